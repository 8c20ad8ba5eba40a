"""What each step of a one-at-a-time task costs: WAL per commit, statements, round trips, and
where its time goes.

The steps of ``e2e.single`` (``receive``, ``claim``, ``finish``, then ``dispatch``, whose
three commits are the dispatch claim, the receiver's commit and the dispatch record), each
counted at the dialect by ``wal_frames.CommitCosts`` over ``sizes.single_tasks`` tasks:
``steps`` on SQLite (WAL frames, one page each), ``pg-steps`` on PostgreSQL (WAL bytes).
Each figure is the median over the tasks; an extra, untimed diagnostic, not a rate. A
step's time runs from the commit before it to its own, split into the COMMIT (and the fsync
it waits for), the other calls into the driver (statements), and the rest, postroom's Python
(the counting itself adds a little to each).
``postroom bench --before FILE`` shows, beside each step, the same figures from an earlier
run's JSON report (of an earlier version, say).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from postroom._bench.context import BenchError, Context, Measurement, Rounds
from postroom._bench.scenarios.end_to_end import _pipeline, one_task
from postroom._bench.wal_frames import Commit, CommitCosts

__all__ = ["STEPS", "earlier", "markdown", "run"]

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
                     "round_trips": statistics.median(c.round_trips for c in commits),
                     "us_per_step": _us(c.seconds for c in commits),
                     "us_in_commit": _us(c.in_commit for c in commits),
                     "us_in_statements": _us(c.in_statements for c in commits),
                     "us_in_python": _us(c.seconds - c.in_commit - c.in_statements
                                         for c in commits)}))
    return rows


def _us(seconds: Iterable[float]) -> float:
    """The median of ``seconds``, in microseconds."""
    return round(statistics.median(seconds) * 1e6, 1)


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


#: A step's time and its parts, as the details name them.
_TIMES = ("us_per_step", "us_in_commit", "us_in_statements", "us_in_python")


def _time(details: dict[str, Any], was: dict[str, Any] | None, key: str) -> str:
    """One part of a step's time in microseconds, beside an earlier run's if it has it."""
    if key not in details:
        return ""
    now = f"{details[key]:,.0f}"
    if was is None or key not in was["details"]:
        return now
    return f"{was['details'][key]:,.0f} -> {now}"


def earlier(report: dict[str, Any]) -> dict[str, Any]:
    """What ``--before`` keeps of an earlier run's JSON report: when and how it ran, and its
    step rows. ``ValueError`` if it has none."""
    rows = [row for row in report.get("measurements", ()) if row["id"].startswith("steps.")]
    if not rows:
        raise ValueError("the earlier report has no step rows: run it with --only steps "
                         "(and --only pg-steps)")
    machine = report.get("machine", {})
    return {"command": report.get("command"), "started": report.get("started"),
            "commit": machine.get("commit"), "measurements": rows}


def markdown(report: dict[str, Any]) -> list[str]:
    """Per-step costs as a Markdown section (empty without step rows), beside an earlier
    run's when the report carries one (``before``)."""
    rows = [row for row in report["measurements"] if row["id"].startswith("steps.")]
    if not rows:
        return []
    before = {row["id"]: row for row in report.get("before", {}).get("measurements", ())}
    lines = ["", "## Per step of a one-at-a-time task", "", __doc__.split("\n\n", 1)[1], ""]
    if before:
        then = report["before"]
        lines += [f"Before: `{then['command']}` on {then['started']} at commit "
                  f"`{then['commit']}`; each cell shows before -> now.", ""]
    lines += ["| backend | step | WAL per commit (median) | mean | least | statements "
              "| round trips | us | in COMMIT | in statements | in Python |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        details, was = row["details"], before.get(row["id"])

        def cell(now: float, key: str | None, form: str, was: dict[str, Any] | None = was
                 ) -> str:
            shown = format(now, form)
            if was is None:
                return shown
            old = was["value"] if key is None else was["details"][key]
            return f"{format(old, form)} -> {shown}"

        unit = "frames" if row["backend"] == "sqlite" else "bytes"
        lines.append(f"| {row['backend']} | {details['step']} | "
                     f"{cell(row['value'], None, ',.1f')} {unit} | "
                     f"{cell(details['wal_mean'], 'wal_mean', ',.1f')} | "
                     f"{cell(details['wal_min'], 'wal_min', ',.0f')} | "
                     f"{cell(details['statements'], 'statements', 'g')} | "
                     f"{cell(details['round_trips'], 'round_trips', 'g')} | "
                     + " | ".join(_time(details, was, key) for key in _TIMES) + " |")
    return lines
