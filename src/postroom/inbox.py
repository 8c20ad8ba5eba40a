"""Receiving: authorize, validate, then store the message and its task in one transaction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from postroom import chains, log, outbox, transitions
from postroom.db.database import NotAllApplied, Tx, Write
from postroom.errors import (
    InvalidEnvelope,
    InvalidInput,
    PayloadCollision,
    StoreUnavailable,
    Unauthorized,
)
from postroom.models import Ack, AuthContext, Envelope, FollowUp, Position, TaskState
from postroom.settings import Settings
from postroom.transitions import TaskDecision
from postroom.validation import (
    FOLLOW_UP_NAMESPACES,
    CheckedEnvelope,
    check_envelope,
    check_int,
    check_text,
)

__all__ = ["RECEIVE", "RECEIVE_ATOMIC", "Parent", "authorize", "check", "check_follow_up",
           "check_position", "principal_of", "store_all", "store_message", "watermark"]

RECEIVE = Write("receive")
RECEIVE_ATOMIC = Write("receive_atomic")

_MAX_SEQ = 2**63 - 1

_log = log.get("inbox")


def principal_of(settings: Settings, auth: AuthContext) -> str:
    """The authenticated principal, as text; ``Unauthorized`` if it cannot be an identity."""
    if not isinstance(auth, AuthContext):
        raise Unauthorized("an AuthContext from a trusted adapter is required")
    try:
        principal = check_text(auth.principal, "principal", max_bytes=settings.limits.text_bytes)
    except InvalidInput as exc:
        # No sender can equal such a principal, and it cannot key an identity either.
        raise Unauthorized(f"the principal is not a usable identity: {exc.problem}") from None
    if principal.startswith(FOLLOW_UP_NAMESPACES):
        raise Unauthorized(f"principal {principal!r} is reserved: names beginning with "
                           f"{' or '.join(map(repr, FOLLOW_UP_NAMESPACES))} identify the "
                           f"tasks postroom makes itself (follow-ups, re-runs, schedules)")
    return principal


def authorize(settings: Settings, auth: AuthContext) -> str:
    """The authenticated principal, if it is an allowed source; ``Unauthorized`` otherwise."""
    principal = principal_of(settings, auth)
    allowed = settings.allowed_sources
    if allowed is not None and principal not in allowed:
        raise Unauthorized(f"principal {principal!r} is not an allowed source")
    return principal


def check(settings: Settings, auth: AuthContext, envelope: Envelope) -> CheckedEnvelope:
    """Authorize the principal and validate the envelope; nothing is written either way."""
    principal = authorize(settings, auth)
    if not isinstance(envelope, Envelope):
        raise InvalidEnvelope("envelope", f"must be an Envelope, got {type(envelope).__name__}")
    checked = check_envelope(principal, envelope.to_dict(), limits=settings.limits)
    if checked.sender != principal:
        raise Unauthorized(f"sender {checked.sender!r} does not match the authenticated "
                           f"principal {principal!r}")
    return checked


@dataclass(frozen=True, slots=True)
class Parent:
    """What a follow-up inherits from the task it follows."""

    task_id: str
    principal: str
    deadline: float
    hops: int
    queue: str
    requester: str | None  # the principal that sent the chain's root


def check_follow_up(settings: Settings, follow_up: FollowUp, parent: Parent, *,
                    namespace: str) -> CheckedEnvelope:
    """The envelope of a follow-up of ``parent``, identified by ``message_id`` in ``namespace``.

    Hops, the parent link and the requester (the chain's, so its reply goes where the
    root's does) are computed here, never taken from the caller; queue and deadline default
    to the parent's.
    """
    fields = {
        "message_id": follow_up.message_id,
        "sender": parent.principal,
        "payload": follow_up.payload,
        "deadline": parent.deadline if follow_up.deadline is None else follow_up.deadline,
        "max_attempts": follow_up.max_attempts,
        "hops": parent.hops + 1,
        "queue": parent.queue if follow_up.queue is None else follow_up.queue,
        "correlation_id": follow_up.correlation_id,
        "parent_task_id": parent.task_id,
    }
    checked = check_envelope(namespace, fields, limits=settings.limits)
    return replace(checked, requester=parent.requester or parent.principal)


def check_position(settings: Settings, position: Position | None) -> Position | None:
    """Validate an upstream stream position."""
    if position is None:
        return None
    if not isinstance(position, Position):
        raise InvalidInput("position", f"must be a Position or None, got "
                                       f"{type(position).__name__}")
    check_text(position.stream, "position.stream", max_bytes=settings.limits.text_bytes)
    check_int(position.seq, "position.seq", low=1, high=_MAX_SEQ)
    return position


def store_message(tx: Tx, settings: Settings, checked: CheckedEnvelope,
                  position: Position | None = None) -> Ack:
    """Store the message as its task (with a reply if it is born terminal).

    A repeat of a stored identity with the same fingerprint is a duplicate and writes
    nothing; with a different fingerprint it is a ``PayloadCollision``.

    A root is placed in its chain without reading anything, so its insert is the first thing
    that learns whether its identity is stored. A message naming a parent looks first: placing
    it reads (and may write) its chain, and a resend must stay a duplicate even after its
    parent was pruned.

    A prune can forget the identity between the insert that found it and the read of its
    fingerprint (on PostgreSQL; SQLite runs one writer at a time). The read waits for that
    prune, finds nothing, and the identity is then a new request: stored again, once.
    """
    for _ in range(2):
        if checked.parent_task_id is not None and _stored_as(tx, checked):
            duplicate = True
            break
        if _insert_tasks(tx, settings, [checked], each=True):
            duplicate = False
            break
        if _stored_as(tx, checked):
            duplicate = True
            break
    else:
        raise StoreUnavailable(f"message {checked.message_id!r} from {checked.principal!r}: "
                               "its identity was forgotten twice while it was being stored")
    if position is not None:
        _record_position(tx, checked, position)
    return Ack(task_id=checked.task_id, duplicate=duplicate)


def _stored_as(tx: Tx, checked: CheckedEnvelope) -> bool:
    """``True`` if the identity is stored with this content; ``PayloadCollision`` if with
    other content; ``False`` if it is not stored."""
    stored = tx.one("task_fingerprint", task_id=checked.task_id)
    if stored is None:
        return False
    if stored["fingerprint"] != checked.fingerprint:
        raise PayloadCollision(
            f"message {checked.message_id!r} from {checked.principal!r}",
            f"task {checked.task_id} was stored with fingerprint {stored['fingerprint']}, "
            f"this one is {checked.fingerprint}")
    return True


def store_all(tx: Tx, settings: Settings, items: Sequence[CheckedEnvelope]) -> list[Ack]:
    """``store_message`` for a batch of new messages, one statement per table.

    Raises ``NotAllApplied`` if any identity is already stored (or given twice), or if one
    names a parent (which may be another item of the batch): ``store_message`` item by item
    then tells duplicates from collisions, and links each to its parent's chain in order.
    """
    if any(checked.parent_task_id is not None for checked in items):
        raise NotAllApplied("task_parent")
    _insert_tasks(tx, settings, items, each=False)
    return [Ack(task_id=checked.task_id, duplicate=False) for checked in items]


def _task(checked: CheckedEnvelope, decision: TaskDecision, now: float,
          priority_weight: float, root_task_id: str) -> dict[str, object]:
    return {"task_id": checked.task_id, "principal": checked.principal,
            "message_id": checked.message_id, "fingerprint": checked.fingerprint,
            "envelope": checked.envelope, "queue": checked.queue,
            "state": decision.to_state.value, "payload": checked.payload,
            "deadline": checked.deadline, "max_attempts": checked.max_attempts,
            "hops": checked.hops, "parent_task_id": checked.parent_task_id,
            "correlation_id": checked.correlation_id, "requester": checked.requester,
            "result": decision.result, "last_error": decision.last_error, "now": now,
            "available_at": decision.available_at, "not_before": checked.not_before,
            "priority": checked.priority, "priority_weight": priority_weight,
            "retry_of": checked.retry_of,
            "root_task_id": None if root_task_id == checked.task_id else root_task_id,
            "ended_at": now if decision.to_state.terminal else None}


def _insert_tasks(tx: Tx, settings: Settings, items: Sequence[CheckedEnvelope], *,
                  each: bool) -> bool:
    """Create the tasks of new messages, with the replies of born-terminal ones.

    ``each``: one message, inserted unless its identity is stored (``False``: nothing was
    written). Otherwise a batch of new ones, one statement for all; an identity already
    stored (or given twice) raises ``NotAllApplied``.
    """
    now = tx.now
    placed = [chains.place(tx, settings, checked) for checked in items]
    decided = [(checked, transitions.initial_state(
        deadline=checked.deadline, hops=checked.hops, max_hops=placement.max_hops, now=now,
        not_before=checked.not_before, budget_spent=placement.budget_spent,
        chain_cancelled=placement.cancelled))
        for checked, placement in placed]
    rows = [_task(checked, decision, now, settings.priority_weight, placement.root_task_id)
            for (checked, decision), (_, placement) in zip(decided, placed, strict=True)]
    if each:
        (row,) = rows
        if tx.one("task_insert", **row) is None:
            return False
    else:
        tx.change_each("task_insert", rows)
    tx.kept_in_task = True  # created_at keeps this transaction's time (see clock_read)
    chains.admit(tx, settings, [
        (placement, decision.to_state)
        for (_, placement), (_, decision) in zip(placed, decided, strict=True)])
    outbox.insert_replies(tx, settings, [
        (row, decision.to_state, decision.reply_result)
        for row, (_, decision) in zip(rows, decided, strict=True)
        if decision.reply_result is not None])
    for queue in dict.fromkeys(checked.queue for checked, decision in decided
                               if decision.to_state is TaskState.PENDING):
        tx.notify(queue)
    if _log.isEnabledFor(logging.DEBUG):
        for checked, decision in decided:
            tx.log(_log, logging.DEBUG, "task received", task_id=checked.task_id,
                   state=decision.to_state.value, last_error=decision.last_error)
    return True


def _record_position(tx: Tx, checked: CheckedEnvelope, position: Position) -> None:
    key = {"principal": checked.principal, "stream": position.stream}
    if tx.one("stream_position_insert", seq=position.seq, task_id=checked.task_id,
              **key) is None:
        holder = tx.one("stream_position_task", seq=position.seq, **key)
        if holder is not None and holder["task_id"] != checked.task_id:
            raise PayloadCollision(
                f"stream {position.stream!r} position {position.seq}",
                f"already holds task {holder['task_id']}, not {checked.task_id}")
        return
    tx.change("stream_create", **key)
    current = tx.one("stream_watermark_locked", **key)
    stored = int(current["watermark"]) if current is not None else 0
    # Any position above the stored watermark recomputes the run, not only seq == stored + 1:
    # that also moves on a watermark left behind by versions without the lock above.
    if position.seq > stored:
        tx.change("stream_advance", watermark=_contiguous(tx, key, stored), **key)


def _contiguous(tx: Tx, key: dict[str, str], stored: int) -> int:
    row = tx.one("stream_next_missing", watermark=stored, **key)
    return int(row["missing"]) - 1 if row is not None else stored


def watermark(tx: Tx, principal: str, stream: str) -> int:
    """The highest ``seq`` such that every position up to it is stored (0 if none).

    Read from the persisted watermark plus any run of positions stored above it, so a
    position committed concurrently with the one that would have advanced it is counted.
    """
    key = {"principal": principal, "stream": stream}
    current = tx.one("stream_watermark", **key)
    stored = int(current["watermark"]) if current is not None else 0
    return _contiguous(tx, key, stored)
