"""The crash table of the wait operations (SPEC §5, §9), run by ``test_crash_points``.

Every entry plays one durable flow: task ``m-1`` asks a question (opens the wait with
``task_id`` = ``m-1``), the answer is signaled (or the deadline passes), the continuation is
resumed with a follow-up task, and both tasks are worked and their replies delivered. A real
child process dies inside one of those operations; the parent reopens, checks that the crash
left nothing (before the commit, or at any seam inside the transaction) or everything (after
it), retries the operation as its caller would, and finishes the flow. Converged: the wait
ended once with one continuation, consumed, and exactly one follow-up; both tasks terminal,
their replies sent, one receiver effect each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import postroom
from postroom import ExpireResult, OpenResult, ResumeResult, SignalResult, WaitState
from postroom.validation import task_id_for
from postroom.waits import WaitAddress, follow_up_namespace
from tests.crash.scenarios import Call, CommitCrash, call, commits
from tests.crash.world import World, task_id
from tests.support import START

TASK = task_id("m-1")
FLOW, STEP = "refund-m-1", "approval"
OPEN: dict[str, Any] = {"flow": FLOW, "step": STEP, "expected_generation": 0,
                        "deadline": START + 10, "request_id": "ask-1", "task_id": TASK}
ANSWER: dict[str, Any] = {"event_id": "mail-1", "flow": FLOW, "step": STEP, "generation": 1,
                          "value": {"approve": True}}
ALICE = postroom.AuthContext(principal="alice")
NEXT = {"message_id": "next", "payload": {"after": "the answer"}}
RESUME: dict[str, Any] = {"flow": FLOW, "step": STEP, "generation": 1}
FOLLOW_UP = task_id_for(follow_up_namespace(WaitAddress(FLOW, STEP, 1)), "next")


def ask(world: World) -> postroom.WaitOpening:
    """Task m-1 asks its question."""
    return world.store.open_wait(**OPEN)


def answer(world: World) -> postroom.SignalReceipt:
    """Alice answers at +3 s."""
    world.clock.set(START + 3)
    return world.store.signal(ALICE, **ANSWER)


def resume(world: World) -> postroom.Resumption:
    """The flow continues: the follow-up task must converge too."""
    world.expected.append(FOLLOW_UP)
    return world.store.resume(**RESUME, effect=postroom.FollowUp(**NEXT))


def finish_both(world: World) -> None:
    """Work the asking task and the follow-up, then deliver both replies."""
    world.work()
    world.work()
    world.dispatch()


class WaitCrash(CommitCrash):
    """A crash inside one wait operation of the flow."""

    #: How the wait ends in this flow.
    ends = WaitState.SIGNALED

    def converged(self, world: World) -> None:
        wait = world.store.wait(FLOW, STEP)
        assert (wait.generation, wait.state) == (1, self.ends)
        assert world.store.continuations() == []
        follow_up = world.store.task(FOLLOW_UP)
        assert (follow_up.parent_task_id, follow_up.hops) == (TASK, 1)
        world.assert_converged()


class OpenWait(WaitCrash):
    """The asking process dies registering the question; it retries with its request id."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("open_wait", **OPEN)]

    def left_nothing(self, world: World) -> None:
        assert world.store.info()["waits"] == {}

    def left_everything(self, world: World) -> None:
        wait = world.store.wait(FLOW, STEP)
        assert (wait.generation, wait.state, wait.task_id) == (1, WaitState.WAITING, TASK)

    def retry(self, world: World) -> None:
        opening = ask(world)
        assert (opening.result, opening.generation, opening.replay) == (
            OpenResult.OPENED, 1, self.committed)
        assert answer(world).result is SignalResult.ACCEPTED
        assert resume(world).result is ResumeResult.RESUMED
        finish_both(world)


class Signal(WaitCrash):
    """The process receiving the answer dies; the sender, never ACKed, sends it again."""

    def setup(self, world: World) -> None:
        super().setup(world)
        ask(world)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("signal", at=3, principal=ALICE.principal, **ANSWER)]

    def left_nothing(self, world: World) -> None:
        assert world.store.wait(FLOW, STEP).state is WaitState.WAITING
        assert world.store.continuations() == []

    def left_everything(self, world: World) -> None:
        wait = world.store.wait(FLOW, STEP)
        assert (wait.state, wait.event_principal, wait.event_id) == (
            WaitState.SIGNALED, "alice", "mail-1")
        [continuation] = world.store.continuations()
        assert continuation.value == {"approve": True}

    def retry(self, world: World) -> None:
        receipt = answer(world)
        assert (receipt.result, receipt.recorded) == (
            SignalResult.REPLAY if self.committed else SignalResult.ACCEPTED,
            SignalResult.ACCEPTED)
        assert resume(world).result is ResumeResult.RESUMED
        finish_both(world)


class Expire(WaitCrash):
    """Nobody answers; the process timing the wait out at its deadline dies and retries."""

    ends = WaitState.TIMED_OUT

    def setup(self, world: World) -> None:
        super().setup(world)
        ask(world)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("expire", at=10, flow=FLOW, step=STEP, generation=1)]

    def left_nothing(self, world: World) -> None:
        assert world.store.wait(FLOW, STEP).state is WaitState.WAITING
        assert world.store.continuations() == []

    def left_everything(self, world: World) -> None:
        assert world.store.wait(FLOW, STEP).state is WaitState.TIMED_OUT
        assert [c.kind for c in world.store.continuations()] == ["timeout"]

    def time_out(self, world: World) -> None:
        assert world.store.expire(FLOW, STEP, 1) is (
            ExpireResult.CLOSED if self.committed else ExpireResult.TIMED_OUT)

    def retry(self, world: World) -> None:
        self.time_out(world)
        assert world.store.signal(ALICE, **ANSWER).result is SignalResult.CLOSED
        assert resume(world).result is ResumeResult.RESUMED
        finish_both(world)


class ExpireDue(Expire):
    """The same, for the sweeper of due waits."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("expire_due", at=10)]

    def time_out(self, world: World) -> None:
        assert world.store.expire_due() == (0 if self.committed else 1)


class Resume(WaitCrash):
    """The process resuming the flow dies; a restarted one finds the continuation or not."""

    def setup(self, world: World) -> None:
        super().setup(world)
        ask(world)
        answer(world)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("resume", effect=NEXT, **RESUME)]

    def left_nothing(self, world: World) -> None:
        assert len(world.store.continuations()) == 1
        with pytest.raises(postroom.NotFound):
            world.store.task(FOLLOW_UP)

    def left_everything(self, world: World) -> None:
        assert world.store.continuations() == []
        assert world.store.task(FOLLOW_UP).state is postroom.TaskState.PENDING

    def retry(self, world: World) -> None:
        resumed = resume(world)
        assert (resumed.result, resumed.task_id) == (
            ResumeResult.REPLAY if self.committed else ResumeResult.RESUMED, FOLLOW_UP)
        finish_both(world)


#: A crash at a seam inside a transaction leaves what a crash before its commit leaves.
WAIT_CRASHES = {
    **commits("open_wait", OpenWait),
    "open_wait.after_wait_insert": OpenWait(committed=False),
    **commits("signal", Signal),
    "signal.after_receipt_insert": Signal(committed=False),
    "signal.after_terminal_update": Signal(committed=False),
    **commits("expire", Expire),
    "expire.after_terminal_update": Expire(committed=False),
    **commits("expire_due", ExpireDue),
    "expire_due.after_terminal_update": ExpireDue(committed=False),
    **commits("resume", Resume),
    "resume.after_consume": Resume(committed=False),
    "resume.after_follow_up_insert": Resume(committed=False),
}
