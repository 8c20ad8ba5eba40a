"""Every wait input is validated before any write; each refusal names its field."""

from __future__ import annotations

import math

import pytest

import postroom
from postroom import FollowUp, OpenResult, SignalResult
from tests.support import START

ALICE = postroom.AuthContext(principal="alice")
CJK_129_BYTES = "界" * 43
TOO_LONG = "x" * 129
LONE_SURROGATE = "a\ud800"
BAD_TEXT = ["", TOO_LONG, CJK_129_BYTES, LONE_SURROGATE, 7, None, b"flow"]
BAD_GENERATION = [0, -1, True, 1.0, "1", None, 2**31]
BAD_DEADLINE = ["10", True, math.nan, math.inf, -math.inf, 10**1000, None, [1]]


def self_referencing() -> list[object]:
    items: list[object] = []
    items.append(items)
    return items


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_VALUE = [math.nan, {1: "x"}, self_referencing(), nested(17), "x" * (64 * 1024), {1, 2},
             object()]

OPEN = {"flow": "f", "step": "s", "expected_generation": 0, "deadline": START + 10}
SIGNAL = {"event_id": "e1", "flow": "f", "step": "s", "generation": 1, "value": "yes"}
ADDRESS = {"flow": "f", "step": "s", "generation": 1}


def nothing_written(store: postroom.Store) -> bool:
    info = store.info()
    return (info["waits"], info["continuations_unconsumed"], info["time_high_water"]) == (
        {}, 0, 0.0)


def refused_field(call, **arguments: object) -> str:
    with pytest.raises(postroom.InvalidInput) as refused:
        call(**arguments)
    return refused.value.field


def cases(field: str, values: list[object]) -> list[tuple[str, object]]:
    return [(field, value) for value in values]


@pytest.mark.parametrize(("field", "value"), [
    *cases("flow", BAD_TEXT), *cases("step", BAD_TEXT),
    *cases("expected_generation", [-1, True, 0.0, "0", None, 2**31 - 1]),
    *cases("deadline", BAD_DEADLINE),
    *cases("request_id", [v for v in BAD_TEXT if v is not None]),
    *cases("task_id", [v for v in BAD_TEXT if v is not None]),
])
def test_open_wait_refuses(store, field, value):
    assert refused_field(store.open_wait, **(OPEN | {field: value})) == field
    assert nothing_written(store)


@pytest.mark.parametrize(("field", "value"), [
    *cases("event_id", BAD_TEXT), *cases("flow", BAD_TEXT), *cases("step", BAD_TEXT),
    *cases("generation", BAD_GENERATION),
])
def test_signal_refuses(store, field, value):
    assert refused_field(store.signal, auth=ALICE, **(SIGNAL | {field: value})) == field
    assert nothing_written(store)


@pytest.mark.parametrize("value", BAD_VALUE)
def test_signal_refuses_a_value_that_is_not_bounded_json(store, value):
    field = refused_field(store.signal, auth=ALICE, **(SIGNAL | {"value": value}))
    assert field.startswith("value")
    assert nothing_written(store)


@pytest.mark.parametrize(("field", "value"), [
    *cases("flow", BAD_TEXT), *cases("step", BAD_TEXT), *cases("generation", BAD_GENERATION),
])
@pytest.mark.parametrize("operation", ["expire", "resume"])
def test_expire_and_resume_refuse(store, operation, field, value):
    arguments = ADDRESS | {field: value}
    if operation == "resume":
        arguments["effect"] = None
    assert refused_field(getattr(store, operation), **arguments) == field
    assert nothing_written(store)


@pytest.mark.parametrize(("effect", "field"), [
    ("next", "effect"),
    ({"message_id": "next"}, "effect"),
    (FollowUp(message_id="", payload={}), "effect.message_id"),
    (FollowUp(message_id="next", payload=[]), "effect.payload"),  # type: ignore[arg-type]
    (FollowUp(message_id="next", payload={"x": math.inf}), "effect.payload.x"),
    (FollowUp(message_id="next", payload={}, max_attempts=0), "effect.max_attempts"),
    (FollowUp(message_id="next", payload={}, deadline=math.nan), "effect.deadline"),
    (FollowUp(message_id="next", payload={}, queue=TOO_LONG), "effect.queue"),
])
def test_resume_refuses_an_invalid_effect_before_touching_the_continuation(store, effect,
                                                                           field):
    store.open_wait("f", "s", 0, START + 10)
    store.signal(ALICE, "e1", "f", "s", 1, "yes")
    assert refused_field(store.resume, **(ADDRESS | {"effect": effect})) == field
    assert len(store.continuations()) == 1


def test_the_limits_themselves_are_accepted(store):
    flow, step = "é" * 64, "界" * 42 + "xx"  # exactly 128 bytes each
    assert store.open_wait(flow, step, 0, START + 10, request_id="r" * 128).result is (
        OpenResult.OPENED)
    receipt = store.signal(ALICE, "e" * 128, flow, step, 1, {"v": "x" * 60_000})
    assert receipt.result is SignalResult.ACCEPTED
    assert store.signal(ALICE, "e2", flow, step, 2**31 - 1, None).result is (
        SignalResult.UNKNOWN_WAIT)
    assert store.open_wait(flow, step, 2**31 - 2, START).result is OpenResult.STALE


def test_a_store_with_lower_limits_refuses_longer_addresses(db_url, clock):
    settings = postroom.Settings(limits=postroom.Limits(text_bytes=8))
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        assert refused_field(store.open_wait, **(OPEN | {"flow": "123456789"})) == "flow"


def test_open_wait_takes_a_task_id_whatever_the_text_limit(db_url, clock, auth):
    settings = postroom.Settings(limits=postroom.Limits(text_bytes=16))
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        parent = store.receive(auth, postroom.Envelope(message_id="ask", sender=auth.principal,
                                                       deadline=START + 3600, payload={}))
        opening = store.open_wait("f", "s", 0, START + 10, task_id=parent.task_id)
    assert opening.result is OpenResult.OPENED
