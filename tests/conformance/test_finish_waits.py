"""SPEC §5, §10: a task that asks the outside world opens its wait in its finish's transaction,
and a wait may name the only principal whose answer it takes."""

from __future__ import annotations

import pytest

import postroom
from postroom import OpenResult, OpenWait, SignalResult, TaskState
from tests.support import START, envelope

ALICE = postroom.AuthContext(principal="alice")
MALLORY = postroom.AuthContext(principal="mallory")


@pytest.fixture
def claim(store, auth):
    store.receive(auth, envelope())
    return store.claim("w")


def test_finish_opens_its_wait_in_the_same_transaction(store, claim):
    (opening,) = store.finish(claim, "asked", waits=[OpenWait(flow="f", step="s",
                                                               deadline=START + 60)])
    assert (opening.result, opening.generation) == (OpenResult.OPENED, 1)
    wait = store.wait("f", "s")
    assert (wait.state, wait.task_id, wait.deadline) == ("waiting", claim.task_id, START + 60)
    assert store.task(claim.task_id).state == TaskState.DONE


def test_a_wait_that_cannot_open_leaves_the_task_running_and_writes_nothing(store, claim):
    store.open_wait("f", "s", 0, START + 60)  # someone else holds generation 1
    with pytest.raises(postroom.WaitNotOpened) as refused:
        store.finish(claim, "asked", waits=[OpenWait(flow="f", step="s", deadline=START + 60)])
    assert refused.value.opening.result is OpenResult.STALE
    assert store.task(claim.task_id).state == TaskState.RUNNING
    assert store.reply(claim.task_id) is None
    assert store.wait("f", "s").task_id is None  # the other registration, untouched


def test_a_fenced_finish_opens_no_wait(store, claim, clock):
    clock.advance(store.settings.lease)
    store.claim("w2")
    with pytest.raises(postroom.Fenced):
        store.finish(claim, "late", waits=[OpenWait(flow="f", step="s", deadline=START + 99)])
    with pytest.raises(postroom.NotFound):
        store.wait("f", "s")


def test_two_waits_on_one_slot_in_one_finish_are_refused_before_anything(store, claim):
    twice = [OpenWait(flow="f", step="s", deadline=START + 60)] * 2
    with pytest.raises(postroom.InvalidInput, match="waits"):
        store.finish(claim, "asked", waits=twice)
    assert store.task(claim.task_id).state == TaskState.RUNNING


def test_a_finish_wait_with_a_bad_field_is_refused_naming_it(store, claim):
    with pytest.raises(postroom.InvalidInput, match=r"waits\[0\]\.deadline"):
        store.finish(claim, "asked", waits=[OpenWait(flow="f", step="s", deadline="soon")])


def test_a_wait_with_a_responder_takes_that_principals_answer(store):
    store.open_wait("f", "s", 0, START + 60, responder="alice")
    receipt = store.signal(ALICE, "e-1", "f", "s", 1, {"approve": True})
    assert receipt.result is SignalResult.ACCEPTED
    assert store.wait("f", "s").responder == "alice"


def test_another_principals_answer_is_refused_before_any_receipt(store):
    store.open_wait("f", "s", 0, START + 60, responder="alice")
    with pytest.raises(postroom.Unauthorized, match="alice"):
        store.signal(MALLORY, "e-1", "f", "s", 1, {"approve": True})
    assert store.wait("f", "s").state == "waiting"
    # No receipt was written: the same event id is still new for mallory elsewhere.
    store.open_wait("g", "s", 0, START + 60)
    assert store.signal(MALLORY, "e-1", "g", "s", 1, 1).result is SignalResult.ACCEPTED


def test_a_responder_guards_every_generation_it_was_given_to(store):
    store.open_wait("f", "s", 0, START + 60, responder="alice")
    store.signal(ALICE, "e-1", "f", "s", 1, "yes")
    store.resume("f", "s", 1, None)
    store.open_wait("f", "s", 1, START + 60)  # generation 2 takes anyone's answer
    with pytest.raises(postroom.Unauthorized):
        store.signal(MALLORY, "e-2", "f", "s", 1, "late")  # generation 1 was alice's
    assert store.signal(MALLORY, "e-3", "f", "s", 2, "ok").result is SignalResult.ACCEPTED


def test_a_finish_can_name_the_waits_responder(store, claim):
    store.finish(claim, "asked", waits=[OpenWait(flow="f", step="s", deadline=START + 60,
                                                 responder="alice")])
    with pytest.raises(postroom.Unauthorized):
        store.signal(MALLORY, "e-1", "f", "s", 1, "yes")


@pytest.mark.parametrize("responder", ["", "task:x", 7])
def test_a_responder_that_no_principal_can_be_is_refused(store, responder):
    with pytest.raises(postroom.InvalidInput, match="responder"):
        store.open_wait("f", "s", 0, START + 60, responder=responder)


def test_a_retried_registration_with_another_responder_is_a_collision(store):
    store.open_wait("f", "s", 0, START + 60, request_id="r-1", responder="alice")
    with pytest.raises(postroom.PayloadCollision):
        store.open_wait("f", "s", 0, START + 60, request_id="r-1", responder="bob")
