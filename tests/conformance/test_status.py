"""The store's status: each queue's work stage by stage (SPEC §10: received, processing,
business outcome, reply delivery, never one tick for all four), plus open waits, dead replies
and continuations left to resume."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import postroom
from postroom import Outcome, QueueStatus, ReplyState, TaskState
from tests.support import START, envelope

NO_OUTCOMES = dict.fromkeys((state for state in TaskState if state.terminal), 0)
NO_DELIVERIES = dict.fromkeys(ReplyState, 0)


class Answering:
    """A transport that gives every reply the same outcome, receiving nothing."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> Sequence[Outcome]:
        return [self.outcome] * len(batch)


DELIVERED = Answering(Outcome.delivered())
REFUSED = Answering(Outcome.permanent("HTTP 400"))


def queue_status(store: postroom.Store, queue: str = "default") -> QueueStatus:
    return store.status().queues[queue]


def test_an_empty_store_has_no_queues_and_nothing_open(store, clock):
    assert store.status() == postroom.StoreStatus(
        at=clock.now(), queues={}, open_waits=0, dead_replies=0, continuations_unconsumed=0)


def test_received_and_processing_tasks_are_counted_apart(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    store.claim("w")
    status = queue_status(store)
    assert (status.received, status.processing) == (2, 1)
    assert (status.outcomes, status.deliveries) == (NO_OUTCOMES, NO_DELIVERIES)


def test_each_queue_is_counted_on_its_own(store, auth):
    store.receive_atomic(auth, [envelope("a-1", queue="a"), envelope("a-2", queue="a"),
                                envelope("b-1", queue="b")])
    store.claim("w", queues="b")
    queues = store.status().queues
    assert sorted(queues) == ["a", "b"]
    assert [(q.queue, q.received, q.processing) for q in queues.values()] == [
        ("a", 2, 0), ("b", 0, 1)]


def test_each_business_outcome_is_counted_in_its_own_state(store, auth, clock):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    store.finish(store.claim("w"), "ok")
    store.fail(store.claim("w"), "broken", retryable=False)
    store.cancel(store.claim("w").task_id)
    store.receive(auth, envelope("late", deadline=START - 1))
    store.receive(auth, envelope("far", hops=store.settings.max_hops))
    assert queue_status(store).outcomes == {
        TaskState.DONE: 1, TaskState.FAILED: 1, TaskState.CANCELLED: 1, TaskState.EXPIRED: 1,
        TaskState.HOP_LIMIT: 1, TaskState.BUDGET_EXHAUSTED: 0}


def test_a_retry_is_received_again_not_an_outcome(store, auth):
    store.receive(auth, envelope())
    store.fail(store.claim("w"), "flaky")
    status = queue_status(store)
    assert (status.received, status.processing, status.outcomes) == (1, 0, NO_OUTCOMES)


def test_a_done_task_whose_reply_is_undelivered_is_done_and_pending_delivery(store, auth):
    store.receive(auth, envelope())
    store.finish(store.claim("w"), "ok")
    status = queue_status(store)
    assert status.outcomes[TaskState.DONE] == 1
    assert status.deliveries == {**NO_DELIVERIES, ReplyState.PENDING: 1}


def test_each_delivery_state_is_counted_apart(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(4)])
    store.finish_batch([(claim, "ok") for claim in store.claim_batch("w", 4)])
    store.dispatch(DELIVERED)
    store.dispatch(REFUSED)
    store.claim_replies("d")
    assert queue_status(store).deliveries == {
        ReplyState.PENDING: 1, ReplyState.SENDING: 1, ReplyState.SENT: 1, ReplyState.DEAD: 1}


def test_sent_replies_are_counted_once_each_however_often_they_were_tried(store, auth, clock):
    store.receive(auth, envelope())
    store.finish(store.claim("w"), "ok")
    store.dispatch(Answering(Outcome.transient("timeout")))
    clock.advance(5)  # the fixed test delivery backoff
    store.dispatch(DELIVERED)
    assert queue_status(store).deliveries == {**NO_DELIVERIES, ReplyState.SENT: 1}


def test_dead_replies_are_counted_per_queue_and_in_total(store, auth):
    store.receive_atomic(auth, [envelope("a-1", queue="a"), envelope("b-1", queue="b"),
                                envelope("b-2", queue="b")])
    for queue, count in (("a", 1), ("b", 2)):
        store.finish_batch([(claim, "ok") for claim in store.claim_batch("w", count,
                                                                         queues=queue)])
    store.dispatch(REFUSED, limit=3)
    status = store.status()
    assert status.dead_replies == 3
    assert [q.deliveries[ReplyState.DEAD] for q in status.queues.values()] == [1, 2]


def test_a_requeued_dead_reply_is_pending_again_not_dead(store, auth):
    task_id = store.receive(auth, envelope()).task_id
    store.finish(store.claim("w"), "ok")
    store.dispatch(REFUSED)
    store.requeue_reply(store.reply(task_id).reply_id, operator="ops", reason="receiver fixed")
    status = store.status()
    assert status.dead_replies == 0
    assert status.queues["default"].deliveries == {**NO_DELIVERIES, ReplyState.PENDING: 1}


@pytest.fixture
def forgetful(db_url, clock):
    """A store that prunes what is a minute past."""
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(retention=60.0)) as store:
        yield store


def test_a_pruned_store_still_reports_its_done_count(forgetful, auth, clock):
    forgetful.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    forgetful.finish_batch([(claim, "ok") for claim in forgetful.claim_batch("w", 3)])
    forgetful.dispatch(DELIVERED, limit=3)
    clock.advance(61)
    assert forgetful.prune() == 3
    status = forgetful.status().queues["default"]
    assert (status.received, status.processing) == (0, 0)
    assert status.outcomes == {**NO_OUTCOMES, TaskState.DONE: 3}
    assert status.deliveries == {**NO_DELIVERIES, ReplyState.SENT: 3}


def test_a_queue_with_only_history_still_appears(forgetful, auth, clock):
    forgetful.receive(auth, envelope(queue="quiet"))
    forgetful.cancel(forgetful.claim("w", queues="quiet").task_id)
    forgetful.dispatch(DELIVERED)
    clock.advance(61)
    forgetful.prune()
    assert forgetful.status().queues == {"quiet": QueueStatus(
        queue="quiet", received=0, processing=0,
        outcomes={**NO_OUTCOMES, TaskState.CANCELLED: 1},
        deliveries={**NO_DELIVERIES, ReplyState.SENT: 1}, awaiting_endpoint=0,
        oldest_pending_age=None)}


def test_oldest_pending_age_is_how_long_the_next_claimable_task_has_waited(store, auth, clock):
    store.receive(auth, envelope("first"))
    clock.advance(30)
    store.receive(auth, envelope("second"))
    clock.advance(12)
    assert queue_status(store).oldest_pending_age == 42.0


def test_a_task_in_its_retry_backoff_is_not_claimable_so_has_no_age(store, auth, clock):
    store.receive(auth, envelope())
    store.fail(store.claim("w"), "flaky")
    assert queue_status(store).oldest_pending_age is None
    clock.advance(10 + 3)  # the fixed test backoff, then three seconds claimable
    assert queue_status(store).oldest_pending_age == 3.0


def test_a_queue_with_nothing_pending_has_no_age(store, auth):
    store.receive(auth, envelope())
    store.claim("w")
    assert queue_status(store).oldest_pending_age is None


def test_open_waits_and_unconsumed_continuations_are_counted(store, auth):
    for step in ("a", "b", "c"):
        store.open_wait("flow", step, 0, START + 60)
    store.signal(auth, "e-1", "flow", "a", 1, "yes")
    store.signal(auth, "e-2", "flow", "b", 1, "yes")
    store.resume("flow", "b", 1, None)
    status = store.status()
    assert (status.open_waits, status.continuations_unconsumed) == (1, 1)


def test_status_is_read_at_the_stores_time(store, clock):
    clock.advance(7)
    assert store.status().at == START + 7


def test_a_reply_waiting_for_its_requesters_endpoint_is_counted_as_such(store, auth):
    store.receive(auth, envelope("m-1"))
    store.finish(store.claim("w"), "ok")
    assert store.claim_replies("d", routed=True) == []  # planner has no endpoint: parked
    queue = store.status().queues["default"]
    assert (queue.awaiting_endpoint, queue.deliveries[ReplyState.PENDING]) == (1, 1)


def test_outcomes_in_many_queues_decided_by_one_transaction_are_each_counted(store, auth,
                                                                             clock):
    # One sweep expires the tasks of seven queues at once: seven tallies in one commit.
    names = [f"q{i}" for i in range(7)]
    store.receive_atomic(auth, [envelope(f"m-{name}", queue=name, deadline=START + 10)
                                for name in names])
    clock.advance(10)
    assert store.sweep().deadlines_expired == len(names)
    for name in names:
        assert queue_status(store, name).outcomes == {**NO_OUTCOMES, TaskState.EXPIRED: 1}


def test_one_settle_counts_each_outcome_it_decides(store, auth):
    store.receive_atomic(auth, [envelope("m-1"), envelope("m-2")])
    first, second = store.claim_batch("w", 2)
    store.settle([postroom.Finished(claim=first, result=None),
                  postroom.Failed(claim=second, reason="broken", retryable=False)])
    assert queue_status(store).outcomes == {**NO_OUTCOMES, TaskState.DONE: 1,
                                            TaskState.FAILED: 1}
