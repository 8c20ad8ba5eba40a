"""A host that runs only the scheduler duty, on a clock the test moves: for the bar test of
periodic schedules (``tests/concurrency/test_schedule_hosts.py``).

``FileClock`` reads the time from a file that the test rewrites (atomically, with
``set_time``), so every process of a test shares one manual clock. Run as::

    python -m tests.harness.scheduler_host STORE_URL CLOCK_FILE [INTERVAL]

it opens the store on that clock, starts a ``Scheduler`` duty, prints ``ready`` and runs until
its stdin ends (or it is killed, which is the point).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import postroom
from postroom.runtime.duty import Duties
from postroom.runtime.scheduler import Scheduler
from tests.support import SETTINGS

__all__ = ["FileClock", "set_time"]


class FileClock:
    """A clock reading seconds since the epoch from a file, for processes sharing one time."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def now(self) -> float:
        """The time the file holds."""
        return float(self._path.read_text("ascii"))


def set_time(path: Path, when: float) -> None:
    """Move every ``FileClock`` reading ``path`` to ``when`` at once (a rename is atomic)."""
    partial = path.with_suffix(".partial")
    partial.write_text(repr(float(when)), "ascii")
    os.replace(partial, path)


def main(url: str, clock_file: str, interval: str = "0.05") -> None:
    with postroom.open_store(url, clock=FileClock(Path(clock_file)), settings=SETTINGS) as store:
        duties = Duties([Scheduler(store, interval=float(interval))])
        duties.start()
        print("ready", flush=True)
        sys.stdin.read()  # until the test closes it
        duties.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
