"""Tasks: claim, renew, finish, fail, cancel, and the bounded sweeps that recover them.

Each function runs inside a transaction the caller opened; rules come from
``postroom.transitions`` and are applied by the guarded ``task_apply*`` statements.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from postroom import approvals, chains, log, outbox, transitions, waits
from postroom.db.database import NotAllApplied, Tx, Write
from postroom.db.dialect import Row
from postroom.errors import (
    Conflict,
    Fenced,
    NotFound,
    PayloadCollision,
    PostroomError,
    WaitNotOpened,
)
from postroom.inbox import store_message
from postroom.models import Claim, OpenResult, Retry, Settled, TaskState, WaitOpening
from postroom.queues import free_slots
from postroom.settings import Settings
from postroom.transitions import TaskDecision
from postroom.validation import (
    RETRIES,
    CheckedEnvelope,
    canonical_json,
    check_envelope,
    follow_up_principal,
)

__all__ = [
    "CANCEL",
    "CLAIM",
    "FAIL",
    "FINISH",
    "RELEASE",
    "RENEW",
    "RENEW_ALL",
    "RERUNNABLE",
    "RETRY",
    "SETTLE",
    "SWEEP",
    "Settling",
    "SweepCounts",
    "after",
    "after_all",
    "answer_fan_in",
    "apply",
    "cancel",
    "claim",
    "claim_from_row",
    "due",
    "fail",
    "finish",
    "finish_all",
    "release",
    "renew",
    "renew_all",
    "retry",
    "settle",
    "sweep",
]

CLAIM = Write("claim")
RENEW = Write("renew")
FINISH = Write("finish")
FAIL = Write("fail")
RELEASE = Write("release")
#: Many owners' outcomes committed together (a worker's group commit).
SETTLE = Write("settle")
#: Many claims' leases extended together.
RENEW_ALL = Write("renew_all")
#: An operator's decision to run a task again.
RETRY = Write("retry")
CANCEL = Write("cancel")
SWEEP = Write("sweep")

_log = log.get("tasks")


class SweepCounts:
    """Mutable tallies of one sweep (folded into ``Swept`` by the store)."""

    __slots__ = ("deadlines_expired", "exhausted", "recovered")

    def __init__(self) -> None:
        self.recovered = 0
        self.exhausted = 0
        self.deadlines_expired = 0


def apply(tx: Tx, settings: Settings, task_id: str, decision: TaskDecision, *,
          from_state: TaskState, fence: int) -> bool:
    """Apply ``decision`` if the task is still in ``from_state`` at ``fence``.

    Writes the reply in the same transaction when the decision is terminal. Returns whether
    the guarded update matched.
    """
    row = tx.one("task_apply", task_id=task_id, from_state=from_state.value, fence=fence,
                 now=tx.now, **_decided(decision, settings, tx.now))
    if row is None:
        return False
    after(tx, settings, row, decision)
    return True


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


#: What a claim copies from its task: the claim's field, the task's column, and how a stored
#: value reads. ``{claim_is_current}`` holds every one of them to the task's own.
_COPIED: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("attempt", "attempts", int), ("max_attempts", "max_attempts", int), ("hops", "hops", int),
    ("deadline", "deadline", float), ("principal", "principal", str), ("queue", "queue", str),
    ("message_id", "message_id", str), ("correlation_id", "correlation_id", _text),
    ("requester", "requester", _text))


def claim_from_row(row: Mapping[str, Any], owner: str) -> Claim:
    """The claim a ``claim_tasks`` row hands ``owner``."""
    return Claim(task_id=row["task_id"], owner=owner, fence=int(row["fence"]),
                 payload=json.loads(row["payload"]), lease_until=float(row["lease_until"]),
                 **_issued(row))


def _issued(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a claim on the task in ``row`` carries from it, by the claim's field names."""
    return {field: kind(row[column]) for field, column, kind in _COPIED}


def _current(claim: Claim, now: float) -> dict[str, Any]:
    """The parameters of ``{claim_is_current}`` for ``claim`` at ``now``."""
    return {"task_id": claim.task_id, "claim_owner": claim.owner, "fence": claim.fence,
            "now": now, **{field: getattr(claim, field) for field, _, _ in _COPIED}}


def _decided(decision: TaskDecision, settings: Settings, now: float) -> dict[str, Any]:
    """The parameters that apply ``decision`` at ``now`` (the guarded statement adds where)."""
    return {"to_state": decision.to_state.value, "available_at": decision.available_at,
            "priority_weight": settings.priority_weight,
            "result": decision.result, "last_error": decision.last_error,
            "ended": None if decision.ended is None else decision.ended.value,
            "ended_at": now if decision.to_state.terminal else None}


def _owned(claim: Claim, decision: TaskDecision, now: float,
           settings: Settings) -> dict[str, Any]:
    """Parameters of ``task_apply_owned``: apply ``decision`` while ``claim`` is current."""
    return (_current(claim, now) | _decided(decision, settings, now)
            | {"give_back": int(decision.gives_back)})


def _apply_owned(tx: Tx, settings: Settings, claim: Claim, decision: TaskDecision) -> Row:
    row = tx.one("task_apply_owned", **_owned(claim, decision, tx.now, settings))
    if row is None:
        raise fenced(tx, claim)
    after(tx, settings, row, decision)
    return row


def after(tx: Tx, settings: Settings, row: Row, decision: TaskDecision) -> None:
    """What follows a decision the task in ``row`` (its route, as the guarded statement
    returned it) was moved by: a terminal one writes its reply and counts the outcome; one
    that makes the task claimable announces its queue."""
    after_all(tx, settings, [(row, decision)])


def after_all(tx: Tx, settings: Settings, moved: Sequence[tuple[Row, TaskDecision]]) -> None:
    """``after`` for many decisions, their replies written by one statement."""
    outbox.insert_replies(tx, settings, [(row, decision.to_state, decision.reply_result)
                                         for row, decision in moved
                                         if decision.reply_result is not None])
    for row, decision in moved:
        if decision.to_state is TaskState.PENDING and decision.available_at <= tx.now:
            tx.notify(row["queue"])
        if decision.to_state.terminal and row["parent_task_id"] is not None:
            answer_fan_in(tx, row["parent_task_id"])


def fenced(tx: Tx, claim: Claim) -> Fenced:
    """Explain why ``claim`` is no longer current (read after the guarded update missed).

    When only time stands in the way (the lease or the deadline ran out), the refusal carries
    its decision time, which the store then keeps.
    """
    row = tx.one("task_get", task_id=claim.task_id)
    decided_at: float | None = None
    if row is None:
        reason = "no such task"
    elif row["state"] != TaskState.RUNNING:
        reason = f"the task is {row['state']}"
    elif row["owner"] != claim.owner or int(row["fence"]) != claim.fence:
        reason = (f"claimed by {row['owner']!r} with fence {row['fence']}; this claim is "
                  f"{claim.owner!r} with fence {claim.fence}")
    elif altered := transitions.altered_claim(claim, _issued(row), "task"):
        reason = altered
    else:
        decided_at = tx.now
        reason = (f"the lease expired at {row['lease_until']} (now {tx.now})"
                  if float(row["lease_until"]) <= tx.now
                  else f"the deadline {row['deadline']} passed (now {tx.now})")
    return Fenced(f"task {claim.task_id}", reason, decided_at=decided_at)


def sweep(tx: Tx, settings: Settings, counts: SweepCounts, *, leases: bool = True,
          deadlines: bool = True) -> None:
    """Recover expired leases and expire passed deadlines (either or both), at most
    ``sweep_limit`` of each.

    Both reads walk the head of a partial index, so an idle sweep costs two index probes
    whatever the backlog.
    """
    now = tx.now
    expired = tx.all("tasks_lease_expired", now=now, limit=settings.sweep_limit) if leases else []
    for row in expired:
        decision = transitions.lease_expired(attempts=int(row["attempts"]),
                                             max_attempts=int(row["max_attempts"]), now=now)
        if apply(tx, settings, row["task_id"], decision, from_state=TaskState.RUNNING,
                 fence=int(row["fence"])):
            recovered = decision.to_state is TaskState.PENDING
            if recovered:
                counts.recovered += 1
            else:
                counts.exhausted += 1
            tx.log(_log, logging.INFO if recovered else logging.WARNING,
                   "lease recovered" if recovered else "attempts exhausted",
                   task_id=row["task_id"], owner=row["owner"], fence=int(row["fence"]),
                   attempt=int(row["attempts"]), state=decision.to_state.value,
                   last_error=decision.last_error)
    passed = (tx.all("tasks_deadline_passed", now=now, limit=settings.sweep_limit)
              if deadlines else [])
    for row in passed:
        state = TaskState(row["state"])
        decision = transitions.deadline_passed(state=state, deadline=float(row["deadline"]),
                                               now=now)
        if apply(tx, settings, row["task_id"], decision, from_state=state,
                 fence=int(row["fence"])):
            counts.deadlines_expired += 1
            tx.log(_log, logging.INFO, "deadline passed", task_id=row["task_id"],
                   fence=int(row["fence"]), state=decision.to_state.value,
                   last_error=decision.last_error)


def due(tx: Tx, queues: Sequence[str]) -> bool:
    """Whether ``claim`` on ``queues`` would find anything to do at ``tx.now``: a claimable
    task, or a lease or deadline for its sweep. One index probe per queue (and two more)."""
    first, *others = dict.fromkeys(queues)
    row = tx.one("tasks_due", queue=first, now=tx.now)
    if row is not None and row["due"]:
        return True
    return any(tx.one("claim_order", queue=queue, now=tx.now, limit=1) is not None
               for queue in others)


def claim(tx: Tx, settings: Settings, *, owner: str, queues: Sequence[str], limit: int,
          lease: float, per_queue: Mapping[str, int] | None = None) -> list[Claim]:
    """Sweep, then claim up to ``limit`` tasks from ``queues``, the first in claim order
    (``claim_at``, then arrival) of all of them, handed back in that order.

    A paused queue gives nothing; a queue with a limit gives no more than it has free slots,
    one for each task it hands out (a slot is free again once its task stops running); a
    queue in ``per_queue`` gives no more than that many (the claimer's own cap on it).
    """
    now = tx.now
    caps = per_queue or {}
    looks: dict[str, Row] = {}
    for queue in dict.fromkeys(queues):
        if caps.get(queue, limit) > 0:
            look = tx.one("claim_look", queue=queue, now=now)
            assert look is not None, "a SELECT of subqueries answers one row"
            looks[queue] = look
    # Every look says the same of the sweep; without one (no queue wanted) it runs whole.
    seen = next(iter(looks.values()), None)
    sweep(tx, settings, SweepCounts(), leases=seen is None or bool(seen["leases"]),
          deadlines=seen is None or bool(seen["deadlines"]))
    # How many each queue may give: the claim's limit, the claimer's cap on the queue, and
    # for a limited queue its free slots (locked for this claim).
    allowed: dict[str, int] = {}
    slots: dict[str, list[int]] = {}
    for queue, row in looks.items():
        want = min(limit, caps.get(queue, limit))
        if row["paused"] or want <= 0:
            continue
        if row["running_limit"] is not None:
            slots[queue] = free_slots(tx, queue, want)
            want = len(slots[queue])
        if want > 0:
            allowed[queue] = want
    if len(allowed) > 1:
        # Several queues: the claim takes the first ``limit`` of their tasks in claim order
        # (SPEC §1), so each queue's next tasks are read in that order (one walk of the head
        # of its index) and merged to learn how many each gives.
        heads = sorted((float(row["claim_at"]), int(row["id"]), queue)
                       for queue, most in allowed.items()
                       for row in tx.all("claim_order", queue=queue, now=now, limit=most))
        taken = Counter(queue for _, _, queue in heads[:limit])
        allowed = {queue: taken[queue] for queue in allowed if taken[queue]}
    picked: list[tuple[float, int, Claim]] = []
    for queue, want in allowed.items():
        rows = tx.all("claim_tasks", queue=queue, now=now, limit=want, owner=owner,
                      lease_until=now + lease)
        held = [(float(row["claim_at"]), int(row["id"]), claim_from_row(row, owner))
                for row in rows]
        # The statement hands its rows back in no promised order: a limited queue's slots go
        # to its tasks in the queue's order (claim_at, then arrival).
        held.sort(key=lambda item: item[:2])
        for (_, _, one), slot in zip(held, slots.get(queue, ()), strict=False):
            tx.change("queue_slot_take", queue=queue, slot=slot, task_id=one.task_id,
                      fence=one.fence)
        picked.extend(held)
    picked.sort(key=lambda item: item[:2])
    claims = [one for _, _, one in picked]
    if _log.isEnabledFor(logging.DEBUG):
        for one in claims:
            tx.log(_log, logging.DEBUG, "task claimed", task_id=one.task_id, owner=owner,
                   fence=one.fence, attempt=one.attempt, state=TaskState.RUNNING.value)
    return claims


def renew(tx: Tx, claim: Claim, *, lease: float) -> Claim:
    """Extend a current claim's lease; a stale, expired or past-deadline claim is fenced."""
    row = tx.one("task_renew", lease_until=tx.now + lease, **_current(claim, tx.now))
    if row is None:
        raise fenced(tx, claim)
    return replace(claim, lease_until=float(row["lease_until"]))


def finish(tx: Tx, settings: Settings, claim: Claim, *, result_json: str,
           follow_ups: Sequence[CheckedEnvelope] = (),
           opens: Sequence[waits.OpenRequest] = (), charge: int = 0,
           effects: Sequence[approvals.CheckedEffect] = (),
           asks: Mapping[int, approvals.CheckedAsk] | None = None) -> list[WaitOpening]:
    """Mark the task done, write its reply, consume an approval for each side effect and
    record it, charge its chain ``charge`` cost units, create its follow-ups (within what
    the chain has left) and open its waits, atomically; ``NotApproved`` or
    ``WaitNotOpened`` (and nothing written) if a side effect has no usable approval or a
    wait cannot open."""
    decision = transitions.finish(result_json=result_json, now=tx.now)
    _apply_owned(tx, settings, claim, decision)
    _log_owned(tx, "task finished", claim, decision)
    return _with_finish(tx, settings, claim, follow_ups=follow_ups, opens=opens,
                        charge=charge, effects=effects, asks=asks or {})


def _with_finish(tx: Tx, settings: Settings, claim: Claim, *,
                 follow_ups: Sequence[CheckedEnvelope], opens: Sequence[waits.OpenRequest],
                 charge: int, effects: Sequence[approvals.CheckedEffect],
                 asks: Mapping[int, approvals.CheckedAsk]) -> list[WaitOpening]:
    """What commits with a finish, after its task moved: its side effects with their
    approvals' uses, then the charge, so that its follow-ups see what the chain has left."""
    approvals.consume(tx, claim.task_id, effects)
    chains.charge(tx, settings, claim.task_id, charge)
    for follow_up in follow_ups:
        store_message(tx, settings, follow_up)
    openings = []
    for index, request in enumerate(opens):
        opening = waits.open_wait(tx, request)
        if opening.result is not OpenResult.OPENED:
            raise WaitNotOpened(opening)
        if index in asks:
            assert request.responder is not None  # check_ask holds it
            approvals.ask(tx, opening, asks[index], task_id=claim.task_id,
                          responder=request.responder)
        if request.responder == follow_up_principal(claim.task_id):  # a fan-in (Store._waits)
            tx.change("fan_in_insert", task_id=claim.task_id, flow=opening.flow,
                      step=opening.step, generation=opening.generation)
            answer_fan_in(tx, claim.task_id)
        openings.append(opening)
    return openings


def answer_fan_in(tx: Tx, task_id: str) -> None:
    """If ``task_id`` waits for all of its children and none is live any more, answer its
    wait with their outcomes (a signal from the task's own reserved principal, which no
    caller can be): one continuation, written by whichever transaction ends the last child.
    """
    fan_in = tx.one("fan_in_get_locked", task_id=task_id)
    if fan_in is None:
        return
    children = tx.all("fan_in_children", task_id=task_id)
    if any(not TaskState(child["state"]).terminal for child in children):
        return
    outcomes = [{"task_id": child["task_id"], "message_id": child["message_id"],
                 "status": child["state"],
                 "result": None if child["result"] is None else json.loads(child["result"]),
                 "error": child["last_error"]} for child in children]
    address = waits.WaitAddress(fan_in["flow"], fan_in["step"], int(fan_in["generation"]))
    waits.signal(tx, waits.SignalRequest(follow_up_principal(task_id), "fan-in", address,
                                         canonical_json({"children": outcomes})))


def finish_all(tx: Tx, settings: Settings, items: Sequence[tuple[Claim, str]]) -> None:
    """``finish`` many claims (with their canonical results), one guarded statement each, sent
    together.

    Raises ``NotAllApplied`` if any claim is not current (nothing of the batch may stay):
    ``finish`` item by item then names it.
    """
    now = tx.now
    decisions = [(claim, transitions.finish(result_json=result, now=now))
                 for claim, result in items]
    rows = tx.one_each("task_apply_owned", [_owned(claim, decision, now, settings)
                                            for claim, decision in decisions])
    if any(row is None for row in rows):
        raise NotAllApplied("task_apply_owned")
    after_all(tx, settings, [(row, decision) for row, (_, decision) in zip(
        rows, decisions, strict=True) if row is not None])
    if _log.isEnabledFor(logging.DEBUG):
        for claim, decision in decisions:
            _log_owned(tx, "task finished", claim, decision)


def fail(tx: Tx, settings: Settings, claim: Claim, *, reason: str, retryable: bool,
         delay: float) -> TaskState:
    """Record a failure: back to pending after ``delay``, or failed with its reply."""
    decision = transitions.fail(attempt=claim.attempt, max_attempts=claim.max_attempts,
                                retryable=retryable, reason=reason, now=tx.now, delay=delay)
    _apply_owned(tx, settings, claim, decision)
    if decision.to_state is TaskState.PENDING:
        _log_owned(tx, "task failed, to be retried", claim, decision)
    elif retryable:
        _log_owned(tx, "attempts exhausted", claim, decision, level=logging.WARNING)
    else:
        _log_owned(tx, "task failed, not retryable", claim, decision, level=logging.INFO)
    return decision.to_state


def release(tx: Tx, settings: Settings, claim: Claim, *, delay: float) -> None:
    """Hand a claimed task back unfinished, its attempt given back (see
    ``transitions.release``); a stale claim is fenced like ``finish``'s."""
    decision = transitions.release(now=tx.now, delay=delay)
    _apply_owned(tx, settings, claim, decision)
    _log_owned(tx, "task released", claim, decision)


def _log_owned(tx: Tx, message: str, claim: Claim, decision: TaskDecision, *,
               level: int = logging.DEBUG) -> None:
    tx.log(_log, level, message, task_id=claim.task_id, owner=claim.owner, fence=claim.fence,
           attempt=claim.attempt, state=decision.to_state.value, last_error=decision.last_error)


def cancel(tx: Tx, settings: Settings, task_id: str, *, reason: str) -> bool:
    """Cancel a pending or running task (its running claim becomes fenced). Cancelling a
    chain's root cancels its chain: every live task of it, each as a single cancel, and the
    chain's new work is born cancelled. ``True`` if any task was cancelled."""
    row = tx.one("task_get", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    if (row["root_task_id"] or task_id) != task_id:
        return _cancel_one(tx, settings, task_id, reason=reason)
    live = chains.cancel(tx, settings, task_id, reason)
    return sum(_cancel_one(tx, settings, member, reason=reason) for member in live) > 0


def _cancel_one(tx: Tx, settings: Settings, task_id: str, *, reason: str) -> bool:
    while True:
        row = tx.one("task_get", task_id=task_id)
        if row is None:
            return False  # pruned meanwhile (a chain's member)
        state = TaskState(row["state"])
        decision = transitions.cancel(state=state, reason=reason, now=tx.now)
        if decision is None:
            return False
        if apply(tx, settings, task_id, decision, from_state=state, fence=int(row["fence"])):
            tx.log(_log, logging.DEBUG, "task cancelled", task_id=task_id, owner=row["owner"],
                   fence=int(row["fence"]), state=decision.to_state.value,
                   last_error=decision.last_error)
            return True
        # Lost a race with a claim or a sweep (possible where the database does not
        # serialize writers, e.g. PostgreSQL): decide again on what is there now.


@dataclass(frozen=True, slots=True)
class Settling:
    """One outcome of ``settle``, validated: its claim, the decision to make at the
    transaction's time, and what commits with it (a finish's follow-ups and waits)."""

    claim: Claim
    decide: Callable[[float], TaskDecision]
    follow_ups: Sequence[CheckedEnvelope] = ()
    opens: Sequence[waits.OpenRequest] = ()
    message: str = "task settled"
    charge: int = 0  # cost units charged to the task's chain
    effects: Sequence[approvals.CheckedEffect] = ()  # side effects, each needing an approval
    asks: Mapping[int, approvals.CheckedAsk] = field(default_factory=dict)  # by wait index


def settle(tx: Tx, settings: Settings, items: Sequence[Settling]) -> list[Settled]:
    """Apply many owners' outcomes in one transaction, each fenced and atomic on its own.

    An outcome with nothing to commit but its decision (and its reply) is applied by its own
    guarded statement, all of them sent together; one whose claim is no longer current
    matched nothing and wrote nothing, so it is only explained. An outcome with follow-ups or
    waits runs in a savepoint, so whatever refuses it (a fence, a wait that cannot open, a
    follow-up that collides) undoes it alone. No outcome costs another its commit.
    """
    now = tx.now
    settled: dict[int, Settled] = {}
    plain = [(index, item, item.decide(now)) for index, item in enumerate(items)
             if not (item.follow_ups or item.opens or item.charge or item.effects)]
    rows = tx.one_each("task_apply_owned", [_owned(item.claim, decision, now, settings)
                                            for _, item, decision in plain])
    moved: list[tuple[Row, TaskDecision]] = []
    for (index, item, decision), row in zip(plain, rows, strict=True):
        if row is None:
            refusal = fenced(tx, item.claim)
            settled[index] = Settled(task_id=item.claim.task_id, error=refusal)
            if refusal.decided_at is not None:
                tx.wrote = True  # time refused it: keep that time, as a single call would
            continue
        moved.append((row, decision))
        _log_owned(tx, item.message, item.claim, decision)
        settled[index] = Settled(task_id=item.claim.task_id, state=decision.to_state)
    after_all(tx, settings, moved)
    for index, item in enumerate(items):
        if index in settled:
            continue
        decision = item.decide(now)
        try:
            with tx.savepoint():
                _apply_owned(tx, settings, item.claim, decision)
                openings = _with_finish(tx, settings, item.claim, follow_ups=item.follow_ups,
                                        opens=item.opens, charge=item.charge,
                                        effects=item.effects, asks=item.asks)
        except PostroomError as exc:
            settled[index] = Settled(task_id=item.claim.task_id, error=exc)
            continue
        _log_owned(tx, item.message, item.claim, decision)
        settled[index] = Settled(task_id=item.claim.task_id, state=decision.to_state,
                                 openings=tuple(openings))
    return [settled[index] for index in range(len(items))]


def renew_all(tx: Tx, claims: Sequence[Claim], *, lease: float) -> list[Claim | Fenced]:
    """Extend many claims' leases in one transaction (one guarded statement each, sent
    together): the renewed claim, or why it is no longer current."""
    rows = tx.one_each("task_renew", [{"lease_until": tx.now + lease, **_current(claim, tx.now)}
                                      for claim in claims])
    renewed: list[Claim | Fenced] = []
    for claim, row in zip(claims, rows, strict=True):
        if row is None:
            refusal = fenced(tx, claim)
            if refusal.decided_at is not None:
                tx.wrote = True
            renewed.append(refusal)
        else:
            renewed.append(replace(claim, lease_until=float(row["lease_until"])))
    return renewed


#: The terminal states an operator may run again (a done task did its work; a task stopped
#: at its hop limit would stop there again).
RERUNNABLE = frozenset({TaskState.FAILED, TaskState.EXPIRED, TaskState.CANCELLED})


def retry(tx: Tx, settings: Settings, task_id: str, *, operator: str, reason: str,
          deadline: float | None, request_id: str | None = None) -> Retry:
    """Run a failed, expired or cancelled task again: a new task, linked to the old one by
    ``retry_of`` and by a recorded decision (who, when, why); the old task, its terminal
    state and its reply stay as they are.

    The new task is the old one's payload, queue, limits, priority, chain and requester,
    identified as the n-th re-run of the old task (``retry:<task_id>``, ``n``). Its deadline
    is ``deadline``, or as far from now as the old one was from its creation.

    A ``request_id`` makes the decision idempotent: the same request sent again (by the
    same operator, for the same reason) gets the re-run it made; another decision under
    that id is a ``PayloadCollision``.
    """
    row = tx.one("task_get_locked", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    if request_id is not None:
        made = tx.one("task_retry_requested", task_id=task_id, request_id=request_id)
        if made is not None:
            return _same_request(Retry.from_row(made), operator=operator, reason=reason)
    state = TaskState(row["state"])
    if state not in RERUNNABLE:
        raise Conflict(f"task {task_id} is {state.value}: only a failed, expired or cancelled "
                       f"task can be run again")
    counted = tx.one("task_retry_count", task_id=task_id)
    number = (int(counted["n"]) if counted is not None else 0) + 1
    budget = float(row["deadline"]) - float(row["created_at"])
    fields = {"message_id": str(number), "sender": RETRIES + task_id,
              "payload": json.loads(row["payload"]),
              "deadline": deadline if deadline is not None else tx.now + max(budget, 1.0),
              "max_attempts": int(row["max_attempts"]), "hops": int(row["hops"]),
              "queue": row["queue"], "correlation_id": row["correlation_id"],
              "parent_task_id": row["parent_task_id"], "priority": int(row["priority"])}
    checked = replace(check_envelope(RETRIES + task_id, fields, limits=settings.limits),
                      requester=row["requester"], retry_of=task_id)
    store_message(tx, settings, checked)
    tx.change("task_retry_insert", task_id=task_id, number=number,
              new_task_id=checked.task_id, operator=operator, reason=reason, now=tx.now,
              request_id=request_id)
    tx.log(_log, logging.INFO, "task run again", task_id=task_id, state=state.value,
           operator=operator)
    return Retry(task_id=task_id, number=number, new_task_id=checked.task_id,
                 operator=operator, reason=reason, retried_at=tx.now, request_id=request_id)


def _same_request(made: Retry, *, operator: str, reason: str) -> Retry:
    """The re-run a request made, answered again, if this is that request once more."""
    for name, given, recorded in (("operator", operator, made.operator),
                                   ("reason", reason, made.reason)):
        if given != recorded:
            raise PayloadCollision(f"request {made.request_id!r} re-running {made.task_id}",
                                   f"its {name} was {recorded!r}")
    return made
