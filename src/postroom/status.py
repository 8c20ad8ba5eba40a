"""What a store holds, as its readers see it: one task, reply or story; the store's status,
stage by stage; pages of tasks, open waits and dead replies; a signal's receipt; ``postroom
info`` (settings, schema, counts, durability).

Nothing here writes; each function takes a reading transaction (the ``check_*`` functions
take none: they validate a call before it opens one).

Listings page by a key, not an offset. A page's ``next_cursor`` is the key of its last item
with the listing's name and filters, as canonical JSON behind a checksum, in URL-safe base64:
opaque to callers, and refused (``InvalidInput`` naming ``cursor``) when it is damaged or
edited, or comes back to another listing or with other filters. It grants nothing: a made-up
cursor can only start a page of what its listing returns to anyone who calls it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from postroom import chains, retention
from postroom.db import Tx
from postroom.db.dialect import Row
from postroom.errors import InvalidInput, NotFound
from postroom.inbox import principal_of
from postroom.models import (
    Attempt,
    AuthContext,
    CommittedEffect,
    Observation,
    Page,
    QueueStatus,
    Reply,
    ReplyState,
    Requeue,
    SignalReceipt,
    StoreStatus,
    Task,
    TaskState,
    TaskStory,
    Timeline,
    Wait,
    WaitState,
)
from postroom.settings import Settings
from postroom.transitions import reply_id_for
from postroom.validation import canonical_json, check_int, check_number, check_text

__all__ = [
    "MAX_PAGE",
    "PageRequest",
    "check_dead_reply_listing",
    "check_principal",
    "check_state",
    "check_task_listing",
    "check_wait_listing",
    "info",
    "list_dead_replies",
    "list_tasks",
    "list_waits",
    "observe",
    "receipt",
    "reply",
    "requeues",
    "store_status",
    "story",
    "task",
]

#: The most items a page holds (a listing's ``limit``).
MAX_PAGE = 1000

E = TypeVar("E", bound=StrEnum)
R = TypeVar("R")


def task(tx: Tx, task_id: str) -> Task:
    """The task ``task_id`` as stored; ``NotFound`` if there is none."""
    row = tx.one("task_get", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return Task.from_row(row)


def tasks_of(tx: Tx, task_ids: Sequence[str]) -> list[Task | None]:
    """The tasks ``task_ids`` as stored, in order (``None`` where there is none), read in as
    few round trips as the driver allows."""
    rows = tx.one_each("task_get", [{"task_id": task_id} for task_id in task_ids])
    return [None if row is None else Task.from_row(row) for row in rows]


def reply(tx: Tx, task_id: str) -> Reply | None:
    """The reply of task ``task_id``, or ``None`` while the task is not terminal."""
    row = tx.one("reply_get", task_id=task_id)
    return Reply.from_row(row) if row is not None else None


def requeues(tx: Tx, reply_id: str) -> list[Requeue]:
    """The recorded operator decisions to resend ``reply_id``, oldest first."""
    return [Requeue.from_row(row) for row in tx.all("requeues_for_reply", reply_id=reply_id)]


def story(tx: Tx, settings: Settings, task_id: str) -> TaskStory:
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
        waits=[Wait.from_row(wait) for wait in tx.all("waits_of_task", task_id=task_id)],
        chain=chains.find(tx, settings, row["root_task_id"] or task_id),
        side_effects=[CommittedEffect.from_row(effect)
                      for effect in tx.all("side_effects_of", task_id=task_id)])


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
    paused = {row["queue"] for row in tx.all("queues_paused")}
    for queue in paused:
        counts.setdefault(queue, {})
    return StoreStatus(
        at=tx.now, queues={queue: _queue_status(tx, queue, counts[queue], queue in paused)
                           for queue in sorted(counts)},
        open_waits=waits.get("open_waits", 0), dead_replies=dead,
        continuations_unconsumed=waits.get("continuations_unconsumed", 0))


def _queue_status(tx: Tx, queue: str, counts: Mapping[tuple[str, str], int],
                  paused: bool) -> QueueStatus:
    received = counts.get(("task", TaskState.PENDING.value), 0)
    # The head of the queue as a claim would take it (the same query, so the same rule).
    head = tx.one("claim_order", queue=queue, now=tx.now, limit=1) if received else None
    parked = counts.get(("reply", "parked"), 0)
    deliveries = {state: counts.get(("reply", state.value), 0) for state in ReplyState}
    deliveries[ReplyState.PENDING] += parked
    return QueueStatus(
        queue=queue, received=received,
        processing=counts.get(("task", TaskState.RUNNING.value), 0),
        outcomes={state: counts.get(("task", state.value), 0)
                  for state in TaskState if state.terminal},
        deliveries=deliveries, awaiting_endpoint=parked, paused=paused,
        oldest_pending_age=None if head is None else tx.now - float(head["available_at"]))


def observe(tx: Tx, since: float, limit: int) -> Observation:
    """The status, and the tasks created since ``since`` (at most ``limit``) with their
    attempts and deliveries, in one snapshot: see ``Observation``."""
    # (created_at >= since: after the last task created strictly before it.)
    rows = tx.all("observe_recent_tasks", since=since, limit=limit + 1,
                  **tx.tasks_walk(after=math.nextafter(since, -math.inf)))
    recent = [Timeline(task=Task.from_row(row), attempts=Attempt.list_from(row["history"]),
                       deliveries=Attempt.list_from(row["delivery_history"]))
              for row in rows[:limit]]
    before = tx.one("observe_pending_before", since=since)
    oldest: dict[str, float] = {}
    for row in tx.all("observe_oldest_undelivered"):  # one row per queue and part
        age = max(0.0, tx.now - float(row["oldest"]))
        oldest[row["queue"]] = max(age, oldest.get(row["queue"], 0.0))
    return Observation(
        status=store_status(tx), since=since, recent=recent, truncated=len(rows) > limit,
        pending_before=0 if before is None else int(before["n"]),
        oldest_pending_reply_age=oldest,
        waits={WaitState(state): n for state, n in _counts(tx, "wait_counts").items()})


# -- listings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PageRequest:
    """A validated listing call: the listing, its filters (as canonical JSON values: they are
    bound into its cursors), how many items a page holds, and the key of the last item of
    the page before (``None``: the first page)."""

    listing: str
    filters: dict[str, Any]
    limit: int
    after: tuple[Any, ...] | None


#: The key each listing pages by, as the types of its parts.
class _RowId:
    """The kind of a cursor's part that is a row's id inside the store (63 bits)."""


_KEYS: dict[str, tuple[type, ...]] = {
    "list_tasks": (float, _RowId),  # created_at, the task's id (newest first)
    "list_waits": (float, str, str, int),  # deadline, flow, step, generation
    "list_dead_replies": (float, _RowId),  # updated_at (when it died), the reply's id
}
#: A cursor longer than any postroom makes is refused before it is decoded.
_CURSOR_CHARS = 2048
_DIGEST_BYTES = 8


def check_state(value: object, states: type[E], field: str = "state") -> E:
    """A member of ``states``, given as the member itself, its value or its name."""
    if isinstance(value, states):
        return value
    if type(value) is str:
        for state in states:
            if value in (state.value, state.name):
                return state
    shown = repr(value) if type(value) is str and len(value) <= 64 else type(value).__name__
    raise InvalidInput(field, f"must be one of {', '.join(state.value for state in states)}, "
                              f"got {shown}")


def check_principal(settings: Settings, who: object) -> str:
    """A principal to read for: an ``AuthContext``'s (as ``watermark`` takes it) or a name."""
    if isinstance(who, AuthContext):
        return principal_of(settings, who)
    return check_text(who, "principal", max_bytes=settings.limits.text_bytes)


def check_task_listing(settings: Settings, *, state: object, queue: object, principal: object,
                       created_after: object, created_before: object, limit: object,
                       cursor: object) -> PageRequest:
    """Validate a ``list_tasks`` call: each filter is optional; the created bounds are
    exclusive."""
    text = settings.limits.text_bytes
    filters = {
        "state": None if state is None else check_state(state, TaskState).value,
        "queue": None if queue is None else check_text(queue, "queue", max_bytes=text),
        "principal": (None if principal is None
                      else check_text(principal, "principal", max_bytes=text)),
        "created_after": (None if created_after is None
                          else check_number(created_after, "created_after")),
        "created_before": (None if created_before is None
                           else check_number(created_before, "created_before")),
    }
    return _page_request("list_tasks", filters, limit, cursor)


def check_wait_listing(*, state: object, due_before: object, limit: object,
                       cursor: object, responder: object = None,
                       text_bytes: int = 128) -> PageRequest:
    """Validate a ``list_waits`` call: waiting generations (the only state listed: an ended
    one is history, read with ``Store.wait``), due before ``due_before`` if given, addressed
    to ``responder`` if given."""
    checked = check_state(state, WaitState)
    if checked is not WaitState.WAITING:
        raise InvalidInput("state", f"only waiting generations are listed, got "
                                    f"{checked.value!r}: read an ended one with Store.wait")
    filters = {"state": checked.value,
               "due_before": None if due_before is None else check_number(due_before,
                                                                          "due_before")}
    if responder is not None:
        filters["responder"] = check_text(responder, "responder", max_bytes=text_bytes)
    return _page_request("list_waits", filters, limit, cursor)


def check_dead_reply_listing(*, limit: object, cursor: object) -> PageRequest:
    """Validate a ``list_dead_replies`` call."""
    return _page_request("list_dead_replies", {}, limit, cursor)


def list_tasks(tx: Tx, request: PageRequest) -> Page[Task]:
    """A page of tasks, newest first by ``(created_at, id)`` (``id``: arrival order).

    Pending tasks are read from the partial index of the backlog and running ones from
    theirs (one per claim held, ordered among themselves); otherwise the order of creation
    is walked from the page's bound (``Dialect.ids_follow_creation``), testing each task
    against the filters.
    """
    filters = request.filters
    upper: tuple[float, int] = (math.inf, 0)
    if request.after is not None:
        upper = min(upper, (request.after[0], request.after[1]))
    if filters["created_before"] is not None:
        upper = min(upper, (filters["created_before"], 0))  # 0: below every id
    params: dict[str, Any] = {
        "upper_created": upper[0], "upper_id": upper[1],
        "lower_created": (-math.inf if filters["created_after"] is None
                          else filters["created_after"]),
        "queue": filters["queue"], "principal": filters["principal"],
        "limit": request.limit + 1}
    if filters["state"] == TaskState.PENDING.value:
        rows = tx.all("tasks_page_pending", **params)
    elif filters["state"] == TaskState.RUNNING.value:
        rows = tx.all("tasks_page_running", **params)
    else:
        rows = tx.all("tasks_page", state=filters["state"], **params, **tx.tasks_walk(
            after=filters["created_after"], before=filters["created_before"],
            **({} if request.after is None else {"below": int(request.after[1])})))
    return _page(request, rows, Task.from_row,
                 lambda row: (float(row["created_at"]), int(row["id"])))


def list_waits(tx: Tx, request: PageRequest) -> Page[Wait]:
    """A page of waiting generations, earliest deadline first (then by address)."""
    after = request.after if request.after is not None else (-math.inf, "", "", 0)
    due_before = request.filters["due_before"]
    responder = request.filters.get("responder")
    bounds = {"due_before": math.inf if due_before is None else due_before,
              "after_deadline": after[0], "after_flow": after[1], "after_step": after[2],
              "after_generation": after[3], "limit": request.limit + 1}
    rows = (tx.all("waits_page", **bounds) if responder is None
            else tx.all("waits_page_for", responder=responder, **bounds))
    return _page(request, rows, Wait.from_row, lambda row: (
        float(row["deadline"]), row["flow"], row["step"], int(row["generation"])))


def list_dead_replies(tx: Tx, request: PageRequest) -> Page[Reply]:
    """A page of dead replies, the longest dead first (by when they died, then arrival)."""
    after = request.after if request.after is not None else (-math.inf, 0)
    rows = tx.all("replies_dead_page", after_updated=after[0], after_id=after[1],
                  limit=request.limit + 1)
    return _page(request, rows, Reply.from_row,
                 lambda row: (float(row["updated_at"]), int(row["id"])))


def receipt(tx: Tx, principal: str, event_id: str) -> SignalReceipt | None:
    """The receipt of ``principal``'s signal ``event_id`` as stored, or ``None``."""
    row = tx.one("wait_receipt_get", principal=principal, event_id=event_id)
    return None if row is None else SignalReceipt.from_row(row)


def _page(request: PageRequest, rows: Sequence[Row], build: Callable[[Row], R],
          key: Callable[[Row], tuple[Any, ...]]) -> Page[R]:
    """The first ``limit`` rows as items; a cursor after the last if one more was found."""
    more = len(rows) > request.limit
    return Page(items=[build(row) for row in rows[:request.limit]],
                next_cursor=(_encode_cursor(request, key(rows[request.limit - 1])) if more
                             else None))


def _page_request(listing: str, filters: dict[str, Any], limit: object,
                  cursor: object) -> PageRequest:
    checked = check_int(limit, "limit", low=1, high=MAX_PAGE)
    after = None if cursor is None else _decode_cursor(cursor, listing, filters)
    return PageRequest(listing, filters, checked, after)


def _encode_cursor(request: PageRequest, key: tuple[Any, ...]) -> str:
    body = canonical_json({"after": list(key), "filters": _given(request.filters),
                           "listing": request.listing}).encode("utf-8")
    raw = hashlib.sha256(body).digest()[:_DIGEST_BYTES] + body
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode_cursor(cursor: object, listing: str, filters: dict[str, Any]) -> tuple[Any, ...]:
    if type(cursor) is not str:
        raise InvalidInput("cursor", f"must be a page's next_cursor (a string), got "
                                     f"{type(cursor).__name__}")
    unreadable = InvalidInput("cursor", "is not a cursor postroom made (damaged, truncated "
                                        "or edited): pass a page's next_cursor unchanged")
    if not cursor or len(cursor) > _CURSOR_CHARS:
        raise unreadable
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_",
                               validate=True)
        digest, body = raw[:_DIGEST_BYTES], raw[_DIGEST_BYTES:]
        if not hmac.compare_digest(digest, hashlib.sha256(body).digest()[:_DIGEST_BYTES]):
            raise unreadable
        document = json.loads(body)
    except (binascii.Error, ValueError):  # not base64, not ASCII, not JSON
        raise unreadable from None
    if not isinstance(document, dict) or set(document) != {"after", "filters", "listing"}:
        raise unreadable
    if document["listing"] != listing:
        raise InvalidInput("cursor", f"continues {document['listing']}, not {listing}: a "
                                     f"cursor continues only the listing that made it")
    if document["filters"] != _given(filters):
        raise InvalidInput("cursor", f"was made with other filters "
                                     f"({_shown(document['filters'])}) than this call's "
                                     f"({_shown(_given(filters))}): pass its first page's "
                                     f"filters again, or no cursor to start over")
    return _key(document["after"], _KEYS[listing], unreadable)


def _key(values: object, kinds: tuple[type, ...], unreadable: InvalidInput) -> tuple[Any, ...]:
    if not isinstance(values, list) or len(values) != len(kinds):
        raise unreadable
    key: list[Any] = []
    for value, kind in zip(values, kinds, strict=True):
        if not _fits(value, kind):
            raise unreadable
        key.append(float(value) if kind is float else value)
    return tuple(key)


def _fits(value: object, kind: type) -> bool:
    """Whether one part of a cursor's key has its type (a generation fits 32 bits)."""
    if kind is float:
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
    if kind is int:
        return type(value) is int and 0 <= value < 2**31
    if kind is _RowId:
        return type(value) is int and 0 <= value < 2**63
    return type(value) is kind


def _given(filters: Mapping[str, Any]) -> dict[str, Any]:
    """The filters a call gave (a cursor binds these; the others are ``None``)."""
    return {name: value for name, value in filters.items() if value is not None}


def _shown(filters: object) -> str:
    if not isinstance(filters, dict):
        return "?"
    return ", ".join(f"{name}={value!r}" for name, value in sorted(filters.items())) or "none"
