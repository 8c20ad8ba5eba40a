"""The simulated world: a store and a receiver on real databases, a manual clock, and what the
simulation itself was told (ACKs, claims, streams) so it can hold the databases to it.

A ``Snapshot`` is everything the checks compare between two steps, read through a table of
named queries (``SNAPSHOT_TABLES``); a component that adds tables (waits) adds a row there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from postroom.clock import ManualClock
from postroom.db.database import Database
from postroom.models import AuthContext, Claim, Envelope, TaskState
from postroom.receiver import Receiver
from postroom.settings import ExponentialBackoff, Settings
from postroom.store import Store
from postroom.transports import InProcessTransport
from postroom.validation import check_envelope
from tests.harness import queries
from tests.support import database_of

__all__ = [
    "OWNERS",
    "PRINCIPALS",
    "QUEUES",
    "SIM_SETTINGS",
    "SNAPSHOT_TABLES",
    "START",
    "TERMINAL",
    "Snapshot",
    "StreamModel",
    "Table",
    "UrlFactory",
    "World",
    "content_fingerprint",
    "read_snapshot",
]

#: Makes a fresh, empty database URL for a name ("store", "receiver"); see ``temp_urls``.
UrlFactory = Callable[[str], str]

#: Short leases, backoffs and retention, a small sweep limit and a low hop limit, so that a
#: few hundred operations reach every path: recoveries, exhausted attempts and budgets,
#: pruning, bounded sweeps that need several transactions, follow-ups at the hop limit.
SIM_SETTINGS = Settings(
    lease=30.0,
    dispatch_lease=20.0,
    max_hops=3,
    delivery_budget=3,
    retention=900.0,
    sweep_limit=5,
    backoff=ExponentialBackoff(base=2.0, cap=60.0),
    delivery_backoff=ExponentialBackoff(base=2.0, cap=60.0),
)

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
PRINCIPALS = ("planner", "scout")
QUEUES = ("default", "fast", "slow")
OWNERS = ("w1", "w2", "w3")
TERMINAL = frozenset(state.value for state in TaskState if state.terminal)

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Table:
    """One whole-table read of a snapshot: its query, key column(s) and database.

    A single key column keys rows by its value; several (a composite key, like a wait's
    ``(flow, step, generation)``) key them by the tuple of their values.
    """

    name: str
    query: str
    key: str | tuple[str, ...]
    database: str  # "store" or "receiver"

    def key_of(self, row: Row) -> Any:
        """The identity of ``row`` in this table."""
        if isinstance(self.key, str):
            return row[self.key]
        return tuple(row[column] for column in self.key)


SNAPSHOT_TABLES: list[Table] = [
    Table("tasks", "snapshot_tasks", "task_id", "store"),
    Table("replies", "snapshot_replies", "reply_id", "store"),
    Table("receipts", "snapshot_receipts", "reply_id", "receiver"),
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What both databases held at one moment, keyed by identity."""

    high_water: float
    tables: Mapping[str, Mapping[Any, Row]]

    @property
    def tasks(self) -> Mapping[str, Row]:
        """Tasks by task_id."""
        return self.tables["tasks"]

    @property
    def replies(self) -> Mapping[str, Row]:
        """Replies by reply_id."""
        return self.tables["replies"]

    @property
    def receipts(self) -> Mapping[str, Row]:
        """Receiver receipts by reply_id."""
        return self.tables["receipts"]


def read_snapshot(store: Database, receiver: Database) -> Snapshot:
    """Read every snapshot table, each database in one consistent read."""
    tables: dict[str, dict[Any, Row]] = {}
    high_water = 0.0
    for name, database in (("store", store), ("receiver", receiver)):
        with database.reading() as tx:
            if name == "store":
                row = tx.one("clock_read")
                high_water = float(row["high_water"]) if row is not None else 0.0
            for table in SNAPSHOT_TABLES:
                if table.database == name:
                    tables[table.name] = {table.key_of(row): row
                                          for row in queries.rows(tx, table.query)}
    return Snapshot(high_water=high_water, tables=tables)


def content_fingerprint(principal: str, envelope: Envelope) -> str:
    """The content fingerprint the store will compute for ``envelope``."""
    return check_envelope(principal, envelope.to_dict(), limits=SIM_SETTINGS.limits).fingerprint


@dataclass(slots=True)
class StreamModel:
    """What the simulation knows about one numbered upstream stream."""

    next_seq: int = 1
    skipped: list[int] = field(default_factory=list)  # positions left as gaps, to fill later
    stored: set[int] = field(default_factory=set)  # every position ever ACKed
    envelopes: dict[int, Envelope] = field(default_factory=dict)
    task_ids: set[str] = field(default_factory=set)
    watermark: int = 0  # the highest watermark read so far
    pruned: bool = False  # a position of this stream was pruned (the watermark may lag)


class World:
    """A store and a receiver under simulation, plus the simulation's own records."""

    def __init__(self, seed: int, urls: UrlFactory, *, settings: Settings = SIM_SETTINGS,
                 start: float = START) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.settings = settings
        self.clock = ManualClock(start)
        self.store_url = urls("store")
        self.receiver_url = urls("receiver")
        self.store = Store.open(self.store_url, clock=self.clock, settings=settings, seed=seed)
        self.receiver = Receiver.open(self.receiver_url, clock=self.clock)
        self.transport = InProcessTransport(self.receiver)
        self.restarts = 0
        # What the simulation was told. ``sent`` holds the latest content tried per identity.
        self.sent: dict[tuple[str, str], Envelope] = {}
        self.acked: set[str] = set()
        self.claims: list[Claim] = []
        self.streams: dict[tuple[str, str], StreamModel] = {}
        self.counter = 0
        self.last = self.snapshot()

    def snapshot(self) -> Snapshot:
        """Read both databases now."""
        return read_snapshot(database_of(self.store), database_of(self.receiver))

    def restart(self) -> None:
        """Close both databases and open them again, as a restarted process would."""
        self.close()
        self.store = Store.open(self.store_url, clock=self.clock, settings=self.settings,
                                seed=self.rng.randrange(2**32))
        self.receiver = Receiver.open(self.receiver_url, clock=self.clock)
        self.transport = InProcessTransport(self.receiver)
        self.restarts += 1

    def close(self) -> None:
        """Close both databases."""
        self.store.close()
        self.receiver.close()

    # -- what the simulation sends ------------------------------------------------------------

    def auth(self, principal: str) -> AuthContext:
        """The authenticated principal sending as ``principal``."""
        return AuthContext(principal=principal)

    def new_envelope(self, *, principal: str | None = None, deadline: float | None = None,
                     hops: int | None = None) -> tuple[AuthContext, Envelope]:
        """A message never sent before, with random but valid content."""
        rng = self.rng
        sender = principal if principal is not None else rng.choice(PRINCIPALS)
        self.counter += 1
        now = self.clock.now()
        deadline = deadline if deadline is not None else now + rng.uniform(20.0, 1500.0)
        # Some run later (held until not_before) and some first or last (a priority).
        later = rng.random() < 0.15 and deadline > now + 2
        envelope = Envelope(
            message_id=f"m-{self.counter}",
            sender=sender,
            payload=self.payload(),
            deadline=deadline,
            not_before=rng.uniform(now + 1, min(now + 120, deadline - 1)) if later else None,
            priority=rng.choice((0, 0, 0, 0, -3, 2, 5)),
            max_attempts=rng.randint(1, 4),
            hops=hops if hops is not None else rng.choice((0, 0, 0, 1, 2)),
            queue=rng.choice(QUEUES),
            correlation_id=rng.choice((None, "flow-a", "flow-b")),
        )
        return self.auth(sender), envelope

    def payload(self) -> dict[str, Any]:
        """A small random JSON object (with non-ASCII text, nesting and numbers)."""
        rng = self.rng
        return {
            "n": rng.randint(-(10**6), 10**6),
            "text": rng.choice(("", "plain", "日本語", "ünïcödé", "x" * rng.randint(0, 40))),
            "ratio": rng.choice((0.5, -1.25, 1e-9, 12345.678)),
            "nested": {"flag": rng.choice((True, False, None)),
                       "items": [rng.randint(0, 9) for _ in range(rng.randint(0, 4))]},
        }

    def remember_claims(self, claims: list[Claim]) -> None:
        """Keep claims (they go stale later) for workers that come back with old ones."""
        self.claims.extend(claims)
        del self.claims[:-48]
