"""What a store holds, as its readers see it: one task, reply or story; ``postroom info``
(settings, schema, counts, durability).

Nothing here writes; each function takes a reading transaction.
"""

from __future__ import annotations

from typing import Any

from postroom import retention
from postroom.db import Tx
from postroom.errors import NotFound
from postroom.models import Attempt, Reply, Requeue, Task, TaskStory, Wait
from postroom.settings import Settings
from postroom.transitions import reply_id_for

__all__ = ["info", "reply", "requeues", "story", "task"]


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
