"""A worker on a host with no database access: ``RemoteWorker`` draining tasks through a
``postroom serve`` process, on one backend.

Each round enqueues its tasks untimed (one ``receive_atomic`` into the store the service
serves), then times one ``RemoteWorker.run`` until all of them are settled: with its
defaults (16 handlers at once, up to 16 tasks claimed per request, the outcomes waiting
committed together with one request), and one task at a time (``concurrency=1, batch=1``:
a claim request and a settle request per task). Two handlers: the trivial one, where the
requests are all the cost, and one that awaits 50 ms, as a call to a model or another
service would. Afterwards every task must be done and the store must audit clean.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import postroom
from postroom._bench.context import BenchError, Context, Measurement, require_clean_audit
from postroom._bench.handlers import QUEUES, app
from postroom._bench.scenarios import runtime
from postroom._bench.scenarios.http_submit import _free_port

__all__ = ["run"]

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0
#: (RemoteWorker options, the rows' key, their label)
_SHAPES: tuple[tuple[dict[str, int], str, str], ...] = (
    ({}, "defaults", "defaults (concurrency 16, batch 16)"),
    ({"concurrency": 1, "batch": 1}, "one_at_a_time",
     "one task at a time (concurrency 1, batch 1)"),
)


def _round(store: postroom.Store, client: object, queue: str, tasks: int, *,
           options: dict[str, int], numbers: list[int]) -> Callable[[], tuple[int, float]]:
    from postroom.client import Client, RemoteWorker

    assert isinstance(client, Client)

    def work() -> tuple[int, float]:
        first = numbers[0]
        numbers[0] += tasks
        deadline = time.time() + _DAY
        store.receive_atomic(_AUTH, [postroom.Envelope(
            message_id=f"{queue}-{n}", sender="bench", queue=queue, payload={},
            deadline=deadline) for n in range(first, first + tasks)])
        worker = RemoteWorker(client, app, queues=[queue], poll=0.2,
                              concurrency=options.get("concurrency", 16),
                              batch=options.get("batch"))
        running = threading.Thread(target=worker.run, name="bench-remote-worker")
        start = time.perf_counter()
        running.start()
        while sum(worker.settled.values()) < tasks:
            time.sleep(0.002)
            if not running.is_alive():
                raise BenchError(f"the remote worker stopped after {worker.settled}")
        seconds = time.perf_counter() - start
        worker.stop()
        running.join()
        if worker.settled["finish"] != tasks:
            raise BenchError(f"{tasks} tasks, settled {worker.settled}")
        return tasks, seconds
    return work


def run(ctx: Context) -> list[Measurement]:
    """Tasks/s of a remote worker, with its defaults and one task at a time."""
    try:
        from postroom.client import Client
    except ImportError as exc:
        raise BenchError("the remote-worker scenarios need the server extra: "
                         "pip install 'postroom[server]'") from exc
    backend = ctx.target.backend
    url = ctx.target.url("remote-worker")
    queues = {"trivial": (QUEUES["trivial"], ctx.sizes.remote_tasks),
              "io": (QUEUES["io"], ctx.sizes.io_tasks)}
    ctx.progress(f"remote worker: {ctx.sizes.remote_tasks} trivial and {ctx.sizes.io_tasks} "
                 f"50 ms tasks per round, through postroom serve ({backend})")
    rows: list[Measurement] = []
    with postroom.open_store(url) as store:
        token = store.add_principal("bench-worker", "worker",
                                    queues=[queue for queue, _ in queues.values()]).token
        port = _free_port()
        with runtime._children() as children, Client(
                f"http://127.0.0.1:{port}", token, timeout=60.0) as client:
            children.start("serve", url, "--port", str(port), "--no-duties")  # the API alone
            numbers = [0]
            for kind, (queue, tasks) in queues.items():
                for options, key, label in _SHAPES:
                    work = _round(store, client, queue, tasks, options=options,
                                  numbers=numbers)
                    work()  # warm-up: the connection, the server's statements
                    rows.append(Measurement(
                        id=f"remote.{backend}.{kind}.{key}", backend=backend, unit="tasks/s",
                        label=f"`RemoteWorker` through `postroom serve`, "
                              f"{'trivial' if kind == 'trivial' else '50 ms'} handler, "
                              f"{label}",
                        rounds=ctx.measured_rounds(work),
                        details={"tasks_per_round": tasks, "handler": kind, **options}))
        done = store.info()["tasks"].get("done", 0)
        if done != numbers[0]:
            raise BenchError(f"{numbers[0]} tasks sent, {done} done")
        require_clean_audit(store._db)
    return rows
