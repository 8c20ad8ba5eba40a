"""The randomized audit of SPEC §9: many seeds of mixed operations, then multi-process rounds.

- ``world``      the databases under test, the manual clock, what the simulation was told,
                 and ``Snapshot`` (both databases read through ``SNAPSHOT_TABLES``);
- ``operations`` the weighted table of operations, each holding its outcome to the
                 snapshot before it (``OPERATIONS``);
- ``checks``     the invariants compared between two snapshots (``CHECKS``), beside the
                 SPEC §8 audit of each database;
- ``runner``     one seed: operations, injected crashes, restarts, retries, checks;
- ``rounds``     real processes released together on one store, some SIGKILLed, then
                 drained and checked end to end (``burst`` is the process);
- ``waits``      the wait operations, their model and checks, registered into the tables;
- ``scheduling`` paused and limited queues and re-runs, registered into the tables;
- ``wait_rounds`` real processes racing on a few contested waits, exactly one winner each
                 (``wait_burst`` is the process);
- ``schedules``  the periodic schedules' operations and checks, registered into the tables;
- ``chains``     roots with small budgets and spawns that exhaust them, registered likewise;
- ``approvals``  grants, revocations, expiries and side effects that use (or cannot use) a
                 human's approval, registered likewise.

A component that adds records and rules (waits, approvals) extends the three tables:
``SNAPSHOT_TABLES``, ``OPERATIONS`` and ``CHECKS``.

``postroom random-audit`` runs ``random_audit`` and prints its summary.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Importing them registers waits, flow control, schedules, chains and approvals in the tables.
from tests.harness.simulation import (  # noqa: F401
    approvals,
    chains,
    schedules,
    scheduling,
    waits,
)
from tests.harness.simulation.rounds import RoundsResult, run_rounds
from tests.harness.simulation.runner import SeedResult, Violation, run_seed
from tests.harness.simulation.wait_rounds import WaitRoundsResult, run_wait_rounds
from tests.harness.simulation.world import UrlFactory

__all__ = ["AuditSummary", "RoundsResult", "SeedResult", "Violation", "WaitRoundsResult",
           "random_audit", "run_rounds", "run_seed", "run_wait_rounds", "sqlite_urls"]


@dataclass(kw_only=True, slots=True)
class AuditSummary:
    """Everything a random audit ran and found."""

    seeds: int
    first_seed: int
    ops_per_seed: int
    operations: int = 0
    per_operation: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    crash_points: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    rounds: RoundsResult = field(default_factory=RoundsResult)
    processes_per_round: int = 0
    wait_rounds: WaitRoundsResult = field(default_factory=WaitRoundsResult)
    wait_processes_per_round: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, result: SeedResult) -> None:
        """Fold one seed's result in."""
        self.operations += result.steps
        self.per_operation.update(result.operations)
        self.outcomes.update(result.outcomes)
        self.crash_points.update(result.crashes)
        self.restarts += result.restarts
        if result.violation is not None:
            self.violations.append(result.violation.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON summary ``postroom random-audit`` prints."""
        rounds, contests = self.rounds, self.wait_rounds
        return {
            "seeds": self.seeds,
            "first_seed": self.first_seed,
            "ops_per_seed": self.ops_per_seed,
            "operations": self.operations,
            "per_operation": dict(sorted(self.per_operation.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "crashes_injected": sum(self.crash_points.values()),
            "crash_points": dict(sorted(self.crash_points.items())),
            "restarts": self.restarts,
            "rounds": rounds.rounds,
            "processes_per_round": self.processes_per_round,
            "processes_started": rounds.processes,
            "processes_killed": rounds.killed,
            "round_operations": rounds.operations,
            "round_acked_tasks": rounds.acked,
            "round_requeued_replies": rounds.requeued,
            "wait_rounds": contests.rounds,
            "wait_processes_per_round": self.wait_processes_per_round,
            "wait_processes_started": contests.processes,
            "wait_processes_killed": contests.killed,
            "wait_round_operations": contests.operations,
            "wait_round_winners": dict(sorted(contests.winners.items())),
            "violations": self.violations + rounds.violations + contests.violations,
            "seconds": round(self.seconds, 1),
        }


@contextmanager
def sqlite_urls(folder: Path | None = None) -> Iterator[Callable[[str], UrlFactory]]:
    """``prefix -> (name -> URL)`` of fresh SQLite files in ``folder`` (or a temporary one)."""
    with _folder(folder) as root:
        def factory(prefix: str) -> UrlFactory:
            return lambda name: f"sqlite:///{root / f'{prefix}-{name}.db'}"

        yield factory


@contextmanager
def _folder(folder: Path | None) -> Iterator[Path]:
    """``folder`` (created if needed, and kept), or a temporary folder removed afterwards."""
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="postroom-random-audit-") as scratch:
        yield Path(scratch)


def random_audit(*, seeds: int, ops: int, rounds: int, processes: int, wait_rounds: int = 0,
                 wait_processes: int = 12, first_seed: int = 0, folder: Path | None = None,
                 progress: Callable[[int], None] | None = None) -> AuditSummary:
    """Run ``seeds`` seeds of ``ops`` operations, then ``rounds`` multi-process task rounds
    of ``processes`` processes, then ``wait_rounds`` wait rounds of ``wait_processes``.

    ``progress(n)`` is told of every finished operation and round (``seeds * ops + rounds +
    wait_rounds`` in all, skipped ones included when a seed or phase stops early).
    """
    started = time.monotonic()
    summary = AuditSummary(seeds=seeds, first_seed=first_seed, ops_per_seed=ops,
                           processes_per_round=processes,
                           wait_processes_per_round=wait_processes)
    done = 0

    def advance() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(1)

    with sqlite_urls(folder) as urls:
        for seed in range(first_seed, first_seed + seeds):
            summary.add(run_seed(seed, ops, urls(f"seed-{seed}"), on_step=advance))
        summary.rounds = run_rounds(rounds, processes, urls("rounds"), seed=first_seed,
                                    on_round=advance)
        summary.wait_rounds = run_wait_rounds(wait_rounds, wait_processes, urls("wait-rounds"),
                                              seed=first_seed, on_round=advance)
    if progress is not None:
        progress(seeds * ops + rounds + wait_rounds - done)  # what stopped phases left undone
    summary.seconds = time.monotonic() - started
    return summary
