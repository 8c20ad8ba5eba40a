"""Through the runtime: ``postroom worker`` and ``postroom dispatch`` processes at work.

Every figure here is made by the real commands, each a child process with its default
settings (``WorkerSettings()``: concurrency 16, prefetch automatic, settle_batch 500, linger 2 ms,
poll 1 s, duties on; ``DispatcherSettings()`` likewise), running the handlers of
``postroom._bench.handlers``. The bench only enqueues, pauses and resumes, and reads the
database; the processes are started once per figure and told to stop with SIGTERM.

A throughput round: the queue is paused, ``N`` tasks are received one at a time (not
timed), the queue is resumed (every worker, ready and idle, is woken at once), and the
round lasts from the first claim to the last task done (or the last reply sent), read from
the tasks' attempt history and the replies' ``sent_at`` in the database. Rounds are
sandwiched between baseline rounds like every other figure.

- ``worker``: one worker process on SQLite, a trivial handler;
- ``pg-workers``: four worker processes on PostgreSQL, against a raw PostgreSQL commit loop
  (one small-row INSERT per transaction, one connection) measured around every round;
- ``delivered``: one worker and one ``postroom dispatch --receiver`` process on SQLite,
  timed to the last reply delivered into the receiver's own database;
- ``worker-latency``, ``pg-worker-latency``: an idle worker; the bench receives one task at
  a time at random gaps, and a task's latency runs from ``receive`` returning to its
  handler starting (both read the host's monotonic clock; the handler returns it);
- ``concurrency``: a 50 ms ``async`` handler with ``--concurrency 1`` and ``8``;
- ``rss``, ``pg-rss``: the resident memory (``VmRSS``) of a worker and a dispatcher after a
  warm-up and at the end of a long run (``--rss-tasks``);
- ``scheduled``: one worker on 1,000 due tasks, with a backlog of tasks scheduled in the
  future (``Envelope.not_before``) and without.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from typing import IO, Any

import postroom
from postroom._bench.context import (
    BenchError,
    Context,
    Measurement,
    Rounds,
    median,
    require_clean_audit,
)
from postroom._bench.handlers import QUEUES

__all__ = ["PostgresCommitLoop", "rss_kib", "run_concurrency", "run_delivered",
           "run_pg_latency", "run_pg_rss", "run_pg_workers", "run_rss", "run_scheduled",
           "run_sqlite_latency", "run_worker"]

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0
#: Starts a postroom command as ``postroom`` would, with its INFO records on stderr: the
#: worker says when it started, which is how the bench knows it is ready.
_LAUNCH = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
           "from postroom.cli import main; main(sys.argv[1:], prog_name='postroom')")
_READY = {"worker": b"worker started", "dispatch": b'"dispatching"',
          "serve": b"Uvicorn running on"}
#: How long the bench waits for a process to be ready, or for a round to end.
_PATIENCE = 600.0
_LOOK_EVERY = 0.02


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """The resident set size of process ``pid`` in KiB (``VmRSS`` of ``/proc/PID/status``;
    ``field="VmHWM"`` gives its peak)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise BenchError(f"process {pid} has no {field}")


@dataclass(eq=False)
class _Child:
    """A ``postroom`` command running as a child process; its output goes to a file."""

    name: str
    process: subprocess.Popen[bytes]
    output: IO[bytes]

    def said(self, text: bytes) -> bool:
        self.output.flush()
        self.output.seek(0)
        return text in self.output.read()

    def tail(self) -> str:
        self.output.seek(0)
        return self.output.read()[-2000:].decode("utf-8", "replace")


@dataclass(eq=False)
class _Children:
    """The processes of one figure: started ready, checked while waiting, stopped at the end."""

    children: list[_Child] = field(default_factory=list)

    def start(self, name: str, *args: str) -> _Child:
        """Start ``postroom NAME ARGS...`` and wait until it says it is ready."""
        output = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close(), with the child
        process = subprocess.Popen([sys.executable, "-c", _LAUNCH, name, *args],
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=output)
        child = _Child(name, process, output)
        self.children.append(child)
        self.wait_for(lambda: child.said(_READY[name]), f"{name} to start")
        return child

    def check(self) -> None:
        """Raise ``BenchError`` if any process ended (a bench's process never ends early)."""
        for child in self.children:
            if child.process.poll() is not None:
                raise BenchError(f"postroom {child.name} exited with code "
                                 f"{child.process.returncode}: {child.tail()}")

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Look until ``done()``; raise ``BenchError`` if a process dies or it takes too long."""
        given_up = time.monotonic() + _PATIENCE
        while not done():
            self.check()
            if time.monotonic() > given_up:
                raise BenchError(f"waited {_PATIENCE:.0f}s for {what}")
            time.sleep(_LOOK_EVERY)

    def close(self) -> None:
        """SIGTERM every process (they stop cleanly, exit 143); kill those that do not."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            child.output.close()
        self.children.clear()


@contextmanager
def _children() -> Iterator[_Children]:
    children = _Children()
    try:
        yield children
    finally:
        children.close()


def _worker(children: _Children, url: str, queue: str, *options: str) -> _Child:
    return children.start("worker", url, "--import", "postroom._bench.handlers",
                          "--queue", queue, *options)


def _counted(store: postroom.Store, kind: str, queue: str, state: str) -> int:
    """Tasks (or replies) of ``queue`` that reached ``state``, from the store's counters."""
    row = store._db.read(lambda tx: tx.execute(
        "SELECT COALESCE(SUM(n), 0) AS n FROM postroom_counts WHERE kind = :kind "
        "AND queue = :queue AND state = :state",
        {"kind": kind, "queue": queue, "state": state}).fetchone())
    return int(row["n"])


def _envelope(queue: str, message_id: str, deadline: float,
              not_before: float | None = None) -> postroom.Envelope:
    return postroom.Envelope(message_id=message_id, sender="bench", queue=queue,
                             deadline=deadline, not_before=not_before, payload={})


class _Rig:
    """One store with its processes, and rounds of tasks received while its queue is paused."""

    def __init__(self, store: postroom.Store, children: _Children, queue: str,
                 *, replies: bool = False) -> None:
        self.store = store
        self.children = children
        self.queue = queue
        self.replies = replies
        self.done = 0
        self._rounds = count()

    def round(self, tasks: int) -> tuple[int, float]:
        """Receive ``tasks`` one at a time, paused; resume; (tasks, seconds from the first
        claim to the last done or delivered), read from the database."""
        store, queue = self.store, self.queue
        prefix = f"r{next(self._rounds)}-"
        store.pause_queue(queue, operator="bench", reason="receiving a round's tasks")
        deadline = time.time() + _DAY
        for n in range(tasks):
            store.receive(_AUTH, _envelope(queue, f"{prefix}{n}", deadline))
        self.done += tasks
        store.resume_queue(queue)
        kind, state = ("reply", "sent") if self.replies else ("task", "done")
        self.children.wait_for(lambda: _counted(store, kind, queue, state) >= self.done,
                               f"{tasks} tasks ({state})")
        first, last = _span(store, prefix, replies=self.replies)
        return tasks, last - first


def _span(store: postroom.Store, prefix: str, *, replies: bool) -> tuple[float, float]:
    """The first claim of the round's tasks, and the last task done (or reply sent)."""
    rows = store._db.read(lambda tx: tx.execute(
        "SELECT task_id, message_id, history FROM tasks WHERE state = 'done'").fetchall())
    ours = [(row["task_id"], json.loads(row["history"])) for row in rows
            if str(row["message_id"]).startswith(prefix)]
    first = min(history[0]["started_at"] for _, history in ours)
    if not replies:
        return first, max(history[-1]["ended_at"] for _, history in ours)
    ids = {task_id for task_id, _ in ours}
    sent = store._db.read(lambda tx: tx.execute(
        "SELECT task_id, sent_at FROM replies WHERE state = 'sent'").fetchall())
    return first, max(float(row["sent_at"]) for row in sent if row["task_id"] in ids)


@contextmanager
def _rig(ctx: Context, name: str, queue: str, *, workers: int = 1,
         worker_options: Sequence[str] = (), deliver: bool = False,
         url: str | None = None) -> Iterator[_Rig]:
    """A store at a new database (or ``url``) with ``workers`` worker processes (and a
    dispatcher into a receiver, with ``deliver``), every process ready."""
    store_url = url if url is not None else ctx.target.url(name)
    receiver_url = ctx.target.url(f"{name}-receiver") if deliver else None
    with ExitStack() as stack:
        store = stack.enter_context(postroom.open_store(store_url))
        if receiver_url is not None:
            postroom.Receiver.open(receiver_url).close()  # its schema, before two processes
        children = stack.enter_context(_children())
        for _ in range(workers):
            _worker(children, store_url, queue, *worker_options)
        if receiver_url is not None:
            children.start("dispatch", store_url, "--receiver", receiver_url)
        rig = _Rig(store, children, queue, replies=deliver)
        yield rig
        children.close()
        if receiver_url is not None:
            with postroom.Receiver.open(receiver_url) as receiver:
                if receiver.effects_total() != rig.done:
                    raise BenchError(f"{rig.done} tasks delivered but the receiver has "
                                     f"{receiver.effects_total()} effects")
                require_clean_audit(store._db, receiver._db)
        else:
            require_clean_audit(store._db)


def _throughput(id: str, label: str, rounds: Rounds, ctx: Context, **details: Any
                ) -> Measurement:
    return Measurement(id=id, backend=ctx.target.backend, unit="tasks/s", label=label,
                       rounds=rounds, details={"settings": "defaults", **details})


# -- throughput ---------------------------------------------------------------------------------

def run_worker(ctx: Context) -> list[Measurement]:
    """One ``postroom worker`` on SQLite: tasks/s of a trivial handler."""
    tasks = ctx.sizes.runtime_tasks
    ctx.progress(f"runtime: one worker process, {tasks:,} tasks per round")
    with _rig(ctx, "runtime-worker", QUEUES["trivial"]) as rig:
        rig.round(min(tasks, 500))  # warm-up: the worker's statements and the file's pages
        rounds = ctx.measured_rounds(lambda: rig.round(tasks))
    return [_throughput("runtime.sqlite.workers_1",
                        "one `postroom worker` process, trivial handler (first claim to last "
                        "done)", rounds, ctx, workers=1, tasks_per_round=tasks)]


def run_delivered(ctx: Context) -> list[Measurement]:
    """One worker and one ``postroom dispatch --receiver`` on SQLite: tasks/s delivered."""
    tasks = ctx.sizes.runtime_tasks
    ctx.progress(f"runtime: worker + dispatcher, {tasks:,} tasks per round")
    with _rig(ctx, "runtime-delivered", QUEUES["trivial"], deliver=True) as rig:
        rig.round(min(tasks, 500))
        rounds = ctx.measured_rounds(lambda: rig.round(tasks))
    return [_throughput("runtime.sqlite.delivered",
                        "one `postroom worker` + one `postroom dispatch --receiver` (first "
                        "claim to last reply delivered)", rounds, ctx, workers=1,
                        dispatchers=1, tasks_per_round=tasks)]


class PostgresCommitLoop:
    """The PostgreSQL yardstick: one small-row INSERT per transaction on one connection,
    server defaults (``synchronous_commit`` as the server has it)."""

    def __init__(self, url: str, *, commits: int) -> None:
        import psycopg  # the postgres extra

        self.commits = commits
        self.rates: list[float] = []
        self._conn = psycopg.connect(url)
        self._conn.execute("CREATE TABLE raw_rows (id BIGSERIAL PRIMARY KEY, body TEXT)")
        self._conn.commit()

    def round(self) -> float:
        """Commit ``commits`` one-row transactions; record and return commits/s."""
        conn = self._conn
        body = "x" * 100
        start = time.perf_counter()
        for _ in range(self.commits):
            conn.execute("INSERT INTO raw_rows (body) VALUES (%s)", (body,))
            conn.commit()
        rate = self.commits / (time.perf_counter() - start)
        self.rates.append(rate)
        return rate

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


@dataclass
class _BothLoops:
    """The run's baseline, with the PostgreSQL loop measured just before each of its rounds:
    every timed round is then sandwiched by both."""

    sqlite: Any
    postgres: PostgresCommitLoop

    def round(self) -> float:
        self.postgres.round()
        return float(self.sqlite.round())


def run_pg_workers(ctx: Context) -> list[Measurement]:
    """``postroom worker`` processes on PostgreSQL, ``sizes.pg_worker_curve`` of them in turn,
    each count against the raw PostgreSQL loop measured around its own rounds."""
    tasks = ctx.sizes.pg_runtime_tasks
    loop = PostgresCommitLoop(ctx.target.url("pg-raw-loop"), commits=ctx.sizes.raw_commits)
    rows = []
    raw_all: list[float] = []
    try:
        loop.round()  # warm-up
        for workers in ctx.sizes.pg_worker_curve:
            loop.rates.clear()
            ctx.progress(f"runtime: {workers} worker processes on PostgreSQL, {tasks:,} tasks "
                         "per round")
            with _rig(ctx, f"pg-runtime-workers-{workers}", QUEUES["trivial"],
                      workers=workers) as rig:
                rig.round(min(tasks, 500))
                both = Context(sizes=ctx.sizes, target=ctx.target, progress=ctx.progress,
                               baseline=_BothLoops(ctx.baseline, loop))
                rounds = both.measured_rounds(lambda: rig.round(tasks))
            raw = list(loop.rates)
            raw_all += raw
            # round i ran between the loop's rounds i and i + 1
            to_raw = [rate / ((raw[index] + raw[index + 1]) / 2)
                      for index, rate in enumerate(rounds.rates)]
            rows.append(_throughput(
                f"runtime.pg.workers_{workers}",
                f"PostgreSQL, {workers} `postroom worker` process{'es' if workers > 1 else ''}, "
                "trivial handler (first claim to last done)", rounds, ctx, workers=workers,
                tasks_per_round=tasks, raw_pg_rates=[round(rate, 1) for rate in raw],
                round_ratios_to_pg_raw=[round(ratio, 4) for ratio in to_raw],
                ratio_to_pg_raw=round(median(to_raw), 4)))
    finally:
        loop.close()
    return [Measurement(id="pg.raw_commit_loop", backend="postgres", unit="commits/s",
                        label="raw PostgreSQL commit loop (1 small-row INSERT per transaction, "
                              "1 connection, server defaults)",
                        rounds=Rounds(rates=tuple(raw_all)),
                        details={"commits_per_round": ctx.sizes.raw_commits}), *rows]


def run_concurrency(ctx: Context) -> list[Measurement]:
    """A 50 ms ``async`` handler with ``--concurrency`` 1 and 8: tasks/s of each."""
    tasks = ctx.sizes.io_tasks
    rows = []
    for concurrency in (1, 8):
        ctx.progress(f"runtime: 50 ms async handler, concurrency {concurrency}")
        with _rig(ctx, f"runtime-io-{concurrency}", QUEUES["io"],
                  worker_options=("--concurrency", str(concurrency))) as rig:
            rig.round(concurrency)
            rounds = ctx.measured_rounds(partial(rig.round, tasks))
        rows.append(_throughput(
            f"runtime.io.concurrency_{concurrency}",
            f"one `postroom worker --concurrency {concurrency}`, 50 ms async handler", rounds,
            ctx, workers=1, concurrency=concurrency, tasks_per_round=tasks))
    return rows


# -- latency ------------------------------------------------------------------------------------

def _latency(ctx: Context, key: str, what: str) -> list[Measurement]:
    tasks = ctx.sizes.latency_tasks
    queue = QUEUES["started"]
    rng = random.Random(0)
    p50s: list[float] = []
    p99s: list[float] = []
    split: dict[str, list[float]] = {"to_claim": [], "claim_to_start": []}
    with _rig(ctx, f"{key}-latency", queue) as rig:
        store = rig.store
        for index in range(ctx.sizes.rounds):
            deadline = time.time() + _DAY
            sent: dict[str, float] = {}
            sent_wall: dict[str, float] = {}
            for n in range(tasks):
                time.sleep(rng.uniform(0.005, 0.025))  # the worker is idle, waiting
                message_id = f"l{index}-{n}"
                store.receive(_AUTH, _envelope(queue, message_id, deadline))
                sent[message_id], sent_wall[message_id] = time.monotonic(), time.time()
            rig.done += tasks
            rig.children.wait_for(lambda: _counted(store, "task", queue, "done") >= rig.done,
                                  "the latency round's tasks")
            rows = store._db.read(lambda tx: tx.execute(
                "SELECT message_id, result, history FROM tasks WHERE state = 'done'"
            ).fetchall())
            ours = [(row["message_id"], json.loads(row["result"]),
                     json.loads(row["history"])[0]["started_at"]) for row in rows
                    if row["message_id"] in sent]
            latencies = sorted((result["started"] - sent[name]) * 1000
                               for name, result, _ in ours)
            # Where it goes, on the wall clock: until the claim transaction's time, and
            # from there (its statements, its commit, the hand-off) to the handler.
            split["to_claim"].append(median([(claimed - sent_wall[name]) * 1000
                                             for name, _, claimed in ours]))
            split["claim_to_start"].append(median([(result["started_wall"] - claimed) * 1000
                                                   for _, result, claimed in ours]))
            p50s.append(latencies[len(latencies) // 2])
            p99s.append(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])
            ctx.progress(f"{what} latency round {index + 1}: p50 {p50s[-1]:.2f} ms, "
                         f"p99 {p99s[-1]:.2f} ms")
    details = {"tasks_per_round": tasks, "gap_ms": [5, 25], "from": "receive() returned",
               "to": "the handler started, in an idle `postroom worker` process",
               "settings": "defaults",
               "median_ms_receive_to_claim_time": round(median(split["to_claim"]), 2),
               "median_ms_claim_time_to_handler": round(median(split["claim_to_start"]), 2)}
    return [Measurement(id=f"runtime.latency.{key}.{name}", backend=ctx.target.backend,
                        unit="ms", rounds=Rounds(rates=tuple(values)), details=details,
                        label=f"{what}: enqueue-to-start latency of an idle `postroom "
                              f"worker`, {name}")
            for name, values in (("p50", p50s), ("p99", p99s))]


def run_sqlite_latency(ctx: Context) -> list[Measurement]:
    """Enqueue-to-handler-start latency of an idle worker process on SQLite."""
    return _latency(ctx, "sqlite", "SQLite")


def run_pg_latency(ctx: Context) -> list[Measurement]:
    """Enqueue-to-handler-start latency of an idle worker process on PostgreSQL."""
    return _latency(ctx, "pg", "PostgreSQL")


# -- memory -------------------------------------------------------------------------------------

def _rss(ctx: Context, key: str, total: int) -> list[Measurement]:
    """Feed a worker and a dispatcher ``total`` tasks; their RSS after the warm-up and at
    the end."""
    warm_up = min(ctx.sizes.rss_warm_up, total)
    queue = QUEUES["trivial"]
    batch, ahead = 1_000, 5_000
    with _rig(ctx, f"{key}-rss", queue, deliver=True) as rig:
        store = rig.store
        worker, dispatcher = rig.children.children
        sizes: dict[str, list[int]] = {"worker": [], "dispatcher": []}
        started = time.perf_counter()

        def sent() -> int:
            return _counted(store, "reply", queue, "sent")

        def feed_to(goal: int) -> None:
            deadline = time.time() + _DAY
            while (delivered := sent()) < goal:
                if rig.done < goal and rig.done - delivered < ahead:
                    count_ = min(batch, goal - rig.done)
                    store.receive_atomic(_AUTH, [
                        _envelope(queue, f"m-{n}", deadline)
                        for n in range(rig.done, rig.done + count_)])
                    rig.done += count_
                    continue
                rig.children.check()
                time.sleep(_LOOK_EVERY * 5)

        # Read along the way too, so that a plateau (a cache filled up) shows from a leak.
        goals = sorted({warm_up, *(warm_up + (total - warm_up) * step // 4
                                   for step in range(1, 5))})
        readings: list[int] = []
        for goal in goals:
            feed_to(goal)
            readings.append(goal)
            sizes["worker"].append(rss_kib(worker.process.pid))
            sizes["dispatcher"].append(rss_kib(dispatcher.process.pid))
            ctx.progress(f"{key} rss after {goal:,} tasks delivered "
                         f"({time.perf_counter() - started:.0f}s): worker "
                         f"{sizes['worker'][-1]:,} KiB, dispatcher "
                         f"{sizes['dispatcher'][-1]:,} KiB")
    elapsed = time.perf_counter() - started
    return [Measurement(
        id=f"runtime.rss.{key}.{name}", backend=ctx.target.backend, unit="x",
        label=f"{'SQLite' if key == 'sqlite' else 'PostgreSQL'}: `postroom "
              f"{'worker' if name == 'worker' else 'dispatch'}` RSS after {total:,} tasks "
              f"over RSS after {warm_up:,}",
        rounds=Rounds(rates=(kib[-1] / kib[0],)),
        details={"rss_kib_after_warm_up": kib[0], "rss_kib_at_end": kib[-1],
                 "rss_kib_by_tasks_delivered": dict(zip(map(str, readings), kib, strict=True)),
                 "warm_up_tasks": warm_up, "tasks": total, "seconds": round(elapsed, 1),
                 "settings": "defaults"})
        for name, kib in sizes.items()]


def run_rss(ctx: Context) -> list[Measurement]:
    """Worker and dispatcher RSS over a long run on SQLite."""
    return _rss(ctx, "sqlite", ctx.sizes.rss_tasks)


def run_pg_rss(ctx: Context) -> list[Measurement]:
    """Worker and dispatcher RSS over a long run on PostgreSQL."""
    return _rss(ctx, "pg", ctx.sizes.pg_rss_tasks)


# -- scheduling ---------------------------------------------------------------------------------

def _schedule_future(store: postroom.Store, tasks: int, batch: int) -> None:
    """``tasks`` tasks not claimable for a day, received ``batch`` per transaction."""
    now = time.time()
    later, deadline = now + _DAY, now + 2 * _DAY
    for first in range(0, tasks, batch):
        store.receive_atomic(_AUTH, [
            _envelope(QUEUES["trivial"], f"future-{n}", deadline, not_before=later)
            for n in range(first, min(tasks, first + batch))])


def run_scheduled(ctx: Context) -> list[Measurement]:
    """claim+finish of due tasks by a worker, with and without a future backlog."""
    sizes = ctx.sizes
    due = sizes.due_tasks
    rows = []
    for backlog in (0, sizes.future_backlog):
        url = ctx.target.url(f"scheduled-{backlog}")
        if backlog:
            started = time.perf_counter()
            with postroom.open_store(url) as store:
                _schedule_future(store, backlog, sizes.build_batch)
            ctx.progress(f"scheduled: {backlog:,} future tasks received in "
                         f"{time.perf_counter() - started:.0f}s")
        ctx.progress(f"scheduled: {due:,} due tasks per round, {backlog:,} in the future")
        with _rig(ctx, "scheduled", QUEUES["trivial"], url=url) as rig:
            rig.round(min(due, 100))
            rounds = ctx.measured_rounds(partial(rig.round, due))
        rows.append(_throughput(
            f"runtime.scheduled.future_{backlog}",
            f"one `postroom worker`, {due:,} due tasks, {backlog:,} scheduled in the future",
            rounds, ctx, workers=1, tasks_per_round=due, future_backlog=backlog))
    return rows
