"""claim+finish by one worker, at growing backlogs of pending tasks (``claim`` on SQLite,
``pg-claim-backlog`` on PostgreSQL).

SPEC §3: claim cost must not grow with the backlog. One store is grown through the sizes
(smallest first) with ``receive_atomic`` batches; at each size a fixed number of claim+finish
cycles is timed, and the backlog is topped up between rounds so that it stays between the size
and the size plus one round. One more round per size splits a cycle's time into commits,
statements and Python (``DriverTime``). The plans of the claim transaction's statements (the
claim and its two sweeps) are read with ``EXPLAIN`` at every size: a scan of the tasks table
or a sort fails the run.
"""

from __future__ import annotations

import time
from functools import partial

import postroom
from postroom._bench.context import BenchError, Context, Measurement
from postroom._bench.driver_time import DriverTime

__all__ = ["ROWS", "run"]

#: The id prefix of each backend's rows (SQLite's keep the names they always had); the
#: backlog follows it.
ROWS = {"sqlite": "claim_finish.backlog_", "postgres": "pg.claim_finish.backlog_"}

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


#: The statements of a claim transaction, with parameters to plan them with.
_CLAIM_STATEMENTS: dict[str, dict[str, object]] = {
    "claim_tasks": {"queue": "default", "limit": 1, "owner": "worker"},
    "tasks_lease_expired": {"limit": 100},
    "tasks_deadline_passed": {"limit": 100},
}


def claim_plans(store: postroom.Store) -> dict[str, list[str]]:
    """``EXPLAIN`` of every statement a claim runs, as the store would run them now."""
    dialect = store._db.dialect
    now = time.time()
    with dialect.connection() as conn:
        return {name: dialect.explain(conn, dialect.queries[name].sql,
                                      {"now": now, "lease_until": now + 30, **params})
                for name, params in _CLAIM_STATEMENTS.items()}


def scans_or_sorts(plans: dict[str, list[str]]) -> list[str]:
    """SQLite plan lines that read the whole tasks table or sort rows (none may appear)."""
    return [f"{name}: {line}" for name, lines in plans.items() for line in lines
            if line.startswith("SCAN tasks") or "TEMP B-TREE" in line]


def run(ctx: Context) -> list[Measurement]:
    """claim+finish cycles/s at each backlog of ``ctx.sizes.backlogs``."""
    sizes = ctx.sizes
    cycles = sizes.claim_cycles
    rows = []
    prefix = ROWS[ctx.target.backend]
    what = "PostgreSQL " if ctx.target.backend == "postgres" else ""
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
            backlog.fill_to(size + cycles)
            with DriverTime([store._db]) as inside:  # one more round, split by where
                start = time.perf_counter()
                backlog.cycles(cycles)
                wall = time.perf_counter() - start
            plans = claim_plans(store)
            problems = scans_or_sorts(plans) if store._db.dialect.name == "sqlite" else []
            if problems:
                raise BenchError(f"at {size:,} pending the claim's plan scans or sorts: "
                                 + "; ".join(problems))
            rows.append(Measurement(
                id=f"{prefix}{size}", backend=ctx.target.backend,
                label=f"{what}claim+finish, one worker, backlog {size:,} pending",
                unit="tasks/s", rounds=rounds,
                details={"backlog": size, "cycles_per_round": cycles,
                         "commits_per_task": inside.commits / cycles,
                         "us_per_task_in_commits": round(inside.committing / cycles * 1e6, 1),
                         "us_per_task_in_statements": round(inside.statements / cycles * 1e6,
                                                            1),
                         "us_per_task_elsewhere": round(
                             (wall - inside.seconds) / cycles * 1e6, 1),
                         "claim_plans": plans}))
    return rows
