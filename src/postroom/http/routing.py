"""How one route of the table is served: its declaration (``Route``), what its handler is
given (``Call``) and returns (``Answer``), the guard every request passes (body size, time),
the dispatcher that serves the table (``Dispatch``), and the OpenAPI document built from it.

A request to a ``Route`` goes, in order:

1. the guard (``Guard``, ASGI middleware over the whole app): a body over ``max_body`` is
   refused with 413 from its ``Content-Length``, or as soon as more arrives while streaming,
   before anything parses it; the whole request must be answered within ``timeout``;
2. routing (``Dispatch``, the next middleware): a path of the table is served here, any
   other request goes on to the framework's own routes;
3. authentication (``postroom.http.auth``): unless the route is public, the bearer token
   must belong to an active principal whose role the route admits (401, 403). A token seen
   before is not read again on its own: the call runs under ``Store.confirming``, so each of
   its transactions confirms the token first, and an answer no transaction confirmed (a
   refusal before the store, a call that needs none) is confirmed by one read;
4. the query parameters and the JSON body are parsed and checked against the route's
   declared schemas (400 naming the field; where a route takes query parameters, one it
   does not declare is refused too, so that a misspelt filter never widens a listing);
5. the handler runs in a worker thread (the store is synchronous) and its ``Answer`` is
   sent as JSON; a ``Problem`` it raises, or a postroom error (``problem_for``), is sent as
   problem+json.

Every answer carries an ``x-request-id``; problem bodies do not, so two answers of the same
problem are byte-identical.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from starlette.datastructures import QueryParams
from starlette.responses import Response

from postroom import (
    BatchFailed,
    InvalidInput,
    PostroomError,
    Principal,
    Role,
    Store,
    Unauthorized,
    Unconfirmed,
)
from postroom.http import schemas
from postroom.http.asgi import Message, Scope, send_body
from postroom.http.auth import UNAUTHENTICATED, Caller, Principals, bearer
from postroom.http.problems import CONTENT_TYPE, Problem, problem_for
from postroom.validation import is_decimal

__all__ = ["Answer", "Call", "Dispatch", "Guard", "Limits", "Observer", "Route", "Served",
           "openapi"]

_log = logging.getLogger("postroom.http")

ASGIApp = Callable[..., Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """What one request may cost the service."""

    #: The largest request body, in bytes (refused with 413 before it is parsed).
    max_body: int = 1024 * 1024
    #: Seconds within which every request is answered (503 ``timeout`` otherwise).
    timeout: float = 30.0
    #: The longest a claim may wait for work (its ``wait``), below ``timeout``.
    max_poll: float = 20.0
    #: Requests served at once: each holds one of this many threads while it calls the
    #: store (a claim for as long as it waits for work), and the rest queue for a thread.
    threads: int = 40

    def __post_init__(self) -> None:
        if not 1 <= self.max_body <= 64 * 1024 * 1024:
            raise InvalidInput("max_body", "must be 1 byte .. 64 MiB")
        if not 0 < self.timeout <= 3600:
            raise InvalidInput("timeout", "must be in (0, 3600] seconds")
        if not 0 <= self.max_poll < self.timeout:
            raise InvalidInput("max_poll", "must be at least 0 and below timeout")
        if not 1 <= self.threads <= 1024:
            raise InvalidInput("threads", "must be 1 .. 1024")


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """A handler's JSON answer."""

    body: Any
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """What a handler is given: the store, the caller (``None`` on a public route), and the
    request's path parameters, query and body, already checked against the route's schemas.
    """

    store: Store
    caller: Caller | None
    params: Mapping[str, str]
    query: Mapping[str, Any]
    body: Any
    limits: Limits

    @property
    def principal(self) -> Principal:
        """The authenticated principal (a route's handler runs only once there is one)."""
        assert self.caller is not None, "a public route has no principal"
        return self.caller.principal


Handler = Callable[[Call], Answer]


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """One operation of the API: its method and path, who may call it (``roles``; ``None``
    for a public route), the schemas of its query, body and answers, and its handler (a
    plain function, run in a worker thread; its docstring's first line is its summary)."""

    method: str
    path: str
    handler: Handler
    roles: frozenset[Role] | None
    body: schemas.Schema | None = None
    query: Mapping[str, schemas.Schema] = field(default_factory=dict)
    answers: Mapping[int, schemas.Schema] = field(default_factory=dict)
    tag: str = "tasks"

    @property
    def name(self) -> str:
        """The operation's id: its handler's name."""
        return self.handler.__name__

    @property
    def summary(self) -> str:
        """The first line of its handler's docstring."""
        return (self.handler.__doc__ or self.name).strip().splitlines()[0]

    @property
    def path_params(self) -> list[str]:
        """The names of its path parameters, in order."""
        return re.findall(r"\{([a-z_]+)\}", self.path)


# -- the guard ------------------------------------------------------------------------------


class Guard:
    """ASGI middleware: bodies over ``limits.max_body`` are refused (413) before they are
    read whole, and every request is answered within ``limits.timeout`` (503)."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Callable[[], Any],
                       send: Callable[[Message], Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        request_id = uuid.uuid4().hex

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode("ascii"))]
            await send(message)

        limit = self.limits.max_body
        declared = _header(scope, b"content-length")
        if declared is not None and (not is_decimal(declared) or int(declared) > limit):
            await _send_problem(sending, _too_large(limit) if is_decimal(declared) else Problem(
                400, "invalid-input", "Invalid input", "content-length is not a number",
                field="content-length"))
            return
        seen = 0

        async def receiving() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _too_large(limit)
            return message

        try:
            async with asyncio.timeout(self.limits.timeout):
                await self.app(scope, receiving, sending)
        except Problem as problem:
            if not started:
                await _send_problem(sending, problem)
        except TimeoutError:
            _log.warning("request timed out", extra={"path": scope.get("path")})
            if not started:
                await _send_problem(sending, Problem(
                    503, "timeout", "Timed out",
                    f"the request was not answered within {self.limits.timeout:g} s",
                    headers={"retry-after": "1"}))


def _too_large(limit: int) -> Problem:
    return Problem(413, "too-large", "Body too large",
                   f"a request body may have at most {limit} bytes", field="body")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


async def _send_problem(send: Callable[[Message], Any], problem: Problem) -> None:
    await send_body(send, problem.status, problem.body(), CONTENT_TYPE, problem.headers)


# -- serving the routes ---------------------------------------------------------------------


def problem_response(problem: Problem) -> Response:
    """``problem`` as a Starlette response."""
    return Response(problem.body(), status_code=problem.status, media_type=CONTENT_TYPE,
                    headers=problem.headers)


#: Told of each request a route served: the route, and its answer or the postroom error it
#: was refused with (``create_app``'s ``observe``; the metrics count with it).
Observer = Callable[[Route, "Answer | PostroomError"], None]


@dataclass(frozen=True, slots=True)
class Served:
    """What every request to the app is served with, shared by its routes: the store, the
    limits, the principals of tokens already seen, and the threads that call the store."""

    store: Store
    limits: Limits
    known: Principals
    threads: Executor


class Dispatch:
    """ASGI middleware that serves ``routes`` itself and hands every other request to the app
    it wraps (the dashboard, metrics, the OpenAPI document, the 404s).

    The API is the hot path: routing it here, by a dictionary for the fixed paths and one
    pattern per path with parameters (``[^/]+`` each, as Starlette matches them), spares each
    request the framework's router and exception layers (about a fifth of the server's CPU
    per submission, by py-spy; one client waiting on each answer gains little, its time
    being the wake-ups and the store). A path served here with a method it does not serve
    is 405 with ``Allow``; ``HEAD`` is served as ``GET``.
    """

    def __init__(self, app: ASGIApp, *, routes: Sequence[Route], served: Served,
                 observe: Observer | None = None) -> None:
        self.app = app
        self.served = served
        self.observe = observe
        # Each path's routes by method: the fixed paths by path, the others by pattern.
        self._fixed: dict[str, dict[str, Route]] = {}
        patterned: dict[str, dict[str, Route]] = {}
        for route in routes:
            into = patterned if route.path_params else self._fixed
            into.setdefault(route.path, {})[route.method] = route
        self._patterned = [
            (re.compile("^" + re.sub(r"\{([a-z_]+)\}", r"(?P<\1>[^/]+)", path) + "$"), methods)
            for path, methods in patterned.items()]
        # Only a path under the first segment of a patterned route can match one.
        self._heads = tuple({"/" + path.split("/")[1] + "/" for path in patterned})

    async def __call__(self, scope: Scope, receive: Callable[[], Any],
                       send: Callable[[Message], Any]) -> None:
        found = self._match(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        methods, params = found
        method = scope["method"]
        route = methods.get("GET" if method == "HEAD" else method)
        if route is None:
            allowed = sorted({*methods, *(("HEAD",) if "GET" in methods else ())})
            await _send_problem(send, Problem(
                405, "method-not-allowed", "Method not allowed", f"{method} is not served here",
                headers={"allow": ", ".join(allowed)}))
            return
        try:
            answer = await self._serve(route, params, scope, receive)
        except Problem as problem:
            await _send_problem(send, problem)
            return
        except PostroomError as exc:
            if self.observe is not None:
                self.observe(route, exc)
            await _send_problem(send, problem_for(exc))
            return
        if self.observe is not None:
            self.observe(route, answer)
        payload = json.dumps(answer.body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        await send_body(send, answer.status, payload, "application/json", answer.headers)

    def _match(self, scope: Scope) -> tuple[dict[str, Route], dict[str, str]] | None:
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        fixed = self._fixed.get(path)
        if fixed is not None:
            return fixed, {}
        if path.startswith(self._heads):
            # Parameters are matched in the path as sent, then decoded one by one: a name
            # holding a "/" (a flow "a/b", sent as "a%2Fb") is one parameter, not two
            # segments.
            target = _raw_path(scope, root) or path
            for pattern, methods in self._patterned:
                matched = pattern.match(target)
                if matched is not None:
                    return methods, {name: unquote(value)
                                     for name, value in matched.groupdict().items()}
        return None

    async def _serve(self, route: Route, params: dict[str, str], scope: Scope,
                     receive: Callable[[], Any]) -> Answer:
        raw = await _body(receive) if route.body is not None else b""
        request = _Request(params, QueryParams(scope.get("query_string", b"")))
        header = _header(scope, b"authorization")
        # One trip to a worker thread for the whole call: authenticating reads the database
        # too. A request that times out stops waiting for it; the call itself runs to its end.
        return await asyncio.get_running_loop().run_in_executor(
            self.served.threads, _call, route, self.served, request, header, raw)


def _raw_path(scope: Scope, root: str) -> str | None:
    """The request's path as sent (percent-encoded), less the ``root`` it is mounted under;
    ``None`` if the server gives none."""
    raw = scope.get("raw_path")
    if not raw:
        return None
    path = bytes(raw).decode("latin-1")
    prefix = quote(root) if root else ""
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


@dataclass(frozen=True, slots=True)
class _Request:
    """What a route's call reads of its request besides the body."""

    path_params: dict[str, str]
    query_params: QueryParams


async def _body(receive: Callable[[], Any]) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Problem(400, "invalid-input", "Invalid input",
                          "the client went away mid-body", field="body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _call(route: Route, served: Served, request: _Request, header: str | None,
          raw: bytes) -> Answer:
    if route.roles is None:
        return _handle(route, served, request, None, raw)
    token = bearer(header)
    caller = served.known.caller(served.store, token)
    # A remembered principal is only a hint: every transaction of the call confirms the
    # token first, and an answer that none confirmed is confirmed by a read of its own.
    try:
        with served.store.confirming(token, caller.principal) as confirmed:
            answer = _handle(route, served, request, caller, raw)
    except Exception as exc:
        cause = exc.error if isinstance(exc, BatchFailed) else exc
        if isinstance(cause, Unconfirmed):
            served.known.forget(token)
            raise UNAUTHENTICATED from None
        _confirm_unless(confirmed.transactions, served, token)
        raise
    _confirm_unless(confirmed.transactions, served, token)
    return answer


def _confirm_unless(transactions: int, served: Served, token: str) -> None:
    if transactions:
        return
    try:
        served.store.authenticate(token)
    except Unauthorized:
        served.known.forget(token)
        raise UNAUTHENTICATED from None


def _handle(route: Route, served: Served, request: _Request, caller: Caller | None,
            raw: bytes) -> Answer:
    if caller is not None and route.roles is not None \
            and caller.principal.role not in route.roles:
        raise Problem(403, "forbidden", "Forbidden",
                      f"the {caller.principal.role.value} role may not call {route.name}")
    for name in request.query_params if route.query else ():
        if name not in route.query:  # a misspelt filter must not widen what is listed
            raise InvalidInput(name, f"is not a query parameter of {route.name} (it takes "
                                     f"{', '.join(sorted(route.query))})")
    query = {name: _query_value(name, request.query_params.get(name), schema)
             for name, schema in route.query.items()
             if request.query_params.get(name) is not None}
    body = None
    if route.body is not None:
        body = _json(raw) if raw else {}
        schemas.check(body, route.body, "")
    call = Call(store=served.store, caller=caller, params=request.path_params,
                query=query, body=body, limits=served.limits)
    try:
        return route.handler(call)
    except (Problem, PostroomError):
        raise
    except Exception as exc:  # a bug: logged, answered 500 without its text
        _log.exception("route %s failed", route.name)
        raise Problem(500, "internal", "Internal error", type(exc).__name__) from exc


def _refuse_constant(name: str) -> Any:
    raise InvalidInput("body", f"{name} is not a JSON number postroom accepts")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise InvalidInput("body", "is not UTF-8") from None
    except RecursionError:
        raise InvalidInput("body", "is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput("body", f"is not JSON: {exc.msg} at {exc.pos}") from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise InvalidInput("body", "holds an integer too long to read") from None


def _query_value(name: str, text: str | None, schema: schemas.Schema) -> Any:
    assert text is not None
    kind = schema.get("type")
    value: Any = text
    if kind == "integer":
        if not re.fullmatch(r"-?[0-9]{1,19}", text):
            raise InvalidInput(name, "must be an integer")
        value = int(text)
    elif kind == "number":
        try:
            value = float(text)
        except ValueError:
            raise InvalidInput(name, "must be a number") from None
        if not math.isfinite(value):
            raise InvalidInput(name, "must be a finite number")
    elif kind == "boolean":
        if text not in ("true", "false"):
            raise InvalidInput(name, "must be true or false")
        value = text == "true"
    schemas.check(value, schema, name)
    return value


# -- the OpenAPI document -------------------------------------------------------------------

_PROBLEM = schemas.obj({
    "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
    "detail": {"type": "string"}, "field": {"type": "string"},
}, required=("type", "title", "status"), closed=False)

_ERRORS = {400: "Invalid input (`field` names it)", 401: "No valid token",
           403: "The caller's role may not do this", 404: "No such record, or not yours",
           409: "A conflict: a lost lease, a collision", 413: "Body too large",
           503: "Store unavailable, or timed out: try again"}


def openapi(routes: Sequence[Route], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        parameters = [{"name": name, "in": "path", "required": True,
                       "schema": schemas.text(512)} for name in route.path_params]
        parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                       for name, schema in route.query.items()]
        responses: dict[str, Any] = {
            str(status): {"description": "OK", "content": {"application/json": {
                "schema": schema}}} for status, schema in route.answers.items()}
        errors = [400, 413, 503] if route.roles is None else list(_ERRORS)
        for status in errors:
            responses.setdefault(str(status), {"description": _ERRORS[status], "content": {
                CONTENT_TYPE: {"schema": _PROBLEM}}})
        operation: dict[str, Any] = {"operationId": route.name, "summary": route.summary,
                                     "tags": [route.tag], "responses": responses}
        if route.handler.__doc__:
            operation["description"] = route.handler.__doc__.strip()
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {"required": False, "content": {
                "application/json": {"schema": route.body}}}
        if route.roles is not None:
            operation["security"] = [{"bearer": []}]
            operation["x-roles"] = sorted(role.value for role in route.roles)
        else:
            operation["security"] = []
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {"openapi": "3.1.0", "info": {"title": title, "version": version},
            "paths": paths, "components": {"securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}]}
