"""SPEC §10: the worker runs handlers with leases renewed, outcomes group-committed, and a
graceful stop that never marks unfinished work done."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

import postroom
from postroom import AttemptOutcome, TaskState
from postroom.runtime import App, Context, PermanentFailure
from postroom.runtime.worker import QUICK_HANDLER, Worker, WorkerSettings
from tests.runtime.support import FAST, PATIENCE, eventually, far, running, send, state

RETRY_AT_ONCE = postroom.Settings(backoff=postroom.FixedBackoff(seconds=0.0))


@pytest.fixture
def quick_store(db_url):
    with postroom.open_store(db_url, settings=RETRY_AT_ONCE) as opened:
        yield opened


def test_a_worker_runs_each_task_and_finishes_it_with_the_handlers_result(store):
    app = App()
    app.add_handler("default", lambda payload, ctx: {"double": payload["n"] * 2})
    ids = [send(store, f"m-{n}", {"n": n}) for n in range(50)]
    with running(store, app) as worker:
        eventually(lambda: worker.stats.done == 50)
    assert {state(store, task_id) for task_id in ids} == {TaskState.DONE}
    assert store.task(ids[7]).result == {"double": 14}
    assert store.reply(ids[7]).document["result"] == {"double": 14}


def test_the_handler_is_told_the_tasks_identity_and_the_claims_terms(store):
    seen: list[Context] = []
    app = App()
    app.add_handler("default", lambda payload, ctx: seen.append(ctx))
    task_id = send(store, "m-1", correlation_id="order-7")
    with running(store, app) as worker:
        eventually(lambda: worker.stats.done == 1)
    (ctx,) = seen
    assert (ctx.task_id, ctx.message_id, ctx.attempt, ctx.fence, ctx.queue) == (
        task_id, "m-1", 1, 1, "default")
    assert (ctx.principal, ctx.requester, ctx.correlation_id) == ("planner", "planner",
                                                                   "order-7")
    assert not ctx.cancelled


def test_an_exception_is_a_retryable_failure_and_the_task_runs_again(quick_store):
    attempts: list[int] = []
    app = App()

    @app.handler("default")
    def flaky(payload: dict[str, object], ctx: Context) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return "third time"

    task_id = send(quick_store, "m-1", max_attempts=3)
    with running(quick_store, app) as worker:
        eventually(lambda: worker.stats.done == 1)
    assert attempts == [1, 2, 3]
    story = quick_store.story(task_id)
    assert [a.error for a in story.attempts][:2] == ["RuntimeError: not yet"] * 2


def test_a_handlers_exception_is_logged_with_its_traceback_and_the_task(store, caplog):
    app = App()

    @app.handler("default")
    def divide(payload: dict[str, object], ctx: Context) -> float:
        return 1 / 0

    task_id = send(store, "m-1", max_attempts=1)
    with caplog.at_level("WARNING", logger="postroom"), running(store, app) as worker:
        eventually(lambda: worker.stats.failed == 1)
    (record,) = [record for record in caplog.records if record.msg.startswith("handler raised")]
    assert record.levelname == "WARNING" and record.task_id == task_id and record.attempt == 1
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
    assert "in divide" in caplog.text  # the frame the error was raised in


def test_attempts_exhausted_fail_the_task_with_its_last_error(quick_store):
    app = App()
    app.add_handler("default", lambda payload, ctx: 1 / 0)
    task_id = send(quick_store, "m-1", max_attempts=2)
    with running(quick_store, app) as worker:
        eventually(lambda: worker.stats.failed == 1)
    task = quick_store.task(task_id)
    assert task.state == TaskState.FAILED and "ZeroDivisionError" in task.last_error


def test_a_permanent_failure_fails_the_task_at_once(store):
    app = App()

    @app.handler("default")
    def refuse(payload: dict[str, object], ctx: Context) -> None:
        raise PermanentFailure("the address does not exist")

    task_id = send(store, "m-1", max_attempts=3)
    with running(store, app) as worker:
        eventually(lambda: worker.stats.failed == 1)
    task = store.task(task_id)
    assert (task.state, task.attempts) == (TaskState.FAILED, 1)
    assert task.last_error == "PermanentFailure: the address does not exist"


def test_a_result_that_is_not_json_fails_the_task_for_good_naming_why(store):
    app = App()
    app.add_handler("default", lambda payload, ctx: {"when": object()})
    task_id = send(store, "m-1")
    with running(store, app) as worker:
        eventually(lambda: worker.stats.failed == 1)
    task = store.task(task_id)
    assert task.state == TaskState.FAILED
    assert "finish refused" in task.last_error and "result.when" in task.last_error


def test_follow_ups_and_a_wait_commit_with_the_finish(store):
    app = App()

    @app.handler("default")
    def ask(payload: dict[str, object], ctx: Context) -> str:
        ctx.spawn("audit-log", {"from": ctx.task_id}, queue="audit")
        ctx.open_wait("refund-1", "approval", far(), responder="alice")
        return "asked"

    task_id = send(store, "m-1")
    with running(store, app) as worker:
        eventually(lambda: worker.stats.done == 1)
    child = store.claim("w", queues="audit")
    assert child.payload == {"from": task_id}
    wait = store.wait("refund-1", "approval")
    assert (wait.task_id, wait.responder, wait.state) == (task_id, "alice", "waiting")


def test_a_handlers_charges_commit_with_its_finish_and_spend_the_chains_cost(store):
    app = App()

    @app.handler("default")
    def costly(payload: dict[str, object], ctx: Context) -> str:
        ctx.charge(2)
        ctx.charge(1)
        ctx.spawn("next", {"n": 1}, queue="later")
        return "charged"

    task_id = send(store, "m-1", budget=postroom.Budget(cost=3))
    with running(store, app) as worker:
        eventually(lambda: worker.stats.done == 1)
    assert store.chain(task_id).cost == 3
    (child,) = store.list_tasks(queue="later").items
    assert child.state is TaskState.BUDGET_EXHAUSTED


def test_a_coroutine_handler_runs_on_the_event_loop(store):
    app = App()

    @app.handler("default")
    async def fetch(payload: dict[str, object], ctx: Context) -> object:
        await asyncio.sleep(0.01)
        return payload["n"]

    ids = [send(store, f"m-{n}", {"n": n}) for n in range(20)]
    with running(store, app) as worker:
        eventually(lambda: worker.stats.done == 20)
    assert [store.task(task_id).result for task_id in ids] == list(range(20))


def _most_coroutines_at_once(store: postroom.Store, tasks: int, *, concurrency: int,
                             lasting: float, clock: postroom.Clock | None = None) -> int:
    """The most coroutine handlers (each awaiting ``lasting`` seconds) that ran at once while
    a worker of ``concurrency`` did ``tasks`` tasks."""
    now = {"running": 0, "most": 0}
    app = App()

    @app.handler("default")
    async def briefly(payload: dict[str, object], ctx: Context) -> None:
        now["running"] += 1  # on the worker's one event loop: no lock needed
        now["most"] = max(now["most"], now["running"])
        await asyncio.sleep(lasting)
        now["running"] -= 1

    for n in range(tasks):
        send(store, f"m-{n}")
    settings = dataclasses.replace(FAST, concurrency=concurrency)
    with running(store, app, settings, clock=clock) as worker:
        eventually(lambda: worker.stats.done == tasks)
    return now["most"]


def test_no_more_handlers_run_at_once_than_the_workers_concurrency(store):
    # A slot is taken back from the claims in flight and given to the running handlers at
    # once: a claim made meanwhile (the settler's and the claimer's race) never sees it free.
    assert 1 < _most_coroutines_at_once(store, 300, concurrency=4, lasting=0.01) <= 4


def test_plain_functions_run_at_once_on_at_most_concurrency_threads_reused_task_after_task(
        store):
    lock = threading.Lock()
    meet = threading.Barrier(4)  # four handlers at once, or the barrier breaks
    now = {"running": 0, "most": 0}
    threads: set[threading.Thread] = set()
    app = App()

    @app.handler("default")
    def counted(payload: dict[str, object], ctx: Context) -> None:
        with lock:
            now["running"] += 1
            now["most"] = max(now["most"], now["running"])
            threads.add(threading.current_thread())
        if payload.get("meet"):
            meet.wait(PATIENCE)
        with lock:
            now["running"] -= 1

    for n in range(200):
        send(store, f"m-{n}", {"meet": n < 4})
    with running(store, app, dataclasses.replace(FAST, concurrency=4)) as worker:
        eventually(lambda: worker.stats.done == 200)
    assert now["most"] == 4
    assert len(threads) == 4
    eventually(lambda: not any(thread.is_alive() for thread in threads))  # ended with it


def _processing(store: postroom.Store) -> int:
    return store.status().queues["default"].processing


def _timed_app(clock: postroom.ManualClock, release: threading.Event, *, takes: float,
               held_takes: float = 0.0) -> App:
    """An app whose handler takes ``takes`` seconds on ``clock``, or, for a task sent with
    ``{"hold": True}``, ``held_takes`` seconds and then waits for ``release``."""
    app = App()

    @app.handler("default")
    def timed(payload: dict[str, object], ctx: Context) -> None:
        if payload.get("hold"):
            clock.advance(held_takes)
            release.wait(PATIENCE)
        else:
            clock.advance(takes)

    return app


def _claimed_at_once(store: postroom.Store, *, takes: float, concurrency: int = 2,
                     waiting: int = 8) -> int:
    """How many of ``waiting`` tasks a worker of ``concurrency`` holds at once once its
    handlers have each taken ``takes`` seconds (on the worker's clock): the tasks wait in a
    paused queue, so the worker takes them with one claim when it is resumed."""
    clock = postroom.ManualClock()
    release = threading.Event()
    app = _timed_app(clock, release, takes=takes)
    for n in range(4):
        send(store, f"first-{n}")
    settings = dataclasses.replace(FAST, concurrency=concurrency)
    with running(store, app, settings, clock=clock) as worker:
        eventually(lambda: worker.stats.done == 4)
        store.pause_queue("default", operator="test", reason="to be claimed at once")
        for n in range(waiting):
            send(store, f"held-{n}", {"hold": True})
        store.resume_queue("default")
        eventually(lambda: _processing(store) > 0 and worker.stats.claimed > 4)
        held = _processing(store)
        release.set()
        eventually(lambda: worker.stats.done == 4 + waiting)
    return held


def test_while_its_handlers_take_no_time_a_worker_claims_16_tasks_per_slot_beyond_free_slots(
        store):
    assert _claimed_at_once(store, takes=0.0, waiting=40) == 2 + 16 * 2


def test_a_worker_prefetches_what_its_slots_run_within_the_quick_handler_time(store):
    # Handlers of 0.3 QUICK_HANDLER (one slot, so no run time overlaps another's): three
    # tasks beyond the free slot, each waiting about QUICK_HANDLER at most.
    assert _claimed_at_once(store, takes=0.3 * QUICK_HANDLER, concurrency=1, waiting=10) == 1 + 3


def test_while_its_handlers_are_nearly_slow_a_worker_still_prefetches_its_concurrency(store):
    assert _claimed_at_once(store, takes=0.8 * QUICK_HANDLER, concurrency=1) == 1 + 1


def test_after_slow_handlers_a_worker_claims_only_for_its_free_slots(store):
    assert _claimed_at_once(store, takes=2 * QUICK_HANDLER) == 2


def test_prefetched_coroutines_wait_for_a_slot_so_no_more_than_concurrency_run_at_once(store):
    # The worker's clock never moves, so every handler counts as quick and the worker
    # prefetches; the prefetched coroutines must still wait for one of the slots.
    assert _most_coroutines_at_once(store, 100, concurrency=2, lasting=0.002,
                                    clock=postroom.ManualClock()) == 2


def test_a_prefetched_coroutine_whose_task_is_cancelled_while_it_waits_never_runs(store):
    release = threading.Event()
    ran: list[str] = []
    app = App()

    @app.handler("default")
    async def held(payload: dict[str, object], ctx: Context) -> None:
        ran.append(ctx.message_id)
        while payload.get("hold") and not release.is_set():
            await asyncio.sleep(0.005)

    send(store, "first")
    settings = dataclasses.replace(FAST, concurrency=1, renew_every=0.05)
    with running(store, app, settings, clock=postroom.ManualClock()) as worker:
        eventually(lambda: worker.stats.done == 1)  # quick: the worker prefetches now
        store.pause_queue("default", operator="test", reason="to be claimed at once")
        send(store, "running", {"hold": True})
        waiting = send(store, "waiting", {"hold": True})
        store.resume_queue("default")
        eventually(lambda: _processing(store) == 2)
        store.cancel(waiting)
        eventually(lambda: worker.stats.abandoned == 1)
        release.set()
        send(store, "after")  # its slot came back: the worker goes on
        eventually(lambda: worker.stats.done == 3)
    assert ran == ["first", "running", "after"]
    assert store.task(waiting).state == TaskState.CANCELLED


def test_a_prefetched_coroutine_whose_claim_is_lost_before_the_loop_first_runs_it_ends_at_once(
        store):
    release, loop_free = threading.Event(), threading.Event()
    ran: list[str] = []
    app = App()

    @app.handler("default")
    async def held(payload: dict[str, object], ctx: Context) -> None:
        ran.append(ctx.message_id)
        if payload.get("block_loop"):
            loop_free.wait(PATIENCE)  # the event loop itself: nothing else on it runs
        while payload.get("hold") and not release.is_set():
            await asyncio.sleep(0.005)

    send(store, "first")
    settings = dataclasses.replace(FAST, concurrency=1, renew_every=0.05)
    with running(store, app, settings) as worker:
        eventually(lambda: worker.stats.done == 1)  # quick: the worker prefetches now
        store.pause_queue("default", operator="test", reason="to be claimed at once")
        holder = send(store, "running", {"hold": True, "block_loop": True})
        waiting = send(store, "waiting", {"hold": True})
        store.resume_queue("default")
        eventually(lambda: _processing(store) == 2)
        store.cancel(waiting)
        for _ in range(2):  # the second renewal begins once the first one's answers are read
            renewed = store.task(holder).lease_until
            eventually(lambda: store.task(holder).lease_until != renewed)  # noqa: B023
        loop_free.set()  # "waiting" first runs now, its claim lost, the only slot still held
        eventually(lambda: worker.stats.abandoned == 1)
        release.set()
        eventually(lambda: worker.stats.done == 2)
    assert ran == ["first", "running"]


def test_once_its_handlers_turn_slow_a_worker_releases_what_it_prefetched_for_others(store):
    clock = postroom.ManualClock()
    release = threading.Event()
    app = _timed_app(clock, release, takes=0.0, held_takes=20 * QUICK_HANDLER)
    for n in range(4):
        send(store, f"quick-{n}")
    settings = dataclasses.replace(FAST, concurrency=1)
    with running(store, app, settings, clock=clock) as worker:
        eventually(lambda: worker.stats.done == 4)  # quick: 16 tasks a slot prefetched
        store.pause_queue("default", operator="test", reason="to be claimed at once")
        send(store, "slow", {"hold": True})
        waiting = [send(store, f"after-{n}") for n in range(5)]
        store.resume_queue("default")
        eventually(lambda: _processing(store) == 6)
        release.set()  # the slow handler ends: its run turns the average slow
        eventually(lambda: worker.stats.done == 10)
    released = [task_id for task_id in waiting
                if any(attempt.outcome is AttemptOutcome.RELEASED
                       for attempt in store.story(task_id).attempts)]
    # The free slot keeps the first; the other four went back to the queue.
    assert released == waiting[1:]


def test_a_worker_given_a_prefetch_claims_that_many_beyond_free_slots_whatever_its_pace(
        store):
    release = threading.Event()
    app = App()
    app.add_handler("default", lambda payload, ctx: release.wait(PATIENCE))
    store.pause_queue("default", operator="test", reason="to be claimed at once")
    for n in range(8):
        send(store, f"m-{n}")
    settings = dataclasses.replace(FAST, concurrency=2, prefetch=3)
    with running(store, app, settings) as worker:
        store.resume_queue("default")
        eventually(lambda: _processing(store) > 0)
        assert _processing(store) == 5
        release.set()
        eventually(lambda: worker.stats.done == 8)


def test_a_long_handlers_lease_is_renewed_so_nobody_takes_it_over(store):
    release = threading.Event()
    app = App()
    app.add_handler("default", lambda payload, ctx: release.wait(PATIENCE))
    task_id = send(store, "m-1")
    settings = dataclasses.replace(FAST, lease=0.5, renew_every=0.1)
    with running(store, app, settings) as worker:
        eventually(lambda: state(store, task_id) == TaskState.RUNNING)
        first = store.task(task_id).lease_until
        eventually(lambda: store.task(task_id).lease_until > first + 0.3)
        assert store.claim("other", lease=0.5) is None
        release.set()
        eventually(lambda: worker.stats.done == 1)
    assert store.task(task_id).attempts == 1


def test_a_cancelled_tasks_handler_is_told_and_its_outcome_is_not_committed(store):
    noticed = threading.Event()
    app = App()

    @app.handler("default")
    def long(payload: dict[str, object], ctx: Context) -> str:
        noticed.set() if ctx.cancellation.wait(PATIENCE) else None
        return "finished anyway"

    task_id = send(store, "m-1")
    settings = dataclasses.replace(FAST, renew_every=0.05)
    with running(store, app, settings) as worker:
        eventually(lambda: state(store, task_id) == TaskState.RUNNING)
        store.cancel(task_id, reason="not needed")
        assert noticed.wait(PATIENCE)
        eventually(lambda: worker.stats.abandoned == 1)
    assert store.task(task_id).state == TaskState.CANCELLED


def test_a_coroutine_whose_task_was_cancelled_is_cancelled_too(store):
    cancelled = threading.Event()
    app = App()

    @app.handler("default")
    async def wait_forever(payload: dict[str, object], ctx: Context) -> None:
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task_id = send(store, "m-1")
    with running(store, app, dataclasses.replace(FAST, renew_every=0.05)):
        eventually(lambda: state(store, task_id) == TaskState.RUNNING)
        store.cancel(task_id)
        assert cancelled.wait(PATIENCE)


def test_stopping_lets_running_handlers_finish_within_the_grace_period(store):
    started, finish = threading.Event(), threading.Event()
    app = App()

    @app.handler("default")
    def slow(payload: dict[str, object], ctx: Context) -> str:
        started.set()
        finish.wait(PATIENCE)
        return "done in time"

    task_id = send(store, "m-1")
    worker = Worker(store, app, dataclasses.replace(FAST, grace=PATIENCE))
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(PATIENCE)
    worker.stop()
    finish.set()
    thread.join(PATIENCE)
    assert store.task(task_id).state == TaskState.DONE


def test_stopping_releases_prefetched_tasks_at_once_and_never_begins_their_handlers(store):
    started, finish = threading.Event(), threading.Event()
    ran: list[object] = []
    app = App()

    @app.handler("default")
    def first_blocks(payload: dict[str, object], ctx: Context) -> None:
        ran.append(payload["n"])
        started.set()
        finish.wait(PATIENCE)

    store.pause_queue("default", operator="test", reason="to be claimed at once")
    task_ids = [send(store, f"m-{n}", {"n": n}) for n in range(4)]
    worker = Worker(store, app, dataclasses.replace(FAST, concurrency=1, prefetch=3,
                                                    grace=PATIENCE))
    thread = threading.Thread(target=worker.run)
    thread.start()
    store.resume_queue("default")
    assert started.wait(PATIENCE)
    eventually(lambda: _processing(store) == 4)
    worker.stop()
    # Released while the first handler still runs within the grace period.
    eventually(lambda: [state(store, task_id) for task_id in task_ids[1:]]
               == [TaskState.PENDING] * 3)
    finish.set()
    thread.join(PATIENCE)
    assert ran == [0]
    assert state(store, task_ids[0]) == TaskState.DONE
    assert [store.task(task_id).attempts for task_id in task_ids[1:]] == [0, 0, 0]


def test_stopping_releases_what_outlives_the_grace_period_with_its_attempt_given_back(store):
    started = threading.Event()
    app = App()

    @app.handler("default")
    def stuck(payload: dict[str, object], ctx: Context) -> str:
        started.set()
        ctx.cancellation.wait(PATIENCE)
        return "too late"

    task_id = send(store, "m-1")
    worker = Worker(store, app, dataclasses.replace(FAST, grace=0.2))
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(PATIENCE)
    worker.stop()
    thread.join(PATIENCE)
    task = store.task(task_id)
    assert (task.state, task.attempts, task.owner, task.last_error) == (
        TaskState.PENDING, 0, None, None)
    assert worker.stats.released == 1 and worker.stats.done == 0


def test_an_outcome_whose_claim_was_taken_over_is_abandoned_silently(store):
    started, finish = threading.Event(), threading.Event()
    app = App()

    @app.handler("default")
    def slow(payload: dict[str, object], ctx: Context) -> str:
        started.set()
        finish.wait(PATIENCE)
        return "stale"

    task_id = send(store, "m-1")
    # It never renews, and with its one slot taken it cannot claim the task back itself.
    settings = dataclasses.replace(FAST, lease=0.2, renew_every=PATIENCE, concurrency=1)
    with running(store, app, settings) as worker:
        assert started.wait(PATIENCE)
        eventually(lambda: store.task(task_id).lease_until < store.clock.now())
        taker = store.claim("other")
        finish.set()
        eventually(lambda: worker.stats.abandoned == 1)
    store.finish(taker, "current")
    assert store.task(task_id).result == "current"


def test_a_worker_wakes_when_work_arrives_instead_of_waiting_for_its_poll(store):
    app = App()
    app.add_handler("default", lambda payload, ctx: "ok")
    settings = dataclasses.replace(FAST, poll=PATIENCE * 10)
    with running(store, app, settings) as worker:
        eventually(lambda: True)
        send(store, "m-late")
        eventually(lambda: worker.stats.done == 1)


def test_a_queue_without_a_handler_is_refused_when_the_worker_is_made(store):
    app = App()
    app.add_handler("default", lambda payload, ctx: None)
    with pytest.raises(postroom.InvalidInput, match="emails"):
        Worker(store, app, WorkerSettings(queues=("default", "emails")))


@pytest.mark.parametrize(("field", "value"), [("concurrency", 0), ("prefetch", -1),
                                              ("grace", -1), ("poll", 0), ("lease", 0),
                                              ("queues", "default")])
def test_a_worker_setting_out_of_range_is_refused_naming_it(field, value):
    with pytest.raises(postroom.InvalidInput, match=field):
        WorkerSettings(**{field: value})


class Interrupted(BaseException):
    """Not an ``Exception``: what no handler's failure is made of."""


@pytest.mark.parametrize("ending", [Interrupted, SystemExit, KeyboardInterrupt,
                                    asyncio.CancelledError])
def test_a_coroutine_ending_in_a_base_exception_is_abandoned_and_the_loop_runs_the_next(
        store, ending):
    app = App()

    @app.handler("default")
    async def handle(payload: dict[str, object], ctx: Context) -> str:
        if payload.get("end"):
            raise ending
        return "next"

    abandoned = send(store, "ends", {"end": True})
    settings = dataclasses.replace(FAST, concurrency=1)
    with running(store, app, settings) as worker:
        eventually(lambda: worker.stats.abandoned == 1)
        after = send(store, "after")  # its slot came back, and the loop still runs
        eventually(lambda: state(store, after) == TaskState.DONE)
    assert store.task(abandoned).state == TaskState.RUNNING  # its lease will run out
