"""A claim is a credential: only the claim as postroom issued it may renew, finish or fail a
task, or record a reply's delivery (SPEC §3, §4).

Two kinds of forgery, two answers, the same on both backends and before anything is written:

- a field of the right type whose value differs from what was issued (another attempt count,
  deadline, queue, ...) is a stale or forged claim: ``Fenced``;
- a field of the wrong type (``fence="1"``, ``fence=1.0``, ``fence=True``, ``task_id=None``,
  a NaN deadline) is a programming error: ``InvalidInput`` naming the field, raised before any
  SQL runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest

import postroom
from postroom import Outcome
from tests.support import envelope, stored


@pytest.fixture
def claim(store, auth, clock):
    store.receive(auth, envelope(max_attempts=3, hops=1))
    issued = store.claim("w")
    clock.advance(5)  # a write by a refused call would move the time high-water too
    return issued


@pytest.fixture
def reply_claim(store, auth, clock):
    store.receive(auth, envelope())
    store.finish(store.claim("w"), {"answer": 42})
    issued = store.claim_replies("d")[0]
    clock.advance(5)
    return issued


TASK_CALLS: dict[str, Callable[[postroom.Store, postroom.Claim], object]] = {
    "renew": lambda store, claim: store.renew(claim),
    "finish": lambda store, claim: store.finish(claim, {"ok": True}),
    "fail": lambda store, claim: store.fail(claim, "broken"),
    "finish_batch": lambda store, claim: store.finish_batch([(claim, None)]),
}

REPLY_CALLS: dict[str, Callable[[postroom.Store, postroom.ReplyClaim], object]] = {
    "record_delivery": lambda store, claim: store.record_delivery(claim, Outcome.delivered()),
    "record_deliveries": lambda store, claim: store.record_deliveries(
        [(claim, Outcome.delivered())]),
    "record_and_claim": lambda store, claim: store.record_and_claim(
        [(claim, Outcome.delivered())], "forger"),
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


def test_a_copy_of_the_claim_from_before_its_renewal_still_finishes(store, claim):
    # Not a credential: the database's lease is the one that counts.
    assert store.renew(claim, lease=60).lease_until != claim.lease_until
    store.finish(claim, None)
    assert store.task(claim.task_id).state == postroom.TaskState.DONE


def test_a_claim_whose_payload_its_handler_changed_still_finishes(store, claim):
    claim.payload["seen"] = True  # the handler's to use
    store.finish(claim, None)
    assert store.task(claim.task_id).state == postroom.TaskState.DONE


#: Values of the wrong type for a claim's fields: (field, value, the problem named).
MISTYPED = [
    ("fence", "1", "must be an int, got str"),
    ("fence", 1.0, "must be an int, got float"),
    ("fence", True, "must be an int, got bool"),
    ("fence", None, "must be an int, got NoneType"),
    ("fence", 2**64, "must be in"),
    ("attempt", 1.0, "must be an int, got float"),
    ("attempt", False, "must be an int, got bool"),
    ("max_attempts", "3", "must be an int, got str"),
    ("hops", 1.5, "must be an int, got float"),
    ("task_id", None, "must be a string, got NoneType"),
    ("task_id", 5, "must be a string, got int"),
    ("task_id", "", "must not be empty"),
    ("owner", b"w", "must be a string, got bytes"),
    ("owner", "w\x00", "contains U.0000"),
    ("queue", "q" * 129, "the limit is 128"),
    ("principal", "planner\ud800", "not valid UTF-8"),
    ("message_id", 1, "must be a string, got int"),
    ("deadline", math.nan, "must be a finite float, got nan"),
    ("deadline", math.inf, "must be a finite float, got inf"),
    ("deadline", 1_003_600, "must be a finite float, got int"),
    ("deadline", "soon", "must be a finite float, got str"),
    ("lease_until", None, "must be a finite float, got NoneType"),
    ("lease_until", -math.inf, "must be a finite float, got -inf"),
    ("payload", [1], "must be a dict, got list"),
    ("payload", None, "must be a dict, got NoneType"),
]


@pytest.mark.parametrize(("field", "value", "problem"), MISTYPED,
                         ids=[f"{field}-{value!r}"[:40] for field, value, _ in MISTYPED])
def test_a_claim_with_a_field_of_the_wrong_type_is_refused_naming_it(store, claim, field,
                                                                     value, problem):
    forged = dataclasses.replace(claim, **{field: value})
    before = stored(store)
    with pytest.raises(postroom.InvalidInput, match=problem) as refused:
        store.renew(forged)
    assert refused.value.field == f"claim.{field}"
    assert stored(store) == before


@pytest.mark.parametrize("call", TASK_CALLS)
@pytest.mark.parametrize(("field", "value"), [("fence", "1"), ("fence", 1.0), ("fence", True),
                                              ("attempt", 1.0)])
def test_every_owner_call_refuses_a_mistyped_claim_before_any_sql(store, claim, call, field,
                                                                  value):
    # These committed on both backends (or, for True, failed inside PostgreSQL).
    before = stored(store)
    with pytest.raises(postroom.InvalidInput) as refused:
        TASK_CALLS[call](store, dataclasses.replace(claim, **{field: value}))
    assert refused.value.field.endswith(f"claim.{field}")
    assert stored(store) == before


def test_a_batch_names_the_item_whose_claim_is_mistyped(store, auth):
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    first, second = store.claim_batch("w", 2)
    before = stored(store)
    with pytest.raises(postroom.InvalidInput) as refused:
        store.finish_batch([(first, None), (dataclasses.replace(second, fence="1"), None)])
    assert refused.value.field == "items[1].claim.fence"
    assert stored(store) == before


def test_a_batch_names_the_item_whose_result_is_refused(store, claim):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.finish_batch([(claim, {"score": math.nan})])
    assert refused.value.field == "items[0].result.score"


@pytest.mark.parametrize("item", [None, "claim", (1, 2, 3)])
def test_a_finish_batch_item_that_is_not_a_pair_is_refused(store, claim, item):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.finish_batch([(claim, None), item])
    assert refused.value.field == "items[1]"


@pytest.mark.parametrize("call", [*TASK_CALLS, *REPLY_CALLS])
def test_something_that_is_not_a_claim_is_refused(store, call):
    calls: dict[str, Callable[[postroom.Store, Any], object]] = {**TASK_CALLS, **REPLY_CALLS}
    with pytest.raises(postroom.InvalidInput, match=r"must be a (Reply)?Claim, got dict"):
        calls[call](store, {"task_id": "t", "fence": 1})


REPLY_ALTERED: dict[str, Callable[[Any], Any]] = {
    "reply_id": lambda value: value + "x",
    "task_id": lambda value: value[::-1],
    "owner": lambda value: "another-dispatcher",
    "fence": lambda value: value + 1,
    "attempt": lambda value: value + 1,
    "budget": lambda value: value + 10,
    "body": lambda value: value.replace("42", "43"),
    "fingerprint": lambda value: value[::-1],
}


@pytest.mark.parametrize("field", REPLY_ALTERED)
def test_a_reply_claim_with_a_field_altered_is_fenced_and_nothing_is_written(
        store, reply_claim, field):
    forged = dataclasses.replace(reply_claim,
                                 **{field: REPLY_ALTERED[field](getattr(reply_claim, field))})
    before = stored(store)
    with pytest.raises(postroom.Fenced):
        store.record_delivery(forged, Outcome.delivered())
    assert stored(store) == before


REPLY_MISTYPED = [
    ("fence", "1", "must be an int, got str"),
    ("fence", 1.0, "must be an int, got float"),
    ("fence", True, "must be an int, got bool"),
    ("attempt", 1.0, "must be an int, got float"),
    ("budget", None, "must be an int, got NoneType"),
    ("reply_id", None, "must be a string, got NoneType"),
    ("task_id", 5, "must be a string, got int"),
    ("owner", "", "must not be empty"),
    ("body", b"{}", "must be a string, got bytes"),
    ("body", "x" * (200 * 1024), "the limit is"),
    ("fingerprint", None, "must be a string, got NoneType"),
    ("lease_until", math.nan, "must be a finite float, got nan"),
]


@pytest.mark.parametrize(("field", "value", "problem"), REPLY_MISTYPED,
                         ids=[f"{field}-{value!r}"[:40] for field, value, _ in REPLY_MISTYPED])
def test_a_reply_claim_with_a_field_of_the_wrong_type_is_refused_naming_it(
        store, reply_claim, field, value, problem):
    forged = dataclasses.replace(reply_claim, **{field: value})
    before = stored(store)
    with pytest.raises(postroom.InvalidInput, match=problem) as refused:
        store.record_delivery(forged, Outcome.delivered())
    assert refused.value.field == f"claim.{field}"
    assert stored(store) == before


def test_a_batch_of_outcomes_names_the_item_whose_claim_is_mistyped(store, reply_claim):
    before = stored(store)
    with pytest.raises(postroom.InvalidInput) as refused:
        store.record_deliveries([(reply_claim, Outcome.delivered()),
                                 (dataclasses.replace(reply_claim, fence="1"),
                                  Outcome.delivered())])
    assert refused.value.field == "pairs[1].claim.fence"
    assert stored(store) == before


@pytest.mark.parametrize("outcome", [None, "delivered", Outcome(kind="delivered")])
def test_an_outcome_that_is_not_one_is_refused(store, reply_claim, outcome):
    before = stored(store)
    with pytest.raises(postroom.InvalidInput, match="outcome"):
        store.record_delivery(reply_claim, outcome)
    assert stored(store) == before
