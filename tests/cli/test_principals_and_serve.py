"""``postroom principal`` and ``postroom serve``, run as real subprocesses."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx

import postroom
from tests.harness import children
from tests.harness.children import Process, python


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
