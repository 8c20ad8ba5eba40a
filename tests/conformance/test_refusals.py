"""Arguments of the wrong type are refused before any SQL, with ``InvalidInput`` naming the
argument, the same on both backends (never ``TypeError``, never a ``StoreError`` from inside
the database); and batch arguments take any iterable, within the batch limit."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

import postroom
from postroom import Outgoing
from postroom.validation import MAX_BATCH
from tests.support import envelope, stored

#: Every call that takes an identity to look up: (the call, the argument it names).
LOOKUPS: dict[str, tuple[Callable[[postroom.Store, object], object], str]] = {
    "task": (lambda store, value: store.task(value), "task_id"),
    "reply": (lambda store, value: store.reply(value), "task_id"),
    "cancel": (lambda store, value: store.cancel(value), "task_id"),
    "requeues": (lambda store, value: store.requeues(value), "reply_id"),
    "requeue_reply": (lambda store, value: store.requeue_reply(value, operator="op",
                                                               reason="why"), "reply_id"),
    "wait": (lambda store, value: store.wait(value, "step"), "flow"),
}


@pytest.mark.parametrize("call", LOOKUPS)
def test_an_identity_that_is_not_text_is_refused_naming_it(store, call):
    lookup, name = LOOKUPS[call]
    with pytest.raises(postroom.InvalidInput, match="must be a string, got int") as refused:
        lookup(store, 5)
    assert refused.value.field == name


@pytest.mark.parametrize("call", ["task", "requeues"])
def test_an_identity_longer_than_any_stored_one_is_refused_naming_it(store, call):
    lookup, name = LOOKUPS[call]
    with pytest.raises(postroom.InvalidInput, match="the limit is") as refused:
        lookup(store, "x" * 10_000)
    assert refused.value.field == name


@pytest.mark.parametrize("lookup", ["receipt", "effect_count"])
def test_a_receiver_refuses_a_reply_id_that_is_not_text(receiver, lookup):
    with pytest.raises(postroom.InvalidInput) as refused:
        getattr(receiver, lookup)(5)
    assert refused.value.field == "reply_id"


@pytest.mark.parametrize("retryable", ["no", 0, None])
def test_fail_refuses_a_retryable_that_is_not_a_bool(store, auth, retryable):
    store.receive(auth, envelope())
    claim = store.claim("w")
    before = stored(store)
    with pytest.raises(postroom.InvalidInput, match="must be a bool") as refused:
        store.fail(claim, "broken", retryable=retryable)
    assert refused.value.field == "retryable"
    assert stored(store) == before


# -- batches take any iterable ----------------------------------------------------------------


def test_receive_batch_takes_a_generator_of_envelopes(store, auth):
    acks = store.receive_batch(auth, (envelope(f"m-{i}") for i in range(3)))
    assert [ack.duplicate for ack in acks] == [False] * 3
    assert store.info()["tasks"] == {"pending": 3}


def test_receive_batch_of_a_generator_keeps_its_committed_prefix(store, auth):
    items = (envelope("ok") if i == 0 else envelope("bad", max_attempts=0) for i in range(2))
    with pytest.raises(postroom.BatchFailed) as failed:
        store.receive_batch(auth, items)
    assert (failed.value.index, len(failed.value.acks)) == (1, 1)
    assert store.info()["tasks"] == {"pending": 1}


def test_receive_atomic_takes_a_generator_of_envelopes(store, auth):
    acks = store.receive_atomic(auth, (envelope(f"m-{i}") for i in range(3)),
                                positions=(None for _ in range(3)))
    assert len(acks) == 3


@pytest.mark.parametrize("call", ["receive_batch", "receive_atomic"])
def test_an_endless_iterable_of_envelopes_is_refused_before_anything_is_stored(store, auth,
                                                                              call):
    before = stored(store)
    with pytest.raises(postroom.InvalidInput, match=f"more than {MAX_BATCH}") as refused:
        getattr(store, call)(auth, itertools.repeat(envelope()))
    assert refused.value.field == "envelopes"
    assert stored(store) == before


@pytest.mark.parametrize("call", ["receive_batch", "receive_atomic"])
@pytest.mark.parametrize("value", [envelope(), "m-1", {"message_id": "m-1"}, 7])
def test_a_batch_of_envelopes_must_be_an_iterable_of_them(store, auth, call, value):
    with pytest.raises(postroom.InvalidInput, match="iterable") as refused:
        getattr(store, call)(auth, value)
    assert refused.value.field == "envelopes"


def test_finish_batch_takes_a_generator_of_pairs(store, auth):
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    claims = store.claim_batch("w", 2)
    store.finish_batch((claim, None) for claim in claims)
    assert store.info()["tasks"] == {"done": 2}


# -- the receiver -----------------------------------------------------------------------------

#: Bodies a receiver must refuse as not a result document, though ``json.loads`` takes them.
NOT_JSON_DOCUMENTS = {
    "nan": '{"kind":"result","result":NaN,"status":"done","task_id":"t"}',
    "infinity": '{"kind":"result","result":[-Infinity],"status":"done","task_id":"t"}',
    "overflowing-float": '{"kind":"result","result":1e400,"status":"done","task_id":"t"}',
    "lone-surrogate": '{"kind":"result","result":"\\ud800","status":"done","task_id":"t"}',
    "deep": '{"kind":"result","result":' + "[" * 100_000 + "]" * 100_000
            + ',"status":"done","task_id":"t"}',
}


@pytest.mark.parametrize("body", NOT_JSON_DOCUMENTS.values(), ids=NOT_JSON_DOCUMENTS)
def test_a_receiver_refuses_a_body_that_is_not_json_naming_body(receiver, body):
    with pytest.raises(postroom.InvalidInput) as refused:
        receiver.accept("reply:t", body)
    assert refused.value.field == "body"
    assert receiver.receipt("reply:t") is None


@pytest.mark.parametrize("body", NOT_JSON_DOCUMENTS.values(), ids=NOT_JSON_DOCUMENTS)
def test_a_receiver_batch_answers_a_body_that_is_not_json_as_permanent(receiver, body):
    good = '{"kind":"result","result":1,"status":"done","task_id":"u"}'
    outcomes = receiver.accept_batch([Outgoing(reply_id="reply:t", body=body, fingerprint=""),
                                      Outgoing(reply_id="reply:u", body=good, fingerprint="")])
    assert [outcome.kind for outcome in outcomes] == ["permanent", "delivered"]
    assert receiver.effects_total() == 1


@pytest.mark.parametrize(("reply_id", "body"), [(5, "{}"), ("reply:t", None), (None, None)])
def test_a_receiver_batch_answers_a_reply_of_the_wrong_type_as_permanent(receiver, reply_id,
                                                                         body):
    outcomes = receiver.accept_batch([Outgoing(reply_id=reply_id, body=body, fingerprint="")])
    assert [outcome.kind for outcome in outcomes] == ["permanent"]
    assert receiver.effects_total() == 0
