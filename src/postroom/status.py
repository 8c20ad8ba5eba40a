"""What a store holds, as its readers see it: one task, reply or story; the store's status,
stage by stage; ``postroom info`` (settings, schema, counts, durability).

Nothing here writes; each function takes a reading transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from postroom import retention
from postroom.db import Tx
from postroom.errors import NotFound
from postroom.models import (
    Attempt,
    QueueStatus,
    Reply,
    ReplyState,
    Requeue,
    StoreStatus,
    Task,
    TaskState,
    TaskStory,
    Wait,
)
from postroom.settings import Settings
from postroom.transitions import reply_id_for

__all__ = [
    "info",
    "reply",
    "requeues",
    "store_status",
    "story",
    "task",
]


def task(tx: Tx, task_id: str) -> Task:
    """The task ``task_id`` as stored; ``NotFound`` if there is none."""
    row = tx.one("task_get", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return Task.from_row(row)


def reply(tx: Tx, task_id: str) -> Reply | None:
    """The reply of task ``task_id``, or ``None`` while the task is not terminal."""
    row = tx.one("reply_get", task_id=task_id)
    return Reply.from_row(row) if row is not None else None


def requeues(tx: Tx, reply_id: str) -> list[Requeue]:
    """The recorded operator decisions to resend ``reply_id``, oldest first."""
    return [Requeue.from_row(row) for row in tx.all("requeues_for_reply", reply_id=reply_id)]


def story(tx: Tx, task_id: str) -> TaskStory:
    """Everything durable about task ``task_id``; ``NotFound`` if there is no such task."""
    row = tx.one("task_get", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    found = tx.one("reply_get", task_id=task_id)
    return TaskStory(
        task=Task.from_row(row), attempts=Attempt.list_from(row["history"]),
        reply=None if found is None else Reply.from_row(found),
        deliveries=[] if found is None else Attempt.list_from(found["history"]),
        requeues=requeues(tx, reply_id_for(task_id)),
        waits=[Wait.from_row(wait) for wait in tx.all("waits_of_task", task_id=task_id)])


def info(tx: Tx, settings: Settings, *, schema_version: int, settings_from: str
         ) -> dict[str, Any]:
    """Settings, schema version, counts, the time high-water and the database settings that
    durability depends on, with a warning for each weak one.

    ``retention_seconds`` is the period the store publishes (``None`` until its first opener
    publishes one); ``earlier_retention_honoured`` the longer period it still keeps, and
    until when, for what it received before a shortening (``None`` if none).
    ``settings_from`` says whose the other settings shown are: they live in the processes
    that open the store, not in the database.
    """
    durability, warnings = tx.durability()
    published = retention.published(tx)
    clock = tx.one("clock_read")
    unconsumed = tx.one("continuations_unconsumed_count")
    honoured = None
    if published is None:
        warnings.append("no retention period is published yet: the store's next opener "
                        "publishes one")
    elif (running := published.floor(tx.now)) is not None and running[0] > published.value:
        honoured = {"seconds": running[0], "until": running[1]}
    return {
        "dialect": tx.backend,
        "schema_version": schema_version,
        "settings_from": settings_from,
        "retention_seconds": None if published is None else published.value,
        "earlier_retention_honoured": honoured,
        "lease_seconds": settings.lease,
        "dispatch_lease_seconds": settings.dispatch_lease,
        "max_hops": settings.max_hops,
        "delivery_budget": settings.delivery_budget,
        "time_high_water": float(clock["high_water"]) if clock is not None else None,
        "tasks": _counts(tx, "task_counts"),
        "replies": _counts(tx, "reply_counts"),
        "waits": _counts(tx, "wait_counts"),
        "continuations_unconsumed": int(unconsumed["n"]) if unconsumed is not None else 0,
        "durability": durability,
        "warnings": warnings,
    }


def _counts(tx: Tx, query: str) -> dict[str, int]:
    return {row["state"]: int(row["n"]) for row in tx.all(query)}


# -- the store's status -------------------------------------------------------------------------


def store_status(tx: Tx) -> StoreStatus:
    """Every queue's work stage by stage, the open waits, the dead replies and the
    continuations left to resume, in one snapshot.

    Live counts walk the partial indexes of live rows and outcomes come from the cumulative
    counts, so the cost follows the live work and the number of queues, not the history.
    """
    counts: dict[str, dict[tuple[str, str], int]] = {}
    dead = 0
    for row in (*tx.all("status_live_counts"), *tx.all("status_cumulative_counts")):
        kind, state, n = row["kind"], row["state"], int(row["n"])
        if (kind, state) == ("reply", ReplyState.DEAD.value):
            dead += n
        if row["queue"] is not None:  # a reply written before replies knew their queue
            of_queue = counts.setdefault(row["queue"], {})
            of_queue[kind, state] = of_queue.get((kind, state), 0) + n
    waits = {row["name"]: int(row["n"]) for row in tx.all("status_wait_counts")}
    return StoreStatus(
        at=tx.now, queues={queue: _queue_status(tx, queue, counts[queue])
                           for queue in sorted(counts)},
        open_waits=waits.get("open_waits", 0), dead_replies=dead,
        continuations_unconsumed=waits.get("continuations_unconsumed", 0))


def _queue_status(tx: Tx, queue: str, counts: Mapping[tuple[str, str], int]) -> QueueStatus:
    received = counts.get(("task", TaskState.PENDING.value), 0)
    # The head of the queue as a claim would take it (the same query, so the same rule).
    head = tx.one("claim_head", queue=queue, now=tx.now) if received else None
    return QueueStatus(
        queue=queue, received=received,
        processing=counts.get(("task", TaskState.RUNNING.value), 0),
        outcomes={state: counts.get(("task", state.value), 0)
                  for state in TaskState if state.terminal},
        deliveries={state: counts.get(("reply", state.value), 0) for state in ReplyState},
        oldest_pending_age=None if head is None else tx.now - float(head["available_at"]))
