"""SPEC §3: claims, leases, fences, attempts, deadlines, retries, cancellation, follow-ups."""

from __future__ import annotations

import dataclasses

import pytest

import postroom
from postroom import TaskState
from tests.support import START, envelope


@pytest.fixture
def task_id(store, auth):
    return store.receive(auth, envelope()).task_id


def test_claim_makes_the_task_running_with_owner_lease_and_fence_one(store, task_id, clock):
    claim = store.claim("w1")
    assert claim is not None
    assert (claim.task_id, claim.owner, claim.fence, claim.attempt) == (task_id, "w1", 1, 1)
    assert claim.payload == {"n": 1}
    task = store.task(task_id)
    assert task.state == TaskState.RUNNING and task.owner == "w1"
    assert task.lease_until == clock.now() + store.settings.lease


def test_claim_on_an_empty_queue_returns_none(store):
    assert store.claim("w1") is None


def test_a_claimed_task_is_not_claimed_again_while_its_lease_holds(store, task_id):
    assert store.claim("w1") is not None
    assert store.claim("w2") is None


def test_claim_takes_only_the_named_queues(store, auth):
    store.receive(auth, envelope(queue="reviews"))
    assert store.claim("w", queues=["builds"]) is None
    claim = store.claim("w", queues="reviews")
    assert claim is not None and claim.queue == "reviews"


def test_claim_across_queues_takes_the_oldest_available_first(store, auth, clock):
    store.receive(auth, envelope("old", queue="b"))
    clock.advance(1)
    store.receive(auth, envelope("new", queue="a"))
    first = store.claim("w", queues=["a", "b"])
    second = store.claim("w", queues=["a", "b"])
    assert (first.message_id, second.message_id) == ("old", "new")


def test_claim_batch_claims_up_to_the_limit(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(5)])
    claims = store.claim_batch("w", 3)
    assert len(claims) == 3 and len({c.task_id for c in claims}) == 3
    assert len(store.claim_batch("w", 10)) == 2


def test_an_expired_lease_is_recovered_with_a_new_fence(store, task_id, clock):
    first = store.claim("w1")
    clock.advance(store.settings.lease)
    second = store.claim("w2")
    assert second is not None and second.task_id == task_id
    assert (second.fence, second.attempt) == (first.fence + 1, 2)


def test_a_lease_expiring_on_the_last_attempt_fails_the_task(store, auth, clock):
    ack = store.receive(auth, envelope(max_attempts=1))
    store.claim("w1")
    clock.advance(store.settings.lease)
    assert store.claim("w2") is None
    task = store.task(ack.task_id)
    assert task.state == TaskState.FAILED and "attempts exhausted" in task.last_error
    assert store.reply(ack.task_id).status == TaskState.FAILED


def test_a_passed_deadline_expires_a_pending_task_before_it_is_claimed(store, auth, clock):
    ack = store.receive(auth, envelope(deadline=START + 10))
    clock.advance(10)
    assert store.claim("w") is None
    assert store.task(ack.task_id).state == TaskState.EXPIRED
    assert store.reply(ack.task_id).status == TaskState.EXPIRED


def test_finish_writes_done_the_result_and_the_reply_together(store, task_id):
    claim = store.claim("w1")
    store.finish(claim, {"answer": 42})
    task = store.task(task_id)
    assert task.state == TaskState.DONE and task.result == {"answer": 42}
    assert (task.owner, task.lease_until) == (None, None)
    reply = store.reply(task_id)
    assert reply.reply_id == "reply:" + task_id
    assert reply.document == {"kind": "result", "task_id": task_id, "status": "done",
                              "result": {"answer": 42}, "requester": "planner",
                              "correlation_id": None, "parent_task_id": None}
    assert reply.state == postroom.ReplyState.PENDING


def test_a_stale_worker_is_fenced_after_its_task_was_reclaimed(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    current = store.claim("w2")
    with pytest.raises(postroom.Fenced, match="fence 2"):
        store.finish(stale, {"from": "stale"})
    store.finish(current, {"from": "current"})
    assert store.task(task_id).result == {"from": "current"}


def test_finish_after_the_lease_expired_is_fenced_and_writes_nothing(store, task_id, clock):
    claim = store.claim("w1")
    clock.advance(store.settings.lease)
    with pytest.raises(postroom.Fenced, match="lease expired"):
        store.finish(claim, {})
    assert store.task(task_id).state == TaskState.RUNNING
    assert store.reply(task_id) is None


def test_finish_after_the_deadline_is_fenced(store, auth, clock):
    ack = store.receive(auth, envelope(deadline=START + 5))
    claim = store.claim("w1")
    clock.advance(5)
    with pytest.raises(postroom.Fenced, match="deadline"):
        store.finish(claim, {})
    assert store.task(ack.task_id).state == TaskState.RUNNING


def test_a_finished_claim_cannot_finish_twice(store, task_id):
    claim = store.claim("w1")
    store.finish(claim, 1)
    with pytest.raises(postroom.Fenced, match="done"):
        store.finish(claim, 2)
    assert store.task(task_id).result == 1


def test_finish_batch_finishes_every_claim_with_its_own_result_and_reply(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    claims = store.claim_batch("w", 3)
    store.finish_batch([(claim, {"i": i}) for i, claim in enumerate(claims)])
    for i, claim in enumerate(claims):
        assert store.task(claim.task_id).result == {"i": i}
        assert store.reply(claim.task_id).document["result"] == {"i": i}


def test_finish_batch_with_one_stale_claim_finishes_none_and_names_it(store, auth, clock):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(3)])
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    current = store.claim_batch("w2", 3)
    # The other two tasks' claims (a batch's claims come in no promised order).
    first, second = (claim for claim in current if claim.task_id != stale.task_id)
    with pytest.raises(postroom.Fenced, match=f"task {stale.task_id}.*fence 2"):
        store.finish_batch([(first, 1), (stale, 2), (second, 3)])
    for claim in current:
        assert store.task(claim.task_id).state == TaskState.RUNNING
        assert store.reply(claim.task_id) is None


def test_finish_batch_naming_a_claim_twice_finishes_none(store, task_id):
    claim = store.claim("w1")
    with pytest.raises(postroom.Fenced, match="done"):
        store.finish_batch([(claim, 1), (claim, 2)])
    assert store.task(task_id).state == TaskState.RUNNING


def test_renew_extends_the_lease(store, task_id, clock):
    claim = store.claim("w1")
    clock.advance(20)
    renewed = store.renew(claim, lease=60)
    assert renewed.lease_until == clock.now() + 60
    clock.advance(50)
    store.finish(renewed, "ok")
    assert store.task(task_id).state == TaskState.DONE


def test_an_expired_lease_cannot_be_renewed_back_to_life(store, task_id, clock):
    claim = store.claim("w1")
    clock.advance(store.settings.lease)
    with pytest.raises(postroom.Fenced, match="lease expired"):
        store.renew(claim)


def test_a_stale_fence_cannot_renew(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    store.claim("w2")
    with pytest.raises(postroom.Fenced):
        store.renew(stale)
    assert store.task(task_id).owner == "w2"


def test_a_retryable_failure_returns_to_pending_after_the_backoff(store, task_id, clock):
    claim = store.claim("w1")
    assert store.fail(claim, "flaky dependency") == TaskState.PENDING
    task = store.task(task_id)
    assert task.state == TaskState.PENDING and task.last_error == "flaky dependency"
    assert task.available_at == clock.now() + 10.0
    clock.advance(9.9)
    assert store.claim("w2") is None
    clock.advance(0.1)
    again = store.claim("w2")
    assert (again.attempt, again.fence) == (2, 2)


def test_a_non_retryable_failure_fails_the_task_with_its_reply(store, task_id):
    claim = store.claim("w1")
    assert store.fail(claim, "bad input", retryable=False) == TaskState.FAILED
    assert store.reply(task_id).document["result"] == {"error": "bad input"}


def test_a_failure_on_the_last_attempt_fails_the_task(store, auth, clock):
    ack = store.receive(auth, envelope(max_attempts=2))
    store.fail(store.claim("w"), "one")
    clock.advance(10)
    assert store.fail(store.claim("w"), "two") == TaskState.FAILED
    task = store.task(ack.task_id)
    assert task.attempts == 2 and "attempts exhausted" in task.last_error


def test_retries_never_renew_the_deadline(store, auth, clock):
    ack = store.receive(auth, envelope(deadline=START + 15))
    store.fail(store.claim("w"), "retry me")
    clock.advance(15)
    assert store.claim("w") is None
    assert store.task(ack.task_id).state == TaskState.EXPIRED


def test_a_stale_worker_cannot_fail_the_task(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    store.claim("w2")
    with pytest.raises(postroom.Fenced):
        store.fail(stale, "late failure")
    assert store.task(task_id).state == TaskState.RUNNING


def test_cancel_a_pending_task_writes_cancelled_and_its_reply(store, task_id):
    assert store.cancel(task_id) is True
    assert store.task(task_id).state == TaskState.CANCELLED
    assert store.reply(task_id).status == TaskState.CANCELLED
    assert store.claim("w") is None


def test_cancel_fences_a_running_claim(store, task_id):
    claim = store.claim("w1")
    assert store.cancel(task_id, reason="the human changed their mind") is True
    with pytest.raises(postroom.Fenced, match="cancelled"):
        store.finish(claim, {})


def test_cancel_of_a_terminal_task_returns_false(store, task_id):
    store.finish(store.claim("w"), None)
    assert store.cancel(task_id) is False
    assert store.task(task_id).state == TaskState.DONE


def test_cancel_of_an_unknown_task_is_not_found(store):
    with pytest.raises(postroom.NotFound):
        store.cancel("no-such-task")


def test_follow_ups_commit_with_finish_with_hops_and_parent_computed(store, auth):
    parent = store.receive(auth, envelope(hops=1)).task_id
    claim = store.claim("w")
    store.finish(claim, "planned", follow_ups=[
        postroom.FollowUp(message_id="step-1", payload={"do": "build"}),
        postroom.FollowUp(message_id="step-2", payload={"do": "test"}, queue="tests")])
    child = store.claim("w")
    assert child.hops == 2 and child.deadline == claim.deadline
    task = store.task(child.task_id)
    assert task.parent_task_id == parent and task.principal == f"task:{parent}"
    assert store.claim("w", queues="tests").payload == {"do": "test"}


def test_a_fenced_finish_creates_no_follow_ups(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    store.claim("w2")
    with pytest.raises(postroom.Fenced):
        store.finish(stale, None, follow_ups=[postroom.FollowUp(message_id="x", payload={})])
    assert store.info()["tasks"] == {"running": 1}


def test_a_follow_up_reaching_the_hop_limit_is_stored_hop_limit(store, auth):
    store.receive(auth, envelope(hops=store.settings.max_hops - 1))
    store.finish(store.claim("w"), None,
                 follow_ups=[postroom.FollowUp(message_id="loop", payload={})])
    assert store.claim("w") is None
    assert store.info()["tasks"] == {"done": 1, "hop_limit": 1}


def test_a_follow_up_message_id_twice_is_refused(store, task_id):
    claim = store.claim("w")
    with pytest.raises(postroom.InvalidInput, match="twice"):
        store.finish(claim, None, follow_ups=[postroom.FollowUp(message_id="x", payload={}),
                                              postroom.FollowUp(message_id="x", payload={})])
    assert store.task(task_id).state == TaskState.RUNNING


def test_decisions_ignore_a_clock_that_steps_backwards(store, task_id, clock):
    claim = store.claim("w1")
    clock.advance(store.settings.lease)
    store.sweep()  # the lease expired at the high-water time
    clock.set(START)  # the host clock steps back before the expiry
    with pytest.raises(postroom.Fenced):
        store.finish(claim, {})
    again = store.claim("w2")
    assert again is not None and again.lease_until == START + 2 * store.settings.lease


@pytest.mark.parametrize("call", ["finish", "renew", "fail"])
def test_a_claim_refused_because_its_lease_ran_out_stays_refused_when_the_clock_steps_back(
        store, task_id, clock, call):
    claim = store.claim("w1")
    clock.advance(store.settings.lease)
    with pytest.raises(postroom.Fenced, match="lease expired"):
        _stale_call(store, call, claim)
    clock.set(START + 1)  # the host clock steps back to inside the old lease
    with pytest.raises(postroom.Fenced, match="lease expired"):
        _stale_call(store, call, claim)
    assert store.task(task_id).state == TaskState.RUNNING and store.reply(task_id) is None


def test_a_claim_refused_because_the_deadline_passed_stays_refused_when_the_clock_steps_back(
        store, auth, clock):
    ack = store.receive(auth, envelope(deadline=START + 5))
    claim = store.claim("w1")
    clock.advance(5)
    with pytest.raises(postroom.Fenced, match="deadline"):
        store.finish(claim, {})
    clock.set(START + 1)
    with pytest.raises(postroom.Fenced, match="deadline"):
        store.finish(claim, {})
    assert store.task(ack.task_id).state == TaskState.RUNNING


def _stale_call(store: postroom.Store, call: str, claim: postroom.Claim) -> None:
    if call == "finish":
        store.finish(claim, {})
    elif call == "renew":
        store.renew(claim)
    else:
        store.fail(claim, "too slow")


def test_sweep_recovers_leases_and_expires_deadlines_without_claiming(store, auth, clock):
    running = store.receive(auth, envelope("run")).task_id
    store.claim("w1")
    late = store.receive(auth, envelope("late", deadline=START + 20)).task_id
    clock.advance(store.settings.lease)
    report = store.sweep()
    assert (report.leases_recovered, report.deadlines_expired) == (1, 1)
    assert store.task(running).state == TaskState.PENDING
    assert store.task(late).state == TaskState.EXPIRED


def test_attempts_keep_counting_across_restarts(db_url, clock, settings, auth):
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        task_id = store.receive(auth, envelope(max_attempts=3)).task_id
        store.claim("w1")
    clock.advance(settings.lease)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        claim = store.claim("w2")
        assert (claim.attempt, claim.fence) == (2, 2)
        assert store.task(task_id).attempts == 2


def test_a_claim_altered_to_allow_more_attempts_is_fenced(store, auth):
    task_id = store.receive(auth, envelope(max_attempts=1)).task_id
    claim = store.claim("w")
    with pytest.raises(postroom.Fenced, match="max_attempts"):
        store.fail(dataclasses.replace(claim, max_attempts=5), "try again")
    task = store.task(task_id)
    assert task.state == TaskState.RUNNING and task.attempts == 1


def test_a_claim_altered_to_reset_its_hops_spawns_no_follow_ups(store, auth):
    store.receive(auth, envelope(hops=store.settings.max_hops - 1))
    claim = store.claim("w")
    with pytest.raises(postroom.Fenced, match="hops"):
        store.finish(dataclasses.replace(claim, hops=0), None,
                     follow_ups=[postroom.FollowUp(message_id="loop", payload={})])
    assert store.info()["tasks"] == {"running": 1}


def test_a_finish_batch_with_an_altered_claim_finishes_none(store, auth):
    store.receive_atomic(auth, [envelope(message_id="a"), envelope(message_id="b")])
    first, second = store.claim_batch("w", 2)
    with pytest.raises(postroom.Fenced, match="principal"):
        store.finish_batch([(first, None),
                            (dataclasses.replace(second, principal="someone-else"), None)])
    assert store.info()["tasks"] == {"running": 2}


def test_a_claim_takes_a_task_another_connection_committed_just_before_it(
        store, db_url, clock, settings, auth):
    assert store.claim("w") is None  # an empty claim (a look, on SQLite) keeps no snapshot
    with postroom.open_store(db_url, clock=clock, settings=settings) as other:
        ack = other.receive(auth, envelope())
    claim = store.claim("w")
    assert claim is not None and claim.task_id == ack.task_id


def test_a_claim_decides_at_the_high_water_even_when_the_clock_has_stepped_back(
        store, task_id, auth, clock):
    store.claim("w1")
    clock.advance(store.settings.lease)
    store.receive(auth, envelope("later", queue="elsewhere"))  # a decision when the lease ran out
    clock.set(START)  # the host clock steps back to inside the old lease
    again = store.claim("w2")
    assert again is not None and (again.task_id, again.attempt) == (task_id, 2)
