"""The wait timer: a wait nobody answered before its deadline times out, with its
continuation.

A signal that arrives late times its wait out itself (``too_late``), so a late timer can never
extend a deadline; the timer makes sure the flow hears "no answer" when no signal comes.
"""

from __future__ import annotations

from postroom.runtime.duty import check_interval
from postroom.store import Store

__all__ = ["WaitTimer"]


class WaitTimer:
    """Times out every due wait, ``sweep_limit`` per transaction."""

    name = "wait timer"

    def __init__(self, store: Store, *, interval: float = 1.0) -> None:
        self._store = store
        self.interval = check_interval(interval)

    def run_once(self) -> int:
        """Time out every due wait; how many."""
        return self._store.expire_due()
