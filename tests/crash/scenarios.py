"""The crash table: for every fault point, how to reach it and what must hold afterwards.

``CRASHES`` maps a fault point's name to a ``Crash``:

- ``setup(world)`` -- what the parent puts in the databases first;
- ``steps(world)`` -- what the child process does; the last step runs with the point armed,
  so the child dies there (``os._exit``);
- ``check(world)`` -- what the reopened databases show: before a commit nothing of the
  operation (``left_nothing``), after it all of it (``left_everything``);
- ``retry(world)`` -- what the real caller does next (send the same message again, retry with
  the same claim, or restart and sweep when the claim died with the process), driving the
  task to the end; then ``converged(world)``.

Another suite keeps its own table for its own operations (``tests/crash/wait_scenarios.py``),
and ``test_crash_points`` runs the union.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import postroom
from postroom import Fenced, NotFound, Outcome, ReplyState, TaskState
from postroom.approvals import request_approval_id
from postroom.audit import audit_url
from postroom.db import Database, dialect_for_url
from postroom.settings import DEFAULT_RETENTION
from postroom.store import inspect_store
from postroom.transitions import FLOOR_MARGIN, reply_id_for
from tests.crash.world import AUTH, RESULT, Refusing, World, task_id
from tests.harness.steps import HUMAN as REFUND_HUMAN
from tests.harness.steps import REFUND as REFUND_EFFECT
from tests.support import SETTINGS, START, envelope, latest_schema

TASK = task_id("m-1")
REPLY = reply_id_for(TASK)
LEASE = SETTINGS.lease


@dataclass(frozen=True)
class Call:
    """One step the child runs (see ``tests.harness.steps``), at ``START + at`` if given."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    at: float | None = None


def call(name: str, *, at: float | None = None, **args: Any) -> Call:
    """``Call(name, args, at)`` with the arguments spelled as keywords."""
    return Call(name, args, at)


class Crash:
    """One way to kill a process at a fault point, and what must hold afterwards."""

    #: Whether the child opens the store and the receiver before its first step.
    opens = True

    def setup(self, world: World) -> None:
        """Prepare the databases: by default one pending task, ``m-1``."""
        world.receive()

    def steps(self, world: World) -> Sequence[Call]:
        """The child's steps; the last one reaches the armed point."""
        raise NotImplementedError

    def check(self, world: World) -> None:
        """Assert what the crash left in the reopened databases."""
        raise NotImplementedError

    def retry(self, world: World) -> None:
        """Retry as the real caller would, and drive the pipeline to the end."""
        raise NotImplementedError

    def converged(self, world: World) -> None:
        """Assert the end state: terminal, reply sent, one receiver effect."""
        world.assert_converged()


class CommitCrash(Crash):
    """A crash before (``committed=False``) or after (``True``) one transaction's commit."""

    def __init__(self, *, committed: bool) -> None:
        self.committed = committed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(committed={self.committed})"

    def check(self, world: World) -> None:
        if self.committed:
            self.left_everything(world)
        else:
            self.left_nothing(world)

    def left_nothing(self, world: World) -> None:
        """Nothing of the operation is in the database."""
        raise NotImplementedError

    def left_everything(self, world: World) -> None:
        """All of the operation is in the database."""
        raise NotImplementedError


def commits(operation: str, kind: type[CommitCrash]) -> dict[str, Crash]:
    """The table entries for ``<operation>.before_commit`` and ``.after_commit``."""
    return {f"{operation}.before_commit": kind(committed=False),
            f"{operation}.after_commit": kind(committed=True)}


def _running_under_the_dead_worker(world: World) -> postroom.Task:
    task = world.task()
    assert (task.state, task.owner, task.fence, task.attempts) == (
        TaskState.RUNNING, "w-dead", 1, 1)
    return task


# -- receiving --------------------------------------------------------------------------------


class Receive(CommitCrash):
    """The process dies storing a message; the sender, never ACKed, sends it again."""

    def setup(self, world: World) -> None:
        world.expect("m-1")

    def steps(self, world: World) -> Sequence[Call]:
        return [call("receive", message_id="m-1")]

    def left_nothing(self, world: World) -> None:
        assert world.store.info()["tasks"] == {}

    def left_everything(self, world: World) -> None:
        assert world.task().state == TaskState.PENDING

    def retry(self, world: World) -> None:
        ack = world.receive("m-1")
        assert (ack.task_id, ack.duplicate) == (TASK, self.committed)
        world.work()
        world.dispatch()


class ReceiveAtomic(CommitCrash):
    """The process dies storing an atomic batch: both messages or neither."""

    def setup(self, world: World) -> None:
        world.expect("m-1", "m-2")

    def steps(self, world: World) -> Sequence[Call]:
        return [call("receive_atomic", message_ids=["m-1", "m-2"])]

    def left_nothing(self, world: World) -> None:
        assert world.store.info()["tasks"] == {}

    def left_everything(self, world: World) -> None:
        assert world.store.info()["tasks"] == {"pending": 2}

    def retry(self, world: World) -> None:
        acks = world.store.receive_atomic(AUTH, [envelope("m-1"), envelope("m-2")])
        assert [(a.task_id, a.duplicate) for a in acks] == [
            (task_id("m-1"), self.committed), (task_id("m-2"), self.committed)]
        world.work()
        world.work()
        world.dispatch()


# -- tasks ------------------------------------------------------------------------------------


class Claim(CommitCrash):
    """A worker dies claiming; a committed claim dies with it and blocks until its lease ends."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead")]

    def left_nothing(self, world: World) -> None:
        task = world.task()
        assert (task.state, task.owner, task.fence, task.attempts) == (
            TaskState.PENDING, None, 0, 0)

    def left_everything(self, world: World) -> None:
        task = _running_under_the_dead_worker(world)
        assert task.lease_until == START + LEASE

    def retry(self, world: World) -> None:
        if self.committed:
            assert world.store.claim("w-restarted") is None, "the dead worker's lease holds"
            world.recover()
        assert world.work().fence == (2 if self.committed else 1)
        world.dispatch()


class Renew(CommitCrash):
    """A worker dies renewing its lease at +20 s; a committed renewal holds until +50 s."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("renew", at=20)]

    def left_nothing(self, world: World) -> None:
        assert _running_under_the_dead_worker(world).lease_until == START + LEASE

    def left_everything(self, world: World) -> None:
        assert _running_under_the_dead_worker(world).lease_until == START + 20 + LEASE

    def retry(self, world: World) -> None:
        world.clock.set(START + LEASE)
        assert world.store.sweep().leases_recovered == (0 if self.committed else 1)
        if self.committed:
            world.recover()
        assert world.work().fence == 2
        world.dispatch()


class Finish(CommitCrash):
    """A worker dies committing its result (task done and reply, one transaction)."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("finish", result=RESULT)]

    def left_nothing(self, world: World) -> None:
        _running_under_the_dead_worker(world)
        assert world.reply() is None

    def left_everything(self, world: World) -> None:
        task = world.task()
        assert (task.state, task.owner, task.result) == (TaskState.DONE, None, RESULT)
        reply = world.reply()
        assert reply is not None and (reply.state, reply.status) == (
            ReplyState.PENDING, TaskState.DONE)

    def retry(self, world: World) -> None:
        if self.committed:
            # The worker comes back with the claim it kept: the task is already done.
            with pytest.raises(Fenced, match="done"):
                world.store.finish(world.dead_claim, RESULT)
        else:
            world.recover()
            assert world.work().fence == 2
        world.dispatch()


class Settle(Finish):
    """A worker dies group-committing its result: the same all-or-nothing as ``finish``."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("settle", result=RESULT)]


class RenewAll(Renew):
    """A worker dies renewing its leases together: the same as one ``renew``."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("renew_all", at=20)]


class Fail(CommitCrash):
    """A worker dies reporting a retryable failure; a committed one backs off 10 s."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("fail", reason="flaky")]

    def left_nothing(self, world: World) -> None:
        assert _running_under_the_dead_worker(world).last_error is None

    def left_everything(self, world: World) -> None:
        task = world.task()
        assert (task.state, task.owner, task.attempts, task.last_error, task.available_at) == (
            TaskState.PENDING, None, 1, "flaky", START + 10)

    def retry(self, world: World) -> None:
        if self.committed:
            with pytest.raises(Fenced, match="pending"):
                world.store.fail(world.dead_claim, "flaky")
            assert world.store.claim("w-restarted") is None, "the backoff holds"
            world.clock.set(START + 10)
        else:
            world.recover()
        claim = world.work()
        assert (claim.fence, claim.attempt) == (2, 2)
        world.dispatch()


class Release(CommitCrash):
    """A worker dies handing its task back (a shutdown): a committed release gives the
    attempt back and makes the task claimable at once."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("claim", owner="w-dead"), call("release")]

    def left_nothing(self, world: World) -> None:
        assert _running_under_the_dead_worker(world).attempts == 1

    def left_everything(self, world: World) -> None:
        task = world.task()
        assert (task.state, task.owner, task.attempts, task.fence, task.last_error) == (
            TaskState.PENDING, None, 0, 1, None)

    def retry(self, world: World) -> None:
        if self.committed:
            with pytest.raises(Fenced, match="pending"):
                world.store.release(world.dead_claim)
        else:
            world.recover()
        claim = world.work()
        # The fence never goes back; the attempt counts once whichever way it went.
        assert (claim.fence, claim.attempt) == (2, 1 if self.committed else 2)
        world.dispatch()


class Cancel(CommitCrash):
    """The process dies cancelling a pending task (state and reply, one transaction)."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("cancel", task_id=TASK)]

    def left_nothing(self, world: World) -> None:
        assert world.task().state == TaskState.PENDING
        assert world.reply() is None

    def left_everything(self, world: World) -> None:
        assert world.task().state == TaskState.CANCELLED
        reply = world.reply()
        assert reply is not None and reply.status == TaskState.CANCELLED

    def retry(self, world: World) -> None:
        assert world.store.cancel(TASK) is not self.committed
        world.dispatch()


class Retry(CommitCrash):
    """The process dies running a cancelled task again (the new task, its inbox row and the
    operator's record: one transaction)."""

    def steps(self, world: World) -> Sequence[Call]:
        world.store.cancel(TASK)
        return [call("retry", task_id=TASK, request_id="req-1")]

    def left_nothing(self, world: World) -> None:
        assert world.store.retries(TASK) == []

    def left_everything(self, world: World) -> None:
        (retry,) = world.store.retries(TASK)
        assert world.store.task(retry.new_task_id).retry_of == TASK

    def retry(self, world: World) -> None:
        # The operator sends the same request again: a committed re-run is answered, not
        # made twice, so either way there is exactly one.
        done = world.store.retry(TASK, operator="op", reason="test", request_id="req-1")
        assert done.number == 1 and world.store.retries(TASK) == [done]
        world.dispatch()


class RetryMany(CommitCrash):
    """The process dies in a bulk re-run, at the second task's decision: each re-run is a
    transaction of its own, so the first one stands and the second is all or nothing."""

    #: The bulk call's commits passed before the one it dies at.
    skip = 1

    def setup(self, world: World) -> None:
        for message_id in ("m-1", "m-2"):
            world.receive(message_id)
            world.store.cancel(task_id(message_id))

    def steps(self, world: World) -> Sequence[Call]:
        return [call("retry_many", state="cancelled", request_id="bulk-1")]

    def _reruns(self, world: World) -> int:
        return sum(len(world.store.retries(task_id(m))) for m in ("m-1", "m-2"))

    def left_nothing(self, world: World) -> None:
        assert self._reruns(world) == 1

    def left_everything(self, world: World) -> None:
        assert self._reruns(world) == 2
        assert {len(world.store.retries(task_id(m))) for m in ("m-1", "m-2")} == {1}

    def retry(self, world: World) -> None:
        # The operator sends the same bulk request again: each task ends re-run once.
        again = world.store.retry_many(operator="op", reason="test", state="cancelled",
                                       request_id="bulk-1")
        assert len(again) == 2 and self._reruns(world) == 2
        world.dispatch()


class Pause(CommitCrash):
    """The process dies pausing a queue: paused for every host, or not at all."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("pause", queue="default")]

    def left_nothing(self, world: World) -> None:
        assert world.store.paused_queues() == []

    def left_everything(self, world: World) -> None:
        assert [p.queue for p in world.store.paused_queues()] == ["default"]

    def retry(self, world: World) -> None:
        assert world.store.pause_queue("default", operator="op", reason="again") is not (
            self.committed)
        world.store.resume_queue("default")
        world.work()
        world.dispatch()


class ResumeQueue(CommitCrash):
    """The process dies resuming a paused queue."""

    def steps(self, world: World) -> Sequence[Call]:
        world.store.pause_queue("default", operator="op", reason="before")
        return [call("resume_queue", queue="default")]

    def left_nothing(self, world: World) -> None:
        assert [p.queue for p in world.store.paused_queues()] == ["default"]

    def left_everything(self, world: World) -> None:
        assert world.store.paused_queues() == []

    def retry(self, world: World) -> None:
        assert world.store.resume_queue("default") is not self.committed
        world.work()
        world.dispatch()


class Limit(CommitCrash):
    """The process dies limiting a queue: the limit and its slots, or nothing."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("limit", queue="default", running=2)]

    def left_nothing(self, world: World) -> None:
        assert world.store.queue_limits() == {}

    def left_everything(self, world: World) -> None:
        assert world.store.queue_limits() == {"default": 2}

    def retry(self, world: World) -> None:
        world.store.set_queue_limit("default", 2)
        assert world.store.queue_limits() == {"default": 2}
        world.store.set_queue_limit("default", None)
        world.work()
        world.dispatch()


# -- human approvals --------------------------------------------------------------------------


class Grant(CommitCrash):
    """A human's grant dies committing: the approval and its event, or neither; the retried
    grant is the same approval, and the side effect then consumes it once."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("grant", approval_id="refund-17", expires_at=START + 600)]

    def left_nothing(self, world: World) -> None:
        with pytest.raises(NotFound):
            world.store.approval("refund-17")

    def left_everything(self, world: World) -> None:
        assert world.store.approval("refund-17").uses == 0

    def retry(self, world: World) -> None:
        _grant(world)
        claim = world.store.claim("w-restarted")
        assert claim is not None
        world.store.finish(claim, RESULT, side_effects=[REFUND_EFFECT])
        assert world.store.approval("refund-17").uses == 1
        world.dispatch()


class Revoke(CommitCrash):
    """A revocation dies committing: after it, the side effect is refused (nothing written);
    before it, the retried revocation refuses it all the same."""

    def setup(self, world: World) -> None:
        world.receive()
        _grant(world)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("revoke", approval_id="refund-17")]

    def left_nothing(self, world: World) -> None:
        assert world.store.approval("refund-17").revoked_at is None

    def left_everything(self, world: World) -> None:
        assert world.store.approval("refund-17").revoked_by == "alice"

    def retry(self, world: World) -> None:
        assert world.store.revoke_approval(REFUND_HUMAN, "refund-17",
                                           reason="again") is not self.committed
        claim = world.store.claim("w-restarted")
        assert claim is not None
        with pytest.raises(postroom.NotApproved):
            world.store.finish(claim, RESULT, side_effects=[REFUND_EFFECT])
        world.store.finish(claim, RESULT)
        world.dispatch()


class Answer(CommitCrash):
    """The human's answer dies committing: the grant and the wait's signal, or neither. The
    retried answer is accepted (or replayed), the flow resumes once, and the follow-up's side
    effect consumes the approval once."""

    def setup(self, world: World) -> None:
        world.receive()
        claim = world.store.claim("w-asker")
        assert claim is not None
        world.store.finish(claim, RESULT, waits=[postroom.OpenWait(
            flow="refund-m-1", step="approval", deadline=START + 600, responder="alice",
            approval=postroom.ApprovalRequest(action=REFUND_EFFECT.action,
                                              resource=REFUND_EFFECT.resource,
                                              data=REFUND_EFFECT.data,
                                              expires_at=START + 3600))])

    def steps(self, world: World) -> Sequence[Call]:
        return [call("answer_approval", event_id="yes-1", flow="refund-m-1", step="approval",
                     generation=1, approve=True)]

    def left_nothing(self, world: World) -> None:
        assert world.store.continuations() == []
        with pytest.raises(NotFound):
            world.store.approval(_REQUESTED)

    def left_everything(self, world: World) -> None:
        assert len(world.store.continuations()) == 1
        assert world.store.approval(_REQUESTED).granted_by == "alice"

    def retry(self, world: World) -> None:
        receipt = world.store.answer_approval(REFUND_HUMAN, "yes-1", "refund-m-1", "approval",
                                              1, approve=True)
        assert receipt.result is (postroom.SignalResult.REPLAY if self.committed
                                  else postroom.SignalResult.ACCEPTED)
        follow_up = world.store.resume("refund-m-1", "approval", 1, postroom.FollowUp(
            message_id="issue", payload={"refund": 17}))
        assert follow_up.task_id is not None
        world.expected.append(follow_up.task_id)
        claim = world.store.claim("w-restarted")
        assert claim is not None and claim.task_id == follow_up.task_id
        world.store.finish(claim, RESULT, side_effects=[postroom.SideEffect(
            action=REFUND_EFFECT.action, resource=REFUND_EFFECT.resource,
            data=REFUND_EFFECT.data, approval_id=_REQUESTED)])
        assert world.store.approval(_REQUESTED).uses == 1
        world.dispatch()


_REQUESTED = request_approval_id("refund-m-1", "approval", 1)


def _grant(world: World) -> None:
    world.store.grant_approval(REFUND_HUMAN, "refund-17", action=REFUND_EFFECT.action,
                               resource=REFUND_EFFECT.resource, data=REFUND_EFFECT.data,
                               expires_at=START + 600, requested_by="planner")


class Sweep(CommitCrash):
    """A sweeper dies recovering a dead worker's expired lease."""

    def setup(self, world: World) -> None:
        world.receive()
        claim = world.store.claim("w-dead")
        assert claim is not None
        world.clock.set(claim.lease_until)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("sweep")]

    def left_nothing(self, world: World) -> None:
        _running_under_the_dead_worker(world)

    def left_everything(self, world: World) -> None:
        task = world.task()
        assert (task.state, task.owner, task.last_error) == (
            TaskState.PENDING, None, "lease expired on attempt 1")

    def retry(self, world: World) -> None:
        assert world.store.sweep().leases_recovered == (0 if self.committed else 1)
        assert world.work().fence == 2
        world.dispatch()


# -- replies ----------------------------------------------------------------------------------


class Delivery(Crash):
    """A dispatcher dies delivering a done task's reply.

    Which commits happened decides what the reopened databases show: the reply claimed
    (``sending`` under the dead dispatcher), the receiver's receipt and effect, the ``sent``
    record. A claimed reply is redelivered only after the dead dispatcher's lease, with the
    same reply_id; if the receiver already had it, it answers duplicate and adds no effect.
    """

    def __init__(self, *, claimed: bool, received: bool, recorded: bool) -> None:
        self.claimed, self.received, self.recorded = claimed, received, recorded

    def __repr__(self) -> str:
        return (f"Delivery(claimed={self.claimed}, received={self.received}, "
                f"recorded={self.recorded})")

    def setup(self, world: World) -> None:
        world.receive()
        world.work(owner="w-1")

    def steps(self, world: World) -> Sequence[Call]:
        return [call("dispatch", owner="d-dead")]

    def check(self, world: World) -> None:
        reply = world.reply()
        assert reply is not None
        if self.recorded:
            expected = (ReplyState.SENT, None, 1)
        elif self.claimed:
            expected = (ReplyState.SENDING, "d-dead", 1)
        else:
            expected = (ReplyState.PENDING, None, 0)
        assert (reply.state, reply.owner, reply.fence) == expected
        assert (world.receiver.receipt(REPLY) is not None) == self.received
        assert world.effects() == (1 if self.received else 0)

    def retry(self, world: World) -> None:
        if self.recorded:
            assert world.dispatch() == [], "a sent reply is not delivered again"
            return
        if self.claimed:
            assert world.dispatch() == [], "the dead dispatcher's lease holds the reply"
            reply = world.reply()
            assert reply is not None and reply.lease_until is not None
            world.clock.set(reply.lease_until)
        assert world.dispatch() == [Outcome.delivered(duplicate=self.received)]
        reply = world.reply()
        assert reply is not None
        assert (reply.reply_id, reply.fence) == (REPLY, 2 if self.claimed else 1)


class Requeue(CommitCrash):
    """An operator's requeue of a dead reply dies; the decision is recorded once or not at all."""

    def setup(self, world: World) -> None:
        world.receive()
        world.work(owner="w-1")
        assert world.store.dispatch(Refusing()).dead == 1

    def steps(self, world: World) -> Sequence[Call]:
        return [call("requeue", reply_id=REPLY, operator="ops", reason="receiver fixed")]

    def left_nothing(self, world: World) -> None:
        reply = world.reply()
        assert reply is not None and reply.state == ReplyState.DEAD
        assert world.store.requeues(REPLY) == []

    def left_everything(self, world: World) -> None:
        reply = world.reply()
        assert reply is not None and (reply.state, reply.attempts) == (ReplyState.PENDING, 0)
        assert [r.operator for r in world.store.requeues(REPLY)] == ["ops"]

    def retry(self, world: World) -> None:
        if self.committed:
            with pytest.raises(Fenced, match="only a dead reply"):
                world.store.requeue_reply(REPLY, operator="ops", reason="receiver fixed")
        else:
            world.store.requeue_reply(REPLY, operator="ops", reason="receiver fixed")
        assert len(world.store.requeues(REPLY)) == 1
        assert world.dispatch() == [Outcome.delivered()]


# -- housekeeping -----------------------------------------------------------------------------


class Prune(CommitCrash):
    """The pruner dies forgetting a finished, delivered message past retention."""

    def setup(self, world: World) -> None:
        world.receive()
        world.work(owner="w-1")
        world.dispatch()
        world.clock.set(START + world.store.retention + 1)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("prune")]

    def left_nothing(self, world: World) -> None:
        reply = world.reply()
        assert world.task().state == TaskState.DONE
        assert reply is not None and reply.state == ReplyState.SENT

    def left_everything(self, world: World) -> None:
        with pytest.raises(NotFound):
            world.task()
        assert world.reply() is None

    def retry(self, world: World) -> None:
        assert world.store.prune() == (0 if self.committed else 1)

    def converged(self, world: World) -> None:
        assert world.store.info()["tasks"] == {}
        assert world.effects() == 1 and world.receiver.effects_total() == 1


class ShortenRetention(CommitCrash):
    """An operator's process dies publishing a shorter retention period."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("publish_retention", seconds=60.0)]

    def left_nothing(self, world: World) -> None:
        assert world.store.retention == DEFAULT_RETENTION
        assert world.store.info()["earlier_retention_honoured"] is None

    def left_everything(self, world: World) -> None:
        assert world.store.retention == 60.0
        # m-1 came under a week's promise, and keeps it
        assert world.store.info()["earlier_retention_honoured"] == {
            "seconds": DEFAULT_RETENTION, "until": START + DEFAULT_RETENTION + FLOOR_MARGIN}

    def retry(self, world: World) -> None:
        previous = world.store.publish_retention(60.0)
        assert previous == (60.0 if self.committed else DEFAULT_RETENTION)
        world.work()
        world.dispatch()


class FirstPublication(CommitCrash):
    """The first process to open an upgraded store dies publishing its retention period."""

    opens = False

    def setup(self, world: World) -> None:
        older = Database(dialect_for_url(world.store_url))
        try:
            older.migrate("store", target=3)  # before stores published anything
        finally:
            older.close()

    def steps(self, world: World) -> Sequence[Call]:
        return [call("open", store=world.store_url)]

    def left_nothing(self, world: World) -> None:
        assert inspect_store(world.store_url)["retention_seconds"] is None

    def left_everything(self, world: World) -> None:
        assert inspect_store(world.store_url)["retention_seconds"] == DEFAULT_RETENTION

    def retry(self, world: World) -> None:
        assert world.store.retention == DEFAULT_RETENTION
        world.receive()
        world.work()
        world.dispatch()


class Migrate(CommitCrash):
    """The first process to open a new database dies creating its schema."""

    opens = False

    def setup(self, world: World) -> None:
        pass  # a new, empty database

    def steps(self, world: World) -> Sequence[Call]:
        return [call("open", store=world.store_url)]

    def left_nothing(self, world: World) -> None:
        assert [v.check for v in audit_url(world.store_url)] == ["schema"]

    def left_everything(self, world: World) -> None:
        assert audit_url(world.store_url) == []

    def retry(self, world: World) -> None:
        # reopening succeeded and brought the schema to its newest version
        assert world.store.info()["schema_version"] == latest_schema(world.store)
        world.receive()
        world.work()
        world.dispatch()


#: Crashes at a later commit of a call that makes many (a bulk call): the scenario's ``skip``
#: says how many commits of the point it passes first. Keyed by the point and the call.
BULK_CRASHES: dict[tuple[str, str], Crash] = {
    (f"retry.{when}_commit", "retry_many"): RetryMany(committed=when == "after")
    for when in ("before", "after")}

CRASHES: dict[str, Crash] = {
    **commits("receive", Receive),
    **commits("receive_atomic", ReceiveAtomic),
    **commits("claim", Claim),
    **commits("renew", Renew),
    **commits("finish", Finish),
    **commits("fail", Fail),
    **commits("settle", Settle),
    **commits("renew_all", RenewAll),
    **commits("release", Release),
    **commits("cancel", Cancel),
    **commits("retry", Retry),
    **commits("queue.pause", Pause),
    **commits("queue.resume", ResumeQueue),
    **commits("queue.limit", Limit),
    **commits("sweep", Sweep),
    **commits("grant_approval", Grant),
    **commits("revoke_approval", Revoke),
    **commits("answer_approval", Answer),
    **commits("requeue", Requeue),
    **commits("prune", Prune),
    **commits("publish", FirstPublication),
    **commits("retention", ShortenRetention),
    **commits("migrate", Migrate),
    # One delivery crosses three commits: the claim, the receiver's, the recording.
    "dispatch.claim.before_commit": Delivery(claimed=False, received=False, recorded=False),
    "dispatch.claim.after_commit": Delivery(claimed=True, received=False, recorded=False),
    "delivery.before_remote_commit": Delivery(claimed=True, received=False, recorded=False),
    "receiver.accept.before_commit": Delivery(claimed=True, received=False, recorded=False),
    "receiver.accept.after_commit": Delivery(claimed=True, received=True, recorded=False),
    "delivery.after_remote_commit": Delivery(claimed=True, received=True, recorded=False),
    "dispatch.record.before_commit": Delivery(claimed=True, received=True, recorded=False),
    "dispatch.record.after_commit": Delivery(claimed=True, received=True, recorded=True),
}
