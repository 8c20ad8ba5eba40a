"""The API's handlers and the schemas of what they take and answer.

Each handler takes a ``Call`` (its body and query already checked against the schemas its
route declares in ``postroom.http.app``) and returns an ``Answer``; it runs in a worker
thread and calls the store, which checks every limit again and owns every rule. What the
service adds is who may see and touch what (``postroom.principals``' ``may_*``):

- a record the caller may not see is answered exactly as a missing one (``NOT_FOUND``);
- a worker's outcome names only ``task_id`` and ``fence``: the claim is rebuilt from the
  stored task, never from fields the worker sends back, and must be held by this worker
  (``owner_of``) in a queue it is granted, else 409 ``lease-lost`` (or 404 outside its
  queues);
- names the store records as "who decided" (an operator's re-run, requeue, pause) are the
  caller's own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import quote

import postroom
from postroom import (
    ApprovalRequest,
    AttemptOutcome,
    Claim,
    Envelope,
    Failed,
    Fenced,
    Finished,
    FollowUp,
    InvalidInput,
    NotFound,
    OpenResult,
    OpenWait,
    PostroomError,
    Principal,
    Released,
    Role,
    Settlement,
    SideEffect,
    Task,
    TaskState,
    Unauthorized,
    Wait,
    WaitOpening,
)
from postroom.chains import cancel_answer
from postroom.http.problems import NOT_FOUND, Problem, problem_for
from postroom.http.routing import Answer, Call
from postroom.http.schemas import (
    Schema,
    array,
    boolean,
    integer,
    mapping,
    nullable,
    number,
    obj,
    text,
)
from postroom.principals import (
    may_answer,
    may_read_approval,
    may_read_task,
    may_read_wait,
    may_work,
)
from postroom.validation import MAX_BATCH as STORE_BATCH
from postroom.validation import MAX_CHAIN_BUDGET, is_decimal

__all__ = ["owner_of", "plain"]

R = TypeVar("R")

MAX_BATCH = 1000  # items in one HTTP batch (the store allows more; a request stays small)
MAX_CLAIMS = 100

# -- schemas --------------------------------------------------------------------------------

ANY: Schema = {}
OBJECT: Schema = {"type": "object"}
TASK_ID = text(64)
REASON = text(4096)
FENCE = integer(1, 2**62)
LEASE = number(exclusiveMinimum=0, maximum=86_400)

#: A chain root's budgets (``postroom.Budget``): each only lowers the store's setting.
BUDGET = obj({"hops": integer(1, MAX_CHAIN_BUDGET), "tasks": integer(1, MAX_CHAIN_BUDGET),
              "cost": integer(0, MAX_CHAIN_BUDGET)})
ENVELOPE = obj({
    "message_id": text(128), "payload": OBJECT, "deadline": number(),
    "max_attempts": integer(1, 10), "hops": integer(0, 2**31 - 1), "queue": text(),
    "correlation_id": text(), "parent_task_id": TASK_ID, "not_before": nullable(number()),
    "priority": integer(-10, 10), "budget": nullable(BUDGET),
}, required=("message_id", "payload", "deadline"))
BATCH = obj({"envelopes": array(ENVELOPE, max_items=MAX_BATCH, min_items=1)},
            required=("envelopes",))
ACK = obj({"ack": {"type": "string"}, "task_id": {"type": "string"},
           "duplicate": {"type": "boolean"}}, required=("ack", "task_id", "duplicate"))
ACKS = obj({"acks": array(ACK, max_items=MAX_BATCH)}, required=("acks",))
TASK = obj({"task_id": {"type": "string"}, "state": {"type": "string"}}, required=(
    "task_id", "state"), closed=False)
PAGE = obj({"items": {"type": "array"}, "next_cursor": nullable({"type": "string"})},
           required=("items", "next_cursor"))
STATES = {"enum": [state.value for state in TaskState], "type": "string"}
TASK_QUERY: Mapping[str, Schema] = {
    "state": STATES, "queue": text(), "principal": text(), "created_after": number(),
    "created_before": number(), "limit": integer(1, 1000), "cursor": text(4096),
}
REASON_BODY = obj({"reason": REASON}, required=("reason",))
OPTIONAL_REASON = obj({"reason": REASON})
CLAIM_BODY = obj({"queues": array(text(), max_items=64, min_items=1),
                  "limit": integer(1, MAX_CLAIMS), "lease": LEASE,
                  "wait": number(minimum=0, maximum=3600),
                  # The claimer's own cap per queue (a worker's per-queue concurrency).
                  "per_queue": mapping(integer(0, MAX_CLAIMS), max_properties=64)})
CLAIM = obj({"task_id": {"type": "string"}, "fence": {"type": "integer"},
             "payload": OBJECT}, required=("task_id", "fence", "payload"), closed=False)
CLAIMS = obj({"claims": array(CLAIM, max_items=MAX_CLAIMS)}, required=("claims",))
FOLLOW_UP = obj({"message_id": text(128), "payload": OBJECT, "queue": text(),
                 "deadline": number(), "max_attempts": integer(1, 10),
                 "correlation_id": text()}, required=("message_id", "payload"))
OPEN_WAIT = obj({"flow": text(), "step": text(), "deadline": number(),
                 "expected_generation": integer(0, 2**31 - 1), "request_id": text(),
                 "responder": text()}, required=("flow", "step", "deadline"))
APPROVAL_ID = text()
TERMS: Mapping[str, Schema] = {"action": text(), "resource": text(), "data": ANY}
ASK = obj({**TERMS, "expires_at": number(), "max_uses": integer(1, 10_000)},
          required=("action", "resource", "data", "expires_at"))
SIDE_EFFECT = obj({**TERMS, "approval_id": nullable(APPROVAL_ID)},
                  required=("action", "resource", "data"))
RENEW_BODY = obj({"fence": FENCE, "lease": LEASE}, required=("fence",))
RENEWALS_BODY = obj({"claims": array(obj({"task_id": TASK_ID, "fence": FENCE},
                                         required=("task_id", "fence")),
                                     max_items=MAX_CLAIMS, min_items=1),
                     "lease": LEASE}, required=("claims",))
RENEWED = obj({"renewed": array(obj({"task_id": {"type": "string"}}, required=("task_id",),
                                    closed=False), max_items=MAX_CLAIMS)},
              required=("renewed",))
# A finish carries as much as ``Store.finish`` takes (``MAX_BATCH`` of each): a handler's
# outcome commits alike through a local and a remote worker, within the body's size limit.
FINISH_BODY = obj({"fence": FENCE, "result": ANY,
                   "follow_ups": array(FOLLOW_UP, max_items=STORE_BATCH),
                   "waits": array(obj({**OPEN_WAIT["properties"], "approval": nullable(ASK),
                                       "children": boolean()},
                                      required=("flow", "step", "deadline")),
                                  max_items=STORE_BATCH),
                   "side_effects": array(SIDE_EFFECT, max_items=STORE_BATCH),
                   "charge": integer(0, MAX_CHAIN_BUDGET)}, required=("fence",))
FAIL_BODY = obj({"fence": FENCE, "reason": REASON, "retryable": boolean()},
                required=("fence", "reason"))
RELEASE_BODY = obj({"fence": FENCE, "delay": number(minimum=0, maximum=365 * 86_400)},
                   required=("fence",))
#: What each outcome of a settlement may carry beside its task, fence and kind.
OUTCOME_FIELDS: Mapping[str, tuple[str, ...]] = {
    "finish": ("result", "follow_ups", "waits", "side_effects", "charge"),
    "fail": ("reason", "retryable"),
    "release": ("delay",),
}
SETTLEMENT = obj({"task_id": TASK_ID, "fence": FENCE,
                  "outcome": {"type": "string", "enum": list(OUTCOME_FIELDS)},
                  **{name: schema for body in (FINISH_BODY, FAIL_BODY, RELEASE_BODY)
                     for name, schema in body["properties"].items() if name != "fence"}},
                 required=("task_id", "fence", "outcome"))
SETTLE_BODY = obj({"outcomes": array(SETTLEMENT, max_items=MAX_CLAIMS, min_items=1),
                   "claim": obj({name: CLAIM_BODY["properties"][name]
                                 for name in ("queues", "limit", "lease", "per_queue")})},
                  required=("outcomes",))
SETTLED = obj({"settled": array(obj({"task_id": {"type": "string"}}, required=("task_id",),
                                    closed=False), max_items=MAX_CLAIMS),
               "claims": array(CLAIM, max_items=MAX_CLAIMS)},
              required=("settled", "claims"))
OPEN_WAIT_BODY = obj({**OPEN_WAIT["properties"], "task_id": TASK_ID},
                     required=("flow", "step", "deadline"))
SIGNAL_BODY = obj({"event_id": text(), "value": ANY}, required=("event_id",))
ANSWER_BODY = obj({"event_id": text(), "approve": boolean()}, required=("event_id", "approve"))
GRANT_BODY = obj({**ASK["properties"], "approval_id": APPROVAL_ID, "requested_by": text()},
                 required=("approval_id", "action", "resource", "data", "expires_at",
                           "requested_by"))
APPROVAL_QUERY: Mapping[str, Schema] = {"granted_by": text(), "limit": integer(1, 1000)}
ASKED_QUERY: Mapping[str, Schema] = {"responder": text(), "limit": integer(1, 1000)}
WAIT_QUERY: Mapping[str, Schema] = {"due_before": number(), "responder": text(),
                                    "limit": integer(1, 1000), "cursor": text(4096)}
GENERATION_QUERY: Mapping[str, Schema] = {"generation": integer(1, 2**31 - 1)}
PAGE_QUERY: Mapping[str, Schema] = {"limit": integer(1, 1000), "cursor": text(4096)}
RETRY_BODY = obj({"reason": REASON, "deadline": number(), "request_id": text()},
                 required=("reason",))
RETRIES_BODY = obj({
    "reason": REASON, "state": {"type": "string", "enum": ["failed", "expired", "cancelled"]},
    "queue": text(), "created_after": number(), "created_before": number(),
    "dry_run": boolean(), "limit": integer(1, 1000), "request_id": text()},
    required=("reason",))
RESULT: Schema = {"type": "object"}

# -- what the store's records look like over HTTP -------------------------------------------


def plain(value: Any) -> Any:
    """A record as JSON values: dataclasses as objects, enums as their values."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: plain(getattr(value, item.name))
                for item in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(plain(key)): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    return value


def owner_of(call: Call) -> str:
    """The owner a worker's claims are recorded under."""
    return f"http:{call.principal.name}"


def _page(page: postroom.Page[Any]) -> Answer:
    return Answer(body={"items": [plain(item) for item in page.items],
                        "next_cursor": page.next_cursor})


_EMPTY = Answer(body={"items": [], "next_cursor": None})


def _own(call: Call, whose: str) -> dict[str, Any] | None:
    """A listing's query, held to the caller's own records unless it is an operator
    (``None``: it asked for another principal's, which it never sees)."""
    query = dict(call.query)
    if call.principal.role is not Role.OPERATOR:
        if query.get(whose, call.principal.name) != call.principal.name:
            return None
        query[whose] = call.principal.name
    return query


def _visible(call: Call, read: Callable[[], R], may: Callable[[Principal, R], bool]) -> R:
    """The record ``read`` returns if the caller ``may`` see it; else, as when there is
    none, ``NOT_FOUND``."""
    try:
        record = read()
    except NotFound:
        raise NOT_FOUND from None
    if not may(call.principal, record):
        raise NOT_FOUND
    return record


def _visible_task(call: Call, task_id: str) -> Task:
    return _visible(call, lambda: call.store.task(task_id), may_read_task)


def _visible_wait(call: Call, generation: int | None = None) -> Wait:
    return _visible(call, lambda: call.store.wait(call.params["flow"], call.params["step"],
                                                  generation), may_read_wait)


def _claim_of(call: Call) -> Claim:
    """The claim the calling worker holds on the path's task at the body's fence."""
    try:
        task: Task | None = call.store.task(call.params["task_id"])
    except NotFound:
        task = None
    return _holding(call, task, call.body["fence"])


def _holding(call: Call, task: Task | None, fence: int) -> Claim:
    """The claim the calling worker holds on ``task`` (as stored) at ``fence``, rebuilt
    from it: ``NOT_FOUND`` if there is none or it is outside its queues, ``Fenced`` if the
    worker does not hold it."""
    if task is None or not may_work(call.principal, task.queue):
        raise NOT_FOUND
    if (task.state is not TaskState.RUNNING or task.owner != owner_of(call)
            or task.fence != fence or task.lease_until is None):
        raise Fenced(task.task_id, f"not held by this worker at fence {fence}")
    return Claim(task_id=task.task_id, owner=task.owner, fence=task.fence,
                 attempt=task.attempts, max_attempts=task.max_attempts, payload=task.payload,
                 queue=task.queue, hops=task.hops, deadline=task.deadline,
                 lease_until=task.lease_until, principal=task.principal,
                 message_id=task.message_id, correlation_id=task.correlation_id,
                 requester=task.requester)


def _claim_json(claim: Claim) -> dict[str, Any]:
    return {"task_id": claim.task_id, "owner": claim.owner, "fence": claim.fence,
            "attempt": claim.attempt, "max_attempts": claim.max_attempts,
            "payload": claim.payload, "queue": claim.queue, "hops": claim.hops,
            "deadline": claim.deadline,
            "lease_until": claim.lease_until, "principal": claim.principal,
            "message_id": claim.message_id, "correlation_id": claim.correlation_id,
            "requester": claim.requester}


def _envelope(call: Call, body: Mapping[str, Any]) -> Envelope:
    fields = {name: body[name] for name in (
        "max_attempts", "hops", "queue", "correlation_id", "parent_task_id", "not_before",
        "priority", "budget") if name in body}
    return Envelope(message_id=body["message_id"], sender=call.principal.name,
                    payload=body["payload"], deadline=body["deadline"], **fields)


def _location(task_id: str) -> dict[str, str]:
    return {"location": f"/v1/tasks/{quote(task_id, safe='')}"}


# -- health ---------------------------------------------------------------------------------


def healthz(call: Call) -> Answer:
    """Whether the service runs (it does not look at the database)."""
    return Answer(body={"ok": True})


def readyz(call: Call) -> Answer:
    """Whether the service can reach its database."""
    try:
        call.store.paused_queues()
    except postroom.PostroomError as exc:
        raise Problem(503, "not-ready", "Not ready", type(exc).__name__,
                      headers={"retry-after": "1"}) from exc
    return Answer(body={"ok": True})


def whoami(call: Call) -> Answer:
    """The authenticated principal: its name, role and granted queues."""
    return Answer(body=call.principal.to_dict())


# -- agents: submitting and reading their tasks ---------------------------------------------


def submit(call: Call) -> Answer:
    """Submit a task: 202 once it is durably stored (a resend is a duplicate).

    The sender is the caller. The same ``message_id`` again answers the same task
    (``duplicate: true``); with other content it is 409 ``payload-collision`` and the stored
    task is untouched.
    """
    assert call.caller is not None
    ack = call.store.receive(call.caller.auth, _envelope(call, call.body))
    return Answer(status=202, body=ack.to_dict(), headers=_location(ack.task_id))


def submit_batch(call: Call) -> Answer:
    """Submit tasks one commit each, in order: on a failure, the committed prefix stands.

    A refusal answers the failing item's problem with ``failed_index`` and the ``acks`` of
    the items before it, which are stored: fix the item and send the rest again (resending
    the prefix answers duplicates, never new tasks).
    """
    assert call.caller is not None
    acks = call.store.receive_batch(call.caller.auth, [
        _envelope(call, item) for item in call.body["envelopes"]])
    return Answer(body={"acks": [ack.to_dict() for ack in acks]})


def submit_atomic(call: Call) -> Answer:
    """Submit tasks all together in one transaction, or none of them."""
    assert call.caller is not None
    acks = call.store.receive_atomic(call.caller.auth, [
        _envelope(call, item) for item in call.body["envelopes"]])
    return Answer(body={"acks": [ack.to_dict() for ack in acks]})


def list_tasks(call: Call) -> Answer:
    """A page of tasks, newest first (an agent sees only its own).

    Filters combine; pass ``next_cursor`` back as ``cursor`` with the same filters.
    """
    query = _own(call, "principal")
    return _page(call.store.list_tasks(**query)) if query is not None else _EMPTY


def get_task(call: Call) -> Answer:
    """One task as stored."""
    return Answer(body=plain(_visible_task(call, call.params["task_id"])))


def get_story(call: Call) -> Answer:
    """Everything durable about a task: attempts, reply, deliveries, requeues, waits."""
    task = _visible_task(call, call.params["task_id"])
    return Answer(body=plain(call.store.story(task.task_id)))


def get_reply(call: Call) -> Answer:
    """A task's reply (404 while the task is not terminal)."""
    task = _visible_task(call, call.params["task_id"])
    reply = call.store.reply(task.task_id)
    if reply is None:
        raise NOT_FOUND
    return Answer(body=plain(reply))


# -- workers: claims and their outcomes -----------------------------------------------------


def _granted(call: Call, queues: list[str] | None, field: str) -> list[str]:
    """The queues a claim names (all the caller is granted, if none): 403 naming the first
    that is not granted."""
    granted = call.principal.queues
    for index, queue in enumerate(queues if queues is not None else ()):
        if queue not in granted:
            raise Problem(403, "forbidden", "Forbidden",
                          f"queue {queue!r} is not granted to this worker",
                          field=f"{field}[{index}]")
    return list(queues) if queues is not None else list(granted)


def claim(call: Call) -> Answer:
    """Claim up to ``limit`` tasks of the caller's granted queues, waiting up to ``wait``
    seconds (bounded by the service) for one to come; of a queue named in ``per_queue``, at
    most that many."""
    body = call.body
    queues = _granted(call, body.get("queues"), "queues")
    limit = body.get("limit", 1)
    wait = min(float(body.get("wait", 0)), call.limits.max_poll)
    deadline = time.monotonic() + wait
    # Made before the first claim, so work announced while it runs wakes the first wait.
    waiter = call.store.waiter(queues) if wait > 0 else None
    while True:
        claims = call.store.claim_batch(owner_of(call), limit, queues=queues,
                                        lease=body.get("lease"),
                                        per_queue=body.get("per_queue"))
        left = deadline - time.monotonic()
        if claims or left <= 0 or waiter is None:
            return Answer(body={"claims": [_claim_json(item) for item in claims]})
        waiter.wait(min(left, 1.0))


def renew(call: Call) -> Answer:
    """Extend the lease of the caller's claim on a task (``fence`` names the claim)."""
    renewed = call.store.renew(_claim_of(call), lease=call.body.get("lease"))
    return Answer(body=_lease_json(renewed))


def renew_many(call: Call) -> Answer:
    """Extend the leases of many of the caller's claims in one transaction: a remote
    worker's renewal of every task it holds. Each item names its task and the claim's
    ``fence``, and is answered in its place: its new ``lease_until``, or its problem
    (``lease-lost``, ``not-found``), which costs the others nothing."""
    items = call.body["claims"]
    answers: dict[int, dict[str, Any]] = {}
    held: list[tuple[int, Claim]] = []
    stored = call.store.tasks_of(item["task_id"] for item in items)
    for index, (item, task) in enumerate(zip(items, stored, strict=True)):
        try:
            held.append((index, _holding(call, task, item["fence"])))
        except (Problem, PostroomError) as exc:
            answers[index] = _refused(item["task_id"], exc)
    renewed = call.store.renew_all([claim for _, claim in held], lease=call.body.get("lease"))
    for (index, claim), result in zip(held, renewed, strict=True):
        answers[index] = (_lease_json(result) if isinstance(result, Claim)
                          else _refused(claim.task_id, result))
    return Answer(body={"renewed": [answers[index] for index in range(len(items))]})


def _lease_json(claim: Claim) -> dict[str, Any]:
    return {"task_id": claim.task_id, "fence": claim.fence, "lease_until": claim.lease_until}


def _refused(task_id: str, error: Exception) -> dict[str, Any]:
    """The answer to an item of a batch that was refused on its own: its problem."""
    problem = error if isinstance(error, Problem) else problem_for(
        error if isinstance(error, PostroomError) else PostroomError(str(error)))
    return {"task_id": task_id, "problem": problem.document()}


#: What each outcome's attempt ended as, and the task's state it answers.
_ENDS = {
    "finish": {AttemptOutcome.DONE: TaskState.DONE},
    "fail": {AttemptOutcome.RETRY: TaskState.PENDING, AttemptOutcome.FAILED: TaskState.FAILED},
    "release": {AttemptOutcome.RELEASED: TaskState.PENDING},
}


def _outcome(call: Call, kind: str, commit: Callable[[Claim], Answer]) -> Answer:
    """Commit an outcome of the caller's claim; a retry of one that committed already (its
    answer was lost) answers it again, ``replay: true``, instead of ``lease-lost``."""
    try:
        return commit(_claim_of(call))
    except Fenced:
        replay = _replayed(call, call.params["task_id"], call.body["fence"], kind,
                           call.body.get("waits", ()))
        if replay is None:
            raise
        return Answer(body=replay)


def _replayed(call: Call, task_id: str, fence: int, kind: str,
              waits: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The answer to a ``kind`` outcome of the caller's claim at ``fence`` that already
    committed (``replay: true``, the state it left the task in and, for a finish, the
    ``waits`` it opened, as its first answer gave them), or ``None`` if none committed."""
    story = call.store.story(task_id)
    for attempt in story.attempts:
        if (attempt.fence == fence and attempt.owner == owner_of(call)
                and attempt.outcome in _ENDS[kind]):
            answer: dict[str, Any] = {"state": _ENDS[kind][attempt.outcome].value,
                                      "replay": True}
            if kind == "finish":
                # A committed finish opened each wait it asked for at the generation after
                # the one it expected; the task's story holds those it opened.
                opened = {(wait.flow, wait.step, wait.generation) for wait in story.waits}
                answer["waits"] = [plain(WaitOpening(
                    result=OpenResult.OPENED, flow=flow, step=step, generation=generation,
                    replay=True))
                    for flow, step, generation in (
                        (asked["flow"], asked["step"], asked.get("expected_generation", 0) + 1)
                        for asked in waits)
                    if (flow, step, generation) in opened]
            return answer
    return None


def _finishing(body: Mapping[str, Any]) -> dict[str, Any]:
    """A finish's follow-ups, waits, side effects and charge, as ``Store.finish`` takes
    them."""
    return {"follow_ups": [FollowUp(**item) for item in body.get("follow_ups", ())],
            "waits": [OpenWait(**{**item, "approval": None if item.get("approval") is None
                                  else ApprovalRequest(**item["approval"])})
                      for item in body.get("waits", ())],
            "side_effects": [SideEffect(**item) for item in body.get("side_effects", ())],
            "charge": body.get("charge", 0)}


def finish(call: Call) -> Answer:
    """Finish the caller's claim on a task with ``result``; its follow-ups, its waits (each
    may ask its responder for an ``approval``) and its declared ``side_effects`` commit with
    it: each side effect consumes a use of a human's approval, or the finish is refused 403
    ``not-approved`` and writes nothing; its ``charge`` (cost units) is charged to its
    chain's budget first. A retry after a lost answer is answered ``replay: true``."""
    finishing = _finishing(call.body)

    def commit(claim: Claim) -> Answer:
        openings = call.store.finish(claim, call.body.get("result"), **finishing)
        return Answer(body={"state": TaskState.DONE.value, "replay": False,
                            "waits": [plain(opening) for opening in openings]})

    return _outcome(call, "finish", commit)


def fail(call: Call) -> Answer:
    """Report the caller's claim on a task failed: retried after a backoff while attempts
    remain and ``retryable`` (default), else failed for good."""
    def commit(claim: Claim) -> Answer:
        state = call.store.fail(claim, call.body["reason"],
                                retryable=call.body.get("retryable", True))
        return Answer(body={"state": state.value, "replay": False})

    return _outcome(call, "fail", commit)


def release(call: Call) -> Answer:
    """Hand the caller's claim on a task back unfinished (no attempt is counted)."""
    def commit(claim: Claim) -> Answer:
        call.store.release(claim, delay=call.body.get("delay", 0.0))
        return Answer(body={"state": TaskState.PENDING.value, "replay": False})

    return _outcome(call, "release", commit)


def settle(call: Call) -> Answer:
    """Commit many outcomes of the caller's claims in one transaction: a remote worker's
    group commit. Each item names its task, the claim's ``fence`` and its ``outcome``:
    ``finish`` (with a finish's fields), ``fail`` (with a ``reason``) or ``release``. Each
    is fenced and atomic on its own: one that is refused is answered in its place with its
    problem (``lease-lost``, ``not-found``, ...), writes nothing and costs the others
    nothing; a retry of one that committed already is answered ``replay: true``. With
    ``claim``, the caller's next tasks are claimed in the same transaction, as ``/v1/claims``
    would claim them (without waiting): the slots these outcomes free, filled with one
    request."""
    items = call.body["outcomes"]
    wanted = call.body.get("claim")
    queues = _granted(call, wanted.get("queues"), "claim.queues") if wanted else []
    answers: dict[int, dict[str, Any]] = {}
    ready: list[tuple[int, Settlement]] = []
    stored = call.store.tasks_of(item["task_id"] for item in items)
    for index, (item, task) in enumerate(zip(items, stored, strict=True)):
        try:
            ready.append((index, _settlement(index, item, _holding(call, task, item["fence"]))))
        except (Problem, PostroomError) as exc:
            answers[index] = _not_settled(call, item, exc)
    outcomes = [outcome for _, outcome in ready]
    claims: list[Claim] = []
    if wanted:
        settled, claims = call.store.settle_and_claim(
            outcomes, owner_of(call), wanted.get("limit", 1), queues=queues,
            lease=wanted.get("lease"), per_queue=wanted.get("per_queue"))
    else:
        settled = call.store.settle(outcomes)
    for place, ((index, _), done) in enumerate(zip(ready, settled, strict=True)):
        if done.error is None:
            assert done.state is not None
            answers[index] = {"task_id": done.task_id, "state": done.state.value,
                              "replay": False,
                              "waits": [plain(opening) for opening in done.openings]}
        else:
            answers[index] = _not_settled(call, items[index],
                                          _renumbered(done.error, place, index))
    return Answer(body={"settled": [answers[index] for index in range(len(items))],
                        "claims": [_claim_json(claim) for claim in claims]})


def _settlement(index: int, item: Mapping[str, Any], claim: Claim) -> Settlement:
    """Item ``index`` of a settlement, of ``claim``, as the store takes it."""
    kind = item["outcome"]
    for name in item:
        if name not in ("task_id", "fence", "outcome", *OUTCOME_FIELDS[kind]):
            raise InvalidInput(f"outcomes[{index}].{name}", f"is not a field of a {kind}")
    if kind == "fail" and "reason" not in item:
        raise InvalidInput(f"outcomes[{index}].reason", "is required to fail a task")
    if kind == "finish":
        return Finished(claim=claim, result=item.get("result"), **_finishing(item))
    if kind == "fail":
        return Failed(claim=claim, reason=item["reason"],
                      retryable=item.get("retryable", True))
    return Released(claim=claim, delay=item.get("delay", 0.0))


def _not_settled(call: Call, item: Mapping[str, Any], error: Exception) -> dict[str, Any]:
    """The answer to an item that was not committed now: its replay, if the same outcome
    of the same claim committed before, else its problem."""
    if isinstance(error, Fenced):
        replay = _replayed(call, item["task_id"], item["fence"], item["outcome"],
                           item.get("waits", ()))
        if replay is not None:
            return {"task_id": item["task_id"], "waits": [], **replay}
    return _refused(item["task_id"], error)


def _renumbered(error: Exception, place: int, index: int) -> Exception:
    """``error`` as the store raised it for its item ``place``, naming the request's item
    ``index`` instead (the refused items were not sent to the store)."""
    was, now = f"outcomes[{place}]", f"outcomes[{index}]"
    if isinstance(error, InvalidInput) and error.field.startswith(was):
        return InvalidInput(now + error.field[len(was):], error.problem)
    if isinstance(error, Unauthorized) and str(error).startswith(was):
        return Unauthorized(now + str(error)[len(was):])
    return error


# -- waits and signals ----------------------------------------------------------------------


def open_wait(call: Call) -> Answer:
    """Open the next generation of a wait (a compare-and-set on the slot's generation)."""
    body = call.body
    opening = call.store.open_wait(
        body["flow"], body["step"], body.get("expected_generation", 0), body["deadline"],
        request_id=body.get("request_id"), task_id=body.get("task_id"),
        responder=body.get("responder"))
    return Answer(body=plain(opening))


def list_waits(call: Call) -> Answer:
    """A page of open waits, earliest deadline first (a human sees those addressed to it)."""
    query = _own(call, "responder")
    return _page(call.store.list_waits(**query)) if query is not None else _EMPTY


def get_wait(call: Call) -> Answer:
    """One generation of a wait (the current one unless ``generation`` is given)."""
    return Answer(body=plain(_visible_wait(call, call.query.get("generation"))))


def signal(call: Call) -> Answer:
    """Answer one generation of a wait addressed to the caller.

    The result is ``accepted``, ``too_late``, ``closed``, ``stale_generation``, ``replay``
    (the same ``event_id`` and value again) or ``conflict`` (the same ``event_id``, another
    value). An operator, who sees every wait, may answer one not opened yet: it is stored as
    an early signal (``unknown_wait``, SPEC §5); to anyone else such a wait is 404.
    """
    assert call.caller is not None
    generation = _generation(call.params["generation"])
    flow, step = call.params["flow"], call.params["step"]
    try:
        wait = _visible_wait(call, generation)
    except Problem as problem:
        if problem is not NOT_FOUND or call.principal.role is not Role.OPERATOR:
            raise
    else:
        if not may_answer(call.principal, wait):  # an operator, for a wait addressed to another
            raise Problem(403, "forbidden", "Forbidden",
                          "this wait adopts only the answer of the principal it is addressed to")
        flow, step, generation = wait.flow, wait.step, wait.generation
    receipt = call.store.signal(call.caller.auth, call.body["event_id"], flow, step, generation,
                                call.body.get("value"))
    return Answer(body=plain(receipt))


def answer_approval(call: Call) -> Answer:
    """The addressed human approves (``approve: true``) or denies the approval a wait
    generation asks for: the grant and the wait's signal commit in one transaction, so the
    flow resumes once. The receipt's ``result`` as ``signal``'s (a resend is ``replay`` and
    grants nothing again)."""
    assert call.caller is not None
    wait = _visible_wait(call, _generation(call.params["generation"]))
    receipt = call.store.answer_approval(call.caller.auth, call.body["event_id"], wait.flow,
                                         wait.step, wait.generation,
                                         approve=call.body["approve"])
    return Answer(body=plain(receipt))


def _generation(text_value: str) -> int:
    if not is_decimal(text_value) or len(text_value) > 10:
        raise InvalidInput("generation", "must be a positive integer")
    return int(text_value)


# -- approvals ------------------------------------------------------------------------------


def _visible_approval(call: Call) -> postroom.Approval:
    return _visible(call, lambda: call.store.approval(call.params["approval_id"]),
                    may_read_approval)


def grant_approval(call: Call) -> Answer:
    """Grant an approval as the calling human: ``action`` on ``resource`` carrying exactly
    ``data``, ``max_uses`` times (default 1) until ``expires_at``, for ``requested_by``. A
    resend of the same grant answers the stored approval; other terms under the same
    ``approval_id`` are 409 ``payload-collision``."""
    assert call.caller is not None
    body = dict(call.body)
    approval = call.store.grant_approval(call.caller.auth, body.pop("approval_id"), **body)
    return Answer(status=201, body=plain(approval))


def get_approval(call: Call) -> Answer:
    """One approval as stored, with its uses (a human sees those it granted)."""
    return Answer(body=plain(_visible_approval(call)))


def revoke_approval(call: Call) -> Answer:
    """Revoke an approval (its granter, or an operator): no use commits after this does
    (``revoked: false`` if it was revoked already)."""
    assert call.caller is not None
    approval = _visible_approval(call)
    revoked = call.store.revoke_approval(call.caller.auth, approval.approval_id,
                                         reason=call.body["reason"])
    return Answer(body={"approval_id": approval.approval_id, "revoked": revoked})


def list_approvals(call: Call) -> Answer:
    """The newest approvals first (a human's: those it granted)."""
    query = _own(call, "granted_by")
    found = call.store.list_approvals(**query) if query is not None else []
    return Answer(body={"items": [plain(item) for item in found], "next_cursor": None})


def approval_requests(call: Call) -> Answer:
    """The approval requests awaiting an answer, earliest deadline first (a human's: those
    addressed to it)."""
    query = _own(call, "responder")
    found = call.store.approval_requests(**query) if query is not None else []
    return Answer(body={"items": [plain(item) for item in found], "next_cursor": None})


# -- operators ------------------------------------------------------------------------------


def cancel(call: Call) -> Answer:
    """Cancel a pending or running task and, for a chain's root, every live task of its
    chain (``cancelled``: whether this call cancelled the task itself; an ended root whose
    chain it cancelled answers its ``state`` and ``chain_cancelled: true``)."""
    task_id = _visible_task(call, call.params["task_id"]).task_id
    acted = call.store.cancel(task_id, reason=call.body.get("reason", "cancelled"))
    return Answer(body=cancel_answer(task_id, acted, call.store.task(task_id).state))


def status(call: Call) -> Answer:
    """Every queue's four stages, counted apart: received, processing, outcomes, delivery."""
    return Answer(body=plain(call.store.status()))


def dead_replies(call: Call) -> Answer:
    """A page of dead replies, the longest dead first."""
    return _page(call.store.list_dead_replies(**call.query))


def requeue(call: Call) -> Answer:
    """Send a dead reply again: a recorded decision of the caller's, with its reason."""
    reply_id = call.params["reply_id"]
    call.store.requeue_reply(reply_id, operator=call.principal.name,
                             reason=call.body["reason"])
    return Answer(body={"reply_id": reply_id, "requeued": True})


def retry(call: Call) -> Answer:
    """Run a failed, expired or cancelled task again, as a new task linked to it."""
    task_id = _visible_task(call, call.params["task_id"]).task_id
    made = call.store.retry(task_id, operator=call.principal.name,
                            reason=call.body["reason"], deadline=call.body.get("deadline"),
                            request_id=call.body.get("request_id"))
    return Answer(status=201, body=plain(made), headers=_location(made.new_task_id))


def retry_many(call: Call) -> Answer:
    """Run again every failed, expired or cancelled task the filters name (``dry_run``:
    only list them)."""
    body = dict(call.body)
    found = call.store.retry_many(operator=call.principal.name, **body)
    key = "tasks" if body.get("dry_run") else "retries"
    return Answer(body={key: [plain(item) for item in found]})


def paused_queues(call: Call) -> Answer:
    """Every paused queue, with who paused it, when and why."""
    return Answer(body={"paused": [plain(item) for item in call.store.paused_queues()]})


def pause(call: Call) -> Answer:
    """Pause a queue for every host (``paused: false`` if it was paused already)."""
    queue = call.params["queue"]
    paused = call.store.pause_queue(queue, operator=call.principal.name,
                                    reason=call.body["reason"])
    return Answer(body={"queue": queue, "paused": paused})


def resume(call: Call) -> Answer:
    """Resume a paused queue (``resumed: false`` if it was not paused)."""
    queue = call.params["queue"]
    return Answer(body={"queue": queue, "resumed": call.store.resume_queue(queue)})


def audit(call: Call) -> Answer:
    """Check the store's invariants (SPEC §8): the violations found, none when all hold."""
    found = call.store.audit()
    return Answer(body={"ok": not found, "violations": [
        {"check": item.check, "identity": item.identity, "detail": item.detail}
        for item in found]})
