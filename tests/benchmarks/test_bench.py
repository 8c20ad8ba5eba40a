"""``postroom bench --quick`` runs to the end and reports every figure and bar.

A smoke test of the benchmark's machinery, run as a real subprocess. It checks the shape of
the report, never the speed: timing belongs to benchmarks, not to assertions.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.report import render
from bench.runner import default_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_report() -> Iterator[dict[str, object]]:
    # The bench refuses a memory file system, and pytest's tmp_path may be one: use a
    # private folder where the bench itself would put its databases.
    folder = Path(tempfile.mkdtemp(prefix="bench-test-", dir=default_folder()))
    try:
        done = subprocess.run([sys.executable, "-m", "postroom", "bench", "--quick", "--dir",
                               str(folder)], capture_output=True, text=True, check=False,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        report: dict[str, object] = json.loads(done.stdout)
        report["_leftovers"] = sorted(path.name for path in folder.iterdir())
        report["_stderr"] = done.stderr
        yield report
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_quick_run_reports_every_scenario_with_a_ratio_to_the_raw_loop(quick_report):
    rows = {row["id"]: row for row in quick_report["measurements"]}
    assert set(rows) == {"raw_sqlite", "claim_finish.backlog_100", "claim_finish.backlog_1000",
                         "claim_finish.backlog_3000", "e2e.single", "e2e.batched"}
    for row in rows.values():
        assert row["value"] == pytest.approx(statistics.median(row["rounds"]), abs=0.1)
        assert len(row["round_ratios"]) == len(row["rounds"]) > 0
        assert all(ratio > 0 for ratio in row["round_ratios"])
        assert row["ratio_to_raw"] == pytest.approx(statistics.median(row["round_ratios"]),
                                                    abs=1e-4)
    assert rows["raw_sqlite"]["ratio_to_raw"] == 1.0
    assert rows["raw_sqlite"]["value"] == quick_report["raw_commits_per_s"]


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


def test_quick_run_judges_the_three_bars(quick_report):
    bars = {bar["id"]: bar for bar in quick_report["bars"]}
    assert set(bars) == {"claim_flat_under_backlog", "single_vs_raw", "batched_vs_raw"}
    assert [bars[name]["required"] for name in sorted(bars)] == [1.5, 0.7, 0.12]
    ratios = {row["id"]: row["ratio_to_raw"] for row in quick_report["measurements"]}
    for bar in bars.values():
        assert bar["measured"] == pytest.approx(
            ratios[bar["numerator"]] / ratios[bar["denominator"]], rel=1e-2)
        assert bar["passed"] is (bar["measured"] >= bar["required"])
    assert quick_report["all_bars_passed"] is all(bar["passed"] for bar in bars.values())


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
    assert "`postroom bench --quick`" in text
    assert "CPUs (`nproc`)" in text and "SQLite" in text
    for row in quick_report["measurements"]:
        assert row["label"] in text
    for bar in quick_report["bars"]:
        assert bar["text"] in text
    assert "pass" in text or "FAIL" in text
