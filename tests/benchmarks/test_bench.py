"""``postroom bench --quick`` runs to the end and reports every figure and bar.

A smoke test of the benchmark's machinery, run as a real subprocess. It checks the shape of
the report, never the speed: timing belongs to benchmarks, not to assertions. The PostgreSQL
scenarios run in a database of their own on the tests' server; without a server the run
leaves them out, and their tests skip (or, under ``CI``, fail).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import psycopg
import pytest

from postroom._bench.plots import plots
from postroom._bench.report import render, write
from postroom._bench.runner import SCENARIOS, default_folder
from tests import pg
from tests.conftest import require_postgres
from tests.harness.children import python, run

pytestmark = pytest.mark.slow

SQLITE_ROWS = {"raw_sqlite", "claim_finish.backlog_100", "claim_finish.backlog_1000",
               "claim_finish.backlog_3000", "receive.single", "e2e.single", "e2e.batched",
               "signals.accepted", "commit_cost.pages_1", "commit_cost.pages_6"}
#: A count, not a rate: the WAL frames a one-at-a-time task's commits write.
FRAME_ROWS = {"wal.single_task"}
#: Figures of ``postroom worker`` and ``postroom dispatch`` processes on SQLite.
RUNTIME_ROWS = {"runtime.sqlite.workers_1", "runtime.sqlite.delivered",
                "runtime.io.concurrency_1", "runtime.io.concurrency_8",
                "runtime.scheduled.future_0", "runtime.scheduled.future_3000"}
LATENCY_ROWS = {"runtime.latency.sqlite.p50", "runtime.latency.sqlite.p99"}
RSS_ROWS = {"runtime.rss.sqlite.worker", "runtime.rss.sqlite.dispatcher"}
PG_RUNTIME_ROWS = {"pg.raw_commit_loop", "runtime.pg.workers_1", "runtime.pg.workers_4",
                   "runtime.latency.pg.p50",
                   "runtime.latency.pg.p99", "runtime.rss.pg.worker", "runtime.rss.pg.dispatcher"}
STEPS = ("receive", "claim", "finish", "dispatch_claim", "receiver", "dispatch_record")
#: What each step of a one-at-a-time task costs, on each backend.
STEP_ROWS = {f"steps.sqlite.{step}" for step in STEPS}
PG_STEP_ROWS = {f"steps.postgres.{step}" for step in STEPS}
#: Submit in process and over HTTP, one at a time, on each backend, and where the HTTP
#: submission's time goes (an empty request, authentication alone, a lighter client), and
#: the floors: each client against a server that only answers, the lighter one against
#: uvicorn with a do-nothing app; and the ceiling one receive plus the client's floor allow;
#: and ``receive`` made as the service makes it, from an event loop through a worker thread.
HTTP_KINDS = ("receive", "receive_from_loop", "submit", "healthz", "whoami", "submit_stdlib",
              "client_floor", "ceiling", "stdlib_floor", "stack_floor")
HTTP_ROWS = {f"http.sqlite.{kind}" for kind in HTTP_KINDS}
PG_HTTP_ROWS = {f"http.postgres.{kind}" for kind in HTTP_KINDS}
#: A remote worker through the service, with its defaults and one task at a time, for the
#: trivial handler and the 50 ms one, on each backend.
REMOTE_KINDS = [f"{handler}.{shape}" for handler in ("trivial", "io")
                for shape in ("defaults", "one_at_a_time")]
REMOTE_ROWS = {f"remote.sqlite.{kind}" for kind in REMOTE_KINDS}
PG_REMOTE_ROWS = {f"remote.postgres.{kind}" for kind in REMOTE_KINDS}
#: Where each kernel call's time goes, sampled by py-spy, on each backend.
CALLS = ("receive", "claim", "finish", "dispatch", "signal")
PROFILE_ROWS = {f"profiles.sqlite.{call}" for call in CALLS}
PG_PROFILE_ROWS = {f"profiles.postgres.{call}" for call in CALLS}


def _peer_rows(system: str, *, delivered: bool = False) -> set[str]:
    return {f"peers.{system}.workers_{workers}{suffix}.{metric}" for workers in (1, 4)
            for suffix in ("", *([".delivered"] if delivered else []))
            for metric in ("processed", "end_to_end")}


#: The peers the dev extra installs (huey, procrastinate) beside postroom; oban-py's own
#: Python 3.12 environment is left out of the smoke run.
PEER_ROWS = _peer_rows("huey") | _peer_rows("postroom-sqlite", delivered=True)
PG_PEER_ROWS = _peer_rows("procrastinate") | _peer_rows("postroom-pg", delivered=True)
POSTGRES_THROUGHPUT_ROWS = {f"pg.{key}.{kind}.workers_{workers}" for key in ("claim_finish", "e2e")
                            for kind in ("single", "batched") for workers in (1, 4)}
#: claim+finish of one worker at each backlog of the quick sizes, on PostgreSQL.
PG_BACKLOG_ROWS = {f"pg.claim_finish.backlog_{size}" for size in (100, 1_000, 3_000)}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run(python("-m", "postroom", "bench", "--quick", *args), timeout=900)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    # One quick run per test session: under xdist, the first worker to get here runs it and
    # the others wait for its report (the parent of a worker's basetemp is the session's).
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent
    with open(shared / "bench-quick.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = shared / "bench-quick.json"
        if not saved.exists():
            saved.write_text(json.dumps(_quick_run()))
        report: dict[str, Any] = json.loads(saved.read_text())
    return report


def _quick_run() -> dict[str, Any]:
    # The bench refuses a memory file system, and pytest's tmp_path may be one: use a
    # private folder where the bench itself would put its databases.
    folder = Path(tempfile.mkdtemp(prefix="bench-test-", dir=default_folder()))
    pg_url = None if pg.problem() else pg.create_database("bench")
    try:
        if pg_url is None:
            only = [arg for name, scenario in SCENARIOS.items()
                    if scenario.backend == "sqlite" for arg in ("--only", name)]
            done = _bench("--dir", str(folder), *only)
        else:
            done = _bench("--dir", str(folder), "--pg-url", pg_url)
        assert done.returncode == 0, done.stdout + done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        report["_leftovers"] = sorted(path.name for path in folder.iterdir())
        report["_stderr"] = done.stderr
        if pg_url is not None:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                report["_schemas"] = [name for (name,) in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench%'")]
        return report
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if pg_url is not None:
            pg.drop_database(pg_url)


@pytest.fixture
def pg_report(quick_report: dict[str, Any]) -> dict[str, Any]:
    """The quick report, for tests of its PostgreSQL rows (which need the server)."""
    require_postgres()
    return quick_report


def test_quick_run_reports_every_scenario_with_a_ratio_to_the_raw_loop(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]
            if row["backend"] == "sqlite"}
    assert set(rows) == (SQLITE_ROWS | RUNTIME_ROWS | LATENCY_ROWS | RSS_ROWS | STEP_ROWS
                         | PEER_ROWS | HTTP_ROWS | REMOTE_ROWS | FRAME_ROWS | PROFILE_ROWS)
    for row in (rows[name] for name in SQLITE_ROWS | RUNTIME_ROWS | HTTP_ROWS | REMOTE_ROWS):
        assert row["value"] == pytest.approx(statistics.median(row["rounds"]), abs=0.1)
        assert len(row["round_ratios"]) == len(row["rounds"]) > 0
        assert all(ratio > 0 for ratio in row["round_ratios"])
        assert row["ratio_to_raw"] == pytest.approx(statistics.median(row["round_ratios"]),
                                                    abs=1e-4)
    assert rows["raw_sqlite"]["ratio_to_raw"] == 1.0
    assert rows["raw_sqlite"]["value"] == quick_report["raw_commits_per_s"]


def test_quick_run_reports_an_http_submissions_ceiling_as_a_receive_then_a_floor_request(
        quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    for backend in {row["backend"] for row in rows.values() if row["id"].startswith("http.")}:
        ceiling, receive, floor = (rows[f"http.{backend}.{kind}"]["rounds"]
                                   for kind in ("ceiling", "receive", "client_floor"))
        for one, alone, request in zip(ceiling, receive, floor, strict=True):
            assert one == pytest.approx(1 / (1 / alone + 1 / request), rel=1e-3)


def test_quick_run_counts_the_commits_a_task_costs(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    assert rows["e2e.single"]["details"]["commits_per_task"] == 6
    batched = rows["e2e.batched"]["details"]
    assert batched["commits_per_task"] == pytest.approx(6 / batched["batch_size"])


def test_quick_run_splits_a_claim_cycle_between_commits_statements_and_python(quick_report):
    for row in quick_report["measurements"]:
        if row["id"].startswith("claim_finish."):
            details = row["details"]
            assert details["commits_per_task"] == 2
            assert details["us_per_task_in_commits"] > 0
            assert details["us_per_task_in_statements"] > 0


def test_quick_run_splits_end_to_end_time_between_database_and_python(quick_report):
    for row in quick_report["measurements"]:
        if row["id"].startswith("e2e."):
            details = row["details"]
            assert 0 < details["database_share"] <= 1
            assert details["ratio_if_python_were_free"] == pytest.approx(
                row["ratio_to_raw"] / details["database_share"], rel=0.01)


def test_quick_run_gives_the_ceiling_the_commits_alone_put_on_end_to_end(quick_report):
    for row in quick_report["measurements"]:
        if row["id"].startswith("e2e."):
            details = row["details"]
            assert 0 < details["commit_share"] < details["database_share"]
            assert details["ratio_if_only_commits_took_time"] == pytest.approx(
                row["ratio_to_raw"] / details["commit_share"], rel=0.01)


def test_quick_run_counts_the_wal_frames_an_end_to_end_task_writes(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    single = rows["e2e.single"]["details"]
    # a receive alone writes a task row, its key and two index entries, and the time
    assert single["wal_frames_per_commit"] >= 2
    assert single["wal_frames_per_task"] == pytest.approx(
        single["wal_frames_per_commit"] * single["commits_per_task"], rel=0.01)
    batched = rows["e2e.batched"]["details"]
    assert batched["wal_frames_per_commit"] > single["wal_frames_per_commit"]


def test_quick_run_prices_commits_by_the_pages_they_write(quick_report):
    text = render(quick_report)
    assert "What a commit costs by the pages it writes" in text
    assert "How many pages an end-to-end task's commits write" in text


def test_quick_run_answers_every_wait_it_opens_with_one_accepted_signal(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    signals = rows["signals.accepted"]
    assert signals["unit"] == "signals/s" and signals["backend"] == "sqlite"
    per_round = quick_report["sizes"]["signals"]
    assert signals["details"]["signals_per_round"] == per_round == 30
    # one untimed warm-up round, then the timed ones: every wait in the store was answered
    assert signals["details"]["waits_in_store_at_end"] == per_round * (
        quick_report["sizes"]["rounds"] + 1)


def test_quick_run_judges_every_bar(quick_report):
    bars = {bar["id"]: bar for bar in quick_report["bars"]}
    expected = {"claim_flat_under_backlog": 0.7, "single_vs_raw": 0.12, "batched_vs_raw": 1.2,
                "receive_vs_raw": 0.6, "frames_per_task": 20.0,
                "signals_vs_raw": 0.3, "worker_vs_raw": 0.5, "delivered_vs_raw": 0.3,
                "worker_latency_sqlite_p50": 5.0, "concurrency_8_vs_1": 6.0,
                "rss_sqlite_worker": 1.1, "rss_sqlite_dispatcher": 1.1,
                "due_claims_flat_under_future_backlog": 0.7, "peers_sqlite_2x_huey": 2.0,
                "http_submit_sqlite": 0.5,
                **{f"peers_huey_w{workers}_{metric}": 1.0 for workers in (1, 4)
                   for metric in ("processed", "end_to_end")}}
    if quick_report["postgres"] is not None:
        expected |= {"pg_claim_scales_to_4_workers": 2.0, "pg_latency_p50": 10.0,
                     "pg_workers_vs_raw_pg": 0.75, "worker_latency_pg_p50": 5.0,
                     "rss_pg_worker": 1.1, "rss_pg_dispatcher": 1.1, "peers_pg_3x_best": 3.0,
                     "http_submit_postgres": 0.5, "pg_claim_flat_under_backlog": 0.7,
                     **{f"peers_procrastinate_w{workers}_{metric}": 1.0 for workers in (1, 4)
                        for metric in ("processed", "end_to_end")}}
    assert {name: bar["required"] for name, bar in bars.items()} == expected
    rows = {row["id"]: row for row in quick_report["measurements"]}
    for bar in bars.values():
        numerator = rows[bar["numerator"]]
        if bar["denominator"] is None:
            assert bar["unit"] == numerator["unit"], bar
            assert bar["measured"] == pytest.approx(numerator["value"], abs=0.06), bar
        else:
            key = "ratio_to_raw" if bar["basis"] == "ratio" else "value"
            assert bar["unit"] == "x", bar
            # (abs: the report rounds a bar to 3 decimals, and a small ratio loses 1% there)
            assert bar["measured"] == pytest.approx(
                numerator[key] / rows[bar["denominator"]][key], rel=1e-2, abs=1e-3), bar
        at_least = bar["kind"] == "minimum"
        assert bar["passed"] is (bar["measured"] >= bar["required"] if at_least
                                 else bar["measured"] <= bar["required"]), bar
    assert bars["signals_vs_raw"]["text"] == (
        "accepted signals/s, one at a time >= 0.3x raw commits/s")
    assert quick_report["all_bars_passed"] is all(bar["passed"] for bar in bars.values())


def test_quick_run_measures_postgres_workers_and_latency(pg_report):
    rows = {row["id"]: row for row in pg_report["measurements"] if row["backend"] == "postgres"}
    assert set(rows) == (POSTGRES_THROUGHPUT_ROWS | PG_RUNTIME_ROWS | PG_STEP_ROWS | PG_PEER_ROWS
                         | PG_HTTP_ROWS | PG_REMOTE_ROWS | PG_BACKLOG_ROWS | PG_PROFILE_ROWS
                         | {"pg.latency.p50", "pg.latency.p99"})
    for name in POSTGRES_THROUGHPUT_ROWS:
        row = rows[name]
        assert row["unit"] == "tasks/s" and row["value"] > 0
        assert row["details"]["workers"] == int(name.rpartition("_")[2])
        assert len(row["round_ratios"]) == len(row["rounds"]) == pg_report["sizes"]["rounds"]
        assert row["ratio_to_raw"] == pytest.approx(statistics.median(row["round_ratios"]),
                                                    abs=1e-4)
    p50, p99 = rows["pg.latency.p50"], rows["pg.latency.p99"]
    for row in (p50, p99):
        assert row["unit"] == "ms" and row["ratio_to_raw"] is None and row["round_ratios"] == []
        assert len(row["rounds"]) == pg_report["sizes"]["rounds"]
    assert 0 < p50["value"] <= p99["value"] < 1_000
    server = pg_report["postgres"]
    assert server["server_version"] and server["synchronous_commit"] and server["fsync"]


def test_quick_run_times_worker_processes_from_the_database(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    sizes = quick_report["sizes"]
    for name in RUNTIME_ROWS:
        details = rows[name]["details"]
        assert details["settings"] == "defaults" and details["workers"] == 1
    assert rows["runtime.sqlite.workers_1"]["details"]["tasks_per_round"] == sizes[
        "runtime_tasks"]
    assert rows["runtime.sqlite.delivered"]["details"]["dispatchers"] == 1
    assert rows["runtime.io.concurrency_8"]["details"]["concurrency"] == 8
    assert rows["runtime.scheduled.future_3000"]["details"]["future_backlog"] == sizes[
        "future_backlog"]


def test_quick_run_reads_the_latency_of_an_idle_worker_from_its_handler(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    p50, p99 = rows["runtime.latency.sqlite.p50"], rows["runtime.latency.sqlite.p99"]
    for row in (p50, p99):
        assert row["unit"] == "ms" and row["round_ratios"] == []
        assert len(row["rounds"]) == quick_report["sizes"]["rounds"]
    assert 0 < p50["value"] <= p99["value"] < 1_000


def test_quick_run_reads_worker_and_dispatcher_memory_after_warm_up_and_at_the_end(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    sizes = quick_report["sizes"]
    for name in RSS_ROWS:
        row = rows[name]
        details = row["details"]
        assert row["unit"] == "x" and details["tasks"] == sizes["rss_tasks"]
        assert details["warm_up_tasks"] == sizes["rss_warm_up"]
        assert details["rss_kib_after_warm_up"] > 0 and details["rss_kib_at_end"] > 0
        assert row["value"] == pytest.approx(
            details["rss_kib_at_end"] / details["rss_kib_after_warm_up"], rel=1e-3)


def test_quick_run_measures_postgres_workers_against_a_raw_postgres_loop(pg_report):
    rows = {row["id"]: row for row in pg_report["measurements"]}
    rounds = pg_report["sizes"]["rounds"]
    raw = rows["pg.raw_commit_loop"]
    curve = [rows[f"runtime.pg.workers_{count}"] for count in (1, 4)]
    assert raw["unit"] == "commits/s"
    assert len(raw["rounds"]) == len(curve) * (rounds + 1)  # around each round of each count
    for count, workers in zip((1, 4), curve, strict=True):
        assert workers["details"]["workers"] == count
        around = workers["details"]["raw_pg_rates"]
        assert len(around) == rounds + 1
        ratios = workers["details"]["round_ratios_to_pg_raw"]
        assert ratios == pytest.approx([rate / ((around[index] + around[index + 1]) / 2)
                                        for index, rate in enumerate(workers["rounds"])],
                                       rel=0.01)
    assert 0 < rows["runtime.latency.pg.p50"]["value"] <= rows["runtime.latency.pg.p99"]["value"]


def test_quick_run_drops_the_postgres_schemas_it_created(pg_report):
    assert pg_report["_schemas"] == []


def test_quick_run_reads_the_claim_plan_and_describes_the_machine(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    plans = rows["claim_finish.backlog_3000"]["details"]["claim_plans"]
    assert set(plans) == {"claim_tasks", "tasks_lease_expired", "tasks_deadline_passed"}
    assert "tasks_claimable" in "\n".join(plans["claim_tasks"])
    machine = quick_report["machine"]
    assert machine["nproc"] >= 1 and machine["sqlite"] and machine["python"]
    assert machine["filesystem"] not in {"tmpfs", "ramfs"}
    assert len(quick_report["load_average"]["before"]) == 3


def test_quick_run_cleans_up_its_databases_and_leaves_results_alone(quick_report):
    assert quick_report["_leftovers"] == []
    assert quick_report["mode"] == "quick"
    assert "wrote" not in quick_report["_stderr"]


def test_results_markdown_shows_command_machine_figures_and_bars(quick_report):
    text = render(quick_report)
    assert "`postroom bench --quick" in text
    assert "CPUs (`nproc`)" in text and "SQLite" in text
    for row in quick_report["measurements"]:
        assert row["label"] in text
    for bar in quick_report["bars"]:
        assert bar["text"] in text
    assert "pass" in text or "FAIL" in text
    assert "No bar judges" in render({**quick_report, "bars": []})


def test_results_markdown_puts_postgres_rows_in_their_own_table(pg_report):
    text = render(pg_report)
    figures, _, rest = text.partition("## PostgreSQL")
    postgres, _, _ = rest.partition("## Bars")
    assert "PostgreSQL claim+finish" not in figures and "PostgreSQL claim+finish" in postgres
    assert "PostgreSQL" in figures.split("## Machine")[1]  # the server's version, settings
    latency = next(line for line in postgres.splitlines() if "latency, idle worker, p50" in line)
    assert latency.split(" | ")[1].endswith(" ms") and latency.split(" | ")[2] == ""
    assert "<= 10 ms |" in text


def _points(svg: str) -> list[str]:
    """The hover titles of a chart's points: "line: x → median"."""
    return [str(title.text) for title in
            ElementTree.fromstring(svg).iter("{http://www.w3.org/2000/svg}title")]


def test_the_backlog_chart_draws_each_backends_median_at_each_backlog(pg_report):
    charts = plots(pg_report)
    rows = {row["id"]: row for row in pg_report["measurements"]}
    expected = [f"{name}: {size:,} → {statistics.median(rows[f'{prefix}{size}']['rounds']):,.0f}"
                for name, prefix in (("SQLite", "claim_finish.backlog_"),
                                     ("PostgreSQL", "pg.claim_finish.backlog_"))
                for size in (100, 1_000, 3_000)]
    assert _points(charts["claim_backlog.svg"]) == expected


def test_the_workers_chart_draws_postroom_workers_beside_the_raw_postgres_loop(pg_report):
    charts = plots(pg_report)
    rows = {row["id"]: row for row in pg_report["measurements"]}
    points = _points(charts["pg_workers.svg"])
    ours = [rows[f"runtime.pg.workers_{count}"] for count in (1, 4)]
    assert points[:2] == [f"postroom worker processes: {row['details']['workers']} → "
                          f"{statistics.median(row['rounds']):,.0f}" for row in ours]
    assert [point.partition(":")[0] for point in points[2:]] == [
        "raw PostgreSQL commit loop (1 connection)"] * 2


def test_writing_the_results_puts_the_charts_beside_the_markdown(pg_report, tmp_path):
    written = write(pg_report, tmp_path / "RESULTS.md")
    assert written == [tmp_path / "claim_backlog.svg", tmp_path / "pg_workers.svg"]
    markdown = (tmp_path / "RESULTS.md").read_text()
    assert markdown.startswith("# postroom benchmark results")
    assert "![claim_backlog](claim_backlog.svg)" in markdown
    assert "![pg_workers](pg_workers.svg)" in markdown
    for chart in written:
        ElementTree.fromstring(chart.read_text())  # well-formed SVG


def test_a_run_without_the_curves_draws_no_chart(quick_report):
    kept = [row for row in quick_report["measurements"]
            if "backlog_" not in row["id"] and not row["id"].startswith("runtime.pg.workers_")]
    assert plots({**quick_report, "measurements": kept}) == {}


def _check_peer_rows(rows: dict[str, Any], names: set[str], tasks: int) -> None:
    for name in (name for name in names if name.endswith(".processed")):
        processed, details = rows[name], rows[name]["details"]
        end_to_end = rows[name.removesuffix(".processed") + ".end_to_end"]
        assert processed["unit"] == end_to_end["unit"] == "tasks/s"
        assert details["tasks_per_round"] == tasks and details["durability"]
        assert details["worker_peak_rss_kib"] > 10_000  # a Python process, at least
        # end to end adds the enqueueing time to the processing time
        assert 0 < end_to_end["value"] < min(processed["value"], details["enqueue_per_s"])


def test_quick_run_puts_postroom_beside_the_installed_peers_on_sqlite(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    _check_peer_rows(rows, PEER_ROWS, quick_report["sizes"]["peer_tasks"])
    assert rows["peers.huey.workers_1.processed"]["details"]["durability"] == (
        "SqliteHuey(fsync=True): WAL, synchronous=FULL")
    assert rows["peers.postroom-sqlite.workers_4.delivered.processed"]["details"]["to"] == (
        "delivered")


def test_quick_run_puts_postroom_beside_the_installed_peers_on_postgres(pg_report):
    rows = {row["id"]: row for row in pg_report["measurements"]}
    _check_peer_rows(rows, PG_PEER_ROWS, pg_report["sizes"]["peer_tasks"])


def test_quick_run_leaves_oban_out_with_its_reason(pg_report):
    assert "oban left out of this smoke run: oban-py runs in a Python 3.12" in (
        pg_report["_stderr"])


def test_quick_run_counts_wal_statements_and_round_trips_of_each_step(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    for name in STEP_ROWS:
        row, details = rows[name], rows[name]["details"]
        assert row["unit"] == "WAL frames/commit" and row["value"] >= 1
        # at least BEGIN and COMMIT, each a round trip of its own on SQLite
        assert details["statements"] >= details["round_trips"] >= 2
        assert details["tasks"] == quick_report["sizes"]["single_tasks"]


def test_quick_run_reads_postgres_wal_bytes_of_each_step(pg_report):
    rows = {row["id"]: row for row in pg_report["measurements"]}
    for name in PG_STEP_ROWS:
        row = rows[name]
        assert row["unit"] == "WAL bytes/commit" and row["details"]["wal_min"] > 0
        assert row["details"]["round_trips"] >= 2


def test_quick_run_samples_where_each_kernel_calls_time_goes(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    for name in PROFILE_ROWS:
        row, details = rows[name], rows[name]["details"]
        assert row["unit"] == "us/call" and row["value"] > 0
        assert details["calls"] == quick_report["sizes"]["profile_calls"]
        assert details["samples"] > 0
        assert sum(details["shares"].values()) == pytest.approx(1.0, abs=0.01)
        # every call commits: the sampler sees the COMMIT
        assert details["shares"]["commit"] > 0
        for item in details["top"]:
            assert item["module"].startswith("postroom/") and "_bench" not in item["module"]
            assert 0 < item["share"] <= details["shares"]["postroom"]


def test_quick_run_samples_the_kernel_calls_on_postgres_too(pg_report):
    rows = {row["id"]: row for row in pg_report["measurements"]}
    for name in PG_PROFILE_ROWS:
        assert rows[name]["details"]["shares"]["commit"] > 0


def test_results_markdown_tabulates_the_profiles(quick_report):
    text = render(quick_report)
    profiles = text.partition("## Profiles of the kernel calls")[2].partition("## ")[0]
    for call in CALLS:
        assert f"| sqlite | {call} |" in profiles
        assert f"- sqlite, `{call}`: " in profiles


def test_results_markdown_tabulates_the_peers_and_the_steps(quick_report):
    text = render(quick_report)
    peers = text.partition("## Beside the peers")[2].partition("## Sizes")[0]
    assert "| huey | sqlite | 1 | done |" in peers
    assert "| postroom-sqlite | sqlite | 4 | delivered |" in peers
    steps = text.partition("## Per step of a one-at-a-time task")[2].partition("##")[0]
    for step in ("receive", "dispatch claim", "receiver", "dispatch record"):
        assert f"| sqlite | {step} |" in steps


def test_results_markdown_shows_each_step_beside_an_earlier_runs(quick_report):
    from postroom._bench.scenarios import steps

    earlier = json.loads(json.dumps(quick_report))  # an earlier run: its own copy
    for row in earlier["measurements"]:
        if row["id"] == "steps.sqlite.receive":
            row["value"], row["details"]["statements"] = 13.0, 7.0
    text = render({**quick_report, "before": steps.earlier(earlier)})
    table = text.partition("## Per step of a one-at-a-time task")[2].partition("##")[0]
    now = next(row for row in quick_report["measurements"]
               if row["id"] == "steps.sqlite.receive")
    assert (f"| sqlite | receive | 13.0 -> {now['value']:,.1f} frames |" in table
            and f"| 7 -> {now['details']['statements']:g} |" in table), table
    assert "each cell shows before -> now" in table


def test_an_earlier_report_without_steps_is_refused():
    with pytest.raises(ValueError, match="--only steps"):
        from postroom._bench.scenarios import steps

        steps.earlier({"measurements": [{"id": "e2e.single"}]})


def test_unreachable_postgres_fails_the_run_before_anything_runs():
    folder = Path(tempfile.mkdtemp(prefix="bench-test-", dir=default_folder()))
    try:
        done = _bench("--dir", str(folder), "--pg-url",
                      "postgresql://postgres:hidden@127.0.0.1:1/postgres")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "PostgreSQL at postgresql://postgres:***@127.0.0.1:1/postgres is unreachable" \
            in done.stderr
        assert ("pg-claim, pg-claim-backlog, pg-e2e, pg-latency, pg-workers, pg-worker-latency, "
                "pg-rss, pg-steps, pg-peers, pg-http-submit, pg-remote-worker, pg-profiles need it"
                in done.stderr)
        assert "--only" in done.stderr
        assert "hidden" not in done.stderr and done.stdout == ""
        assert list(folder.iterdir()) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_only_offers_every_registered_scenario():
    from postroom.cli import main

    only = next(param for param in main.commands["bench"].params if param.name == "only")
    assert list(only.type.choices) == list(SCENARIOS)  # type: ignore[attr-defined]


def test_a_dead_postgres_worker_process_fails_the_next_round_at_once():
    from postroom._bench.context import BenchError
    from postroom._bench.scenarios.postgres import _Swarm

    require_postgres()
    url = pg.create_schema("bench-swarm")
    swarm = _Swarm(url, 2, job="claim", batch=1)
    try:
        victim = swarm._processes[0]
        victim.kill()
        victim.join(timeout=30)
        with pytest.raises(BenchError, match="exited with code"):
            swarm.round(1)
    finally:
        swarm.close()
        pg.drop_schema(url)


def test_the_cli_knows_the_bench_scenarios_and_default_url_without_importing_the_bench():
    from postroom import cli
    from postroom._bench.runner import SCENARIOS
    from postroom._bench.scenarios.postgres import DEFAULT_URL

    assert tuple(SCENARIOS) == cli.BENCH_SCENARIOS
    assert cli.DEFAULT_PG_URL == DEFAULT_URL
