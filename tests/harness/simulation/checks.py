"""Invariants checked after every simulated step.

``postroom.audit`` checks one moment; the checks here compare two (``before`` and ``after`` a
step) and catch what no single snapshot can show: time running backwards, a receipt or a
reply rewritten, a terminal task revived, a fence reused, an ACKed task lost. Each check is a
function yielding problems, listed in ``CHECKS``; a component adds its own by extending it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass

from postroom.audit import audit_database
from postroom.db.database import Database
from postroom.transitions import reply_id_for
from tests.harness.simulation.world import TERMINAL, Snapshot

__all__ = ["CHECKS", "KEEPERS", "Check", "Transition", "audit_problems", "check_transition",
           "prunable"]


@dataclass(frozen=True, slots=True)
class Transition:
    """What the checks know about the step between two snapshots."""

    forgets: bool  # the step may prune (only pruning may make a record disappear)
    retention: float
    acked: Set[str]  # task ids the simulation was ACKed and not seen pruned


Check = Callable[[Snapshot, Snapshot, Transition], Iterator[str]]


def high_water_never_decreases(before: Snapshot, after: Snapshot, _: Transition
                               ) -> Iterator[str]:
    """The persisted time high-water mark only moves forward."""
    if after.high_water < before.high_water:
        yield f"time high-water went back from {before.high_water} to {after.high_water}"


def receipts_never_change(before: Snapshot, after: Snapshot, _: Transition) -> Iterator[str]:
    """A receiver receipt, once written, stays exactly as it was."""
    for reply_id, receipt in before.receipts.items():
        now = after.receipts.get(reply_id)
        if now is None:
            yield f"receipt {reply_id} disappeared"
        elif (now["fingerprint"], now["received_at"]) != (receipt["fingerprint"],
                                                          receipt["received_at"]):
            yield f"receipt {reply_id} changed"


def terminal_tasks_stay_terminal(before: Snapshot, after: Snapshot, _: Transition
                                 ) -> Iterator[str]:
    """A terminal task never changes state or result again."""
    for task_id, row in before.tasks.items():
        if row["state"] not in TERMINAL:
            continue
        now = after.tasks.get(task_id)
        if now is not None and (now["state"], now["result"]) != (row["state"], row["result"]):
            yield f"terminal task {task_id} changed from {row['state']} to {now['state']}"


def replies_keep_their_content(before: Snapshot, after: Snapshot, _: Transition
                               ) -> Iterator[str]:
    """A reply's identity and content never change; it goes only with its pruned task."""
    for reply_id, row in before.replies.items():
        now = after.replies.get(reply_id)
        if now is None:
            if row["task_id"] in after.tasks:
                yield f"reply {reply_id} disappeared while its task remains"
        elif (now["fingerprint"], now["status"], now["task_id"]) != (
                row["fingerprint"], row["status"], row["task_id"]):
            yield f"reply {reply_id} changed its content"


def fences_never_decrease(before: Snapshot, after: Snapshot, _: Transition) -> Iterator[str]:
    """Task and reply fences, and task attempts, only grow."""
    for task_id, row in before.tasks.items():
        now = after.tasks.get(task_id)
        if now is None:
            continue
        if now["fence"] < row["fence"]:
            yield f"task {task_id} fence went back from {row['fence']} to {now['fence']}"
        if now["attempts"] < row["attempts"]:
            yield f"task {task_id} attempts went back from {row['attempts']} " \
                  f"to {now['attempts']}"
    for reply_id, row in before.replies.items():
        now = after.replies.get(reply_id)
        if now is not None and now["fence"] < row["fence"]:
            yield f"reply {reply_id} fence went back from {row['fence']} to {now['fence']}"


#: Task ids a component still needs in a snapshot, which pruning must keep (a wait's parent
#: task while the wait may still enqueue its follow-up); a component appends its own.
KEEPERS: list[Callable[[Snapshot], Set[str]]] = []


def prunable(snapshot: Snapshot, task_id: str, cutoff: float) -> bool:
    """Whether pruning at ``cutoff`` may forget ``task_id``: terminal, reply sent, old, at
    no stream position above its stream's watermark, and needed by no component; a chain's
    root only with every other task of its chain."""
    if not _forgettable(snapshot, task_id, cutoff):
        return False
    return snapshot.tasks[task_id]["root_task_id"] != task_id or all(
        _forgettable(snapshot, other, cutoff) for other, row in snapshot.tasks.items()
        if row["root_task_id"] == task_id and other != task_id)


def _forgettable(snapshot: Snapshot, task_id: str, cutoff: float) -> bool:
    row = snapshot.tasks[task_id]
    reply = snapshot.replies.get(reply_id_for(task_id))
    return (row["state"] in TERMINAL and reply is not None and reply["state"] == "sent"
            and row["received_at"] is not None and row["received_at"] < cutoff
            and not row["above_watermark"]
            and not any(task_id in kept(snapshot) for kept in KEEPERS))


def nothing_is_lost(before: Snapshot, after: Snapshot, step: Transition) -> Iterator[str]:
    """A task disappears only by pruning, and only once it was terminal, sent and old."""
    cutoff = after.high_water - step.retention
    for task_id in before.tasks.keys() - after.tasks.keys():
        if not step.forgets:
            yield f"task {task_id} disappeared ({before.tasks[task_id]['state']})"
        elif not prunable(before, task_id, cutoff):
            yield f"task {task_id} was pruned before it was terminal, sent and past retention"
    for task_id in step.acked - after.tasks.keys() - before.tasks.keys():
        yield f"ACKed task {task_id} is not stored"


def sent_replies_were_received(before: Snapshot, after: Snapshot, _: Transition
                               ) -> Iterator[str]:
    """A reply recorded ``sent`` is held by the receiver, with the same content."""
    for reply_id, row in after.replies.items():
        if row["state"] != "sent":
            continue
        receipt = after.receipts.get(reply_id)
        if receipt is None:
            yield f"reply {reply_id} is sent but the receiver has no receipt"
        elif receipt["fingerprint"] != row["fingerprint"]:
            yield f"reply {reply_id} is sent but the receiver holds other content"


CHECKS: list[Check] = [
    high_water_never_decreases,
    receipts_never_change,
    terminal_tasks_stay_terminal,
    replies_keep_their_content,
    fences_never_decrease,
    nothing_is_lost,
    sent_replies_were_received,
]


def check_transition(before: Snapshot, after: Snapshot, step: Transition,
                     checks: list[Check] = CHECKS) -> list[str]:
    """Every problem any check finds between ``before`` and ``after``."""
    return [f"{check.__name__}: {problem}" for check in checks
            for problem in check(before, after, step)]


def audit_problems(store: Database, receiver: Database) -> list[str]:
    """The SPEC §8 snapshot audit of both databases, as problems."""
    return [f"audit {name}: {violation}"
            for name, database in (("store", store), ("receiver", receiver))
            for violation in audit_database(database)]
