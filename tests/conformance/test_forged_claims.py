"""A claim is a credential: only the claim as postroom issued it may renew, finish or fail a
task, or record a reply's delivery (SPEC §3, §4).

A field of the right type whose value differs from what was issued (another attempt count,
deadline, queue, ...) is a stale or forged claim: ``Fenced``, and nothing is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import postroom
from tests.support import envelope, stored


@pytest.fixture
def claim(store, auth, clock):
    store.receive(auth, envelope(max_attempts=3, hops=1))
    issued = store.claim("w")
    clock.advance(5)  # a write by a refused call would move the time high-water too
    return issued


TASK_CALLS: dict[str, Callable[[postroom.Store, postroom.Claim], object]] = {
    "renew": lambda store, claim: store.renew(claim),
    "finish": lambda store, claim: store.finish(claim, {"ok": True}),
    "fail": lambda store, claim: store.fail(claim, "broken"),
    "finish_batch": lambda store, claim: store.finish_batch([(claim, None)]),
}

#: A claim's fields given another value of the right type, and how each is altered.
ALTERED: dict[str, Callable[[Any], Any]] = {
    "attempt": lambda value: value + 1,
    "max_attempts": lambda value: value + 5,
    "hops": lambda value: 0,
    "deadline": lambda value: value + 1e6,
    "queue": lambda value: "other-queue",
    "principal": lambda value: "someone-else",
    "message_id": lambda value: "another-message",
    "owner": lambda value: "another-worker",
    "fence": lambda value: value + 1,
}


@pytest.mark.parametrize("field", ALTERED)
def test_renew_with_a_field_altered_is_fenced_and_nothing_is_written(store, claim, field):
    forged = dataclasses.replace(claim, **{field: ALTERED[field](getattr(claim, field))})
    before = stored(store)
    with pytest.raises(postroom.Fenced):
        store.renew(forged)
    assert stored(store) == before


@pytest.mark.parametrize("call", TASK_CALLS)
def test_every_owner_call_fences_a_claim_for_another_message(store, claim, call):
    before = stored(store)
    with pytest.raises(postroom.Fenced, match="message_id"):
        TASK_CALLS[call](store, dataclasses.replace(claim, message_id="another-message"))
    assert stored(store) == before


def test_a_claim_given_the_id_of_another_task_of_its_owner_is_fenced(store, auth):
    # Both tasks have the same owner, fence, attempt, limits, queue and deadline: only the
    # message tells the claims apart.
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    first, second = store.claim_batch("w", 2)
    before = stored(store)
    with pytest.raises(postroom.Fenced, match="message_id"):
        store.finish(dataclasses.replace(first, task_id=second.task_id), {"from": "a"})
    assert stored(store) == before


def test_renew_with_an_altered_deadline_does_not_extend_the_lease(store, claim):
    lease_until = store.task(claim.task_id).lease_until
    with pytest.raises(postroom.Fenced, match="deadline"):
        store.renew(dataclasses.replace(claim, deadline=claim.deadline + 1e6), lease=3600)
    assert store.task(claim.task_id).lease_until == lease_until


def test_the_claim_as_issued_still_renews_and_fails(store, claim):
    renewed = store.renew(claim)
    assert renewed.lease_until > claim.lease_until
    assert store.fail(renewed, "once more") == postroom.TaskState.PENDING
