"""Named fault points: inert markers in the code where a test can inject a crash or an error.

Every commit postroom makes passes two points, ``<operation>.before_commit`` and
``<operation>.after_commit``; delivery adds its own (see ``postroom.outbox``). Points are
registered when their module is imported, so ``registered()`` enumerates all of them once
``postroom`` is imported, and a crash suite built on it covers a new point automatically.

Production code only calls ``hit``; nothing is armed unless a test (or the demo) arms it::

    with faults.armed("finish.after_commit", faults.crash(77)):
        store.finish(claim, result)        # the process exits right after the commit
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "FaultPoint",
    "arm",
    "armed",
    "commit_points",
    "crash",
    "disarm_all",
    "hit",
    "point",
    "raising",
    "registered",
]

Action = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class FaultPoint:
    """A named place in the code where a fault can be injected."""

    name: str
    description: str


_registry: dict[str, FaultPoint] = {}
_armed: dict[str, tuple[Action, int | None]] = {}
_lock = threading.Lock()


def point(name: str, description: str) -> FaultPoint:
    """Register (idempotently) and return a named fault point."""
    existing = _registry.get(name)
    if existing is not None:
        return existing
    created = FaultPoint(name, description)
    _registry[name] = created
    return created


def commit_points(operation: str) -> tuple[FaultPoint, FaultPoint]:
    """Register the before/after commit points of a transaction named ``operation``."""
    return (
        point(f"{operation}.before_commit", f"{operation}: all writes done, commit not issued"),
        point(f"{operation}.after_commit", f"{operation}: committed, result not yet returned"),
    )


def registered() -> list[FaultPoint]:
    """Every registered point, sorted by name."""
    return [_registry[name] for name in sorted(_registry)]


def hit(name: str) -> None:
    """Pass the point ``name``; runs its action if a test armed it, otherwise does nothing."""
    if not _armed:  # the common case costs one dict truth test
        return
    with _lock:
        entry = _armed.get(name)
        if entry is None:
            return
        action, remaining = entry
        if remaining is not None:
            if remaining <= 1:
                del _armed[name]
            else:
                _armed[name] = (action, remaining - 1)
    action(name)


def arm(name: str, action: Action, *, times: int | None = 1) -> None:
    """Arm ``name`` so the next ``times`` hits (``None``: every hit) run ``action``."""
    if name not in _registry:
        raise KeyError(f"unknown fault point {name!r}")
    with _lock:
        _armed[name] = (action, times)


def disarm_all() -> None:
    """Disarm every point."""
    with _lock:
        _armed.clear()


@contextmanager
def armed(name: str, action: Action, *, times: int | None = 1) -> Iterator[None]:
    """Arm ``name`` for the duration of the block."""
    arm(name, action, times=times)
    try:
        yield
    finally:
        with _lock:
            _armed.pop(name, None)


def crash(exit_code: int = 77) -> Action:
    """An action that ends the process at once, as a power cut or SIGKILL would.

    ``os._exit`` skips ``finally`` blocks, ``atexit`` and buffered writes: nothing gets a
    chance to tidy up, which is what a crash test needs.
    """

    def action(_name: str) -> None:
        os._exit(exit_code)

    return action


def raising(make: Callable[[str], BaseException]) -> Action:
    """An action that raises the exception ``make(point_name)``."""

    def action(name: str) -> None:
        raise make(name)

    return action
