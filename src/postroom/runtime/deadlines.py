"""The deadline sweeper: a task whose absolute deadline passed ends ``expired``, with its reply.

Claims never hand out a task past its deadline and owners' commits are refused after it, so
the sweeper only writes down what already holds, promptly: the requester hears ``expired``
even when no worker is claiming that queue.
"""

from __future__ import annotations

from postroom.runtime.duty import check_interval
from postroom.store import Store

__all__ = ["DeadlineSweeper"]


class DeadlineSweeper:
    """Expires live tasks whose deadline passed, ``sweep_limit`` per transaction."""

    name = "deadline sweeper"

    def __init__(self, store: Store, *, interval: float = 1.0) -> None:
        self._store = store
        self.interval = check_interval(interval)

    def run_once(self) -> int:
        """Expire every task past its deadline; how many."""
        return self._store.sweep(leases=False).total
