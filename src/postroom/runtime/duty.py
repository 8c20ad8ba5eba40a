"""Background duties: the one protocol they follow, and the runner that keeps them going.

A duty is a small object with a ``name``, an ``interval`` and ``run_once()``: one bounded
round of work (each round is the store's own fenced, locked transactions, so any number of
hosts may run the same duty at once) returning how much it did. The runner gives each duty
a thread: after a round that did something it runs again at once; after an idle round it
waits ``interval``. A round that raises is logged and backed off (capped, jittered), and the
duty carries on: a duty never kills its process.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Sequence
from typing import Protocol

from postroom import log
from postroom.errors import InvalidInput

__all__ = ["Duties", "Duty", "check_interval"]

_log = log.get("duty")

#: The longest a failing duty waits before its next round.
BACKOFF_CAP = 60.0


class Duty(Protocol):
    """A background duty: one bounded round of work at a time."""

    @property
    def name(self) -> str:
        """What the logs call it."""
        ...

    @property
    def interval(self) -> float:
        """Seconds to wait after a round that found nothing to do."""
        ...

    def run_once(self) -> int:
        """Do one bounded round; return how many records it changed (0: nothing to do)."""
        ...


def check_interval(seconds: float, field: str = "interval") -> float:
    """A duty's interval: a finite number of seconds in (0, 1 day]."""
    if type(seconds) not in (int, float) or not (math.isfinite(seconds)
                                                 and 0 < seconds <= 86_400):
        raise InvalidInput(field, f"must be a number of seconds in (0, 86400], got {seconds!r}")
    return float(seconds)


class Duties:
    """Runs duties, each in a thread of its own, from ``start()`` until ``stop()``."""

    def __init__(self, duties: Sequence[Duty], *, seed: int | None = None) -> None:
        self._duties = list(duties)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random(seed)

    @property
    def names(self) -> list[str]:
        """The duties' names, in order."""
        return [duty.name for duty in self._duties]

    def start(self) -> None:
        """Start every duty's thread."""
        for duty in self._duties:
            thread = threading.Thread(target=self._loop, args=(duty,), daemon=True,
                                      name=f"postroom-{duty.name.replace(' ', '-')}")
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every duty to stop after its current round, and wait up to ``timeout``."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout)

    def _loop(self, duty: Duty) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                done = duty.run_once()
            except Exception as exc:  # a duty's crash is logged, never the process's end
                failures += 1
                pause = min(BACKOFF_CAP, duty.interval * 2.0 ** min(failures, 16))
                pause *= 0.5 + self._rng.random() / 2
                log.event(_log, logging.WARNING,
                          f"{duty.name} failed; its next round in {pause:.1f}s",
                          last_error=f"{type(exc).__name__}: {exc}")
                self._stopping.wait(pause)
                continue
            failures = 0
            if not done:
                self._stopping.wait(duty.interval)
