"""The outbox: writing terminal tasks' replies, claiming them for delivery, recording
outcomes, recovering publishers.

A reply is written in the transaction that makes its task terminal, with its route taken
from the task's row (who it goes to, what it answers), and its body never changes.

Delivery has two commits of its own around the receiver's, each with fault points:

- ``dispatch.claim``  -- the reply becomes ``sending`` under a lease and a new fence;
- ``delivery.before_remote_commit`` / ``delivery.after_remote_commit`` -- around the
  receiver's commit, the latter being where an ACK is lost in transit;
- ``dispatch.record`` -- the outcome (``sent``, retry, ``dead``) is recorded, fenced.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from postroom import endpoints, faults, log, transitions
from postroom.db.database import NotAllApplied, Tx, Write
from postroom.db.wakeups import REPLIES_CHANNEL
from postroom.errors import Fenced, NotFound
from postroom.models import Outcome, OutcomeKind, ReplyClaim, ReplyState, TaskState
from postroom.settings import Settings
from postroom.transitions import ReplyDecision, Route

__all__ = [
    "AFTER_REMOTE_COMMIT",
    "BEFORE_REMOTE_COMMIT",
    "DISPATCH_CLAIM",
    "DISPATCH_RECORD",
    "RELEASE",
    "REQUEUE",
    "claim_replies",
    "insert_replies",
    "record",
    "record_all",
    "release_all",
    "replies_due",
    "requeue",
    "sweep_replies",
]

DISPATCH_CLAIM = Write("dispatch.claim")
DISPATCH_RECORD = Write("dispatch.record")
REQUEUE = Write("requeue")
RELEASE = Write("dispatch.release")

_log = log.get("outbox")

BEFORE_REMOTE_COMMIT = faults.point(
    "delivery.before_remote_commit", "a reply is about to be handed to the receiver").name
AFTER_REMOTE_COMMIT = faults.point(
    "delivery.after_remote_commit",
    "the receiver committed the reply; its ACK has not reached the dispatcher").name


def insert_replies(tx: Tx, settings: Settings,
                   replies: Sequence[tuple[Mapping[str, Any], TaskState, str]]) -> None:
    """Write the replies of tasks that just became terminal: for each, the task's row (at
    least ``task_id``, ``queue``, ``requester``, ``correlation_id`` and ``parent_task_id``),
    its terminal state and the canonical JSON its reply answers with. Each outcome is
    counted."""
    if not replies:
        return
    rows = []
    for task, status, result_json in replies:
        route = Route(task["requester"], task["correlation_id"], task["parent_task_id"])
        content = transitions.reply_content(task["task_id"], status, result_json, route)
        rows.append({"reply_id": content.reply_id, "task_id": task["task_id"],
                     "status": status.value, "body": content.body,
                     "fingerprint": content.fingerprint, "requester": route.requester,
                     "queue": task["queue"], "budget": settings.delivery_budget,
                     "now": tx.now})
        tx.tally("task", task["queue"], status.value)
    tx.change_many("reply_insert", rows)
    tx.notify(REPLIES_CHANNEL)


def _params(reply_id: str, decision: ReplyDecision, *, fence: int,
            now: float) -> dict[str, Any]:
    return {"reply_id": reply_id, "fence": fence, "to_state": decision.to_state.value,
            "available_at": decision.available_at, "last_error": decision.last_error,
            "sent_at": decision.sent_at, "ended": decision.ended.value, "now": now}


def _owned(claim: ReplyClaim, decision: ReplyDecision, now: float) -> dict[str, Any]:
    """Parameters of ``reply_apply_owned``: apply ``decision`` while ``claim`` is current."""
    return _params(claim.reply_id, decision, fence=claim.fence, now=now) | {
        "claim_owner": claim.owner, "task_id": claim.task_id, "attempt": claim.attempt,
        "budget": claim.budget, "body": claim.body, "fingerprint": claim.fingerprint,
        "requester": claim.requester}


def _counted(tx: Tx, row: Mapping[str, Any], decision: ReplyDecision) -> None:
    if decision.to_state is ReplyState.SENT and row["queue"] is not None:
        tx.tally("reply", row["queue"], ReplyState.SENT.value)


def _apply(tx: Tx, reply_id: str, decision: ReplyDecision, *, fence: int,
           from_state: ReplyState) -> bool:
    params = _params(reply_id, decision, fence=fence, now=tx.now)
    row = tx.one("reply_apply", from_state=from_state.value, **params)
    if row is None:
        return False
    _counted(tx, row, decision)
    return True


def sweep_replies(tx: Tx, settings: Settings) -> tuple[int, int]:
    """Recover replies whose publisher's lease expired; returns (pending again, dead)."""
    recovered = dead = 0
    for row in tx.all("replies_lease_expired", now=tx.now, limit=settings.sweep_limit):
        decision = transitions.reply_lease_expired(attempt=int(row["attempts"]),
                                                   budget=int(row["budget"]), now=tx.now)
        if _apply(tx, row["reply_id"], decision, fence=int(row["fence"]),
                  from_state=ReplyState.SENDING):
            is_dead = decision.to_state is ReplyState.DEAD
            if is_dead:
                dead += 1
            else:
                recovered += 1
            tx.log(_log, logging.WARNING if is_dead else logging.INFO,
                   "reply dead" if is_dead else "delivery lease recovered",
                   reply_id=row["reply_id"], owner=row["owner"], fence=int(row["fence"]),
                   attempt=int(row["attempts"]), state=decision.to_state.value,
                   last_error=decision.last_error)
    return recovered, dead


def replies_due(tx: Tx) -> bool:
    """Whether ``claim_replies`` would find anything to do at ``tx.now``: a reply due for
    delivery, or a delivery lease to recover."""
    row = tx.one("replies_due", now=tx.now)
    return row is not None and bool(row["due"])


def claim_replies(tx: Tx, settings: Settings, *, owner: str, limit: int,
                  lease: float, routed: bool = False) -> list[ReplyClaim]:
    """Sweep, then claim up to ``limit`` replies due for delivery.

    ``routed`` claims for endpoints: the replies of the head whose requester has no enabled
    endpoint are parked first (see ``endpoints``), so fewer than ``limit`` may be claimed
    while more are due, and each reply's first attempt fixes its budget to its endpoint's.
    """
    sweep_replies(tx, settings)
    if routed:
        endpoints.park(tx, limit)
    rows = tx.all("claim_replies", now=tx.now, limit=limit, owner=owner,
                  lease_until=tx.now + lease, routed=int(routed))
    if _log.isEnabledFor(logging.DEBUG):
        for row in rows:
            tx.log(_log, logging.DEBUG, "reply claimed", reply_id=row["reply_id"],
                   task_id=row["task_id"], owner=owner, fence=int(row["fence"]),
                   attempt=int(row["attempts"]), state=ReplyState.SENDING.value)
    return [ReplyClaim(reply_id=row["reply_id"], task_id=row["task_id"], owner=owner,
                       fence=int(row["fence"]), attempt=int(row["attempts"]),
                       budget=int(row["budget"]), lease_until=float(row["lease_until"]),
                       body=row["body"], fingerprint=row["fingerprint"],
                       requester=row["requester"]) for row in rows]


def record(tx: Tx, claim: ReplyClaim, outcome: Outcome, *, delay: float) -> ReplyState:
    """Record one delivery outcome; ``Fenced`` if another publisher took the reply over."""
    decision = transitions.delivery(outcome.kind, detail=outcome.detail, attempt=claim.attempt,
                                    budget=claim.budget, now=tx.now, delay=delay)
    row = tx.one("reply_apply_owned", **_owned(claim, decision, tx.now))
    if row is None:
        raise _fenced(tx, claim)
    _counted(tx, row, decision)
    _log_recorded(tx, claim, decision)
    if outcome.kind is OutcomeKind.GONE:
        endpoints.stopped_by_gone(tx, claim.requester, claim.reply_id)
    return decision.to_state


def _log_recorded(tx: Tx, claim: ReplyClaim, decision: ReplyDecision) -> None:
    is_dead = decision.to_state is ReplyState.DEAD
    tx.log(_log, logging.WARNING if is_dead else logging.DEBUG,
           "reply dead" if is_dead else "delivery recorded", reply_id=claim.reply_id,
           task_id=claim.task_id, owner=claim.owner, fence=claim.fence, attempt=claim.attempt,
           state=decision.to_state.value, last_error=decision.last_error)


def _fenced(tx: Tx, claim: ReplyClaim) -> Fenced:
    """Explain why ``claim`` is no longer its publisher's (read after the update missed)."""
    row = tx.one("reply_get_by_id", reply_id=claim.reply_id)
    if row is not None and row["state"] == ReplyState.SENDING and row["owner"] == claim.owner \
            and int(row["fence"]) == claim.fence:
        issued = {"task_id": row["task_id"], "attempt": int(row["attempts"]),
                  "budget": int(row["budget"]), "body": row["body"],
                  "fingerprint": row["fingerprint"], "requester": row["requester"]}
        altered = transitions.altered_claim(claim, issued, "reply")
        if altered is not None:
            return Fenced(f"reply {claim.reply_id}", altered)
    state = row["state"] if row is not None else "missing"
    holder = f"{row['owner']!r} with fence {row['fence']}" if row is not None else "nobody"
    return Fenced(f"reply {claim.reply_id}", f"the reply is {state}, held by {holder}; this "
                                             f"claim is {claim.owner!r} with fence {claim.fence}")


def record_all(tx: Tx, items: Sequence[tuple[ReplyClaim, Outcome, float]]) -> list[ReplyState]:
    """``record`` many outcomes (each with its retry delay) in one statement.

    Raises ``NotAllApplied`` if any claim is no longer its publisher's: ``record`` item by
    item then tells which are fenced.
    """
    now = tx.now
    decisions = [transitions.delivery(outcome.kind, detail=outcome.detail,
                                      attempt=claim.attempt, budget=claim.budget, now=now,
                                      delay=delay) for claim, outcome, delay in items]
    rows = tx.one_each("reply_apply_owned", [
        _owned(claim, decision, now)
        for (claim, _, _), decision in zip(items, decisions, strict=True)])
    if any(row is None for row in rows):
        raise NotAllApplied("reply_apply_owned")
    debug = _log.isEnabledFor(logging.DEBUG)
    for row, (claim, outcome, _), decision in zip(rows, items, decisions, strict=True):
        assert row is not None
        _counted(tx, row, decision)
        if debug or decision.to_state is ReplyState.DEAD:
            _log_recorded(tx, claim, decision)
        if outcome.kind is OutcomeKind.GONE:
            endpoints.stopped_by_gone(tx, claim.requester, claim.reply_id)
    return [decision.to_state for decision in decisions]


def release_all(tx: Tx, claims: Sequence[ReplyClaim], *, delay: float) -> list[str]:
    """Hand ``claims`` back unsent, each claimable again after ``delay`` with its attempt
    given back; returns the reply ids that were no longer these claims' (left as they are)."""
    decision = transitions.reply_release(now=tx.now, delay=delay)
    rows = tx.one_each("reply_release_owned", [
        _owned(claim, decision, tx.now) for claim in claims])
    fenced = []
    for row, claim in zip(rows, claims, strict=True):
        if row is None:
            fenced.append(claim.reply_id)
        else:
            tx.log(_log, logging.DEBUG, "delivery released", reply_id=claim.reply_id,
                   task_id=claim.task_id, owner=claim.owner, fence=claim.fence,
                   attempt=claim.attempt, state=ReplyState.PENDING.value)
    if len(fenced) < len(claims):
        tx.notify(REPLIES_CHANNEL)
    return fenced


def requeue(tx: Tx, reply_id: str, *, operator: str, reason: str) -> None:
    """Send a dead reply again, recording the operator's decision; id and content unchanged."""
    row = tx.one("reply_get_by_id", reply_id=reply_id)
    if row is None:
        raise NotFound(f"no reply {reply_id}")
    if row["state"] != ReplyState.DEAD:
        raise Fenced(f"reply {reply_id}", f"only a dead reply can be requeued; it is "
                                          f"{row['state']}")
    tx.change("requeue_insert", reply_id=reply_id, operator=operator, reason=reason, now=tx.now,
              previous_attempts=int(row["attempts"]), previous_error=row["last_error"])
    if not tx.change("reply_requeue", reply_id=reply_id, now=tx.now):
        raise Fenced(f"reply {reply_id}", "changed while being requeued")
    tx.notify(REPLIES_CHANNEL)
    tx.log(_log, logging.INFO, "dead reply requeued", reply_id=reply_id,
           task_id=row["task_id"], operator=operator, state=ReplyState.PENDING.value,
           last_error=row["last_error"])
