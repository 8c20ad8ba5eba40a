"""The pruner: forgets what the store's published retention period no longer promises.

Pruning keeps everything a promise still covers (see ``postroom.retention``), so running it
often only spreads the work: a pruned message sent again is a new request, and never sooner
than the period its sender was promised.
"""

from __future__ import annotations

from postroom.runtime.duty import check_interval
from postroom.store import Store

__all__ = ["Pruner"]


class Pruner:
    """Prunes messages past retention, ``sweep_limit`` per transaction."""

    name = "pruner"

    def __init__(self, store: Store, *, interval: float = 300.0) -> None:
        self._store = store
        self.interval = check_interval(interval)

    def run_once(self) -> int:
        """Prune what retention allows; how many messages were forgotten."""
        return self._store.prune()
