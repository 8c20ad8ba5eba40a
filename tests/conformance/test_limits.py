"""SPEC §1 limits, at the store: each bad value is refused by ``receive`` with an
``InvalidEnvelope`` naming its field, and nothing at all is written; each value exactly at
its limit is stored."""

from __future__ import annotations

import pytest

import postroom
from postroom.validation import canonical_json
from tests.support import START, envelope

CJK = "日"  # three bytes of UTF-8


def nested(levels: int) -> dict[str, object]:
    """A payload with ``levels`` levels of containers (the payload object is level 1)."""
    value: dict[str, object] = {"leaf": True}
    for _ in range(levels - 1):
        value = {"inner": value}
    return value


def with_nodes(count: int) -> dict[str, object]:
    """A payload of exactly ``count`` JSON values: itself, one list, and its items."""
    return {"items": [0] * (count - 2)}


def of_size(size: int) -> dict[str, object]:
    """A payload whose canonical JSON is exactly ``size`` bytes."""
    payload = {"k": "x" * (size - len('{"k":""}'))}
    assert len(canonical_json(payload).encode("utf-8")) == size
    return payload


def self_referencing_dict() -> dict[str, object]:
    payload: dict[str, object] = {"a": 1}
    payload["self"] = payload
    return payload


def self_referencing_list() -> dict[str, object]:
    items: list[object] = [1]
    items.append(items)
    return {"items": items}


def refused(field: str, value: object, name: str) -> object:
    return pytest.param(field, value, id=f"{field}-{name}")


REFUSED = [
    refused("message_id", "", "empty"),
    refused("message_id", CJK * 43, "43-cjk-is-129-bytes"),
    refused("message_id", "x" * 129, "129-ascii"),
    refused("message_id", 42, "int"),
    refused("message_id", None, "none"),
    refused("message_id", b"m-1", "bytes"),
    refused("message_id", "m-\ud800", "lone-surrogate"),
    refused("message_id", "m-\x00", "nul"),
    refused("payload", [1, 2], "list"),
    refused("payload", "text", "str"),
    refused("payload", None, "none"),
    refused("payload", {1: "x"}, "int-key"),
    refused("payload", {("a",): "x"}, "tuple-key"),
    refused("payload", nested(17), "depth-17"),
    refused("payload", with_nodes(10_001), "10001-nodes"),
    refused("payload", {"x": float("nan")}, "nan"),
    refused("payload", {"x": [float("inf")]}, "inf"),
    refused("payload", {"x": float("-inf")}, "minus-inf"),
    refused("payload", {"x": 2**64}, "int-beyond-64-bits"),
    refused("payload", of_size(64 * 1024 + 1), "64KiB-plus-one-byte"),
    refused("payload", self_referencing_dict(), "self-referencing-dict"),
    refused("payload", self_referencing_list(), "self-referencing-list"),
    refused("payload", {"x": b"bytes"}, "bytes-value"),
    refused("payload", {"x": {1, 2}}, "set-value"),
    refused("payload", {"x": "\udc80"}, "lone-surrogate-value"),
    refused("payload", {"x": {"\ud800": 1}}, "lone-surrogate-key"),
    refused("deadline", 10**1000, "10-to-the-1000"),
    refused("deadline", "soon", "str"),
    refused("deadline", True, "bool"),
    refused("deadline", float("nan"), "nan"),
    refused("deadline", float("inf"), "inf"),
    refused("deadline", float("-inf"), "minus-inf"),
    refused("deadline", None, "none"),
    refused("max_attempts", 0, "zero"),
    refused("max_attempts", 11, "eleven"),
    refused("max_attempts", True, "bool"),
    refused("max_attempts", 3.0, "float"),
    refused("max_attempts", "3", "str"),
    refused("hops", -1, "minus-one"),
    refused("hops", 2**31, "2-to-the-31"),
    refused("hops", True, "bool"),
    refused("hops", 1.0, "float"),
    refused("queue", "", "empty"),
    refused("queue", "q" * 129, "129-bytes"),
    refused("queue", CJK * 43, "43-cjk"),
    refused("queue", 7, "int"),
    refused("queue", "q\x00", "nul"),
    refused("correlation_id", "", "empty"),
    refused("correlation_id", "c" * 129, "129-bytes"),
    refused("correlation_id", CJK * 43, "43-cjk"),
    refused("correlation_id", 7, "int"),
]


def written(store: postroom.Store) -> tuple[object, ...]:
    """Everything a refused receive must leave alone: counts and the time high-water."""
    info = store.info()
    return info["tasks"], info["replies"], info["time_high_water"]


@pytest.fixture
def busy(store, auth, clock):
    store.receive(auth, envelope("already-there"))
    clock.advance(5)  # so a write by the refused call would move the high-water too
    return store


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_bad_value_is_refused_naming_its_field_and_nothing_is_written(busy, auth, field,
                                                                         value):
    before = written(busy)
    with pytest.raises(postroom.InvalidEnvelope) as refusal:
        busy.receive(auth, envelope(**{"message_id": "new-message", field: value}))
    assert isinstance(refusal.value, ValueError)
    assert refusal.value.field.split(".")[0].split("[")[0] == field
    assert str(refusal.value).startswith(field)
    assert written(busy) == before


@pytest.mark.parametrize(("field", "value"), REFUSED[:8])
def test_a_bad_value_in_an_atomic_batch_names_its_item_and_writes_nothing(busy, auth, field,
                                                                          value):
    before = written(busy)
    with pytest.raises(postroom.InvalidEnvelope) as refusal:
        busy.receive_atomic(auth, [envelope("fine"),
                                   envelope(**{"message_id": "bad", field: value})])
    assert refusal.value.field.startswith(f"envelopes[1].{field}")
    assert written(busy) == before


@pytest.mark.parametrize(("field", "value"), [
    pytest.param("message_id", "x" * 128, id="message_id-128-ascii"),
    pytest.param("message_id", CJK * 42 + "xx", id="message_id-42-cjk-and-2-ascii"),
    pytest.param("payload", nested(16), id="payload-depth-16"),
    pytest.param("payload", with_nodes(10_000), id="payload-10000-nodes"),
    pytest.param("payload", of_size(64 * 1024), id="payload-exactly-64KiB"),
    pytest.param("payload", {"x": 2**63 - 1, "y": -(2**63)}, id="payload-64-bit-ints"),
    pytest.param("payload", {"shared": [[1]] * 3}, id="payload-shared-not-cyclic"),
    pytest.param("max_attempts", 1, id="max_attempts-1"),
    pytest.param("max_attempts", 10, id="max_attempts-10"),
    pytest.param("hops", 0, id="hops-0"),
    pytest.param("deadline", int(START) + 60, id="deadline-int"),
    pytest.param("queue", "q" * 128, id="queue-128-bytes"),
    pytest.param("correlation_id", "c" * 128, id="correlation_id-128-bytes"),
])
def test_a_value_at_its_limit_is_stored(store, auth, field, value):
    ack = store.receive(auth, envelope(**{"message_id": "edge", field: value}))
    task = store.task(ack.task_id)
    assert task.state == postroom.TaskState.PENDING
    stored = {"message_id": task.message_id, "payload": task.payload,
              "max_attempts": task.max_attempts, "hops": task.hops, "deadline": task.deadline,
              "queue": task.queue, "correlation_id": task.correlation_id}[field]
    assert stored == value


def test_the_largest_hop_count_is_accepted_and_stored_at_the_hop_limit(store, auth):
    ack = store.receive(auth, envelope("far", hops=2**31 - 1))
    task = store.task(ack.task_id)
    assert (task.hops, task.state) == (2**31 - 1, postroom.TaskState.HOP_LIMIT)


def test_a_lowered_limit_is_enforced_by_the_store(db_url, clock, auth):
    settings = postroom.Settings(limits=postroom.Limits(payload_bytes=1024, text_bytes=16))
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        with pytest.raises(postroom.InvalidEnvelope, match="payload"):
            store.receive(auth, envelope(payload=of_size(1025)))
        with pytest.raises(postroom.InvalidEnvelope, match="message_id"):
            store.receive(auth, envelope("m" * 17))
        assert store.receive(auth, envelope("m" * 16, payload=of_size(1024)))
