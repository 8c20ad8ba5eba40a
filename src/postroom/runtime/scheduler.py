"""The scheduler: enqueues the task of each periodic schedule's period once it begins.

Every worker runs it (as it runs the other duties), so a schedule keeps running while any
host does; rounds on several hosts share the due schedules out (``SKIP LOCKED``), and a
period is one task whoever enqueues it (see ``postroom.schedules``). Its interval bounds how
late a period's task is enqueued; a round when nothing is due is one indexed look.
"""

from __future__ import annotations

from postroom.runtime.duty import check_interval
from postroom.store import Store
from postroom.validation import check_limit

__all__ = ["Scheduler"]


class Scheduler:
    """Runs ``Store.enqueue_due_schedules``, ``limit`` schedules per transaction."""

    name = "scheduler"

    def __init__(self, store: Store, *, interval: float = 1.0, limit: int = 100) -> None:
        self._store = store
        self.interval = check_interval(interval)
        self._limit = check_limit(limit)

    def run_once(self) -> int:
        """Enqueue the due periods of up to ``limit`` schedules; how many tasks it stored."""
        return len(self._store.enqueue_due_schedules(limit=self._limit))
