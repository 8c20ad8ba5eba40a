"""``postroom worker`` given a service URL: a real worker process with no database URL,
claiming and committing through a real server on 127.0.0.1."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests.harness.children import Process, python, run
from tests.runtime.support import eventually
from tests.support import START

JOBS = textwrap.dedent("""
    from postroom.runtime import App

    app = App()

    @app.handler("default")
    async def double(payload, ctx):
        return {"doubled": payload["n"] * 2}
""")


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(JOBS, "utf-8")
    return tmp_path


def test_a_worker_given_a_service_url_runs_the_handlers_over_http_until_sigterm(service,
                                                                                 jobs):
    agent = service.client("alice")
    acks = [agent.submit(f"m-{n}", {"n": n}, deadline=START + 3600) for n in range(20)]
    with Process(python("-m", "postroom", "worker", service.url, "--import", "jobs",
                        "--poll", "0.1"), name="remote-worker",
                 env={"PYTHONPATH": str(jobs),
                      "POSTROOM_TOKEN": service.tokens["wendy"]}) as process:
        eventually(lambda: all(service.store.task(ack.task_id).state == "done"
                               for ack in acks))
        process.signal(signal.SIGTERM)
        assert process.wait() == 143
        said = process.stderr()
    assert service.store.task(acks[7].task_id).result == {"doubled": 14}
    assert f"INFO postroom.client remote worker started on default at {service.url}" in said
    assert "remote worker stopped: {'finish': 20," in said
    assert "httpx" not in said  # a line per request only at --log-level debug
    assert service.store.story(acks[7].task_id).attempts[0].owner == "http:wendy"


@pytest.mark.parametrize(("args", "token", "problem"), [
    ([], "", "POSTROOM_TOKEN"),
    (["--prefetch", "4"], "t", "--prefetch is the local worker's"),
    (["--owner", "me"], "t", "--owner is the local worker's"),
    (["--no-duties"], "t", "--no-duties is the local worker's"),
    (["--concurrency", "other=2"], "t", "queue_concurrency: not a queue this worker claims"),
    (["--timeout", "default=0"], "t", "timeouts['default']: must be a number of seconds"),
])
def test_a_worker_of_a_service_url_that_cannot_run_says_why_and_exits_2(jobs, args, token,
                                                                        problem):
    result = run(python("-m", "postroom", "worker", "http://127.0.0.1:9", "--import", "jobs",
                        *args), env={"PYTHONPATH": str(jobs), "POSTROOM_TOKEN": token})
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr and "Traceback" not in result.stderr


def test_a_worker_whose_principal_is_not_granted_the_apps_queues_exits_naming_the_queue(
        service, jobs):
    result = run(python("-m", "postroom", "worker", service.url, "--import", "jobs"),
                 env={"PYTHONPATH": str(jobs), "POSTROOM_TOKEN": service.tokens["walt"]})
    assert result.returncode == 2, result.stderr
    assert "'default' is not granted" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
