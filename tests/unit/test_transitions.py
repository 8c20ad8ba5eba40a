"""The state machines as pure decisions: no database, no clock."""

import random

import pytest

from postroom import ExponentialBackoff, FixedBackoff, OutcomeKind, ReplyState, TaskState
from postroom import transitions as t
from postroom.validation import canonical_json, fingerprint


def test_a_reply_body_is_the_canonical_json_of_its_document():
    content = t.reply_content("tid", TaskState.DONE, canonical_json({"b": 1, "a": "é"}))
    document = {"kind": "result", "task_id": "tid", "status": "done",
                "result": {"a": "é", "b": 1}}
    assert content.body == canonical_json(document)
    assert content.fingerprint == fingerprint(content.body)
    assert content.reply_id == "reply:tid"


@pytest.mark.parametrize(("deadline", "hops", "expected"), [
    (101.0, 0, TaskState.PENDING),
    (100.0, 0, TaskState.EXPIRED),
    (101.0, 4, TaskState.HOP_LIMIT),
    (101.0, 3, TaskState.PENDING),
])
def test_initial_state(deadline, hops, expected):
    decision = t.initial_state("tid", deadline=deadline, hops=hops, max_hops=4, now=100.0)
    assert decision.to_state == expected
    assert (decision.reply is not None) == expected.terminal


@pytest.mark.parametrize(("attempts", "expected"), [(1, TaskState.PENDING),
                                                     (2, TaskState.PENDING),
                                                     (3, TaskState.FAILED)])
def test_lease_expiry(attempts, expected):
    decision = t.lease_expired("tid", attempts=attempts, max_attempts=3, now=5.0)
    assert decision.to_state == expected


def test_a_retryable_failure_waits_for_the_backoff():
    decision = t.fail("tid", attempt=1, max_attempts=3, retryable=True, reason="x", now=10.0,
                      delay=4.0)
    assert (decision.to_state, decision.available_at, decision.reply) == (
        TaskState.PENDING, 14.0, None)


@pytest.mark.parametrize(("attempt", "retryable"), [(3, True), (1, False)])
def test_a_final_failure_is_terminal_with_a_reply(attempt, retryable):
    decision = t.fail("tid", attempt=attempt, max_attempts=3, retryable=retryable,
                      reason="x", now=10.0, delay=4.0)
    assert decision.to_state == TaskState.FAILED and decision.reply is not None


@pytest.mark.parametrize("state", list(TaskState))
def test_only_live_tasks_can_be_cancelled(state):
    decision = t.cancel("tid", state=state, reason="r", now=1.0)
    assert (decision is None) == state.terminal


@pytest.mark.parametrize(("kind", "attempt", "expected"), [
    (OutcomeKind.DELIVERED, 1, ReplyState.SENT),
    (OutcomeKind.TRANSIENT, 1, ReplyState.PENDING),
    (OutcomeKind.TRANSIENT, 3, ReplyState.DEAD),
    (OutcomeKind.PERMANENT, 1, ReplyState.DEAD),
    (OutcomeKind.COLLISION, 1, ReplyState.DEAD),
])
def test_delivery_outcomes(kind, attempt, expected):
    decision = t.delivery(kind, detail="d", attempt=attempt, budget=3, now=1.0, delay=2.0)
    assert decision.to_state == expected
    assert (decision.last_error is None) == (expected == ReplyState.SENT)


def test_exponential_backoff_is_capped_and_jittered_downwards():
    policy = ExponentialBackoff(base=1.0, cap=60.0, jitter=0.5)
    rng = random.Random(7)
    for attempt in range(1, 40):
        delay = policy.delay(attempt, rng)
        ceiling = min(60.0, 2.0 ** (attempt - 1))
        assert ceiling * 0.5 <= delay <= ceiling


def test_fixed_backoff_is_fixed():
    assert FixedBackoff(seconds=3).delay(9, random.Random()) == 3.0
