"""SPEC §3 and §10: a worker that stops hands its task back with ``release``; not a failure."""

from __future__ import annotations

import dataclasses

import pytest

import postroom
from postroom import TaskState
from tests.support import envelope


@pytest.fixture
def task_id(store, auth):
    return store.receive(auth, envelope(max_attempts=2)).task_id


def test_a_released_task_is_pending_again_with_its_attempt_given_back(store, task_id):
    store.release(store.claim("w1"))
    task = store.task(task_id)
    assert (task.state, task.owner, task.lease_until, task.attempts, task.fence) == (
        TaskState.PENDING, None, None, 0, 1)
    assert task.last_error is None  # not a failure
    assert store.reply(task_id) is None


def test_a_released_task_is_claimable_at_once_with_a_new_fence_and_the_same_attempt(
        store, task_id):
    store.release(store.claim("w1"))
    again = store.claim("w2")
    assert (again.fence, again.attempt) == (2, 1)


def test_repeated_releases_never_use_up_the_attempts(store, task_id):
    for _ in range(5):  # more shutdowns than max_attempts
        store.release(store.claim("w"))
    claim = store.claim("w")
    assert (claim.attempt, claim.fence) == (1, 6)
    store.finish(claim, "ok")
    assert store.task(task_id).state == TaskState.DONE


def test_a_release_with_a_delay_keeps_the_task_until_then(store, task_id, clock):
    store.release(store.claim("w1"), delay=30)
    assert store.claim("w2") is None
    clock.advance(30)
    assert store.claim("w2") is not None


def test_a_stale_release_is_fenced_and_writes_nothing(store, task_id, clock):
    stale = store.claim("w1")
    clock.advance(store.settings.lease)
    current = store.claim("w2")
    with pytest.raises(postroom.Fenced):
        store.release(stale)
    task = store.task(task_id)
    assert (task.state, task.owner, task.fence, task.attempts) == (
        TaskState.RUNNING, "w2", current.fence, 2)


def test_a_release_of_an_altered_claim_is_fenced(store, task_id):
    claim = store.claim("w1")
    with pytest.raises(postroom.Fenced):
        store.release(dataclasses.replace(claim, attempt=claim.attempt + 1))
    assert store.task(task_id).state == TaskState.RUNNING


@pytest.mark.parametrize("delay", [-1, float("nan"), "0", True, 10**9])
def test_a_release_delay_that_is_not_a_sensible_number_of_seconds_is_refused(
        store, task_id, delay):
    claim = store.claim("w1")
    with pytest.raises(postroom.InvalidInput, match="delay"):
        store.release(claim, delay=delay)
    assert store.task(task_id).state == TaskState.RUNNING


def test_a_release_wakes_the_workers_waiting_on_its_queue(store, task_id):
    claim = store.claim("w1")
    waiter = store.waiter(queues=["default"])
    store.release(claim)
    assert waiter.wait(timeout=0)
