"""The state machines of tasks, replies and waits, as data, and their drawings.

Each table lists every transition the code applies, once, as ``(source, event, target)``
rows; a ``source`` of ``None`` is a record created in ``target``. The decisions in
``postroom.transitions`` and the guarded statements in ``db/sql`` make the moves, and
``tests/unit/test_machines.py`` holds them to these tables both ways: every move the code
makes is a row here, and every row is a move the code makes. Terminal states are the ones
with no way out.

The README draws each table with ``mermaid``; redraw them after changing a table with::

    python -m postroom.machines README.md

(without a file it prints the drawings).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar

from postroom.models import ReplyState, TaskState, WaitState

__all__ = [
    "DRAWING",
    "MACHINES",
    "REPLY_MACHINE",
    "REPLY_TRANSITIONS",
    "TASK_MACHINE",
    "TASK_TRANSITIONS",
    "WAIT_MACHINE",
    "WAIT_TRANSITIONS",
    "AnyMachine",
    "Machine",
    "Transition",
    "drawing",
    "main",
    "redraw",
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
    Transition(None, "received past its chain's budget", TaskState.BUDGET_EXHAUSTED),
    Transition(None, "received into a cancelled chain", TaskState.CANCELLED),
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
    Transition(ReplyState.SENDING, "endpoint gone", ReplyState.DEAD),  # and it is disabled
    Transition(ReplyState.SENDING, "release", ReplyState.PENDING),  # the attempt is given back
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
    """A state enum and its table of transitions, under the name the README draws it by."""

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

    def mermaid(self) -> str:
        """The table as a Mermaid ``stateDiagram-v2``: the rows in table order, labelled by
        their events, then each terminal state's way to the end."""
        lines = ["stateDiagram-v2"]
        for row in self.transitions:
            source = "[*]" if row.source is None else row.source.value
            lines.append(f"    {source} --> {row.target.value} : {row.event}")
        lines.extend(f"    {state.value} --> [*]" for state in self.terminal())
        return "\n".join(lines) + "\n"


TASK_MACHINE = Machine("task", TaskState, TASK_TRANSITIONS)
REPLY_MACHINE = Machine("reply", ReplyState, REPLY_TRANSITIONS)
WAIT_MACHINE = Machine("wait", WaitState, WAIT_TRANSITIONS)

AnyMachine: TypeAlias = Machine[TaskState] | Machine[ReplyState] | Machine[WaitState]

#: The machines by the name a drawing's marker gives (``<!-- state machine: task -->``).
MACHINES: Mapping[str, AnyMachine] = {
    machine.name: machine for machine in (TASK_MACHINE, REPLY_MACHINE, WAIT_MACHINE)}

#: A drawing in Markdown: its marker line, then a ``mermaid`` fence right below it.
DRAWING = re.compile(r"^<!-- state machine: (?P<name>[a-z]+) -->\n```mermaid\n"
                     r"(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def drawing(machine: AnyMachine) -> str:
    """``machine``'s drawing in Markdown, as ``DRAWING`` finds it."""
    return f"<!-- state machine: {machine.name} -->\n```mermaid\n{machine.mermaid()}```"


def redraw(markdown: str) -> str:
    """``markdown`` with every drawing replaced by its machine's current one.

    Raises ``KeyError`` for a marker that names no machine.
    """
    return DRAWING.sub(lambda match: drawing(MACHINES[match.group("name")]), markdown)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m postroom.machines [FILE...]``: redraw the drawings in each Markdown FILE,
    or with no FILE print them all."""
    files = sys.argv[1:] if argv is None else list(argv)
    if not files:
        sys.stdout.write("\n\n".join(map(drawing, MACHINES.values())) + "\n")
        return 0
    for name in files:
        path = Path(name)
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            sys.stderr.write(f"{name}: {exc.strerror or exc}\n")
            return 2
        found = [match.group("name") for match in DRAWING.finditer(text)]
        unknown = sorted(set(found) - MACHINES.keys())
        if not found or unknown:
            sys.stderr.write(f"{name}: no machine named {', '.join(unknown)}\n" if unknown
                             else f"{name}: no <!-- state machine: NAME --> drawing\n")
            return 2
        stale = [match.group("name") for match in DRAWING.finditer(text)
                 if match.group("body") != MACHINES[match.group("name")].mermaid()]
        if stale:
            path.write_text(redraw(text), "utf-8")
        sys.stdout.write(f"{name}: redrew {', '.join(stale)}\n" if stale
                         else f"{name}: {', '.join(found)} already current\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
