"""The crash table of periodic schedules (SPEC §9), run by ``test_crash_points``.

An operator's change (add, pause, resume, remove) is one transaction: the child dies inside
it, the reopened store shows all of it or none, and the operator's retry converges; task
``m-1`` then runs as usual. A round dies enqueueing a period: the period's task and the
schedule's next period commit together, so after the crash there is either both or neither,
and the next round (any host's) enqueues the period exactly once; its task then runs to its
reply.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import postroom
from postroom import TaskState
from postroom.schedules import period_key
from postroom.validation import task_id_for
from tests.crash.scenarios import Call, CommitCrash, call, commits
from tests.crash.world import World
from tests.support import START

HOUR = 3600.0
#: The hourly schedule's first period: the first whole hour after START.
FIRST = START - START % HOUR + HOUR
NAME = "report"
#: The task of the first period.
PERIOD_TASK = task_id_for(f"schedule:{NAME}", period_key(FIRST))


def add(world: World) -> postroom.Periodic:
    return world.store.add_schedule(NAME, "0 * * * *", operator="op")


def run_m1(world: World) -> None:
    world.work()
    world.dispatch()


class AddSchedule(CommitCrash):
    """The process dies adding a schedule; the operator adds it again."""

    def steps(self, world: World) -> Sequence[Call]:
        return [call("schedule_add", schedule=NAME)]

    def left_nothing(self, world: World) -> None:
        assert world.store.schedules() == []

    def left_everything(self, world: World) -> None:
        assert [s.name for s in world.store.schedules()] == [NAME]

    def retry(self, world: World) -> None:
        added = add(world)  # the same definition again: a no-op if it committed
        assert world.store.schedules() == [added]
        run_m1(world)


class PauseSchedule(CommitCrash):
    """The process dies pausing a schedule."""

    paused = True

    def setup(self, world: World) -> None:
        super().setup(world)
        add(world)
        if not self.paused:
            world.store.pause_schedule(NAME, operator="op")

    def steps(self, world: World) -> Sequence[Call]:
        return [call("schedule_pause" if self.paused else "schedule_resume", schedule=NAME)]

    def left_nothing(self, world: World) -> None:
        assert world.store.schedule(NAME).paused is not self.paused

    def left_everything(self, world: World) -> None:
        assert world.store.schedule(NAME).paused is self.paused

    def retry(self, world: World) -> None:
        change = world.store.pause_schedule if self.paused else world.store.resume_schedule
        assert change(NAME, operator="op") is not self.committed
        run_m1(world)


class ResumeSchedule(PauseSchedule):
    """The process dies resuming a paused schedule."""

    paused = False


class RemoveSchedule(CommitCrash):
    """The process dies removing a schedule."""

    def setup(self, world: World) -> None:
        super().setup(world)
        add(world)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("schedule_remove", schedule=NAME)]

    def left_nothing(self, world: World) -> None:
        assert world.store.schedule(NAME).name == NAME

    def left_everything(self, world: World) -> None:
        with pytest.raises(postroom.NotFound):
            world.store.schedule(NAME)

    def retry(self, world: World) -> None:
        assert world.store.remove_schedule(NAME) is not self.committed
        run_m1(world)


class EnqueuePeriod(CommitCrash):
    """A round dies enqueueing the first period; the next round is any host's."""

    def setup(self, world: World) -> None:
        add(world)
        world.expected.append(PERIOD_TASK)

    def steps(self, world: World) -> Sequence[Call]:
        return [call("schedule_round", at=FIRST - START + 5)]

    def left_nothing(self, world: World) -> None:
        assert world.store.info()["tasks"] == {}
        assert world.store.schedule(NAME).next_at == FIRST

    def left_everything(self, world: World) -> None:
        assert world.store.task(PERIOD_TASK).state == TaskState.PENDING
        assert world.store.schedule(NAME).next_at == FIRST + HOUR

    def retry(self, world: World) -> None:
        acks = world.store.enqueue_due_schedules()
        assert [ack.task_id for ack in acks] == ([] if self.committed else [PERIOD_TASK])
        assert world.store.enqueue_due_schedules() == []
        assert world.store.info()["tasks"] == {"pending": 1}
        world.work()
        world.dispatch()


SCHEDULE_CRASHES = {
    **commits("schedule.add", AddSchedule),
    **commits("schedule.pause", PauseSchedule),
    **commits("schedule.resume", ResumeSchedule),
    **commits("schedule.remove", RemoveSchedule),
    **commits("schedule.enqueue", EnqueuePeriod),
}
