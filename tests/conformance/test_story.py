"""A task's durable story: every attempt to run it and to deliver its reply, kept in its row."""

from __future__ import annotations

import pytest

import postroom
from postroom import AttemptOutcome, TaskState
from tests.support import START, envelope


@pytest.fixture
def task_id(store, auth):
    return store.receive(auth, envelope(max_attempts=3)).task_id


def test_a_task_never_claimed_has_no_attempts_and_no_reply(store, task_id):
    story = store.story(task_id)
    assert (story.task.task_id, story.attempts, story.reply, story.deliveries) == (
        task_id, [], None, [])


def test_each_attempt_keeps_its_owner_fence_times_and_how_it_ended(store, task_id, clock):
    store.fail(store.claim("w1"), "flaky")
    clock.advance(10)  # the fixed test backoff
    store.release(store.claim("w2"))
    clock.advance(1)
    store.finish(store.claim("w3"), "ok")
    attempts = store.story(task_id).attempts
    assert [(a.owner, a.fence, a.attempt, a.outcome) for a in attempts] == [
        ("w1", 1, 1, AttemptOutcome.RETRY), ("w2", 2, 2, AttemptOutcome.RELEASED),
        ("w3", 3, 2, AttemptOutcome.DONE)]
    assert attempts[0].error == "flaky"
    assert (attempts[0].started_at, attempts[0].ended_at) == (START, START)
    assert (attempts[2].started_at, attempts[2].ended_at) == (START + 11, START + 11)


def test_a_running_attempt_has_no_end_yet(store, task_id):
    store.claim("w1")
    (attempt,) = store.story(task_id).attempts
    assert (attempt.owner, attempt.ended_at, attempt.outcome) == ("w1", None, None)


def test_a_lost_lease_and_a_cancel_end_the_attempt_they_interrupt(store, auth, task_id, clock):
    store.claim("w1")
    clock.advance(store.settings.lease)
    store.sweep()
    store.claim("w2")
    store.cancel(task_id, reason="no longer needed")
    attempts = store.story(task_id).attempts
    assert [a.outcome for a in attempts] == [AttemptOutcome.LEASE_EXPIRED,
                                             AttemptOutcome.CANCELLED]
    assert attempts[1].error == "no longer needed"


def test_a_deadline_that_passes_while_it_runs_ends_the_attempt_as_expired(store, auth, clock):
    task_id = store.receive(auth, envelope("short", deadline=START + 5)).task_id
    store.claim("w1")
    clock.advance(5)
    store.sweep()
    (attempt,) = store.story(task_id).attempts
    assert attempt.outcome == AttemptOutcome.EXPIRED
    assert store.task(task_id).state == TaskState.EXPIRED


def test_a_fenced_call_leaves_the_story_as_it_was(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    store.claim("w2")
    before = store.story(task_id).attempts
    with pytest.raises(postroom.Fenced):
        store.finish(stale, "late")
    assert store.story(task_id).attempts == before


def test_each_delivery_attempt_of_the_reply_is_kept(store, task_id, clock, transport):
    store.finish(store.claim("w1"), "ok")
    claim = store.claim_replies("d1")[0]
    store.record_delivery(claim, postroom.Outcome.transient("timeout"))
    clock.advance(5)  # the fixed test delivery backoff
    store.dispatch(transport, owner="d2")
    story = store.story(task_id)
    assert [(d.owner, d.attempt, d.outcome) for d in story.deliveries] == [
        ("d1", 1, AttemptOutcome.TRANSIENT), ("d2", 2, AttemptOutcome.DELIVERED)]
    assert story.reply is not None and story.reply.state == postroom.ReplyState.SENT


def test_the_story_names_the_waits_the_task_opened(store, task_id):
    claim = store.claim("w1")
    store.finish(claim, "asked", waits=[postroom.OpenWait(flow="refund-1", step="approval",
                                                          deadline=START + 60)])
    (wait,) = store.story(task_id).waits
    assert (wait.flow, wait.step, wait.generation, wait.task_id) == (
        "refund-1", "approval", 1, task_id)


def test_the_story_of_an_unknown_task_is_not_found(store):
    with pytest.raises(postroom.NotFound):
        store.story("no-such-task")


def test_several_tasks_are_read_in_one_snapshot_in_order_with_none_where_there_is_none(
        store, auth, task_id):
    other = store.receive(auth, envelope(message_id="another")).task_id
    store.claim("w1")
    found = store.tasks_of([other, "0" * 64, task_id])
    assert [None if task is None else (task.task_id, task.state) for task in found] == [
        (other, TaskState.PENDING), None, (task_id, TaskState.RUNNING)]
    assert found[2] == store.task(task_id)


def test_reading_several_tasks_names_a_task_id_that_is_not_one(store):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.tasks_of(["", "x" * 100])
    assert refused.value.field == "task_ids[0]"
