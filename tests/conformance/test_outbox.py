"""SPEC §4: the outbox, dispatch, delivery outcomes, dead replies and the receiver."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

import postroom
from postroom import Outcome, ReplyState, TaskState, faults
from postroom.outbox import AFTER_REMOTE_COMMIT
from postroom.validation import canonical_json
from tests.support import database_of, envelope


class Scripted:
    """A transport that answers from a script, then delegates to a real one."""

    def __init__(self, inner: postroom.Transport, *answers: Outcome | Exception) -> None:
        self.inner = inner
        self.answers = list(answers)
        self.calls = 0

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> Sequence[Outcome]:
        self.calls += 1
        if self.answers:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return [answer] * len(batch)
        return self.inner.deliver(batch)


@pytest.fixture
def done_task(store, auth):
    task_id = store.receive(auth, envelope()).task_id
    store.finish(store.claim("w"), {"answer": 42})
    return task_id


def lose_ack():
    return faults.armed(AFTER_REMOTE_COMMIT, faults.raising(
        lambda _: postroom.TransientDeliveryError("ACK lost")))


def test_dispatch_delivers_the_reply_once(store, done_task, transport, receiver):
    report = store.dispatch(transport)
    assert (report.claimed, report.sent) == (1, 1)
    reply = store.reply(done_task)
    assert reply.state == ReplyState.SENT and reply.sent_at is not None
    assert receiver.effect_count(reply.reply_id) == 1


def test_dispatch_with_nothing_due_does_nothing(store, transport):
    assert store.dispatch(transport) == postroom.DispatchReport()


def test_a_lost_ack_is_redelivered_with_the_same_reply_id_and_one_effect(
        store, done_task, transport, receiver, clock):
    with lose_ack():
        assert store.dispatch(transport).retrying == 1
    reply = store.reply(done_task)
    assert reply.state == ReplyState.PENDING and "ACK lost" in reply.last_error
    assert reply.available_at == clock.now() + 5.0
    clock.advance(5)
    assert store.dispatch(transport).sent == 1
    assert store.reply(done_task).reply_id == reply.reply_id
    assert receiver.effect_count(reply.reply_id) == 1


def test_delivery_failures_never_rerun_business_work(store, done_task, transport, clock):
    task_before = store.task(done_task)
    with lose_ack():
        store.dispatch(transport)
    clock.advance(5)
    store.dispatch(transport)
    task_after = store.task(done_task)
    assert (task_after.state, task_after.attempts, task_after.fence) == (
        TaskState.DONE, task_before.attempts, task_before.fence)
    assert store.claim("w") is None


def test_transient_failures_until_the_budget_make_the_reply_dead(
        store, done_task, transport, clock):
    flaky = Scripted(transport, *[Outcome.transient("HTTP 503")] * 3)
    for _ in range(3):
        store.dispatch(flaky)
        clock.advance(5)
    reply = store.reply(done_task)
    assert reply.state == ReplyState.DEAD and reply.attempts == 3
    assert "budget spent" in reply.last_error and "503" in reply.last_error
    assert store.dispatch(flaky).claimed == 0


def test_a_transport_exception_counts_as_a_transient_failure(store, done_task, transport):
    report = store.dispatch(Scripted(transport, ConnectionError("refused")))
    assert report.retrying == 1
    assert "ConnectionError" in store.reply(done_task).last_error


def test_a_collision_makes_the_reply_dead_at_once(store, done_task, transport):
    store.dispatch(Scripted(transport, Outcome.collision("different content")))
    reply = store.reply(done_task)
    assert reply.state == ReplyState.DEAD and reply.attempts == 1
    assert reply.last_error.startswith("collision")


def test_a_permanent_refusal_makes_the_reply_dead(store, done_task, transport):
    store.dispatch(Scripted(transport, Outcome.permanent("HTTP 410")))
    assert store.reply(done_task).state == ReplyState.DEAD


class OneAtATime:
    """A transport that sends one request per reply, as a webhook does: a receiver's refusal
    of one reply is raised and ends the batch, after the replies before it committed."""

    def __init__(self, receiver: postroom.Receiver) -> None:
        self.receiver = receiver

    def deliver(self, batch):
        for item in batch:
            self.receiver.accept(item.reply_id, item.body)  # raises PayloadCollision
        return [Outcome.delivered() for _ in batch]


def test_a_refusal_raised_for_a_batch_makes_only_the_refused_reply_dead(store, auth, receiver):
    tasks = [ack.task_id for ack in store.receive_atomic(auth, [envelope(f"m-{i}")
                                                                for i in range(3)])]
    store.finish_batch([(claim, {"n": 1}) for claim in store.claim_batch("w", 3)])
    refused = tasks[1]  # the receiver already holds other content under its reply_id
    receiver.accept("reply:" + refused, canonical_json(
        {"kind": "result", "result": "other", "status": "done", "task_id": refused}))
    report = store.dispatch(OneAtATime(receiver), limit=3)
    assert (report.sent, report.dead) == (2, 1)
    assert {task_id: store.reply(task_id).state for task_id in tasks} == {
        tasks[0]: ReplyState.SENT, refused: ReplyState.DEAD, tasks[2]: ReplyState.SENT}
    assert store.reply(refused).last_error.startswith("collision")
    assert [receiver.effect_count("reply:" + task_id) for task_id in tasks] == [1, 1, 1]


def test_a_stale_publisher_is_fenced(store, done_task, clock):
    stale = store.claim_replies("p1")[0]
    clock.advance(store.settings.dispatch_lease)
    current = store.claim_replies("p2")[0]
    assert current.fence == stale.fence + 1
    with pytest.raises(postroom.Fenced):
        store.record_delivery(stale, Outcome.delivered())
    assert store.record_delivery(current, Outcome.delivered()) == ReplyState.SENT


def test_record_deliveries_reports_a_stale_claim_and_records_the_others(store, auth, clock):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 3)])
    stale = store.claim_replies("p1")[0]
    clock.advance(store.settings.dispatch_lease)
    current = store.claim_replies("p2", limit=3)
    report = store.record_deliveries([(current[0], Outcome.delivered()),
                                      (stale, Outcome.delivered()),
                                      (current[1], Outcome.transient("timeout")),
                                      (current[2], Outcome.delivered())])
    assert (report.claimed, report.sent, report.retrying) == (4, 2, 1)
    assert report.fenced == [stale.reply_id]
    states = [store.reply(claim.task_id).state for claim in current]
    assert states == [ReplyState.SENT, ReplyState.PENDING, ReplyState.SENT]


def test_record_and_claim_records_the_outcomes_and_claims_the_next_replies_together(
        store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(4)])
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 4)])
    first = store.claim_replies("p", limit=2)
    report, taken = store.record_and_claim([(first[0], Outcome.delivered()),
                                            (first[1], Outcome.transient("timeout"))],
                                           "p", limit=5)
    assert (report.claimed, report.sent, report.retrying, report.fenced) == (2, 1, 1, [])
    assert [store.reply(claim.task_id).state for claim in first] == [ReplyState.SENT,
                                                                     ReplyState.PENDING]
    # The one retrying waits out its backoff; the two never claimed are claimed now.
    others = {claim.task_id for claim in first}
    assert len(taken) == 2 and not {claim.task_id for claim in taken} & others
    assert all(store.reply(claim.task_id).state is ReplyState.SENDING for claim in taken)


def test_record_and_claim_reports_a_stale_claim_and_still_claims(store, auth, clock):
    acks = store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(2)])
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 2)])
    stale = store.claim_replies("p1")[0]
    clock.advance(store.settings.dispatch_lease)
    current = store.claim_replies("p2")[0]
    report, taken = store.record_and_claim([(stale, Outcome.delivered())], "p1", limit=5)
    assert report.fenced == [stale.reply_id] and report.sent == 0
    assert store.reply(current.task_id).owner == "p2"
    # The stale outcome is not recorded, and the claim half takes the reply p2 does not hold.
    assert [claim.task_id for claim in taken] == [ack.task_id for ack in acks
                                                   if ack.task_id != current.task_id]


def test_record_and_claim_refuses_a_bad_limit_naming_it_and_writes_nothing(store, done_task):
    claim = store.claim_replies("p")[0]
    with pytest.raises(postroom.InvalidInput, match="limit"):
        store.record_and_claim([(claim, Outcome.delivered())], "p", limit=0)
    assert store.reply(done_task).state is ReplyState.SENDING


def test_an_expired_sending_lease_returns_the_reply_to_pending(store, done_task, clock):
    store.claim_replies("p1")
    clock.advance(store.settings.dispatch_lease)
    report = store.sweep()
    assert report.deliveries_recovered == 1
    reply = store.reply(done_task)
    assert reply.state == ReplyState.PENDING and "outcome unknown" in reply.last_error


def test_an_expired_sending_lease_on_the_last_attempt_is_dead_outcome_unknown(
        db_url, clock, auth):
    settings = postroom.Settings(delivery_budget=1)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        task_id = store.receive(auth, envelope()).task_id
        store.finish(store.claim("w"), None)
        store.claim_replies("p1")
        clock.advance(settings.dispatch_lease)
        assert store.sweep().deliveries_dead == 1
        reply = store.reply(task_id)
        assert reply.state == ReplyState.DEAD and "outcome unknown" in reply.last_error


def test_requeue_of_a_dead_reply_is_a_recorded_decision_with_same_id_and_content(
        store, done_task, transport, receiver, clock):
    store.dispatch(Scripted(transport, Outcome.permanent("HTTP 400")))
    dead = store.reply(done_task)
    clock.advance(60)
    store.requeue_reply(dead.reply_id, operator="ops@example", reason="receiver fixed")
    [decision] = store.requeues(dead.reply_id)
    assert (decision.operator, decision.reason, decision.requeued_at) == (
        "ops@example", "receiver fixed", clock.now())
    assert (decision.previous_attempts, decision.previous_error) == (1, dead.last_error)
    assert store.dispatch(transport).sent == 1
    sent = store.reply(done_task)
    assert (sent.reply_id, sent.body, sent.fingerprint) == (dead.reply_id, dead.body,
                                                            dead.fingerprint)
    assert receiver.effect_count(sent.reply_id) == 1


def test_only_a_dead_reply_can_be_requeued(store, done_task):
    with pytest.raises(postroom.Fenced, match="only a dead reply"):
        store.requeue_reply("reply:" + done_task, operator="ops", reason="why not")
    assert store.requeues("reply:" + done_task) == []


def test_requeue_of_an_unknown_reply_is_not_found(store):
    with pytest.raises(postroom.NotFound):
        store.requeue_reply("reply:nope", operator="ops", reason="typo")


def test_batched_dispatch_delivers_many_replies_in_three_commits(store, auth, transport,
                                                                   receiver):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(20)])
    store.finish_batch([(claim, claim.message_id) for claim in store.claim_batch("w", 20)])
    report = store.dispatch(transport, limit=50)
    assert (report.claimed, report.sent) == (20, 20)
    assert receiver.effects_total() == 20


def test_a_receiver_counts_one_effect_per_reply_id(receiver):
    body = '{"kind":"result","result":1,"status":"done","task_id":"t"}'
    assert receiver.accept("reply:t", body).duplicate is False
    assert receiver.accept("reply:t", body).duplicate is True
    assert receiver.effect_count("reply:t") == 1


def test_a_receiver_refuses_the_same_reply_id_with_other_content(receiver):
    receiver.accept("reply:t", '{"kind":"result","result":1,"status":"done","task_id":"t"}')
    with pytest.raises(postroom.PayloadCollision):
        receiver.accept("reply:t", '{"kind":"result","result":2,"status":"done","task_id":"t"}')
    assert receiver.effect_count("reply:t") == 1


def test_a_receiver_effect_commits_with_its_receipt(make_url):
    def effect(tx, document):
        raise RuntimeError("business system down")

    with postroom.Receiver.open(make_url("receiver"), effect=effect) as receiver:
        body = '{"kind":"result","result":1,"status":"done","task_id":"t"}'
        with pytest.raises(RuntimeError):
            receiver.accept("reply:t", body)
        assert receiver.receipt("reply:t") is None
        assert receiver.effect_count("reply:t") == 0


def test_a_receiver_refuses_a_reply_id_that_does_not_match_its_body(receiver):
    with pytest.raises(postroom.InvalidInput, match="task_id"):
        receiver.accept("reply:other", '{"kind":"result","result":1,"status":"done",'
                                       '"task_id":"t"}')


def _outgoing(task_id: str, result: object) -> postroom.Outgoing:
    body = f'{{"kind":"result","result":{result},"status":"done","task_id":"{task_id}"}}'
    return postroom.Outgoing(reply_id=f"reply:{task_id}", body=body, fingerprint="")


def test_a_receiver_batch_of_new_replies_has_one_effect_each_in_order(make_url):
    seen = []
    with postroom.Receiver.open(make_url("receiver"),
                                effect=lambda tx, document: seen.append(document)) as receiver:
        outcomes = receiver.accept_batch([_outgoing(t, 1) for t in ("a", "b", "c")])
        assert [outcome.kind for outcome in outcomes] == ["delivered"] * 3
        assert [document["task_id"] for document in seen] == ["a", "b", "c"]
        assert receiver.effects_total() == 3


def test_a_receiver_batch_records_receipts_in_reply_id_order_and_effects_in_batch_order(
        make_url):
    # Overlapping batches of two dispatchers then lock the same keys in the same order.
    seen = []
    with postroom.Receiver.open(make_url("receiver"),
                                effect=lambda tx, document: seen.append(document)) as receiver:
        receiver.accept_batch([_outgoing(t, 1) for t in ("c", "a", "b")])
        physical = "ctid" if database_of(receiver).dialect.name == "postgres" else "rowid"
        with database_of(receiver).reading() as tx:
            stored = [row["reply_id"] for row in tx.execute(
                f"SELECT reply_id FROM receiver_receipts ORDER BY {physical}")]
    assert stored == ["reply:a", "reply:b", "reply:c"]
    assert [document["task_id"] for document in seen] == ["c", "a", "b"]


def test_a_receiver_batch_tells_new_duplicate_collision_and_malformed_apart(receiver):
    receiver.accept_batch([_outgoing("dup", 1), _outgoing("clash", 1)])
    outcomes = receiver.accept_batch([
        _outgoing("new", 1), _outgoing("dup", 1), _outgoing("clash", 2),
        postroom.Outgoing(reply_id="reply:bad", body="not json", fingerprint=""),
        _outgoing("new", 1)])
    assert [(o.kind, o.duplicate) for o in outcomes] == [
        ("delivered", False), ("delivered", True), ("collision", False),
        ("permanent", False), ("delivered", True)]
    assert receiver.effects_total() == 3


def test_a_reply_claim_altered_to_a_larger_budget_is_fenced(store, done_task):
    claim = store.claim_replies("p")[0]
    with pytest.raises(postroom.Fenced, match="budget"):
        store.record_delivery(dataclasses.replace(claim, budget=100), Outcome.transient("5xx"))
    reply = store.reply(done_task)
    assert reply.state == ReplyState.SENDING and reply.attempts == 1


def test_a_reply_claim_with_another_body_cannot_be_recorded_sent(store, done_task):
    claim = store.claim_replies("p")[0]
    forged = dataclasses.replace(claim, body=canonical_json({"kind": "result", "forged": True}))
    with pytest.raises(postroom.Fenced, match="body"):
        store.record_delivery(forged, Outcome.delivered())
    assert store.reply(done_task).state == ReplyState.SENDING


def test_record_deliveries_with_an_altered_claim_records_the_others(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(2)])
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 2)])
    first, second = store.claim_replies("p", limit=2)
    report = store.record_deliveries([(first, Outcome.delivered()),
                                      (dataclasses.replace(second, attempt=0),
                                       Outcome.delivered())])
    assert (report.sent, report.fenced) == (1, [second.reply_id])
    assert store.reply(second.task_id).state == ReplyState.SENDING
