"""``Store.waiter``: a committed transaction wakes the waiters of the channels it announced,
whichever process committed it."""

from __future__ import annotations

import pytest

import postroom
from tests.harness.children import spawn
from tests.support import envelope

#: Long enough for a NOTIFY to travel; a passing test never waits this long.
WAKE = 30.0
#: The polling interval of a waiter that must be woken by another process: a ``wait`` that
#: times out returns False, so True means it heard the commit.
POLL = 10.0
#: How long "no wake-up" is watched for.
QUIET = 0.2


def test_a_waiter_wakes_when_a_task_of_its_queue_is_received(store, auth):
    waiter = store.waiter(queues="default")
    store.receive(auth, envelope())
    assert waiter.wait(timeout=WAKE)


def test_a_waiter_wakes_when_another_process_receives_a_task_while_it_waits(store, db_url):
    with spawn(1, store=db_url) as (child,):
        waiter = store.waiter(queues="default")
        child.go("receive", message_id="from-afar")
        woke = waiter.wait(timeout=POLL)
        child.answer().unwrap()
        assert woke  # heard the commit: a timeout would have returned False
        assert store.claim("w") is not None


def test_a_waiter_does_not_wake_for_another_queue(store, auth):
    waiter = store.waiter(queues="default")
    store.receive(auth, envelope(queue="reviews"))
    assert not waiter.wait(timeout=QUIET)


def test_a_waiter_for_replies_wakes_when_a_task_finishes(store, auth):
    store.receive(auth, envelope())
    claim = store.claim("w")
    waiter = store.waiter(queues=(), replies=True)
    store.finish(claim, {"ok": True})
    assert waiter.wait(timeout=WAKE)


def test_a_rolled_back_transaction_wakes_nobody(store, auth):
    store.receive(auth, envelope("taken", payload={"n": 1}))
    waiter = store.waiter(queues="default")
    with pytest.raises(postroom.PayloadCollision):
        store.receive_atomic(auth, [envelope("fresh"), envelope("taken", payload={"n": 2})])
    assert not waiter.wait(timeout=QUIET)


def test_a_waiter_needs_a_queue_or_replies(store):
    with pytest.raises(postroom.InvalidInput, match="queues"):
        store.waiter(queues=())


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, "1", True])
def test_a_wait_with_a_timeout_that_is_not_a_number_of_seconds_is_refused(store, timeout):
    # NaN would return at once every time, so a polling loop would spin; inf would overflow.
    with pytest.raises(postroom.InvalidInput, match="timeout"):
        store.waiter().wait(timeout)
