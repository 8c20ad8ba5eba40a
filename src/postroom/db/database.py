"""Transactions over a dialect: named operations, fault points, the time authority, migrations.

Every write postroom makes goes through ``Database.transaction(operation)``, which:

1. takes a connection and opens a write transaction,
2. fixes the transaction's decision time (``tx.now``) from the clock and the high-water mark,
3. runs the caller's statements,
4. persists the high-water if anything was written, lets the dialect emit the wake-ups the
   transaction announced (``Tx.notify``), passes ``<op>.before_commit``, commits, wakes this
   process's waiters, passes ``<op>.after_commit``,
5. rolls back on any exception and translates driver errors into postroom's tree, except a
   ``Fenced`` that time decided (``decided_at``: a lease or deadline ran out) in a transaction
   that wrote nothing: that refusal is a decision too, so its time is committed (step 4)
   before it is raised, and a clock stepping back cannot reverse it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from postroom import faults, log
from postroom.clock import Clock, finite_time
from postroom.db.dialect import Dialect, Row
from postroom.db.queries import QuerySet
from postroom.errors import Fenced, PostroomError, SchemaError, StoreUnavailable

__all__ = ["Check", "Database", "NotAllApplied", "Tx", "Write"]

T = TypeVar("T")


class NotAllApplied(Exception):
    """A statement run for a whole batch changed fewer rows than it was given.

    Raised inside the transaction, so that it rolls back; ``Database.run_batch`` then does
    the batch again item by item, which decides and explains each item as one call would.
    """


class Write:
    """A named kind of write transaction, with its two commit fault points.

    ``timed=False`` names a transaction that decides nothing by time (publishing a store
    setting, say): it neither reads the clock nor moves the high-water, and its ``tx.now``
    stays 0, so it works whatever the clock reads.
    """

    __slots__ = ("after", "before", "name", "timed")

    def __init__(self, name: str, *, timed: bool = True) -> None:
        self.name = name
        self.timed = timed
        before, after = faults.commit_points(name)
        self.before = before.name
        self.after = after.name

    def __repr__(self) -> str:
        return f"Write({self.name!r})"


_MIGRATE = Write("migrate")


#: Bounds on a 64-bit id that hold every id.
ID_BOUNDS = (-(1 << 63), (1 << 63) - 1)


class Tx:
    """One open transaction. Statements are run by query name with keyword parameters."""

    __slots__ = ("_conn", "_dialect", "_queries", "_savepoints", "channels", "checked",
                 "events", "forgets_time", "high_water", "kept_in_task", "now", "op",
                 "tallies", "wrote")

    def __init__(self, conn: Any, dialect: Dialect, op: Write | None) -> None:
        self._conn = conn
        self._dialect = dialect
        self._queries: QuerySet = dialect.queries
        self.op = op
        self.now = 0.0
        self.high_water = 0.0
        self.wrote = False
        #: This transaction created a task, whose created_at (its decision time) keeps its
        #: time: no clock row needs it (see ``clock_read``).
        self.kept_in_task = False
        #: This transaction deleted tasks, whose creation may have been all that kept a time:
        #: it keeps its own in a clock row.
        self.forgets_time = False
        self.channels: set[str] = set()
        self.tallies: dict[tuple[str, str, str], int] = {}
        self.events: list[tuple[logging.Logger, int, str, dict[str, object]]] = []
        #: The rows of the ``Check``s of ``Database.checking``, if the dialect read them with
        #: the transaction's first statement (``Dialect.decision_time``).
        self.checked: Sequence[Row | None] | None = None
        self._savepoints = 0

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of this transaction that a failure undoes on its own.

        If the block raises, what it wrote is rolled back to where it began (so are the
        wake-ups, tallies and log records it announced) and the exception goes on; the rest of
        the transaction stands and may still commit. A driver error inside the block arrives
        translated into postroom's tree; one that ended the session (``StoreUnavailable``)
        cannot be undone this way and fails the whole transaction.
        """
        self._savepoints += 1
        name = f"postroom_part_{self._savepoints}"
        marks = (set(self.channels), dict(self.tallies), len(self.events), self.wrote,
                 self.kept_in_task, self.forgets_time)
        dialect = self._dialect
        dialect.execute(self._conn, f"SAVEPOINT {name}", {})
        try:
            yield
        except BaseException as exc:
            translated = (dialect.translate(exc) if isinstance(exc, dialect.driver_error)
                          else exc)
            if isinstance(translated, StoreUnavailable):
                raise translated from exc
            dialect.execute(self._conn, f"ROLLBACK TO SAVEPOINT {name}", {})
            dialect.execute(self._conn, f"RELEASE SAVEPOINT {name}", {})
            self.channels, self.tallies = marks[0], marks[1]
            del self.events[marks[2]:]
            self.wrote, self.kept_in_task, self.forgets_time = marks[3], marks[4], marks[5]
            if translated is exc:
                raise
            raise translated from exc
        dialect.execute(self._conn, f"RELEASE SAVEPOINT {name}", {})

    @property
    def backend(self) -> str:
        """The dialect's name: ``sqlite`` or ``postgres``."""
        return self._dialect.name

    @property
    def conn(self) -> Any:
        """The dialect's connection this transaction runs on (for dialect hooks)."""
        return self._conn

    def one(self, name: str, **params: Any) -> Row | None:
        """The first row of query ``name``, or ``None``."""
        query = self._queries[name]
        cursor = self._dialect.execute(self._conn, query.sql, params)
        row: Row | None = cursor.fetchone()
        if query.writes and row is not None:
            self.wrote = True
            cursor.fetchall()  # drain, so the statement completes on every driver
        return row

    def all(self, name: str, **params: Any) -> list[Row]:
        """Every row of query ``name``."""
        query = self._queries[name]
        rows: list[Row] = self._dialect.execute(self._conn, query.sql, params).fetchall()
        if query.writes and rows:
            self.wrote = True
        return rows

    def change(self, name: str, **params: Any) -> int:
        """Run query ``name`` and return how many rows it changed."""
        query = self._queries[name]
        cursor = self._dialect.execute(self._conn, query.sql, params)
        count = len(cursor.fetchall()) if "RETURNING" in query.sql else cursor.rowcount
        if query.writes and count > 0:
            self.wrote = True
        return int(count)

    def change_many(self, name: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Run query ``name`` once per parameter set; return how many rows they changed."""
        if not rows:
            return 0
        query = self._queries[name]
        count = self._dialect.executemany(self._conn, query.sql, rows)
        if query.writes and count > 0:
            self.wrote = True
        return count

    def one_each(self, name: str, rows: Sequence[Mapping[str, Any]]) -> list[Row | None]:
        """Run query ``name`` once per parameter set; the first row of each (or ``None``).

        For a guarded ``... RETURNING`` statement applied to many records: each answer says
        whether its record matched, as ``one`` would, in as few round trips as the driver
        allows.
        """
        if not rows:
            return []
        query = self._queries[name]
        found = self._dialect.execute_returning(self._conn, query.sql, rows)
        if query.writes and any(row is not None for row in found):
            self.wrote = True
        return found

    def change_each(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run query ``name`` once per parameter set, each of which must change one row.

        Raises ``NotAllApplied`` if one did not (a guarded statement found its record in
        another state, an insert found the identity already stored).
        """
        if self.change_many(name, rows) != len(rows):
            raise NotAllApplied(name)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """Run one statement of the caller's own in this transaction (a receiver's business
        effect, say) and return the driver's cursor.

        Parameters are written ``:name`` on every backend, as in postroom's own queries; the
        dialect converts them. The transaction counts as having written.
        """
        self.wrote = True
        return self._dialect.execute(self._conn, self._dialect.convert(sql), params or {})

    def confirm_locked(self, rows: list[T], still: Callable[[T], bool]) -> list[T]:
        """The ``rows`` a locking statement chose that still hold: ``still(row)`` asks one
        again where the dialect's locking statements may have chosen from an older snapshot
        (see ``Dialect.confirm_locked``)."""
        return self._dialect.confirm_locked(rows, still)

    def tasks_walk(self, *, after: float | None = None, before: float | None = None,
                   below: int = ID_BOUNDS[1]) -> dict[str, int]:
        """The ids a query walking the order of creation (``{tasks_walk}``) stays strictly
        between: below ``below`` and the first task created at or after ``before``, above
        the last created at or before ``after`` (where ids follow creation; elsewhere the
        query does not read them)."""
        above = ID_BOUNDS[0]
        if before is not None:
            below = min(below, self.tasks_created_from(before))
        if after is not None:
            above = self.tasks_created_from(after, strictly=True) - 1
        return {"walk_below": below, "walk_above": above}

    def tasks_created_from(self, at: float, *, strictly: bool = False) -> int:
        """The least task id from which every task was created at or after ``at`` (after
        it, if ``strictly``), where ids follow creation; 0 elsewhere (see
        ``Dialect.tasks_created_from``): the bound on id that a query walking the order of
        creation takes with its bound on created_at."""
        return self._dialect.tasks_created_from(self, at, strictly=strictly)

    def durability(self) -> tuple[dict[str, str], list[str]]:
        """The database settings commits' durability depends on, and a warning for each one
        that weakens it (see ``Dialect.durability``)."""
        return self._dialect.durability(self._conn)

    def catch_up_time(self) -> None:
        """Call after a lock or a read that may see what a decision committed after this
        transaction took its time: ``now`` rises to that decision's time (never falls)."""
        self._dialect.catch_up_time(self)

    def tally(self, kind: str, queue: str, state: str, count: int = 1) -> None:
        """Add ``count`` to the cumulative count of ``kind`` records of ``queue`` that reached
        ``state``, once this transaction commits.

        Tallies are summed per transaction and written just before COMMIT, one statement per
        distinct count, into this connection's shard of the counts (so concurrent writers do
        not queue on one row).
        """
        key = (kind, queue, state)
        self.tallies[key] = self.tallies.get(key, 0) + count

    def notify(self, channel: str) -> None:
        """Announce new work on ``channel`` once this transaction commits.

        Announcements are collected: each channel is emitted once per transaction, and only
        if the transaction commits.
        """
        self.channels.add(channel)

    def log(self, logger: logging.Logger, level: int, message: str, **fields: object) -> None:
        """Log ``message`` with ``fields`` (see ``postroom.log``) once this transaction commits.

        Nothing is kept when ``logger`` would drop the record; a transaction that rolls back
        (or is run again) logs nothing of what it did.
        """
        if logger.isEnabledFor(level):
            self.events.append((logger, level, message, fields))


@dataclass(frozen=True, slots=True)
class Check:
    """A condition a transaction must meet before its work runs: the first row of query
    ``query`` with ``params`` (``None`` if there is none), which ``judge(tx, row)`` accepts or
    refuses by raising. A dialect may read it together with the transaction's first
    statement (``Dialect.decision_time``), saving a round trip."""

    query: str
    params: Mapping[str, Any]
    judge: Callable[[Tx, Row | None], None]


#: The checks ``Database.checking`` asks every transaction of this context to pass first.
_CHECKS: ContextVar[tuple[Check, ...]] = ContextVar("postroom_checks", default=())


class Database:
    """A dialect plus the transaction discipline every postroom component shares."""

    def __init__(self, dialect: Dialect, *, clock: Clock | None = None,
                 track_time: bool = True) -> None:
        self.dialect = dialect
        self.clock: Clock = clock if clock is not None else dialect.default_clock()
        self._track_time = track_time

    @contextmanager
    def _open(self, *, write: bool) -> Iterator[Any]:
        """A connection inside a transaction; any failure rolls back, driver errors translated."""
        dialect = self.dialect
        with dialect.connection() as conn:
            try:
                dialect.begin(conn, write=write)
                yield conn
            except dialect.driver_error as exc:
                dialect.rollback(conn)
                raise dialect.translate(exc) from exc
            except BaseException:
                dialect.rollback(conn)
                raise

    @contextmanager
    def transaction(self, op: Write) -> Iterator[Tx]:
        """A write transaction named ``op``; see the module docstring."""
        dialect = self.dialect
        refused: Fenced | None = None
        with self._open(write=True) as conn:
            tx = Tx(conn, dialect, op)
            if op.timed:
                tx.now = (dialect.decision_time(tx, self.clock, _CHECKS.get())
                          if self._track_time
                          else finite_time(dialect.current_time(tx, self.clock)))
            try:
                yield tx
            except Fenced as exc:
                # Time refused the call (a lease or deadline ran out) and nothing was written:
                # commit that time like any decision's, then refuse.
                if exc.decided_at is None or tx.wrote or not self._track_time:
                    raise
                refused, tx.wrote = exc, True
            if tx.tallies:
                shard = dialect.clock_shard(tx)
                dialect.add_counts(tx, [
                    {"kind": kind, "queue": queue, "state": state, "shard": shard, "n": n}
                    for (kind, queue, state), n in sorted(tx.tallies.items())])
            if self._track_time:
                dialect.record_time(tx)
            dialect.before_commit(tx)
            faults.hit(op.before)
            dialect.commit(conn)
            dialect.after_commit(tx)
        for logger, level, message, fields in tx.events:
            log.event(logger, level, message, **fields)
        faults.hit(op.after)
        if refused is not None:
            raise refused

    def write(self, op: Write, work: Callable[[Tx], T]) -> T:
        """Run ``work(tx)`` in a write transaction named ``op`` and return its result.

        If the transaction fails with ``StoreUnavailable`` and the dialect says the failure
        left nothing behind (``retry_delay`` returns a delay), ``work`` runs again in a new
        transaction; ``work`` must therefore do nothing outside the transaction.
        """
        return self._retrying(lambda: self.transaction(op), work)

    def write_if(self, op: Write, due: Callable[[Tx], bool], work: Callable[[Tx], T], *,
                 otherwise: T) -> T:
        """``write(op, work)``, unless ``due`` finds nothing to do: then ``otherwise``.

        Where a write transaction locks the whole database (``Dialect.one_writer``: SQLite),
        ``due`` runs first in a read transaction, at the time the write would decide with
        (never below the high-water), and takes no lock a writer waits for: an idle worker's
        claim neither waits behind a writer nor holds other writers up. ``due`` is only a
        hint, so it must never say "nothing" when ``work`` would do something; ``work``
        decides everything again under the lock. Where writers do not exclude each other
        (PostgreSQL), the look would only cost a round trip, and ``write`` runs at once.
        """
        if self.dialect.one_writer and not self._retrying(
                lambda: self.reading(deciding=True), due):
            return otherwise
        return self.write(op, work)

    def write_batch(self, op: Write, bulk: Callable[[Tx], T], each: Callable[[Tx], T]) -> T:
        """Do a batch with ``bulk`` (a few statements for all items) or, failing that, ``each``.

        ``bulk`` raises ``NotAllApplied`` when a statement did not apply to every item, and
        its transaction rolls back; ``each`` then does the same work item by item in a new
        transaction, with the exact decisions and explanations of the single-item calls.
        Both must have the same effect when every item applies.
        """
        try:
            return self.write(op, bulk)
        except NotAllApplied:
            return self.write(op, each)

    def read(self, work: Callable[[Tx], T]) -> T:
        """Run ``work(tx)`` in a read transaction and return its result.

        A read changes nothing, so when its session is lost (a server restarting ends every
        session, the pooled ones included) it runs again on a new one, as ``write`` does for a
        write that committed nothing.
        """
        return self._retrying(self.reading, work)

    @contextmanager
    def checking(self, check: Check) -> Iterator[None]:
        """Within the block, every ``read``, ``write`` and ``write_if`` this context runs
        passes ``check`` first, in its own transaction: if its judge raises, the transaction
        rolls back, its work never runs, and the error propagates. Checks nest: the inner is
        judged last.
        """
        outer = _CHECKS.get()
        token = _CHECKS.set((*outer, check))
        try:
            yield
        finally:
            _CHECKS.reset(token)

    def _retrying(self, begin: Callable[[], AbstractContextManager[Tx]],
                  work: Callable[[Tx], T]) -> T:
        attempt = 0
        while True:
            try:
                with begin() as tx:
                    checks = _CHECKS.get()
                    if checks:
                        rows = tx.checked if tx.checked is not None else [
                            tx.one(check.query, **check.params) for check in checks]
                        for check, row in zip(checks, rows, strict=True):
                            check.judge(tx, row)
                    return work(tx)
            except StoreUnavailable as exc:
                delay = self.dialect.retry_delay(exc, attempt)
                if delay is None:
                    raise
                attempt += 1
                time.sleep(delay)

    @contextmanager
    def reading(self, *, deciding: bool = False) -> Iterator[Tx]:
        """A read-only transaction: one consistent snapshot, no fault points.

        ``deciding`` gives it the time a write transaction would decide with (the clock, but
        never below the high-water), for a read that tells whether a write has work.
        """
        with self._open(write=False) as conn:
            tx = Tx(conn, self.dialect, None)
            tx.now = (self.dialect.decision_time(tx, self.clock) if deciding and self._track_time
                      else finite_time(self.dialect.current_time(tx, self.clock)))
            yield tx
            self.dialect.rollback(conn)

    def migrate(self, component: str, *, target: int | None = None) -> int:
        """Create or upgrade ``component``'s schema; return its version.

        ``target`` stops at an older version (to test upgrades from it). Raises
        ``SchemaError`` if the database holds a newer version than this code knows.
        """
        dialect = self.dialect
        migrations = [(version, script) for version, script in dialect.migrations(component)
                      if target is None or version <= target]
        latest = migrations[-1][0] if migrations else 0
        with self._open(write=True) as conn:
            dialect.lock_migrations(conn)
            dialect.execute_script(conn, _SCHEMA_TABLE)
            cursor = dialect.execute(
                conn, dialect.convert(
                    "SELECT version FROM postroom_schema WHERE component = :component"),
                {"component": component})
            row = cursor.fetchone()
            current = int(row["version"]) if row is not None else 0
            if current > latest:
                raise SchemaError(
                    f"{component} schema is at version {current}; this postroom knows "
                    f"up to {latest}: upgrade postroom before opening this database")
            for version, script in migrations:
                if version > current:
                    dialect.execute_script(conn, script)
            if latest > current:
                dialect.execute(conn, dialect.convert(
                    "INSERT INTO postroom_schema (component, version) "
                    "VALUES (:component, :version) ON CONFLICT (component) "
                    "DO UPDATE SET version = excluded.version"),
                    {"component": component, "version": latest})
            faults.hit(_MIGRATE.before)
            dialect.commit(conn)
        faults.hit(_MIGRATE.after)
        return latest

    def schema_version(self, component: str) -> int:
        """The schema version of ``component`` in the database (0 if absent)."""
        try:
            with self.reading() as tx:
                cursor = tx.execute(
                    "SELECT version FROM postroom_schema WHERE component = :component",
                    {"component": component})
                row = cursor.fetchone()
        except StoreUnavailable:
            raise
        except PostroomError:  # no postroom_schema table: nothing of postroom's is here
            return 0
        return int(row["version"]) if row is not None else 0

    def schema_problem(self, component: str) -> str | None:
        """Why ``component``'s schema is not the version this postroom reads (``None`` when it
        is, or when the database has none): for a look that must not upgrade it."""
        found = self.schema_version(component)
        latest = self.dialect.migrations(component)[-1][0]
        if found in (0, latest):
            return None
        remedy = ((("postroom init" if component == "store" else "opening it with this postroom")
                   + " upgrades it") if found < latest else "use the postroom that wrote it")
        return f"version {found}, this postroom's is {latest}: {remedy}"

    def close(self) -> None:
        """Release the dialect's connections."""
        self.dialect.close()


_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS postroom_schema (
    component  TEXT PRIMARY KEY,
    version    INTEGER NOT NULL
);
"""
