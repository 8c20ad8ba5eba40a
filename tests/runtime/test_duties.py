"""SPEC §10: background duties, each behind one protocol, safe on many hosts at once, and never
the end of their process."""

from __future__ import annotations

import dataclasses
import threading

import pytest

import postroom
from postroom import FollowUp, TaskState
from postroom.runtime import App
from postroom.runtime.continuations import ContinuationRunner
from postroom.runtime.deadlines import DeadlineSweeper
from postroom.runtime.duty import Duties
from postroom.runtime.pruner import Pruner
from postroom.runtime.rescuer import LeaseRescuer
from postroom.runtime.scheduler import Scheduler
from postroom.runtime.wait_timer import WaitTimer
from tests.runtime.support import FAST, eventually, running, send
from tests.support import SETTINGS, START, envelope

ALICE = postroom.AuthContext(principal="alice")


@pytest.fixture
def store(db_url, clock):  # duties decide by the store's clock: a manual one here
    with postroom.open_store(db_url, clock=clock, settings=SETTINGS) as opened:
        yield opened


def test_the_lease_rescuer_recovers_a_dead_owners_task_with_nobody_claiming(store, auth, clock):
    task_id = store.receive(auth, envelope()).task_id
    store.claim("dead")
    clock.advance(store.settings.lease)
    assert LeaseRescuer(store).run_once() == 1
    task = store.task(task_id)
    assert (task.state, task.owner) == (TaskState.PENDING, None)
    assert LeaseRescuer(store).run_once() == 0


def test_the_deadline_sweeper_expires_a_task_and_writes_its_reply(store, auth, clock):
    task_id = store.receive(auth, envelope(deadline=START + 5)).task_id
    clock.advance(5)
    assert DeadlineSweeper(store).run_once() == 1
    assert store.task(task_id).state == TaskState.EXPIRED
    assert store.reply(task_id).status == TaskState.EXPIRED


def test_the_wait_timer_times_out_a_wait_nobody_answered(store, clock):
    store.open_wait("f", "s", 0, START + 5)
    clock.advance(5)
    assert WaitTimer(store).run_once() == 1
    assert store.wait("f", "s").state == "timed_out"


def test_the_continuation_runner_resumes_each_ended_wait_once_with_its_resumer(
        store, auth, clock):
    store.receive(auth, envelope())
    store.finish(store.claim("w"), "asked",
                 waits=[postroom.OpenWait(flow="refund-1", step="approval",
                                          deadline=START + 60)])
    store.signal(ALICE, "e-1", "refund-1", "approval", 1, {"approve": True})
    app = App()
    seen: list[postroom.Continuation] = []

    @app.resumer("approval")
    def next_step(continuation: postroom.Continuation) -> FollowUp:
        seen.append(continuation)
        return FollowUp(message_id="refund", payload={"approved": continuation.value})

    first, second = ContinuationRunner(store, app), ContinuationRunner(store, app)
    assert (first.run_once(), second.run_once()) == (1, 0)  # two hosts: one effect
    (continuation,) = seen
    assert (continuation.kind, continuation.value) == ("signal", {"approve": True})
    follow_up = store.claim("w")
    assert follow_up.payload == {"approved": {"approve": True}}


def test_a_continuation_at_a_step_with_no_resumer_here_is_left_for_another_process(store):
    store.open_wait("f", "unknown-step", 0, START + 60)
    store.signal(ALICE, "e-1", "f", "unknown-step", 1, 1)
    app = App()
    app.add_resumer("approval", lambda continuation: None)
    assert ContinuationRunner(store, app).run_once() == 0
    assert len(store.continuations()) == 1


def test_a_resumer_that_raises_leaves_the_continuation_for_the_next_round(store):
    store.open_wait("f", "s", 0, START + 60)
    store.signal(ALICE, "e-1", "f", "s", 1, 1)
    app = App()
    calls: list[int] = []

    @app.resumer("s")
    def flaky(continuation: postroom.Continuation) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("downstream is down")

    runner = ContinuationRunner(store, app)
    assert runner.run_once() == 0
    assert runner.run_once() == 1
    assert store.continuations() == []


def test_the_pruner_forgets_what_retention_no_longer_promises(db_url, clock, auth, transport):
    with postroom.open_store(db_url, clock=clock, settings=postroom.Settings(retention=0)) as s:
        task_id = s.receive(auth, envelope()).task_id
        s.finish(s.claim("w"), "ok")
        s.dispatch(transport)
        clock.advance(1)
        assert Pruner(s).run_once() == 1
        with pytest.raises(postroom.NotFound):
            s.task(task_id)


def test_the_scheduler_enqueues_a_period_once_it_has_begun(store, clock):
    store.add_schedule("tick", "* * * * *", operator="op")
    assert Scheduler(store).run_once() == 0
    clock.advance(60)
    assert Scheduler(store).run_once() == 1
    assert Scheduler(store).run_once() == 0
    assert store.list_tasks(principal="schedule:tick").items[0].state == TaskState.PENDING


def test_a_workers_scheduler_enqueues_what_its_handlers_then_run(store, clock):
    ran = threading.Event()
    app = App()
    app.add_handler("ticks", lambda payload, ctx: ran.set())
    store.add_schedule("tick", "* * * * *", operator="op", queue="ticks")
    clock.advance(60)  # the first period has begun
    with running(store, app, dataclasses.replace(FAST, duties=True)):
        assert ran.wait(10)


class _Flaky:
    """A duty that fails its first round and then counts its rounds."""

    name = "flaky duty"
    interval = 0.01

    def __init__(self) -> None:
        self.rounds = 0
        self.ran_after_failing = threading.Event()

    def run_once(self) -> int:
        self.rounds += 1
        if self.rounds == 1:
            raise RuntimeError("a bad day")
        self.ran_after_failing.set()
        return 0


def test_a_duty_that_raises_is_backed_off_and_goes_on(caplog):
    duty = _Flaky()
    duties = Duties([duty], seed=0)
    duties.start()
    try:
        assert duty.ran_after_failing.wait(10)
    finally:
        duties.stop()
    assert any("flaky duty failed" in record.getMessage() for record in caplog.records)


def test_a_workers_duties_run_beside_it_and_stop_with_it(db_url):
    with postroom.open_store(db_url, settings=SETTINGS) as store:
        app = App()
        app.add_handler("default", lambda payload, ctx: None)
        store.open_wait("f", "s", 0, store.clock.now() + 0.2)
        with running(store, app, dataclasses.replace(FAST, duties=True)):
            eventually(lambda: store.wait("f", "s").state == "timed_out")
        send(store, "after")  # the store still works after the worker stopped


@pytest.mark.parametrize("interval", [0, -1, float("nan"), "1"])
def test_a_duty_interval_that_is_not_a_sensible_number_is_refused(store, interval):
    with pytest.raises(postroom.InvalidInput, match="interval"):
        LeaseRescuer(store, interval=interval)
