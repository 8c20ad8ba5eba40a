"""The continuation runner: an ended wait's flow goes on, exactly once, after restarts too.

Every ended wait generation leaves a durable continuation. For each one at a step this
process has a resumer for, the runner asks the resumer what follows (a ``FollowUp``, or
nothing) and consumes the continuation with that effect in one transaction
(``Store.resume``): a second runner on another host gets a ``replay``, never a second
effect. A resumer that raises leaves its continuation for the next round (and is logged);
continuations at steps this process has no resumer for are left to the processes that do.
"""

from __future__ import annotations

import logging

from postroom import log
from postroom.models import ResumeResult
from postroom.runtime.duty import check_interval
from postroom.runtime.handlers import App
from postroom.store import Store
from postroom.validation import check_limit

__all__ = ["ContinuationRunner"]

_log = log.get("continuations")


class ContinuationRunner:
    """Resumes unconsumed continuations at the steps ``app`` has resumers for."""

    name = "continuation runner"

    def __init__(self, store: Store, app: App, *, interval: float = 0.5,
                 batch: int = 100) -> None:
        self._store = store
        self._app = app
        self.interval = check_interval(interval)
        self._batch = check_limit(batch, "batch")

    def run_once(self) -> int:
        """Resume one batch of continuations per step with a resumer; how many resumed."""
        resumed = 0
        for step in self._app.steps:
            for continuation in self._store.continuations(limit=self._batch, step=step):
                resumer = self._app.resumer_for(continuation.flow, continuation.step)
                if resumer is None:
                    continue  # a flow-specific resumer of another flow: not ours
                try:
                    effect = resumer(continuation)
                    done = self._store.resume(continuation.flow, continuation.step,
                                              continuation.generation, effect)
                except Exception as exc:  # the next round tries again
                    log.event(_log, logging.WARNING,
                              f"resuming {continuation.flow!r}/{continuation.step!r} "
                              f"generation {continuation.generation} failed",
                              last_error=f"{type(exc).__name__}: {exc}")
                    continue
                if done.result is ResumeResult.RESUMED:
                    resumed += 1
                    log.event(_log, logging.DEBUG, "continuation resumed",
                              task_id=done.task_id, state=done.kind.value)
        return resumed
