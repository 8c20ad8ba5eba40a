"""claim+finish by one worker, at growing backlogs of pending tasks.

SPEC §3: claim cost must not grow with the backlog. One store is grown through the sizes
(smallest first) with ``receive_atomic`` batches; at each size a fixed number of claim+finish
cycles is timed, and the backlog is topped up between rounds so that it stays between the size
and the size plus one round. The claim's query plan is read with ``EXPLAIN`` at every size.
"""

from __future__ import annotations

import time
from functools import partial

import postroom
from bench.context import BenchError, Context, Measurement

__all__ = ["run"]

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0


class _Backlog:
    """A store's pending tasks, grown through the public API."""

    def __init__(self, store: postroom.Store, *, batch: int) -> None:
        self.store = store
        self.pending = 0
        self._batch = batch
        self._next = 0

    def fill_to(self, size: int) -> None:
        """Receive messages until ``size`` tasks are pending."""
        deadline = time.time() + _DAY  # far beyond the run: nothing expires under us
        while self.pending < size:
            count = min(self._batch, size - self.pending)
            first = self._next
            self.store.receive_atomic(_AUTH, [
                postroom.Envelope(message_id=f"backlog-{n}", sender="bench",
                                  payload={"n": n, "kind": "backlog"}, deadline=deadline)
                for n in range(first, first + count)])
            self._next += count
            self.pending += count

    def cycles(self, count: int) -> int:
        """``count`` claim+finish cycles, each its own two transactions."""
        store = self.store
        for _ in range(count):
            claim = store.claim("worker")
            if claim is None:
                raise BenchError("the backlog ran dry: a claim found nothing")
            store.finish(claim, None)
        self.pending -= count
        return count


def claim_plan(store: postroom.Store) -> list[str]:
    """``EXPLAIN`` of the claim statement, as the store would run it now."""
    dialect = store.database.dialect
    now = time.time()
    params = {"queue": "default", "now": now, "limit": 1, "owner": "worker",
              "lease_until": now + 30}
    with dialect.connection() as conn:
        return dialect.explain(conn, dialect.queries["claim_tasks"].sql, params)


def walks_index_head(lines: list[str]) -> bool:
    """Whether a SQLite claim plan searches the claimable index, with no scan and no sort."""
    text = "\n".join(lines)
    return ("USING INDEX tasks_claimable" in text and "SCAN tasks" not in text
            and "TEMP B-TREE" not in text)


def run(ctx: Context) -> list[Measurement]:
    """claim+finish cycles/s at each backlog of ``ctx.sizes.backlogs``."""
    sizes = ctx.sizes
    cycles = sizes.claim_cycles
    rows = []
    with postroom.open_store(ctx.target.url("claim-backlog")) as store:
        backlog = _Backlog(store, batch=sizes.build_batch)
        for size in sizes.backlogs:
            started = time.perf_counter()
            backlog.fill_to(size + cycles)
            built = time.perf_counter() - started
            ctx.progress(f"claim+finish: backlog of {backlog.pending:,} pending built "
                         f"in {built:.1f}s; measuring")
            backlog.cycles(cycles)  # untimed: statement caches and pages warm at this size
            rounds = ctx.timed_rounds(partial(backlog.cycles, cycles),
                                      before=partial(backlog.fill_to, size + cycles))
            plan = claim_plan(store)
            if store.database.dialect.name == "sqlite" and not walks_index_head(plan):
                raise BenchError(f"the claim does not walk the index head at {size:,} "
                                 "pending:\n" + "\n".join(plan))
            rows.append(Measurement(
                id=f"claim_finish.backlog_{size}", backend=ctx.target.backend,
                label=f"claim+finish, one worker, backlog {size:,} pending",
                unit="tasks/s", rounds=rounds,
                details={"backlog": size, "cycles_per_round": cycles,
                         "commits_per_task": 2, "claim_plan": plan}))
    return rows
