"""Submit over HTTP against ``receive`` in process, one task at a time, on one backend.

In process: ``store.receive`` in a loop, one message and one commit each. Over HTTP: one
client (httpx, one keep-alive connection) posting ``POST /v1/tasks`` to a ``postroom serve``
process started with its defaults, as a client on another host would; each answer must be
202 before the next request is sent. Both run in databases of their own, ``sizes.http_tasks``
tasks per round, after an untimed warm-up; each round's ratio is to the raw loop around it,
and the bar divides the two ratios (the issue's bar: HTTP >= 0.5x in process). Afterwards
each database must hold exactly the tasks sent and audit clean.

Where an HTTP submission's time goes, measured beside it against the same server: the same
client asking ``GET /healthz`` (the whole HTTP path and its worker-thread hop, no store call)
and ``GET /v1/me`` (that plus authenticating the token: one indexed read), and the same
``POST /v1/tasks`` sent by the standard library's ``http.client`` (a client that costs far
less per request than httpx, so the server's share shows). And the floor: the same httpx
client posting the same body to a server that only answers 202 (``postroom._bench.answering``:
no framework, no store), which is the least a submission through that client can cost here;
the same floor for ``http.client``; and ``http.client`` against uvicorn, run as ``postroom
serve`` runs it, with an ASGI app that only makes the one trip to a worker thread every API
request makes before it answers 202 (``answering --asgi``): the floor of the server's stack
without the framework, authentication or the store. A submission can reach half the rate of
``receive`` only if everything but the store call costs no more than one ``receive``; these
floors say how much of that the client and the server's stack take before postroom's code runs.
The ceiling row adds them up: round by round, the rate of one ``receive`` plus one request to
the floor server, what a submission through httpx would reach if the whole service cost
nothing but its store call.

The server calls the store from a worker thread (the store is synchronous; the event loop
must keep serving), and that costs the call itself more than the bare trip the stack floor
times: the loop and the thread both sleep while the commit's fsync (or the database's round
trips) run, and each must be woken again. The row "``receive`` from an event loop" times
the same in-process ``receive`` made that way, one call at a time (with uvloop when it is
installed, as uvicorn runs): beside ``receive`` itself, it is what that trip adds to a
store call before any HTTP.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import postroom
from postroom._bench import answering
from postroom._bench.context import (
    BenchError,
    Context,
    Measurement,
    Numbers,
    Rounds,
    require_clean_audit,
)
from postroom._bench.scenarios import runtime

__all__ = ["run"]

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0


def _envelope(n: int, deadline: float) -> postroom.Envelope:
    """Task ``n`` of an in-process round."""
    return postroom.Envelope(message_id=f"m-{n}", sender="bench", payload={"n": n},
                             deadline=deadline)


def _in_process(store: postroom.Store, sent: Numbers, tasks: int) -> Callable[[], int]:
    def round_() -> int:
        deadline = time.time() + _DAY
        for n in sent.take(tasks):
            store.receive(_AUTH, _envelope(n, deadline))
        return tasks
    return round_


def _from_event_loop(store: postroom.Store, sent: Numbers, tasks: int,
                     threads: ThreadPoolExecutor) -> Callable[[], int]:
    """``_in_process``, each call handed from an event loop to a worker thread and awaited
    there, as the service makes its store calls."""
    async def calls() -> None:
        loop = asyncio.get_running_loop()
        deadline = time.time() + _DAY
        for n in sent.take(tasks):
            await loop.run_in_executor(threads, partial(store.receive, _AUTH,
                                                        _envelope(n, deadline)))

    def round_() -> int:
        _run_loop(calls())
        return tasks
    return round_


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop if it is installed (uvicorn's choice then), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def _over_http(client: object, sent: Numbers, tasks: int) -> Callable[[], int]:
    import httpx

    assert isinstance(client, httpx.Client)

    def round_() -> int:
        deadline = time.time() + _DAY
        for n in sent.take(tasks):
            answer = client.post("/v1/tasks", json={
                "message_id": f"m-{n}", "payload": {"n": n}, "deadline": deadline})
            if answer.status_code != 202:
                raise BenchError(f"POST /v1/tasks answered {answer.status_code}: "
                                 f"{answer.text[:300]}")
        return tasks
    return round_


def _asking(client: object, path: str, tasks: int) -> Callable[[], int]:
    import httpx

    assert isinstance(client, httpx.Client)

    def round_() -> int:
        for _ in range(tasks):
            answer = client.get(path)
            if answer.status_code != 200:
                raise BenchError(f"GET {path} answered {answer.status_code}: "
                                 f"{answer.text[:300]}")
        return tasks
    return round_


def _over_stdlib(port: int, token: str, sent: Numbers, tasks: int) -> Callable[[], int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30.0)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def round_() -> int:
        deadline = time.time() + _DAY
        for n in sent.take(tasks):
            body = json.dumps({"message_id": f"m-{n}", "payload": {"n": n},
                               "deadline": deadline}).encode()
            connection.request("POST", "/v1/tasks", body=body, headers=headers)
            answer = connection.getresponse()
            text = answer.read()
            if answer.status != 202:
                raise BenchError(f"POST /v1/tasks answered {answer.status}: {text[:300]!r}")
        return tasks
    return round_


@contextmanager
def _answering(port: int, *options: str) -> Iterator[None]:
    """Run ``postroom._bench.answering`` on ``port`` until the block ends."""
    process = subprocess.Popen([sys.executable, "-m", "postroom._bench.answering", str(port),
                                *options], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != answering.READY:
            raise BenchError(f"the answering server exited with code {process.wait()}")
        yield
    finally:
        process.kill()
        process.wait()


def _in_series(rates: tuple[float, float]) -> float:
    """The rate of doing one unit at each of ``rates`` in turn."""
    return 1.0 / sum(1.0 / rate for rate in rates)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check(store: postroom.Store, sent: Numbers, what: str) -> None:
    require_clean_audit(store._db)
    stored = sum(store.info()["tasks"].values())
    if stored != sent.used:
        raise BenchError(f"{what}: {sent.used} tasks sent, {stored} stored")


def _local(ctx: Context, tasks: int) -> tuple[Rounds, Rounds]:
    """The rounds of ``receive`` in process: called directly, then from an event loop."""
    with postroom.open_store(ctx.target.url("http-local")) as store:
        sent = Numbers()
        local = _in_process(store, sent, tasks)
        local()  # warm-up: the statements, the file's pages
        local_rounds = ctx.timed_rounds(local)
        with ThreadPoolExecutor(1, thread_name_prefix="bench-store") as threads:
            looped = _from_event_loop(store, sent, tasks, threads)
            looped()
            looped_rounds = ctx.timed_rounds(looped)
        _check(store, sent, "in process")
    return local_rounds, looped_rounds


def run(ctx: Context) -> list[Measurement]:
    """Tasks/s of one-at-a-time ``receive`` in process and of ``POST /v1/tasks``."""
    try:
        import httpx
    except ImportError as exc:  # the server extra brings httpx's peers; the bench extra both
        raise BenchError("the http-submit scenarios need the server extra: "
                         "pip install 'postroom[server]'") from exc
    backend, tasks = ctx.target.backend, ctx.sizes.http_tasks
    ctx.progress(f"http: {tasks} tasks per round, one at a time, in process and over HTTP "
                 f"({backend})")
    local_rounds, looped_rounds = _local(ctx, tasks)

    url = ctx.target.url("http-served")
    with postroom.open_store(url) as store:
        token = store.add_principal("bench", "agent").token
    port = _free_port()
    with runtime._children() as children:
        # The API alone, as the in-process receive it is compared with: no duties beside it.
        children.start("serve", url, "--port", str(port), "--no-duties")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0,
                          headers={"authorization": f"Bearer {token}"}) as client:
            sent = Numbers()
            remote = _over_http(client, sent, tasks)
            remote()  # warm-up: the connection, the server's statements
            remote_rounds = ctx.timed_rounds(remote)
            empty, whoami = _asking(client, "/healthz", tasks), _asking(client, "/v1/me", tasks)
            empty()
            empty_rounds = ctx.timed_rounds(empty)
            whoami_rounds = ctx.timed_rounds(whoami)
        stdlib = _over_stdlib(port, token, sent, tasks)
        stdlib()
        stdlib_rounds = ctx.timed_rounds(stdlib)
    with postroom.open_store(url) as store:
        _check(store, sent, "over HTTP")
    floor_port = _free_port()
    with _answering(floor_port), httpx.Client(
            base_url=f"http://127.0.0.1:{floor_port}", timeout=30.0,
            headers={"authorization": f"Bearer {token}"}) as client:
        floor = _over_http(client, Numbers(), tasks)
        floor()
        floor_rounds = ctx.timed_rounds(floor)
        stdlib_floor = _over_stdlib(floor_port, token, Numbers(), tasks)
        stdlib_floor()
        stdlib_floor_rounds = ctx.timed_rounds(stdlib_floor)
    stack_port = _free_port()
    with _answering(stack_port, "--asgi"):
        stack_floor = _over_stdlib(stack_port, token, Numbers(), tasks)
        stack_floor()
        stack_floor_rounds = ctx.timed_rounds(stack_floor)

    ceiling = Rounds(
        rates=tuple(_in_series(pair) for pair in zip(local_rounds.rates, floor_rounds.rates,
                                                      strict=True)),
        ratios=tuple(_in_series(pair) for pair in zip(local_rounds.ratios, floor_rounds.ratios,
                                                       strict=True)))
    details = {"tasks_per_round": tasks, "client": "httpx, one keep-alive connection",
               "server": "postroom serve, defaults"}
    return [
        Measurement(id=f"http.{backend}.receive", backend=backend, unit="tasks/s",
                    label="`receive` in process, one at a time", rounds=local_rounds,
                    details=details),
        Measurement(id=f"http.{backend}.receive_from_loop", backend=backend, unit="tasks/s",
                    label="`receive` in process, from an event loop: each call made in a "
                          "worker thread and awaited, as the service makes it",
                    rounds=looped_rounds, details=details),
        Measurement(id=f"http.{backend}.submit", backend=backend, unit="tasks/s",
                    label="`POST /v1/tasks` to `postroom serve`, one at a time",
                    rounds=remote_rounds, details=details),
        Measurement(id=f"http.{backend}.healthz", backend=backend, unit="requests/s",
                    label="`GET /healthz` (no store call), the same client",
                    rounds=empty_rounds, details=details),
        Measurement(id=f"http.{backend}.whoami", backend=backend, unit="requests/s",
                    label="`GET /v1/me` (authentication only), the same client",
                    rounds=whoami_rounds, details=details),
        Measurement(id=f"http.{backend}.submit_stdlib", backend=backend, unit="tasks/s",
                    label="`POST /v1/tasks`, sent with `http.client` (stdlib)",
                    rounds=stdlib_rounds,
                    details={**details, "client": "http.client, one keep-alive connection"}),
        Measurement(id=f"http.{backend}.client_floor", backend=backend, unit="requests/s",
                    label="the same POST, the same client, to a server that only answers 202",
                    rounds=floor_rounds,
                    details={**details, "server": "postroom._bench.answering (no framework, "
                                                  "no store)"}),
        Measurement(id=f"http.{backend}.ceiling", backend=backend, unit="tasks/s",
                    label="the ceiling of a submission through that client: one `receive` "
                          "then one request to that server, round by round (a service that "
                          "cost nothing but its store call)",
                    rounds=ceiling, details=details),
        Measurement(id=f"http.{backend}.stdlib_floor", backend=backend, unit="requests/s",
                    label="the same POST, sent with `http.client`, to that server",
                    rounds=stdlib_floor_rounds,
                    details={**details, "client": "http.client, one keep-alive connection",
                             "server": "postroom._bench.answering (no framework, no store)"}),
        Measurement(id=f"http.{backend}.stack_floor", backend=backend, unit="requests/s",
                    label="the same POST, sent with `http.client`, to uvicorn as `postroom "
                          "serve` runs it: one trip to a worker thread, then 202 (no "
                          "framework, no token, no store)",
                    rounds=stack_floor_rounds,
                    details={**details, "client": "http.client, one keep-alive connection",
                             "server": "postroom._bench.answering --asgi"}),
    ]
