"""What each step of a one-at-a-time task costs: WAL per commit, statements, round trips.

The steps of ``e2e.single`` (``receive``, ``claim``, ``finish``, then ``dispatch``, whose
three commits are the dispatch claim, the receiver's commit and the dispatch record), each
counted at the dialect by ``wal_frames.CommitCosts`` over ``sizes.single_tasks`` tasks:
``steps`` on SQLite (WAL frames, one page each), ``pg-steps`` on PostgreSQL (WAL bytes).
Each figure is the median over the tasks; an extra, untimed diagnostic, not a rate.
"""

from __future__ import annotations

import statistics
from typing import Any

from postroom._bench.context import BenchError, Context, Measurement, Rounds
from postroom._bench.scenarios.end_to_end import _pipeline, one_task
from postroom._bench.wal_frames import Commit, CommitCosts

__all__ = ["STEPS", "markdown", "run"]

#: The commits of one task, in order, and the database each is made in.
STEPS = (("receive", "store"), ("claim", "store"), ("finish", "store"),
         ("dispatch claim", "store"), ("receiver", "receiver"), ("dispatch record", "store"))


def run(ctx: Context) -> list[Measurement]:
    """Per step of a one-at-a-time task: median WAL, statements and round trips."""
    tasks = ctx.sizes.single_tasks
    backend = ctx.target.backend
    ctx.progress(f"steps: what each step of {tasks} one-at-a-time tasks costs ({backend})")
    per_step: dict[str, list[Commit]] = {step: [] for step, _ in STEPS}
    with _pipeline(ctx, "steps") as (store, receiver, transport):
        for n in range(3):  # warm-up: statements prepared, pages allocated
            one_task(store, transport, n)
        with CommitCosts({"store": store._db, "receiver": receiver._db}) as costs:
            for n in range(3, 3 + tasks):
                mark = len(costs.commits)
                one_task(store, transport, n)
                _assign(costs.commits[mark:], per_step)
    unit = "WAL frames/commit" if backend == "sqlite" else "WAL bytes/commit"
    rows = []
    for step, commits in per_step.items():
        key = step.replace(" ", "_")
        rows.append(Measurement(
            id=f"steps.{backend}.{key}", backend=backend, unit=unit,
            label=f"{step}: WAL per commit ({backend})",
            rounds=Rounds(rates=(statistics.median(commit.wal for commit in commits),)),
            details={"step": step, "tasks": tasks, "unit": unit,
                     "wal_mean": round(statistics.fmean(c.wal for c in commits), 2),
                     # other clients of a shared server only add WAL: the least is closest
                     "wal_min": min(c.wal for c in commits),
                     "statements": statistics.median(c.statements for c in commits),
                     "round_trips": statistics.median(c.round_trips for c in commits)}))
    return rows


def _assign(commits: list[Commit], per_step: dict[str, list[Commit]]) -> None:
    """Match a task's commits to its steps in order; a read between them commits nothing
    (its statements fold into the next commit's)."""
    written = iter(commits)
    for step, database in STEPS:
        commit = next((c for c in written if c.database == database), None)
        if commit is None:
            raise BenchError(f"no {database} commit for the step {step!r}: "
                             f"{[c.database for c in commits]}")
        per_step[step].append(commit)


def markdown(report: dict[str, Any]) -> list[str]:
    """Per-step costs as a Markdown section (empty without step rows)."""
    rows = [row for row in report["measurements"] if row["id"].startswith("steps.")]
    if not rows:
        return []
    lines = ["", "## Per step of a one-at-a-time task", "", __doc__.split("\n\n", 1)[1], "",
             "| backend | step | WAL per commit (median) | mean | least | statements "
             "| round trips |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        details = row["details"]
        lines.append(f"| {row['backend']} | {details['step']} | {row['value']:,.1f} "
                     f"{'frames' if row['backend'] == 'sqlite' else 'bytes'} | "
                     f"{details['wal_mean']:,.1f} | {details['wal_min']:,.0f} | "
                     f"{details['statements']:g} | "
                     f"{details['round_trips']:g} |")
    return lines
