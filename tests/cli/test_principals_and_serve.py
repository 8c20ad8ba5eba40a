"""``postroom principal`` and ``postroom serve``, run as real subprocesses."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

import postroom
from tests.harness import children
from tests.harness.children import Process, python

#: ``db_url`` names a store already made: these commands refuse a URL without one.
STORE_MADE = True


def run(*args: str):
    return children.run(python("-m", "postroom", *args), timeout=120)


def test_principal_add_prints_its_token_once_and_list_never_shows_it(db_url):
    added = run("principal", "add", "remote-1", "--role", "worker", "--queue", "refunds",
                "--store", db_url)
    assert added.returncode == 0, added.stderr
    shown = json.loads(added.stdout)
    assert "only time the token is shown" in added.stderr
    listed = run("principal", "list", "--json", "--store", db_url)
    assert json.loads(listed.stdout)["principals"] == [{
        "name": "remote-1", "role": "worker", "queues": ["refunds"],
        "created_at": json.loads(listed.stdout)["principals"][0]["created_at"],
        "revoked_at": None}]
    assert shown["token"] not in listed.stdout
    with postroom.open_store(db_url) as store:
        assert store.authenticate(shown["token"]).name == "remote-1"


@pytest.mark.parametrize("args", [
    ["principal", "add", "ana", "--role", "agent"], ["principal", "list"],
    ["principal", "revoke", "ana"], ["endpoint", "add", "ana", "https://x.example.com/in"],
    ["endpoint", "list"]])
def test_a_url_without_a_store_is_refused_saying_so_and_nothing_is_created(tmp_path, args):
    path = tmp_path / "typo.db"
    result = run(*args, "--store", f"sqlite:///{path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no postroom store" in result.stderr and "postroom init" in result.stderr
    assert not path.exists()


def test_principal_rotate_and_revoke_end_the_old_tokens(db_url):
    first = json.loads(run("principal", "add", "ana", "--role", "agent",
                           "--store", db_url).stdout)["token"]
    second = json.loads(run("principal", "rotate", "ana", "--store", db_url).stdout)["token"]
    revoked = run("principal", "revoke", "ana", "--store", db_url)
    assert revoked.returncode == 0
    with postroom.open_store(db_url) as store:
        for token in (first, second):
            try:
                store.authenticate(token)
            except postroom.Unauthorized:
                continue
            raise AssertionError("a token still works")


def test_a_worker_without_a_queue_cannot_be_added_exit_2(db_url):
    refused = run("principal", "add", "w", "--role", "worker", "--store", db_url)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("Error: InvalidInput: queues:")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_on_a_port_already_in_use_says_so_in_one_line_and_exits_2(db_url):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run("serve", db_url, "--port", str(port))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"Error: InvalidInput: port: cannot listen on 127.0.0.1:{port}: ")


def test_serve_answers_until_sigterm_then_exits_143(db_url):
    port = free_port()
    with Process(python("-m", "postroom", "serve", db_url, "--port", str(port),
                        "--log-level", "warning"), name="serve") as served:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                break
            except httpx.TransportError:
                assert served.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        served.signal(signal.SIGTERM)
        code = served.wait(timeout=60)
    assert health.json() == ready.json() == {"ok": True}
    assert code == 143


def test_serve_runs_the_stores_duties_so_a_due_wait_times_out_with_no_worker(db_url):
    with postroom.open_store(db_url) as store:
        store.open_wait("trip", "confirm", 0, time.time() + 0.5)
    port = free_port()
    with Process(python("-m", "postroom", "serve", db_url, "--port", str(port),
                        "--log-level", "warning"), name="serve") as served:
        with postroom.open_store(db_url) as store:
            deadline = time.monotonic() + 60
            while store.wait("trip", "confirm").state == "waiting":
                assert served.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            state = store.wait("trip", "confirm").state
        served.signal(signal.SIGTERM)
        served.wait(timeout=60)
        said = served.stderr()
    assert state == "timed_out"
    assert "duties: lease rescuer, deadline sweeper, wait timer, pruner, scheduler" in said


def test_serve_with_no_duties_says_it_runs_none(db_url):
    port = free_port()
    with Process(python("-m", "postroom", "serve", db_url, "--port", str(port), "--no-duties",
                        "--log-level", "warning"), name="serve") as served:
        deadline = time.monotonic() + 60
        while "duties:" not in served.stderr():
            assert served.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        served.signal(signal.SIGTERM)
        served.wait(timeout=60)
        assert "duties: none" in served.stderr()


FLOWS = """
import time
from postroom import FollowUp
from postroom.runtime import App

app = App()
calls = []

@app.resumer("confirm")
def after_confirm(continuation):
    calls.append(continuation)
    if len(calls) == 1:
        raise RuntimeError("downstream is down")  # logged; the next round resumes it
    return FollowUp(message_id="after", payload={"ended": continuation.kind.value},
                    queue="next", deadline=time.time() + 3600)
"""


def test_serve_with_an_apps_resumers_resumes_an_ended_wait_and_logs_a_failed_round(db_url,
                                                                                  tmp_path):
    (tmp_path / "flows.py").write_text(FLOWS, "utf-8")
    with postroom.open_store(db_url) as store:
        store.receive(postroom.AuthContext(principal="alice"), postroom.Envelope(
            message_id="trip-1", sender="alice", deadline=time.time() + 3600, payload={}))
        store.finish(store.claim("w"), "asked", waits=[
            postroom.OpenWait(flow="trip", step="confirm", deadline=time.time() + 0.3)])
    with Process(python("-m", "postroom", "serve", db_url, "--port", str(free_port()),
                        "--import", "flows", "--log-level", "warning"), name="serve",
                 env={"PYTHONPATH": str(tmp_path)}) as served:
        with postroom.open_store(db_url) as store:
            deadline = time.monotonic() + 60
            while not (found := store.list_tasks(queue="next").items):
                assert served.poll() is None and time.monotonic() < deadline, served.tail()
                time.sleep(0.05)
        served.signal(signal.SIGTERM)
        served.wait(timeout=60)
        said = served.stderr()
    assert [task.payload for task in found] == [{"ended": "timeout"}]
    assert "continuation runner" in said
    assert "WARNING postroom.continuations resuming 'trip'/'confirm'" in said
    assert "downstream is down" in said


def test_serve_refuses_to_import_an_app_without_resumers_exit_2(db_url, tmp_path):
    (tmp_path / "jobs.py").write_text("from postroom.runtime import App\napp = App()\n"
                                      "app.handler('q')(lambda payload, ctx: None)\n", "utf-8")
    refused = children.run(python("-m", "postroom", "serve", db_url, "--import", "jobs"),
                           env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert refused.returncode == 2
    assert "that App has no resumer" in refused.stderr
