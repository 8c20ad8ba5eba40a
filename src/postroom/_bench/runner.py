"""Run the scenarios against one baseline and judge the bars the issues set."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from postroom._bench import machine
from postroom._bench.context import Context, Measurement, Sizes, SQLiteTarget, Target
from postroom._bench.scenarios import (
    claim_backlog,
    commit_cost,
    end_to_end,
    http_submit,
    peers,
    postgres,
    profiles,
    remote_worker,
    runtime,
    steps,
    waits,
)
from postroom._bench.scenarios.raw_sqlite import RawCommitLoop

__all__ = ["SCENARIOS", "Bar", "Scenario", "add_page_ceilings", "bars_for", "default_folder",
           "run_bench"]


@dataclass(frozen=True)
class Scenario:
    """A registered scenario: what runs it, and the backend its ``Target`` must be."""

    run: Callable[[Context], list[Measurement]]
    backend: Literal["sqlite", "postgres"] = "sqlite"


#: Scenario names (``postroom bench --only NAME``), in the order they run.
SCENARIOS: dict[str, Scenario] = {
    "claim": Scenario(claim_backlog.run),
    "receive": Scenario(end_to_end.run_receive),
    "single": Scenario(end_to_end.run_single),
    "batched": Scenario(end_to_end.run_batched),
    "commit-cost": Scenario(commit_cost.run),
    "signals": Scenario(waits.run),
    "pg-claim": Scenario(postgres.run_claim, "postgres"),
    "pg-claim-backlog": Scenario(claim_backlog.run, "postgres"),
    "pg-e2e": Scenario(postgres.run_end_to_end, "postgres"),
    "pg-latency": Scenario(postgres.run_latency, "postgres"),
    "worker": Scenario(runtime.run_worker),
    "delivered": Scenario(runtime.run_delivered),
    "worker-latency": Scenario(runtime.run_sqlite_latency),
    "concurrency": Scenario(runtime.run_concurrency),
    "scheduled": Scenario(runtime.run_scheduled),
    "rss": Scenario(runtime.run_rss),
    "pg-workers": Scenario(runtime.run_pg_workers, "postgres"),
    "pg-worker-latency": Scenario(runtime.run_pg_latency, "postgres"),
    "pg-rss": Scenario(runtime.run_pg_rss, "postgres"),
    "steps": Scenario(steps.run),
    "pg-steps": Scenario(steps.run, "postgres"),
    "peers": Scenario(peers.run_sqlite_peers),
    "pg-peers": Scenario(peers.run_pg_peers, "postgres"),
    "http-submit": Scenario(http_submit.run),
    "pg-http-submit": Scenario(http_submit.run, "postgres"),
    "remote-worker": Scenario(remote_worker.run),
    "pg-remote-worker": Scenario(remote_worker.run, "postgres"),
    "profiles": Scenario(profiles.run),
    "pg-profiles": Scenario(profiles.run, "postgres"),
}


@dataclass(frozen=True, kw_only=True)
class Bar:
    """A required figure: a quotient of two measurements, or one measurement's value.

    ``basis="ratio"`` divides the two measurements' ratios to the raw loop (the median of each
    round's rate over the baseline around it), so a burst of a neighbour's I/O during one
    scenario does not count against another. ``basis="value"`` uses their median values
    instead (for figures the SQLite loop does not pace), and without a ``denominator`` it is
    the numerator's own value, in its unit (e.g. a latency in ms). ``kind`` says whether
    ``required`` is a ``minimum`` (>=) or a ``maximum`` (<=).
    """

    id: str
    text: str
    numerator: str  # a measurement id
    denominator: str | None  # a measurement id; "raw_sqlite" is the baseline
    required: float
    basis: Literal["ratio", "value"] = "ratio"
    kind: Literal["minimum", "maximum"] = "minimum"

    def measure(self, rows: dict[str, Measurement]) -> tuple[float, str]:
        """The figure this bar judges, and its unit ("x" for a quotient)."""
        numerator = rows[self.numerator]
        if self.denominator is None:
            return numerator.value, numerator.unit
        denominator = rows[self.denominator]
        if self.basis == "value":
            return numerator.value / denominator.value, "x"
        assert numerator.ratio is not None and denominator.ratio is not None, self.id
        return numerator.ratio / denominator.ratio, "x"

    def passes(self, measured: float) -> bool:
        """Whether ``measured`` meets the bar."""
        return measured >= self.required if self.kind == "minimum" else measured <= self.required


def bars_for(rows: Sequence[Measurement]) -> list[Bar]:
    """The bars the issues set, for the measurements this run produced."""
    bars = []
    for backend, name, what in (("sqlite", "claim_flat_under_backlog", ""),
                                ("postgres", "pg_claim_flat_under_backlog", "PostgreSQL: ")):
        claims = sorted((row for row in rows if row.id.startswith(claim_backlog.ROWS[backend])),
                        key=lambda row: row.details["backlog"])
        if len(claims) >= 2:
            small, large = claims[0], claims[-1]
            bars.append(Bar(
                id=name, numerator=large.id, denominator=small.id, required=0.7,
                basis="ratio" if backend == "sqlite" else "value",
                text=f"{what}claim+finish at {large.details['backlog']:,} pending >= 0.7x its "
                     f"rate at {small.details['backlog']:,}"))
    ids = {row.id for row in rows}
    if "receive.single" in ids:
        bars.append(Bar(id="receive_vs_raw", numerator="receive.single",
                        denominator="raw_sqlite", required=0.6,
                        text="`receive`, one at a time, SQLite: messages/s >= 0.6x raw "
                             "commits/s"))
    if "e2e.single" in ids:
        bars.append(Bar(id="single_vs_raw", numerator="e2e.single", denominator="raw_sqlite",
                        required=0.12,
                        text="one-at-a-time end-to-end tasks/s >= 0.12x raw commits/s"))
    if "wal.single_task" in ids:
        bars.append(Bar(id="frames_per_task", numerator="wal.single_task",
                        denominator=None, required=20.0, basis="value", kind="maximum",
                        text="WAL frames per one-at-a-time task (its six commits, the "
                             "receiver's included) <= 20"))
    if "e2e.batched" in ids:
        bars.append(Bar(id="batched_vs_raw", numerator="e2e.batched", denominator="raw_sqlite",
                        required=1.2,
                        text="batched end-to-end tasks/s, to delivered (batches of 500) >= "
                             "1.2x raw commits/s"))
    if "signals.accepted" in ids:
        bars.append(Bar(id="signals_vs_raw", numerator="signals.accepted",
                        denominator="raw_sqlite", required=0.3,
                        text="accepted signals/s, one at a time >= 0.3x raw commits/s"))
    one, four = "pg.claim_finish.single.workers_1", "pg.claim_finish.single.workers_4"
    if {one, four} <= ids:
        # Rates, not ratios: the server's commits do not follow the SQLite loop's disk, so
        # dividing by that loop would only add its noise to a PostgreSQL-only comparison.
        bars.append(Bar(id="pg_claim_scales_to_4_workers", numerator=four, denominator=one,
                        required=2.0, basis="value",
                        text="PostgreSQL claim+finish one at a time: tasks/s of 4 worker "
                             "processes >= 2x those of 1 (median rates divided)"))
    if "pg.latency.p50" in ids:
        bars.append(Bar(id="pg_latency_p50", numerator="pg.latency.p50", denominator=None,
                        required=10.0, basis="value", kind="maximum",
                        text="PostgreSQL enqueue-to-start latency of an idle worker, p50 "
                             "<= 10 ms"))
    for key, what in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        if {f"http.{key}.submit", f"http.{key}.receive"} <= ids:
            bars.append(Bar(id=f"http_submit_{key}", numerator=f"http.{key}.submit",
                            denominator=f"http.{key}.receive", required=0.5,
                            text=f"{what}: `POST /v1/tasks` over HTTP (one client, keep-alive) "
                                 ">= 0.5x `receive` in process, one at a time"))
    return bars + _runtime_bars(ids) + peers.peer_bars(ids) + peers.best_pg_peer_bar(rows)


def _runtime_bars(ids: set[str]) -> list[Bar]:
    """The bars of the runtime issue: real ``postroom worker`` and ``dispatch`` processes."""
    bars = []
    if "runtime.sqlite.workers_1" in ids:
        bars.append(Bar(id="worker_vs_raw", numerator="runtime.sqlite.workers_1",
                        denominator="raw_sqlite", required=0.5,
                        text="one `postroom worker` process on SQLite: tasks/s >= 0.5x raw "
                             "commits/s"))
    if {"runtime.pg.workers_4", "pg.raw_commit_loop"} <= ids:
        bars.append(Bar(id="pg_workers_vs_raw_pg", numerator="runtime.pg.workers_4",
                        denominator="pg.raw_commit_loop", required=0.75, basis="value",
                        text="4 `postroom worker` processes on PostgreSQL: tasks/s >= 0.75x "
                             "the raw PostgreSQL commit loop's commits/s (median rates "
                             "divided)"))
    if "runtime.sqlite.delivered" in ids:
        bars.append(Bar(id="delivered_vs_raw", numerator="runtime.sqlite.delivered",
                        denominator="raw_sqlite", required=0.3,
                        text="one worker + one `postroom dispatch --receiver` on SQLite: tasks "
                             "delivered/s >= 0.3x raw commits/s"))
    for key, what in (("sqlite", "SQLite"), ("pg", "PostgreSQL")):
        if f"runtime.latency.{key}.p50" in ids:
            bars.append(Bar(id=f"worker_latency_{key}_p50",
                            numerator=f"runtime.latency.{key}.p50", denominator=None,
                            required=5.0, basis="value", kind="maximum",
                            text=f"{what}: an idle `postroom worker`'s enqueue-to-start "
                                 "latency, p50 <= 5 ms"))
    one, eight = "runtime.io.concurrency_1", "runtime.io.concurrency_8"
    if {one, eight} <= ids:
        bars.append(Bar(id="concurrency_8_vs_1", numerator=eight, denominator=one,
                        required=6.0, basis="value",
                        text="50 ms async handler: tasks/s at concurrency 8 >= 6x those at "
                             "concurrency 1 (median rates divided)"))
    for key, what in (("sqlite", "SQLite"), ("pg", "PostgreSQL")):
        for name, command in (("worker", "worker"), ("dispatcher", "dispatch")):
            row = f"runtime.rss.{key}.{name}"
            if row in ids:
                bars.append(Bar(id=f"rss_{key}_{name}", numerator=row, denominator=None,
                                required=1.1, basis="value", kind="maximum",
                                text=f"{what}: `postroom {command}` RSS at the end of the long "
                                     "run within 10% of its RSS after the warm-up"))
    scheduled = sorted((row for row in ids if row.startswith("runtime.scheduled.future_")),
                       key=lambda row: int(row.rpartition("_")[2]))
    if len(scheduled) >= 2:
        bars.append(Bar(id="due_claims_flat_under_future_backlog", numerator=scheduled[-1],
                        denominator=scheduled[0], required=0.7,
                        text=f"one `postroom worker` on due tasks with "
                             f"{int(scheduled[-1].rpartition('_')[2]):,} scheduled in the "
                             "future >= 0.7x its rate with none"))
    return bars


def default_folder() -> Path:
    """``/var/tmp`` (on disk by convention), else the system's temporary directory."""
    var_tmp = Path("/var/tmp")
    if var_tmp.is_dir() and machine.filesystem(var_tmp) not in machine.MEMORY_FILESYSTEMS:
        return var_tmp
    return Path(tempfile.gettempdir())


def run_bench(*, sizes: Sizes, mode: str, folder: Path, only: Sequence[str] = (),
              pg_url: str = postgres.DEFAULT_URL,
              progress: Callable[[str], None] = lambda _line: None,
              command: str = "postroom bench") -> dict[str, Any]:
    """Run the chosen scenarios (all by default) and return the report as JSON values.

    The PostgreSQL scenarios use schemas of their own in the database at ``pg_url``, dropped
    at the end. Raises ``ValueError`` if ``folder`` is on a memory file system, or if a
    PostgreSQL scenario is chosen and the server cannot be reached (checked before anything
    runs).
    """
    kind = machine.filesystem(folder)
    if kind in machine.MEMORY_FILESYSTEMS:
        raise ValueError(f"{folder} is on {kind}: commits there skip the disk, so the ratios "
                         "would mean nothing; choose a folder on disk with --dir")
    chosen = [name for name in SCENARIOS if not only or name in only]
    server: dict[str, Any] | None = None
    if any(SCENARIOS[name].backend == "postgres" for name in chosen):
        server = _reach_postgres(pg_url, [name for name in chosen
                                          if SCENARIOS[name].backend == "postgres"])
    started = datetime.now(UTC)
    load_before = machine.load_average()
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="postroom-bench-", dir=folder) as scratch, \
            ExitStack() as cleanup:
        where = Path(scratch)
        targets: dict[str, Target] = {"sqlite": SQLiteTarget(where)}
        if server is not None:
            pg_target = postgres.PostgresTarget(pg_url)
            cleanup.callback(pg_target.close)  # drops every schema it handed out
            targets["postgres"] = pg_target
        raw = RawCommitLoop(where / "raw.db", commits=sizes.raw_commits)
        cleanup.callback(raw.close)
        raw.round()  # warm-up, not kept: the first round creates the file's pages
        raw.rates.clear()
        rows: list[Measurement] = []
        for name in chosen:
            scenario = SCENARIOS[name]
            rows.extend(scenario.run(Context(sizes=sizes, target=targets[scenario.backend],
                                             baseline=raw, progress=progress)))
        raw.round()
        baseline = raw.measurement()
    add_page_ceilings(rows)
    elapsed = time.perf_counter() - clock
    return _report(command=command, mode=mode, started=started, elapsed=elapsed,
                   machine_info=machine.summary(folder), postgres_info=server, sizes=sizes,
                   load=(load_before, machine.load_average()), rows=[baseline, *rows])


def add_page_ceilings(rows: Sequence[Measurement]) -> None:
    """Give each end-to-end figure the ratio its commits alone allow, priced by the bare
    commit loops that write a given number of pages per commit (``commit-cost``).

    A commit's time relative to the raw loop's (``1 / ratio``) is fitted by least squares to
    a fixed cost plus a cost per page, over every page count measured, so one noisy round
    does not bend the price. ``ratio_if_commits_cost_bare_commits_of_as_many_pages`` is
    ``1 / fitted time`` at the figure's WAL frames per commit, over its commits per task;
    absent when those frames lie outside the page counts measured (no extrapolation).
    """
    curve = [(float(row.details["pages_per_commit"]), 1.0 / row.ratio) for row in rows
             if row.id.startswith("commit_cost.") and row.ratio]
    pages = [point[0] for point in curve]
    if len(set(pages)) < 2:
        return
    fit = statistics.linear_regression(pages, [point[1] for point in curve])
    for row in rows:
        frames = row.details.get("wal_frames_per_commit")
        if frames is None or not min(pages) <= frames <= max(pages):
            continue
        ratio = 1.0 / (fit.intercept + fit.slope * frames)
        row.details["ratio_if_commits_cost_bare_commits_of_as_many_pages"] = round(
            ratio / row.details["commits_per_task"], 4)


def _reach_postgres(url: str, names: list[str]) -> dict[str, Any]:
    """The server's description, or a ``ValueError`` saying how to run without it."""
    try:
        return postgres.PostgresTarget(url).describe()
    except ImportError as exc:
        raise ValueError(
            f"the scenarios {', '.join(names)} need PostgreSQL support, which is not installed "
            f"({exc}): pip install 'postroom[postgres]', or choose scenarios without them "
            "with --only") from exc
    except Exception as exc:  # psycopg's errors: no server there
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(
            f"PostgreSQL at {postgres.public_url(url)} is unreachable ({reason}); the "
            f"scenarios {', '.join(names)} need it. Point --pg-url (or POSTROOM_PG_URL) at a "
            f"server, or choose scenarios without them with --only") from exc


def _report(*, command: str, mode: str, started: datetime, elapsed: float,
            machine_info: dict[str, Any], postgres_info: dict[str, Any] | None, sizes: Sizes,
            load: tuple[list[float], list[float]], rows: list[Measurement]) -> dict[str, Any]:
    by_id = {row.id: row for row in rows}
    judged = []
    for bar in bars_for(rows):
        measured, unit = bar.measure(by_id)
        shown = round(measured, 3)  # judged as shown, so the report never contradicts itself
        judged.append({"id": bar.id, "text": bar.text, "numerator": bar.numerator,
                       "denominator": bar.denominator, "basis": bar.basis, "kind": bar.kind,
                       "unit": unit, "measured": shown, "required": bar.required,
                       "passed": bar.passes(shown)})
    return {
        "command": command,
        "mode": mode,
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed, 1),
        "machine": machine_info,
        "postgres": postgres_info,
        "load_average": {"before": load[0], "after": load[1]},
        "sizes": {name: getattr(sizes, name) for name in sizes.__dataclass_fields__},
        "raw_commits_per_s": round(rows[0].value, 1),
        "measurements": [row.to_dict() for row in rows],
        "bars": judged,
        "all_bars_passed": all(bar["passed"] for bar in judged),
    }

