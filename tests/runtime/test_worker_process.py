"""``postroom worker`` as users run it: a real process, real signals."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

import postroom
from postroom import TaskState
from tests.harness.children import Process, python, run
from tests.runtime.support import eventually, send

#: The handlers the worker process imports: ``slow`` waits for a file to exist (so a test
#: decides when it ends), ``quick`` returns at once.
JOBS = textwrap.dedent("""
    import os, time
    from postroom.runtime import App

    app = App()

    @app.handler("quick")
    def quick(payload, ctx):
        return {"n": payload["n"]}

    @app.handler("slow")
    def slow(payload, ctx):
        open(os.path.join(payload["folder"], ctx.task_id + ".started"), "w").close()
        gate = os.path.join(payload["folder"], "go")
        while not os.path.exists(gate) and not ctx.cancelled:
            time.sleep(0.01)
        return "finished"
""")


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(JOBS, "utf-8")
    return tmp_path


def worker(url: str, folder: Path, *args: str) -> Process:
    return Process(python("-m", "postroom", "worker", url, "--import", "jobs", "--poll", "0.1",
                          *args), name="worker", env={"PYTHONPATH": str(folder)})


def test_a_worker_process_runs_the_tasks_of_its_queues(store, db_url, jobs):
    ids = [send(store, f"m-{n}", {"n": n}, queue="quick") for n in range(100)]
    with worker(db_url, jobs, "--queue", "quick") as process:
        eventually(lambda: all(store.task(t).state == TaskState.DONE for t in ids))
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
    assert store.task(ids[42]).result == {"n": 42}


def test_a_worker_process_logs_its_start_and_stop_on_stderr(store, db_url, jobs):
    with worker(db_url, jobs, "--queue", "quick") as process:
        eventually(lambda: "worker started on quick" in process.stderr())
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
        said = process.stderr()
    assert "INFO postroom.worker worker started on quick" in said
    assert "INFO postroom.worker worker stopped" in said


def test_a_worker_process_at_log_level_warning_says_only_why_it_stops(store, db_url, jobs):
    task_id = send(store, "m-1", {"n": 1}, queue="quick")
    with worker(db_url, jobs, "--queue", "quick", "--log-level", "warning") as process:
        eventually(lambda: store.task(task_id).state == TaskState.DONE)  # it runs
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
        said = process.stderr().strip().splitlines()
    assert [line.split(":")[0] for line in said] == ["SIGTERM"]


def test_sigterm_lets_running_handlers_finish_within_the_grace_period(store, db_url, jobs):
    task_id = send(store, "m-1", {"folder": str(jobs)}, queue="slow")
    with worker(db_url, jobs, "--queue", "slow", "--grace", "60") as process:
        eventually((jobs / f"{task_id}.started").exists)
        process.signal(signal.SIGTERM)
        (jobs / "go").touch()
        assert process.wait() == 143
    assert store.task(task_id).state == TaskState.DONE


def test_sigterm_releases_what_outlives_the_grace_period_and_marks_nothing_done(
        store, db_url, jobs):
    ids = [send(store, f"m-{n}", {"folder": str(jobs)}, queue="slow") for n in range(3)]
    with worker(db_url, jobs, "--queue", "slow", "--grace", "0.2") as process:
        eventually(lambda: all((jobs / f"{t}.started").exists() for t in ids))
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
    for task_id in ids:
        task = store.task(task_id)
        assert (task.state, task.attempts, task.owner) == (TaskState.PENDING, 0, None)
        assert store.reply(task_id) is None


def test_a_second_signal_exits_at_once(store, db_url, jobs):
    task_id = send(store, "m-1", {"folder": str(jobs)}, queue="slow")
    with worker(db_url, jobs, "--queue", "slow", "--grace", "600") as process:
        eventually((jobs / f"{task_id}.started").exists)
        process.signal(signal.SIGINT)
        eventually(lambda: "SIGINT again exits at once" in process.stderr())
        process.signal(signal.SIGINT)
        assert process.wait() == 130
    assert store.task(task_id).state == TaskState.RUNNING  # its lease will run out


def test_a_handler_past_the_timeout_given_for_its_queue_is_abandoned_and_its_attempt_fails(
        store, db_url, jobs):
    task_id = send(store, "m-1", {"folder": str(jobs)}, queue="slow", max_attempts=1)
    with worker(db_url, jobs, "--queue", "slow", "--timeout", "slow=0.3",
                "--concurrency", "slow=1", "--concurrency", "4") as process:
        eventually(lambda: store.task(task_id).state == TaskState.FAILED)
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
    assert store.task(task_id).last_error.endswith("ran past its execution timeout of 0.3s")


def test_a_killed_workers_task_is_recovered_by_another_workers_rescuer(db_url, jobs):
    settings = postroom.Settings(lease=1.0)
    with postroom.open_store(db_url, settings=settings) as store:
        task_id = send(store, "m-1", {"folder": str(jobs)}, queue="slow")
        with worker(db_url, jobs, "--queue", "slow", "--lease", "1") as first:
            eventually((jobs / f"{task_id}.started").exists)
            first.kill()
        (jobs / "go").touch()
        with worker(db_url, jobs, "--queue", "slow", "--lease", "1") as second:
            eventually(lambda: store.task(task_id).state == TaskState.DONE)
            second.signal(signal.SIGTERM)
            second.wait()
        task = store.task(task_id)
        assert (task.attempts, task.fence) == (2, 2)


@pytest.mark.parametrize(("args", "problem"), [
    (["--import", "no_such_module"], "cannot import 'no_such_module'"),
    (["--import", "jobs:missing"], "has no App named 'missing'"),
    (["--import", "jobs", "--queue", "nobody"], "no handler for 'nobody'"),
    (["--import", "jobs", "--concurrency", "slow=many"], "'slow=many' is not QUEUE=N or N"),
    (["--import", "jobs", "--timeout", "10"], "'10' is not QUEUE=SECONDS"),
    (["--import", "jobs", "--timeout", "nobody=1"], "not a queue this worker claims: 'nobody'"),
    (["--import", "jobs", "--concurrency", "slow=0"], "queue_concurrency['slow']"),
    (["--import", "jobs", "--concurrency", "0"], "concurrency: must be"),
])
def test_a_worker_that_cannot_run_says_why_in_one_line_and_exits_2(db_url, jobs, args,
                                                                   problem):
    result = run(python("-m", "postroom", "worker", db_url, *args),
                 env={"PYTHONPATH": str(jobs)})
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr and "Traceback" not in result.stderr
