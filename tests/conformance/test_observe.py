"""``Store.observe``: the status and the recent history in one snapshot, what metrics and the
dashboard's chart are drawn from (every figure derived from durable rows, so any process
reading the store sees the same)."""

from __future__ import annotations

import pytest

import postroom
from postroom import AttemptOutcome, InvalidInput, WaitState
from tests.conformance.test_status import DELIVERED, REFUSED
from tests.support import START, envelope


def test_recent_holds_the_tasks_created_in_the_window_newest_first(store, auth, clock):
    store.receive(auth, envelope("old"))
    clock.advance(100)
    store.receive(auth, envelope("new-1"))
    clock.advance(1)
    store.receive(auth, envelope("new-2"))
    seen = store.observe(window=50)
    assert [t.task.message_id for t in seen.recent] == ["new-2", "new-1"]
    assert (seen.since, seen.truncated) == (clock.now() - 50, False)


def test_tasks_queued_before_the_window_are_counted_apart(store, auth, clock):
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    store.claim("w")
    clock.advance(100)
    assert store.observe(window=50).pending_before == 1


def test_a_limit_cuts_the_window_and_says_so(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    seen = store.observe(limit=2)
    assert (len(seen.recent), seen.truncated) == (2, True)


def test_each_run_and_delivery_attempt_comes_with_its_times(store, auth, clock, transport):
    store.receive(auth, envelope("m"))
    clock.advance(2)
    claim = store.claim("w")
    clock.advance(3)
    store.finish(claim, {"ok": True})
    store.dispatch(transport)
    (timeline,) = store.observe().recent
    (run,) = timeline.attempts
    assert (run.started_at, run.ended_at, run.outcome) == (START + 2, START + 5,
                                                           AttemptOutcome.DONE)
    assert [d.outcome for d in timeline.deliveries] == [AttemptOutcome.DELIVERED]


def test_the_oldest_undelivered_reply_is_aged_per_queue(store, auth, clock):
    store.receive_atomic(auth, [envelope("a", queue="a"), envelope("b", queue="b")])
    for queue in ("a", "b"):
        store.finish(store.claim("w", queues=queue), None)
        clock.advance(10)
    store.dispatch(DELIVERED, limit=1)  # a's reply goes; b's still waits
    assert store.observe().oldest_pending_reply_age == {"b": 10.0}


def test_a_dead_reply_is_no_longer_undelivered_but_counted_dead(store, auth):
    store.receive(auth, envelope("m"))
    store.finish(store.claim("w"), None)
    store.dispatch(REFUSED)
    seen = store.observe()
    assert (seen.oldest_pending_reply_age, seen.status.dead_replies) == ({}, 1)


def test_waits_are_counted_by_state(store, clock):
    store.open_wait("f", "s1", 0, START + 10)
    opened = store.open_wait("f", "s2", 0, START + 10)
    store.signal(postroom.AuthContext(principal="h"), "e", "f", "s2", opened.generation, 1)
    assert store.observe().waits == {WaitState.WAITING: 1, WaitState.SIGNALED: 1}


@pytest.mark.parametrize(("field", "arguments"), [
    ("window", {"window": 0}), ("window", {"window": "1"}), ("limit", {"limit": 0})])
def test_a_bad_window_or_limit_is_refused_naming_it(store, field, arguments):
    with pytest.raises(InvalidInput, match=field):
        store.observe(**arguments)


def test_observing_writes_nothing(store, auth):
    store.receive(auth, envelope("m"))
    before = store.status()
    store.observe()
    assert store.status() == before
