"""The wait rules of SPEC §5 as pure decisions: no database, no clock."""

import pytest

from postroom import (
    ContinuationKind,
    ExpireResult,
    OpenResult,
    SignalResult,
    WaitState,
)
from postroom import transitions as t
from postroom.validation import canonical_json

WAITING, SIGNALED, TIMED_OUT = WaitState.WAITING, WaitState.SIGNALED, WaitState.TIMED_OUT


@pytest.mark.parametrize(("current", "expected", "state", "consumed", "result"), [
    (0, 0, None, False, OpenResult.OPENED),  # the first generation
    (1, 0, WAITING, False, OpenResult.STALE),  # someone else opened it
    (0, 1, None, False, OpenResult.STALE),  # a caller ahead of the slot
    (2, 1, SIGNALED, True, OpenResult.STALE),  # stale wins over every other reason
    (1, 1, WAITING, False, OpenResult.BUSY),
    (1, 1, SIGNALED, False, OpenResult.PENDING_CONTINUATION),
    (1, 1, TIMED_OUT, False, OpenResult.PENDING_CONTINUATION),
    (1, 1, SIGNALED, True, OpenResult.OPENED),
    (1, 1, TIMED_OUT, True, OpenResult.OPENED),
])
def test_open_wait(current, expected, state, consumed, result):
    assert t.open_wait(current=current, expected=expected, state=state,
                       consumed=consumed) is result


@pytest.mark.parametrize(("current", "generation", "state", "now", "expected"), [
    (1, 1, WAITING, 9.0, (SignalResult.ACCEPTED, t.SIGNALED)),
    (1, 1, WAITING, 10.0, (SignalResult.TOO_LATE, t.TIMED_OUT)),  # exactly at the deadline
    (1, 1, WAITING, 11.0, (SignalResult.TOO_LATE, t.TIMED_OUT)),
    (1, 1, SIGNALED, 9.0, (SignalResult.CLOSED, None)),
    (1, 1, TIMED_OUT, 9.0, (SignalResult.CLOSED, None)),
    (2, 1, SIGNALED, 9.0, (SignalResult.STALE_GENERATION, None)),
    (0, 1, None, 9.0, (SignalResult.UNKNOWN_WAIT, None)),  # early: no wait yet
    (1, 2, None, 9.0, (SignalResult.UNKNOWN_WAIT, None)),  # a generation not opened yet
])
def test_a_new_signal(current, generation, state, now, expected):
    decision = t.signal_wait(current=current, generation=generation, state=state,
                             deadline=10.0, now=now)
    assert (decision.result, decision.end) == expected


def test_an_accepted_signal_writes_a_signal_continuation_and_a_late_one_a_timeout():
    assert (t.SIGNALED.to_state, t.SIGNALED.continuation) == (SIGNALED, ContinuationKind.SIGNAL)
    assert (t.TIMED_OUT.to_state, t.TIMED_OUT.continuation) == (TIMED_OUT,
                                                                ContinuationKind.TIMEOUT)


@pytest.mark.parametrize(("state", "now", "result", "end"), [
    (WAITING, 9.0, ExpireResult.NOT_DUE, None),
    (WAITING, 10.0, ExpireResult.TIMED_OUT, t.TIMED_OUT),
    (SIGNALED, 11.0, ExpireResult.CLOSED, None),
    (TIMED_OUT, 11.0, ExpireResult.CLOSED, None),
    (None, 11.0, ExpireResult.UNKNOWN_WAIT, None),
])
def test_expire(state, now, result, end):
    decision = t.expire_wait(state=state, deadline=10.0, now=now)
    assert (decision.result, decision.end) == (result, end)


def test_a_receipt_body_is_the_canonical_json_of_the_address_and_value():
    value = canonical_json({"b": [1, 2.5], "a": "é"})
    body = t.receipt_body("flow-ü", "step", 7, value)
    assert body == canonical_json({"flow": "flow-ü", "step": "step", "generation": 7,
                                   "value": {"a": "é", "b": [1, 2.5]}})


@pytest.mark.parametrize(("other", "result"), [
    (("f", "s", 1, '"yes"'), SignalResult.REPLAY),
    (("f", "s", 1, '"no"'), SignalResult.CONFLICT),
    (("f", "s", 2, '"yes"'), SignalResult.CONFLICT),
    (("f", "t", 1, '"yes"'), SignalResult.CONFLICT),
    (("g", "s", 1, '"yes"'), SignalResult.CONFLICT),
])
def test_a_repeated_event_id_is_a_replay_only_with_the_same_body(other, result):
    assert t.repeat_signal(t.receipt_body("f", "s", 1, '"yes"'),
                           t.receipt_body(*other)) is result
