"""PostgreSQL: many worker processes on one shared database, and wake-up latency.

Registered in ``bench.runner.SCENARIOS`` as ``pg-claim``, ``pg-e2e`` and ``pg-latency``; they
run on a ``PostgresTarget`` (``postroom bench --pg-url``). Their tasks/s are still divided by
the raw SQLite loop measured around each round, but only as context: the server has its own
disk, fsync settings and processes. A latency has no ratio.

Each worker is a process with its own store (its own connection pool and sessions), as a
worker on another host would be. The processes start before the timed rounds; a round
releases them together (a barrier) and ends when the last one is done, so process start-up
and connection set-up are not counted.

- claim+finish with 1, 4 and 16 workers (``Sizes.pg_workers``), one task per transaction
  pair (``claim``, ``finish``) and in batches (``claim_batch``, ``finish_batch``), from a
  backlog topped up before each round;
- end to end with the same numbers of workers: each worker receives its own tasks, claims (whoever's
  they are), finishes and dispatches to a receiver on its own database, one at a time or in
  batches; afterwards every task must have exactly one receiver effect and both databases
  must audit clean;
- enqueue-to-start latency: an idle worker waits with ``Store.waiter`` (LISTEN/NOTIFY), and
  another process enqueues one task at a time at random intervals; the latency is from the
  ``receive`` call to the moment the worker's ``claim`` returned that task (both read the
  host's monotonic clock).
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import postroom
from postroom._bench.context import BenchError, Context, Measurement, Rounds, require_clean_audit

__all__ = ["DEFAULT_URL", "PostgresTarget", "public_url", "run_claim", "run_end_to_end",
           "run_latency"]

#: The server ``postroom bench`` uses unless told otherwise (``--pg-url``).
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0
_SPAWN = multiprocessing.get_context("spawn")
#: How long the conductor waits for a worker process before it gives up on the run.
_PATIENCE = 600.0
#: How long the conductor waits at a round's barrier: members reach it as soon as they read
#: their command, so only a dead or stuck member takes longer.
_RELEASE = 60.0


def public_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for reports and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=user + host))


class PostgresTarget:
    """Fresh, empty schemas in one PostgreSQL database; each is dropped by ``close``.

    A schema per name (its URL sets ``search_path``) costs a millisecond where a database
    would cost a checkpoint; postroom keeps stores in different schemas apart, wake-ups
    included.
    """

    backend = "postgres"

    def __init__(self, url: str) -> None:
        self._url = url
        self._schemas: list[str] = []

    def describe(self) -> dict[str, Any]:
        """The server's version and durability settings; raises if it cannot be reached."""
        import psycopg

        with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
            settings = {name: conn.execute(f"SHOW {name}").fetchone()
                        for name in ("server_version", "fsync", "synchronous_commit")}
        return {"url": public_url(self._url),
                **{name: row[0] if row else None for name, row in settings.items()}}

    def url(self, name: str) -> str:
        """The URL of a new, empty schema for ``name``."""
        import psycopg  # the postgres extra: imported only when this target is used

        schema = "bench_" + "".join(ch if ch.isalnum() else "_" for ch in name.lower())
        schema = f"{schema[:40]}_{len(self._schemas)}_{time.time_ns() % 1_000_000}"
        with psycopg.connect(self._url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        self._schemas.append(schema)
        separator = "&" if "?" in self._url else "?"
        return f"{self._url}{separator}options=-csearch_path%3D{schema}"

    def close(self) -> None:
        """Drop every schema handed out."""
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as conn:
            for schema in self._schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        self._schemas.clear()


def _envelope(prefix: str, n: int, deadline: float) -> postroom.Envelope:
    return postroom.Envelope(message_id=f"{prefix}-{n}", sender="bench", deadline=deadline,
                             payload={"n": n, "kind": "summarize", "doc": f"doc-{n}"})


# -- the worker processes -----------------------------------------------------------------------

def _claim_job(store: postroom.Store, owner: str, count: int, batch: int) -> int:
    done = 0
    while done < count:
        if batch == 1:
            claim = store.claim(owner)
            if claim is None:
                raise BenchError("the backlog ran dry")
            store.finish(claim, {"n": claim.payload["n"]})
            done += 1
        else:
            claims = store.claim_batch(owner, min(batch, count - done))
            if not claims:
                raise BenchError("the backlog ran dry")
            store.finish_batch([(claim, {"n": claim.payload["n"]}) for claim in claims])
            done += len(claims)
    return done


class _Pipeline:
    """One worker's end-to-end loop: its own tasks in, anyone's tasks out."""

    def __init__(self, store: postroom.Store, receiver_url: str, owner: str) -> None:
        self.store = store
        self.owner = owner
        self.transport = postroom.InProcessTransport(postroom.Receiver.open(receiver_url))
        self.sent = 0

    def run(self, count: int, batch: int) -> int:
        store = self.store
        deadline = time.time() + _DAY
        for _ in range(0, count, batch):
            numbers = range(self.sent, self.sent + batch)
            self.sent += batch
            if batch == 1:
                store.receive(_AUTH, _envelope(self.owner, numbers[0], deadline))
            else:
                store.receive_atomic(_AUTH, [_envelope(self.owner, n, deadline)
                                             for n in numbers])
            claims = store.claim_batch(self.owner, batch)
            if claims:
                store.finish_batch([(claim, {"n": claim.payload["n"]}) for claim in claims])
            store.dispatch(self.transport, owner=self.owner, limit=batch)
        return count


def _member(*, url: str, receiver_url: str | None, owner: str, batch: int, commands: Any,
            start: Any, results: Any) -> None:
    """A worker process: set up once, then run one job per command until told to stop."""
    store = postroom.open_store(url)
    pipeline = _Pipeline(store, receiver_url, owner) if receiver_url else None
    store.claim(owner, queues="bench-warm-up")  # a connection, prepared, before round one
    results.put(("ready", owner))
    while True:
        count = commands.get()
        if count is None:
            break
        start.wait()
        try:
            if pipeline is not None:
                done = pipeline.run(count, batch)
            else:
                done = _claim_job(store, owner, count, batch)
            results.put(("done", done))
        except Exception as exc:  # reported to the conductor, which raises it there
            results.put(("error", f"{owner}: {type(exc).__name__}: {exc}"))
    store.close()


class _Swarm:
    """``size`` worker processes released together for each round."""

    def __init__(self, url: str, size: int, *, job: str, batch: int,
                 receiver_url: str | None = None) -> None:
        self.size = size
        self._start = _SPAWN.Barrier(size + 1)
        self._results: Any = _SPAWN.Queue()
        self._commands = [_SPAWN.Queue() for _ in range(size)]
        self._processes = [
            _SPAWN.Process(target=_member, daemon=True, kwargs={
                "url": url, "receiver_url": receiver_url, "owner": f"{job}-{size}-{index}",
                "batch": batch, "commands": self._commands[index],
                "start": self._start, "results": self._results})
            for index in range(size)]
        for process in self._processes:
            process.start()
        try:
            self._collect("ready")
        except BaseException:
            self.close()
            raise

    def _collect(self, kind: str) -> list[Any]:
        """One ``kind`` report per member; a member's error or death raises ``BenchError``."""
        found: list[Any] = []
        given_up = time.monotonic() + _PATIENCE
        while len(found) < self.size:
            try:
                status, value = self._results.get(timeout=1.0)
            except queue.Empty:
                self._require_alive(kind)
                if time.monotonic() > given_up:
                    raise BenchError(f"no worker process answered for {_PATIENCE:.0f}s "
                                     f"({kind})") from None
                continue
            if status == "error":
                raise BenchError(value)
            if status != kind:
                raise BenchError(f"expected {kind}, got {status}")
            found.append(value)
        return found

    def _require_alive(self, kind: str) -> None:
        dead = [p for p in self._processes if p.exitcode is not None]
        if dead:
            raise BenchError(f"a worker process exited with code {dead[0].exitcode} "
                             f"while the run waited for it ({kind})")

    def round(self, per_member: int) -> tuple[int, float]:
        """Release every member for ``per_member`` tasks; (tasks done, seconds)."""
        self._require_alive("round")
        for commands in self._commands:
            commands.put(per_member)
        try:
            self._start.wait(timeout=_RELEASE)
        except threading.BrokenBarrierError:
            self._require_alive("release")
            raise BenchError(f"the worker processes did not all reach the start of the round "
                             f"within {_RELEASE:.0f}s") from None
        began = time.perf_counter()
        done = sum(self._collect("done"))
        return done, time.perf_counter() - began

    def close(self) -> None:
        """Tell every member to stop; kill those that do not."""
        for commands in self._commands:
            commands.put(None)
        for process in self._processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


def _timed(ctx: Context, swarm: _Swarm, per_member: int,
           before: Callable[[], None] | None = None) -> Rounds:
    """``ctx.timed_rounds`` of swarm rounds (handing out a round costs well under 1 ms)."""
    return ctx.timed_rounds(lambda: swarm.round(per_member)[0], before=before)


# -- scenarios ----------------------------------------------------------------------------------

def run_claim(ctx: Context) -> list[Measurement]:
    """claim+finish tasks/s with ``sizes.pg_workers`` worker processes, single and batched."""
    rows = []
    total = ctx.sizes.claim_cycles * 4
    for batch in (1, ctx.sizes.batch_size // 10 or 10):
        for workers in ctx.sizes.pg_workers:
            url = ctx.target.url(f"pg-claim-{batch}-{workers}")
            per_member = max(batch, total // workers // batch * batch)
            with postroom.open_store(url) as store:
                received = 0

                def refill(store: postroom.Store = store, need: int = per_member * workers
                           ) -> None:
                    nonlocal received
                    pending = store.info()["tasks"].get("pending", 0)
                    deadline = time.time() + _DAY
                    while pending < need:
                        count = min(5_000, need - pending)
                        store.receive_atomic(_AUTH, [_envelope("backlog", n, deadline)
                                                     for n in range(received,
                                                                    received + count)])
                        received += count
                        pending += count

                ctx.progress(f"postgres claim+finish: {workers} workers, batch {batch}")
                swarm = _Swarm(url, workers, job="claim", batch=batch)
                try:
                    refill()
                    swarm.round(per_member)  # warm-up
                    rounds = _timed(ctx, swarm, per_member, before=refill)
                finally:
                    swarm.close()
            rows.append(_row("claim_finish", "claim+finish", rounds, workers=workers,
                             batch=batch, tasks=per_member * workers))
    return rows


def _row(key: str, what: str, rounds: Rounds, *, workers: int, batch: int,
         tasks: int) -> Measurement:
    kind = "one at a time" if batch == 1 else f"batches of {batch}"
    return Measurement(
        id=f"pg.{key}.{'single' if batch == 1 else 'batched'}.workers_{workers}",
        backend="postgres", unit="tasks/s", rounds=rounds,
        label=f"PostgreSQL {what}, {workers} worker process{'es' if workers > 1 else ''}, "
              f"{kind}",
        details={"workers": workers, "batch": batch, "tasks_per_round": tasks})


def run_end_to_end(ctx: Context) -> list[Measurement]:
    """End-to-end tasks/s with ``sizes.pg_workers`` worker processes, single and batched."""
    rows = []
    for batch in (1, ctx.sizes.batch_size // 10 or 10):
        for workers in ctx.sizes.pg_workers:
            store_url = ctx.target.url(f"pg-e2e-{batch}-{workers}")
            receiver_url = ctx.target.url(f"pg-e2e-{batch}-{workers}-receiver")
            per_member = max(batch, ctx.sizes.single_tasks * 2 // workers // batch * batch)
            ctx.progress(f"postgres end to end: {workers} workers, batch {batch}")
            swarm = _Swarm(store_url, workers, job="e2e", batch=batch,
                           receiver_url=receiver_url)
            try:
                swarm.round(per_member)  # warm-up
                rounds = _timed(ctx, swarm, per_member)
            finally:
                swarm.close()
            _drain_and_check(store_url, receiver_url)
            rows.append(_row("e2e", "end to end", rounds, workers=workers, batch=batch,
                             tasks=per_member * workers))
    return rows


def _drain_and_check(store_url: str, receiver_url: str) -> None:
    """Finish whatever a round left in flight, then demand one effect per task."""
    with postroom.open_store(store_url) as store, \
            postroom.Receiver.open(receiver_url) as receiver:
        transport = postroom.InProcessTransport(receiver)
        while claims := store.claim_batch("drain", 500):
            store.finish_batch([(claim, None) for claim in claims])
        while store.dispatch(transport, owner="drain", limit=500).claimed:
            pass
        tasks = sum(store.info()["tasks"].values())
        if receiver.effects_total() != tasks:
            raise BenchError(f"{tasks} tasks but {receiver.effects_total()} receiver effects")
        require_clean_audit(store._db, receiver._db)


def _idle_worker(url: str, count: int, ready: Any, results: Any) -> None:
    store = postroom.open_store(url)
    waiter = store.waiter(queues="latency")
    store.claim("idle", queues="latency")  # warm: connection and prepared statements
    ready.set()
    started: dict[int, float] = {}
    while len(started) < count:
        claim = store.claim("idle", queues="latency")
        if claim is None:
            waiter.wait(timeout=1.0)
            continue
        started[int(claim.payload["n"])] = time.monotonic()
        store.finish(claim, None)
    results.put(started)
    store.close()


def _latency_round(url: str, count: int, rng: random.Random) -> list[float]:
    """Enqueue ``count`` tasks for an idle worker process; their latencies in ms, sorted."""
    ready, results = _SPAWN.Event(), _SPAWN.Queue()
    worker = _SPAWN.Process(target=_idle_worker, args=(url, count, ready, results),
                            daemon=True)
    try:
        with postroom.open_store(url) as store:
            worker.start()
            if not ready.wait(timeout=120):
                raise BenchError(f"the idle worker did not start (exit code {worker.exitcode})")
            deadline = time.time() + _DAY
            sent: dict[int, float] = {}
            for n in range(count):
                time.sleep(rng.uniform(0.005, 0.025))  # the worker is idle, waiting
                sent[n] = time.monotonic()
                store.receive(_AUTH, postroom.Envelope(
                    message_id=f"latency-{n}", sender="bench", deadline=deadline,
                    queue="latency", payload={"n": n}))
            try:
                started = results.get(timeout=_PATIENCE)
            except queue.Empty:
                raise BenchError(f"the idle worker did not start all {count} tasks "
                                 f"(exit code {worker.exitcode})") from None
        worker.join(timeout=60)
    finally:
        if worker.is_alive():
            worker.kill()
    return sorted((started[n] - sent[n]) * 1000 for n in range(count))


def run_latency(ctx: Context) -> list[Measurement]:
    """Enqueue-to-start latency of an idle worker woken by LISTEN/NOTIFY (p50, p99)."""
    count = ctx.sizes.latency_tasks
    p50s: list[float] = []
    p99s: list[float] = []
    rng = random.Random(0)
    for index in range(ctx.sizes.rounds):
        latencies = _latency_round(ctx.target.url(f"pg-latency-{index}"), count, rng)
        p50s.append(latencies[len(latencies) // 2])
        p99s.append(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])
        ctx.progress(f"postgres latency round {index + 1}: p50 {p50s[-1]:.2f} ms, "
                     f"p99 {p99s[-1]:.2f} ms")
    details = {"tasks_per_round": count, "gap_ms": [5, 25],
               "from": "receive() called", "to": "the idle worker's claim() returned it"}
    return [
        Measurement(id="pg.latency.p50", backend="postgres", unit="ms",
                    label="PostgreSQL enqueue-to-start latency, idle worker, p50",
                    rounds=Rounds(rates=tuple(p50s)), details=details),
        Measurement(id="pg.latency.p99", backend="postgres", unit="ms",
                    label="PostgreSQL enqueue-to-start latency, idle worker, p99",
                    rounds=Rounds(rates=tuple(p99s)), details=details),
    ]
