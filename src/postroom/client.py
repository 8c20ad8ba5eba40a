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
resend of one that committed is answered ``replay``), a signal its ``event_id``. So a
request whose answer is lost (a connection error, a timeout, a 502/503/504) is sent again,
``retries`` times with a growing pause. One exception: a claim whose answer was lost leaves
its tasks leased to nobody who knows; they return to the queue when the lease ends.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import quote

import httpx

from postroom.errors import Conflict, Fenced, InvalidInput, NotFound, PostroomError, Unauthorized
from postroom.models import Ack, Claim, Failed, Finished, Released
from postroom.runtime.handlers import App, Context, PermanentFailure

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
    detail = str(problem.get("detail", ""))
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1]
    status = response.status_code
    error: PostroomError
    if status == 400:
        error = InvalidInput(str(problem.get("field", "body")), detail)
    elif status in (401, 403):
        error = Unauthorized(detail)
    elif status == 404:
        error = NotFound(f"{path}: {detail}")
    elif status == 409 and kind == "lease-lost":
        error = Fenced(path, detail)
    elif status == 409:
        error = Conflict(detail)
    else:
        error = ServiceError(status, problem)
    error.__dict__["problem"] = problem  # the problem document, for a caller that wants it
    return error


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


def _ack(answer: Any) -> Ack:
    return Ack(task_id=answer["task_id"], duplicate=answer["duplicate"], ack=answer["ack"])


def _acks(answer: Any) -> list[Ack]:
    return [_ack(item) for item in answer["acks"]]


def _claims(answer: Any) -> list[Claim]:
    names = {item.name for item in fields(Claim)}
    return [Claim(owner="", **{key: value for key, value in item.items() if key in names})
            for item in answer["claims"]]


def _task(task_id: str, tail: str = "") -> str:
    return f"/v1/tasks/{quote(task_id, safe='')}{tail}"


def _outcome_body(outcome: Finished | Failed | Released) -> dict[str, Any]:
    """An outcome as sent: of the claim, only its fence (the server keeps the rest)."""
    fence = outcome.claim.fence
    if isinstance(outcome, Finished):
        return {"fence": fence, "result": outcome.result,
                "follow_ups": [_given(**asdict(follow_up)) for follow_up in outcome.follow_ups],
                "waits": [_given(**asdict(wait)) for wait in outcome.waits],
                "side_effects": [asdict(effect) for effect in outcome.side_effects]}
    if isinstance(outcome, Failed):
        return {"fence": fence, "reason": outcome.reason, "retryable": outcome.retryable}
    return {"fence": fence, "delay": outcome.delay}


_VERBS = {Finished: "finish", Failed: "fail", Released: "release"}


class _Api:
    """Every operation of the API, described once. Each method returns what the service
    answers (on ``AsyncClient``, a coroutine of it)."""

    def _send(self, op: _Op) -> Any:
        raise NotImplementedError

    # agents
    def submit(self, message_id: str, payload: Mapping[str, Any], *, deadline: float,
               queue: str | None = None, max_attempts: int | None = None,
               correlation_id: str | None = None, not_before: float | None = None,
               priority: int | None = None) -> Any:
        """Submit a task; an ``Ack`` once it is durably stored (``duplicate`` on a resend)."""
        return self._send(_Op("POST", "/v1/tasks", _given(
            message_id=message_id, payload=dict(payload), deadline=deadline, queue=queue,
            max_attempts=max_attempts, correlation_id=correlation_id, not_before=not_before,
            priority=priority), read=_ack))

    def submit_batch(self, envelopes: Sequence[Mapping[str, Any]], *,
                     atomic: bool = False) -> Any:
        """Submit envelopes (dicts of ``submit``'s fields): one commit each, in order (on a
        failure the error's ``problem`` has the committed prefix's ``acks`` and the
        ``failed_index``), or ``atomic``: all in one transaction, or none."""
        path = "/v1/batches/atomic" if atomic else "/v1/batches"
        return self._send(_Op("POST", path, {"envelopes": [dict(item) for item in envelopes]},
                              read=_acks))

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
              lease: float | None = None, wait: float = 0.0) -> Any:
        """Claim up to ``limit`` tasks of the worker's queues, waiting up to ``wait`` seconds
        for one: a list of ``Claim`` (empty if none came)."""
        return self._send(_Op("POST", "/v1/claims", _given(
            queues=None if queues is None else list(queues), limit=limit, lease=lease,
            wait=wait), read=_claims))

    def renew(self, claim: Claim, *, lease: float | None = None) -> Any:
        """Extend a claim's lease: ``{"lease_until": ...}``; ``Fenced`` if it is lost."""
        return self._send(_Op("POST", _task(claim.task_id, "/renew"),
                              _given(fence=claim.fence, lease=lease)))

    def settle(self, outcome: Finished | Failed | Released) -> Any:
        """Commit a handler's outcome (``Finished``, ``Failed`` or ``Released``)."""
        verb = _VERBS[type(outcome)]
        return self._send(_Op("POST", _task(outcome.claim.task_id, f"/{verb}"),
                              _outcome_body(outcome)))

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
        """Open the next generation of a wait (``result``: ``opened``, ``stale``, ...)."""
        return self._send(_Op("POST", "/v1/waits", _given(
            flow=flow, step=step, expected_generation=expected_generation, deadline=deadline,
            request_id=request_id, task_id=task_id, responder=responder)))

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
                              {"event_id": event_id, "value": value}))

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
            "approval_id": approval_id, "action": action, "resource": resource, "data": data,
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


class RemoteWorker:
    """Runs ``app``'s handlers for the tasks a worker principal claims over HTTP.

    Each claimed task runs as the local worker runs it (``Context``, sync or ``async def``
    handlers, ``PermanentFailure``) while a timer renews its lease every third of it; the
    outcome is sent back naming only the task and the fence. A lost lease (``Fenced``)
    abandons the work: whatever it would commit is refused anyway. ``run`` claims until
    ``stop()``; ``run_once`` claims and works one round (for tests and scripts).
    """

    def __init__(self, client: Client, app: App, *, queues: Sequence[str] | None = None,
                 batch: int = 1, lease: float = 30.0, poll: float = 5.0) -> None:
        self.client = client
        self.app = app
        self.queues = list(queues) if queues is not None else list(app.queues)
        self.batch = batch
        self.lease = lease
        self.poll = poll
        self._stopping = threading.Event()
        self.settled: dict[str, int] = {"finish": 0, "fail": 0, "release": 0, "fenced": 0}

    def stop(self) -> None:
        """Stop claiming; the tasks in hand still finish."""
        self._stopping.set()

    def run(self) -> None:
        """Claim and work until ``stop()``."""
        while not self._stopping.is_set():
            self.run_once(wait=self.poll)

    def run_once(self, *, wait: float = 0.0) -> int:
        """Claim up to ``batch`` tasks (waiting up to ``wait`` seconds) and work them; how
        many were claimed."""
        claims = self.client.claim(queues=self.queues, limit=self.batch, lease=self.lease,
                                   wait=wait)
        for claim in claims:
            self._work(claim)
        return len(claims)

    def _work(self, claim: Claim) -> None:
        context = Context(claim)
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(claim, context, done),
                                   daemon=True)
        renewer.start()
        try:
            outcome = self._run(claim, context)
        finally:
            done.set()
            renewer.join()
        if context.cancelled:
            self.settled["fenced"] += 1
            return
        try:
            self.client.settle(outcome)
            self.settled[_VERBS[type(outcome)]] += 1
        except Fenced:
            self.settled["fenced"] += 1

    def _run(self, claim: Claim, context: Context) -> Finished | Failed | Released:
        spec = self.app.handler_for(claim.queue)
        if spec is None:
            return Released(claim=claim, delay=self.poll)
        try:
            if inspect.iscoroutinefunction(spec.function):
                result = asyncio.run(spec.function(claim.payload, context))
            else:
                result = spec.function(claim.payload, context)
        except PermanentFailure as exc:
            return Failed(claim=claim, reason=str(exc) or "permanent failure",
                          retryable=False)
        except Exception as exc:  # any other exception is a retryable failure
            return Failed(claim=claim, reason=f"{type(exc).__name__}: {exc}"[:4096] or "error")
        return Finished(claim=claim, result=result, follow_ups=context.follow_ups,
                        waits=context.waits, side_effects=context.side_effects)

    def _renew(self, claim: Claim, context: Context, done: threading.Event) -> None:
        while not done.wait(self.lease / 3):
            try:
                self.client.renew(claim, lease=self.lease)
            except Fenced:
                context.cancellation.set()
                return
            except (PostroomError, httpx.HTTPError):
                _log.warning("renewing %s failed; trying again", claim.task_id)
