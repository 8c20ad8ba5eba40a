"""SPEC §9 for periodic schedules: seeds of schedule operations mixed with the task pipeline,
crashes and clock moves keep every invariant, reach both missed policies' paths, and a
planted bug in a period's identity is reported."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from postroom import schedules
from tests.harness.simulation import run_seed
from tests.harness.simulation.operations import OPERATIONS
from tests.harness.simulation.schedules import PERIODS_PASS, SCHEDULE_OPERATIONS

#: The pipeline around the schedules' tasks: work them, deliver them, move the clock.
AROUND = ("claim", "finish", "fail", "sweep", "dispatch", "prune", "clock_back", "restart")
#: Time passes by periods as often as rounds run, so rounds both keep up and find outages,
#: and schedules are added often enough that each policy meets an outage.
MIX = [*(replace(op, weight=4) if op.name == "schedule_add" else op
         for op in SCHEDULE_OPERATIONS), PERIODS_PASS,
       *(op for op in OPERATIONS if op.name in AROUND)]
SEEDS = (2, 3)
OPS = 150


def test_seeds_of_schedule_operations_keep_every_invariant_and_reach_both_policies(make_url):
    results = [run_seed(seed, OPS, make_url, operations=MIX, crash_rate=0.25)
               for seed in SEEDS]
    assert [r.violation for r in results] == [None] * len(SEEDS)
    outcomes = sum((r.outcomes for r in results), start=Counter[str]())
    for reached in ("schedule_round:enqueued", "schedule_round:skipped",
                    "schedule_add:added", "schedule_add:same", "schedule_add:refused",
                    "schedule_pause:changed", "schedule_resume:changed", "finish:done"):
        assert outcomes[reached] > 0, reached
    crashed = sum((r.crashes for r in results), start=Counter[str]())
    assert any(point.startswith("schedule.enqueue") for point in crashed), crashed


def test_a_period_stored_under_another_identity_is_reported(make_url, monkeypatch):
    monkeypatch.setattr(schedules, "period_key", lambda period: f"at-{period}")
    for seed in SEEDS:
        violation = run_seed(seed, OPS, make_url, operations=MIX).violation
        if violation is not None:
            break
    assert violation is not None, "the planted bug went unnoticed"
    assert violation.operation == "schedule_round"
    assert any("schedule_task_identity" in problem for problem in violation.problems)
