"""The HTTP service: ``create_app(store)`` is an ASGI app (Starlette) over one store.

``ROUTES`` below is the one list of the API's operations: the app serves it, the OpenAPI
document (``/openapi.json``) is built from it, and the authorization tests walk it. Each
entry names its method and path, the roles admitted (``None``: public), the schemas of its
query, body and answers, and its handler (``postroom.http.api``).

Mounting more (the dashboard, metrics): pass Starlette routes as ``extra_routes``::

    create_app(store, extra_routes=dashboard.routes(store))

They are served by the same app behind the same guard (body size, timeout) and are not part
of the OpenAPI document. They authenticate with ``postroom.http.auth.authenticate`` (the
same tokens, the same 401) and decide who sees what with ``postroom.principals``' ``may_*``
rules, as the API does. ``postroom serve`` builds its app with ``build_app``, where the
dashboard adds its routes.

Serve it with any asyncio ASGI server; ``serve`` runs uvicorn with its own limits set
(keep-alive, concurrency, header size), the request limits of ``Limits`` and no access log
(each line costs about a tenth of a submission's time; ``access_log=True`` turns it on).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.routing import Route as StarletteRoute

import postroom
from postroom import Role, Store
from postroom.http import api
from postroom.http.auth import Principals
from postroom.http.problems import NOT_FOUND, Problem
from postroom.http.routing import (
    Dispatch,
    Guard,
    Limits,
    Observer,
    Route,
    Served,
    openapi,
    problem_response,
)

__all__ = ["ROUTES", "Limits", "build_app", "create_app", "serve"]

AGENT = frozenset({Role.AGENT})
HUMAN = frozenset({Role.HUMAN})
WORKER = frozenset({Role.WORKER})
OPERATOR = frozenset({Role.OPERATOR})
ANYONE = frozenset(Role)
READERS = frozenset({Role.AGENT, Role.OPERATOR})
ANSWERERS = frozenset({Role.HUMAN, Role.OPERATOR})
OPENERS = frozenset({Role.WORKER, Role.OPERATOR})

TASK = "/v1/tasks/{task_id}"
WAIT = "/v1/waits/{flow}/{step}"
APPROVAL = "/v1/approvals/{approval_id}"

#: The API, in the order the OpenAPI document lists it.
ROUTES: tuple[Route, ...] = (
    Route(method="GET", path="/healthz", handler=api.healthz, roles=None, tag="health",
          answers={200: api.RESULT}),
    Route(method="GET", path="/readyz", handler=api.readyz, roles=None, tag="health",
          answers={200: api.RESULT}),
    Route(method="GET", path="/v1/me", handler=api.whoami, roles=ANYONE, tag="principals",
          answers={200: api.RESULT}),
    # agents
    Route(method="POST", path="/v1/tasks", handler=api.submit, roles=AGENT, body=api.ENVELOPE,
          answers={202: api.ACK}),
    Route(method="POST", path="/v1/batches", handler=api.submit_batch, roles=AGENT,
          body=api.BATCH, answers={200: api.ACKS}),
    Route(method="POST", path="/v1/batches/atomic", handler=api.submit_atomic, roles=AGENT,
          body=api.BATCH, answers={200: api.ACKS}),
    Route(method="GET", path="/v1/tasks", handler=api.list_tasks, roles=READERS,
          query=api.TASK_QUERY, answers={200: api.PAGE}),
    Route(method="GET", path=TASK, handler=api.get_task, roles=READERS,
          answers={200: api.TASK}),
    Route(method="GET", path=f"{TASK}/story", handler=api.get_story, roles=READERS,
          answers={200: api.RESULT}),
    Route(method="GET", path=f"{TASK}/reply", handler=api.get_reply, roles=READERS,
          answers={200: api.RESULT}),
    # workers
    Route(method="POST", path="/v1/claims", handler=api.claim, roles=WORKER,
          body=api.CLAIM_BODY, answers={200: api.CLAIMS}, tag="work"),
    Route(method="POST", path=f"{TASK}/renew", handler=api.renew, roles=WORKER,
          body=api.RENEW_BODY, answers={200: api.RESULT}, tag="work"),
    Route(method="POST", path=f"{TASK}/finish", handler=api.finish, roles=WORKER,
          body=api.FINISH_BODY, answers={200: api.RESULT}, tag="work"),
    Route(method="POST", path=f"{TASK}/fail", handler=api.fail, roles=WORKER,
          body=api.FAIL_BODY, answers={200: api.RESULT}, tag="work"),
    Route(method="POST", path=f"{TASK}/release", handler=api.release, roles=WORKER,
          body=api.RELEASE_BODY, answers={200: api.RESULT}, tag="work"),
    Route(method="POST", path="/v1/renewals", handler=api.renew_many, roles=WORKER,
          body=api.RENEWALS_BODY, answers={200: api.RENEWED}, tag="work"),
    Route(method="POST", path="/v1/settlements", handler=api.settle, roles=WORKER,
          body=api.SETTLE_BODY, answers={200: api.SETTLED}, tag="work"),
    # waits
    Route(method="POST", path="/v1/waits", handler=api.open_wait, roles=OPENERS,
          body=api.OPEN_WAIT_BODY, answers={200: api.RESULT}, tag="waits"),
    Route(method="GET", path="/v1/waits", handler=api.list_waits, roles=ANSWERERS,
          query=api.WAIT_QUERY, answers={200: api.PAGE}, tag="waits"),
    Route(method="GET", path=WAIT, handler=api.get_wait, roles=ANSWERERS,
          query=api.GENERATION_QUERY, answers={200: api.RESULT}, tag="waits"),
    Route(method="POST", path=f"{WAIT}/{{generation}}/signal", handler=api.signal,
          roles=ANSWERERS, body=api.SIGNAL_BODY, answers={200: api.RESULT}, tag="waits"),
    # approvals
    Route(method="POST", path=f"{WAIT}/{{generation}}/approval", handler=api.answer_approval,
          roles=HUMAN, body=api.ANSWER_BODY, answers={200: api.RESULT}, tag="approvals"),
    Route(method="GET", path="/v1/approval-requests", handler=api.approval_requests,
          roles=ANSWERERS, query=api.ASKED_QUERY, answers={200: api.PAGE}, tag="approvals"),
    Route(method="POST", path="/v1/approvals", handler=api.grant_approval, roles=HUMAN,
          body=api.GRANT_BODY, answers={201: api.RESULT}, tag="approvals"),
    Route(method="GET", path="/v1/approvals", handler=api.list_approvals, roles=ANSWERERS,
          query=api.APPROVAL_QUERY, answers={200: api.PAGE}, tag="approvals"),
    Route(method="GET", path=APPROVAL, handler=api.get_approval, roles=ANSWERERS,
          answers={200: api.RESULT}, tag="approvals"),
    Route(method="POST", path=f"{APPROVAL}/revoke", handler=api.revoke_approval,
          roles=ANSWERERS, body=api.REASON_BODY, answers={200: api.RESULT}, tag="approvals"),
    # operators
    Route(method="POST", path=f"{TASK}/cancel", handler=api.cancel, roles=OPERATOR,
          body=api.OPTIONAL_REASON, answers={200: api.RESULT}, tag="operators"),
    Route(method="POST", path=f"{TASK}/retry", handler=api.retry, roles=OPERATOR,
          body=api.RETRY_BODY, answers={201: api.RESULT}, tag="operators"),
    Route(method="POST", path="/v1/retries", handler=api.retry_many, roles=OPERATOR,
          body=api.RETRIES_BODY, answers={200: api.RESULT}, tag="operators"),
    Route(method="GET", path="/v1/status", handler=api.status, roles=OPERATOR,
          answers={200: api.RESULT}, tag="operators"),
    Route(method="GET", path="/v1/replies/dead", handler=api.dead_replies, roles=OPERATOR,
          query=api.PAGE_QUERY, answers={200: api.PAGE}, tag="operators"),
    Route(method="POST", path="/v1/replies/{reply_id}/requeue", handler=api.requeue,
          roles=OPERATOR, body=api.REASON_BODY, answers={200: api.RESULT}, tag="operators"),
    Route(method="GET", path="/v1/queues", handler=api.paused_queues, roles=OPERATOR,
          answers={200: api.RESULT}, tag="operators"),
    Route(method="POST", path="/v1/queues/{queue}/pause", handler=api.pause, roles=OPERATOR,
          body=api.REASON_BODY, answers={200: api.RESULT}, tag="operators"),
    Route(method="POST", path="/v1/queues/{queue}/resume", handler=api.resume,
          roles=OPERATOR, answers={200: api.RESULT}, tag="operators"),
    Route(method="GET", path="/v1/audit", handler=api.audit, roles=OPERATOR,
          answers={200: api.RESULT}, tag="operators"),
)


def create_app(store: Store, *, limits: Limits | None = None,
               extra_routes: Sequence[BaseRoute] = (),
               routes: Sequence[Route] = ROUTES, observe: Observer | None = None) -> Starlette:
    """The ASGI app serving ``routes`` (the API) and ``extra_routes`` over ``store``.

    ``observe``, if given, is told of each answer a route gave and each postroom error it
    refused with (on the event loop: keep it quick). The app does not close ``store``: its
    owner does, after the server stopped.
    """
    limits = limits if limits is not None else Limits()
    document = openapi(routes, title="postroom", version=postroom.__version__)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    async def not_found(request: Request, exc: Exception) -> Response:
        return problem_response(NOT_FOUND)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return problem_response(Problem(405, "method-not-allowed", "Method not allowed",
                                        f"{request.method} is not served here"))

    threads = ThreadPoolExecutor(limits.threads, thread_name_prefix="postroom-http")
    shared = Served(store, limits, Principals(), threads)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        threads.shutdown(wait=False)

    # The API is served by ``Dispatch``; the framework's router serves the rest.
    app = Starlette(routes=[StarletteRoute("/openapi.json", openapi_json, methods=["GET"],
                                           name="openapi"), *extra_routes],
                    middleware=[Middleware(Guard, limits=limits),
                                Middleware(Dispatch, routes=routes, served=shared,
                                           observe=observe)],
                    exception_handlers={404: not_found, 405: not_allowed}, lifespan=lifespan)
    app.state.store = store
    app.state.limits = limits
    app.state.openapi = document
    return app


def build_app(store: Store, *, limits: Limits | None = None) -> Starlette:
    """The app ``postroom serve`` runs: the API, plus whatever else the service mounts."""
    from postroom.http import dashboard, metrics

    registry = metrics.registry_for(store)
    counters = metrics.SubmissionCounters(registry)
    return create_app(store, limits=limits, observe=counters.observe, extra_routes=[
        *dashboard.routes(store), metrics.route(store, registry=registry)])


#: What ``serve`` tells uvicorn, beside the address, the log level and the shutdown grace.
UVICORN_OPTIONS: dict[str, Any] = {"timeout_keep_alive": 5, "limit_concurrency": 512,
                                   "h11_max_incomplete_event_size": 16 * 1024,
                                   "access_log": False}


def serve(store: Store, *, host: str = "127.0.0.1", port: int = 8000,
          limits: Limits | None = None, **uvicorn_options: Any) -> None:
    """Serve ``build_app(store)`` with uvicorn until SIGTERM or Ctrl-C."""
    import uvicorn

    limits = limits if limits is not None else Limits()
    options: dict[str, Any] = {**UVICORN_OPTIONS,
                               "timeout_graceful_shutdown": int(limits.timeout),
                               "log_level": "info", **uvicorn_options}
    uvicorn.run(build_app(store, limits=limits), host=host, port=port, **options)
