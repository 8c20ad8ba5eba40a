"""``postroom endpoint`` and ``postroom dispatch`` as real subprocesses: the endpoint
commands, and a dispatcher stopped mid-run by SIGTERM, then restarted, with exactly one
effect per reply."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Iterator

import pytest

import postroom
from postroom import ReplyState
from postroom.audit import audit_database
from postroom.http.receiving import ReceiverApp
from tests.harness import children
from tests.harness.children import Process, python
from tests.http.servers import Switch, serve
from tests.support import database_of, envelope

#: ``db_url`` names a store already made: these commands refuse a URL without one.
STORE_MADE = True


def run(*args: str) -> children.subprocess.CompletedProcess[str]:
    return children.run(python("-m", "postroom", *args), timeout=120)


@pytest.fixture
def live_store(db_url) -> Iterator[postroom.Store]:
    with postroom.open_store(db_url) as store:
        yield store


def test_the_endpoint_commands_add_list_rotate_disable_enable_remove(db_url, live_store):
    added = run("endpoint", "add", "planner", "https://hooks.example.com/in", "--store", db_url,
                "--schedule", "standard-webhooks", "--budget", "8", "--concurrency", "2")
    assert added.returncode == 0, added.stderr
    shown = json.loads(added.stdout)
    assert shown["secret"].startswith("whsec_") and "only time" in added.stderr
    assert live_store.endpoint("planner").secrets[0].secret == shown["secret"]

    listed = run("endpoint", "list", "--store", db_url, "--json")
    document = json.loads(listed.stdout)
    (entry,) = document["endpoints"]
    assert (entry["principal"], entry["budget"], entry["schedule"]) == (
        "planner", 8, "standard-webhooks")
    assert shown["secret"] not in listed.stdout  # listings never show a secret
    assert "planner" in run("endpoint", "list", "--store", db_url).stdout

    rotated = json.loads(run("endpoint", "rotate", "planner", "--store", db_url,
                             "--expire-old-after", "3600").stdout)
    assert rotated["secret"] != shown["secret"]
    assert len(live_store.endpoint("planner").secrets) == 2

    disabled = json.loads(run("endpoint", "disable", "planner", "--store", db_url,
                              "--reason", "maintenance").stdout)
    assert disabled == {"principal": "planner", "enabled": False,
                        "disabled_reason": "maintenance"}
    assert json.loads(run("endpoint", "enable", "planner", "--store", db_url).stdout)[
        "enabled"] is True
    assert run("endpoint", "remove", "planner", "--store", db_url).returncode == 0
    assert live_store.endpoints() == {}


@pytest.mark.parametrize(("args", "message"), [
    (("endpoint", "remove", "nobody"), "NotFound: no endpoint for 'nobody'"),
    (("endpoint", "add", "planner", "ftp://x"), "InvalidInput: url:"),
    (("endpoint", "add", "planner", "https://x.example.com", "--budget", "0"),
     "InvalidInput: budget:"),
    (("endpoint", "rotate", "nobody"), "NotFound"),
])
def test_an_endpoint_command_that_cannot_run_says_why_in_one_line_and_exits_2(db_url, args,
                                                                                message):
    result = run(*args, "--store", db_url)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert message in line


def test_a_bad_schedule_is_a_usage_error(db_url):
    result = run("endpoint", "add", "planner", "https://x.example.com", "--store", db_url,
                 "--schedule", "weekly")
    assert result.returncode == 2 and "--schedule" in result.stderr


@pytest.mark.parametrize("command", [("endpoint",), ("endpoint", "add"), ("endpoint", "list"),
                                     ("endpoint", "rotate"), ("endpoint", "disable"),
                                     ("endpoint", "enable"), ("endpoint", "remove"),
                                     ("dispatch",)])
def test_every_new_command_has_help(command):
    result = run(*command, "--help")
    assert result.returncode == 0 and "Usage:" in result.stdout


# -- the dispatcher process -------------------------------------------------------------------


class Slow:
    """The receiving app, a little slow, so that a signal lands while replies are on the
    wire; counts what reached it."""

    def __init__(self, app: ReceiverApp) -> None:
        self.app = app
        self.arrived = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.arrived += 1
            await asyncio.sleep(0.05)
        await self.app(scope, receive, send)


def finished(store: postroom.Store, count: int) -> list[str]:
    auth = postroom.AuthContext(principal="planner")
    acks = store.receive_atomic(auth, [envelope(f"m-{i}", deadline=time.time() + 3600)
                                       for i in range(count)])
    store.finish_batch([(claim, {"n": 1}) for claim in store.claim_batch("w", count)])
    return [ack.task_id for ack in acks]


@contextlib.contextmanager
def dispatcher(db_url: str, *extra: str) -> Iterator[Process]:
    with Process(python("-m", "postroom", "dispatch", db_url, "--poll", "0.2", "--timeout",
                        "2", "--lease", "8", "--concurrency", "4", "--log-level", "warning",
                        *extra), name="dispatch") as process:
        started = json.loads(process.readline() or "{}")
        assert started.get("to") == "endpoints", process.tail()
        yield process


def until(condition, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sigterm_mid_run_leaves_documented_states_and_a_restart_finishes_the_job(
        db_url, live_store, receiver):
    tasks = finished(live_store, 60)
    switch = Switch()
    with serve(switch) as url:
        added = live_store.add_endpoint("planner", url, allow_private=True, concurrency=2)
        slow = Slow(ReceiverApp(receiver, [added.secrets[0].secret]))
        switch.app = slow
        with dispatcher(db_url) as first:
            until(lambda: receiver.effects_total() >= 5)
            first.terminate()
            assert first.wait() == 143
            summary = json.loads(first.readline() or "{}")
        # Stopped gracefully: nothing is left sending, everything delivered is recorded sent,
        # everything else is pending with its attempts given back.
        replies = [live_store.reply(task) for task in tasks]
        assert {reply.state for reply in replies} <= {ReplyState.SENT, ReplyState.PENDING}
        sent = [reply for reply in replies if reply.state is ReplyState.SENT]
        assert 0 < len(sent) < len(tasks) and summary["sent"] == len(sent)
        assert receiver.effects_total() == len(sent) == slow.arrived
        assert all(reply.attempts == 0 for reply in replies if reply.state is ReplyState.PENDING)
        assert audit_database(database_of(live_store)) == []

        with dispatcher(db_url) as second:
            until(lambda: all(live_store.reply(task).state is ReplyState.SENT
                              for task in tasks))
            second.signal(signal.SIGINT)
            assert second.wait() == 130
    assert [receiver.effect_count("reply:" + task) for task in tasks] == [1] * len(tasks)
    assert audit_database(database_of(live_store)) == []
    assert audit_database(database_of(receiver)) == []


def test_a_second_signal_ends_it_at_once_and_leases_recover_what_it_held(
        db_url, live_store, receiver):
    tasks = finished(live_store, 20)
    switch = Switch()
    hold = asyncio.Event()
    arrived: list[str] = []

    async def stuck(scope, receive, send):  # never answers while the first dispatcher runs
        if scope["type"] == "http":
            arrived.append(scope["path"])
            await hold.wait()
        await app(scope, receive, send)

    with serve(switch) as url:
        added = live_store.add_endpoint("planner", url, allow_private=True, concurrency=2)
        app = ReceiverApp(receiver, [added.secrets[0].secret])
        switch.app = stuck
        # The deliveries on the wire outlast the test's two signals by far (a 5 s timeout,
        # never answered): the first stop waits for them, so nothing is handed back before
        # the second signal ends the process. The lease is the shortest that covers them.
        with dispatcher(db_url, "--log-level", "info", "--timeout", "5",
                        "--lease", "9") as first:
            # On the wire, not merely claimed: a claim still waiting for its turn is handed
            # back by the first stop.
            until(lambda: len(arrived) >= 2)
            first.terminate()
            # Two signals before the first is handled are one signal: wait till it is heard.
            until(lambda: "dispatcher stopping" in first.stderr())
            first.terminate()
            assert first.wait(5) == 143, first.tail()
        held = [task for task in tasks if live_store.reply(task).state is ReplyState.SENDING]
        assert held  # the killed dispatcher's claims: recovered when their lease ends
        switch.app = app
        with dispatcher(db_url) as second:
            until(lambda: all(live_store.reply(task).state is ReplyState.SENT
                              for task in tasks), timeout=60)
            second.terminate()
            assert second.wait() == 143
    assert [receiver.effect_count("reply:" + task) for task in tasks] == [1] * len(tasks)
    assert audit_database(database_of(live_store)) == []
