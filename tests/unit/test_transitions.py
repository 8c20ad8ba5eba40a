"""The state machines as pure decisions: no database, no clock."""

import random

import pytest

from postroom import ExponentialBackoff, FixedBackoff, OutcomeKind, ReplyState, TaskState
from postroom import transitions as t
from postroom.models import AttemptOutcome
from postroom.validation import canonical_json, fingerprint


@pytest.mark.parametrize("route", [t.Route("planner", "c-1", "parent"), t.Route(None)])
def test_a_reply_body_is_the_canonical_json_of_its_document(route):
    content = t.reply_content("tid", TaskState.DONE, canonical_json({"b": 1, "a": "é"}), route)
    document = {"kind": "result", "task_id": "tid", "status": "done",
                "result": {"a": "é", "b": 1}, "requester": route.requester,
                "correlation_id": route.correlation_id, "parent_task_id": route.parent_task_id}
    assert content.body == canonical_json(document)
    assert content.fingerprint == fingerprint(content.body)
    assert content.reply_id == "reply:tid"


def test_a_legacy_reply_body_is_the_canonical_json_of_its_four_fields():
    body = t.legacy_reply_body("tid", TaskState.FAILED, canonical_json({"error": "x"}))
    assert body == canonical_json({"kind": "result", "task_id": "tid", "status": "failed",
                                   "result": {"error": "x"}})


@pytest.mark.parametrize(("deadline", "hops", "expected"), [
    (101.0, 0, TaskState.PENDING),
    (100.0, 0, TaskState.EXPIRED),
    (101.0, 4, TaskState.HOP_LIMIT),
    (101.0, 3, TaskState.PENDING),
])
def test_initial_state(deadline, hops, expected):
    decision = t.initial_state(deadline=deadline, hops=hops, max_hops=4, now=100.0)
    assert decision.to_state == expected
    assert (decision.reply_result is not None) == expected.terminal


@pytest.mark.parametrize(("attempts", "expected"), [(1, TaskState.PENDING),
                                                     (2, TaskState.PENDING),
                                                     (3, TaskState.FAILED)])
def test_lease_expiry(attempts, expected):
    decision = t.lease_expired(attempts=attempts, max_attempts=3, now=5.0)
    assert decision.to_state == expected
    assert decision.ended is AttemptOutcome.LEASE_EXPIRED


def test_a_retryable_failure_waits_for_the_backoff():
    decision = t.fail(attempt=1, max_attempts=3, retryable=True, reason="x", now=10.0,
                      delay=4.0)
    assert (decision.to_state, decision.available_at, decision.reply_result) == (
        TaskState.PENDING, 14.0, None)
    assert decision.ended is AttemptOutcome.RETRY


def test_a_release_gives_the_attempt_back_and_is_no_failure():
    decision = t.release(now=10.0, delay=0.0)
    assert (decision.to_state, decision.available_at, decision.last_error) == (
        TaskState.PENDING, 10.0, None)
    assert decision.gives_back and decision.ended is AttemptOutcome.RELEASED


@pytest.mark.parametrize(("attempt", "retryable"), [(3, True), (1, False)])
def test_a_final_failure_is_terminal_with_a_reply(attempt, retryable):
    decision = t.fail(attempt=attempt, max_attempts=3, retryable=retryable,
                      reason="x", now=10.0, delay=4.0)
    assert decision.to_state == TaskState.FAILED and decision.reply_result is not None


@pytest.mark.parametrize("state", list(TaskState))
def test_only_live_tasks_can_be_cancelled(state):
    decision = t.cancel(state=state, reason="r", now=1.0)
    assert (decision is None) == state.terminal
    if decision is not None:
        running = state is TaskState.RUNNING
        assert decision.ended is (AttemptOutcome.CANCELLED if running else None)


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


def test_a_first_retention_period_promises_nothing_earlier():
    assert t.change_retention(None, 60.0, now=1000.0) == t.Retention(60.0)


def test_a_shorter_retention_keeps_the_longer_one_for_what_came_before():
    shortened = t.change_retention(t.Retention(3600.0), 60.0, now=1000.0, margin=0.0)
    assert shortened == t.Retention(60.0, floor_value=3600.0, floor_until=4600.0)
    assert shortened.at(4599.0) == 3600.0  # received at 1000 at the latest: kept until 4600
    assert shortened.at(4600.0) == 60.0


def test_a_floor_outlasts_its_period_by_a_margin_for_messages_stored_meanwhile():
    shortened = t.change_retention(t.Retention(3600.0), 60.0, now=1000.0)
    assert shortened.floor_until == 4600.0 + t.FLOOR_MARGIN


def test_a_longer_retention_promises_no_floor():
    assert t.change_retention(t.Retention(60.0), 3600.0, now=1000.0) == t.Retention(3600.0)


def test_a_running_floor_merges_into_the_next_one_longer_and_later():
    first = t.change_retention(t.Retention(3600.0), 600.0, now=1000.0,
                               margin=0.0)  # 3600 until 4600
    second = t.change_retention(first, 60.0, now=2000.0, margin=0.0)  # 600 until 2600
    assert second == t.Retention(60.0, floor_value=3600.0, floor_until=4600.0)
    late = t.change_retention(t.change_retention(t.Retention(100.0), 50.0, now=0.0, margin=0.0),
                              10.0, now=90.0, margin=0.0)  # 100 until 100, and 50 until 140
    assert late == t.Retention(10.0, floor_value=100.0, floor_until=140.0)


def test_a_floor_the_new_period_reaches_or_that_ran_out_is_dropped():
    floored = t.Retention(60.0, floor_value=3600.0, floor_until=4600.0)
    assert t.change_retention(floored, 7200.0, now=2000.0) == t.Retention(7200.0)
    assert t.change_retention(floored, 30.0, now=5000.0, margin=0.0) == t.Retention(
        30.0, floor_value=60.0, floor_until=5060.0)
