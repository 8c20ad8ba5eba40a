"""Periodic schedules: one task per period of a cron expression, across every host.

A period begins at each fire time of the schedule's cron expression (``postroom.cron``) and
lasts until the next one. A *round* (``enqueue_due``; every worker runs one about every
second) locks the schedules whose next period has begun (``SKIP LOCKED`` on PostgreSQL, so
hosts share them out; SQLite has one writer) and, for each, in the transaction that moves
its ``next_at`` on, enqueues the period's task through the inbox's own receive rule. The
task's identity is the schedule's (principal ``schedule:<name>``) and the period's start
(message_id, ISO 8601 UTC): a host that enqueues the same period again, whatever it raced
with, gets a duplicate, never a second task.

Missed periods. A round at time ``now`` finds the periods that began since the last one it
handled. If only one did (the period in progress), it is enqueued, however late in its
period the round comes. If more did, at least one whole period passed without its task
(every host was down, or the schedule was paused): with ``missed=once`` the latest one (the
period in progress) is enqueued, once, and the earlier ones are dropped; with ``skip`` none
is enqueued, and the next task is the next period's. Either way they all count as handled:
nothing backfills them later.

A period's task has the schedule's queue, payload, priority and max_attempts, and the
deadline ``period start + ttl``; without a ``ttl``, the next period's start (a period's work
is due before the next period's begins). Its reply goes to the principal
``schedule:<name>``: it waits in the outbox unless that principal is given an endpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from postroom import log
from postroom.cron import Cron, parse_cron
from postroom.db import Tx, Write
from postroom.errors import Conflict, InvalidInput, NotFound
from postroom.inbox import store_message
from postroom.models import Ack, Missed, Periodic
from postroom.settings import Settings
from postroom.validation import (
    PRIORITY_LIMIT,
    SCHEDULED,
    check_envelope,
    check_int,
    check_json,
    check_number,
    check_text,
)

__all__ = ["ADD", "ENQUEUE", "PAUSE", "REMOVE", "RESUME", "Definition", "add", "check",
           "enqueue_due", "get", "listed", "period_key", "remove", "set_paused"]

ADD = Write("schedule.add")
PAUSE = Write("schedule.pause")
RESUME = Write("schedule.resume")
REMOVE = Write("schedule.remove")
ENQUEUE = Write("schedule.enqueue")

#: The longest ``ttl`` a schedule may give its tasks (a year).
MAX_TTL = 366 * 86_400.0

_log = log.get("schedules")


@dataclass(frozen=True, kw_only=True, slots=True)
class Definition:
    """A checked schedule definition: what re-adding a schedule is compared by."""

    name: str
    cron: str  # normalized: fields separated by one space
    zone: str | None
    queue: str
    payload: str  # canonical JSON object
    priority: int
    max_attempts: int
    ttl: float | None
    missed: str


def check(settings: Settings, *, name: object, cron: object, zone: object, queue: object,
          payload: object, priority: object, max_attempts: object, ttl: object,
          missed: object) -> Definition:
    """Validate a schedule's definition; ``InvalidInput`` naming the field."""
    limits = settings.limits
    checked_name = check_text(name, "name", max_bytes=limits.text_bytes - len(SCHEDULED))
    parsed = parse_cron(cron, zone)
    if ttl is not None:
        seconds = check_number(ttl, "ttl")
        if not 0 < seconds <= MAX_TTL:
            raise InvalidInput("ttl", f"must be in (0, {MAX_TTL:g}] seconds, got {ttl!r}")
    policies = [policy.value for policy in Missed]
    if type(missed) is not str or missed not in policies:
        raise InvalidInput("missed", f"must be one of {', '.join(policies)}, got {missed!r}")
    return Definition(
        name=checked_name, cron=parsed.expression, zone=parsed.zone,
        queue=check_text(queue, "queue", max_bytes=limits.text_bytes),
        payload=check_json(payload, "payload", limits=limits, require_object=True),
        priority=check_int(priority, "priority", low=-PRIORITY_LIMIT, high=PRIORITY_LIMIT),
        max_attempts=check_int(max_attempts, "max_attempts", low=1, high=limits.max_attempts),
        ttl=None if ttl is None else float(seconds), missed=missed)


def add(tx: Tx, definition: Definition, *, operator: str, replace: bool) -> Periodic:
    """Add the schedule; the same definition again changes nothing, another one is a
    ``Conflict`` unless ``replace`` (then the periods it handled stay handled)."""
    cron = parse_cron(definition.cron, definition.zone)
    fields = asdict(definition)
    fields["schedule"] = fields.pop("name")
    while True:
        row = tx.one("schedule_get_locked", schedule=definition.name)
        if row is None:
            if tx.change("schedule_insert", next_at=cron.next_after(tx.now), operator=operator,
                         now=tx.now, **fields):
                tx.log(_log, logging.INFO, "schedule added", schedule=definition.name,
                       operator=operator)
                return get(tx, definition.name)
            continue  # another host added it meanwhile: compare with theirs
        if _definition(row) == definition:
            return Periodic.from_row(row)
        if not replace:
            raise Conflict(f"schedule {definition.name!r} exists with another definition "
                           f"({row['cron']!r} on queue {row['queue']!r}); replace it to "
                           f"change it (replace=True; --replace on the command line)")
        since = row["last_period"] if row["last_period"] is not None else tx.now
        tx.change("schedule_replace", next_at=cron.next_after(float(since)), operator=operator,
                  now=tx.now, **fields)
        tx.log(_log, logging.INFO, "schedule replaced", schedule=definition.name,
               operator=operator)
        return get(tx, definition.name)


def get(tx: Tx, name: str) -> Periodic:
    """The schedule ``name``; ``NotFound`` if there is none."""
    row = tx.one("schedule_get", schedule=name)
    if row is None:
        raise NotFound(f"no schedule {name!r}")
    return Periodic.from_row(row)


def listed(tx: Tx) -> list[Periodic]:
    """Every schedule, by name."""
    return [Periodic.from_row(row) for row in tx.all("schedules_all")]


def set_paused(tx: Tx, name: str, *, paused: bool, operator: str) -> bool:
    """Pause or resume ``name``; ``False`` if it already was; ``NotFound`` if none.

    A resumed schedule's next round applies its missed policy to the periods its pause let
    pass: resuming never backfills more than the policy says.
    """
    changed = tx.change("schedule_set_paused", schedule=name, paused=int(paused),
                        operator=operator, now=tx.now) > 0
    if not changed:
        get(tx, name)
    else:
        tx.log(_log, logging.INFO, "schedule paused" if paused else "schedule resumed",
               schedule=name, operator=operator)
    return changed


def remove(tx: Tx, name: str) -> bool:
    """Forget ``name`` (its tasks stay as they are); ``False`` if there was none."""
    removed = tx.change("schedule_remove", schedule=name) > 0
    if removed:
        tx.log(_log, logging.INFO, "schedule removed", schedule=name)
    return removed


def due(tx: Tx) -> bool:
    """Whether a round would find a schedule whose next period has begun."""
    return tx.one("schedules_due_any", now=tx.now) is not None


def enqueue_due(tx: Tx, settings: Settings, *, limit: int) -> list[Ack]:
    """One round: up to ``limit`` due schedules, each handled as the module says. Returns
    the ACK of each period's task this round enqueued (``duplicate`` if it was already
    stored)."""
    names = [row["name"] for row in tx.all("schedules_due", now=tx.now, limit=limit)]
    tx.catch_up_time()
    acks: list[Ack] = []
    for name in names:
        # Asked again: under READ COMMITTED the locking statement chose from an older
        # snapshot than the lock it waited for.
        row = tx.one("schedule_get", schedule=name)
        if row is None or row["paused"] or float(row["next_at"]) > tx.now:
            continue
        ack = _handle(tx, settings, row)
        if ack is not None:
            acks.append(ack)
    return acks


def _handle(tx: Tx, settings: Settings, row: Any) -> Ack | None:
    cron = parse_cron(row["cron"], row["zone"])
    first = float(row["next_at"])
    latest = cron.latest(first, tx.now)  # None: only the first one has begun
    period = first if latest is None else latest
    enqueue = latest is None or row["missed"] == Missed.ONCE
    ack = _enqueue(tx, settings, row, cron, period) if enqueue else None
    advanced = tx.change(
        "schedule_advance", schedule=row["name"], expected=first, last_period=period,
        last_key=period_key(period) if ack is not None else None,
        last_task_id=ack.task_id if ack is not None else None,
        next_at=cron.next_after(period))
    if advanced != 1:  # the row is locked (or SQLite's one writer): a broken invariant
        raise Conflict(f"schedule {row['name']!r} moved on while this round held it")
    tx.log(_log, logging.INFO if enqueue else logging.WARNING,
           "schedule enqueued" if enqueue else "schedule skipped missed periods",
           schedule=row["name"], period=period_key(period), late=round(tx.now - period, 3),
           missed=latest is not None, task_id=ack.task_id if ack is not None else None)
    return ack


def _enqueue(tx: Tx, settings: Settings, row: Any, cron: Cron, period: float) -> Ack:
    ttl = row["ttl"]
    sender = SCHEDULED + row["name"]
    fields = {"message_id": period_key(period), "sender": sender,
              "payload": json.loads(row["payload"]),
              "deadline": period + float(ttl) if ttl is not None else cron.next_after(period),
              "max_attempts": int(row["max_attempts"]), "queue": row["queue"],
              "priority": int(row["priority"])}
    return store_message(tx, settings, check_envelope(sender, fields, limits=settings.limits))


def period_key(period: float) -> str:
    """A period's part of its task's identity: its start, ISO 8601 UTC to the second."""
    return datetime.fromtimestamp(period, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _definition(row: Any) -> Definition:
    return Definition(name=row["name"], cron=row["cron"], zone=row["zone"], queue=row["queue"],
                      payload=row["payload"], priority=int(row["priority"]),
                      max_attempts=int(row["max_attempts"]),
                      ttl=None if row["ttl"] is None else float(row["ttl"]),
                      missed=row["missed"])
