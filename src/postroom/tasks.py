"""Tasks: claim, renew, finish, fail, cancel, and the bounded sweeps that recover them.

Each function runs inside a transaction the caller opened; rules come from
``postroom.transitions`` and are applied by the guarded ``task_apply*`` statements.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from postroom import transitions
from postroom.db.database import Tx, Write
from postroom.errors import Fenced, NotFound
from postroom.inbox import insert_reply, store_message
from postroom.models import Claim, TaskState
from postroom.settings import Settings
from postroom.transitions import TaskDecision
from postroom.validation import CheckedEnvelope

__all__ = [
    "CANCEL",
    "CLAIM",
    "FAIL",
    "FINISH",
    "RENEW",
    "SWEEP",
    "SweepCounts",
    "apply",
    "cancel",
    "claim",
    "claim_from_row",
    "fail",
    "finish",
    "finish_all",
    "renew",
    "sweep",
]

CLAIM = Write("claim")
RENEW = Write("renew")
FINISH = Write("finish")
FAIL = Write("fail")
CANCEL = Write("cancel")
SWEEP = Write("sweep")


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
    changed = tx.change("task_apply", task_id=task_id, from_state=from_state.value, fence=fence,
                     to_state=decision.to_state.value, owner=None, lease_until=None,
                     available_at=decision.available_at, result=decision.result,
                     last_error=decision.last_error, now=tx.now)
    if not changed:
        return False
    _after(tx, settings, task_id, decision)
    return True


#: What a claim copies from its task: the claim's field, the task's column, the column's
#: Python type. ``{claim_is_current}`` holds every one of them to the task's own.
_COPIED = (("attempt", "attempts", int), ("max_attempts", "max_attempts", int),
           ("hops", "hops", int), ("deadline", "deadline", float),
           ("principal", "principal", str), ("queue", "queue", str),
           ("message_id", "message_id", str))


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


def _owned(claim: Claim, decision: TaskDecision, now: float) -> dict[str, Any]:
    """Parameters of ``task_apply_owned``: apply ``decision`` while ``claim`` is current."""
    return _current(claim, now) | {
        "to_state": decision.to_state.value, "owner": None, "lease_until": None,
        "available_at": decision.available_at, "result": decision.result,
        "last_error": decision.last_error}


def _apply_owned(tx: Tx, settings: Settings, claim: Claim, decision: TaskDecision) -> None:
    if not tx.change("task_apply_owned", **_owned(claim, decision, tx.now)):
        raise fenced(tx, claim)
    _after(tx, settings, claim.task_id, decision)


def _after(tx: Tx, settings: Settings, task_id: str, decision: TaskDecision) -> None:
    if decision.reply is not None:
        insert_reply(tx, settings, task_id, decision.reply)


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


def sweep(tx: Tx, settings: Settings, counts: SweepCounts) -> None:
    """Recover expired leases and expire passed deadlines, at most ``sweep_limit`` of each.

    Both reads walk the head of a partial index, so an idle sweep costs two index probes
    whatever the backlog.
    """
    now = tx.now
    for row in tx.all("tasks_lease_expired", now=now, limit=settings.sweep_limit):
        decision = transitions.lease_expired(row["task_id"], attempts=int(row["attempts"]),
                                             max_attempts=int(row["max_attempts"]), now=now)
        if apply(tx, settings, row["task_id"], decision, from_state=TaskState.RUNNING,
                 fence=int(row["fence"])):
            if decision.to_state is TaskState.PENDING:
                counts.recovered += 1
            else:
                counts.exhausted += 1
    for row in tx.all("tasks_deadline_passed", now=now, limit=settings.sweep_limit):
        decision = transitions.deadline_passed(row["task_id"], deadline=float(row["deadline"]),
                                               now=now)
        if apply(tx, settings, row["task_id"], decision, from_state=TaskState(row["state"]),
                 fence=int(row["fence"])):
            counts.deadlines_expired += 1


def claim(tx: Tx, settings: Settings, *, owner: str, queues: Sequence[str], limit: int,
          lease: float) -> list[Claim]:
    """Sweep, then claim up to ``limit`` tasks from ``queues``, oldest available first."""
    sweep(tx, settings, SweepCounts())
    now = tx.now
    ordered = list(queues)
    if len(ordered) > 1:
        # Several queues: one index probe per queue finds each head, and the oldest head goes
        # first. (A single ORDER BY across queues would need a temporary sort.)
        heads = []
        for queue in dict.fromkeys(ordered):
            row = tx.one("claim_head", queue=queue, now=now)
            if row is not None:
                heads.append((float(row["available_at"]), queue))
        ordered = [queue for _, queue in sorted(heads)]
    claims: list[Claim] = []
    for queue in ordered:
        rows = tx.all("claim_tasks", queue=queue, now=now, limit=limit - len(claims),
                      owner=owner, lease_until=now + lease)
        claims.extend(claim_from_row(row, owner) for row in rows)
        if len(claims) >= limit:
            break
    return claims


def renew(tx: Tx, claim: Claim, *, lease: float) -> Claim:
    """Extend a current claim's lease; a stale, expired or past-deadline claim is fenced."""
    row = tx.one("task_renew", lease_until=tx.now + lease, **_current(claim, tx.now))
    if row is None:
        raise fenced(tx, claim)
    return replace(claim, lease_until=float(row["lease_until"]))


def finish(tx: Tx, settings: Settings, claim: Claim, *, result_json: str,
           follow_ups: Sequence[CheckedEnvelope]) -> None:
    """Mark the task done, write its reply and create its follow-ups, atomically."""
    decision = transitions.finish(claim.task_id, result_json=result_json, now=tx.now)
    _apply_owned(tx, settings, claim, decision)
    for follow_up in follow_ups:
        store_message(tx, settings, follow_up)


def finish_all(tx: Tx, settings: Settings, items: Sequence[tuple[Claim, str]]) -> None:
    """``finish`` many claims (with their canonical results), one guarded statement for all.

    Raises ``NotAllApplied`` if any claim is not current (nothing of the batch may stay):
    ``finish`` item by item then names it.
    """
    now = tx.now
    decisions = [(claim, transitions.finish(claim.task_id, result_json=result, now=now))
                 for claim, result in items]
    tx.change_each("task_apply_owned", [_owned(claim, decision, now)
                                    for claim, decision in decisions])
    for claim, decision in decisions:
        _after(tx, settings, claim.task_id, decision)


def fail(tx: Tx, settings: Settings, claim: Claim, *, reason: str, retryable: bool,
         delay: float) -> TaskState:
    """Record a failure: back to pending after ``delay``, or failed with its reply."""
    decision = transitions.fail(claim.task_id, attempt=claim.attempt,
                                max_attempts=claim.max_attempts, retryable=retryable,
                                reason=reason, now=tx.now, delay=delay)
    _apply_owned(tx, settings, claim, decision)
    return decision.to_state


def cancel(tx: Tx, settings: Settings, task_id: str, *, reason: str) -> bool:
    """Cancel a pending or running task (its running claim becomes fenced)."""
    while True:
        row = tx.one("task_get", task_id=task_id)
        if row is None:
            raise NotFound(f"no task {task_id}")
        state = TaskState(row["state"])
        decision = transitions.cancel(task_id, state=state, reason=reason, now=tx.now)
        if decision is None:
            return False
        if apply(tx, settings, task_id, decision, from_state=state, fence=int(row["fence"])):
            return True
        # Lost a race with a claim or a sweep (possible where the database does not
        # serialize writers, e.g. PostgreSQL): decide again on what is there now.
