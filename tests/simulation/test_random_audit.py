"""SPEC §9: the randomized audit, short enough for every run, and proof it is not vacuous.

The full run is ``postroom random-audit`` (defaults: 50 seeds x 500 operations, 40 rounds of
8 processes). Here a few seeds and two small rounds must come out clean, and each planted
bug (a rule that skips a write, a guard that forgets the fence, a clock that runs backwards,
a receiver that drops effects) must be reported with its seed, step and operation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

import postroom
from postroom import tasks
from postroom.db import dialect as dialect_module
from postroom.db.dialect import Dialect
from postroom.db.queries import QuerySet
from postroom.receiver import Receiver
from tests.harness.simulation import run_rounds, run_seed
from tests.harness.simulation.operations import OPERATIONS

SEEDS = (0, 1, 2)
OPS = 100


def test_a_few_seeds_of_mixed_operations_keep_every_invariant(make_url):
    results = [run_seed(seed, OPS, make_url) for seed in SEEDS]
    assert [r.violation for r in results] == [None] * len(SEEDS)
    assert sum(r.steps for r in results) == len(SEEDS) * OPS
    outcomes = sum((r.outcomes for r in results), start=Counter[str]())
    # The run reached the paths it exists for, not just the happy one.
    for reached in ("finish:done", "stale_worker:fenced", "receive_duplicate:duplicate",
                    "receive_collision:collision", "dispatch:delivered", "claim:claimed"):
        assert outcomes[reached] > 0, reached
    assert sum(sum(r.crashes.values()) for r in results) > 0
    assert sum(r.restarts for r in results) > 0


def test_two_small_rounds_of_processes_drain_to_one_effect_per_reply(make_url):
    result = run_rounds(2, 3, make_url, seed=7, ops=15, kill_rate=0.5)
    assert result.violations == []
    assert (result.rounds, result.processes) == (2, 6)
    assert result.operations > 0 and result.acked > 0


#: What makes claims stale and brings them back: a bug in the fences shows within a few
#: hundred of these (every one of seeds 0-5 within 450 operations), where the whole mix
#: needs thousands.
FENCE_OPERATIONS = [op for op in OPERATIONS if op.name in {
    "receive", "claim", "claim_batch", "renew", "finish", "fail", "stale_worker", "sweep",
    "clock_forward"}]


def first_violation(make_url, ops: int = 300, operations=OPERATIONS):
    for seed in SEEDS:
        result = run_seed(seed, ops, make_url, operations=operations)
        if result.violation is not None:
            return result.violation
    pytest.fail("the planted bug went unnoticed")
    raise AssertionError


def test_a_rule_that_skips_writing_the_reply_is_reported(make_url, monkeypatch):
    monkeypatch.setattr(tasks, "after", lambda tx, settings, row, decision: None)
    violation = first_violation(make_url)
    # The SPEC §8 snapshot audit names it, and so does a finishing operation's expectation
    # (a claim's sweep that fails a task on its last lease may meet it first).
    assert any("terminal_task_without_reply" in problem for problem in violation.problems)
    if violation.operation not in ("claim", "claim_batch", "sweep"):
        assert any("with reply None" in problem for problem in violation.problems)
    assert violation.to_dict()["reproduce"] == (
        f"postroom random-audit --seeds 1 --first-seed {violation.seed} "
        f"--ops {violation.step + 1} --rounds 0 --wait-rounds 0")


def test_a_reported_violation_reproduces_from_its_seed(make_url, monkeypatch):
    monkeypatch.setattr(tasks, "after", lambda tx, settings, row, decision: None)
    violation = first_violation(make_url)
    again = run_seed(violation.seed, violation.step + 1, make_url).violation
    assert again == violation


def test_a_guard_that_forgets_the_fence_is_reported(make_url, monkeypatch):
    def unfenced(fragments, convert):
        queries = dict(load_queries(fragments, convert))
        # As the dialect spells its parameters. An owner's decisions also require the claim's
        # attempt count, which a newer claim has raised like the fence: both must go.
        guards = {"task_apply_owned": ["AND fence = :fence", "AND attempts = :attempt"],
                  "task_renew": ["AND fence = :fence"]}
        for name, removed in guards.items():
            sql = queries[name].sql
            for guard in map(convert, removed):
                assert guard in sql
                sql = sql.replace(guard, "")
            queries[name] = replace(queries[name], sql=sql)
        return QuerySet(queries)

    load_queries = dialect_module.load_queries
    monkeypatch.setattr(dialect_module, "load_queries", unfenced)
    violation = first_violation(make_url, ops=500, operations=FENCE_OPERATIONS)
    assert any("stale claim" in problem for problem in violation.problems)


def rewrite_query(monkeypatch, name: str, old: str, new: str) -> None:
    """Plant a bug: query ``name`` with ``old`` (which it must hold) replaced by ``new``."""
    load_queries = dialect_module.load_queries

    def rewritten(fragments, convert):
        queries = dict(load_queries(fragments, convert))
        assert old in queries[name].sql
        queries[name] = replace(queries[name], sql=queries[name].sql.replace(old, new))
        return QuerySet(queries)

    monkeypatch.setattr(dialect_module, "load_queries", rewritten)


def test_a_claim_that_takes_no_slot_of_a_limited_queue_is_reported(make_url, monkeypatch):
    rewrite_query(monkeypatch, "claim_look",
                  "(SELECT running FROM queue_limits WHERE", "(SELECT NULL FROM queue_limits WHERE")
    violation = first_violation(make_url)
    # A claim past the limit takes a slot it does not have, or more than the free ones.
    assert any("holds no slot" in problem or "limited)" in problem
               for problem in violation.problems)


def test_a_claim_that_ignores_a_pause_is_reported(make_url, monkeypatch):
    rewrite_query(monkeypatch, "claim_look",
                  "(SELECT 1 FROM paused_queues WHERE", "(SELECT NULL FROM paused_queues WHERE")
    violation = first_violation(make_url)
    assert any("which allowed 0" in problem for problem in violation.problems)


def test_decisions_that_follow_a_clock_stepping_back_are_reported(make_url, monkeypatch):
    original = Dialect.decision_time

    def forgetful(self, tx, clock):
        original(self, tx, clock)
        return clock.now()  # ignores the high-water mark it just read

    monkeypatch.setattr(Dialect, "decision_time", forgetful)
    first_violation(make_url)


def test_rounds_report_a_receiver_that_drops_effects(make_url, monkeypatch):
    def no_effect(self, tx, replies):
        for reply in replies:
            tx.execute("INSERT INTO receiver_receipts (reply_id, fingerprint, body, "
                       "received_at) VALUES (:reply_id, :fingerprint, :body, :now)",
                       {"reply_id": reply.reply_id, "fingerprint": reply.fingerprint,
                        "body": reply.body, "now": tx.now})
        return [postroom.Outcome.delivered() for _ in replies]

    # Patched in this process only: the drain's deliveries lose their effects.
    monkeypatch.setattr(Receiver, "_accept_all", no_effect)
    result = run_rounds(1, 2, make_url, seed=3, ops=10, kill_rate=0.0)
    assert result.violations
    assert any("effect" in problem for problem in result.violations[0]["problems"])
