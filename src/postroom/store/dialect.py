"""The dialect seam: the few things SQLite and PostgreSQL do differently.

Everything a rule needs is written once above this seam (``postroom.store.database`` and the
named queries). A dialect provides only:

- connections and transaction boundaries (``connection``, ``begin``, ``commit``, ``rollback``),
- the parameter style and the query fragments that differ (``convert``, ``fragments``),
- the time authority and how its high-water mark is kept (``decision_time``, ``record_time``),
- error classification (``translate``) and the driver's error base (``driver_error``),
- wake-ups after a commit (``notify``), schema scripts and query plans (``explain``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

from postroom.clock import Clock, SystemClock
from postroom.store.queries import QuerySet, load_queries

if TYPE_CHECKING:
    from postroom.errors import PostroomError
    from postroom.store.database import Tx

__all__ = ["Dialect", "Row"]

Row = Mapping[str, Any]


class Dialect(ABC):
    """One database backend."""

    #: Short name, also the folder of its migrations.
    name: ClassVar[str]
    #: Replacements for ``{fragment}`` markers in the shared queries.
    fragments: ClassVar[Mapping[str, str]]
    #: The driver's base exception class, translated at the boundary.
    driver_error: ClassVar[type[BaseException]]

    @cached_property
    def queries(self) -> QuerySet:
        """Every named query, resolved for this dialect."""
        return load_queries(self.fragments, self.convert)

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

    @abstractmethod
    def execute_script(self, conn: Any, script: str) -> None:
        """Run a schema script inside the open transaction."""

    @abstractmethod
    def translate(self, exc: BaseException) -> PostroomError:
        """Map a driver error to postroom's exception tree."""

    @abstractmethod
    def explain(self, conn: Any, sql: str, params: Mapping[str, Any]) -> list[str]:
        """The query plan of ``sql`` as lines of text."""

    def decision_time(self, tx: Tx, clock: Clock) -> float:
        """The time a write transaction decides with: never below the persisted high-water."""
        row = tx.one("clock_read")
        high_water = float(row["high_water"]) if row is not None else 0.0
        tx.high_water = high_water
        return max(clock.now(), high_water)

    def record_time(self, tx: Tx) -> None:
        """Persist the time a transaction used, if it wrote anything and time moved forward."""
        if tx.wrote and tx.now > tx.high_water:
            tx.run("clock_advance", now=tx.now)

    def retry_delay(self, exc: PostroomError, attempt: int) -> float | None:
        """Seconds to wait before running a failed transaction again, or ``None`` to raise.

        Only for failures that certainly left nothing behind (the default: never retry).
        """
        return None

    def notify(self, tx: Tx, channel: str) -> None:  # noqa: B027 - optional hook
        """Announce new work on ``channel`` when ``tx`` commits (no-op where unsupported)."""

    def migrations(self, component: str) -> list[tuple[int, str]]:
        """``(version, script)`` of every migration of ``component``, in order."""
        folder = resources.files("postroom.store") / "migrations" / self.name / component
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
