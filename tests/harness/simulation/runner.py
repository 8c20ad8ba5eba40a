"""Run one seed: N weighted operations on a fresh store and receiver, checked after each.

Some steps run with a crash armed: every fault point is armed with one counting action that
raises ``SimulatedCrash`` at a random hit, so the operation dies before or after one of its
commits (or inside the receiver, or with a reply in flight). The world then restarts (both
databases closed and reopened), is checked, and the original operation is retried, as a
client whose call died would retry it. The first problem stops the seed with a
``Violation`` naming the seed, step and operation, so the run can be reproduced.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from postroom import faults
from tests.harness.simulation.checks import (
    CHECKS,
    Check,
    Transition,
    audit_problems,
    check_transition,
)
from tests.harness.simulation.operations import OPERATIONS, Action, Broken, Operation, Step
from tests.harness.simulation.world import Snapshot, UrlFactory, World
from tests.support import database_of

__all__ = ["SeedResult", "SimulatedCrash", "Violation", "run_seed"]

#: Share of steps that run with a crash armed.
CRASH_RATE = 0.08
#: A crash fires at a hit in 1..this (an operation passes two points per commit).
_CRASH_HITS = 6


class SimulatedCrash(BaseException):
    """The process 'died' at a fault point.

    A ``BaseException``, like ``SystemExit``, so that no ``except Exception`` on the way out
    (a transport's error handling, for instance) can mistake it for a failure to record.
    """


class _CrashAt:
    """A fault action that raises ``SimulatedCrash`` at its ``at``-th hit, whichever point."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.hits = 0
        self.fired: str | None = None

    def __call__(self, name: str) -> None:
        self.hits += 1
        if self.hits == self.at:
            self.fired = name
            raise SimulatedCrash(name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """The first problem of a seed: where it happened and how to see it again."""

    seed: int
    step: int
    operation: str
    crash: str | None
    problems: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, with the command that reproduces it."""
        return {"seed": self.seed, "step": self.step, "operation": self.operation,
                "crash": self.crash, "problems": list(self.problems),
                "reproduce": f"postroom random-audit --seeds 1 --first-seed {self.seed} "
                             f"--ops {self.step + 1} --rounds 0 --wait-rounds 0"}


@dataclass(kw_only=True, slots=True)
class SeedResult:
    """What one seed ran and found."""

    seed: int
    steps: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    violation: Violation | None = None


def run_seed(seed: int, ops: int, urls: UrlFactory, *,
             operations: Sequence[Operation] = OPERATIONS, checks: list[Check] = CHECKS,
             crash_rate: float = CRASH_RATE,
             on_step: Callable[[], None] | None = None) -> SeedResult:
    """Run ``ops`` operations for ``seed``; stop at the first violation."""
    result = SeedResult(seed=seed)
    world = World(seed, urls)
    weights = [operation.weight for operation in operations]
    try:
        for index in range(ops):
            operation, action = _choose(world, operations, weights)
            crash = (_CrashAt(world.rng.randint(1, _CRASH_HITS))
                     if world.rng.random() < crash_rate else None)
            problems = _run_step(world, operation, action, crash=crash, checks=checks,
                                 result=result)
            result.steps = index + 1
            result.operations[operation.name] += 1
            if problems:
                result.violation = Violation(
                    seed=seed, step=index, operation=operation.name,
                    crash=crash.fired if crash is not None else None,
                    problems=tuple(problems))
                break
            if on_step is not None:
                on_step()
    finally:
        faults.disarm_all()
        world.close()
    result.restarts = world.restarts
    return result


def _choose(world: World, operations: Sequence[Operation], weights: list[float]
            ) -> tuple[Operation, Action]:
    while True:  # some plans cannot run yet (nothing to finish); receiving always can
        operation = world.rng.choices(operations, weights)[0]
        action = operation.plan(world)
        if action is not None:
            return operation, action


def _run_step(world: World, operation: Operation, action: Action, *, crash: _CrashAt | None,
              checks: list[Check], result: SeedResult) -> list[str]:
    step = Step(world, world.last)
    problems, outcome = _attempt(step, operation, action, crash)
    if problems:  # name everything else that is wrong now, too
        return problems + _observe(world, step.before, world.snapshot(), operation, checks)
    if crash is not None and crash.fired is not None:
        result.crashes[crash.fired] += 1
        world.restart()
        problems = _observe(world, step.before, world.snapshot(), operation, checks)
        if problems:
            return [f"after a crash at {crash.fired} and a restart: {p}" for p in problems]
        step = Step(world, world.last)  # the retry decides on what is there now
        problems, outcome = _attempt(step, operation, action, None)
        if problems:
            problems += _observe(world, step.before, world.snapshot(), operation, checks)
            return [f"retry after a crash at {crash.fired}: {p}" for p in problems]
    result.outcomes[f"{operation.name}:{outcome}"] += 1
    return _observe(world, step.before, step.after(), operation, checks)


def _attempt(step: Step, operation: Operation, action: Action, crash: _CrashAt | None
             ) -> tuple[list[str], str]:
    with ExitStack() as armed:
        if crash is not None:
            for point in faults.registered():
                armed.enter_context(faults.armed(point.name, crash, times=None))
        try:
            outcome = action(step)
        except SimulatedCrash:
            return [], "crashed"
        except Broken as exc:
            return [f"{operation.name}: {exc}"], "broken"
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return [f"{operation.name}: unexpected {type(exc).__name__}: {exc} "
                    f"(at {where.filename}:{where.lineno})"], "error"
    if crash is not None and crash.fired is not None:
        return [f"{operation.name}: the crash at {crash.fired} was swallowed"], "error"
    return [], outcome


def _observe(world: World, before: Snapshot, after: Snapshot, operation: Operation,
             checks: list[Check]) -> list[str]:
    """Check the step; on success the world moves on from ``after``."""
    transition = Transition(forgets=operation.forgets, retention=world.store.retention,
                            acked=world.acked)
    problems = audit_problems(database_of(world.store), database_of(world.receiver))
    problems += check_transition(before, after, transition, checks)
    if operation.forgets:
        world.acked -= before.tasks.keys() - after.tasks.keys()
    world.last = after
    return problems
