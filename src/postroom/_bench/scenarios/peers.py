"""postroom beside the queues a Python user would otherwise pick, on the same workload.

``peers`` (SQLite) runs huey; ``pg-peers`` (PostgreSQL) runs procrastinate and oban-py; each
also runs postroom on that backend through its runtime (``postroom worker`` processes with
default settings), to done and to delivered (one ``postroom dispatch --receiver`` beside the
workers). A round, for every system alike:

1. **enqueue**: ``N`` trivial jobs, one at a time, each its own durable commit, by the
   system's client; no worker runs. ``enqueue/s`` is ``N`` over that time.
2. **process**: the system's own worker processes are started and take the jobs;
   ``processed/s`` is ``N`` over the time from the first job taken to the last done, read
   from the system's own timestamps where it keeps them (postroom's attempt history and
   replies' ``sent_at``, procrastinate's events, oban's ``attempted_at`` and
   ``completed_at``) and, for huey, which deletes a job when it takes it and keeps no
   time, by polling its table every 5 ms (the first poll with fewer than ``N`` jobs to the
   first with none).
3. ``end-to-end/s`` is ``N`` over the two times added.

Worker peak RSS is the largest ``VmHWM`` of ``/proc/PID/status`` among a system's worker
processes (huey's consumer and its worker processes), read just before they are stopped.

Durability, the same class everywhere (each commit durable on disk before it returns):
huey's ``SqliteHuey(fsync=True)`` (WAL, ``synchronous=FULL``) and postroom's SQLite (WAL,
``synchronous=FULL``); on PostgreSQL, the server's defaults (``fsync``, and
``synchronous_commit`` as the report shows them) for every system.

The peers are not postroom's dependencies: the optional ``bench`` extra installs huey and
procrastinate; oban-py needs Python >= 3.12, so the bench gives it a virtual environment of
its own (``ensure_oban_python``). Their programs live in ``postroom._bench.peer_apps`` and
run as child processes. With ``--quick``, a peer that is not installed is left out with a
printed reason; a real run fails instead.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

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
from postroom._bench.scenarios import runtime
from postroom.db import sqlite_path

__all__ = ["OBAN_VENV", "WORKERS", "best_pg_peer_bar", "ensure_oban_python", "markdown",
           "peer_bars", "run_pg_peers", "run_sqlite_peers"]

#: Worker processes of each row.
WORKERS = (1, 4)
#: Where the bench makes oban-py's virtual environment when it is missing
#: (``POSTROOM_BENCH_OBAN_VENV`` chooses another).
OBAN_VENV = Path.home() / ".cache" / "postroom-bench" / "oban-venv"
_APPS = Path(__file__).resolve().parent.parent / "peer_apps"
_AUTH = postroom.AuthContext(principal="bench")
_POLL = 0.005
_PATIENCE = 1800.0
_DURABILITY = {
    "huey": "SqliteHuey(fsync=True): WAL, synchronous=FULL",
    "postroom-sqlite": "postroom's SQLite: WAL, synchronous=FULL",
    "procrastinate": "PostgreSQL server defaults",
    "oban": "PostgreSQL server defaults",
    "postroom-pg": "PostgreSQL server defaults",
}


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _largest_peak(pids: Sequence[int]) -> int:
    every = [pid for root in pids for pid in (root, *_descendants(root))]
    return max(runtime.rss_kib(pid, "VmHWM") for pid in every)


@dataclass(frozen=True)
class _Round:
    enqueue_s: float
    process_s: float
    peak_rss_kib: int


# -- the peers ----------------------------------------------------------------------------------

class _Peer:
    """A peer's program: ``enqueue`` and ``work`` as child processes, and how to read its
    database for the jobs done and the time they took."""

    name = ""
    backend = ""

    def __init__(self, python: str, url: str) -> None:
        self.python = python
        self.url = url
        self.done = 0

    def command(self, *args: str) -> list[str]:
        return [self.python, str(_APPS / f"{self.name}_app.py"), *args]

    def prepare(self) -> None:
        """Make the peer's schema."""

    def enqueue(self, tasks: int) -> float:
        """Enqueue ``tasks`` one at a time; the seconds the client took."""
        done = subprocess.run(self.command("enqueue", self.url, str(tasks)), check=False,
                              capture_output=True, text=True, timeout=_PATIENCE)
        if done.returncode != 0:
            raise BenchError(f"{self.name} enqueue failed: {done.stderr[-2000:]}")
        return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])

    def workers(self, count: int) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` worker processes."""
        return [self._start("work", "0") for _ in range(count)]

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command(args[0], self.url, *args[1:]),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def process(self, tasks: int, alive: Callable[[], None]) -> float:
        """Wait until the round's ``tasks`` are done; the seconds from first taken to last
        done."""
        raise NotImplementedError


class _Huey(_Peer):
    name, backend = "huey", "sqlite"

    def workers(self, count: int) -> list[subprocess.Popen[bytes]]:
        return [self._start("work", str(count))]  # one consumer, ``count`` worker processes

    def _waiting(self) -> int:
        conn = sqlite3.connect(self.url, timeout=30)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM task").fetchone()[0])
        finally:
            conn.close()

    def process(self, tasks: int, alive: Callable[[], None]) -> float:
        first = None
        given_up = time.monotonic() + _PATIENCE
        while (waiting := self._waiting()) > 0:
            if first is None and waiting < tasks:
                first = time.perf_counter()
            alive()
            if time.monotonic() > given_up:
                raise BenchError(f"huey: {waiting} jobs still waiting")
            time.sleep(_POLL)
        end = time.perf_counter()
        return end - (first if first is not None else end)


class _PostgresPeer(_Peer):
    backend = "postgres"
    #: SQL: how many of the jobs with ``id > :floor`` are done, and the seconds from the
    #: first taken to the last done.
    done_sql = ""
    span_sql = ""
    floor_sql = ""

    def process(self, tasks: int, alive: Callable[[], None]) -> float:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            floor = self.done
            given_up = time.monotonic() + _PATIENCE
            while True:
                row = conn.execute(self.done_sql, {"floor": floor}).fetchone()
                if row is not None and int(row[0]) >= tasks:
                    break
                alive()
                if time.monotonic() > given_up:
                    raise BenchError(f"{self.name}: jobs still not done")
                time.sleep(_POLL * 4)
            span = conn.execute(self.span_sql, {"floor": floor}).fetchone()
            self.done = int(conn.execute(self.floor_sql).fetchone()[0])  # type: ignore[index]
        assert span is not None
        return float(span[0])


class _Procrastinate(_PostgresPeer):
    name = "procrastinate"
    done_sql = ("SELECT COUNT(*) FROM procrastinate_jobs WHERE id > %(floor)s "
                "AND status = 'succeeded'")
    span_sql = ("SELECT EXTRACT(EPOCH FROM MAX(at) FILTER (WHERE type = 'succeeded') "
                "- MIN(at) FILTER (WHERE type = 'started')) FROM procrastinate_events "
                "WHERE job_id > %(floor)s")
    floor_sql = "SELECT COALESCE(MAX(id), 0) FROM procrastinate_jobs"

    def prepare(self) -> None:
        done = subprocess.run(self.command("schema", self.url, "0"), check=False,
                              capture_output=True, text=True, timeout=_PATIENCE)
        if done.returncode != 0:
            raise BenchError(f"procrastinate schema failed: {done.stderr[-2000:]}")


class _Oban(_Procrastinate):
    name = "oban"
    done_sql = ("SELECT COUNT(*) FROM oban_jobs WHERE id > %(floor)s "
                "AND state = 'completed'")
    span_sql = ("SELECT EXTRACT(EPOCH FROM MAX(completed_at) - MIN(attempted_at)) "
                "FROM oban_jobs WHERE id > %(floor)s")
    floor_sql = "SELECT COALESCE(MAX(id), 0) FROM oban_jobs"


def ensure_oban_python(progress: Callable[[str], None]) -> str:
    """The interpreter of oban-py's virtual environment, made (Python >= 3.12 from pyenv,
    then ``pip install oban``) when missing. Raises ``BenchError`` when it cannot be."""
    venv = Path(os.environ.get("POSTROOM_BENCH_OBAN_VENV", OBAN_VENV))
    python = venv / "bin" / "python"
    if python.exists() and _imports(str(python), "oban"):
        return str(python)
    bases = sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python"))
    if not bases:
        raise BenchError("oban-py needs Python >= 3.12 and none was found under "
                         "~/.pyenv/versions")
    progress(f"peers: making oban-py's virtual environment at {venv} with {bases[-1]}")
    for args in ([str(bases[-1]), "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", "oban"]):
        done = subprocess.run(args, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return str(python)


def _imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], check=False,
                          capture_output=True).returncode == 0


# -- rounds -------------------------------------------------------------------------------------

def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _peer_round(peer: _Peer, tasks: int, workers: int) -> _Round:
    enqueue_s = peer.enqueue(tasks)
    processes = peer.workers(workers)
    try:
        def alive() -> None:
            for process in processes:
                if process.poll() is not None:
                    raise BenchError(f"a {peer.name} worker exited with code "
                                     f"{process.returncode}")

        process_s = peer.process(tasks, alive)
        peak = _largest_peak([process.pid for process in processes])
    finally:
        _stop(processes)
    return _Round(enqueue_s, process_s, peak)


@contextmanager
def _postroom(ctx: Context, workers: int, *, deliver: bool) -> Iterator[Callable[[int],
                                                                                  _Round]]:
    """postroom's rounds, as the peers': receive one at a time with no process running,
    then start the ``postroom worker`` processes (and a dispatcher) and time them from the
    database, as ``runtime`` does."""
    name = f"peers-postroom-{workers}{'-delivered' if deliver else ''}"
    queue = QUEUES["trivial"]
    store_url = ctx.target.url(name)
    receiver_url = ctx.target.url(f"{name}-receiver") if deliver else None
    rounds = count()
    with postroom.open_store(store_url) as store:
        if receiver_url is not None:
            postroom.Receiver.open(receiver_url).close()  # its schema, before two processes

        def one(tasks: int) -> _Round:
            prefix = f"r{next(rounds)}-"
            deadline = time.time() + 86_400
            start = time.perf_counter()
            for n in range(tasks):
                store.receive(_AUTH, runtime._envelope(queue, f"{prefix}{n}", deadline))
            enqueue_s = time.perf_counter() - start
            kind, state = ("reply", "sent") if deliver else ("task", "done")
            goal = runtime._counted(store, kind, queue, state) + tasks
            with runtime._children() as children:
                if receiver_url is not None:  # first: its start-up is not the round's time
                    children.start("dispatch", store_url, "--receiver", receiver_url)
                pids = [runtime._worker(children, store_url, queue).process.pid
                        for _ in range(workers)]
                children.wait_for(lambda: runtime._counted(store, kind, queue, state) >= goal,
                                  f"{tasks} tasks ({state})")
                peak = _largest_peak(pids)
            first, last = runtime._span(store, prefix, replies=deliver)
            return _Round(enqueue_s, last - first, peak)

        yield one
        if receiver_url is None:
            require_clean_audit(store._db)
        else:
            with postroom.Receiver.open(receiver_url) as receiver:
                require_clean_audit(store._db, receiver._db)


def _rows(system: str, backend: str, workers: int, tasks: int, rounds: list[_Round], *,
          to: str = "done") -> list[Measurement]:
    enqueue = [tasks / one.enqueue_s for one in rounds]
    processed = [tasks / one.process_s for one in rounds]
    end_to_end = [tasks / (one.enqueue_s + one.process_s) for one in rounds]
    key = f"peers.{system}.workers_{workers}" + ("" if to == "done" else f".{to}")
    what = f"{system}, {workers} worker process{'es' if workers > 1 else ''}, to {to}"
    details = {"system": system, "workers": workers, "to": to, "tasks_per_round": tasks,
               "durability": _DURABILITY[system],
               "enqueue_per_s": round(median(enqueue), 1),
               "enqueue_rounds": [round(rate, 1) for rate in enqueue],
               "worker_peak_rss_kib": max(one.peak_rss_kib for one in rounds)}
    return [Measurement(id=f"{key}.processed", label=f"{what}: processed/s", backend=backend,
                        unit="tasks/s", rounds=Rounds(rates=tuple(processed)), details=details),
            Measurement(id=f"{key}.end_to_end", label=f"{what}: end-to-end/s",
                        backend=backend, unit="tasks/s", rounds=Rounds(rates=tuple(end_to_end)),
                        details={"system": system, "workers": workers, "to": to})]


def _run(ctx: Context, peers: list[tuple[str, Callable[[], _Peer]]],
         postroom_name: str) -> list[Measurement]:
    sizes = ctx.sizes
    tasks, rounds = sizes.peer_tasks, sizes.peer_rounds
    rows: list[Measurement] = []
    for name, make in peers:
        try:
            peer = make()
        except BenchError as exc:
            if sizes.peers_optional:
                ctx.progress(f"peers: {name} left out of this smoke run: {exc}")
                continue
            raise
        peer.prepare()
        for workers in WORKERS:
            ctx.progress(f"peers: {name}, {workers} worker processes, {tasks:,} jobs x "
                         f"{rounds}")
            done = [_peer_round(peer, tasks, workers) for _ in range(rounds)]
            rows += _rows(name, peer.backend, workers, tasks, done)
    for deliver in (False, True):
        for workers in WORKERS:
            ctx.progress(f"peers: {postroom_name}, {workers} worker processes"
                         f"{' + a dispatcher' if deliver else ''}, {tasks:,} tasks x {rounds}")
            with _postroom(ctx, workers, deliver=deliver) as one:
                if sizes.peer_warm_up:  # the processes' statements and pages
                    one(min(tasks, sizes.peer_warm_up))
                done = [one(tasks) for _ in range(rounds)]
            rows += _rows(postroom_name, ctx.target.backend, workers, tasks, done,
                          to="delivered" if deliver else "done")
    return rows


def _installed(module: str) -> None:
    if not _imports(sys.executable, module):
        raise BenchError(f"{module} is not installed (pip install 'postroom[bench]')")


def _huey(ctx: Context) -> _Peer:
    _installed("huey")
    path = sqlite_path(ctx.target.url("peers-huey"))
    assert path is not None, "the peers scenario runs on SQLite"
    return _Huey(sys.executable, path)


def run_sqlite_peers(ctx: Context) -> list[Measurement]:
    """huey and postroom on SQLite."""
    return _run(ctx, [("huey", lambda: _huey(ctx))], "postroom-sqlite")


def run_pg_peers(ctx: Context) -> list[Measurement]:
    """procrastinate, oban-py and postroom on PostgreSQL."""
    def procrastinate() -> _Peer:
        _installed("procrastinate")
        return _Procrastinate(sys.executable, ctx.target.url("peers-procrastinate"))

    def oban() -> _Peer:
        if ctx.sizes.peers_optional:
            raise BenchError("oban-py runs in a Python 3.12 virtual environment of its own, "
                             "too slow to make in a smoke run")
        return _Oban(ensure_oban_python(ctx.progress), ctx.target.url("peers-oban"))

    return _run(ctx, [("procrastinate", procrastinate), ("oban", oban)], "postroom-pg")


# -- bars and report ----------------------------------------------------------------------------

def peer_bars(ids: set[str]) -> list[Any]:
    """The bars of the performance issue on the peer rows present, as ``runner.Bar``."""
    from postroom._bench.runner import Bar

    bars = []
    for backend, ours, theirs in (("SQLite", "postroom-sqlite", ("huey",)),
                                  ("PostgreSQL", "postroom-pg", ("procrastinate", "oban"))):
        for workers in WORKERS:
            for peer in theirs:
                for metric in ("processed", "end_to_end"):
                    mine = f"peers.{ours}.workers_{workers}.{metric}"
                    other = f"peers.{peer}.workers_{workers}.{metric}"
                    if {mine, other} <= ids:
                        bars.append(Bar(
                            id=f"peers_{peer}_w{workers}_{metric}", numerator=mine,
                            denominator=other, required=1.0, basis="value",
                            text=f"{backend}, {workers} worker processes, to done: postroom's "
                                 f"{metric.replace('_', '-')}/s >= {peer}'s"))
    one, huey = "peers.postroom-sqlite.workers_1.processed", "peers.huey.workers_1.processed"
    if {one, huey} <= ids:
        bars.append(Bar(id="peers_sqlite_2x_huey", numerator=one, denominator=huey,
                        required=2.0, basis="value",
                        text="SQLite, 1 worker process, to done: postroom's processed/s "
                             ">= 2x huey's"))
    return bars


def best_pg_peer_bar(rows: Sequence[Measurement]) -> list[Any]:
    """PostgreSQL, 4 workers: postroom's processed/s >= 3x the best of its peers'."""
    from postroom._bench.runner import Bar

    by_id = {row.id: row for row in rows}
    ours = by_id.get("peers.postroom-pg.workers_4.processed")
    theirs = [by_id[key] for key in ("peers.procrastinate.workers_4.processed",
                                     "peers.oban.workers_4.processed") if key in by_id]
    if ours is None or not theirs:
        return []
    best = max(theirs, key=lambda row: row.value)
    return [Bar(id="peers_pg_3x_best", numerator=ours.id, denominator=best.id, required=3.0,
                basis="value",
                text=f"PostgreSQL, 4 worker processes, to done: postroom's processed/s >= 3x "
                     f"the best peer's ({best.details['system']})")]


def markdown(report: dict[str, Any]) -> list[str]:
    """The peer comparison as a Markdown section (empty without peer rows)."""
    rows = {row["id"]: row for row in report["measurements"] if row["id"].startswith("peers.")}
    if not rows:
        return []
    lines = ["", "## Beside the peers", "", __doc__.split("\n\n", 1)[1].split("\n\nThe peers")[0],
             "", "| system | backend | workers | to | enqueue/s | processed/s | end-to-end/s "
             "| worker peak RSS | durability |", "|---|---|---|---|---|---|---|---|---|"]
    for key, row in rows.items():
        if not key.endswith(".processed"):
            continue
        details = row["details"]
        end = rows[key.removesuffix(".processed") + ".end_to_end"]
        lines.append(f"| {details['system']} | {row['backend']} | {details['workers']} | "
                     f"{details['to']} | {details['enqueue_per_s']:,.0f} | "
                     f"{row['value']:,.0f} | {end['value']:,.0f} | "
                     f"{details['worker_peak_rss_kib'] / 1024:,.1f} MiB | "
                     f"{details['durability']} |")
    return lines
