"""Retention: the period a store promises to keep received identities, and pruning by it.

The period is a promise to every sender (SPEC §2: an identity sent again within it is a
duplicate), so it is the store's, not one process's: the first opener publishes its
``Settings.retention`` (or ``DEFAULT_RETENTION``), every later opener adopts it, and an
operator changes it (``postroom init URL --retention SECONDS``) for every process at once. A
promise made stays kept: after a shortening, pruning keeps the longer period until what was
received before has had it (``transitions.change_retention``).

Pruning forgets a message, its task, its reply and their records once all of them are done
with: the task terminal, the reply sent, no wait still needing the task as a follow-up's
parent, no stream still counting on its position.
"""

from __future__ import annotations

from postroom import transitions
from postroom.db import Tx, Write
from postroom.errors import InvalidInput, SchemaError
from postroom.settings import DEFAULT_RETENTION
from postroom.transitions import Retention, reply_id_for

__all__ = ["PRUNE", "PUBLISH", "RETENTION", "adopt", "change", "prune_once", "published"]

PRUNE = Write("prune")
#: The first publication of the store's settings, by its first opener: decides nothing by time.
PUBLISH = Write("publish", timed=False)
#: An operator's change of the retention period: from its time on, what it promises holds.
RETENTION = Write("retention")


def published(tx: Tx, *, locked: bool = False) -> Retention | None:
    """The retention period the store publishes (``None`` before its first opener)."""
    row = tx.one("published_read_locked" if locked else "published_read", setting="retention")
    if row is None:
        return None
    floor_value, floor_until = row["floor_value"], row["floor_until"]
    return Retention(float(row["value"]), None if floor_value is None else float(floor_value),
                     None if floor_until is None else float(floor_until))


def adopt(tx: Tx, wanted: float | None) -> float:
    """Publish ``wanted`` (or the default) unless the store publishes a period already;
    return the store's period.

    ``InvalidInput`` naming ``retention`` when ``wanted`` is given and differs from it.
    """
    tx.change("published_first", setting="retention",
              value=DEFAULT_RETENTION if wanted is None else wanted)
    found = published(tx)
    if found is None:  # pragma: no cover - the statement above just published it
        raise SchemaError("the store publishes no retention period")
    if wanted is not None and found.value != wanted:
        raise InvalidInput("retention", (
            f"this store publishes {found.value:g} seconds, not {wanted:g}: leave "
            "Settings.retention unset to use the store's, or change the store's with "
            "postroom init URL --retention SECONDS"))
    return found.value


def change(tx: Tx, seconds: float) -> float | None:
    """Publish ``seconds`` as the period, keeping the promises made; return the one before."""
    current = published(tx, locked=True)
    changed = transitions.change_retention(current, seconds, tx.now)
    tx.change("published_set", setting="retention", value=changed.value,
              floor_value=changed.floor_value, floor_until=changed.floor_until)
    return None if current is None else current.value


def prune_once(tx: Tx, *, limit: int) -> tuple[int, int]:
    """Prune up to ``limit`` messages; return how many were pruned and how many were chosen.

    A message stored at a stream position above its stream's watermark is kept: its source
    will send it again from the watermark, and that must be a duplicate.
    """
    retention = published(tx)
    if retention is None:  # pragma: no cover - every opener publishes one first
        raise SchemaError("the store publishes no retention period")
    cutoff = tx.now - retention.at(tx.now)
    walk = tx.tasks_walk(before=cutoff)
    candidates = tx.all("tasks_prunable", cutoff=cutoff, task_id=None, limit=limit, **walk)
    # A wait attached to one, or a position received for it, may have committed after the
    # statement chose it; where that can be, each is asked again.
    rows = tx.confirm_locked(candidates, lambda row: tx.one(
        "tasks_prunable", cutoff=cutoff, task_id=row["task_id"], limit=1, **walk) is not None)
    if rows:
        # A claim on a pruned task (reply) may still be held: keep its fence from coming
        # back on a new one with the same identity.
        tx.change("fence_floor_raise", kind="task",
                  floor=max(int(row["task_fence"]) for row in rows))
        tx.change("fence_floor_raise", kind="reply",
                  floor=max(int(row["reply_fence"]) for row in rows))
    if rows:
        tx.forgets_time = True  # the newest task may go: keep the time in a clock row
    for row in rows:
        task_id = row["task_id"]
        tx.change("prune_stream_positions", task_id=task_id)
        tx.change("prune_requeues", reply_id=reply_id_for(task_id))
        tx.change("prune_task_retries", task_id=task_id)
        tx.change("prune_chain", task_id=task_id)
        tx.change("prune_reply", id=row["id"])
        tx.change("prune_task", id=row["id"])
    return len(rows), len(candidates)
