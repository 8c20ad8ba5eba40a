"""SPEC §10: logs under ``postroom`` carry task_id, reply_id, owner, fence, attempt, state and
the last error as structured fields, never payloads, results or tokens.

Transitions are DEBUG; what an operator follows is INFO (a lease recovered, a deadline
passed) or WARNING (attempts exhausted, a reply dead). A record is emitted only once its
transaction committed.
"""

from __future__ import annotations

import logging

import pytest

import postroom
from postroom import Outcome
from tests.conformance.test_outbox import Scripted
from tests.support import envelope

SECRET = "s3cr3t-payload-value"
RESULT = "r3sult-value"
TOKEN = "t0ken-value"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="postroom")
    return caplog


def records(logs: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    """The records of event ``message`` (a record's text is the message, then its fields)."""
    return [record for record in logs.records
            if record.name.startswith("postroom") and record.getMessage().startswith(message)]


def only(logs: pytest.LogCaptureFixture, message: str) -> logging.LogRecord:
    found = records(logs, message)
    assert len(found) == 1, [record.getMessage() for record in logs.records]
    return found[0]


def fields(record: logging.LogRecord, *names: str) -> dict[str, object]:
    return {name: getattr(record, name, None) for name in names}


def test_a_claim_is_logged_at_debug_with_task_id_owner_fence_attempt_and_state(
        store, auth, logs):
    task_id = store.receive(auth, envelope()).task_id
    claim = store.claim("w1")
    record = only(logs, "task claimed")
    assert record.levelno == logging.DEBUG and record.name == "postroom.tasks"
    assert fields(record, "task_id", "owner", "fence", "attempt", "state") == {
        "task_id": task_id, "owner": "w1", "fence": claim.fence, "attempt": 1,
        "state": "running"}


def test_a_record_repeats_its_fields_in_its_message(store, auth, logs):
    task_id = store.receive(auth, envelope()).task_id
    store.claim("w1")
    assert f"task_id={task_id} owner=w1" in only(logs, "task claimed").getMessage()


def test_a_finish_is_logged_at_debug_with_the_claims_fields(store, auth, logs):
    task_id = store.receive(auth, envelope()).task_id
    claim = store.claim("w1")
    store.finish(claim, {"answer": 42})
    record = only(logs, "task finished")
    assert record.levelno == logging.DEBUG
    assert fields(record, "task_id", "owner", "fence", "state") == {
        "task_id": task_id, "owner": "w1", "fence": claim.fence, "state": "done"}


def test_a_retryable_failure_is_logged_at_debug_with_its_reason_as_the_last_error(
        store, auth, logs):
    store.receive(auth, envelope())
    store.fail(store.claim("w1"), "upstream timed out")
    record = only(logs, "task failed, to be retried")
    assert record.levelno == logging.DEBUG
    assert fields(record, "state", "attempt", "last_error") == {
        "state": "pending", "attempt": 1, "last_error": "upstream timed out"}


def test_a_failure_on_the_last_attempt_is_logged_at_warning_as_attempts_exhausted(
        store, auth, logs):
    task_id = store.receive(auth, envelope(max_attempts=1)).task_id
    store.fail(store.claim("w1"), "upstream timed out")
    record = only(logs, "attempts exhausted")
    assert record.levelno == logging.WARNING
    assert fields(record, "task_id", "state") == {"task_id": task_id, "state": "failed"}
    assert "upstream timed out" in str(record.last_error)  # type: ignore[attr-defined]


def test_a_recovered_lease_is_logged_at_info_naming_the_owner_that_lost_it(
        store, auth, clock, logs):
    task_id = store.receive(auth, envelope()).task_id
    first = store.claim("w1")
    clock.advance(store.settings.lease)
    store.sweep()
    record = only(logs, "lease recovered")
    assert record.levelno == logging.INFO
    assert fields(record, "task_id", "owner", "fence", "attempt", "state") == {
        "task_id": task_id, "owner": "w1", "fence": first.fence, "attempt": 1,
        "state": "pending"}


def test_a_lease_expiring_on_the_last_attempt_is_logged_at_warning(store, auth, clock, logs):
    store.receive(auth, envelope(max_attempts=1))
    store.claim("w1")
    clock.advance(store.settings.lease)
    store.claim("w2")
    record = only(logs, "attempts exhausted")
    assert record.levelno == logging.WARNING and record.owner == "w1"  # type: ignore[attr-defined]


def test_a_passed_deadline_is_logged_at_info(store, auth, clock, logs):
    task_id = store.receive(auth, envelope(deadline=store.clock.now() + 10)).task_id
    clock.advance(10)
    store.sweep()
    record = only(logs, "deadline passed")
    assert record.levelno == logging.INFO
    assert fields(record, "task_id", "state") == {"task_id": task_id, "state": "expired"}


def test_a_cancel_is_logged_at_debug(store, auth, logs):
    task_id = store.receive(auth, envelope()).task_id
    store.cancel(task_id, reason="no longer needed")
    record = only(logs, "task cancelled")
    assert record.levelno == logging.DEBUG
    assert fields(record, "task_id", "state", "last_error") == {
        "task_id": task_id, "state": "cancelled", "last_error": "no longer needed"}


def test_a_recorded_delivery_is_logged_at_debug_with_reply_id_owner_fence_and_state(
        store, auth, transport, logs):
    task_id = store.receive(auth, envelope()).task_id
    store.finish(store.claim("w"), None)
    store.dispatch(transport, owner="d1")
    record = only(logs, "delivery recorded")
    assert record.levelno == logging.DEBUG and record.name == "postroom.outbox"
    assert fields(record, "reply_id", "task_id", "owner", "attempt", "state") == {
        "reply_id": f"reply:{task_id}", "task_id": task_id, "owner": "d1", "attempt": 1,
        "state": "sent"}


def test_a_dead_reply_is_logged_at_warning_with_its_last_error(store, auth, transport, logs):
    task_id = store.receive(auth, envelope()).task_id
    store.finish(store.claim("w"), None)
    store.dispatch(Scripted(transport, Outcome.permanent("HTTP 404")))
    record = only(logs, "reply dead")
    assert record.levelno == logging.WARNING
    assert fields(record, "reply_id", "state", "last_error") == {
        "reply_id": f"reply:{task_id}", "state": "dead", "last_error": "permanent: HTTP 404"}


def test_a_rolled_back_transaction_logs_nothing(store, auth, logs):
    store.receive(auth, envelope("taken", payload={"n": 1}))
    logs.clear()
    with pytest.raises(postroom.PayloadCollision):
        store.receive_atomic(auth, [envelope("fresh"), envelope("taken", payload={"n": 2})])
    assert records(logs, "task received") == []


def test_no_record_carries_a_payload_a_result_or_a_token(
        store, auth, transport, clock, logs):
    secret = {"text": SECRET, "token": TOKEN}
    store.receive(auth, envelope("a", payload=secret))
    store.receive(auth, envelope("b", payload=secret, max_attempts=1))
    store.receive(auth, envelope("c", payload=secret))
    first = store.claim("w1")
    store.finish(first, {"text": RESULT}, follow_ups=[
        postroom.FollowUp(message_id="child", payload=secret)])
    store.fail(store.claim("w1"), "retry me")
    store.claim("w2")
    clock.advance(store.settings.lease)
    store.sweep()
    store.cancel(store.receive(auth, envelope("d", payload=secret)).task_id)
    store.dispatch(Scripted(transport, Outcome.transient("HTTP 503")), limit=10)
    clock.advance(60)
    store.dispatch(transport, limit=10)
    assert len(logs.records) >= 10
    for record in logs.records:
        text = " ".join([record.getMessage(), *map(repr, vars(record).values())])
        for value in (SECRET, RESULT, TOKEN):
            assert value not in text, record.getMessage()
