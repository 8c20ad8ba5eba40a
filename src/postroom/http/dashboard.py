"""The dashboard: server-rendered pages over one store, served by the service's app.

Mount it with ``create_app(store, extra_routes=dashboard.routes(store))``; it lives under
``/dashboard``. Every page is plain HTML (Jinja2 templates, autoescaped), so it reads with
JavaScript off; the chart is an SVG drawn on the server from durable rows.

Login is by token: the login form posts a principal's token, which is checked exactly as a
bearer token is (``postroom.http.auth.authenticate``) and then kept in an ``HttpOnly``,
``SameSite=Strict`` cookie scoped to ``/dashboard`` for at most ``SESSION_SECONDS``. Every
request authenticates the cookie's token again, so a revoked or rotated-out token logs its
sessions out at once, and any process serving the same store accepts the session (no
server-side session state, no secret to share between processes). Every form that writes
carries a CSRF token derived from the session's token (an HMAC a page of another origin can
neither read nor compute), and a write whose token does not match, or that a browser says
comes from another site (``Origin``), is refused (403); so is a login posted from another
site, which could otherwise log a browser in as someone else.

Who sees what follows the API's rules (``postroom.principals``' ``may_*``): an operator sees
and decides everything; an agent reads its own tasks; a human reads and answers the waits
addressed to it. Everyone else's pages are read-only, and a record one may not see is a
plain 404, like one that does not exist.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from postroom import (
    AuthContext,
    NotFound,
    Observation,
    PostroomError,
    Principal,
    Role,
    Store,
    TaskState,
    Unauthorized,
    Wait,
    principals,
)
from postroom.http.auth import authenticate
from postroom.http.problems import Problem

__all__ = ["COOKIE", "PREFIX", "SESSION_SECONDS", "Chart", "chart", "routes"]

#: Where the dashboard is mounted.
PREFIX = "/dashboard"
#: The session cookie's name.
COOKIE = "postroom_session"
#: How long a login lasts (the cookie's Max-Age).
SESSION_SECONDS = 8 * 3600
#: The terminal states an operator can run again (``Store.retry``).
RERUNNABLE = (TaskState.FAILED, TaskState.EXPIRED, TaskState.CANCELLED)
#: Rows per listing page.
PAGE = 50

_templates = Environment(loader=PackageLoader("postroom.http", "templates"),
                         autoescape=select_autoescape(default=True), trim_blocks=True,
                         lstrip_blocks=True)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float) -> str:
    value = max(0.0, value)
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


_templates.filters.update(when=_when, seconds=_seconds,
                          pretty=lambda value: json.dumps(value, indent=2, sort_keys=True))


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: the principal the session's token belongs to, and that token's CSRF
    token for the forms of the page."""

    principal: Principal
    csrf: str

    @property
    def operator(self) -> bool:
        """Whether it may decide (every write but a human's answer is an operator's)."""
        return self.principal.role is Role.OPERATOR

    @property
    def auth(self) -> AuthContext:
        """The context the store is called with for this viewer."""
        return AuthContext(principal=self.principal.name, role=self.principal.role.value)


class _Refused(Exception):
    """Answer with ``status`` and a page saying ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _csrf(token: str) -> str:
    return hmac.new(token.encode("utf-8"), b"postroom-dashboard-csrf", hashlib.sha256).hexdigest()


def _render(name: str, viewer: Viewer | None, code: int = 200, **context: Any) -> Response:
    page = _templates.get_template(name).render(viewer=viewer, prefix=PREFIX, **context)
    return HTMLResponse(page, status_code=code, headers={
        "cache-control": "no-store", "x-frame-options": "DENY",
        "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                   "img-src 'self'; form-action 'self'; frame-ancestors 'none'",
        "referrer-policy": "same-origin"})


def _back(path: str, **query: str) -> Response:
    """See Other: the page to show after a write (its outcome in the query)."""
    shown = {name: value for name, value in query.items() if value}
    return RedirectResponse(f"{PREFIX}{path}" + (f"?{urlencode(shown)}" if shown else ""),
                            status_code=303)


def _cross_site(request: Request) -> bool:
    """Whether a browser says the request comes from a page of another site (its ``Origin``
    names another host than the one asked; a client that sends no ``Origin`` is no browser
    posting a form across sites)."""
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc != request.headers.get("host", "")


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form posted (the app's guard has bounded its size already)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"),
                      keep_blank_values=True)
    return {name: values[-1] for name, values in fields.items()}


Handler = Callable[[Request, Store, Viewer, dict[str, str]], Awaitable[Response]]


def _served(store: Store, handler: Handler, *, operator: bool) -> Callable[
        [Request], Awaitable[Response]]:
    """``handler`` for a logged-in viewer (an operator, if ``operator``), given the form a
    POST carries once its CSRF token is checked; a refusal or a store error is a page."""

    async def serve(request: Request) -> Response:
        viewer = await _viewer(request, store)
        if viewer is None:
            return _back("/login", next=request.url.path if request.method == "GET" else "")
        try:
            form: dict[str, str] = {}
            if request.method == "POST":
                form = await _form(request)
                if _cross_site(request) or not hmac.compare_digest(form.get("csrf", ""),
                                                                    viewer.csrf):
                    raise _Refused(403, "the form is stale or was not sent by this dashboard: "
                                        "reload the page and try again")
            if operator and not viewer.operator:
                raise _Refused(403, "only an operator may open this page or do this")
            return await handler(request, store, viewer, form)
        except _Refused as refused:
            return _render("message.html", viewer, refused.status, message=refused.message)
        except NotFound:
            return _render("message.html", viewer, 404, message="not found")
        except Unauthorized as exc:
            return _render("message.html", viewer, 403, message=str(exc))
        except PostroomError as exc:
            return _render("message.html", viewer, 400, message=str(exc))

    return serve


async def _viewer(request: Request, store: Store) -> Viewer | None:
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        caller = await run_in_threadpool(authenticate, store, f"Bearer {token}")
    except Problem:
        return None
    return Viewer(principal=caller.principal, csrf=_csrf(token))


# -- login ---------------------------------------------------------------------------------------


async def _login_form(request: Request) -> Response:
    return _render("login.html", None, next=_next(request.query_params.get("next")))


def _next(target: str | None) -> str:
    """Where to go after logging in: a dashboard path, never another site."""
    if target and target.startswith(f"{PREFIX}/") and not target.startswith("//"):
        return target
    return f"{PREFIX}/"


def _login(store: Store, *, secure: bool) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        if _cross_site(request):  # another site must not log a browser in as someone else
            return _render("login.html", None, 403, next=f"{PREFIX}/",
                           error="log in from this dashboard's own page")
        form = await _form(request)
        token = form.get("token", "").strip()
        try:
            await run_in_threadpool(authenticate, store, f"Bearer {token}")
        except Problem:
            return _render("login.html", None, 401, next=_next(form.get("next")),
                           error="that token is not valid")
        answer = RedirectResponse(_next(form.get("next")), status_code=303)
        answer.set_cookie(COOKIE, token, max_age=SESSION_SECONDS, path=PREFIX, httponly=True,
                          samesite="strict", secure=secure)
        return answer

    return login


async def _logout(request: Request) -> Response:
    answer = RedirectResponse(f"{PREFIX}/login", status_code=303)
    answer.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return answer


# -- reading -------------------------------------------------------------------------------------


async def _overview(request: Request, store: Store, viewer: Viewer,
                    form: dict[str, str]) -> Response:
    if not viewer.operator:
        return _render("overview.html", viewer, status=None, drawn=None)
    seen = await run_in_threadpool(store.observe, window=3600.0)
    return _render("overview.html", viewer, status=seen.status, drawn=chart(seen),
                   terminal=[state for state in TaskState if state.terminal])


async def _tasks(request: Request, store: Store, viewer: Viewer,
                 form: dict[str, str]) -> Response:
    query = request.query_params
    state = query.get("state") or None
    queue = query.get("queue") or None
    principal = query.get("principal") or None
    if viewer.principal.role is Role.AGENT:
        principal = viewer.principal.name  # an agent lists only its own tasks
    elif not viewer.operator:
        raise _Refused(403, "only agents (their own tasks) and operators list tasks")
    page = await run_in_threadpool(lambda: store.list_tasks(
        state=state, queue=queue, principal=principal, limit=PAGE,
        cursor=query.get("cursor") or None))
    filters = {"state": state or "", "queue": queue or "", "principal": principal or ""}
    more = (None if page.next_cursor is None
            else urlencode({**filters, "cursor": page.next_cursor}))
    return _render("tasks.html", viewer, tasks=page.items, filters=filters, more=more,
                   states=list(TaskState), rerunnable=RERUNNABLE,
                   notice=query.get("done", ""))


async def _task(request: Request, store: Store, viewer: Viewer,
                form: dict[str, str]) -> Response:
    task_id = request.path_params["task_id"]
    story = await run_in_threadpool(store.story, task_id)
    if not principals.may_read_task(viewer.principal, story.task):
        raise NotFound(task_id)
    retries = await run_in_threadpool(store.retries, task_id)
    # The re-run form names its request, so that a form sent twice makes one re-run.
    return _render("task.html", viewer, story=story, retries=retries,
                   rerunnable=story.task.state in RERUNNABLE, request_id=uuid.uuid4().hex,
                   notice=request.query_params.get("done", ""))


async def _waits(request: Request, store: Store, viewer: Viewer,
                 form: dict[str, str]) -> Response:
    if viewer.principal.role not in (Role.HUMAN, Role.OPERATOR):
        raise _Refused(403, "only humans (the waits addressed to them) and operators see waits")
    cursor = request.query_params.get("cursor") or None
    page = await run_in_threadpool(lambda: store.list_waits(limit=PAGE, cursor=cursor))
    responder = None if viewer.operator else viewer.principal.name
    asked = {(item.flow, item.step, item.generation): item
             for item in await run_in_threadpool(lambda: store.approval_requests(
                 responder=responder, limit=1000))}
    shown = [(wait, principals.may_answer(viewer.principal, wait),
              asked.get((wait.flow, wait.step, wait.generation)))
             for wait in page.items if principals.may_read_wait(viewer.principal, wait)]
    return _render("waits.html", viewer, waits=shown, more=page.next_cursor,
                   event_id=uuid.uuid4().hex, notice=request.query_params.get("done", ""),
                   now=store.clock.now())


async def _dead(request: Request, store: Store, viewer: Viewer,
                form: dict[str, str]) -> Response:
    cursor = request.query_params.get("cursor") or None
    page = await run_in_threadpool(lambda: store.list_dead_replies(limit=PAGE, cursor=cursor))
    return _render("dead.html", viewer, replies=page.items, more=page.next_cursor,
                   notice=request.query_params.get("done", ""))


async def _queues(request: Request, store: Store, viewer: Viewer,
                  form: dict[str, str]) -> Response:
    status = await run_in_threadpool(store.status)
    paused = {entry.queue: entry for entry in await run_in_threadpool(store.paused_queues)}
    return _render("queues.html", viewer, queues=sorted(status.queues), paused=paused,
                   notice=request.query_params.get("done", ""))


async def _audit(request: Request, store: Store, viewer: Viewer,
                 form: dict[str, str]) -> Response:
    violations = await run_in_threadpool(store.audit)
    return _render("audit.html", viewer, violations=violations)


# -- writing -------------------------------------------------------------------------------------


def _required(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        raise _Refused(400, f"{name}: is required")
    return value


async def _visible_wait(request: Request, store: Store, viewer: Viewer) -> Wait:
    """The path's wait generation, if the viewer may see it (else, as a missing one, a
    404)."""
    flow, step = request.path_params["flow"], request.path_params["step"]
    wait = await run_in_threadpool(store.wait, flow, step,
                                   int(request.path_params["generation"]))
    if not principals.may_read_wait(viewer.principal, wait):
        raise NotFound(f"{flow}/{step}")
    return wait


async def _signal(request: Request, store: Store, viewer: Viewer,
                  form: dict[str, str]) -> Response:
    wait = await _visible_wait(request, store, viewer)
    flow, step, generation = wait.flow, wait.step, wait.generation
    if not principals.may_answer(viewer.principal, wait):
        raise _Refused(403, "this wait waits for another principal's answer")
    try:
        value = json.loads(_required(form, "value"))
    except ValueError:
        raise _Refused(400, "value: must be JSON (a string in quotes, true, 42, {...})"
                       ) from None
    receipt = await run_in_threadpool(store.signal, viewer.auth, _required(form, "event_id"),
                                      flow, step, generation, value)
    return _back("/waits", done=f"{flow}/{step} #{generation}: {receipt.result.value}")


async def _approve(request: Request, store: Store, viewer: Viewer,
                   form: dict[str, str]) -> Response:
    wait = await _visible_wait(request, store, viewer)
    flow, step, generation = wait.flow, wait.step, wait.generation
    approve = _required(form, "approve")
    if approve not in ("true", "false"):
        raise _Refused(400, "approve: must be true or false")
    receipt = await run_in_threadpool(lambda: store.answer_approval(
        viewer.auth, _required(form, "event_id"), flow, step, generation,
        approve=approve == "true"))
    said = "approved" if approve == "true" else "denied"
    return _back("/waits", done=f"{flow}/{step} #{generation} {said}: {receipt.result.value}")


async def _requeue(request: Request, store: Store, viewer: Viewer,
                   form: dict[str, str]) -> Response:
    reply_id = request.path_params["reply_id"]
    await run_in_threadpool(lambda: store.requeue_reply(
        reply_id, operator=viewer.principal.name, reason=_required(form, "reason")))
    return _back("/replies/dead", done=f"{reply_id} requeued")


async def _retry(request: Request, store: Store, viewer: Viewer,
                 form: dict[str, str]) -> Response:
    task_id = request.path_params["task_id"]
    retry = await run_in_threadpool(lambda: store.retry(
        task_id, operator=viewer.principal.name, reason=_required(form, "reason"),
        request_id=form.get("request_id") or None))
    return _back(f"/tasks/{retry.new_task_id}", done=f"a re-run of {task_id}")


async def _retry_many(request: Request, store: Store, viewer: Viewer,
                      form: dict[str, str]) -> Response:
    state = form.get("state") or None
    queue = form.get("queue") or None
    reason = _required(form, "reason")
    dry_run = form.get("confirm") != "yes"
    chosen = await run_in_threadpool(lambda: store.retry_many(
        operator=viewer.principal.name, reason=reason, state=state, queue=queue,
        dry_run=dry_run, limit=PAGE * 20, request_id=form.get("request_id") or None))
    if dry_run:
        return _render("rerun.html", viewer, chosen=chosen, state=state or "",
                       queue=queue or "", reason=reason, request_id=uuid.uuid4().hex)
    return _back("/tasks", state=state or "", queue=queue or "",
                 done=f"{len(chosen)} task(s) run again")


async def _pause(request: Request, store: Store, viewer: Viewer,
                 form: dict[str, str]) -> Response:
    queue = _required(form, "queue")
    paused = await run_in_threadpool(lambda: store.pause_queue(
        queue, operator=viewer.principal.name, reason=_required(form, "reason")))
    return _back("/queues", done=f"{queue} paused" if paused else f"{queue} was paused already")


async def _resume(request: Request, store: Store, viewer: Viewer,
                  form: dict[str, str]) -> Response:
    queue = _required(form, "queue")
    resumed = await run_in_threadpool(store.resume_queue, queue)
    return _back("/queues", done=f"{queue} resumed" if resumed else f"{queue} was not paused")


# -- the chart -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chart:
    """Throughput and queue depth per minute over the observed window, oldest first.

    ``finished[i]`` counts the tasks (created in the window) that reached a terminal state in
    minute ``i``; ``depth[i]`` the tasks queued (created, not yet claimed nor ended) at its
    end, those queued since before the window included. ``svg`` draws both.
    """

    start: float
    finished: list[int]
    depth: list[int]
    svg: Markup


def chart(seen: Observation, *, minutes: int = 60) -> Chart:
    """The chart of an observation's last ``minutes`` minutes."""
    end = seen.status.at
    start = end - 60 * minutes
    finished = [0] * minutes
    depth = [seen.pending_before] * minutes
    ends = [start + 60 * (i + 1) for i in range(minutes)]
    for timeline in seen.recent:
        task = timeline.task
        if task.state.terminal and task.updated_at >= start:
            finished[min(minutes - 1, int((task.updated_at - start) // 60))] += 1
        left = (timeline.attempts[0].started_at if timeline.attempts
                else task.updated_at if task.state.terminal else math.inf)
        for i, at in enumerate(ends):
            if task.created_at <= at < left:
                depth[i] += 1
    return Chart(start=start, finished=finished, depth=depth, svg=_svg(finished, depth))


def _svg(finished: list[int], depth: list[int]) -> Markup:
    """Bars of finished tasks and a line of queue depth, each on its own scale (numbers
    only: nothing a user wrote is drawn, so the markup is safe as it is)."""
    width, height, pad = 720, 200, 24
    step = (width - 2 * pad) / len(finished)
    top_done, top_depth = max(1, *finished), max(1, *depth)
    bars = "".join(
        f'<rect x="{pad + i * step:.1f}" y="{height - pad - n / top_done * (height - 2 * pad):.1f}"'
        f' width="{max(1.0, step - 1):.1f}" height="{n / top_done * (height - 2 * pad):.1f}"'
        f' fill="#7aa7d8"><title>{n} finished</title></rect>'
        for i, n in enumerate(finished) if n)
    points = " ".join(
        f"{pad + (i + 0.5) * step:.1f},{height - pad - n / top_depth * (height - 2 * pad):.1f}"
        for i, n in enumerate(depth))
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="throughput and queue '
        f'depth, last {len(finished)} minutes">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff" stroke="#ccc"/>'
        f'{bars}<polyline points="{points}" fill="none" stroke="#c0392b" stroke-width="2"/>'
        f'<text x="{pad}" y="16" font-size="12">finished per minute (bars, max {top_done})'
        f' - queue depth (line, max {top_depth})</text></svg>')


# -- the routes ----------------------------------------------------------------------------------


def routes(store: Store, *, secure_cookie: bool = False) -> list[BaseRoute]:
    """The dashboard's routes, to pass as ``create_app(..., extra_routes=...)``.

    ``secure_cookie`` marks the session cookie ``Secure``: set it when the service is
    reached over HTTPS (a browser then never sends the token over plain HTTP).
    """
    def anyone(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return _served(store, handler, operator=False)

    def operators(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return _served(store, handler, operator=True)

    get, post = ["GET"], ["POST"]
    return [Route(PREFIX, lambda request: _back("/"), methods=get), Mount(PREFIX, routes=[
        Route("/login", _login_form, methods=get),
        Route("/login", _login(store, secure=secure_cookie), methods=post),
        Route("/logout", _logout, methods=post),
        Route("/", anyone(_overview), methods=get),
        Route("/tasks", anyone(_tasks), methods=get),
        Route("/tasks/{task_id}", anyone(_task), methods=get),
        Route("/tasks/{task_id}/retry", operators(_retry), methods=post),
        Route("/retries", operators(_retry_many), methods=post),
        Route("/waits", anyone(_waits), methods=get),
        Route("/waits/{flow}/{step}/{generation:int}/signal", anyone(_signal), methods=post),
        Route("/waits/{flow}/{step}/{generation:int}/approval", anyone(_approve),
              methods=post),
        Route("/replies/dead", operators(_dead), methods=get),
        Route("/replies/{reply_id}/requeue", operators(_requeue), methods=post),
        Route("/queues", operators(_queues), methods=get),
        Route("/queues/pause", operators(_pause), methods=post),
        Route("/queues/resume", operators(_resume), methods=post),
        Route("/audit", operators(_audit), methods=get),
    ])]
