"""The limits issue: execution timeouts (per handler, or the worker's default per queue) and a
worker's own concurrency per queue. Timeouts are measured on a manual clock the test moves."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable

import pytest

import postroom
from postroom import TaskState
from postroom.runtime import App, Context
from postroom.runtime.worker import Worker, WorkerSettings
from tests.runtime.support import FAST, PATIENCE, eventually, running, send, state


def timed_out(store: postroom.Store, task_id: str) -> bool:
    """Whether the task's last attempt failed past its execution timeout."""
    task = store.task(task_id)
    return task.state != TaskState.RUNNING and "execution timeout" in (task.last_error or "")


def slow_app(until: Callable[[Context], object]) -> tuple[App, threading.Event]:
    """An app whose one handler (timeout: 10s) says it started, then returns once ``until``
    does; and the event it sets."""
    started = threading.Event()
    app = App()

    @app.handler("default", timeout=10)
    def slow(payload: dict[str, object], ctx: Context) -> str:
        started.set()
        until(ctx)
        return "too late"

    return app, started


# -- execution timeouts -------------------------------------------------------------------------


def test_a_handler_past_its_timeout_is_told_and_its_attempt_fails_as_retryable(store):
    told = threading.Event()
    app, started = slow_app(lambda ctx: ctx.cancellation.wait(PATIENCE) and told.set())
    clock = postroom.ManualClock(0)
    task_id = send(store, "m-1", max_attempts=3)
    with running(store, app, clock=clock) as worker:
        assert started.wait(PATIENCE)
        clock.advance(10)
        eventually(lambda: timed_out(store, task_id))
        assert told.wait(PATIENCE)
        eventually(lambda: worker.stats.retried == 1)
        assert worker.stats.timed_out == 1
    task = store.task(task_id)
    assert (task.state, task.attempts, task.result) == (TaskState.PENDING, 1, None)
    assert task.last_error == "timed out: ran past its execution timeout of 10s"


def test_a_coroutine_past_its_timeout_is_cancelled(store):
    started, cancelled = threading.Event(), threading.Event()
    app = App()

    @app.handler("default", timeout=5)
    async def wait_forever(payload: dict[str, object], ctx: Context) -> None:
        started.set()
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    clock = postroom.ManualClock(0)
    task_id = send(store, "m-1")
    with running(store, app, clock=clock):
        assert started.wait(PATIENCE)
        clock.advance(5)
        assert cancelled.wait(PATIENCE)
        eventually(lambda: timed_out(store, task_id))


def test_the_workers_timeout_for_a_queue_holds_for_a_handler_that_sets_none_and_its_own_wins(
        store):
    release = threading.Event()
    started: list[str] = []

    def hold(payload: dict[str, object], ctx: Context) -> str:
        started.append(ctx.queue)
        release.wait(PATIENCE)
        return "done"

    app = App()
    app.add_handler("by-worker", hold)
    app.add_handler("own", hold, timeout=100)
    settings = dataclasses.replace(FAST, timeouts={"by-worker": 5, "own": 5})
    clock = postroom.ManualClock(0)
    by_worker = send(store, "m-1", queue="by-worker")
    own = send(store, "m-2", queue="own")
    with running(store, app, settings, clock=clock):
        eventually(lambda: len(started) == 2)
        clock.advance(6)
        eventually(lambda: timed_out(store, by_worker))
        release.set()  # the watchdog looked at both after the clock moved: "own" ran on
        eventually(lambda: state(store, own) == TaskState.DONE)
    assert store.task(own).result == "done"


def test_a_plain_functions_slot_stays_taken_until_it_returns_and_its_result_is_ignored(store):
    release = threading.Event()
    # Looks at nothing: its thread cannot be stopped.
    app, started = slow_app(lambda ctx: release.wait(PATIENCE))
    clock = postroom.ManualClock(0)
    first = send(store, "m-1", max_attempts=1)
    second = send(store, "m-2", max_attempts=1)
    with running(store, app, dataclasses.replace(FAST, concurrency=1), clock=clock) as worker:
        assert started.wait(PATIENCE)
        clock.advance(10)
        eventually(lambda: worker.stats.failed == 1)
        assert (state(store, first), state(store, second)) == (TaskState.FAILED,
                                                               TaskState.PENDING)
        assert worker.stats.claimed == 1  # the one slot is still the stubborn thread's
        release.set()
        eventually(lambda: state(store, second) == TaskState.DONE)
    assert store.task(first).result is None
    assert store.task(first).last_error.endswith("ran past its execution timeout of 10s")


@pytest.mark.parametrize("timeout", [0, -1, 86_401, "10", True])
def test_a_handlers_timeout_that_cannot_be_is_refused_naming_it(timeout):
    with pytest.raises(postroom.InvalidInput, match="timeout"):
        App().add_handler("default", lambda payload, ctx: None, timeout=timeout)


def test_an_included_app_keeps_its_handlers_timeouts():
    inner, outer = App(), App()
    inner.add_handler("default", lambda payload, ctx: None, timeout=7)
    outer.include(inner)
    spec = outer.handler_for("default")
    assert spec is not None and spec.timeout == 7


# -- a worker's concurrency per queue -----------------------------------------------------------


def test_a_queue_capped_in_the_worker_runs_at_most_its_cap_while_the_others_run_on(store):
    release = threading.Event()
    lock = threading.Lock()
    now, most = [0], [0]
    app = App()

    @app.handler("slow")
    def slow(payload: dict[str, object], ctx: Context) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        release.wait(PATIENCE)
        with lock:
            now[0] -= 1

    app.add_handler("fast", lambda payload, ctx: "ok")
    settings = dataclasses.replace(FAST, concurrency=4, queue_concurrency={"slow": 2})
    slow_ids = [send(store, f"s-{n}", queue="slow") for n in range(5)]
    fast_ids = [send(store, f"f-{n}", queue="fast") for n in range(20)]
    with running(store, app, settings) as worker:
        eventually(lambda: all(state(store, task_id) == TaskState.DONE for task_id in fast_ids))
        assert sum(state(store, task_id) == TaskState.RUNNING for task_id in slow_ids) == 2
        release.set()
        eventually(lambda: worker.stats.done == 25)
    assert most[0] == 2


def test_a_worker_whose_every_queue_is_capped_claims_no_more_than_the_caps(store):
    release = threading.Event()
    app = App()
    app.add_handler("a", lambda payload, ctx: release.wait(PATIENCE))
    app.add_handler("b", lambda payload, ctx: release.wait(PATIENCE))
    settings = dataclasses.replace(FAST, concurrency=8, queue_concurrency={"a": 1, "b": 2})
    ids = [send(store, f"{queue}-{n}", queue=queue) for queue in "ab" for n in range(4)]
    with running(store, app, settings) as worker:
        eventually(lambda: worker.stats.claimed == 3)
        running_now = [store.task(task_id).queue for task_id in ids
                       if state(store, task_id) == TaskState.RUNNING]
        assert sorted(running_now) == ["a", "b", "b"]
        release.set()
        eventually(lambda: worker.stats.done == 8)


@pytest.mark.parametrize(("field", "value"), [
    ("queue_concurrency", {"default": 0}), ("queue_concurrency", {"default": 1.5}),
    ("queue_concurrency", [("default", 1)]), ("timeouts", {"default": 0}),
    ("timeouts", {"default": "soon"})])
def test_a_per_queue_setting_that_cannot_be_is_refused_naming_it(field, value):
    with pytest.raises(postroom.InvalidInput, match=field):
        WorkerSettings(**{field: value})


@pytest.mark.parametrize("field", ["queue_concurrency", "timeouts"])
def test_a_per_queue_setting_for_a_queue_the_worker_does_not_claim_is_refused(store, field):
    app = App()
    app.add_handler("default", lambda payload, ctx: None)
    with pytest.raises(postroom.InvalidInput, match=f"{field}.*emails"):
        Worker(store, app, WorkerSettings(**{field: {"emails": 1}}))
