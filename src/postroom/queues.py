"""Queues under an operator's control: paused (none of their tasks claimed; running ones
finish), and limited (at most K of their tasks running at once across every host).

A limit is kept as K slot rows. A claim locks free slots (skipping those another claim holds,
where rows lock) and takes one for each task it hands out; a slot is free again as soon as
its task is no longer running at the fence it was claimed with, so finishing, failing,
releasing, expiring or losing a lease gives it back without a write of its own, and no
single row serializes the claims.
"""

from __future__ import annotations

from dataclasses import dataclass

from postroom.db import Tx, Write

__all__ = ["LIMIT", "PAUSE", "RESUME", "Paused", "free_slots", "limits", "pause", "paused",
           "resume", "set_limit"]

PAUSE = Write("queue.pause")
RESUME = Write("queue.resume")
LIMIT = Write("queue.limit")

#: The highest limit a queue may be given.
MAX_LIMIT = 10_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Paused:
    """A paused queue: who paused it, when and why."""

    queue: str
    operator: str
    reason: str
    paused_at: float


def pause(tx: Tx, queue: str, *, operator: str, reason: str) -> bool:
    """Pause ``queue``; ``False`` if it was paused already (the first record stands)."""
    return tx.change("queue_pause", queue=queue, operator=operator, reason=reason,
                     now=tx.now) > 0


def resume(tx: Tx, queue: str) -> bool:
    """Resume ``queue``; ``False`` if it was not paused. Its workers hear of it."""
    resumed = tx.change("queue_resume", queue=queue) > 0
    if resumed:
        tx.notify(queue)
    return resumed


def paused(tx: Tx) -> list[Paused]:
    """Every paused queue, by name."""
    return [Paused(queue=row["queue"], operator=row["operator"], reason=row["reason"],
                   paused_at=float(row["paused_at"])) for row in tx.all("queues_paused")]


def set_limit(tx: Tx, queue: str, running: int | None) -> None:
    """At most ``running`` tasks of ``queue`` at once (``None``: no limit).

    The tasks running now keep running (none is stopped) and take the free slots, so a new
    limit counts them: no new task is claimed while ``running`` or more run. If more than
    ``running`` run (a limit set or lowered below them), the ones beyond it hold no slot and
    run on, and a slot that frees waits for them to end: the count only falls until it is
    within the limit.
    """
    if running is None:
        tx.change("queue_limit_clear", queue=queue)
        return
    tx.change("queue_limit_set", queue=queue, running=running)
    tx.change_many("queue_slot_add", [{"queue": queue, "slot": slot}
                                      for slot in range(1, running + 1)])
    tx.change("queue_slots_trim", queue=queue, running=running)
    free = _unheld_slots(tx, queue, running)
    unseated = tx.all("queue_running_unseated", queue=queue, limit=max(1, len(free)))
    tx.change_many("queue_slot_take", [
        {"queue": queue, "slot": slot, "task_id": row["task_id"], "fence": int(row["fence"])}
        for slot, row in zip(free, unseated, strict=False)])
    tx.notify(queue)


def free_slots(tx: Tx, queue: str, want: int) -> list[int]:
    """Lock up to ``want`` slots of a limited queue that a claim may take now, for this
    transaction: those no running task holds, less one for each task that runs beyond the
    limit (holding none since the limit was set or lowered below the tasks running), so a
    slot that frees waits for them to end instead of letting more than the limit run."""
    beyond = len(tx.all("queue_running_unseated", queue=queue, limit=MAX_LIMIT))
    unheld = _unheld_slots(tx, queue, want + beyond)
    return unheld[beyond:]


def _unheld_slots(tx: Tx, queue: str, want: int) -> list[int]:
    """Lock up to ``want`` slots that no running task holds; those that a claim committed
    meanwhile took are left out (see ``queue_slots_held``)."""
    locked = [int(row["slot"]) for row in tx.all("queue_free_slots", queue=queue, limit=want)]
    if not locked:
        return []
    held = {int(row["slot"]) for row in tx.all("queue_slots_held", queue=queue)}
    return [slot for slot in locked if slot not in held]


def limits(tx: Tx) -> dict[str, int]:
    """Every limited queue and how many of its tasks may run at once."""
    return {row["queue"]: int(row["running"]) for row in tx.all("queue_limits_all")}
