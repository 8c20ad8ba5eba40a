"""A property of every owner's call (SPEC §3, §4): take a real, current claim, alter or mistype
exactly one of its fields, and the call is refused -- ``Fenced`` for a value of the right type,
``InvalidInput`` for one of the wrong type, never another exception -- and nothing at all is
written: not a task, not a reply, not the time high-water.

Two fields are not credentials and may hold any value of their type: ``lease_until`` (the
database's lease is the one that counts, and an older copy of a claim is still the claim) and
``payload`` (the handler's to use). For those only a wrong type is drawn.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import postroom
from postroom import Outcome
from tests.support import envelope, stored

PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

#: Values of any type, drawn for any field (one of the issued type is filtered out below).
anything = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.binary(max_size=4), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.just(1 + 2j),
)


def ints(issued: int) -> st.SearchStrategy[Any]:
    altered = st.one_of(
        st.sampled_from([issued + 1, issued - 1, -issued, 0, -1, 2**31, 2**63 - 1]),
        st.integers(-(2**63), 2**63 - 1))
    mistyped = st.one_of(
        st.sampled_from([float(issued), str(issued), True, False, 2**63, -(2**63) - 1,
                         2**64]), anything.filter(lambda v: type(v) is not int))
    return st.one_of(altered, mistyped)


def floats(issued: float, *, credential: bool) -> st.SearchStrategy[Any]:
    mistyped = st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, int(issued), str(issued), 10**400,
                         True]), anything.filter(lambda v: type(v) is not float))
    if not credential:
        return mistyped
    altered = st.one_of(
        st.sampled_from([issued + 1e6, issued - 1, math.nextafter(issued, math.inf), -issued,
                         1e308, 0.0]), st.floats(allow_nan=False, allow_infinity=False))
    return st.one_of(altered, mistyped)


def texts(issued: str) -> st.SearchStrategy[Any]:
    altered = st.one_of(
        st.sampled_from([issued + "x", issued[:-1] or "y", issued.upper(), " " + issued,
                         "x" * 100]), st.text(min_size=1, max_size=12))
    mistyped = st.one_of(
        st.sampled_from(["", "x" * 200_000, issued + "\x00", issued + "\ud800",
                         issued.encode(), [issued]]),
        anything.filter(lambda v: type(v) is not str))
    return st.one_of(altered, mistyped)


def payloads(issued: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from([list(issued.items()), tuple(issued), str(issued)]),
                     anything.filter(lambda v: type(v) is not dict))


def wrong_value(field: str, issued: Any) -> st.SearchStrategy[Any]:
    """Another value for ``field`` of a claim that holds ``issued`` there: of the same type
    (for a credential) or of another, never the same value of the same type."""
    if field == "payload":
        strategy = payloads(issued)
    elif issued is None:  # an optional text the task does not have: any value alters it
        strategy = st.one_of(texts("x"), anything.filter(lambda v: v is not None))
    elif type(issued) is int:
        strategy = ints(issued)
    elif type(issued) is float:
        strategy = floats(issued, credential=field != "lease_until")
    else:
        strategy = texts(issued)
    return strategy.filter(lambda value: not (type(value) is type(issued) and value == issued))


#: A new message (so a new task, and a claim of its own) for every example.
MESSAGE_NUMBERS = count()

#: The owner's calls, each with a claim: (make a current claim, make the call).
Make = Callable[[postroom.Store, postroom.AuthContext, str], Any]


def task_claim(store: postroom.Store, auth: postroom.AuthContext, message_id: str) -> Any:
    store.receive(auth, envelope(message_id, max_attempts=3, hops=1,
                                 correlation_id=f"c-{message_id}"))
    return store.claim("w")


def reply_claim(store: postroom.Store, auth: postroom.AuthContext, message_id: str) -> Any:
    store.receive(auth, envelope(message_id))
    store.finish(store.claim("w"), {"answer": message_id})
    return store.claim_replies("d")[0]


CALLS: dict[str, tuple[Make, Callable[[postroom.Store, Any], object]]] = {
    "renew": (task_claim, lambda store, claim: store.renew(claim)),
    "finish": (task_claim, lambda store, claim: store.finish(claim, {"ok": True})),
    "fail": (task_claim, lambda store, claim: store.fail(claim, "broken", retryable=False)),
    "record_delivery": (reply_claim, lambda store, claim: store.record_delivery(
        claim, Outcome.delivered())),
}


@pytest.mark.parametrize("call", CALLS)
@PROPERTY
@given(data=st.data())
def test_a_claim_with_one_field_altered_or_mistyped_is_refused_and_writes_nothing(
        store, auth, clock, call, data):
    make, act = CALLS[call]
    claim = make(store, auth, f"m-{next(MESSAGE_NUMBERS)}")
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(claim)]),
                      label="field")
    value = data.draw(wrong_value(field, getattr(claim, field)), label="value")
    forged = dataclasses.replace(claim, **{field: value})
    clock.advance(0.01)  # a write would move the time high-water: leases (30 s) still hold
    before = stored(store)
    with pytest.raises((postroom.Fenced, postroom.InvalidInput)) as refused:
        act(store, forged)
    event(f"{field}: {type(refused.value).__name__}")
    assert stored(store) == before
