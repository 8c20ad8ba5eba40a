"""A Python client of the HTTP service (``postroom serve``): ``Client`` (sync) and
``AsyncClient`` (asyncio), and ``RemoteWorker``, which runs an ``App``'s handlers on a host
that has no database access.

    client = Client("http://127.0.0.1:8000", token)
    ack = client.submit("order-17", {"sku": "A1"}, deadline=time.time() + 3600)
    client.task(ack.task_id)["state"]

Every operation is described once (``_Api``: method, path, body, how to read the answer);
the two clients differ only in how they send it. Errors come back as postroom's own tree:
400 ``InvalidInput`` naming the field, 401/403 ``Unauthorized``, 404 ``NotFound``, 409
``Fenced`` (a lost lease) or ``Conflict``; anything else is a ``ServiceError`` with the
status and the problem document.

Retries are safe because every request names a stable identity: a submit its
``message_id`` (a resend is a duplicate), an outcome the task and the claim's fence (a
resend of one that committed is answered ``replay``), a signal its ``event_id``, a wait's
opening and a re-run their ``request_id`` (a new one made for each call that names none).
So a request whose answer is lost (a connection error, a timeout, a 502/503/504) is sent
again, ``retries`` times with a growing pause. The exceptions:

- a claim whose answer was lost leaves its tasks leased to nobody who knows: when the lease
  ends, each attempt is spent as a worker's crash spends it (the task runs again while it
  has attempts left, and fails once it has none);
- an operator's decision sent again after it took effect is answered as what it finds then
  (``cancelled: false``, ``paused: false``; a requeue is refused, the reply being pending).

A JSON document no store takes (a key that is not a string, NaN, a value of another type) is
refused before anything is sent, with the ``InvalidInput`` the store would raise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx

from postroom.errors import (
    BatchFailed,
    Conflict,
    Fenced,
    InvalidEnvelope,
    InvalidInput,
    NotApproved,
    NotFound,
    PayloadCollision,
    PostroomError,
    Unauthorized,
    WaitNotOpened,
)
from postroom.models import (
    Ack,
    Budget,
    Claim,
    Failed,
    Finished,
    OpenResult,
    Released,
    Settled,
    TaskState,
    WaitOpening,
)
from postroom.runtime.handlers import (
    App,
    Context,
    EventLoopThread,
    check_by_queue,
    execution_timeouts,
    handled_queues,
    outcome_of,
    refused_finish,
    timed_out,
)
from postroom.store import check_settlement
from postroom.validation import DEFAULT_LIMITS, check_json

__all__ = ["AsyncClient", "Client", "RemoteWorker", "ServiceError"]

_log = logging.getLogger("postroom.client")

#: Statuses whose request may not have been served: sent again.
_TRANSIENT = frozenset({502, 503, 504})


class ServiceError(PostroomError):
    """The service answered with a problem the client has no better class for."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")


def _error(response: httpx.Response, path: str) -> PostroomError:
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text[:200]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:200]}
    return _problem_error(response.status_code, problem, path)


#: The members of a problem that rebuild the store's own error (the service adds them).
_APPROVAL = ("action", "resource", "reason")
_COLLISION = ("identity", "collision")


def _texts(problem: dict[str, Any], names: Sequence[str]) -> bool:
    return all(type(problem.get(name)) is str for name in names)


def _opening(problem: dict[str, Any]) -> WaitOpening | None:
    """The ``WaitOpening`` a ``wait-not-opened`` problem describes, if it is whole."""
    try:
        return WaitOpening(result=OpenResult(problem["result"]), flow=str(problem["flow"]),
                           step=str(problem["step"]), generation=int(problem["generation"]))
    except (KeyError, TypeError, ValueError):
        return None


def _problem_error(status: int, problem: dict[str, Any], path: str) -> PostroomError:
    """The postroom error a problem document of ``status`` stands for."""
    stopped = _stopped_batch(status, problem, path)
    if stopped is not None:
        return stopped
    detail = str(problem.get("detail", ""))
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1]
    error: PostroomError
    if status == 400:
        field = str(problem.get("field", "body"))
        # The service's detail is the store's error text, which starts with the field.
        error = InvalidInput(field, detail.removeprefix(f"{field}: "))
    elif status == 403 and kind == "not-approved" and _texts(problem, _APPROVAL):
        error = NotApproved(*(str(problem[name]) for name in _APPROVAL))
    elif status in (401, 403):
        error = Unauthorized(detail)
    elif status == 404:
        error = NotFound(f"{path}: {detail}")
    elif status == 409 and kind == "lease-lost":
        error = Fenced(path, detail)
    elif status == 409 and kind == "payload-collision" and _texts(problem, _COLLISION):
        error = PayloadCollision(str(problem["identity"]), str(problem["collision"]))
    elif status == 409 and kind == "wait-not-opened" and (opening := _opening(problem)):
        error = WaitNotOpened(opening)
    elif status == 409:
        error = Conflict(detail)
    else:
        error = ServiceError(status, problem)
    error.__dict__["problem"] = problem  # the problem document, for a caller that wants it
    return error


def _stopped_batch(status: int, problem: dict[str, Any], path: str) -> BatchFailed | None:
    """The ``BatchFailed`` of an item-by-item batch the service stopped (its problem names
    ``failed_index`` and the committed prefix's ``acks``), as ``Store.receive_batch`` raises
    it: the item's own error, its field named within the item, is the cause."""
    index, acks = problem.get("failed_index"), problem.get("acks")
    if type(index) is not int or not isinstance(acks, list):
        return None
    item = {name: value for name, value in problem.items()
            if name not in ("failed_index", "acks")}
    if isinstance(item.get("field"), str):
        item["field"] = item["field"].removeprefix(f"envelopes[{index}].")
    cause = _problem_error(status, item, path)
    stopped = BatchFailed([_ack(ack) for ack in acks], index, cause)
    stopped.__cause__ = cause
    stopped.__dict__["problem"] = problem
    return stopped


@dataclass(frozen=True, slots=True)
class _Op:
    """One request and how to read its answer."""

    method: str
    path: str
    body: Any = None
    params: Mapping[str, Any] | None = None
    read: Callable[[Any], Any] = lambda answer: answer


def _given(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def _claiming(queues: Sequence[str] | None, limit: int, lease: float | None,
              per_queue: Mapping[str, int] | None, **more: Any) -> dict[str, Any]:
    """The body of a claim (``/v1/claims``, or a settlement's ``claim``)."""
    return _given(queues=None if queues is None else list(queues), limit=limit, lease=lease,
                  per_queue=dict(per_queue) if per_queue else None, **more)


def _ack(answer: Any) -> Ack:
    return Ack(task_id=answer["task_id"], duplicate=answer["duplicate"], ack=answer["ack"])


def _acks(answer: Any) -> list[Ack]:
    return [_ack(item) for item in answer["acks"]]


def _claims(answer: Any) -> list[Claim]:
    names = {item.name for item in fields(Claim)}
    return [Claim(**{"owner": "", **{key: value for key, value in item.items()
                                     if key in names}}) for item in answer["claims"]]


def _task(task_id: str, tail: str = "") -> str:
    return f"/v1/tasks/{quote(task_id, safe='')}{tail}"


def _document(value: Any, field: str, *, require_object: bool = False,
              error: type[InvalidInput] = InvalidInput) -> Any:
    """``value``, once it is a JSON document every store takes: checked as the store checks
    it, against SPEC §1's limits (which a store may lower, never raise), so that one no
    store takes is refused here naming its field, never changed by the encoding (a key
    ``1`` sent as ``"1"``) nor failing inside it."""
    check_json(value, field, limits=DEFAULT_LIMITS, require_object=require_object,
               error=error)
    return value


def _refused_payload(items: Sequence[Mapping[str, Any]]) -> tuple[int, InvalidInput] | None:
    """The first item of a batch whose payload no store takes, and why (an item without
    one is left to the service, which names the missing field)."""
    for index, item in enumerate(items):
        if "payload" not in item:
            continue
        try:
            _document(item.get("payload"), "payload", require_object=True,
                      error=InvalidEnvelope)
        except InvalidInput as exc:
            return index, exc
    return None


def _outcome_body(outcome: Finished | Failed | Released) -> dict[str, Any]:
    """An outcome as sent: of the claim, only its fence (the server keeps the rest). One no
    store could take is refused first, as ``Store.settle`` refuses it."""
    check_settlement(outcome)
    fence = outcome.claim.fence
    if isinstance(outcome, Finished):
        return {"fence": fence, "result": outcome.result,
                "follow_ups": [_given(**asdict(follow_up)) for follow_up in outcome.follow_ups],
                "waits": [_given(**asdict(wait)) for wait in outcome.waits],
                "side_effects": [asdict(effect) for effect in outcome.side_effects],
                "charge": outcome.charge}
    if isinstance(outcome, Failed):
        return {"fence": fence, "reason": outcome.reason, "retryable": outcome.retryable}
    return {"fence": fence, "delay": outcome.delay}


_VERBS = {Finished: "finish", Failed: "fail", Released: "release"}


def _settlement(outcomes: Sequence[Finished | Failed | Released]) -> dict[str, Any]:
    return {"outcomes": [_indexed_outcome(index, outcome)
                         for index, outcome in enumerate(outcomes)]}


def _indexed_outcome(index: int, outcome: Finished | Failed | Released) -> dict[str, Any]:
    try:
        body = _outcome_body(outcome)
    except InvalidInput as exc:  # named by its place, as the service names it
        raise InvalidInput(f"outcomes[{index}].{exc.field}", exc.problem) from None
    return {"task_id": outcome.claim.task_id, "outcome": _VERBS[type(outcome)], **body}


def _item_error(task_id: str, problem: dict[str, Any]) -> PostroomError:
    """The error of an item of a batch that the service refused on its own."""
    return _problem_error(int(problem.get("status", 500)), problem, _task(task_id))


def _settled(answer: Any) -> list[Settled]:
    """A settlement's answer, one ``Settled`` per outcome as ``Store.settle`` returns."""
    found: list[Settled] = []
    for item in answer["settled"]:
        task_id = item["task_id"]
        if "problem" in item:
            found.append(Settled(task_id=task_id, error=_item_error(task_id, item["problem"])))
        else:
            found.append(Settled(task_id=task_id, state=TaskState(item["state"]),
                                 openings=tuple(WaitOpening(**{
                                     **opening, "result": OpenResult(opening["result"])})
                                     for opening in item.get("waits", ()))))
    return found


def _renewed(claims: list[Claim], answer: Any) -> list[Claim | PostroomError]:
    """A renewal's answer: each claim with its new lease, or the error that refused it."""
    found: list[Claim | PostroomError] = []
    for claim, item in zip(claims, answer["renewed"], strict=True):
        if "problem" in item:
            found.append(_item_error(claim.task_id, item["problem"]))
        else:
            found.append(replace(claim, lease_until=item["lease_until"]))
    return found


class _Api:
    """Every operation of the API, described once. Each method returns what the service
    answers (on ``AsyncClient``, a coroutine of it)."""

    def _send(self, op: _Op) -> Any:
        raise NotImplementedError

    # agents
    def submit(self, message_id: str, payload: Mapping[str, Any], *, deadline: float,
               queue: str | None = None, max_attempts: int | None = None,
               correlation_id: str | None = None, not_before: float | None = None,
               priority: int | None = None, hops: int | None = None,
               parent_task_id: str | None = None,
               budget: Budget | Mapping[str, int] | None = None) -> Any:
        """Submit a task; an ``Ack`` once it is durably stored (``duplicate`` on a resend).
        The fields are ``Envelope``'s (the sender is the token's principal)."""
        return self._send(_Op("POST", "/v1/tasks", _given(
            message_id=message_id, deadline=deadline, queue=queue, payload=_document(
                dict(payload), "payload", require_object=True, error=InvalidEnvelope),
            max_attempts=max_attempts, correlation_id=correlation_id, not_before=not_before,
            priority=priority, hops=hops, parent_task_id=parent_task_id,
            budget=budget.to_dict() if isinstance(budget, Budget) else budget), read=_ack))

    def submit_batch(self, envelopes: Sequence[Mapping[str, Any]], *,
                     atomic: bool = False) -> Any:
        """Submit envelopes (dicts of ``submit``'s fields): one commit each, in order (a
        failure raises ``BatchFailed``, as ``Store.receive_batch`` does: the committed
        prefix's ``acks``, the failing ``index`` and, as its cause, the item's own error),
        or ``atomic``: all in one transaction, or none."""
        path = "/v1/batches/atomic" if atomic else "/v1/batches"
        items = [dict(item) for item in envelopes]
        refused = _refused_payload(items)
        if refused is None:
            return self._send(_Op("POST", path, {"envelopes": items}, read=_acks))
        index, error = refused
        if atomic or index == 0:  # nothing is stored: the item's error, named by its place
            if atomic:
                raise type(error)(f"envelopes[{index}].{error.field}", error.problem)
            raise BatchFailed([], 0, error) from error

        def stopped(answer: Any) -> Any:  # the prefix before the item is stored
            raise BatchFailed(_acks(answer), index, error) from error
        return self._send(_Op("POST", path, {"envelopes": items[:index]}, read=stopped))

    def task(self, task_id: str) -> Any:
        """One task (a dict of its stored fields)."""
        return self._send(_Op("GET", _task(task_id)))

    def story(self, task_id: str) -> Any:
        """A task's whole durable story (a dict)."""
        return self._send(_Op("GET", _task(task_id, "/story")))

    def reply(self, task_id: str) -> Any:
        """A task's reply (``NotFound`` while the task runs)."""
        return self._send(_Op("GET", _task(task_id, "/reply")))

    def tasks(self, **filters: Any) -> Any:
        """A page of tasks: ``{"items": [...], "next_cursor": ...}``; filters as
        ``Store.list_tasks``'s (``state``, ``queue``, ``principal``, ``created_after``,
        ``created_before``, ``limit``, ``cursor``)."""
        return self._send(_Op("GET", "/v1/tasks", params=_given(**filters)))

    # workers
    def claim(self, *, queues: Sequence[str] | None = None, limit: int = 1,
              lease: float | None = None, wait: float = 0.0,
              per_queue: Mapping[str, int] | None = None) -> Any:
        """Claim up to ``limit`` tasks of the worker's queues, waiting up to ``wait`` seconds
        for one: a list of ``Claim`` (empty if none came); of a queue named in
        ``per_queue``, at most that many."""
        return self._send(_Op("POST", "/v1/claims", _claiming(
            queues, limit, lease, per_queue, wait=wait), read=_claims))

    def renew(self, claim: Claim, *, lease: float | None = None) -> Any:
        """Extend a claim's lease: ``{"lease_until": ...}``; ``Fenced`` if it is lost."""
        return self._send(_Op("POST", _task(claim.task_id, "/renew"),
                              _given(fence=claim.fence, lease=lease)))

    def renew_many(self, claims: Sequence[Claim], *, lease: float | None = None) -> Any:
        """Extend many claims' leases with one request and one transaction: one answer per
        claim, in order, the claim with its new ``lease_until`` or the error that refused it
        on its own (``Fenced`` for a lost lease, ...)."""
        given = list(claims)
        body = {"claims": [{"task_id": claim.task_id, "fence": claim.fence} for claim in given],
                **_given(lease=lease)}
        return self._send(_Op("POST", "/v1/renewals", body,
                              read=lambda answer: _renewed(given, answer)))

    def settle(self, outcome: Finished | Failed | Released) -> Any:
        """Commit a handler's outcome (``Finished``, ``Failed`` or ``Released``)."""
        verb = _VERBS[type(outcome)]
        return self._send(_Op("POST", _task(outcome.claim.task_id, f"/{verb}"),
                              _outcome_body(outcome)))

    def settle_many(self, outcomes: Sequence[Finished | Failed | Released]) -> Any:
        """Commit many handlers' outcomes with one request and one transaction: a list of
        ``Settled``, in order, each committed (``state``) or refused on its own (``error``:
        ``Fenced`` for a lost lease, ...). An outcome that committed before (a retry after
        a lost answer) is answered with its state again."""
        return self._send(_Op("POST", "/v1/settlements", _settlement(outcomes),
                              read=_settled))

    def settle_and_claim(self, outcomes: Sequence[Finished | Failed | Released], limit: int,
                         *, queues: Sequence[str] | None = None,
                         lease: float | None = None,
                         per_queue: Mapping[str, int] | None = None) -> Any:
        """``settle_many``, and claim up to ``limit`` tasks in the same transaction (without
        waiting, ``per_queue`` as for ``claim``): ``(settled, claims)``."""
        body = {**_settlement(outcomes),
                "claim": _claiming(queues, limit, lease, per_queue)}
        return self._send(_Op("POST", "/v1/settlements", body,
                              read=lambda answer: (_settled(answer), _claims(answer))))

    def finish(self, claim: Claim, result: Any = None) -> Any:
        """Finish a claim with ``result``."""
        return self.settle(Finished(claim=claim, result=result))

    def fail(self, claim: Claim, reason: str, *, retryable: bool = True) -> Any:
        """Report a claim failed (retried while attempts remain and ``retryable``)."""
        return self.settle(Failed(claim=claim, reason=reason, retryable=retryable))

    def release(self, claim: Claim, *, delay: float = 0.0) -> Any:
        """Hand a claim back unfinished."""
        return self.settle(Released(claim=claim, delay=delay))

    # waits
    def open_wait(self, flow: str, step: str, expected_generation: int, deadline: float, *,
                  request_id: str | None = None, task_id: str | None = None,
                  responder: str | None = None) -> Any:
        """Open the next generation of a wait (``result``: ``opened``, ``stale``, ...). The
        call names its request (``request_id``, a new UUID if not given), so that a resend
        after a lost answer replays ``opened`` instead of answering ``stale``."""
        return self._send(_Op("POST", "/v1/waits", _given(
            flow=flow, step=step, expected_generation=expected_generation, deadline=deadline,
            request_id=request_id or uuid.uuid4().hex, task_id=task_id, responder=responder)))

    def waits(self, **filters: Any) -> Any:
        """A page of open waits (a human's: those addressed to it)."""
        return self._send(_Op("GET", "/v1/waits", params=_given(**filters)))

    def wait(self, flow: str, step: str, generation: int | None = None) -> Any:
        """One wait generation (the current one by default)."""
        return self._send(_Op("GET", f"/v1/waits/{quote(flow, safe='')}/"
                                     f"{quote(step, safe='')}",
                              params=_given(generation=generation)))

    def signal(self, event_id: str, flow: str, step: str, generation: int,
               value: Any = None) -> Any:
        """Answer a wait generation; the receipt (``result``: ``accepted``, ``replay``...)."""
        return self._send(_Op("POST", f"/v1/waits/{quote(flow, safe='')}/"
                                      f"{quote(step, safe='')}/{generation}/signal",
                              {"event_id": event_id, "value": _document(value, "value")}))

    # approvals
    def answer_approval(self, event_id: str, flow: str, step: str, generation: int, *,
                        approve: bool) -> Any:
        """As the addressed human, approve or deny the approval a wait generation asks for
        (the grant and the signal in one transaction); the receipt (``result``)."""
        return self._send(_Op("POST", f"/v1/waits/{quote(flow, safe='')}/"
                                      f"{quote(step, safe='')}/{generation}/approval",
                              {"event_id": event_id, "approve": approve}))

    def approval_requests(self, *, responder: str | None = None,
                          limit: int | None = None) -> Any:
        """The approval requests awaiting an answer (a human's: those addressed to it)."""
        return self._send(_Op("GET", "/v1/approval-requests",
                              params=_given(responder=responder, limit=limit)))

    def grant_approval(self, approval_id: str, *, action: str, resource: str, data: Any,
                       expires_at: float, requested_by: str, max_uses: int = 1) -> Any:
        """As a human, grant an approval (a dict of the stored approval)."""
        return self._send(_Op("POST", "/v1/approvals", {
            "approval_id": approval_id, "action": action, "resource": resource,
            "data": _document(data, "data"),
            "expires_at": expires_at, "requested_by": requested_by, "max_uses": max_uses}))

    def approvals(self, *, granted_by: str | None = None, limit: int | None = None) -> Any:
        """The newest approvals (a human's: those it granted)."""
        return self._send(_Op("GET", "/v1/approvals",
                              params=_given(granted_by=granted_by, limit=limit)))

    def approval(self, approval_id: str) -> Any:
        """One approval with its uses."""
        return self._send(_Op("GET", f"/v1/approvals/{quote(approval_id, safe='')}"))

    def revoke_approval(self, approval_id: str, *, reason: str) -> Any:
        """Revoke an approval: ``{"revoked": bool}``."""
        return self._send(_Op("POST", f"/v1/approvals/{quote(approval_id, safe='')}/revoke",
                              {"reason": reason}))

    # operators
    def cancel(self, task_id: str, *, reason: str = "cancelled") -> Any:
        """Cancel a task: ``{"cancelled": bool}``."""
        return self._send(_Op("POST", _task(task_id, "/cancel"), {"reason": reason}))

    def retry(self, task_id: str, *, reason: str, deadline: float | None = None,
              request_id: str | None = None) -> Any:
        """Run an ended task again as a new one. The call is idempotent: it names its
        request (``request_id``, a new UUID if not given), so that a resend after a lost
        answer gets the re-run the first one made."""
        return self._send(_Op("POST", _task(task_id, "/retry"), _given(
            reason=reason, deadline=deadline, request_id=request_id or uuid.uuid4().hex)))

    def retry_many(self, *, reason: str, request_id: str | None = None,
                   **filters: Any) -> Any:
        """Run again every ended task the filters name (``dry_run=True``: list them); like
        ``retry``, idempotent under its ``request_id``."""
        return self._send(_Op("POST", "/v1/retries", _given(
            reason=reason, request_id=request_id or uuid.uuid4().hex, **filters)))

    def status(self) -> Any:
        """Every queue's four stages."""
        return self._send(_Op("GET", "/v1/status"))

    def dead_replies(self, *, limit: int | None = None, cursor: str | None = None) -> Any:
        """A page of dead replies."""
        return self._send(_Op("GET", "/v1/replies/dead",
                              params=_given(limit=limit, cursor=cursor)))

    def requeue(self, reply_id: str, *, reason: str) -> Any:
        """Send a dead reply again (a recorded decision)."""
        return self._send(_Op("POST", f"/v1/replies/{quote(reply_id, safe='')}/requeue",
                              {"reason": reason}))

    def paused_queues(self) -> Any:
        """The paused queues."""
        return self._send(_Op("GET", "/v1/queues"))

    def pause(self, queue: str, *, reason: str) -> Any:
        """Pause a queue."""
        return self._send(_Op("POST", f"/v1/queues/{quote(queue, safe='')}/pause",
                              {"reason": reason}))

    def resume(self, queue: str) -> Any:
        """Resume a queue."""
        return self._send(_Op("POST", f"/v1/queues/{quote(queue, safe='')}/resume"))

    def audit(self) -> Any:
        """The store's invariants: ``{"ok": bool, "violations": [...]}``."""
        return self._send(_Op("GET", "/v1/audit"))

    def me(self) -> Any:
        """Who the token belongs to: name, role, queues."""
        return self._send(_Op("GET", "/v1/me"))


def _headers(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "user-agent": "postroom-client"}


def _final(answer: httpx.Response | httpx.TransportError, attempt: int, retries: int) -> bool:
    """Whether this attempt's answer stands (else the request is sent again): a lost
    connection and a 502/503/504 are retried while attempts remain."""
    if attempt >= retries:
        return True
    return isinstance(answer, httpx.Response) and answer.status_code not in _TRANSIENT


def _read(op: _Op, response: httpx.Response | httpx.TransportError) -> Any:
    if isinstance(response, httpx.TransportError):
        raise response
    if response.status_code >= 400:
        raise _error(response, op.path)
    return op.read(response.json())


def _pause(attempt: int, backoff: float) -> float:
    return float(backoff * 2 ** attempt)


class Client(_Api):
    """The API over one keep-alive connection pool (``httpx.Client``); use as a context
    manager or ``close()`` it. ``transport`` replaces httpx's (tests)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.2,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(token),
                                  timeout=timeout, transport=transport)
        self._retries = retries
        self._backoff = backoff

    @property
    def base_url(self) -> str:
        """The service's URL, as given."""
        return str(self._http.base_url)

    def _send(self, op: _Op) -> Any:
        attempt = 0
        while True:
            try:
                answer: httpx.Response | httpx.TransportError = self._http.request(
                    op.method, op.path, json=op.body, params=op.params)
            except httpx.TransportError as exc:
                answer = exc
            if _final(answer, attempt, self._retries):
                return _read(op, answer)
            time.sleep(_pause(attempt, self._backoff))
            attempt += 1

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Api):
    """``Client`` for asyncio: every method returns a coroutine (``await client.submit``)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.2,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token),
                                       timeout=timeout, transport=transport)
        self._retries = retries
        self._backoff = backoff

    async def _send(self, op: _Op) -> Any:
        attempt = 0
        while True:
            try:
                answer: httpx.Response | httpx.TransportError = await self._http.request(
                    op.method, op.path, json=op.body, params=op.params)
            except httpx.TransportError as exc:
                answer = exc
            if _final(answer, attempt, self._retries):
                return _read(op, answer)
            await asyncio.sleep(_pause(attempt, self._backoff))
            attempt += 1

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


#: The most tasks the service hands out, or takes outcomes of, in one request.
_MOST_PER_REQUEST = 100
#: The status of a request body over the service's limit.
_TOO_LARGE = 413

#: A handler's outcome, with the claim and context it ran under.
_Done = tuple[Claim, Context, Finished | Failed | Released | None]


def _awaited(running: concurrent.futures.Future[Any]) -> Any:
    """What a coroutine run by ``EventLoopThread.submit`` returned. Cancelled (by
    ``_abandon``, or by raising ``asyncio.CancelledError`` itself), it ends as a coroutine
    does in the local worker: with a ``CancelledError`` that is no failure (the future's own
    is an ``Exception``)."""
    try:
        return running.result()
    except concurrent.futures.CancelledError:
        raise asyncio.CancelledError from None


class RemoteWorker:
    """Runs ``app``'s handlers for the tasks a worker principal claims over HTTP.

    Up to ``concurrency`` handlers run at once, each on a thread of its own (``async def``
    ones all on one event loop, which the next ones share), as the local worker runs them
    (``Context``, ``PermanentFailure``, ``ctx.charge``, a handler's ``timeout=``: past it
    the handler is abandoned and its attempt fails as retryable; a plain function's thread
    cannot be stopped, so the tasks after it wait for a thread until it returns, their
    timeouts counting from when they start). One thread renews every held lease each
    third of it with one request (``renew_many``), and one commits the outcomes as they
    come, all those waiting with one request (``settle_many``), naming only each task and
    fence; a slot is free again once its outcome is committed. A lost lease abandons the
    work (``ctx.cancelled`` is set, a coroutine is cancelled): whatever it would commit is
    refused anyway. A finish no store could take (a result or a follow-up's payload that
    is not JSON as it is, a follow-up out of range; checked here as the store checks it,
    ``postroom.store.check_settlement``) or that the service refuses (a follow-up that
    collides, a wait that cannot open, an outcome the request was refused for) fails its
    attempt instead, as the local worker does, and costs the other outcomes nothing. A
    request that fails is sent again (outcomes name their claims, so a resend is a
    replay); one the service refuses as a whole (a revoked token) stops the worker and is
    raised by ``run`` or ``run_once``. Every queue it claims from needs a handler.

    ``run`` claims, up to ``batch`` tasks a request and as many as it has free slots, until
    ``stop()`` (then the handlers running get ``grace`` seconds before their claims are
    released, and tasks a claim brings after ``stop()`` are released at once, never
    started); ``run_once`` claims and works one round (for tests and scripts). As in the
    local worker's settings, ``queue_concurrency[queue]`` caps the tasks of ``queue`` held at
    once (each claim asks the service for no more than the cap leaves), and
    ``timeouts[queue]`` is the execution timeout of a handler that sets none of its own.
    """

    def __init__(self, client: Client, app: App, *, queues: Sequence[str] | None = None,
                 concurrency: int = 16, batch: int | None = None, lease: float = 30.0,
                 poll: float = 5.0, grace: float = 30.0,
                 queue_concurrency: Mapping[str, int] | None = None,
                 timeouts: Mapping[str, float] | None = None) -> None:
        if not 1 <= concurrency <= 1024:
            raise InvalidInput("concurrency", "must be 1 .. 1024")
        batch = min(concurrency, _MOST_PER_REQUEST) if batch is None else batch
        if not 1 <= batch <= _MOST_PER_REQUEST:
            raise InvalidInput("batch", f"must be 1 .. {_MOST_PER_REQUEST}")
        if type(grace) not in (int, float) or not 0 <= grace <= 86_400:
            raise InvalidInput("grace", f"must be a number of seconds in 0..86400, got "
                                        f"{grace!r}")
        self.client = client
        self.app = app
        self.queues = list(handled_queues(app, queues))
        caps, timeouts = dict(queue_concurrency or {}), dict(timeouts or {})
        check_by_queue(caps, timeouts, self.queues)
        self.queue_concurrency = caps
        self._timeouts = execution_timeouts(app, self.queues, timeouts)
        self.concurrency = concurrency
        self.batch = batch
        self.lease = lease
        self.poll = poll
        self.grace = grace
        self.settled: dict[str, int] = {"finish": 0, "fail": 0, "release": 0, "fenced": 0}
        self._stopping = threading.Event()
        self._slots = threading.Semaphore(concurrency)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a held task was settled
        self._held: dict[str, tuple[Claim, Context]] = {}
        self._refused: Exception | None = None
        self._loop: EventLoopThread | None = None
        self._coroutines: dict[str, concurrent.futures.Future[Any]] = {}
        self._ended: set[str] = set()  # tasks held whose attempt ended (see ``_ends_first``)
        self._reserved_of: Counter[str] = Counter()  # per capped queue: claims in flight

    def stop(self) -> None:
        """Stop claiming; ``run`` returns once the handlers running have ended and their
        outcomes are committed, or after ``grace`` seconds, releasing the claims still held
        then (handed back unfinished, their attempts given back, never marked done; a
        coroutine is cancelled, and what any of them ends with later is ignored)."""
        self._stopping.set()

    def run(self) -> None:
        """Claim and work until ``stop()``; returns once the tasks in hand are settled."""
        _log.info("remote worker started on %s at %s", ", ".join(self.queues),
                  self.client.base_url)
        try:
            with self._working(gathered=False) as work:
                while not self._stopping.is_set():
                    free = self._free_slots()
                    with self._capped(free) as (limit, caps):
                        claims = self._claim(limit, caps, wait=self.poll) if limit else []
                        if claims and self._stopping.is_set():  # stopped while it waited
                            self._hand_back(claims)
                            claims = []
                        for claim in claims:
                            work(claim)
                    for _ in range(free - len(claims)):
                        self._slots.release()
                    if free and not limit:  # every queue at its cap: wait for room
                        with self._changed:
                            self._changed.wait_for(
                                lambda: max(self._room().values()) > 0, timeout=self.poll)
        finally:
            self.close()
            _log.info("remote worker stopped: %s", self.settled)

    def run_once(self, *, wait: float = 0.0) -> int:
        """Claim up to ``batch`` tasks (waiting up to ``wait`` seconds), work them, at most
        ``concurrency`` at once, and commit their outcomes with one request; how many were
        claimed."""
        with self._working(gathered=True) as work, self._capped(self.batch) as (limit, caps):
            claims = self.client.claim(queues=self.queues, limit=limit, lease=self.lease,
                                       wait=wait, per_queue=caps) if limit else []
            for claim in claims:
                work(claim)
        return len(claims)

    @contextmanager
    def _working(self, *, gathered: bool) -> Iterator[Callable[[Claim], None]]:
        """A way to start handlers for claims, with a thread that renews their leases; on
        leaving, every started handler has ended (returned, or passed its execution timeout
        or, for ``run``, the grace period) and its outcome is settled (or given up).
        Outcomes are settled as they come, each batch claiming the next tasks for the slots
        it frees with the same request (``run``), or ``gathered`` and settled together at
        the end (``run_once``)."""
        outcomes: queue.SimpleQueue[_Done | None] = queue.SimpleQueue()
        ended, closing = threading.Event(), threading.Event()
        handlers = ThreadPoolExecutor(self.concurrency, thread_name_prefix="postroom-remote")

        def work(claim: Claim) -> None:
            self._start(claim, handlers, outcomes)

        renewer = threading.Thread(target=self._renew_loop, args=(ended,), daemon=True,
                                   name="postroom-remote-renewer")
        settler = None if gathered else threading.Thread(
            target=self._settle_loop, args=(outcomes, work, closing), daemon=True,
            name="postroom-remote-settler")
        for helper in (renewer, settler):
            if helper is not None:
                helper.start()
        try:
            yield work
        finally:
            closing.set()  # the settler claims no more
            if settler is None:
                with self._changed:  # a handler past its timeout is not waited for
                    self._changed.wait_for(lambda: self._ended.issuperset(self._held))
                handlers.shutdown(wait=False)
                outcomes.put(None)
                self._settle_loop(outcomes, None, closing)
            else:
                outlived = self._outlived_grace()
                for claim, context in outlived:  # handed back (their own ends are ignored)
                    if self._ends_first(claim, context, outcomes,
                                        (claim, Context(claim), Released(claim=claim))):
                        self._abandon(claim, context)
                with self._changed:
                    self._changed.wait_for(lambda: not self._held)
                outcomes.put(None)
                settler.join()
                handlers.shutdown(wait=not outlived)
            ended.set()
            renewer.join()
        if self._refused is not None:
            refused, self._refused = self._refused, None
            raise refused

    def _start(self, claim: Claim, handlers: ThreadPoolExecutor,
               outcomes: queue.SimpleQueue[_Done | None]) -> None:
        """Hold ``claim`` and run its handler on ``handlers``, its outcome put in
        ``outcomes``; past the handler's execution timeout, its failure instead."""
        context = Context(claim)
        with self._lock:
            self._held[claim.task_id] = (claim, context)
        seconds = self._timeouts.get(claim.queue)

        def run() -> None:
            # The timeout counts from here: a claim may wait for a thread (one a handler
            # abandoned still runs on) before its handler starts, as in the local worker.
            watch = None
            if seconds is not None:
                watch = threading.Timer(seconds, self._time_out,
                                        args=(claim, context, seconds, outcomes))
                watch.daemon = True
                watch.start()
            outcome = self._run(claim, context)
            if watch is not None:
                watch.cancel()
            self._ends_first(claim, context, outcomes, (claim, context, outcome))

        handlers.submit(run)

    def _ends_first(self, claim: Claim, context: Context,
                    outcomes: queue.SimpleQueue[_Done | None], done: _Done) -> bool:
        """Put ``done`` in ``outcomes`` if this is the first end of the attempt ``context``
        runs while it is held: its handler's, its execution timeout's or the grace
        period's (any later one is ignored); whether it was. Marked and queued under the
        lock, so whoever sees the attempt ended finds its outcome queued."""
        with self._lock:
            held = self._held.get(claim.task_id)
            if held is None or held[1] is not context or claim.task_id in self._ended:
                return False
            self._ended.add(claim.task_id)
            outcomes.put(done)
            self._changed.notify_all()
            return True

    def _time_out(self, claim: Claim, context: Context, seconds: float,
                  outcomes: queue.SimpleQueue[_Done | None]) -> None:
        """The handler of ``claim`` ran past its execution timeout: abandon it (its context
        cancelled, a coroutine cancelled) and fail the attempt as retryable."""
        if self._ends_first(claim, context, outcomes,
                            (claim, Context(claim), timed_out(claim, seconds))):
            _log.warning("handler of %s timed out after %gs: abandoned", claim.task_id, seconds)
            self._abandon(claim, context)

    def _outlived_grace(self) -> list[tuple[Claim, Context]]:
        """Wait up to ``grace`` seconds for the handlers still running to end and their
        outcomes to commit; the claims still held then."""
        with self._changed:
            self._changed.wait_for(lambda: not self._held, timeout=self.grace)
            return list(self._held.values())

    def _free_slots(self) -> int:
        """Wait up to ``poll`` seconds for a free slot, then take every free one, up to
        ``batch``; how many were taken."""
        if not self._slots.acquire(timeout=self.poll):
            return 0
        taken = 1
        while taken < self.batch and self._slots.acquire(blocking=False):
            taken += 1
        return taken

    @contextmanager
    def _capped(self, limit: int, leaving: Sequence[Claim] = ()
                ) -> Iterator[tuple[int, dict[str, int]]]:
        """How many tasks to claim now (at most ``limit``) and, per capped queue, how many
        at most: what its cap leaves of the tasks held (less ``leaving``, which the same
        request settles) and of the other claims in flight. Reserved for the block, which
        holds what it claimed before it ends."""
        if not self.queue_concurrency:
            yield limit, {}
            return
        with self._lock:
            caps = {queue: max(0, min(limit, room))
                    for queue, room in self._room(leaving).items()}
            if len(caps) == len(self.queues):
                limit = min(limit, sum(caps.values()))
            self._reserved_of.update(caps)
        try:
            yield limit, caps
        finally:
            with self._lock:
                self._reserved_of.subtract(caps)

    def _room(self, leaving: Sequence[Claim] = ()) -> dict[str, int]:
        """Under the lock: per capped queue, what its cap leaves of the tasks held (less
        ``leaving``) and of the claims in flight (negative past it)."""
        held = Counter(claim.queue for claim, _ in self._held.values())
        held.subtract(claim.queue for claim in leaving)
        return {queue: cap - held[queue] - self._reserved_of[queue]
                for queue, cap in self.queue_concurrency.items()}

    def _claim(self, limit: int, caps: Mapping[str, int], *, wait: float) -> list[Claim]:
        try:
            claims: list[Claim] = self.client.claim(queues=self.queues, limit=limit,
                                                    lease=self.lease, wait=wait,
                                                    per_queue=caps)
            return claims
        except (httpx.HTTPError, ServiceError) as exc:
            _log.warning("claiming failed; trying again: %s", exc)
        except PostroomError as exc:
            self._give_up(exc)
        self._stopping.wait(min(self.poll, 1.0))
        return []

    def _give_up(self, exc: Exception) -> None:
        """Stop on a refusal no resend can change (the token revoked, say), or a bug."""
        _log.error("the service refused the worker: %s", exc)
        self._refused = self._refused or exc
        self._stopping.set()

    # -- settling ---------------------------------------------------------------------------

    def _settle_loop(self, outcomes: queue.SimpleQueue[_Done | None],
                     start: Callable[[Claim], None] | None, closing: threading.Event) -> None:
        """Settle the outcomes as they come, all those waiting with one request, until the
        end (``None``). With ``start``, each batch's slots are free again once it is
        settled: the same request claims tasks for them, which ``start`` runs."""
        ended = False
        while not ended:
            batch: list[_Done] = []
            item = outcomes.get()
            while item is not None:
                batch.append(item)
                if len(batch) == _MOST_PER_REQUEST:
                    break
                try:
                    item = outcomes.get_nowait()
                except queue.Empty:
                    break
            ended = item is None
            if not batch:
                continue
            claiming = start is not None and not (closing.is_set() or self._stopping.is_set())
            with self._capped(min(len(batch), self.batch) if claiming else 0,
                              [claim for claim, _, _ in batch]) as (limit, caps):
                try:
                    claims = self._settle(batch, limit, caps)
                except Exception as exc:  # a bug: stop, rather than hold the slots forever
                    _log.exception("settling %d outcomes failed", len(batch))
                    self._give_up(exc)
                    claims = []
                if claims and self._stopping.is_set():  # stopped while it was sent
                    self._hand_back(claims)
                    claims = []
                for claim in claims:
                    assert start is not None
                    start(claim)  # in the slot a settled task left
            # Only now are the settled ones let go: the tasks held never run out while
            # their successors start, so no outcome can come after the end is announced.
            with self._changed:
                for held, _, _ in batch:
                    self._held.pop(held.task_id, None)
                    self._ended.discard(held.task_id)
                self._changed.notify_all()
            for _ in range(len(batch) - len(claims) if start is not None else 0):
                self._slots.release()

    def _settle(self, batch: list[_Done], claim: int, caps: Mapping[str, int]) -> list[Claim]:
        """Commit ``batch``'s outcomes (and claim up to ``claim`` tasks, ``caps`` per queue,
        with the first request): the tasks claimed."""
        sending: list[Finished | Failed | Released] = []
        for _, context, outcome in batch:
            if outcome is None or context.cancelled:
                self._count("fenced")
            else:
                sending.append(_sendable(outcome))
        claims: list[Claim] = []
        failures = 0
        while sending:
            try:
                results, claimed = self._commit(sending, claim, caps)
                claims, claim = claims + claimed, 0
            except (httpx.HTTPError, ServiceError) as exc:
                failures += 1
                _log.warning("committing outcomes failed; trying again: %s", exc)
                if failures > 5 and self._stopping.is_set():
                    break  # given up: their leases will run out
                time.sleep(min(5.0, 0.05 * 2 ** failures))
                continue
            except InvalidInput as exc:
                index = _outcome_named(exc, len(sending))
                if index is None:
                    self._give_up(exc)
                    break
                # The service refused the request for one outcome's content: that one is
                # settled as refused (a finish fails its attempt), the rest go again.
                refused = sending.pop(index)
                instead = self._after(refused, Settled(task_id=refused.claim.task_id,
                                                       error=exc))
                if instead is not None:
                    sending.insert(index, instead)
                continue
            except PostroomError as exc:
                self._give_up(exc)
                break
            sending = [instead for outcome, result in zip(sending, results, strict=True)
                       if (instead := self._after(outcome, result)) is not None]
        return claims

    def _hand_back(self, claims: list[Claim]) -> None:
        """Release ``claims``, which came after ``stop()``: never started, their attempts
        given back, as a claim still held at the end of the grace period."""
        self._settle([(claim, Context(claim), Released(claim=claim)) for claim in claims],
                     0, {})

    def _commit(self, sending: list[Finished | Failed | Released], claim: int,
                caps: Mapping[str, int]) -> tuple[list[Settled], list[Claim]]:
        """One request committing ``sending`` (and claiming up to ``claim`` tasks). Outcomes
        together too large for the service's body limit are sent in halves; one too large
        alone is refused as an input (so a finish fails its attempt instead)."""
        try:
            if claim:
                answer: tuple[list[Settled], list[Claim]] = self.client.settle_and_claim(
                    sending, claim, queues=self.queues, lease=self.lease, per_queue=caps)
                return answer
            return self.client.settle_many(sending), []
        except ServiceError as exc:
            if exc.status != _TOO_LARGE:
                raise
            if len(sending) == 1:
                return [Settled(task_id=sending[0].claim.task_id, error=InvalidInput(
                    "body", "the outcome is larger than the service takes"))], []
            half = len(sending) // 2
            first, claims = self._commit(sending[:half], claim, caps)
            rest, _ = self._commit(sending[half:], 0, caps)
            return first + rest, claims

    def _after(self, outcome: Finished | Failed | Released,
               result: Settled) -> Failed | None:
        """Count a committed outcome; for a refused finish, the failure to commit instead."""
        if result.error is None:
            self._count(_VERBS[type(outcome)])
        elif isinstance(result.error, Fenced):
            self._count("fenced")
        elif isinstance(outcome, Finished):
            return refused_finish(outcome, result.error)
        else:
            _log.warning("outcome of %s refused, its lease will run out: %s",
                         outcome.claim.task_id, result.error)
        return None

    def _count(self, verb: str) -> None:
        with self._lock:
            self.settled[verb] += 1

    # -- running and renewing -----------------------------------------------------------------

    def _run(self, claim: Claim, context: Context) -> Finished | Failed | Released | None:
        """Run the claim's handler (an ``async def`` one on the worker's event loop): its
        outcome, or ``None`` if it was abandoned (``Fenced``, cancelled with its lease, or
        ended by a ``BaseException`` such as ``SystemExit``, as in the local worker)."""
        spec = self.app.handler_for(claim.queue)
        assert spec is not None  # only the queues with a handler are claimed
        if context.cancelled:  # lost (or timed out) before a thread was free to start it
            return None
        call: Callable[[], Any]
        if spec.is_async:
            running = self._event_loop().submit(spec.function(claim.payload, context))
            with self._lock:
                self._coroutines[claim.task_id] = running
            if context.cancelled:  # lost meanwhile: ``_abandon`` found nothing to cancel
                running.cancel()
            call = partial(_awaited, running)
        else:
            call = partial(spec.function, claim.payload, context)
        try:
            return outcome_of(claim, context, call)
        except BaseException:  # cancelled (see ``_abandon``), or not an Exception
            return None
        finally:
            with self._lock:
                self._coroutines.pop(claim.task_id, None)

    def _event_loop(self) -> EventLoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = EventLoopThread("postroom-remote-event-loop")
            return self._loop

    def close(self) -> None:
        """Stop the event loop the ``async def`` handlers ran on (``run`` does this when it
        returns; ``run_once`` keeps it for the next round)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()

    def _renew_loop(self, ended: threading.Event) -> None:
        """Every third of the lease, renew every lease held with one request (per
        ``_MOST_PER_REQUEST``); a claim found lost is abandoned: its context is cancelled,
        and so is its coroutine."""
        while not ended.wait(self.lease / 3):
            with self._lock:
                held = [(claim, context) for claim, context in self._held.values()
                        if not context.cancelled]
            for start in range(0, len(held), _MOST_PER_REQUEST):
                part = held[start:start + _MOST_PER_REQUEST]
                try:
                    answers = self.client.renew_many([claim for claim, _ in part],
                                                     lease=self.lease)
                except (PostroomError, httpx.HTTPError) as exc:
                    _log.warning("renewing %d leases failed; trying again: %s", len(part), exc)
                    continue
                for (claim, context), answer in zip(part, answers, strict=True):
                    if isinstance(answer, (Fenced, NotFound)):
                        self._abandon(claim, context)
                    elif isinstance(answer, PostroomError):
                        _log.warning("renewing %s failed; trying again: %s", claim.task_id,
                                     answer)

    def _abandon(self, claim: Claim, context: Context) -> None:
        context.cancellation.set()
        with self._lock:
            running = self._coroutines.get(claim.task_id)
        if running is not None:
            running.cancel()


def _sendable(outcome: Finished | Failed | Released) -> Finished | Failed | Released:
    """``outcome``, or the failure that replaces a finish no store can take (a result or a
    follow-up's payload that is not JSON, say): checked here as the store checks it, so that
    it fails its own attempt, as in the local worker, and never the request carrying it."""
    if isinstance(outcome, Finished):
        try:
            check_settlement(outcome)
        except InvalidInput as exc:
            return refused_finish(outcome, exc)
    return outcome


def _outcome_named(exc: InvalidInput, count: int) -> int | None:
    """The index of the outcome a settlement was refused for (its ``field`` names it)."""
    found = re.match(r"outcomes\[([0-9]+)\]", exc.field)
    if found is None or int(found.group(1)) >= count:
        return None
    return int(found.group(1))
