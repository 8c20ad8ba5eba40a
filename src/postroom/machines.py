"""The state machines of tasks, replies and waits, as data.

Each table lists every transition the code applies, once, as ``(source, event, target)``
rows; a ``source`` of ``None`` is a record created in ``target``. The decisions in
``postroom.transitions`` and the guarded statements in ``db/sql`` make the moves, and
``tests/unit/test_machines.py`` holds them to these tables both ways: every move the code
makes is a row here, and every row is a move the code makes. Terminal states are the ones
with no way out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from postroom.models import ReplyState, TaskState, WaitState

__all__ = [
    "MACHINES",
    "REPLY_MACHINE",
    "REPLY_TRANSITIONS",
    "TASK_MACHINE",
    "TASK_TRANSITIONS",
    "WAIT_MACHINE",
    "WAIT_TRANSITIONS",
    "Machine",
    "Transition",
]

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Transition(Generic[S]):
    """One move: ``event`` takes a record from ``source`` (``None``: it is created) to
    ``target``."""

    source: S | None
    event: str
    target: S


#: SPEC §2, §3. "fail, final" is a failure that is not retryable or came on the last attempt.
TASK_TRANSITIONS: tuple[Transition[TaskState], ...] = (
    Transition(None, "received", TaskState.PENDING),
    Transition(None, "received past deadline", TaskState.EXPIRED),
    Transition(None, "received at hop limit", TaskState.HOP_LIMIT),
    Transition(TaskState.PENDING, "claim", TaskState.RUNNING),
    Transition(TaskState.RUNNING, "finish", TaskState.DONE),
    Transition(TaskState.RUNNING, "fail, retryable", TaskState.PENDING),
    Transition(TaskState.RUNNING, "fail, final", TaskState.FAILED),
    Transition(TaskState.RUNNING, "release", TaskState.PENDING),  # the attempt is given back
    Transition(TaskState.RUNNING, "lease expired", TaskState.PENDING),
    Transition(TaskState.RUNNING, "lease expired, attempts exhausted", TaskState.FAILED),
    Transition(TaskState.PENDING, "deadline passed", TaskState.EXPIRED),
    Transition(TaskState.RUNNING, "deadline passed", TaskState.EXPIRED),
    Transition(TaskState.PENDING, "cancel", TaskState.CANCELLED),
    Transition(TaskState.RUNNING, "cancel", TaskState.CANCELLED),
)

#: SPEC §4. A reply is created with its task's terminal state; ``dead`` waits for an operator.
REPLY_TRANSITIONS: tuple[Transition[ReplyState], ...] = (
    Transition(None, "created", ReplyState.PENDING),
    Transition(ReplyState.PENDING, "claim", ReplyState.SENDING),
    Transition(ReplyState.SENDING, "delivered", ReplyState.SENT),
    Transition(ReplyState.SENDING, "transient failure", ReplyState.PENDING),
    Transition(ReplyState.SENDING, "transient failure, budget spent", ReplyState.DEAD),
    Transition(ReplyState.SENDING, "collision", ReplyState.DEAD),
    Transition(ReplyState.SENDING, "permanent failure", ReplyState.DEAD),
    Transition(ReplyState.SENDING, "publisher lease expired", ReplyState.PENDING),
    Transition(ReplyState.SENDING, "publisher lease expired, budget spent", ReplyState.DEAD),
    Transition(ReplyState.DEAD, "operator requeue", ReplyState.PENDING),
)

#: SPEC §5: one generation of a wait. Every ending writes its continuation with it.
WAIT_TRANSITIONS: tuple[Transition[WaitState], ...] = (
    Transition(None, "open", WaitState.WAITING),
    Transition(WaitState.WAITING, "signal accepted", WaitState.SIGNALED),
    Transition(WaitState.WAITING, "signal too late", WaitState.TIMED_OUT),
    Transition(WaitState.WAITING, "expire", WaitState.TIMED_OUT),
    Transition(WaitState.WAITING, "sweep", WaitState.TIMED_OUT),
)


@dataclass(frozen=True, slots=True)
class Machine(Generic[S]):
    """A state enum and its table of transitions, under a name."""

    name: str
    states: type[S]
    transitions: tuple[Transition[S], ...]

    def initial(self) -> tuple[S, ...]:
        """The states a record is created in, in the enum's order."""
        born = {row.target for row in self.transitions if row.source is None}
        return tuple(state for state in self.states if state in born)

    def terminal(self) -> tuple[S, ...]:
        """The states the table leads to and has no transition out of, in the enum's order."""
        left = {row.source for row in self.transitions}
        reached = {row.target for row in self.transitions}
        return tuple(state for state in self.states if state in reached - left)


TASK_MACHINE = Machine("task", TaskState, TASK_TRANSITIONS)
REPLY_MACHINE = Machine("reply", ReplyState, REPLY_TRANSITIONS)
WAIT_MACHINE = Machine("wait", WaitState, WAIT_TRANSITIONS)

#: The machines by name.
MACHINES: Mapping[str, Machine[TaskState] | Machine[ReplyState] | Machine[WaitState]] = {
    machine.name: machine for machine in (TASK_MACHINE, REPLY_MACHINE, WAIT_MACHINE)}
