"""What a scenario is given, and the rows it hands back."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from postroom.audit import audit_database
from postroom.db import Database

__all__ = [
    "FULL",
    "QUICK",
    "BenchError",
    "Context",
    "Measurement",
    "Numbers",
    "Rounds",
    "SQLiteTarget",
    "Sizes",
    "Target",
    "require_clean_audit",
]


class BenchError(RuntimeError):
    """A scenario saw something wrong (a missing claim, an unclean audit): no figure."""


def require_clean_audit(*databases: Database) -> None:
    """Raise ``BenchError`` naming every violation ``postroom audit`` finds in ``databases``."""
    for database in databases:
        violations = audit_database(database)
        if violations:
            raise BenchError("audit: " + "; ".join(map(str, violations)))


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How much work each scenario does. ``FULL`` gives the published figures."""

    #: Commits in one round of the raw baseline loop.
    raw_commits: int
    #: Timed rounds per measurement; the median round is reported.
    rounds: int
    #: Pending-task backlogs at which claim+finish is measured, smallest first.
    backlogs: tuple[int, ...]
    #: claim+finish cycles per round (the backlog is topped up between rounds).
    claim_cycles: int
    #: Tasks per round of the one-at-a-time end-to-end scenario.
    single_tasks: int
    #: Tasks per batch, and batches per round, of the batched end-to-end scenario.
    batch_size: int
    batches: int
    #: Waits opened before each round of the signal scenario, each answered in the round.
    signals: int
    #: Worker processes of the PostgreSQL claim+finish and end-to-end scenarios.
    pg_workers: tuple[int, ...]
    #: Tasks enqueued one at a time per round of the PostgreSQL latency scenario.
    latency_tasks: int
    #: Pages each commit rewrites in the commit-cost loops, one figure per count.
    commit_pages: tuple[int, ...]
    #: Tasks per round of the runtime scenarios on SQLite (one worker; worker + dispatcher)
    #: and on PostgreSQL (four workers).
    runtime_tasks: int
    pg_runtime_tasks: int
    #: Tasks per round of the 50 ms I/O-bound handler, at each concurrency.
    io_tasks: int
    #: Tasks delivered before the first RSS reading, and in all, on SQLite and PostgreSQL.
    rss_warm_up: int
    rss_tasks: int
    pg_rss_tasks: int
    #: Tasks scheduled in the future, and due tasks per round, of the scheduling scenario.
    future_backlog: int
    due_tasks: int
    #: Messages per ``receive_atomic`` call when building a backlog (the store's maximum).
    build_batch: int = 10_000
    #: Jobs per round, and rounds, of each system in the peer comparison; whether a peer
    #: that is not installed is left out (a smoke run) rather than failing the run.
    peer_tasks: int = 10_000
    peer_rounds: int = 3
    peers_optional: bool = False
    #: Tasks postroom's processes run before its timed peer rounds (0: no warm-up round).
    peer_warm_up: int = 100
    #: Tasks per round of the submit scenarios (in process, and over HTTP).
    http_tasks: int = 1_000
    #: Tasks per round of a remote worker with the trivial handler (the 50 ms one runs
    #: ``io_tasks``).
    remote_tasks: int = 2_000
    #: ``postroom worker`` processes on PostgreSQL, one count after another (the curve of
    #: throughput against processes; 4 is the one the runtime's bar judges).
    pg_worker_curve: tuple[int, ...] = (1, 2, 4, 8, 16)
    #: Calls of each kernel call under the sampler (the profiles scenarios).
    profile_calls: int = 2_000


FULL = Sizes(raw_commits=1_000, rounds=7, backlogs=(1_000, 10_000, 100_000, 1_000_000),
             claim_cycles=500, single_tasks=300, batch_size=500, batches=4, signals=500,
             pg_workers=(1, 4, 16), latency_tasks=300, commit_pages=(1, 2, 4, 6, 8, 12),
             runtime_tasks=10_000, pg_runtime_tasks=3_000, io_tasks=160, rss_warm_up=10_000,
             rss_tasks=100_000, pg_rss_tasks=100_000, future_backlog=1_000_000,
             due_tasks=1_000)
QUICK = Sizes(raw_commits=100, rounds=2, backlogs=(100, 1_000, 3_000), claim_cycles=40,
              single_tasks=20, batch_size=50, batches=2, signals=30, pg_workers=(1, 4),
              latency_tasks=50, commit_pages=(1, 6), build_batch=1_000,
              runtime_tasks=200, pg_runtime_tasks=200, io_tasks=16, rss_warm_up=300,
              rss_tasks=1_000, pg_rss_tasks=600, future_backlog=3_000, due_tasks=100,
              peer_tasks=50, peer_rounds=1, peers_optional=True, peer_warm_up=0,
              http_tasks=50, remote_tasks=50, pg_worker_curve=(1, 4), profile_calls=100)


class Target(Protocol):
    """Where a scenario's databases live: one backend, a fresh database per name."""

    backend: str

    def url(self, name: str) -> str:
        """The URL of a new, empty database called ``name``."""
        ...


class SQLiteTarget:
    """SQLite files in one folder (on disk: a tmpfs would hide the cost of fsync)."""

    backend = "sqlite"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str) -> Path:
        """``<folder>/<name>.db``."""
        return self.folder / f"{name}.db"

    def url(self, name: str) -> str:
        """``sqlite:///<folder>/<name>.db``."""
        return f"sqlite:///{self.path(name)}"


class Baseline(Protocol):
    """The yardstick every ratio divides by; ``round()`` measures it once more."""

    def round(self) -> float:
        """Run one round and return its rate."""
        ...


@dataclass(frozen=True, kw_only=True)
class Rounds:
    """The values of timed rounds, each with its ratio to the baseline measured around it.

    ``ratios`` is empty for a figure that a commit rate does not divide (a latency).
    """

    rates: tuple[float, ...]
    ratios: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One figure: the median of its rounds, in ``unit``, and its median ratio to raw."""

    id: str  # stable key, e.g. "claim_finish.backlog_1000000"
    label: str  # the row's title in RESULTS.md
    backend: str
    unit: str
    rounds: Rounds
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        """The median rate."""
        return median(self.rounds.rates)

    @property
    def ratio(self) -> float | None:
        """The median of the rounds' ratios to the raw loop (``None`` without ratios)."""
        return median(self.rounds.ratios) if self.rounds.ratios else None

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON values."""
        return {"id": self.id, "label": self.label, "backend": self.backend, "unit": self.unit,
                "value": round(self.value, 4 if self.unit == "x" else 1),
                "ratio_to_raw": None if self.ratio is None else round(self.ratio, 4),
                "rounds": [round(rate, 4 if self.unit == "x" else 1)
                           for rate in self.rounds.rates],
                "round_ratios": [round(ratio, 4) for ratio in self.rounds.ratios],
                "details": self.details}


@dataclass(kw_only=True)
class Context:
    """Everything a scenario needs from the runner."""

    sizes: Sizes
    target: Target
    baseline: Baseline
    progress: Callable[[str], None]

    def timed_rounds(self, work: Callable[[], int], *,
                     before: Callable[[], None] | None = None) -> Rounds:
        """``sizes.rounds`` timed runs of ``work`` (which returns how many units it did).

        Baseline rounds sandwich every timed round, and each round's ratio divides its rate
        by the mean of the two baseline rounds around it: both see the same neighbours and
        the same disk, which a machine shared with other work needs. ``before`` runs
        untimed ahead of each round, e.g. to top a backlog up.
        """
        def clocked() -> tuple[int, float]:
            start = time.perf_counter()
            units = work()
            return units, time.perf_counter() - start

        return self.measured_rounds(clocked, before=before)

    def measured_rounds(self, work: Callable[[], tuple[int, float]], *,
                        before: Callable[[], None] | None = None) -> Rounds:
        """As ``timed_rounds``, for a ``work`` that times itself: it returns the units it
        did and the seconds they took (e.g. read from the database, when other processes
        did the work)."""
        rates: list[float] = []
        ratios: list[float] = []
        raw_after = 0.0
        for index in range(self.sizes.rounds):
            if before is not None:
                before()
            raw_before = raw_after if index else self.baseline.round()
            units, seconds = work()
            rate = units / seconds
            raw_after = self.baseline.round()
            rates.append(rate)
            ratios.append(rate / ((raw_before + raw_after) / 2))
        return Rounds(rates=tuple(rates), ratios=tuple(ratios))


def median(values: list[float] | tuple[float, ...]) -> float:
    """The median (robust to one round disturbed by a neighbour's burst of I/O)."""
    return float(statistics.median(values))


class Numbers:
    """Task numbers handed out in order; ``used`` is how many were handed out."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, count: int) -> range:
        """The next ``count`` numbers."""
        first = self.used
        self.used += count
        return range(first, self.used)
