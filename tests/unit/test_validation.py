"""The validator of SPEC §1, without a database: it never crashes, and what it accepts is
canonical JSON that round-trips within the limits."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom import AuthContext, Envelope, InvalidEnvelope, InvalidInput, Limits, Settings
from postroom.errors import Unauthorized
from postroom.inbox import check
from postroom.models import Claim, ReplyClaim
from postroom.validation import (
    CLAIM_FIELDS,
    DEFAULT_LIMITS,
    REPLY_CLAIM_FIELDS,
    canonical_json,
    check_envelope,
    check_json,
    check_text,
)

QUICK = settings(max_examples=300, deadline=None)

lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
texts = st.one_of(st.text(max_size=8), st.builds(lambda a, s: a + s, st.text(max_size=3),
                                                 lone_surrogates))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**200), 2**200),
    st.floats(allow_nan=True, allow_infinity=True), texts, st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=2), st.sets(st.integers(), max_size=2),
    st.just(object()), st.just(1 + 2j),
)
keys = st.one_of(texts, st.integers(), st.booleans(), st.none(), st.floats(),
                 st.tuples(st.integers()), st.binary(max_size=2))


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(children, max_size=4), st.tuples(children, children),
                     st.dictionaries(keys, children, max_size=4),
                     st.dictionaries(st.text(max_size=4), children, max_size=4))


json_ish = st.recursive(scalars, containers, max_leaves=40)


def with_cycle(data: st.DataObject, value: Any) -> Any:
    """Sometimes make a mutable container inside ``value`` refer back to ``value``."""
    mutable = [item for item in _walk(value) if isinstance(item, list | dict)]
    if not mutable or not isinstance(value, list | dict | tuple) or not data.draw(st.booleans()):
        return value
    target = data.draw(st.sampled_from(mutable))
    if isinstance(target, list):
        target.append(value)
    else:
        target["cycle"] = value
    return value


def _walk(value: Any) -> list[Any]:
    found, stack, seen = [], [value], set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def normalized(value: Any) -> Any:
    """What JSON makes of an accepted value: tuples become lists."""
    if isinstance(value, dict):
        return {key: normalized(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [normalized(child) for child in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (so ``True`` is not ``1``, ``1`` not ``1.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(child) for child in value), default=0)
    return 0


def nodes(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(nodes(child) for child in value.values())
    if isinstance(value, list):
        return 1 + sum(nodes(child) for child in value)
    return 1


@QUICK
@given(st.data(), json_ish)
def test_the_json_check_only_accepts_or_refuses_and_what_it_accepts_round_trips(data, value):
    value = with_cycle(data, value)
    try:
        text = check_json(value, "payload", limits=DEFAULT_LIMITS, require_object=False)
    except InvalidInput as exc:
        assert exc.field.startswith("payload")
        return
    parsed = json.loads(text)
    assert same(parsed, normalized(value))
    assert canonical_json(parsed) == text
    assert len(text.encode("utf-8")) <= DEFAULT_LIMITS.payload_bytes
    assert depth(parsed) <= DEFAULT_LIMITS.payload_depth
    assert nodes(parsed) <= DEFAULT_LIMITS.payload_nodes


@QUICK
@given(st.integers(1, 4), st.integers(1, 40), st.integers(16, 600), json_ish)
def test_lowered_limits_hold_for_whatever_is_accepted(max_depth, max_nodes, max_bytes, value):
    limits = Limits(payload_depth=max_depth, payload_nodes=max_nodes, payload_bytes=max_bytes)
    try:
        text = check_json(value, "result", limits=limits, require_object=False)
    except InvalidInput:
        return
    parsed = json.loads(text)
    assert depth(parsed) <= max_depth and nodes(parsed) <= max_nodes
    assert len(text.encode("utf-8")) <= max_bytes


junk = st.one_of(scalars, st.lists(st.integers(), max_size=2),
                st.dictionaries(texts, texts, max_size=2))
VALID = {
    "message_id": st.text(min_size=1, max_size=42),
    "sender": st.just("planner"),
    "payload": st.dictionaries(st.text(max_size=4), json_ish, max_size=3),
    "deadline": st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                          st.integers(-(2**60), 2**60)),
    "max_attempts": st.integers(1, 10),
    "hops": st.integers(0, 2**31 - 1),
    "kind": st.just("task"),
    "queue": st.text(min_size=1, max_size=42),
    "correlation_id": st.one_of(st.none(), st.text(min_size=1, max_size=42)),
    "parent_task_id": st.one_of(st.none(), st.text(min_size=1, max_size=42)),
}
BROKEN = {
    "message_id": st.one_of(st.text(min_size=43, max_size=130), junk),
    "deadline": st.one_of(st.floats(), st.integers(-(2**1100), 2**1100), junk),
    "max_attempts": st.one_of(st.integers(-2, 12), junk),
    "hops": st.one_of(st.integers(-2, 2**32), junk),
    "queue": st.one_of(st.text(max_size=130), junk),
    "correlation_id": st.one_of(st.text(max_size=130), junk),
}


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid envelope's fields with zero, one or two of them broken or missing."""
    fields = {name: draw(strategy) for name, strategy in VALID.items()}
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del fields[name]
        else:
            fields[name] = draw(BROKEN.get(name, junk))
    return fields


@QUICK
@given(envelopes())
def test_the_envelope_check_only_accepts_or_refuses_naming_a_field(fields):
    try:
        checked = check_envelope("planner", fields, limits=DEFAULT_LIMITS)
    except InvalidEnvelope as exc:
        assert exc.field.split(".")[0].split("[")[0] in VALID
        return
    assert json.loads(checked.payload) == json.loads(canonical_json(fields["payload"]))
    assert math.isfinite(checked.deadline)
    assert type(checked.max_attempts) is int and 1 <= checked.max_attempts <= 10
    assert type(checked.hops) is int and 0 <= checked.hops <= 2**31 - 1
    for name in ("message_id", "queue", "correlation_id"):
        value = getattr(checked, name)
        assert value is None or 1 <= len(value.encode("utf-8")) <= 128
    assert canonical_json(json.loads(checked.envelope)) == checked.envelope


@pytest.mark.parametrize(("name", "value"), [
    ("payload_depth", 17), ("payload_nodes", 10_001), ("payload_bytes", 64 * 1024 + 1),
    ("text_bytes", 129), ("max_attempts", 11), ("hops", 2**31), ("payload_bytes", 0),
    ("hops", True),
])
def test_limits_may_be_lowered_but_never_raised(name, value):
    with pytest.raises(InvalidInput) as refused:
        Limits(**{name: value})
    assert refused.value.field == f"limits.{name}"


def test_a_self_reference_is_named_where_it_closes():
    payload: dict[str, Any] = {"a": {"b": []}}
    payload["a"]["b"].append(payload)
    with pytest.raises(InvalidInput, match="refers to itself") as refused:
        check_json(payload, "payload", limits=DEFAULT_LIMITS, require_object=True)
    assert refused.value.field == "payload.a.b[0]"


def test_the_same_list_twice_is_not_a_self_reference():
    shared = [1, 2]
    text = check_json({"x": shared, "y": shared}, "payload", limits=DEFAULT_LIMITS,
                      require_object=True)
    assert text == '{"x":[1,2],"y":[1,2]}'


def test_canonical_json_sorts_keys_keeps_unicode_and_uses_no_spaces():
    assert canonical_json({"b": 1, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


@QUICK
@given(st.one_of(texts, junk, st.just("planner")))
def test_only_the_senders_own_principal_is_authorized(principal):
    envelope = Envelope(message_id="m", sender="planner", payload={}, deadline=1.0)
    try:
        check(Settings(), AuthContext(principal=principal), envelope)
    except Unauthorized:
        assert principal != "planner"
        return
    assert principal == "planner"


@pytest.mark.parametrize(("payload", "field", "problem"), [
    ({"a": {"\ud800": 1}}, "payload.a", "has a key that is not valid UTF-8"),
    ({"a": ["ok", "\udfff"]}, "payload.a[1]", "is not valid UTF-8"),
    ({"\udc80": {"deep": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}}, "payload", "has a key"),
])
def test_text_that_is_not_utf8_is_refused_at_its_dotted_path(payload, field, problem):
    with pytest.raises(InvalidInput, match=problem) as refused:
        check_json(payload, "payload", limits=DEFAULT_LIMITS, require_object=True)
    assert refused.value.field == field


@pytest.mark.parametrize("text", ["\x00", "m-\x00", "\x00m"])
def test_text_fields_refuse_nul_which_postgresql_cannot_store(text):
    with pytest.raises(InvalidInput, match="U\\+0000") as refused:
        check_text(text, "queue", max_bytes=128)
    assert refused.value.field == "queue"


def test_nul_inside_json_is_escaped_and_accepted():
    assert check_json({"k\x00": "v\x00"}, "payload", limits=DEFAULT_LIMITS,
                      require_object=True) == '{"k\\u0000":"v\\u0000"}'


class Uncomparable:
    """A value whose comparisons raise, as a hostile or buggy caller's object might."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __ne__ = __eq__
    __hash__ = object.__hash__


def test_a_kind_that_cannot_be_compared_is_refused_not_crashed_on():
    fields = {"message_id": "m", "sender": "p", "payload": {}, "deadline": 1.0,
              "kind": Uncomparable()}
    with pytest.raises(InvalidEnvelope) as refused:
        check_envelope("p", fields, limits=DEFAULT_LIMITS)
    assert refused.value.field == "kind"


@pytest.mark.parametrize(("record", "checks"), [(Claim, CLAIM_FIELDS),
                                                (ReplyClaim, REPLY_CLAIM_FIELDS)])
def test_every_field_of_a_claim_is_type_checked_in_order(record, checks):
    # A field added to a claim without a check would reach SQL unchecked.
    assert list(checks) == [field.name for field in dataclasses.fields(record)]


_ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=300),
                       st.binary(max_size=8), st.dictionaries(st.text(max_size=3),
                                                              st.integers(), max_size=2))


_ISSUED_CLAIM = Claim(task_id="a" * 64, owner="w", fence=3, attempt=1, max_attempts=3,
                      payload={"n": 1}, queue="default", hops=0, deadline=1e9 + 0.5,
                      lease_until=1e9 + 30.5, principal="bench", message_id="m-1",
                      correlation_id=None, requester="bench")
_ISSUED_REPLY_CLAIM = ReplyClaim(reply_id="reply:" + "a" * 64, task_id="a" * 64, owner="d",
                                 fence=1, attempt=1, budget=3, lease_until=1e9 + 30.5,
                                 body='{"kind":"result"}', fingerprint="b" * 64,
                                 requester=None)


@given(field=st.sampled_from([field.name for field in dataclasses.fields(Claim)]),
       value=_ANY_VALUE)
@settings(max_examples=400)
def test_a_claim_checked_quickly_is_one_the_field_checks_accept(field, value):
    from postroom.validation import _CLAIM_ISSUED, CLAIM_FIELDS, _as_issued

    claim = dataclasses.replace(_ISSUED_CLAIM, **{field: value})
    if _as_issued(claim, _CLAIM_ISSUED):
        for name, check in CLAIM_FIELDS.items():
            check(getattr(claim, name), name)  # none of them refuses it


@given(field=st.sampled_from([field.name for field in dataclasses.fields(ReplyClaim)]),
       value=_ANY_VALUE)
@settings(max_examples=400)
def test_a_reply_claim_checked_quickly_is_one_the_field_checks_accept(field, value):
    from postroom.validation import _REPLY_CLAIM_ISSUED, REPLY_CLAIM_FIELDS, _as_issued

    claim = dataclasses.replace(_ISSUED_REPLY_CLAIM, **{field: value})
    if _as_issued(claim, _REPLY_CLAIM_ISSUED):
        for name, check in REPLY_CLAIM_FIELDS.items():
            check(getattr(claim, name), name)
