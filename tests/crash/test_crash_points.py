"""SPEC §9: a real process is killed at every registered fault point, and the system recovers.

For each point, from ``faults.registered()`` (so a new point is covered, or fails loudly here):
a child process arms the point with ``faults.crash(CODE)`` and runs the operation; the child
must die with exactly ``CODE`` (the point was reached). The parent then reopens the databases,
checks what the crash left (nothing before the commit, everything after), audits both
databases, retries as the real caller would, and checks that the pipeline converged: task
terminal, reply sent, exactly one receiver effect. The scenarios are in ``scenarios.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

import postroom  # noqa: F401 - importing postroom registers every module's fault points
from postroom import faults
from tests.crash.endpoint_scenarios import ENDPOINT_CRASHES
from tests.crash.principal_scenarios import PRINCIPAL_CRASHES
from tests.crash.scenarios import BULK_CRASHES, Call, Crash
from tests.crash.scenarios import CRASHES as TASK_CRASHES
from tests.crash.schedule_scenarios import SCHEDULE_CRASHES
from tests.crash.wait_scenarios import WAIT_CRASHES
from tests.crash.world import World
from tests.harness.children import Child
from tests.support import START

#: The exit code of a crashed child; no other way out of a child produces it.
CODE = 86

POINTS = [p.name for p in faults.registered()]
CRASHES: dict[str, Crash] = {**TASK_CRASHES, **WAIT_CRASHES, **ENDPOINT_CRASHES,
                             **SCHEDULE_CRASHES, **PRINCIPAL_CRASHES}


def crash_child(world: World, crash: Crash, point: str) -> None:
    """Run the scenario's steps in a child; the last one, with ``point`` armed, must kill it."""
    *before, last = crash.steps(world)
    urls = {"store": world.store_url, "receiver": world.receiver_url} if crash.opens else {}
    with Child(name=f"crash@{point}", now=world.clock.now(), **urls) as child:
        child.ready()
        for step in before:
            world.answers[step.name] = child.call(step.name, now=moment(world, step),
                                                  **step.args)
        child.call("arm", point=point, code=CODE, skip=getattr(crash, "skip", 0))
        child.go(last.name, now=moment(world, last), **last.args)
        code = child.exit_code()
        assert code == CODE, (f"{point} was not reached: {last.name!r} answered "
                              f"{child.unanswered()} and the child exited {code}\n"
                              f"{child.stderr()}")


def moment(world: World, step: Call) -> float:
    """The time ``step`` runs at; parent and child share it."""
    if step.at is not None:
        world.clock.set(START + step.at)
    return world.clock.now()


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_the_point_leaves_all_or_nothing_and_the_retry_converges(point, make_url):
    crash = CRASHES.get(point)
    if crash is None:
        pytest.fail(f"fault point {point!r} has no crash scenario: add it to CRASHES in "
                    f"tests/crash/scenarios.py (WAIT_CRASHES in wait_scenarios.py for waits, "
                    f"ENDPOINT_CRASHES in endpoint_scenarios.py for endpoints)")
    crash_and_converge(crash, point, make_url)


@pytest.mark.parametrize(("point", "call"), list(BULK_CRASHES))
def test_a_crash_at_a_later_commit_of_a_bulk_call_keeps_the_earlier_ones_and_converges(
        point, call, make_url):
    crash_and_converge(BULK_CRASHES[point, call], point, make_url)


def crash_and_converge(crash: Crash, point: str, make_url: Any) -> None:
    """Set up, crash a child at ``point``, check, audit, retry, check convergence, audit."""
    world = World(make_url("store"), make_url("receiver"))
    try:
        crash.setup(world)
        world.restart()
        crash_child(world, crash, point)
        crash.check(world)
        world.reopen()
        world.audit()
        crash.retry(world)
        crash.converged(world)
        world.audit()
    finally:
        world.restart()


def test_every_scenario_names_a_registered_point():
    assert sorted(set(CRASHES) - set(POINTS)) == []
    assert sorted({point for point, _ in BULK_CRASHES} - set(POINTS)) == []
