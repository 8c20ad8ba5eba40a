"""The worker: claims tasks, runs their handlers, keeps their leases, commits their outcomes.

One worker is one owner of claims, with ``concurrency`` slots (and, per queue, at most
``queue_concurrency[queue]`` of them)::

    claimer  -- claims as many tasks as it has free slots, in one transaction (of a capped
                queue, no more than its cap leaves free), and while its handlers are quick
                what its slots run in ``QUICK_HANDLER`` more (the prefetch, started as
                slots free up); when none is
                claimable it waits for a wake-up (LISTEN/NOTIFY on PostgreSQL, the watcher on
                SQLite) and polls only as the fallback;
    handlers -- plain functions run on a pool of ``concurrency`` threads, coroutine functions
                on one event loop; a handler runs outside any transaction;
    renewer  -- renews the leases of every claim it holds together (``Store.renew_all``) at a
                fraction of the lease; a claim found fenced or cancelled is no longer renewed,
                and its handler is told (``ctx.cancelled``; a coroutine is cancelled);
    settler  -- group-commits the outcomes: what handlers end with meanwhile is committed
                together (``Store.settle``), each outcome fenced and atomic on its own, so a
                fenced one costs the others nothing; an outcome counts as durable only once
                that commit returned;
    watchdog -- with an execution timeout for some queue (the handler's ``timeout=``, or
                ``timeouts[queue]``): a handler running past it is abandoned (``ctx.cancelled``
                set, a coroutine cancelled) and its attempt failed as retryable, fenced like
                any outcome, with a reason naming the timeout. A coroutine's slot frees once it
                unwinds; a plain function's thread cannot be stopped, so its slot stays taken
                until it returns (what it returns is ignored);
    duties   -- the lease rescuer, deadline sweeper, wait timer, continuation runner,
                pruner and scheduler (``postroom.runtime.duty``), unless turned off.

Stopping (``stop()``, which the CLI calls on SIGTERM or SIGINT): no more claims; the
prefetched claims whose handlers have not begun are released at once (their handlers never
begin); running handlers have ``grace`` seconds to end (their outcomes are committed as
usual); then every claim still held is released (``Store.release``: handed back, its
attempt given back, never marked done) and its handler told to stop. A handler that
outlives its task's deadline is abandoned; the deadline sweeper expires the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from postroom import log
from postroom.clock import Clock
from postroom.db.wakeups import Waiter
from postroom.errors import Fenced, InvalidInput, StoreError
from postroom.models import Claim, Finished, Released, Settled, Settlement
from postroom.runtime.continuations import ContinuationRunner
from postroom.runtime.deadlines import DeadlineSweeper
from postroom.runtime.duty import Duties, Duty, check_interval
from postroom.runtime.handlers import (
    App,
    Context,
    EventLoopThread,
    HandlerSpec,
    check_by_queue,
    execution_timeouts,
    handled_queues,
    outcome_of,
    refused_finish,
    timed_out,
)
from postroom.runtime.pruner import Pruner
from postroom.runtime.rescuer import LeaseRescuer
from postroom.runtime.scheduler import Scheduler
from postroom.runtime.wait_timer import WaitTimer
from postroom.settings import check_lease
from postroom.store import Store
from postroom.validation import check_int, check_text

__all__ = ["QUICK_HANDLER", "Worker", "WorkerSettings", "WorkerStats", "default_owner",
           "upkeep_duties"]

_log = log.get("worker")

#: Seconds: while its handlers' run time averages under this, a worker with the default
#: prefetch claims beyond its free slots as many tasks as its slots run in that time (at
#: least ``concurrency``, at most ``_PREFETCH_ROUNDS`` times it). A prefetched task then
#: waits for a slot about this long at most, and the commits that hand out work and take
#: back outcomes are that many times fuller.
QUICK_HANDLER = 0.005
#: The most the default prefetch claims, in tasks per slot: what a worker stopped without
#: releasing its claims (a crash) leaves for the lease rescuer stays bounded.
_PREFETCH_ROUNDS = 16
#: The most tasks a worker claims beyond its free slots, by default or when told.
MAX_PREFETCH = 1024
#: The weight of the latest handler's run time in that average (one slow handler turns the
#: prefetch off at once; some thirty quick ones turn it on again).
_RUN_TIME_WEIGHT = 0.1


def default_owner() -> str:
    """``host:pid:random``: unique per worker process, readable in a task's story."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSettings:
    """How a worker runs. Checked when the worker is made.

    The defaults are the fast path: claims, renewals and outcomes are batched, and batching
    never weakens a guarantee (each outcome stays fenced and atomic on its own).
    """

    #: The queues to claim from; ``None``: every queue the app has a handler for.
    queues: tuple[str, ...] | None = None
    #: How many handlers run at once (threads for plain functions, tasks for coroutines).
    concurrency: int = 16
    #: How many tasks to claim beyond the free slots, to start the next ones without waiting
    #: for a commit (their leases are renewed like the running ones'). ``None``: while the
    #: handlers end quickly (their recent run time averages under ``QUICK_HANDLER``
    #: seconds), as many as the slots run in that time (from ``concurrency`` to 16 times
    #: it, at most ``MAX_PREFETCH``); none otherwise, so no task waits behind a slow handler:
    #: once the handlers turn slow, the prefetched claims the free slots do not take at once
    #: are released, for any worker to take.
    prefetch: int | None = None
    #: The lease of each claim, in seconds (``None``: the store's).
    lease: float | None = None
    #: Seconds between lease renewals (``None``: a third of the lease).
    renew_every: float | None = None
    #: Seconds the running handlers get to end once the worker is asked to stop.
    grace: float = 30.0
    #: The polling interval: how long an idle claimer waits for a wake-up before it looks.
    poll: float = 1.0
    #: The most outcomes committed in one transaction.
    settle_batch: int = 500
    #: Seconds the settler waits for the handlers still running to end before it commits
    #: what it has (cut short once none runs; what ends while a commit runs is committed
    #: with the next one anyway).
    linger: float = 0.002
    #: Whether this worker runs the background duties.
    duties: bool = True
    #: The owner its claims are held under (``None``: ``default_owner()``).
    owner: str | None = None
    #: Per queue, how many of its handlers run at once at most (within ``concurrency``).
    queue_concurrency: Mapping[str, int] = field(default_factory=dict)
    #: Per queue, the execution timeout in seconds of a handler that sets none of its own.
    timeouts: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.queues is not None and (isinstance(self.queues, str) or not all(
                isinstance(name, str) for name in self.queues)):
            raise InvalidInput("queues", "must be a tuple of queue names")
        check_int(self.concurrency, "concurrency", low=1, high=1024)
        if self.prefetch is not None:
            check_int(self.prefetch, "prefetch", low=0, high=MAX_PREFETCH)
        check_int(self.settle_batch, "settle_batch", low=1, high=10_000)
        if self.lease is not None:
            check_lease(self.lease)
        if self.renew_every is not None:
            check_interval(self.renew_every, "renew_every")
        check_interval(self.poll, "poll")
        for name in ("grace", "linger"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 <= value <= 86_400:
                raise InvalidInput(name, f"must be a number of seconds in 0..86400, got "
                                         f"{value!r}")
        if self.owner is not None:
            check_text(self.owner, "owner", max_bytes=128)
        check_by_queue(self.queue_concurrency, self.timeouts)


@dataclass(slots=True)
class WorkerStats:
    """What a worker did so far (counted once each outcome committed)."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    abandoned: int = 0  # fenced, cancelled, or past the grace period
    timed_out: int = 0  # ran past its execution timeout (its attempt failed as retryable)
    settle_commits: int = 0


@dataclass(eq=False, slots=True)
class _Held:
    """A claim this worker holds, from its claim until its outcome committed."""

    claim: Claim
    cancellation: threading.Event = field(default_factory=threading.Event)
    running: bool = False  # its handler was handed to a thread or the loop, and has not ended
    ended: bool = False  # its handler ended: its outcome is on its way to the settler
    abandoned: bool = False  # nothing it ends with is committed by this worker
    task: asyncio.Task[Any] | None = None  # the coroutine's task, to cancel
    began: bool = False  # its handler began (a prefetched one waits for a slot until then)
    started: float | None = None  # when its handler began, on the worker's clock
    timed_out: bool = False  # past its execution timeout: its failure is on its way


@dataclass(frozen=True, slots=True)
class _Reserved:
    """Slots reserved for a claim in flight: in all, and of each capped queue."""

    slots: int
    of: dict[str, int]


class _Monotonic:
    """The clock execution timeouts are measured on unless the worker is given another."""

    def now(self) -> float:
        return time.monotonic()


class _Threads:
    """The threads plain-function handlers run on: at most ``size``, each started when a call
    finds no idle one, each taking the next call from one queue.

    What a ``ThreadPoolExecutor`` does for the worker, without the ``Future`` per call (its
    lock and condition) and the semaphore that executor keeps per call, which nobody here
    reads: a handler hands its outcome over itself. Like that executor's, the threads are
    not daemons, so the process waits at exit for a handler still running.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads done with their call and not promised another
        self._closed = False

    def submit(self, call: Callable[[], None]) -> None:
        """Run ``call`` on an idle thread, on a new one while there are fewer than ``size``,
        or on the first to be free."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are shut down")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(target=self._serve,
                                          name=f"{self._name}_{len(self._threads)}")
                thread.start()
                self._threads.append(thread)
        self._calls.put(call)

    def shutdown(self) -> None:
        """Drop the calls not started yet and let every thread end once its call returns
        (without waiting for it)."""
        with self._lock:
            self._closed = True
            threads = len(self._threads)
        with contextlib.suppress(queue.Empty):
            while True:
                self._calls.get_nowait()
        for _ in range(threads):
            self._calls.put(None)

    def _serve(self) -> None:
        calls, lock = self._calls, self._lock
        while (call := calls.get()) is not None:
            try:
                call()
            except Exception as exc:  # pragma: no cover - _run_sync catches a handler's
                # The thread serves the next call anyway: a slot must not die with a bug.
                log.event(_log, logging.ERROR, "handler thread failed",
                          last_error=f"{type(exc).__name__}: {exc}")
            del call  # no reference to the handler's claim kept while idle
            with lock:
                self._idle += 1


class Worker:
    """Runs ``app``'s handlers on ``store``'s tasks (see the module docstring)."""

    def __init__(self, store: Store, app: App, settings: WorkerSettings | None = None,
                 *, duties: Sequence[Duty] | None = None, clock: Clock | None = None) -> None:
        """``clock`` measures execution timeouts and handlers' run time (default: the
        monotonic clock)."""
        self._store = store
        self._app = app
        self._settings = settings = settings if settings is not None else WorkerSettings()
        self.owner = settings.owner or default_owner()
        self.queues = handled_queues(app, settings.queues)
        check_by_queue(settings.queue_concurrency, settings.timeouts, self.queues)
        self._caps = dict(settings.queue_concurrency)
        self._timeouts = execution_timeouts(app, self.queues, settings.timeouts)
        self._clock: Clock = clock if clock is not None else _Monotonic()
        self._lease = settings.lease if settings.lease is not None else store.settings.lease
        self._renew_every = (settings.renew_every if settings.renew_every is not None
                             else self._lease / 3)
        self.stats = WorkerStats()
        mutex = threading.RLock()
        self._lock = threading.Condition(mutex)
        # The claimer waits on a condition of its own (the same lock), woken only when it may
        # claim: a busy worker's every handler ending no longer wakes it for nothing.
        self._claimable = threading.Condition(mutex)
        self._held: dict[str, _Held] = {}
        self._running = 0  # handlers started and not ended
        self._reserved = 0  # slots a claim in flight will fill
        self._running_of: Counter[str] = Counter()  # ``_running``, by queue
        self._reserved_of: Counter[str] = Counter()  # ``_reserved``, by capped queue
        self._unsettled = 0  # outcomes handed to the settler and not committed yet
        self._run_time: float | None = None  # the handlers' recent run time (an average)
        self._stopping = threading.Event()
        self._outcomes: queue.SimpleQueue[tuple[_Held, Settlement] | None] = queue.SimpleQueue()
        self._pool = _Threads(settings.concurrency, "postroom-handler")
        self._coroutine_slots = asyncio.Semaphore(settings.concurrency)  # used on the loop
        self._loop: EventLoopThread | None = None
        self._threads: list[threading.Thread] = []
        self._duties = Duties(duties if duties is not None else (
            self._default_duties() if settings.duties else []))
        self._settled = threading.Event()  # the settler ended
        self._waiter: Waiter | None = None

    # -- running and stopping -----------------------------------------------------------------

    def run(self) -> None:
        """Run until ``stop()``: claim, run, renew and settle; then stop as the module says.

        Returns once every outcome this worker committed is durable and every claim it still
        held is released.
        """
        if any(spec.is_async for spec in map(self._app.handler_for, self.queues) if spec):
            self._loop = EventLoopThread()
        self._start(self._settle_loop, "settler")
        self._start(self._renew_loop, "renewer")
        if self._timeouts:
            self._start(self._watch_loop, "watchdog")
        self._duties.start()
        log.event(_log, logging.INFO, f"worker started on {', '.join(self.queues)}",
                  owner=self.owner)
        try:
            self._claim_loop()
        finally:
            self._shut_down()

    def stop(self) -> None:
        """Ask the worker to stop (thread-safe; safe to call from a signal handler)."""
        self._stopping.set()
        waiter = self._waiter
        if waiter is not None:
            waiter.interrupt()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stopping.is_set()

    def _shut_down(self) -> None:
        grace_ends = time.monotonic() + self._settings.grace
        with self._lock:
            # The prefetched tasks whose handlers have not begun never will: released at once.
            waiting = self._give_up(self._not_begun())
        self._release(waiting, "stopping: releasing {} claims whose handlers had not begun")
        with self._lock:
            while self._running and time.monotonic() < grace_ends:
                self._lock.wait(min(0.1, max(0.0, grace_ends - time.monotonic())))
            unfinished = self._give_up([held for held in self._held.values()
                                        if not held.ended and not held.abandoned])
        self._release(unfinished, "stopping: releasing {} unfinished claims")
        self._outcomes.put(None)  # the settler commits what is queued, then ends
        self._settled.wait()
        self._duties.stop()
        for thread in self._threads:
            thread.join(5.0)
        self._pool.shutdown()
        if self._loop is not None:
            self._loop.stop()
        log.event(_log, logging.INFO, "worker stopped", owner=self.owner)

    # -- claiming -------------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        settings = self._settings
        waiter = self._waiter = self._store.waiter(self.queues)
        failures = 0
        while not self._stopping.is_set():
            with self._lock:
                # While outcomes are on their way the settler takes the next tasks in their
                # commit; the claimer claims only for a worker with nothing to settle.
                free = self._reserve(nothing=bool(self._unsettled))
                if free.slots <= 0:
                    self._claimable.wait(settings.poll)
                    continue
            try:
                claims = self._store.claim_batch(self.owner, free.slots, queues=self.queues,
                                                 lease=self._lease, per_queue=free.of or None)
            except StoreError as exc:
                self._take(free, [])
                failures += 1
                log.event(_log, logging.WARNING, "claim failed; trying again",
                          owner=self.owner, last_error=f"{type(exc).__name__}: {exc}")
                self._stopping.wait(min(5.0, 0.05 * 2 ** min(failures, 7)))
                continue
            failures = 0
            self._take(free, claims)
            if not claims:
                waiter.wait(settings.poll)

    def _reserve(self, settling: int = 0, *, nothing: bool = False) -> _Reserved:
        """Reserve the slots to claim for now (under the lock); ``_take`` gives them back.

        A slot is a handler that has not ended: one whose outcome waits for its commit
        frees its slot, so the next tasks run while the settler commits (``settling``
        outcomes are about to leave). The claims held in all stay bounded (``concurrency``
        more for outcomes on their way, and the prefetch), and every one is renewed. A
        capped queue gets what its cap leaves free of its own running handlers and of the
        claims in flight; with every queue capped, that bounds the whole claim too.
        """
        if nothing:
            return _Reserved(0, {})
        settings = self._settings
        slots = self._free_slots()
        room = (2 * settings.concurrency + self._prefetch() - len(self._held) + settling
                - self._reserved)
        free = max(0, min(slots, room))
        caps = {queue: max(0, min(free, cap - self._running_of[queue]
                                  - self._reserved_of[queue]))
                for queue, cap in self._caps.items()}
        if len(caps) == len(self.queues):
            free = min(free, sum(caps.values()))
        if free <= 0:
            return _Reserved(0, {})
        self._reserved += free
        if caps:
            self._reserved_of.update(caps)
        return _Reserved(free, caps)

    def _take(self, reserved: _Reserved, claims: Sequence[Claim]) -> None:
        """Hold and start ``claims``, made with ``reserved`` slots (which are given back)."""
        with self._lock:
            started = self._hold(reserved, claims)
        for held in started:
            self._begin(held)

    def _hold(self, reserved: _Reserved, claims: Sequence[Claim]) -> list[_Held]:
        """``_take``'s bookkeeping, under the lock: the claims to begin."""
        self._reserved -= reserved.slots
        if reserved.of:
            self._reserved_of.subtract(reserved.of)
        self.stats.claimed += len(claims)
        started = [self._held.setdefault(claim.task_id, _Held(claim)) for claim in claims]
        # Counted as running in the same breath as their slots stop being reserved, so
        # that no other claim sees those slots free in between.
        running_of = self._running_of
        for held in started:
            held.running = True
            running_of[held.claim.queue] += 1
        self._running += len(started)
        self._lock.notify_all()
        self._wake_claimer()
        return started

    def _wake_claimer(self) -> None:
        """Under the lock, after slots or outcomes changed: wake the claimer if it may claim
        now. While outcomes wait for their commit it may not (the settler claims with them),
        nor while every slot is taken (``_reserve`` would find none free)."""
        if not self._unsettled and self._free_slots() > 0:
            self._claimable.notify()

    def _free_slots(self) -> int:
        """Handlers that may start beside those running and reserved (under the lock)."""
        return (self._settings.concurrency + self._prefetch() - self._running
                - self._reserved)

    def _prefetch(self) -> int:
        """The tasks to claim beyond the free slots now (under the lock): the setting's, or
        by default what the slots run in ``QUICK_HANDLER`` seconds at the handlers' recent
        pace, from ``concurrency`` to ``_PREFETCH_ROUNDS`` times it (none while they are
        slower; see ``WorkerSettings``)."""
        settings = self._settings
        if settings.prefetch is not None:
            return settings.prefetch
        run_time = self._run_time
        if run_time is None or run_time >= QUICK_HANDLER:
            return 0
        rounds = (_PREFETCH_ROUNDS if run_time * _PREFETCH_ROUNDS <= QUICK_HANDLER
                  else max(1, int(QUICK_HANDLER / run_time)))
        return min(settings.concurrency * rounds, MAX_PREFETCH)

    def _begin(self, held: _Held) -> None:
        spec = self._app.handler_for(held.claim.queue)
        assert spec is not None  # only the app's queues are claimed
        if spec.is_async:
            assert self._loop is not None
            self._loop.submit(self._run_async(spec, held))
        else:
            self._pool.submit(partial(self._run_sync, spec, held))

    # -- running handlers -----------------------------------------------------------------------

    def _run_sync(self, spec: HandlerSpec, held: _Held) -> None:
        began = self._started(held)
        if began is None:  # fenced or released before it could start
            self._ended_one(held, None)
            return
        ctx = Context(held.claim, held.cancellation)
        try:
            outcome = outcome_of(held.claim, ctx, lambda: spec.function(held.claim.payload, ctx))
        except BaseException:  # pragma: no cover - outcome_of catches every Exception
            outcome = None
        self._ended_one(held, outcome, ran=self._clock.now() - began)

    async def _run_async(self, spec: HandlerSpec, held: _Held) -> None:
        held.task = asyncio.current_task()
        if held.cancellation.is_set():
            # Its claim was lost before the loop first ran it: ``_cancel`` found no task to
            # cancel, so it must not wait for a slot behind the handlers running.
            self._ended_one(held, None)
            return
        try:
            # The threads bound the plain functions; this bounds the coroutines: a
            # prefetched one waits here for one of the ``concurrency`` slots.
            await self._coroutine_slots.acquire()
        except asyncio.CancelledError:
            self._ended_one(held, None)  # its claim ended before it could start
            return
        try:
            began = self._started(held)
            if began is None:
                self._ended_one(held, None)
                return
            ctx = Context(held.claim, held.cancellation)
            try:
                result = await spec.function(held.claim.payload, ctx)
                outcome: Settlement | None = outcome_of(held.claim, ctx, lambda: result)
            except asyncio.CancelledError:
                outcome = None  # cancelled because its claim is no longer current
            except Exception as exc:  # every failure is an outcome
                outcome = outcome_of(held.claim, ctx, _raiser(exc))
            except BaseException:  # SystemExit and its kind: abandoned, as a function's are
                outcome = None
            self._ended_one(held, outcome, ran=self._clock.now() - began)
        finally:
            self._coroutine_slots.release()

    def _started(self, held: _Held) -> float | None:
        """Its handler begins now (returned): its execution timeout counts from now.
        ``None``: its claim was given up first (the worker is stopping), so it never begins."""
        now = self._clock.now()
        with self._lock:
            if held.cancellation.is_set():
                return None
            held.began = True
            if held.claim.queue in self._timeouts:
                held.started = now
                self._lock.notify_all()
        return now

    def _ended_one(self, held: _Held, outcome: Settlement | None, *,
                   ran: float | None = None) -> None:
        """Its handler ended (after ``ran`` seconds, if it started) with ``outcome``."""
        given_back: list[_Held] = []
        with self._lock:
            prefetching = self._prefetch() > 0
            if ran is not None:
                average = self._run_time
                self._run_time = (ran if average is None
                                  else average + (ran - average) * _RUN_TIME_WEIGHT)
            held.running = False
            self._running -= 1
            self._running_of[held.claim.queue] -= 1
            if prefetching and self._prefetch() == 0:
                given_back = self._give_back_prefetched()
            keep = (outcome is not None and not held.timed_out and not held.abandoned
                    and not held.cancellation.is_set())
            if keep:
                held.ended = True
                self._unsettled += 1  # handed over below, as ``_hand_over`` would
            elif not held.timed_out:  # a timed-out one's failure was handed over already
                held.abandoned = True
                self._held.pop(held.claim.task_id, None)
                self.stats.abandoned += 1
            self._lock.notify_all()
            self._wake_claimer()
        if keep:
            assert outcome is not None
            self._outcomes.put((held, outcome))
        self._release(given_back, "handlers are slow now: releasing {} prefetched claims")

    def _give_back_prefetched(self) -> list[_Held]:
        """Under the lock, once the handlers turned slow: give up the prefetched claims whose
        handlers have not begun, but for those the free slots take at once (the first
        claimed), so the rest go back to the queue for any worker instead of waiting here
        behind slow handlers. They are to be released."""
        begun = sum(1 for held in self._held.values() if held.running and held.began)
        return self._give_up(self._not_begun()[max(0, self._settings.concurrency - begun):])

    def _not_begun(self) -> list[_Held]:
        """Under the lock: the claims handed to a handler that has not begun (prefetched
        ones waiting for a slot), in the order they were claimed."""
        return [held for held in self._held.values()
                if held.running and not held.began and not held.abandoned]

    def _give_up(self, claims: list[_Held]) -> list[_Held]:
        """Under the lock: nothing ``claims``' handlers end with is committed any more, and
        they are told to stop (or never begin). Returns them, to be ``_release``d."""
        for held in claims:
            held.abandoned = True
            self._cancel(held)
        return claims

    def _release(self, claims: list[_Held], message: str) -> None:
        """Hand back ``claims`` (given up) unfinished, saying so with ``message`` (its ``{}``:
        how many)."""
        if not claims:
            return
        log.event(_log, logging.INFO, message.format(len(claims)), owner=self.owner)
        for held in claims:
            self._hand_over(held, Released(claim=held.claim))

    # -- execution timeouts ---------------------------------------------------------------------

    def _watch_loop(self) -> None:
        with self._lock:
            while not self._settled.is_set():
                now = self._clock.now()
                wait = min(self._settings.poll, 1.0)
                for held in list(self._held.values()):
                    limit = self._timeouts.get(held.claim.queue)
                    if (limit is None or held.started is None or not held.running
                            or held.ended or held.abandoned):
                        continue
                    left = held.started + limit - now
                    if left > 0:
                        wait = min(wait, left)
                        continue
                    held.ended = held.timed_out = True
                    self._cancel(held)
                    self.stats.timed_out += 1
                    log.event(_log, logging.WARNING, "handler timed out: abandoned",
                              task_id=held.claim.task_id, owner=self.owner,
                              fence=held.claim.fence)
                    self._hand_over(held, timed_out(held.claim, limit))
                self._lock.wait(wait)

    # -- settling -------------------------------------------------------------------------------

    def _hand_over(self, held: _Held, outcome: Settlement) -> None:
        with self._lock:
            self._unsettled += 1
        self._outcomes.put((held, outcome))

    def _settle_loop(self) -> None:
        try:
            closing = False
            while not closing:
                first = self._outcomes.get()
                if first is None:
                    break
                batch = [first]
                closing = self._gather(batch)
                self._settle(batch)
        finally:
            self._settled.set()
            with self._lock:
                self._lock.notify_all()

    def _gather(self, batch: list[tuple[_Held, Settlement]]) -> bool:
        """Add to ``batch`` what else is ready to commit with it; whether the queue closed.

        Everything already handed over joins, and for up to ``linger`` seconds so does what
        handlers still running end with: a group commit, cut short as soon as no handler is
        left running, so it never waits for nothing.
        """
        settings = self._settings
        linger_ends = time.monotonic() + settings.linger
        while len(batch) < settings.settle_batch:
            try:
                item = self._outcomes.get_nowait()
            except queue.Empty:
                remaining = linger_ends - time.monotonic()
                if remaining <= 0 or not self._running:
                    return False
                try:
                    item = self._outcomes.get(timeout=min(remaining, 0.0005))
                except queue.Empty:
                    continue
            if item is None:
                return True
            batch.append(item)
        return False

    def _settle(self, batch: list[tuple[_Held, Settlement]]) -> None:
        # A busy worker takes its next tasks in the transaction that commits these outcomes:
        # one commit for both (unless it is stopping).
        with self._lock:
            free = self._reserve(settling=len(batch), nothing=self._stopping.is_set())
        failures = 0
        claims: list[Claim] = []
        while True:
            try:
                outcomes = [outcome for _, outcome in batch]
                if free.slots:
                    settled, claims = self._store.settle_and_claim(
                        outcomes, self.owner, free.slots, queues=self.queues,
                        lease=self._lease, per_queue=free.of or None)
                else:
                    settled = self._store.settle(outcomes)
                break
            except StoreError as exc:
                # Nothing committed (StoreUnavailable), or maybe it did (OutcomeUnknown): the
                # same outcomes again are safe either way (a committed one is fenced now).
                failures += 1
                log.event(_log, logging.WARNING, "commit of outcomes failed; trying again",
                          owner=self.owner, last_error=f"{type(exc).__name__}: {exc}")
                if self._stopping.is_set() and failures > 5:
                    with self._lock:  # given up: their leases will run out
                        self._unsettled -= len(batch)
                    self._take(free, [])
                    return
                time.sleep(min(5.0, 0.05 * 2 ** min(failures, 7)))
        again: list[tuple[_Held, Settlement]] = []
        with self._lock:
            self.stats.settle_commits += 1
            for (held, outcome), result in zip(batch, settled, strict=True):
                follow = self._after_settle(held, outcome, result)
                if follow is not None:
                    again.append((held, follow))
                    continue
                self._held.pop(held.claim.task_id, None)
            # What is handed over again stays unsettled, so that the claimer leaves the
            # next claim to the settler until that is committed too.
            self._unsettled -= len(batch) - len(again)
            started = self._hold(free, claims)
        for held in started:
            self._begin(held)
        for held, outcome in again:
            self._outcomes.put((held, outcome))

    def _after_settle(self, held: _Held, outcome: Settlement,
                      result: Settled) -> Settlement | None:
        """Count a committed outcome; for a refused one, what to commit instead (if
        anything)."""
        stats = self.stats
        if result.ok:
            if isinstance(outcome, Finished):
                stats.done += 1
            elif isinstance(outcome, Released):
                stats.released += 1
            elif result.state is not None and result.state.terminal:
                stats.failed += 1
            else:
                stats.retried += 1
            return None
        error = result.error
        assert error is not None  # not ok
        if isinstance(error, Fenced):
            stats.abandoned += 1
            log.event(_log, logging.DEBUG, "outcome fenced: abandoned", task_id=held.claim.task_id,
                      owner=self.owner, fence=held.claim.fence, last_error=str(error))
            return None
        if isinstance(outcome, Finished):
            return refused_finish(outcome, error)
        stats.abandoned += 1
        log.event(_log, logging.WARNING, "outcome refused: the lease will run out",
                  task_id=held.claim.task_id, owner=self.owner, fence=held.claim.fence,
                  last_error=f"{type(error).__name__}: {error}")
        return None

    # -- renewing -------------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        while not self._settled.wait(self._renew_every):
            with self._lock:
                held = [h for h in self._held.values() if not h.abandoned]
            if not held:
                continue
            try:
                renewed = self._store.renew_all([h.claim for h in held], lease=self._lease)
            except StoreError as exc:
                log.event(_log, logging.WARNING, "lease renewal failed; trying again",
                          owner=self.owner, last_error=f"{type(exc).__name__}: {exc}")
                continue
            now = self._store.clock.now()
            with self._lock:
                for item, answer in zip(held, renewed, strict=True):
                    if isinstance(answer, Fenced) or item.claim.deadline <= now:
                        # Cancelled, taken over, or past its deadline: stop renewing it and
                        # tell its handler; nothing it ends with will be committed.
                        item.abandoned = True
                        self._cancel(item)
                        if not item.running and not item.ended:
                            self._held.pop(item.claim.task_id, None)
                self._lock.notify_all()
                self._wake_claimer()  # a claim let go of leaves room

    def _cancel(self, held: _Held) -> None:
        held.cancellation.set()
        if held.task is not None and self._loop is not None:
            self._loop.call_soon(held.task.cancel)

    # -- helpers --------------------------------------------------------------------------------

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"postroom-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _default_duties(self) -> list[Duty]:
        duties = upkeep_duties(self._store)
        if self._app.steps:
            duties.append(ContinuationRunner(self._store, self._app))
        return duties


def upkeep_duties(store: Store) -> list[Duty]:
    """The duties that keep ``store`` moving with no application code: the lease rescuer,
    deadline sweeper, wait timer, pruner and scheduler (a worker adds the continuation
    runner for its ``App``'s resumers; ``postroom serve`` runs these)."""
    return [LeaseRescuer(store), DeadlineSweeper(store), WaitTimer(store), Pruner(store),
            Scheduler(store)]


def _raiser(exc: BaseException) -> Callable[[], Any]:
    def run() -> Any:
        raise exc

    return run
