"""Waits: a flow asks the outside world a question and waits for the answer with a deadline.

A wait is addressed by ``(flow, step, generation)``; the slot ``(flow, step)`` holds the
current generation. Whatever arrives -- early, late, duplicated or conflicting answers, a
sweeper that runs late, a restart in between -- exactly one outcome is decided per
generation (``signaled`` or ``timed_out``), written with one continuation, and a continuation
is consumed once, with its local effect, in one transaction (SPEC §5).

Who may do what:

- ``open_wait``, ``expire``, the sweep, ``resume`` and listing continuations are the flow's
  own operations, made by trusted code that holds the store (the worker running the task, a
  coordinator, the sweeper). Like ``claim`` and ``finish`` they take no principal.
- ``signal`` is the outside world answering. It needs the authenticated principal
  (``AuthContext``), which must be an allowed source when the store restricts sources. Event
  ids are scoped by that principal, so one tenant can never jam another's event ids. A wait
  opened with a ``responder`` adopts only that principal's answer: anyone else's signal to it
  is ``Unauthorized`` before any receipt is written. A wait without one takes an answer from
  any allowed principal that can address it (an address is not a secret), and a signal is
  never an approval (SPEC §6).

Time: every decision uses ``tx.now``, the store's decision time (never below the persisted
high-water mark). A call that writes nothing (a replay, a conflict, a stale registration)
does not move the high-water mark.

Fault points, besides each operation's ``before_commit`` / ``after_commit``, mark the seams
between statements of one transaction (``open_wait.after_wait_insert``,
``signal.after_receipt_insert``, ``<op>.after_terminal_update``, ``resume.after_consume``,
``resume.after_follow_up_insert``). A crash at any of them is equivalent to a crash before
the commit -- the whole transaction rolls back -- and the crash suite proves it rather than
assuming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from postroom import faults, transitions
from postroom.db.database import Tx, Write
from postroom.db.dialect import Row
from postroom.errors import InvalidInput, NotFound, PayloadCollision, StoreError, Unauthorized
from postroom.inbox import Parent, authorize, check_follow_up, store_message
from postroom.models import (
    AuthContext,
    Continuation,
    ContinuationKind,
    ExpireResult,
    FollowUp,
    OpenResult,
    ResumeResult,
    Resumption,
    SignalReceipt,
    Wait,
    WaitOpening,
    WaitState,
)
from postroom.settings import Settings
from postroom.transitions import WaitEnd
from postroom.validation import (
    FOLLOW_UP_NAMESPACES,
    TASK_ID_BYTES,
    WAIT_FOLLOW_UPS,
    CheckedEnvelope,
    canonical_json,
    check_int,
    check_json,
    check_number,
    check_text,
)

__all__ = [
    "EXPIRE",
    "EXPIRE_DUE",
    "MAX_GENERATION",
    "OPEN_WAIT",
    "OPERATIONS",
    "RESUME",
    "SIGNAL",
    "OpenRequest",
    "SignalRequest",
    "WaitAddress",
    "check_address",
    "check_effect",
    "check_open",
    "check_signal",
    "continuations",
    "expire",
    "expire_due",
    "follow_up_namespace",
    "get_wait",
    "open_wait",
    "resume",
    "signal",
]

OPEN_WAIT = Write("open_wait")
SIGNAL = Write("signal")
EXPIRE = Write("expire")
EXPIRE_DUE = Write("expire_due")
RESUME = Write("resume")
#: Every wait operation (each has its commit fault points, and some have seams).
OPERATIONS = (OPEN_WAIT, SIGNAL, EXPIRE, EXPIRE_DUE, RESUME)

_AFTER_WAIT_INSERT = faults.point(
    "open_wait.after_wait_insert",
    "open_wait: the slot moved and the new generation is inserted; not committed").name
_AFTER_RECEIPT_INSERT = faults.point(
    "signal.after_receipt_insert",
    "signal: the receipt is inserted; the wait is not ended yet; not committed").name
_AFTER_TERMINAL_UPDATE = {
    op.name: faults.point(f"{op.name}.after_terminal_update",
                          f"{op.name}: the wait is ended; its continuation is not inserted "
                          f"yet; not committed").name
    for op in (SIGNAL, EXPIRE, EXPIRE_DUE)
}
_AFTER_CONSUME = faults.point(
    "resume.after_consume",
    "resume: the continuation is consumed; its effect is not applied yet; not committed").name
_AFTER_FOLLOW_UP_INSERT = faults.point(
    "resume.after_follow_up_insert",
    "resume: the follow-up task is inserted; the effect record is not; not committed").name

#: Generations are positive and bounded so they fit a 32-bit integer column everywhere.
MAX_GENERATION = 2**31 - 1

# A stand-in parent, so a follow-up's own fields are validated before the transaction that
# reads the real parent.
_ANY_PARENT = Parent(task_id="-", principal="-", deadline=0.0, hops=0, queue="-",
                     requester=None)


# -- validation (before any write) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitAddress:
    """A validated ``(flow, step, generation)``."""

    flow: str
    step: str
    generation: int

    def __str__(self) -> str:
        return f"wait {self.flow!r}/{self.step!r} generation {self.generation}"


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A validated ``open_wait`` call."""

    flow: str
    step: str
    expected: int
    deadline: float
    request_id: str | None
    task_id: str | None
    responder: str | None = None


@dataclass(frozen=True, slots=True)
class SignalRequest:
    """A validated ``signal`` call; ``value`` is canonical JSON."""

    principal: str
    event_id: str
    address: WaitAddress
    value: str

    @property
    def body(self) -> str:
        """What the event id is bound to: flow, step, generation and value."""
        a = self.address
        return transitions.receipt_body(a.flow, a.step, a.generation, self.value)


def check_address(settings: Settings, flow: object, step: object,
                  generation: object) -> WaitAddress:
    """Flow and step: non-empty text within the text limit; generation: 1..MAX_GENERATION."""
    limit = settings.limits.text_bytes
    return WaitAddress(check_text(flow, "flow", max_bytes=limit),
                       check_text(step, "step", max_bytes=limit),
                       check_int(generation, "generation", low=1, high=MAX_GENERATION))


def check_open(settings: Settings, *, flow: object, step: object, expected_generation: object,
               deadline: object, request_id: object, task_id: object,
               responder: object = None) -> OpenRequest:
    """Validate an ``open_wait`` call (``responder``: a principal that can sign, or None)."""
    limit = settings.limits.text_bytes
    return OpenRequest(
        flow=check_text(flow, "flow", max_bytes=limit),
        step=check_text(step, "step", max_bytes=limit),
        expected=check_int(expected_generation, "expected_generation", low=0,
                           high=MAX_GENERATION - 1),
        deadline=check_number(deadline, "deadline"),
        request_id=None if request_id is None else check_text(request_id, "request_id",
                                                              max_bytes=limit),
        task_id=None if task_id is None else check_text(task_id, "task_id",
                                                        max_bytes=TASK_ID_BYTES),
        responder=None if responder is None else _responder(settings, responder),
    )


def _responder(settings: Settings, value: object) -> str:
    name = check_text(value, "responder", max_bytes=settings.limits.text_bytes)
    if name.startswith(FOLLOW_UP_NAMESPACES):
        raise InvalidInput("responder", f"{name!r} is reserved for follow-ups: no principal "
                                        f"can answer as it")
    return name


def check_signal(settings: Settings, auth: AuthContext, *, event_id: object, flow: object,
                 step: object, generation: object, value: object) -> SignalRequest:
    """Authorize the principal, then validate the event id, the address and the value."""
    principal = authorize(settings, auth)
    checked_event = check_text(event_id, "event_id", max_bytes=settings.limits.text_bytes)
    address = check_address(settings, flow, step, generation)
    value_json = check_json(value, "value", limits=settings.limits, require_object=False)
    return SignalRequest(principal, checked_event, address, value_json)


def check_effect(settings: Settings, effect: object) -> FollowUp | None:
    """A resume's effect: a ``FollowUp`` to enqueue, or ``None`` to enqueue nothing."""
    if effect is None:
        return None
    if not isinstance(effect, FollowUp):
        raise InvalidInput("effect", f"must be a FollowUp or None, got {type(effect).__name__}")
    _effect_envelope(settings, effect, _ANY_PARENT, "-")
    return effect


def _effect_envelope(settings: Settings, effect: FollowUp, parent: Parent,
                     namespace: str) -> CheckedEnvelope:
    try:
        return check_follow_up(settings, effect, parent, namespace=namespace)
    except InvalidInput as exc:
        raise type(exc)(f"effect.{exc.field}", exc.problem) from None


def follow_up_namespace(address: WaitAddress) -> str:
    """The namespace of the follow-up a wait generation's resume enqueues.

    Keyed by the generation, so every generation may use the same ``message_id`` and a
    re-run of the same resume finds the same identity.
    """
    return WAIT_FOLLOW_UPS + canonical_json([address.flow, address.step, address.generation])


# -- the operations (each inside the caller's transaction) -----------------------------------


def open_wait(tx: Tx, request: OpenRequest) -> WaitOpening:
    """Compare-and-set the slot to ``expected + 1`` and insert that generation, waiting."""
    flow, step = request.flow, request.step
    current = _lock_slot(tx, flow, step)
    if request.request_id is not None:
        earlier = tx.one("wait_by_request", flow=flow, step=step,
                         request_id=request.request_id)
        if earlier is not None:
            return _replayed_opening(request, earlier)
    state: WaitState | None = None
    consumed = False
    if current == request.expected and current > 0:
        row = tx.one("wait_get", flow=flow, step=step, generation=current)
        if row is not None:
            state = WaitState(row["state"])
            consumed = row["continuation_consumed_at"] is not None
    result = transitions.open_wait(current=current, expected=request.expected, state=state,
                                   consumed=consumed)
    if result is not OpenResult.OPENED:
        return WaitOpening(result=result, flow=flow, step=step, generation=current)
    # Locked: a prune must not forget the task while this wait is being attached to it.
    if request.task_id is not None and tx.one("task_kept", task_id=request.task_id) is None:
        raise NotFound(f"no task {request.task_id} (task_id of wait {flow!r}/{step!r})")
    generation = request.expected + 1
    slot = {"flow": flow, "step": step, "generation": generation}
    moved = (tx.one("wait_slot_create", **slot) if current == 0
             else tx.one("wait_slot_advance", expected=current, **slot))
    if moved is None:
        # Another registration created the slot first (only where writers run concurrently,
        # and only for a new slot: an existing one is locked). Decide again on what it wrote.
        return open_wait(tx, request)
    tx.change("wait_insert", deadline=request.deadline, task_id=request.task_id,
              request_id=request.request_id, responder=request.responder, now=tx.now, **slot)
    faults.hit(_AFTER_WAIT_INSERT)
    return WaitOpening(result=OpenResult.OPENED, flow=flow, step=step, generation=generation)


def _replayed_opening(request: OpenRequest, earlier: Row) -> WaitOpening:
    generation = int(earlier["generation"])
    asked = (generation - 1, float(earlier["deadline"]), earlier["task_id"],
             earlier["responder"])
    if asked != (request.expected, request.deadline, request.task_id, request.responder):
        raise PayloadCollision(
            f"open_wait request {request.request_id!r} of {request.flow!r}/{request.step!r}",
            f"it opened generation {generation} with expected_generation {asked[0]}, "
            f"deadline {asked[1]}, task_id {asked[2]}, responder {asked[3]}")
    return WaitOpening(result=OpenResult.OPENED, flow=request.flow, step=request.step,
                       generation=generation, replay=True)


def signal(tx: Tx, request: SignalRequest, *, approval_answer: bool = False) -> SignalReceipt:
    """Decide a signal: replay or conflict of a known event, else a new receipt.

    The receipt, the terminal state and the continuation commit together. A wait that asks
    for an approval takes only its human's answer (``approval_answer``, from
    ``approvals.answer``): a plain signal to it, a relayed "they said yes", is
    ``Unauthorized`` before any receipt is written.
    """
    key = {"principal": request.principal, "event_id": request.event_id}
    stored = tx.one("wait_receipt_get", **key)
    if stored is not None:
        return _repeated(stored, request)
    address = request.address
    current = _lock_slot(tx, address.flow, address.step)
    row = (tx.one("wait_get", flow=address.flow, step=address.step,
                  generation=address.generation) if address.generation <= current else None)
    if row is not None and row["responder"] not in (None, request.principal):
        raise Unauthorized(f"{address} waits for an answer from {row['responder']!r}, not "
                           f"from {request.principal!r}")
    if row is not None and not approval_answer and tx.one(
            "approval_request_get", flow=address.flow, step=address.step,
            generation=address.generation) is not None:
        raise Unauthorized(f"{address} asks for an approval: only its human's answer "
                           f"(answer_approval) counts, never a signal")
    if address.generation != current:
        row = None
    decision = transitions.signal_wait(
        current=current, generation=address.generation,
        state=None if row is None else WaitState(row["state"]),
        deadline=None if row is None else float(row["deadline"]), now=tx.now)
    inserted = tx.one("wait_receipt_insert", flow=address.flow, step=address.step,
                      generation=address.generation, value=request.value,
                      result=decision.result.value, now=tx.now, **key)
    if inserted is None:
        # The same event was recorded meanwhile (only where writers run concurrently).
        stored = tx.one("wait_receipt_get", **key)
        if stored is None:
            raise StoreError(f"receipt {request.principal!r}/{request.event_id!r} vanished")
        return _repeated(stored, request)
    faults.hit(_AFTER_RECEIPT_INSERT)
    if decision.end is not None:
        adopted = decision.end.continuation is ContinuationKind.SIGNAL
        _end(tx, address, decision.end, point=_AFTER_TERMINAL_UPDATE[SIGNAL.name],
             value=request.value if adopted else None,
             event=(request.principal, request.event_id) if adopted else (None, None))
    return SignalReceipt(result=decision.result, recorded=decision.result,
                         principal=request.principal, event_id=request.event_id,
                         flow=address.flow, step=address.step, generation=address.generation,
                         received_at=tx.now)


def _repeated(stored: Row, request: SignalRequest) -> SignalReceipt:
    stored_body = transitions.receipt_body(stored["flow"], stored["step"],
                                           int(stored["generation"]), stored["value"])
    return SignalReceipt.from_row(
        stored, result=transitions.repeat_signal(stored_body, request.body))


def expire(tx: Tx, address: WaitAddress, *, op: Write = EXPIRE) -> ExpireResult:
    """Time the generation out if it is still waiting and its deadline has come."""
    _lock_slot(tx, address.flow, address.step)
    row = tx.one("wait_get", flow=address.flow, step=address.step,
                 generation=address.generation)
    decision = transitions.expire_wait(
        state=None if row is None else WaitState(row["state"]),
        deadline=None if row is None else float(row["deadline"]), now=tx.now)
    if decision.end is not None:
        _end(tx, address, decision.end, point=_AFTER_TERMINAL_UPDATE[op.name], value=None,
             event=(None, None))
    return decision.result


def expire_due(tx: Tx, settings: Settings) -> tuple[int, int]:
    """Time out up to ``sweep_limit`` due waits, earliest deadline first.

    Returns ``(timed out, looked at)``; fewer looked at than the limit means none is left.
    The read walks the head of the ``waits_due`` partial index, so an idle sweep costs one
    index probe whatever the number of waits.
    """
    rows = tx.all("waits_due", now=tx.now, limit=settings.sweep_limit)
    timed_out = 0
    for row in rows:
        address = WaitAddress(row["flow"], row["step"], int(row["generation"]))
        if expire(tx, address, op=EXPIRE_DUE) is ExpireResult.TIMED_OUT:
            timed_out += 1
    return timed_out, len(rows)


def _end(tx: Tx, address: WaitAddress, end: WaitEnd, *, point: str, value: str | None,
         event: tuple[str | None, str | None]) -> None:
    where = {"flow": address.flow, "step": address.step, "generation": address.generation}
    if tx.one("wait_end", to_state=end.to_state.value, event_principal=event[0],
              event_id=event[1], now=tx.now, **where) is None:
        raise StoreError(f"{address} stopped waiting while its slot was locked")
    faults.hit(point)
    tx.change("continuation_insert", kind=end.continuation.value, value=value, now=tx.now,
              **where)


def resume(tx: Tx, settings: Settings, address: WaitAddress,
           effect: FollowUp | None) -> Resumption:
    """Consume the generation's continuation and apply its local effect, atomically.

    The effect is the follow-up task ``effect`` (kind task, parent = the wait's task, hops +
    1), or nothing when ``effect`` is ``None``; either way one effect record is written, and
    its key allows only one per continuation.
    """
    where = {"flow": address.flow, "step": address.step, "generation": address.generation}
    row = tx.one("continuation_get", **where)
    # It may have been written by a decision that committed after this one took its time.
    tx.catch_up_time()
    if row is None:
        raise NotFound(f"{address} has no continuation: it is still waiting, or there is no "
                       f"such wait")
    if row["consumed_at"] is not None:
        return _resumption(ResumeResult.REPLAY, address, row["kind"], row["effect_task_id"])
    # Consume first: a resumer that lost the race reports a replay, before it looks for a
    # parent that a prune may forget once the winner's consumption commits. (A bad effect
    # raises below and rolls the consumption back.)
    if tx.one("continuation_consume", now=tx.now, **where) is None:
        # Consumed meanwhile (only where writers run concurrently): report that consumption.
        again = tx.one("continuation_get", **where)
        assert again is not None
        return _resumption(ResumeResult.REPLAY, address, again["kind"],
                           again["effect_task_id"])
    follow_up = (None if effect is None
                 else _follow_up(tx, settings, address, effect, row["wait_task_id"]))
    faults.hit(_AFTER_CONSUME)
    task_id = None
    if follow_up is not None:
        ack = store_message(tx, settings, follow_up)
        if ack.duplicate:
            raise PayloadCollision(f"follow-up {follow_up.message_id!r} of {address}",
                                   f"task {ack.task_id} already exists")
        task_id = ack.task_id
        faults.hit(_AFTER_FOLLOW_UP_INSERT)
    tx.change("wait_effect_insert", kind="none" if task_id is None else "task", task_id=task_id,
              now=tx.now, **where)
    return _resumption(ResumeResult.RESUMED, address, row["kind"], task_id)


def _follow_up(tx: Tx, settings: Settings, address: WaitAddress, effect: FollowUp,
               parent_id: str | None) -> CheckedEnvelope:
    if parent_id is None:
        raise InvalidInput("effect", f"{address} was opened without a task_id, so it has no "
                                     f"parent for a follow-up; open it with task_id=... or "
                                     f"resume with effect=None")
    parent = tx.one("task_get", task_id=parent_id)
    if parent is None:
        raise NotFound(f"no task {parent_id} (the parent of {address})")
    return _effect_envelope(
        settings, effect,
        Parent(task_id=parent_id, principal=parent["principal"],
               deadline=float(parent["deadline"]), hops=int(parent["hops"]),
               queue=parent["queue"], requester=parent["requester"]),
        follow_up_namespace(address))


def _resumption(result: ResumeResult, address: WaitAddress, kind: str,
                task_id: str | None) -> Resumption:
    return Resumption(result=result, flow=address.flow, step=address.step,
                      generation=address.generation, kind=ContinuationKind(kind),
                      task_id=task_id)


def _lock_slot(tx: Tx, flow: str, step: str) -> int:
    row = tx.one("wait_slot_lock", flow=flow, step=step)
    # The slot's previous holder may have committed a later decision while we waited.
    tx.catch_up_time()
    return 0 if row is None else int(row["generation"])


# -- reading ----------------------------------------------------------------------------------


def continuations(tx: Tx, limit: int, step: str | None = None) -> list[Continuation]:
    """Up to ``limit`` unconsumed continuations (of waits at ``step``, if given), oldest
    first."""
    return [Continuation.from_row(row) for row in tx.all("continuations_unconsumed",
                                                         limit=limit, step=step)]


def get_wait(tx: Tx, flow: str, step: str, generation: int | None) -> Wait:
    """One generation of a wait (the slot's current one if ``generation`` is None)."""
    if generation is None:
        row = tx.one("wait_current", flow=flow, step=step)
        if row is None:
            raise NotFound(f"no wait {flow!r}/{step!r}")
        generation = int(row["generation"])
    found = tx.one("wait_get", flow=flow, step=step, generation=generation)
    if found is None:
        raise NotFound(f"no wait {flow!r}/{step!r} generation {generation}")
    return Wait.from_row(found)

