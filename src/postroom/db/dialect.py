"""The dialect seam: the few things SQLite and PostgreSQL do differently.

Everything a rule needs is written once above this seam (``postroom.db.database`` and the
named queries). A dialect provides only:

- connections and transaction boundaries (``connection``, ``begin``, ``commit``, ``rollback``),
- the parameter style and the query fragments that differ (``convert``, ``fragments``),
- the time source (``default_clock``, ``source_time``, ``current_time``) and which row of the
  time high-water a connection advances (``clock_shard``),
- error classification: ``translate`` is written once here, from two hooks that say what a
  driver error is (``is_transient``, ``is_unique_violation``), so the same failure is the
  same postroom error on both backends; the driver's error base (``driver_error``) and which
  failures are retried (``retry_delay``),
- whether rows a locking statement chose must be asked again (``confirm_locked``),
- the last statements of a write transaction (``before_commit``: e.g. emitting wake-ups),
  wake-ups for waiters (``wakeups``, ``listen``), migration locking and query plans.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from postroom.clock import Clock, SystemClock, finite_time
from postroom.db.queries import QuerySet, load_queries
from postroom.db.wakeups import Wakeups

if TYPE_CHECKING:
    from postroom.db.database import Check, Tx
    from postroom.errors import PostroomError

__all__ = ["Dialect", "Row", "first_line"]

Row = Mapping[str, Any]
T = TypeVar("T")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: The queries each dialect class loaded, by the loader that loaded them.
_LOADED: dict[tuple[Callable[..., QuerySet], type[Dialect]], QuerySet] = {}


class Dialect(ABC):
    """One database backend."""

    #: Short name, also the folder of its migrations.
    name: ClassVar[str]
    #: Replacements for ``{fragment}`` markers in the shared queries.
    fragments: ClassVar[Mapping[str, str]]
    #: The driver's base exception class, translated at the boundary.
    driver_error: ClassVar[type[BaseException]]
    #: Whether a write transaction takes a lock on the whole database (SQLite), so that a
    #: write that may find nothing to do looks first in a read transaction, which does not.
    one_writer: ClassVar[bool] = False
    #: Whether tasks' integer ids follow their creation: a task created later never has a
    #: lower id (SQLite: one writer at a time hands out max(id) + 1, and a task's created_at
    #: is its transaction's time, never below the high-water, which the newest task keeps).
    #: There, the table itself, walked by id, is the order of creation, and a bound on
    #: created_at becomes a bound on id (``tasks_created_from``); elsewhere an index on
    #: (created_at, id) keeps that order.
    ids_follow_creation: ClassVar[bool] = False

    @cached_property
    def queries(self) -> QuerySet:
        """Every named query, resolved for this dialect: loaded once per dialect class in a
        process (the SQL files do not change while it runs), so opening a store costs no
        parsing after the first."""
        key = (load_queries, type(self))  # a test that replaces the loader gets its own
        loaded = _LOADED.get(key)
        if loaded is None:
            loaded = _LOADED[key] = load_queries(self.fragments, self.convert)
        return loaded

    def convert(self, sql: str) -> str:
        """Turn ``:name`` parameters into the driver's style (SQLite takes them as they are)."""
        return sql

    def default_clock(self) -> Clock:
        """The time source used when the caller does not pass one."""
        return SystemClock()

    @abstractmethod
    def connection(self) -> AbstractContextManager[Any]:
        """A connection for one transaction (held exclusively until the block ends)."""

    @abstractmethod
    def begin(self, conn: Any, *, write: bool) -> None:
        """Open a transaction; ``write`` takes the write lock up front where that matters."""

    @abstractmethod
    def commit(self, conn: Any) -> None:
        """Commit the open transaction."""

    @abstractmethod
    def rollback(self, conn: Any) -> None:
        """Roll back the open transaction, if any. Never raises on a dead connection."""

    @abstractmethod
    def execute(self, conn: Any, sql: str, params: Mapping[str, Any] | Sequence[Any]) -> Any:
        """Execute one statement and return the driver's cursor."""

    @abstractmethod
    def executemany(self, conn: Any, sql: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Execute one statement for many parameter sets; return how many rows they changed."""

    def execute_returning(self, conn: Any, sql: str,
                          rows: Sequence[Mapping[str, Any]]) -> list[Row | None]:
        """Execute one statement per parameter set and return the first row each returned.

        One statement at a time by default; a driver that can pipeline them does.
        """
        found: list[Row | None] = []
        for params in rows:
            cursor = self.execute(conn, sql, params)
            found.append(cursor.fetchone())
            cursor.fetchall()
        return found

    @abstractmethod
    def execute_script(self, conn: Any, script: str) -> None:
        """Run a schema script inside the open transaction."""

    @abstractmethod
    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` left nothing committed and may pass (busy, locked, session lost)."""

    @abstractmethod
    def is_unique_violation(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a unique or primary key violation."""

    def describe(self, exc: BaseException) -> str:
        """``exc`` in one line, prefixed with the backend (``sqlite /path: ...``)."""
        return f"{self.name}: {first_line(exc)}"

    def translate(self, exc: BaseException) -> PostroomError:
        """Map a driver error to postroom's exception tree: ``StoreUnavailable`` when it is
        transient, ``Conflict`` for a unique violation, ``StoreError`` otherwise."""
        from postroom.errors import Conflict, StoreError, StoreUnavailable

        if self.is_transient(exc):
            return StoreUnavailable(self.describe(exc))
        if self.is_unique_violation(exc):
            return Conflict(self.describe(exc))
        return StoreError(self.describe(exc))

    def confirm_locked(self, rows: list[T], still: Callable[[T], bool]) -> list[T]:
        """The ``rows`` a locking statement chose that still hold (``still(row)``).

        Where one writer runs at a time (SQLite) what a statement chose is what it locked:
        all of them. A dialect whose locking statements may choose from a snapshot older
        than their locks (PostgreSQL's READ COMMITTED) asks each row again.
        """
        return rows

    @abstractmethod
    def explain(self, conn: Any, sql: str, params: Mapping[str, Any]) -> list[str]:
        """The query plan of ``sql`` as lines of text."""

    @abstractmethod
    def durability(self, conn: Any) -> tuple[dict[str, str], list[str]]:
        """The settings that commits' durability and the store's upkeep depend on, as the
        database reports them to this connection, and one warning per setting that weakens
        them (for ``postroom info``)."""

    def decision_time(self, tx: Tx, clock: Clock, checks: Sequence[Check] = ()) -> float:
        """The time a write transaction decides with: never below the persisted high-water.

        The high-water is the greatest of the clock rows of ``postroom_counts`` (one on
        SQLite, several on PostgreSQL, see ``clock_shard``) and of the newest task's creation;
        it is read in the transaction's first statement, so it includes every decision
        committed before this transaction began. A dialect whose statements cost a round trip
        may read the rows of ``checks`` in that statement too, into ``tx.checked``.
        """
        row = self.clock_read(tx, checks)
        high_water = (float(row["high_water"])
                      if row is not None and row["high_water"] is not None else 0.0)
        tx.high_water = high_water
        return max(finite_time(self.source_time(clock, row)), high_water)

    def tasks_created_from(self, tx: Tx, at: float, *, strictly: bool = False) -> int:
        """The least id from which every task was created at or after ``at`` (after it, if
        ``strictly``), and before which none was: greater than every id when none was.

        Where ids follow creation, a binary search of the ids, each step one lookup by id;
        elsewhere 0, which bounds nothing (the queries there do not read it).
        """
        if not self.ids_follow_creation:
            return 0
        span = tx.one("tasks_id_span")
        if span is None or span["high"] is None:
            return 0
        low, high = int(span["low"]), int(span["high"]) + 1
        while low < high:
            middle = (low + high) // 2
            row = tx.one("task_created_from", id=middle)
            created = None if row is None else float(row["created_at"])
            if created is None or created > at or (created == at and not strictly):
                high = middle
            else:
                low = middle + 1
        return low

    def clock_read(self, tx: Tx, checks: Sequence[Check]) -> Row | None:
        """The ``clock_read`` row (here without the checks' rows: each is its own statement,
        which costs next to nothing in process)."""
        return tx.one("clock_read")

    def source_time(self, clock: Clock, row: Row | None) -> float:
        """The time source's reading for a decision (``row`` is the ``clock_read`` row)."""
        return clock.now()

    def current_time(self, tx: Tx, clock: Clock) -> float:
        """The source's time for a transaction that keeps no high-water (reads, receivers)."""
        return clock.now()

    def catch_up_time(self, tx: Tx) -> None:  # noqa: B027 - optional hook
        """After ``tx`` took a lock or read a row that a later decision may have committed,
        raise ``tx.now`` to the decision times committed since it began (nothing to do where
        write transactions run one at a time, as on SQLite)."""

    def clock_shard(self, tx: Tx) -> int:
        """Which clock row of ``postroom_counts`` records this transaction's decision time."""
        return 1

    def time_to_record(self, tx: Tx) -> bool:
        """Whether ``tx`` must persist its time in a clock row: it wrote something, time moved
        forward, and no task it created keeps that time -- or it deleted tasks, whose
        creation may have been what kept the high-water.

        (A replay or a refused request writes nothing, so it does not move time.)
        """
        return tx.wrote and (tx.forgets_time
                             or (tx.now > tx.high_water and not tx.kept_in_task))

    def record_time(self, tx: Tx) -> None:
        """Persist the time a transaction used, when ``time_to_record`` says so."""
        if self.time_to_record(tx):
            tx.change("clock_advance", now=tx.now, shard=self.clock_shard(tx))

    def add_counts(self, tx: Tx, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add the transaction's tallies to ``postroom_counts``: ``counts_add`` per row.

        A dialect that pays a round trip per statement may instead add them with
        ``before_commit``'s statement.
        """
        tx.change_many("counts_add", rows)

    def retry_delay(self, exc: PostroomError, attempt: int) -> float | None:
        """Seconds to wait before running a failed transaction again, or ``None`` to raise.

        Only for failures that certainly left nothing behind (the default: never retry).
        """
        return None

    def before_commit(self, tx: Tx) -> None:  # noqa: B027 - optional hook
        """The write transaction's last step before COMMIT (its time is already recorded).

        A dialect with cross-process wake-ups emits ``tx.channels`` here, so they are sent
        if and only if the transaction commits.
        """

    def after_commit(self, tx: Tx) -> None:
        """Wake this process's waiters for the channels ``tx`` announced (it committed)."""
        if tx.channels:
            self.wakeups.announce(tx.channels)

    @property
    def wakeups(self) -> Wakeups:
        """The hub that wakes this database's waiters in this process.

        Made on first use; ``dict.setdefault`` is atomic, so threads racing to make it all
        get the same hub (a waiter on one hub and announcements on another would never meet).
        """
        hub = self.__dict__.get("_wakeups")
        if hub is None:
            hub = self.__dict__.setdefault("_wakeups", Wakeups())
        return hub  # type: ignore[no-any-return]

    def listen(self) -> None:  # noqa: B027 - optional hook
        """Start hearing other processes' announcements (where the backend can carry them).

        Returns once listening (or once it is clear that only polling will find work).
        """

    def lock_migrations(self, conn: Any) -> None:  # noqa: B027 - optional hook
        """Keep concurrent migrations of one database apart (inside the open transaction)."""

    def migrations(self, component: str) -> list[tuple[int, str]]:
        """``(version, script)`` of every migration of ``component``, in order."""
        folder = resources.files("postroom.db") / "migrations" / self.name / component
        found: list[tuple[int, str]] = []
        for entry in folder.iterdir():
            if entry.name.endswith(".sql"):
                found.append((int(entry.name.split("_", 1)[0]), entry.read_text("utf-8")))
        found.sort()
        return found

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def rows(self, cursor: Any) -> Iterator[Row]:
        """Iterate a cursor's rows as mappings."""
        return iter(cursor.fetchall())
