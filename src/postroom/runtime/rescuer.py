"""The lease rescuer: tasks and deliveries whose owner stopped renewing go back to work.

A claim sweeps expired leases before it picks, so a busy queue needs no rescuer; this duty
covers the idle ones (a queue no worker claims right now, replies no dispatcher is
claiming), so a crashed worker's tasks are pending again, or failed with their reply when
that was their last attempt, within about a lease and an interval.
"""

from __future__ import annotations

from postroom.runtime.duty import check_interval
from postroom.store import Store

__all__ = ["LeaseRescuer"]


class LeaseRescuer:
    """Recovers expired task and delivery leases, ``sweep_limit`` per transaction."""

    name = "lease rescuer"

    def __init__(self, store: Store, *, interval: float = 1.0) -> None:
        self._store = store
        self.interval = check_interval(interval)

    def run_once(self) -> int:
        """Recover every expired lease; how many records changed."""
        return self._store.sweep(deadlines=False).total
