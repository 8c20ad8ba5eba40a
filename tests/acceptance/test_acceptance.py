"""Acceptance: the product as users run it, on both backends.

Real ``postroom worker`` and ``postroom dispatch`` processes, signed webhooks over real HTTP
to a receiver on 127.0.0.1 that drops connections after committing, times out, answers 5xx,
409, 410 and redirects; processes SIGKILLed and restarted mid-run, frozen past their lease
and woken, stopped by SIGTERM. What must hold at the end: every task done once, one receiver
effect per reply delivered, each fault's reply in its documented state (see
``postroom.runtime.transports.webhook``), no task done that its handler did not finish, and
a clean audit.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

import postroom
from postroom import AttemptOutcome, ReplyState, TaskState
from postroom.audit import audit_database, audit_url
from tests.acceptance.faulty import DELIVERED, MODES, Faulty
from tests.harness.children import Process, python
from tests.support import database_of

#: Seconds a test waits for what the processes should get done.
PATIENCE = 60.0
#: The worker's lease: short, so that a killed or frozen worker's tasks come back quickly.
LEASE = "2"


def eventually(check: Callable[[], bool], what: str) -> None:
    ends = time.monotonic() + PATIENCE
    while not check():
        assert time.monotonic() < ends, f"{what}: not within {PATIENCE:g} s"
        time.sleep(0.05)


def worker(url: str, name: str, *args: str) -> Process:
    return Process(python("-m", "postroom", "worker", url, "--import", "tests.acceptance.jobs",
                          "--poll", "0.1", "--owner", name, *args), name=name)


def dispatcher(url: str, name: str) -> Process:
    # --timeout 1: the receiver that hangs is given up on quickly; --lease 5 (the least
    # that covers a delivery) brings a killed dispatcher's claims back quickly.
    return Process(python("-m", "postroom", "dispatch", url, "--poll", "0.1", "--timeout", "1",
                          "--lease", "5", "--concurrency", "8", "--log-level", "warning",
                          "--owner", name), name=name)


def send(store: postroom.Store, principal: str, message_id: str, payload: dict[str, object],
         queue: str) -> str:
    envelope = postroom.Envelope(message_id=message_id, sender=principal, payload=payload,
                                 queue=queue, deadline=time.time() + 3600, max_attempts=10)
    return store.receive(postroom.AuthContext(principal=principal), envelope).task_id


@pytest.fixture
def live(db_url: str) -> Iterator[postroom.Store]:
    """The store on the system clock, as the processes see it."""
    with postroom.open_store(db_url) as store:
        yield store


def states(store: postroom.Store, tasks: list[str]) -> list[TaskState]:
    return [store.task(task).state for task in tasks]


def test_through_kills_restarts_and_every_receiver_fault_each_task_is_done_once_with_one_effect(
        db_url, live, receiver):
    with Faulty(receiver, hang=3.0) as faulty:
        for mode in MODES:
            faulty.endpoint(live, mode, schedule=[0.2], budget=3 if mode == "redirect" else 8)
        # One reply each for the modes that end dead; the rest share the other 37.
        senders = ["conflict", "gone", "redirect"] + [DELIVERED[n % 4] for n in range(37)]
        tasks = {send(live, principal, f"m-{n}", {"n": n, "seconds": 0.15}, "work"):
                 (principal, n) for n, principal in enumerate(senders)}
        ids = list(tasks)

        first = worker(db_url, "w-1", "--lease", LEASE, "--concurrency", "2")
        post = dispatcher(db_url, "d-1")
        with first, post:  # each SIGKILLed mid-run, with work left over
            eventually(lambda: states(live, ids).count(TaskState.DONE) >= 8, "8 tasks done")
            assert first.kill() == -signal.SIGKILL
            assert states(live, ids).count(TaskState.DONE) < len(ids)
            eventually(lambda: receiver.effects_total() >= 3, "3 effects")
            assert post.kill() == -signal.SIGKILL
            assert receiver.effects_total() < len(ids) - 3

        with worker(db_url, "w-2", "--lease", LEASE) as second, \
                dispatcher(db_url, "d-2") as again:
            eventually(lambda: all(
                (reply := live.reply(task)) is not None
                and reply.state in (ReplyState.SENT, ReplyState.DEAD) for task in ids),
                "every reply sent or dead")
            second.terminate()
            again.terminate()
            assert (second.wait(), again.wait()) == (143, 143), second.tail() + again.tail()

    for task, (principal, n) in tasks.items():
        story = live.story(task)
        assert story.task.state is TaskState.DONE and story.task.result["n"] == n
        assert [a.outcome for a in story.attempts].count(AttemptOutcome.DONE) == 1
        reply = story.reply
        assert reply is not None
        delivered = [d.outcome for d in story.deliveries].count(AttemptOutcome.DELIVERED)
        if principal in DELIVERED:
            assert (reply.state, delivered) == (ReplyState.SENT, 1), (principal, story)
            assert receiver.effect_count(reply.reply_id) == 1
            if principal != "ok":  # the fault happened, and the reply went again
                assert faulty.arrived[reply.reply_id] >= 2
        else:
            assert reply.state is ReplyState.DEAD and delivered == 0, (principal, story)
            assert receiver.effect_count(reply.reply_id) == 0
    killed_mid_task = [a for task in ids for a in live.story(task).attempts
                       if a.owner == "w-1" and a.outcome is AttemptOutcome.LEASE_EXPIRED]
    assert killed_mid_task  # what the SIGKILLed worker was running came back, and was redone
    stories = {principal: live.story(task) for task, (principal, _) in tasks.items()}
    conflict, gone, redirect = (stories[mode] for mode in ("conflict", "gone", "redirect"))
    assert conflict.deliveries[-1].outcome is AttemptOutcome.COLLISION  # 409: dead at once
    assert gone.deliveries[-1].outcome is AttemptOutcome.GONE  # 410: dead, endpoint disabled
    assert live.endpoint("gone").enabled is False
    assert redirect.reply is not None and redirect.reply.attempts == 3  # its whole budget
    # Each 302 is a transient failure, never followed; an attempt the killed dispatcher had
    # on the wire ended when its lease did.
    outcomes = [(d.outcome, d.error or "") for d in redirect.deliveries]
    assert {outcome for outcome, _ in outcomes} <= {AttemptOutcome.TRANSIENT,
                                                    AttemptOutcome.LEASE_EXPIRED}
    assert all("redirects are not followed" in error for outcome, error in outcomes
               if outcome is AttemptOutcome.TRANSIENT)
    assert AttemptOutcome.TRANSIENT in {outcome for outcome, _ in outcomes}
    assert receiver.effects_total() == sum(p in DELIVERED for p in senders)
    assert audit_url(db_url) == []
    assert audit_database(database_of(receiver)) == []


def frozen_holding_nothing(process: Process, url: str) -> None:
    """SIGSTOP ``process`` at a moment it holds no lock in the database (it renews its
    leases every third of one, in short transactions): a process frozen inside one would
    hold the other writers up, which is another story (the README's, on SQLite)."""
    for _ in range(50):
        process.pause()
        if not _locked(url):
            return
        process.resume()
        time.sleep(0.01)
    raise AssertionError(f"{process.name} never let go of the database")


def _locked(url: str) -> bool:
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.1)) as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return True
            conn.rollback()
            return False
    import psycopg

    schema = url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND l.pid <> pg_backend_pid()", (schema,)).fetchone()
    return bool(row and row[0])


def test_a_worker_frozen_past_its_lease_is_fenced_when_it_wakes(db_url, live, tmp_path):
    tasks = [send(live, "planner", f"h-{n}", {"folder": str(tmp_path)}, "held")
             for n in range(4)]
    started = [tmp_path / f"{task}.1" for task in tasks]
    with worker(db_url, "frozen", "--lease", "1", "--no-duties", "--concurrency", "4",
                "--grace", "5") as frozen:
        eventually(lambda: all(path.exists() for path in started), "the first worker to run all")
        frozen_holding_nothing(frozen, db_url)
        with worker(db_url, "thawed", "--lease", "5", "--concurrency", "4") as taker:
            eventually(lambda: all((tmp_path / f"{task}.2").exists() for task in tasks),
                       "the second worker to take every task over")
            (tmp_path / "go").touch()
            eventually(lambda: states(live, tasks) == [TaskState.DONE] * 4, "all done")
            # Woken, its handlers end (they see the gate, or are told they lost their
            # claims); stopping, it settles what they ended with: stale, so refused.
            frozen.resume()
            frozen.terminate()
            taker.terminate()
            assert (frozen.wait(), taker.wait()) == (143, 143), frozen.tail() + taker.tail()
    for task in tasks:
        story = live.story(task)
        assert story.task.result == {"finished": True, "fence": 2}
        assert [(a.owner, a.outcome) for a in story.attempts] == [
            ("frozen", AttemptOutcome.LEASE_EXPIRED), ("thawed", AttemptOutcome.DONE)]
    assert audit_url(db_url) == []


def test_sigterm_leaves_zero_tasks_wrongly_done(db_url, live, tmp_path: Path):
    held = [send(live, "planner", f"h-{n}", {"folder": str(tmp_path)}, "held")
            for n in range(3)]
    quick = [send(live, "planner", f"q-{n}", {"n": n, "seconds": 0.05}, "work")
             for n in range(20)]
    with worker(db_url, "stopped", "--lease", LEASE, "--concurrency", "6",
                "--grace", "0.3") as stopped:
        eventually(lambda: all((tmp_path / f"{task}.1").exists() for task in held),
                   "every held task to start")
        eventually(lambda: TaskState.DONE in states(live, quick), "a quick task done")
        stopped.terminate()
        assert stopped.wait() == 143, stopped.tail()
    for task in held:  # never finished: handed back, the attempt given back, no reply
        found = live.task(task)
        assert (found.state, found.attempts, found.owner) == (TaskState.PENDING, 0, None)
        assert live.reply(task) is None
    for task in quick:  # each either done by its handler, or handed back untouched
        found = live.task(task)
        assert found.state in (TaskState.DONE, TaskState.PENDING)
        if found.state is TaskState.DONE:
            assert found.result["n"] == quick.index(task) and live.reply(task) is not None
        else:
            assert found.attempts == 0 and live.reply(task) is None
    assert audit_url(db_url) == []
