"""End to end: receive -> claim -> finish -> dispatch -> the receiver's effect; and the first
of those steps alone, ``receive`` one message at a time.

The receiver has its own database and is reached through ``InProcessTransport``, so a task
costs the commits a real deployment pays:

- one at a time: ``receive``, ``claim``, ``finish``, then ``dispatch`` (claim the reply,
  the receiver's commit, record ``sent``): six transactions per task;
- batched: ``receive_atomic``, ``claim_batch``, ``finish_batch``, ``dispatch(limit=N)``
  (the receiver takes the whole batch in one transaction): six transactions per batch.

Both keep ``synchronous=FULL`` and the time high-water in every write transaction. After the
timed rounds, one more round measures how much of the time is spent inside the database
driver (and counts the commits), and another counts the WAL frames (pages) the commits
write; then the run is checked: one receiver effect per task and a clean ``postroom audit``
of both databases, or no figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import postroom
from postroom._bench.context import (
    BenchError,
    Context,
    Measurement,
    Numbers,
    Rounds,
    median,
    require_clean_audit,
)
from postroom._bench.driver_time import DriverTime
from postroom._bench.wal_frames import WalFrames
from postroom.db import Database

__all__ = ["one_task", "run_batched", "run_receive", "run_single"]

_AUTH = postroom.AuthContext(principal="bench")
_HOUR = 3600.0


def _envelope(n: int, deadline: float) -> postroom.Envelope:
    return postroom.Envelope(message_id=f"task-{n}", sender="bench", deadline=deadline,
                             payload={"n": n, "kind": "summarize", "doc": f"doc-{n}"})


@contextmanager
def _pipeline(ctx: Context, name: str) -> Iterator[tuple[postroom.Store, postroom.Receiver,
                                                          postroom.InProcessTransport]]:
    with ExitStack() as stack:
        store = stack.enter_context(postroom.open_store(ctx.target.url(f"{name}-store")))
        receiver = stack.enter_context(
            postroom.Receiver.open(ctx.target.url(f"{name}-receiver")))
        yield store, receiver, postroom.InProcessTransport(receiver)


def _measure(ctx: Context, databases: list[Database],
             work: Callable[[], int]) -> tuple[Rounds, dict[str, float]]:
    """A warm-up round, the timed rounds, one round split by ``DriverTime``, and one whose
    WAL frames are counted.

    The split gives two ceilings: the ratio if postroom's Python took no time, and the ratio
    if only the commits (and the fsyncs they wait for) did, which no statement or Python
    change can pass without fewer or cheaper commits. The frames say how many pages a commit
    writes, which is what makes it dearer than the raw loop's (see ``commit_cost``).
    """
    work()
    rounds = ctx.timed_rounds(work)
    with DriverTime(databases) as inside:
        start = time.perf_counter()
        tasks = work()
        wall = time.perf_counter() - start
    with WalFrames(databases) as wal:
        counted = work()
    share = inside.seconds / wall
    commit_share = inside.committing / wall
    ratio = median(rounds.ratios)
    return rounds, {"commits_per_task": round(inside.commits / tasks, 4),
                    "wal_frames_per_task": round(wal.frames / counted, 2),
                    "wal_frames_per_commit": round(wal.frames / counted * tasks / inside.commits,
                                                   2),
                    "database_share": round(share, 3),
                    "commit_share": round(commit_share, 3),
                    "ratio_if_python_were_free": round(ratio / share, 4),
                    "ratio_if_only_commits_took_time": round(ratio / commit_share, 4)}


def _check(store: postroom.Store, receiver: postroom.Receiver, tasks: int) -> None:
    effects = receiver.effects_total()
    if effects != tasks:
        raise BenchError(f"{tasks} tasks finished but the receiver has {effects} effects")
    require_clean_audit(store._db, receiver._db)


def one_task(store: postroom.Store, transport: postroom.InProcessTransport, n: int) -> None:
    """Task ``n`` one step at a time: receive, claim, finish, dispatch (one reply sent)."""
    store.receive(_AUTH, _envelope(n, time.time() + _HOUR))
    claim = store.claim("worker")
    if claim is None:
        raise BenchError(f"task {n} was received but could not be claimed")
    store.finish(claim, {"n": n, "summary": "done"})
    if store.dispatch(transport).sent != 1:
        raise BenchError(f"the reply of task {n} was not delivered")


def run_single(ctx: Context) -> list[Measurement]:
    """Tasks/s when every step of every task is its own transaction."""
    per_round = ctx.sizes.single_tasks
    numbers = Numbers()
    with _pipeline(ctx, "e2e-single") as (store, receiver, transport):

        def work() -> int:
            for n in numbers.take(per_round):
                one_task(store, transport, n)
            return per_round

        ctx.progress("end-to-end, one at a time: measuring")
        rounds, split = _measure(ctx, [store._db, receiver._db], work)
        _check(store, receiver, numbers.used)
    frames = split["wal_frames_per_task"]
    return [Measurement(
        id="e2e.single", backend=ctx.target.backend, unit="tasks/s",
        label="end to end, one at a time (receive, claim, finish, dispatch to a receiver)",
        rounds=rounds, details={"tasks_per_round": per_round, **split,
                                "tasks_in_store_at_end": numbers.used}),
        # Every commit of the task, the receiver's included; each attempt's story is kept in
        # its task's (and its reply's) own row, so it adds bytes to pages written anyway.
        Measurement(id="wal.single_task", backend=ctx.target.backend,
                    unit="WAL frames/task",
                    label="WAL frames (pages) written by a one-at-a-time task's six commits",
                    rounds=Rounds(rates=(frames,)), details={"commits_per_task": 6})]


def run_receive(ctx: Context) -> list[Measurement]:
    """Messages/s of ``receive``, one message at a time: one commit each."""
    per_round = ctx.sizes.http_tasks
    numbers = Numbers()
    with postroom.open_store(ctx.target.url("receive")) as store:
        def work() -> int:
            deadline = time.time() + _HOUR
            for n in numbers.take(per_round):
                store.receive(_AUTH, _envelope(n, deadline))
            return per_round

        ctx.progress("receive, one at a time: measuring")
        rounds, split = _measure(ctx, [store._db], work)
        require_clean_audit(store._db)
    return [Measurement(id="receive.single", backend=ctx.target.backend, unit="messages/s",
                        label="`receive`, one message at a time (one commit each)",
                        rounds=rounds, details={"messages_per_round": per_round, **split,
                                                "tasks_in_store_at_end": numbers.used})]


def run_batched(ctx: Context) -> list[Measurement]:
    """Tasks/s when each step takes a batch of tasks in one transaction."""
    size, batches = ctx.sizes.batch_size, ctx.sizes.batches
    numbers = Numbers()
    with _pipeline(ctx, "e2e-batched") as (store, receiver, transport):

        def work() -> int:
            for _ in range(batches):
                deadline = time.time() + _HOUR
                store.receive_atomic(_AUTH, [_envelope(n, deadline)
                                             for n in numbers.take(size)])
                claims = store.claim_batch("worker", size)
                if len(claims) != size:
                    raise BenchError(f"claimed {len(claims)} of a batch of {size}")
                store.finish_batch([(claim, {"n": claim.payload["n"], "summary": "done"})
                                    for claim in claims])
                if store.dispatch(transport, limit=size).sent != size:
                    raise BenchError("a batch of replies was not delivered whole")
            return batches * size

        ctx.progress(f"end-to-end, batches of {size}: measuring")
        rounds, split = _measure(ctx, [store._db, receiver._db], work)
        _check(store, receiver, numbers.used)
    return [Measurement(
        id="e2e.batched", backend=ctx.target.backend, unit="tasks/s",
        label=f"end to end, batches of {size} (receive_atomic, claim_batch, finish_batch, "
              f"dispatch(limit={size}))",
        rounds=rounds, details={"batch_size": size, "batches_per_round": batches, **split,
                                "tasks_in_store_at_end": numbers.used})]
