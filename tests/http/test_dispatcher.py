"""The dispatcher in this process, against real servers on 127.0.0.1, on both backends:
end to end, per-endpoint isolation, 410, an ACK lost after the receiver committed, replies
waiting for an endpoint, rotation, and delivery into one receiver."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import postroom
from postroom import ReplyState, signing
from postroom.audit import audit_database
from postroom.http.receiving import ReceiverApp
from postroom.runtime.dispatcher import Dispatcher, DispatcherSettings
from postroom.runtime.transports.webhook import Timeouts
from tests.http.servers import RawServer, Switch, answer, refusing_port, serve
from tests.support import database_of, envelope

#: Quick retries, so that a test sees several attempts in well under a second.
SETTINGS = postroom.Settings(delivery_backoff=postroom.FixedBackoff(seconds=0.05),
                             delivery_budget=5)


@pytest.fixture
def live_store(make_url) -> Iterator[postroom.Store]:
    """A store on the system clock: the dispatcher's leases and retries run in real time."""
    with postroom.open_store(make_url("store"), settings=SETTINGS) as store:
        yield store


def finished(store: postroom.Store, sender: str, count: int, *, start: int = 0) -> list[str]:
    """``count`` done tasks sent by ``sender``; their task ids."""
    auth = postroom.AuthContext(principal=sender)
    acks = store.receive_atomic(auth, [envelope(f"{sender}-{i}", sender=sender,
                                                deadline=time.time() + 3600)
                                       for i in range(start, start + count)])
    store.finish_batch([(claim, {"n": 1}) for claim in store.claim_batch("w", count)])
    return [ack.task_id for ack in acks]


def states(store: postroom.Store, task_ids: list[str]) -> list[ReplyState]:
    return [store.reply(task_id).state for task_id in task_ids]  # type: ignore[union-attr]


def until(condition: Callable[[], bool], *, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


@contextlib.contextmanager
def dispatching(store: postroom.Store, **kwargs: object) -> Iterator[Dispatcher]:
    settings = DispatcherSettings(owner="d-test", batch=8, concurrency=8, poll=0.2,
                                  timeouts=Timeouts(connect=1, read=2, total=3))
    dispatcher = Dispatcher(store, settings=kwargs.pop("settings", settings),  # type: ignore[arg-type]
                            seed=0, **kwargs)  # type: ignore[arg-type]
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        thread.join(30)
        assert not thread.is_alive(), "the dispatcher did not stop"


@contextlib.contextmanager
def hook(store: postroom.Store, receiver: postroom.Receiver, principal: str = "planner",
         **options: object) -> Iterator[str]:
    """``principal``'s endpoint: a receiving app under uvicorn that knows its secret."""
    switch = Switch()
    with serve(switch) as url:
        added = store.add_endpoint(principal, url, allow_private=True, **options)  # type: ignore[arg-type]
        switch.app = ReceiverApp(receiver, [added.secrets[0].secret])
        yield url


def test_replies_go_to_their_endpoints_signed_with_one_effect_each(live_store, receiver):
    tasks = finished(live_store, "planner", 20)
    with hook(live_store, receiver, concurrency=3), dispatching(live_store) as dispatcher:
        until(lambda: set(states(live_store, tasks)) == {ReplyState.SENT},
              what="every reply sent")
    assert dispatcher.report.sent == 20
    assert [receiver.effect_count("reply:" + task) for task in tasks] == [1] * 20
    assert audit_database(database_of(live_store)) == []


class Held:
    """An ASGI app that holds every request until ``release`` (a slow endpoint), then
    answers 200; ``arrived`` counts the requests that reached it."""

    def __init__(self) -> None:
        self.arrived = 0
        self.gate = threading.Event()

    async def __call__(self, scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        self.arrived += 1
        await asyncio.to_thread(self.gate.wait, 30)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def test_a_slow_and_a_dead_endpoint_never_hold_up_a_healthy_one(live_store, receiver):
    # The slow and the dead endpoints' replies are ahead of the healthy one's in the outbox.
    slow = finished(live_store, "slow", 6)
    dead = finished(live_store, "dead", 6)
    healthy = finished(live_store, "planner", 12)
    held = Held()
    live_store.add_endpoint("dead", f"http://127.0.0.1:{refusing_port()}/",
                            allow_private=True, schedule=[0.05], budget=100)
    settings = DispatcherSettings(owner="d-test", batch=8, concurrency=6, poll=0.2,
                                  timeouts=Timeouts(connect=1, read=10, total=10))
    with serve(held) as slow_url, hook(live_store, receiver, concurrency=2):
        live_store.add_endpoint("slow", slow_url, allow_private=True, concurrency=1)
        with dispatching(live_store, settings=settings):
            until(lambda: set(states(live_store, healthy)) == {ReplyState.SENT},
                  what="the healthy endpoint's replies sent")
            # All of them went out while the slow endpoint still held its first request and
            # the dead one refused every connection.
            assert held.arrived == 1
            assert set(states(live_store, slow)) <= {ReplyState.PENDING, ReplyState.SENDING}
            assert ReplyState.SENT not in states(live_store, dead)
            held.gate.set()
            until(lambda: set(states(live_store, slow)) == {ReplyState.SENT},
                  what="the slow endpoint's replies sent")
    assert [receiver.effect_count("reply:" + task) for task in healthy] == [1] * 12
    for task in dead:
        assert "Connect" in live_store.reply(task).last_error
    assert audit_database(database_of(live_store)) == []


def test_a_410_makes_the_reply_dead_and_the_endpoint_disabled_and_the_rest_wait(live_store):
    async def gone(line, headers, body):
        return answer(410)

    tasks = finished(live_store, "planner", 5)
    with RawServer(gone) as server:
        live_store.add_endpoint("planner", server.url, allow_private=True, concurrency=1)
        with dispatching(live_store):
            until(lambda: ReplyState.DEAD in states(live_store, tasks), what="a dead reply")
            until(lambda: sum(live_store.awaiting_endpoints().values()) == 4,
                  what="the other replies parked")
        assert server.accepted == 1  # nothing more was sent to a gone endpoint
    endpoint = live_store.endpoint("planner")
    assert not endpoint.enabled and endpoint.disabled_reason.startswith("410 Gone at")
    assert sorted(states(live_store, tasks)).count(ReplyState.PENDING) == 4
    assert audit_database(database_of(live_store)) == []


def test_an_ack_lost_after_the_receiver_committed_is_redelivered_as_a_duplicate(live_store,
                                                                                 receiver):
    tasks = finished(live_store, "planner", 1)
    secret: list[str] = []
    dropped: list[int] = []

    async def commit_then_hang_up(line, headers, body):
        reply_id = signing.verify(secret, headers, body.decode(), now=time.time())
        ack = await asyncio.to_thread(receiver.accept, reply_id, body.decode())
        if not dropped:
            dropped.append(1)
            return None  # committed, then the connection drops before any answer
        return answer(200, body=b'{"duplicate": %s}' % str(ack.duplicate).lower().encode())

    with RawServer(commit_then_hang_up) as server:
        secret.append(live_store.add_endpoint("planner", server.url, allow_private=True)
                      .secrets[0].secret)
        with dispatching(live_store):
            until(lambda: states(live_store, tasks) == [ReplyState.SENT], what="sent")
    reply = live_store.reply(tasks[0])
    assert reply.attempts == 2 and server.accepted == 2
    assert receiver.effect_count(reply.reply_id) == 1


def test_a_reply_waits_for_its_endpoint_and_goes_out_promptly_once_added(live_store,
                                                                         receiver):
    tasks = finished(live_store, "planner", 3)
    settings = DispatcherSettings(owner="d-test", poll=60.0)  # only a wake-up is prompt
    with dispatching(live_store, settings=settings):
        until(lambda: live_store.awaiting_endpoints() == {"planner": 3}, what="parked")
        assert [live_store.reply(task).attempts for task in tasks] == [0, 0, 0]
        with hook(live_store, receiver):
            until(lambda: set(states(live_store, tasks)) == {ReplyState.SENT}, timeout=10,
                  what="sent after the endpoint was added")


def test_a_rotated_secret_signs_the_next_deliveries(live_store, receiver):
    first = finished(live_store, "planner", 2)
    switch = Switch()
    with serve(switch) as url:
        old = live_store.add_endpoint("planner", url, allow_private=True).secrets[0].secret
        switch.app = ReceiverApp(receiver, [old])
        with dispatching(live_store):
            until(lambda: set(states(live_store, first)) == {ReplyState.SENT}, what="sent")
            new = live_store.rotate_endpoint_secret("planner", expire_old_after=0)
            switch.app = ReceiverApp(receiver, [new.secrets[0].secret])  # knows only the new
            later = finished(live_store, "planner", 2, start=2)
            until(lambda: set(states(live_store, later)) == {ReplyState.SENT}, what="sent")
    assert receiver.effects_total() == 4


def test_with_a_receiver_every_reply_goes_into_it_in_this_process(live_store, receiver):
    tasks = finished(live_store, "planner", 10) + finished(live_store, "nobody", 10)
    with dispatching(live_store, receiver=receiver) as dispatcher:
        until(lambda: set(states(live_store, tasks)) == {ReplyState.SENT}, what="sent")
    assert receiver.effects_total() == 20 and dispatcher.report.sent == 20


def test_a_failing_store_is_logged_and_retried_never_ending_the_loop(live_store, receiver,
                                                                     monkeypatch, caplog):
    tasks = finished(live_store, "planner", 2)
    real = live_store.claim_replies
    failures = [postroom.StoreUnavailable("sqlite: database is locked")] * 2

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(live_store, "claim_replies", flaky)
    with caplog.at_level("WARNING", logger="postroom"), \
            dispatching(live_store, receiver=receiver):
        until(lambda: set(states(live_store, tasks)) == {ReplyState.SENT}, what="sent")
    failed = [record for record in caplog.records if record.message.startswith(
        "dispatcher step failed")]
    assert len(failed) == 2 and "locked" in failed[0].last_error


def test_claims_whose_endpoints_cannot_be_read_are_handed_back_not_left_to_lapse(
        live_store, receiver, monkeypatch):
    tasks = finished(live_store, "planner", 3)
    real = live_store.endpoints
    failures = [postroom.StoreUnavailable("postgres: connection lost")]

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(live_store, "endpoints", flaky)
    with hook(live_store, receiver), dispatching(live_store):
        until(lambda: set(states(live_store, tasks)) == {ReplyState.SENT}, what="sent")
    # Each was sent on its first counted attempt: the failed read's claims were given back.
    assert [live_store.reply(task).attempts for task in tasks] == [1, 1, 1]
