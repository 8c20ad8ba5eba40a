"""SPEC §5, §8, §9: waits in the randomized audit, short, and proof their checks are not vacuous.

The full run is ``postroom random-audit`` (50 seeds x 500 mixed operations, then 40 wait rounds
of 12 processes). Here a few seeds weighted towards waits must reach every wait outcome and
come out clean, two small wait rounds must each have exactly one winner per contest, and each
planted wait bug must be reported by the random audit as it runs from the CLI.
"""

from __future__ import annotations

import os
import textwrap
from collections import Counter

from postroom import transitions, waits
from postroom.models import ContinuationKind, SignalResult
from tests.harness.simulation import run_seed, run_wait_rounds
from tests.harness.simulation.operations import OPERATIONS
from tests.harness.simulation.waits import WAIT_OPERATIONS
from tests.simulation.test_random_audit import SEEDS, first_violation

OPS = 200
#: The wait operations with the receiving, clock and restart moves they need around them.
MOSTLY_WAITS = WAIT_OPERATIONS + [operation for operation in OPERATIONS if operation.name in (
    "receive", "clock_forward", "clock_back", "restart")]


def test_a_few_seeds_of_wait_operations_reach_every_outcome_and_keep_every_invariant(
        make_url):
    results = [run_seed(seed, OPS, make_url, operations=MOSTLY_WAITS) for seed in SEEDS]
    assert [r.violation for r in results] == [None] * len(SEEDS)
    outcomes = sum((r.outcomes for r in results), start=Counter[str]())
    for reached in ("open_wait:opened", "open_wait:busy", "open_wait:pending_continuation",
                    "open_wait_retry:replay", "open_wait_retry:collision",
                    "open_wait_stale:stale", "signal:accepted", "signal:closed",
                    "signal_at_deadline:too_late", "signal_at_deadline:accepted",
                    "signal_early:unknown_wait", "signal_stale:stale_generation",
                    "signal_replay:replay:unknown_wait:opened_since",
                    "signal_conflict:conflict", "expire:timed_out", "expire:not_due",
                    "expire_due:timed_out", "resume:resumed", "resume_replay:replay",
                    "recover:resumed"):
        assert outcomes[reached] > 0, reached
    # The runner arms every registered fault point, the wait operations' seams included.
    crashes = sum((r.crashes for r in results), start=Counter[str]())
    assert {point.split(".")[0] for point in crashes} >= {"open_wait", "signal", "resume"}
    assert any(point.endswith(("_insert", "_update", "_consume")) for point in crashes)


def test_two_small_wait_rounds_have_exactly_one_winner_per_contest(make_url):
    result = run_wait_rounds(2, 4, make_url, seed=5, kill_rate=0.25)
    assert result.violations == []
    assert (result.rounds, result.processes) == (2, 8)
    contests = Counter[str]()
    for outcome, rounds in result.winners.items():
        contests[outcome.split(":")[0]] += rounds
    assert contests == {"open": 2, "signals": 2, "deadline": 2, "resume": 2}
    assert result.operations > 0


def test_an_accepted_signal_that_writes_no_continuation_is_reported(make_url, monkeypatch):
    original = waits._end

    def without_signal_continuation(tx, address, end, *, point, value, event):
        if end.continuation is not ContinuationKind.SIGNAL:
            return original(tx, address, end, point=point, value=value, event=event)
        tx.one("wait_end", to_state=end.to_state.value, event_principal=event[0],
               event_id=event[1], now=tx.now, flow=address.flow, step=address.step,
               generation=address.generation)
        return None

    monkeypatch.setattr(waits, "_end", without_signal_continuation)
    violation = first_violation(make_url, ops=400, operations=MOSTLY_WAITS)
    problems = " | ".join(violation.problems)
    assert "wait_continuations" in problems  # the operation's model
    assert "ended_wait_without_continuation" in problems  # the SPEC §8 audit
    assert "continuations_come_with_their_end" in problems  # the check between steps


def test_a_replay_that_moves_the_time_high_water_is_reported(make_url, monkeypatch):
    original = waits.signal

    def leaky(tx, request):
        receipt = original(tx, request)
        if receipt.result in (SignalResult.REPLAY, SignalResult.CONFLICT):
            tx.wrote = True  # as if the repeat had been recorded: the commit persists tx.now
        return receipt

    monkeypatch.setattr(waits, "signal", leaky)
    violation = first_violation(make_url, ops=400, operations=MOSTLY_WAITS)
    assert violation.operation.startswith("signal")
    assert any("time high-water is" in problem and "nothing written" in problem
               for problem in violation.problems)


def test_a_deadline_that_is_not_strict_is_reported(make_url, monkeypatch):
    original = transitions.signal_wait

    def lenient(*, now, deadline, **rest):
        at_deadline = deadline is not None and now == deadline
        return original(now=now - 1.0 if at_deadline else now, deadline=deadline, **rest)

    monkeypatch.setattr(transitions, "signal_wait", lenient)
    violation = first_violation(make_url, ops=400, operations=MOSTLY_WAITS)
    assert violation.operation == "signal_at_deadline"
    problems = " | ".join(violation.problems)
    assert "expected too_late" in problems
    assert "receipt_inconsistent_with_wait" in problems


def test_a_wait_round_reports_a_process_that_claims_a_resume_it_did_not_make(
        make_url, tmp_path, monkeypatch):
    # The bug lives in the round's own processes: each starts with this sitecustomize.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        from postroom import waits
        from postroom.models import ResumeResult

        _original = waits._resumption
        waits._resumption = lambda result, *rest: _original(ResumeResult.RESUMED, *rest)
    """), encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = run_wait_rounds(1, 4, make_url, seed=2, kill_rate=0.0)
    [violation] = result.violations
    assert any(problem.startswith("resume: resumed by") for problem in violation["problems"])
