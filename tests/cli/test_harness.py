"""The harness's commands (``python -m tests.harness``), run as real subprocesses from the
checkout, the way the README's testing section runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.harness.children import Process, python, run


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tests.harness ARGS``."""
    return run(python("-m", "tests.harness", *args), timeout=120)


def test_random_audit_prints_a_clean_summary_and_exits_zero(tmp_path):
    result = harness("random-audit", "--seeds", "2", "--ops", "40", "--rounds", "1",
                 "--processes", "2", "--wait-rounds", "1", "--wait-processes", "3",
                 "--folder", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["seeds"], summary["operations"], summary["rounds"]) == (2, 80, 1)
    assert (summary["wait_rounds"], summary["wait_processes_started"]) == (1, 3)
    assert summary["violations"] == []
    assert sum(summary["per_operation"].values()) == 80
    assert sorted(path.name for path in tmp_path.iterdir())[:4] == [
        "rounds-receiver.db", "rounds-store.db", "seed-0-receiver.db", "seed-0-store.db"]
    assert {"wait-rounds-receiver.db", "wait-rounds-store.db"} <= {
        path.name for path in tmp_path.iterdir()}


def test_random_audit_exits_non_zero_naming_the_seed_step_and_operation(monkeypatch):
    from click.testing import CliRunner

    from postroom import tasks
    from tests.harness.cli import main

    monkeypatch.setattr(tasks, "after", lambda tx, settings, row, decision: None)
    result = CliRunner().invoke(main, ["random-audit", "--seeds", "1", "--ops", "50",
                                       "--rounds", "0", "--wait-rounds", "0"])
    assert result.exit_code == 1
    output = result.stdout  # older click mixes the progress bar (stderr) in: skip past it
    violation = json.loads(output[output.index("{"):])["violations"][0]
    assert {"seed", "step", "operation", "problems", "reproduce"} <= violation.keys()


def test_random_audit_refuses_a_folder_an_earlier_run_left_databases_in(tmp_path):
    (tmp_path / "seed-0-store.db").write_bytes(b"")
    result = harness("random-audit", "--seeds", "1", "--ops", "5", "--rounds", "0",
                 "--wait-rounds", "0", "--folder", str(tmp_path))
    assert result.returncode == 2 and "must be a new or empty folder" in result.stderr


def test_drain_refuses_more_worker_processes_than_a_host_should_start():
    result = harness("drain", "sqlite:///unused.db", "--workers", "100000")
    assert result.returncode == 2 and "--workers" in result.stderr


def test_a_scenario_file_that_is_not_a_scenario_suite_is_one_line(tmp_path):
    for text in ("{not json", "[]", '{"cases": []}'):
        path = tmp_path / "suite.json"
        path.write_text(text, "utf-8")
        result = harness("scenarios", "--file", str(path))
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith("Error: InvalidInput: file:")


def test_a_folder_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("", "utf-8")
    result = harness("random-audit", "--seeds", "1", "--ops", "5", "--rounds", "0",
                 "--wait-rounds", "0", "--folder", str(blocker / "sub"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def _children(pid: int) -> set[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                           check=False)
    return {int(line) for line in found.stdout.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_drain_and_its_worker_processes(tmp_path, signum):
    command = python("-m", "tests.harness", "drain", f"sqlite:///{tmp_path / 'store.db'}",
                     "--tasks", "5000", "--workers", "2", "--dispatchers", "1",
                     "--kill-every", "0")
    with Process(command, name="drain") as drain:
        deadline = time.monotonic() + 60
        while len(workers := _children(drain.pid)) < 3:  # the enqueueing comes first
            assert drain.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        drain.signal(signum)
        assert drain.wait(timeout=30) == 128 + signum  # 143 for SIGTERM, 130 for Ctrl-C
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)  # killed; init reaps them as orphans
    assert not any(map(_alive, workers))
