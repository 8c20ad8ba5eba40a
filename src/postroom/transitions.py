"""The state machines of tasks, replies and waits, as pure decisions.

Each function takes what is known about a record and an event, and returns a frozen decision
value; no I/O, no clock. The store applies a decision with one guarded statement
(``task_apply`` / ``reply_apply`` / ``wait_end``) that only matches the state (and fence) it
was decided on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from postroom.models import (
    AttemptOutcome,
    ContinuationKind,
    ExpireResult,
    OpenResult,
    OutcomeKind,
    ReplyState,
    SignalResult,
    TaskState,
    WaitState,
)
from postroom.validation import canonical_json, canonical_text, fingerprint

__all__ = [
    "FLOOR_MARGIN",
    "SIGNALED",
    "TIMED_OUT",
    "ExpireDecision",
    "ReplyContent",
    "ReplyDecision",
    "Retention",
    "Route",
    "SignalDecision",
    "TaskDecision",
    "WaitEnd",
    "altered_claim",
    "cancel",
    "chain_budget_spent",
    "change_retention",
    "deadline_passed",
    "delivery",
    "expire_wait",
    "fail",
    "finish",
    "initial_state",
    "lease_expired",
    "legacy_reply_body",
    "open_wait",
    "receipt_body",
    "release",
    "repeat_signal",
    "reply_content",
    "reply_id_for",
    "reply_lease_expired",
    "reply_release",
    "signal_wait",
]


@dataclass(frozen=True, slots=True)
class ReplyContent:
    """The fixed identity and body of a terminal task's reply."""

    reply_id: str
    status: TaskState
    body: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Route:
    """Where a task's reply goes and what it answers, taken from the task's own row: the
    requester (the principal that sent the chain's root), the task's correlation id and its
    parent."""

    requester: str | None
    correlation_id: str | None = None
    parent_task_id: str | None = None


@dataclass(frozen=True, slots=True)
class TaskDecision:
    """Move a task to ``to_state``.

    A terminal decision carries ``reply_result``, the canonical JSON its reply answers with
    (the result, or an error document); ``ended`` says how the running attempt ended, when
    one was running; ``gives_back`` whether that attempt is given back (a release).
    """

    to_state: TaskState
    available_at: float
    result: str | None = None  # canonical JSON
    last_error: str | None = None
    reply_result: str | None = None
    ended: AttemptOutcome | None = None
    gives_back: bool = False


@dataclass(frozen=True, slots=True)
class ReplyDecision:
    """Move a reply to ``to_state``; ``ended`` says how the delivery attempt ended."""

    to_state: ReplyState
    available_at: float
    ended: AttemptOutcome
    last_error: str | None = None
    sent_at: float | None = None


@dataclass(frozen=True, slots=True)
class Retention:
    """The retention period a store publishes (``value``), and after a shortening the longer
    period it still honours (``floor_value``) until ``floor_until``, for what it received
    under that promise."""

    value: float
    floor_value: float | None = None
    floor_until: float | None = None

    def floor(self, now: float) -> tuple[float, float] | None:
        """The longer period still honoured at ``now`` and its end, or ``None``."""
        if self.floor_value is None or self.floor_until is None or now >= self.floor_until:
            return None
        return self.floor_value, self.floor_until

    def at(self, now: float) -> float:
        """The period pruning keeps identities for at ``now``."""
        running = self.floor(now)
        return self.value if running is None else max(self.value, running[0])


#: Seconds a floor outlasts ``now + period``: a message stored while the change was being
#: decided may carry a time a little later than the change's (keeping longer is allowed).
FLOOR_MARGIN = 60.0


def change_retention(current: Retention | None, value: float, now: float, *,
                     margin: float = FLOOR_MARGIN) -> Retention:
    """Publish ``value`` at ``now`` without breaking a promise already made.

    An identity received at ``r`` was promised the period then in force, so it is kept until
    ``r + period``. A shorter ``value`` therefore keeps the current period as a floor until
    ``now + current period + margin``; a floor still running is merged into it (the longer
    period, the later end), which keeps some identities longer than promised, never shorter.
    A floor that ``value`` reaches adds nothing and is dropped.
    """
    if current is None:
        return Retention(value)
    running = current.floor(now)
    floor_value, floor_until = running if running is not None else (None, None)
    if value < current.value:
        floor_value = max(current.value, floor_value or 0.0)
        floor_until = max(now + current.value + margin, floor_until or now)
    if floor_value is None or floor_value <= value:
        return Retention(value)
    return Retention(value, floor_value, floor_until)


def altered_claim(claim: object, issued: Mapping[str, object], record: str) -> str | None:
    """Why a claim was not issued as it is: the fields it carries whose values differ from
    ``issued`` (its ``record``'s, by field name), or ``None`` when none does."""
    altered = ", ".join(name for name, value in issued.items() if getattr(claim, name) != value)
    if not altered:
        return None
    return f"the claim's {altered} differ from the {record}'s: it was not issued as it is"


def reply_id_for(task_id: str) -> str:
    """A task's reply id: stable, so a redelivery is recognisably the same reply."""
    return "reply:" + task_id


def reply_content(task_id: str, status: TaskState, result_json: str,
                  route: Route) -> ReplyContent:
    """The reply body as canonical JSON: ``{"correlation_id", "kind": "result",
    "parent_task_id", "requester", "result", "status", "task_id"}``.

    ``result_json`` is already canonical, so the body is assembled in key order rather than
    parsed and dumped again; a unit test pins that this equals ``canonical_json``.
    """
    body = ('{"correlation_id":' + canonical_text(route.correlation_id)
            + ',"kind":"result","parent_task_id":' + canonical_text(route.parent_task_id)
            + ',"requester":' + canonical_text(route.requester)
            + ',"result":' + result_json + ',"status":' + canonical_text(status.value)
            + ',"task_id":' + canonical_text(task_id) + "}")
    return ReplyContent(reply_id=reply_id_for(task_id), status=status, body=body,
                        fingerprint=fingerprint(body))


def legacy_reply_body(task_id: str, status: TaskState, result_json: str) -> str:
    """The body of a reply written before replies carried their route (schema 4 and older):
    ``{"kind": "result", "result", "status", "task_id"}``. Such replies keep their bodies (a
    rewritten body would turn a redelivery into a collision at the receiver)."""
    return ('{"kind":"result","result":' + result_json + ',"status":'
            + canonical_json(status.value) + ',"task_id":' + canonical_json(task_id) + "}")


def _terminal(state: TaskState, now: float, *, result: str | None = None,
              error: str | None = None, ended: AttemptOutcome | None = None) -> TaskDecision:
    result_json = result if result is not None else canonical_json({"error": error})
    return TaskDecision(to_state=state, available_at=now, result=result, last_error=error,
                        reply_result=result_json, ended=ended)


def chain_budget_spent(*, tasks: int, max_tasks: int, cost: int,
                       max_cost: int | None) -> str | None:
    """Why a chain admits no more work (naming the budget), or ``None`` while it may."""
    if tasks >= max_tasks:
        return f"the chain's task budget is spent: {tasks} of {max_tasks} tasks admitted"
    if max_cost is not None and cost >= max_cost:
        return f"the chain's cost budget is spent: {cost} of {max_cost} units charged"
    return None


def initial_state(*, deadline: float, hops: int, max_hops: int, now: float,
                  not_before: float | None = None, budget_spent: str | None = None,
                  chain_cancelled: str | None = None) -> TaskDecision:
    """A newly received task: ``pending`` (claimable from ``not_before`` if it is later than
    now), or terminal if it can never run: its chain was cancelled (``chain_cancelled`` says
    why), its deadline passed, its hops reached its chain's limit, or its chain's budget is
    spent (``budget_spent`` says which)."""
    if chain_cancelled is not None:
        return _terminal(TaskState.CANCELLED, now,
                         error=f"its chain was cancelled: {chain_cancelled}")
    if deadline <= now:
        return _terminal(TaskState.EXPIRED, now,
                         error=f"deadline {deadline} had passed when it arrived at {now}")
    if hops >= max_hops:
        return _terminal(TaskState.HOP_LIMIT, now,
                         error=f"hops {hops} reached the limit of {max_hops}")
    if budget_spent is not None:
        return _terminal(TaskState.BUDGET_EXHAUSTED, now, error=budget_spent)
    available = now if not_before is None else max(now, not_before)
    return TaskDecision(to_state=TaskState.PENDING, available_at=available)


def lease_expired(*, attempts: int, max_attempts: int, now: float) -> TaskDecision:
    """A running task's owner stopped renewing: run it again, or fail if it had its last try."""
    if attempts >= max_attempts:
        return _terminal(TaskState.FAILED, now, ended=AttemptOutcome.LEASE_EXPIRED,
                         error=f"attempts exhausted: the lease expired on attempt "
                               f"{attempts} of {max_attempts}")
    return TaskDecision(to_state=TaskState.PENDING, available_at=now,
                        last_error=f"lease expired on attempt {attempts}",
                        ended=AttemptOutcome.LEASE_EXPIRED)


def deadline_passed(*, state: TaskState, deadline: float, now: float) -> TaskDecision:
    """The absolute deadline passed before the task (``pending`` or ``running``) finished."""
    return _terminal(TaskState.EXPIRED, now, error=f"deadline {deadline} passed (now {now})",
                     ended=AttemptOutcome.EXPIRED if state is TaskState.RUNNING else None)


def finish(*, result_json: str, now: float) -> TaskDecision:
    """The current owner finished the task."""
    return _terminal(TaskState.DONE, now, result=result_json, ended=AttemptOutcome.DONE)


def fail(*, attempt: int, max_attempts: int, retryable: bool, reason: str, now: float,
         delay: float) -> TaskDecision:
    """The current owner reports a failure: retry after ``delay``, or fail for good."""
    if not retryable:
        return _terminal(TaskState.FAILED, now, error=reason, ended=AttemptOutcome.FAILED)
    if attempt >= max_attempts:
        return _terminal(TaskState.FAILED, now, ended=AttemptOutcome.FAILED,
                         error=f"attempts exhausted ({attempt} of {max_attempts}): {reason}")
    return TaskDecision(to_state=TaskState.PENDING, available_at=now + delay,
                        last_error=reason, ended=AttemptOutcome.RETRY)


def release(*, now: float, delay: float) -> TaskDecision:
    """The current owner hands the task back unfinished (e.g. it is shutting down).

    Not a failure: the attempt is given back (``attempts - 1``; the fence never goes back),
    so however many times workers stop, the task keeps every one of its attempts. It is
    claimable again after ``delay``.
    """
    return TaskDecision(to_state=TaskState.PENDING, available_at=now + delay,
                        ended=AttemptOutcome.RELEASED, gives_back=True)


def cancel(*, state: TaskState, reason: str, now: float) -> TaskDecision | None:
    """Cancel a live task; a terminal one cannot be cancelled (``None``)."""
    if state.terminal:
        return None
    return _terminal(TaskState.CANCELLED, now, error=reason,
                     ended=AttemptOutcome.CANCELLED if state is TaskState.RUNNING else None)


def delivery(kind: OutcomeKind, *, detail: str, attempt: int, budget: int, now: float,
             delay: float) -> ReplyDecision:
    """Record what a delivery attempt learned."""
    ended = AttemptOutcome(kind.value)
    if kind is OutcomeKind.DELIVERED:
        return ReplyDecision(to_state=ReplyState.SENT, available_at=now, sent_at=now,
                             ended=ended)
    if kind is OutcomeKind.COLLISION:
        return ReplyDecision(to_state=ReplyState.DEAD, available_at=now, ended=ended,
                             last_error=f"collision: the receiver holds this reply_id with "
                                        f"different content: {detail}")
    if kind is OutcomeKind.PERMANENT:
        return ReplyDecision(to_state=ReplyState.DEAD, available_at=now, ended=ended,
                             last_error=f"permanent: {detail}")
    if kind is OutcomeKind.GONE:
        return ReplyDecision(to_state=ReplyState.DEAD, available_at=now, ended=ended,
                             last_error=f"gone: the endpoint answered 410 Gone and is "
                                        f"disabled: {detail}")
    if attempt >= budget:
        return ReplyDecision(to_state=ReplyState.DEAD, available_at=now, ended=ended,
                             last_error=f"delivery budget spent ({attempt} of {budget}): "
                                        f"{detail}")
    return ReplyDecision(to_state=ReplyState.PENDING, available_at=now + delay, ended=ended,
                         last_error=f"transient: {detail}")


def reply_release(*, now: float, delay: float) -> ReplyDecision:
    """A publisher hands a claimed reply back unsent (it is stopping; the endpoint is busy,
    gone or missing): claimable again after ``delay``, with its attempt given back, since
    nothing was delivered, so however often that happens the reply keeps its whole budget."""
    return ReplyDecision(to_state=ReplyState.PENDING, available_at=now + delay,
                         ended=AttemptOutcome.RELEASED)


def reply_lease_expired(*, attempt: int, budget: int, now: float) -> ReplyDecision:
    """A publisher vanished mid-delivery: the outcome is unknown, so deliver again or give up."""
    ended = AttemptOutcome.LEASE_EXPIRED
    if attempt >= budget:
        return ReplyDecision(to_state=ReplyState.DEAD, available_at=now, ended=ended,
                             last_error=f"outcome unknown: the publisher's lease expired on "
                                        f"attempt {attempt} of {budget}; reconcile with the "
                                        f"receiver by reply_id before requeueing")
    return ReplyDecision(to_state=ReplyState.PENDING, available_at=now, ended=ended,
                         last_error=f"outcome unknown: the publisher's lease expired on "
                                    f"attempt {attempt}")


# -- waits (SPEC §5) ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitEnd:
    """End a waiting generation: its terminal state and the continuation written with it."""

    to_state: WaitState
    continuation: ContinuationKind


SIGNALED = WaitEnd(WaitState.SIGNALED, ContinuationKind.SIGNAL)
TIMED_OUT = WaitEnd(WaitState.TIMED_OUT, ContinuationKind.TIMEOUT)


@dataclass(frozen=True, slots=True)
class SignalDecision:
    """The receipt a new signal gets, and how it ends the wait (if it does)."""

    result: SignalResult
    end: WaitEnd | None = None


@dataclass(frozen=True, slots=True)
class ExpireDecision:
    """What an expiry check reports, and whether it times the wait out."""

    result: ExpireResult
    end: WaitEnd | None = None


def open_wait(*, current: int, expected: int, state: WaitState | None,
              consumed: bool) -> OpenResult:
    """May the slot open generation ``expected + 1``?

    ``current`` is the slot's generation (0 before the first wait); ``state`` and
    ``consumed`` describe that generation and its continuation. The previous generation must
    have ended *and* had its continuation consumed, so an ending and the work it leads to are
    never confused with a new question.
    """
    if current != expected:
        return OpenResult.STALE
    if current == 0:
        return OpenResult.OPENED
    if state is WaitState.WAITING:
        return OpenResult.BUSY
    if not consumed:
        return OpenResult.PENDING_CONTINUATION
    return OpenResult.OPENED


def signal_wait(*, current: int, generation: int, state: WaitState | None,
                deadline: float | None, now: float) -> SignalDecision:
    """The outcome of a new (never seen) signal to ``generation`` at time ``now``.

    The deadline is strict: a signal is accepted only while ``now < deadline``. A waiting wait
    whose deadline passed is timed out by the signal itself, so a late sweeper can never
    extend a deadline.
    """
    if generation > current:
        return SignalDecision(SignalResult.UNKNOWN_WAIT)
    if generation < current:
        return SignalDecision(SignalResult.STALE_GENERATION)
    if state is None:  # the slot's current generation has no row: only a damaged database
        return SignalDecision(SignalResult.UNKNOWN_WAIT)
    if state is not WaitState.WAITING:
        return SignalDecision(SignalResult.CLOSED)
    assert deadline is not None
    if now >= deadline:
        return SignalDecision(SignalResult.TOO_LATE, TIMED_OUT)
    return SignalDecision(SignalResult.ACCEPTED, SIGNALED)


def expire_wait(*, state: WaitState | None, deadline: float | None,
                now: float) -> ExpireDecision:
    """Time a wait out if it is still waiting and its deadline has come (``now >= deadline``)."""
    if state is None:
        return ExpireDecision(ExpireResult.UNKNOWN_WAIT)
    if state is not WaitState.WAITING:
        return ExpireDecision(ExpireResult.CLOSED)
    assert deadline is not None
    if now < deadline:
        return ExpireDecision(ExpireResult.NOT_DUE)
    return ExpireDecision(ExpireResult.TIMED_OUT, TIMED_OUT)


def receipt_body(flow: str, step: str, generation: int, value_json: str) -> str:
    """The canonical JSON ``{"flow", "generation", "step", "value"}`` an event id is bound to.

    ``value_json`` is already canonical, so the body is assembled in key order; a unit test
    pins that this equals ``canonical_json``.
    """
    return ('{"flow":' + canonical_json(flow) + ',"generation":' + str(int(generation))
            + ',"step":' + canonical_json(step) + ',"value":' + value_json + "}")


def repeat_signal(stored_body: str, body: str) -> SignalResult:
    """An event id seen before: the same body is a replay, any other body a conflict.

    Neither the current state of the wait nor the time matters: a replay returns the
    original receipt even after the wait ended or its deadline passed.
    """
    return SignalResult.REPLAY if stored_body == body else SignalResult.CONFLICT
