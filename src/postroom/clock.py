"""Time sources.

A store decides with one trusted time per transaction: ``max(source time, persisted
high-water)``, so a source that steps backwards (or a caller with an old clock) can never make
an expired lease, deadline or wait valid again. This module only provides the sources; the
high-water lives in the store.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from postroom.validation import check_number

__all__ = ["Clock", "ManualClock", "SystemClock", "finite_time"]


def finite_time(value: float, field: str = "clock") -> float:
    """``value`` as a float if it is a finite number of seconds; ``InvalidInput`` otherwise.

    An infinite reading would become the high-water mark and end every lease, deadline and
    wait at once, for good; NaN compares false with everything.
    """
    # Any float will do (numpy.float64 is one); everything else is checked as it is.
    return check_number(float(value) if isinstance(value, float) else value, field)


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock time in seconds since the Unix epoch."""

    def now(self) -> float:
        """The current time in seconds."""
        ...


class SystemClock:
    """The host's wall clock (``time.time``)."""

    def now(self) -> float:
        """The current time in seconds."""
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; for tests, demos and simulations.

    It may be set backwards to simulate a clock step; the store's high-water mark keeps its
    decisions from moving backwards with it.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = finite_time(start, "start")
        self._lock = threading.Lock()

    def now(self) -> float:
        """The current time in seconds."""
        with self._lock:
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when`` (forwards or backwards)."""
        when = finite_time(when, "when")
        with self._lock:
            self._now = when

    def advance(self, seconds: float) -> float:
        """Move by ``seconds`` (negative moves back) and return the new time."""
        with self._lock:
            self._now = finite_time(self._now + finite_time(seconds, "seconds"), "seconds")
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"
