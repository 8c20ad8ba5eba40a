"""PostgreSQL: one database shared by workers, dispatchers and services on many hosts.

psycopg 3 with a ``psycopg_pool`` connection pool. The rules are the shared named queries;
this module only supplies what PostgreSQL does differently:

**Claiming.** ``{skip_locked}`` becomes ``FOR UPDATE SKIP LOCKED``: a claim locks the head of
the partial index of claimable rows and skips rows another worker holds, then one guarded
``UPDATE ... RETURNING`` applies it. Sweeps lock (and skip) the same way, so two sweepers never
queue behind each other, and a row locked under READ COMMITTED is re-checked against its newest
version before it is returned (a lease renewed meanwhile is no longer "expired").

**Time.** The server's ``clock_timestamp()`` is the time authority (``ServerClock``), so hosts
with skewed clocks agree; tests pass a ``ManualClock`` instead. Decisions never go below the
persisted high-water, which is kept in ``_CLOCK_SHARDS`` clock rows of ``postroom_counts``
rather than one: a writing transaction advances only the row of its connection (``clock_shard``), so
workers do not queue on one hot row, while a decision reads the greatest of all rows. Why that
keeps "never earlier than a committed decision" under READ COMMITTED: the read of the rows and
of the server clock is the transaction's first statement, and a READ COMMITTED statement sees
every transaction that committed before it started. A decision D that committed earlier wrote
its time into some row before its COMMIT, so the greatest row already includes it and the new
decision time is at least D's. Transactions that overlap in time are concurrent: neither saw
the other's decision, and any row both touch is serialized by its row lock and re-checked by
the guarded statement, which compares against the row as the winner left it. A decision that
waits for a lock and then reads what the lock's holder wrote has seen that decision, though:
so after taking a lock that orders decisions (a wait's slot), or reading a row a later
decision may have written (a continuation), ``catch_up_time`` reads the rows again and raises
the transaction's time to them.

**Commits and retries.** A failure before COMMIT is sent rolls the whole transaction back
(the server discards an aborted or orphaned transaction), so it is ``StoreUnavailable`` and
``Database.run`` may run the work again: serialization failures, deadlocks, a session ended
by the server or a connection lost mid-transaction. A connection lost while COMMIT is in
flight is different: the server may have made the commit durable and lost only its reply, and
running the work again would apply it twice (a second claim of other tasks, a finish answered
``Fenced`` although it succeeded). So each write transaction notes its transaction id in its
last statement before COMMIT (which also records the high-water and emits the wake-ups, one
round trip for all three), and a lost COMMIT is looked up on a fresh connection with
``pg_xact_status``: committed means the work is done and its result is returned as usual;
aborted means nothing happened and it is ``StoreUnavailable`` (retried); still in progress is
asked again; and if the server cannot be asked in time, the caller gets ``OutcomeUnknown``,
which is never retried. The id is trusted only from the life of the server that gave it
(``_INCARNATION``, noted with the id): a crash forgets ids whose transactions left nothing
durable and hands them out again, so after one an id that reads as committed may be a
newcomer's, and that is ``OutcomeUnknown`` too (``lost_commit_fate``).

**Wake-ups.** ``Tx.notify`` channels are sent with ``pg_notify`` inside the transaction, once
per channel, so listeners hear of work only if it committed. A store has one NOTIFY channel,
named after its schema (two stores in one database do not wake each other), and the payload
names the postroom channel (a queue, or the replies). Each store has one listening
connection (started by the first ``Store.waiter``) that feeds the process's ``Wakeups`` hub;
after it (re)connects it wakes every waiter, because announcements made while it was deaf
are lost and only a poll can find their work. Debouncing happens at both ends: a transaction
emits a channel once however many tasks it made claimable, and a waiter woken by a burst of
announcements wakes once (the hub counts them; it does not queue them). Sending no more than
that matters: PostgreSQL serializes the commits of notifying transactions on one lock.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from postroom import log
from postroom.clock import Clock
from postroom.db import redacted_url
from postroom.db.dialect import Dialect, Row, T, first_line
from postroom.errors import (
    OutcomeUnknown,
    PostroomError,
    StoreError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from postroom.db.database import Check, Tx

__all__ = ["NETWORK", "PostgresDialect", "ServerClock", "durability_warnings",
           "lost_commit_fate", "missing_schema"]

#: Rows of the time high-water (the migration creates exactly these ids: 0 .. N-1).
_CLOCK_SHARDS = 64
#: Taken (with the schema's hash) by migrations, so that processes opening a fresh store
#: together create it once.
_MIGRATION_LOCK = 70_520_137
#: Server states that mean "this session is gone" rather than "this statement failed".
_SESSION_ENDED = {"57P01", "57P02", "57P03", "25P03"}

_log = log.get("postgres")

_PARAMETER = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|::|:([A-Za-z_]\w*)|%")


class ServerClock:
    """The PostgreSQL server's clock, the time authority of a shared store.

    Inside a transaction the store reads it in the same statement as the time high-water;
    ``now()`` asks the server on a connection of its own.
    """

    def __init__(self, dialect: PostgresDialect) -> None:
        self._dialect = dialect

    def now(self) -> float:
        """The server's current time in seconds since the Unix epoch."""
        dialect = self._dialect
        with dialect.connection() as session:
            try:
                row = _one(dialect.execute(session, _SERVER_NOW, None))
            except psycopg.Error as exc:
                raise dialect.translate(exc) from exc
            finally:
                dialect.rollback(session)
        return float(row["now"])

    def __repr__(self) -> str:
        return "ServerClock()"


_SERVER_NOW = "SELECT CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) AS now"
# Which life of the server a transaction id comes from. A restart changes the postmaster's
# start time; a crash of one server process makes the postmaster end every session and run
# crash recovery without restarting, and recovery discards the cumulative statistics, which
# stamps a new reset time on them (checked on PostgreSQL 15). A manual statistics reset
# looks the same: that only turns a lost COMMIT's answer into OutcomeUnknown, never a guess.
_INCARNATION = ("CAST(pg_postmaster_start_time() AS TEXT) || ' ' || "
                "coalesce(CAST(pg_stat_get_bgwriter_stat_reset_time() AS TEXT), '')")
_BEFORE_COMMIT = (
    "SELECT CAST(pg_current_xact_id_if_assigned() AS TEXT) AS xid, "
    f"{_INCARNATION} AS incarnation, "
    "(SELECT count(pg_notify(%(channel)s, payload)) "
    " FROM unnest(CAST(%(payloads)s AS TEXT[])) AS payload) AS notified")
# The same, after advancing the high-water row with the shared ``clock_advance`` statement
# and adding each tally with the shared ``counts_add`` (its parameters suffixed per row): the
# FROM clause runs them first, so the id read afterwards is the final one.
_ADVANCE = "advanced AS ({sql} RETURNING 1)"
_ADVANCED = "(SELECT count(*) AS advanced FROM advanced) AS clock"
_COUNT = "counted_{i} AS ({sql} RETURNING 1)"
_COUNTED = "(SELECT count(*) AS counted FROM counted_{i}) AS counts_{i}"
#: At most this many tallies ride on the statement before COMMIT (each a statement text of its
#: own length); a transaction with more adds them with a statement of their own.
_FOLDED_COUNTS = 4
#: A parameter of a statement already converted to psycopg's style.
_NAMED = re.compile(r"%\((\w+)\)s")

#: A peer that vanished (a host powered off, a network partition) is noticed within about a
#: minute rather than the operating system's hours: keepalive probes on idle connections (the
#: listener idles on one), and a bound on how long sent data may stay unacknowledged. A URL
#: that sets any of these keeps its own value.
NETWORK: dict[str, int] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                           "keepalives_count": 3, "tcp_user_timeout": 60_000}

_DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "autovacuum")
_DURABILITY_QUERY = "SELECT " + ", ".join(f"current_setting('{name}') AS {name}"
                                          for name in _DURABILITY_SETTINGS)


def durability_warnings(settings: Mapping[str, str]) -> list[str]:
    """One warning per PostgreSQL setting that weakens what postroom promises."""
    warnings = []
    if settings.get("fsync") == "off":
        warnings.append("fsync is off: a server crash can lose or corrupt commits that were "
                        "already acknowledged")
    if settings.get("synchronous_commit") == "off":
        warnings.append("synchronous_commit is off: a server crash can lose the last "
                        "commits that were already acknowledged")
    if settings.get("full_page_writes") == "off":
        warnings.append("full_page_writes is off: a crash in the middle of a page write can "
                        "corrupt the database")
    if settings.get("autovacuum") == "off":
        warnings.append("autovacuum is off: the dead row versions every claim and finish "
                        "leaves behind stay in the tables and indexes, which keep growing, "
                        "until someone runs VACUUM")
    return warnings


# What a lost COMMIT's transaction id tells, on a new connection: its status, whether the
# server crashed or restarted meanwhile, and whether the id has been handed out since then.
# (An id not handed out yet, which only a crash can cause, makes pg_xact_status raise: the
# CASE asks only about ids that were.)
_XACT_FATE = (
    "SELECT CASE WHEN assigned THEN pg_xact_status(CAST(%(xid)s AS xid8)) END, incarnation, "
    "assigned FROM (SELECT pg_snapshot_xmax(pg_current_snapshot()) > CAST(%(xid)s AS xid8) "
    f"AS assigned, {_INCARNATION} AS incarnation) AS server")


def lost_commit_fate(status: str | None, *, restarted: bool, assigned: bool) -> str:
    """``committed``, ``aborted``, ``in progress`` or ``ambiguous``: the fate of a transaction
    whose COMMIT was lost, from what the server reports about its id.

    Without a restart the id's status is the transaction's own. After a crash, every
    transaction of the old server is committed (its commit record was flushed, so recovery
    moved the id counter past it) or lost; a lost one's id may be handed out again. So an
    id not handed out yet, or one that is aborted or in progress, means ours is lost; one
    that reads as committed may be ours or a newcomer's, and no id lookup can tell which.
    """
    if status is None:
        return "aborted"
    if not restarted:
        return status
    if status == "committed" and assigned:
        return "ambiguous"
    return "aborted"


class _Session:
    """One pooled connection lent for one transaction, and what a lost COMMIT needs."""

    __slots__ = ("advance", "counts", "incarnation", "pg", "resolvable", "xid")

    def __init__(self, pg: psycopg.Connection[Any]) -> None:
        self.pg = pg
        self.advance: dict[str, Any] | None = None  # the high-water to record at commit
        self.counts: Sequence[Mapping[str, Any]] = ()  # the tallies to add at commit
        self.resolvable = False  # before_commit ran: ``xid`` is known (None: nothing written)
        self.xid: str | None = None
        self.incarnation: str | None = None  # the life of the server that gave ``xid``


class PostgresDialect(Dialect):
    """A PostgreSQL database reached through a pool of connections.

    ``max_size`` bounds this process's connections; ``idle_in_transaction_timeout`` is set on
    every postroom session so that a process frozen mid-transaction cannot hold row locks
    for longer (the server ends its session and its transaction rolls back).
    """

    name: ClassVar[str] = "postgres"
    fragments: ClassVar[Mapping[str, str]] = {
        "skip_locked": "FOR UPDATE SKIP LOCKED",
        # The slots of a limited queue, not the tasks outer-joined to them.
        "skip_locked_slots": "FOR UPDATE OF queue_slots SKIP LOCKED",
        "for_update": "FOR UPDATE",
        # Keeps a row from being pruned (deleted) while a transaction relies on it.
        "for_share": "FOR SHARE",
        # SQLite's statement-journal workaround (see sqlite.py); PostgreSQL needs none.
        "or_fail": "",
        "server_time": "CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)",
        # Ids are taken from a sequence by concurrent transactions, so they need not follow
        # creation: tasks_by_created keeps that order, and the newest task is its head.
        "newest_task_created": "(SELECT max(created_at) AS created_at FROM tasks)",
        "tasks_newest_first": "tasks.created_at DESC, tasks.id DESC",
        "tasks_walk": "",
        "same_as": "IS NOT DISTINCT FROM",
        # The history is text (like every JSON postroom keeps), edited as jsonb.
        "history_open": ("CAST(coalesce(CAST(history AS jsonb), '[]') || jsonb_build_array("
                         "jsonb_build_object('attempt', attempts + 1, 'fence', fence + 1, "
                         "'owner', CAST(:owner AS TEXT), 'started_at', "
                         "CAST(:now AS DOUBLE PRECISION))) AS TEXT)"),
        "history_close": ("CAST(jsonb_set(CAST(history AS jsonb), '{-1}', "
                          "(CAST(history AS jsonb) -> -1) || jsonb_build_object("
                          "'ended_at', CAST(:now AS DOUBLE PRECISION), "
                          "'outcome', CAST(:ended AS TEXT), "
                          "'error', CAST(:last_error AS TEXT))) AS TEXT)"),
    }
    driver_error: ClassVar[type[BaseException]] = psycopg.Error

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8,
                 connect_timeout: float = 10.0, idle_in_transaction_timeout: float = 60.0,
                 retries: int = 8, resolve_timeout: float = 30.0) -> None:
        self.url = url
        self._connect_timeout = connect_timeout
        self._idle_ms = max(1, int(idle_in_transaction_timeout * 1000))
        self._retries = retries
        self._resolve_timeout = resolve_timeout
        # The statement before COMMIT, by (advances the clock, tallies it adds).
        self._before_commit_texts: dict[tuple[bool, int], str] = {}
        self._listener: _Listener | None = None
        self._listener_lock = threading.Lock()
        # The pool logs each failed connection attempt: an operator's business, through
        # postroom's loggers, not stray lines on stderr.
        log.route("psycopg.pool", "pool")
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, timeout=connect_timeout,
            name="postroom", configure=self._configure,
            kwargs=self.connect_options(row_factory=dict_row, autocommit=False,
                                        application_name="postroom"))
        # One direct connection first: the pool only logs why it cannot connect, and would
        # wait the whole timeout for an address that no wait will mend.
        started = time.monotonic()
        reason = _refusal(url, connect_timeout)
        if any(words in reason for words in _WRONG_ADDRESS):
            raise StoreError(f"postgres: cannot connect to {redacted_url(url)}{reason}")
        try:
            self._pool.open(wait=True, timeout=max(1.0, connect_timeout - (
                time.monotonic() - started)))
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"postgres: no connection to {redacted_url(url)} within "
                                   f"{connect_timeout:g}s{reason or _refusal(url, 1)}"
                                   ) from exc
        try:
            with self.connection() as session:
                found = _one(self.execute(session, _SCHEMA, None))
                self.rollback(session)
            schema = found["name"]
            if schema is None:
                raise StoreError(missing_schema(str(found["search_path"]),
                                                str(found["role"])))
        except BaseException:
            self._pool.close()
            raise
        #: The NOTIFY channel of this store (PostgreSQL caps names at 63 bytes).
        self.channel = ("postroom." + schema).encode()[:63].decode(errors="ignore")

    def connect_options(self, **options: Any) -> dict[str, Any]:
        """Keyword arguments for a connection of this store: ``options``, the connect timeout,
        and the network settings of ``NETWORK`` that the URL does not set itself."""
        given = conninfo_to_dict(self.url)
        return {"connect_timeout": max(1, int(self._connect_timeout)),
                **{name: value for name, value in NETWORK.items() if name not in given},
                **options}

    def _configure(self, pg: psycopg.Connection[Any]) -> None:
        pg.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                   [str(self._idle_ms)])
        pg.commit()

    # -- connections and transactions ---------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[_Session]:
        """A pooled connection for one transaction; left clean (or discarded) afterwards.

        As with a psycopg connection, a transaction still open when the block ends is
        committed on a clean exit and rolled back on an error.
        """
        try:
            pg = self._pool.getconn()
        except PoolTimeout as exc:
            raise StoreUnavailable(f"postgres: no connection within "
                                   f"{self._connect_timeout:g}s: {exc}") from exc
        if pg.read_only:  # left by a read transaction; statements outside ``begin`` may write
            pg.read_only = False
        session = _Session(pg)
        try:
            yield session
            status = pg.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INTRANS:
                self.commit(session)
            elif status == psycopg.pq.TransactionStatus.INERROR:
                self.rollback(session)
        except BaseException:
            self.rollback(session)
            raise
        finally:
            self._pool.putconn(pg)

    def begin(self, conn: _Session, *, write: bool) -> None:
        """Writes run at READ COMMITTED; reads get one REPEATABLE READ read-only snapshot.

        psycopg sends BEGIN with these settings before the first statement.
        """
        conn.resolvable = False
        conn.xid = None
        conn.incarnation = None
        conn.advance = None
        pg = conn.pg
        pg.isolation_level = (psycopg.IsolationLevel.READ_COMMITTED if write
                              else psycopg.IsolationLevel.REPEATABLE_READ)
        pg.read_only = not write

    def record_time(self, tx: Tx) -> None:
        """Note the time to record; ``before_commit`` records it (saving a round trip)."""
        session: _Session = tx.conn
        session.advance = ({"now": tx.now, "shard": self.clock_shard(tx)}
                           if self.time_to_record(tx) else None)

    def add_counts(self, tx: Tx, rows: Sequence[Mapping[str, Any]]) -> None:
        """A few tallies are added by ``before_commit``'s statement (a round trip saved)."""
        if len(rows) > _FOLDED_COUNTS:
            super().add_counts(tx, rows)
            return
        session: _Session = tx.conn
        session.counts = rows
        tx.wrote = True

    def before_commit(self, tx: Tx) -> None:
        """Record the high-water, add the tallies, emit the wake-ups and note the transaction
        id: one statement.

        A transaction that wrote nothing has nothing to lose if its COMMIT is lost; one that
        wrote has an id, by which ``commit`` can learn its fate.
        """
        session: _Session = tx.conn
        counts, session.counts = session.counts, ()
        if tx.wrote or tx.channels or session.advance:
            params = {"channel": self.channel, "payloads": sorted(tx.channels)}
            if session.advance:
                params.update(session.advance)
            for i, row in enumerate(counts):
                params.update({f"{name}_{i}": value for name, value in row.items()})
            sql = self._before_commit_sql(session.advance is not None, len(counts))
            row = _one(self.execute(session, sql, params))
            session.xid, session.incarnation = row["xid"], row["incarnation"]
        session.resolvable = True

    def _before_commit_sql(self, advance: bool, counts: int) -> str:
        key = (advance, counts)
        sql = self._before_commit_texts.get(key)
        if sql is None:
            ctes, sources = [], []
            if advance:
                ctes.append(_ADVANCE.format(sql=self.queries["clock_advance"].sql))
                sources.append(_ADVANCED)
            add = self.queries["counts_add"].sql
            for i in range(counts):
                ctes.append(_COUNT.format(i=i, sql=_NAMED.sub(rf"%(\1_{i})s", add)))
                sources.append(_COUNTED.format(i=i))
            sql = _BEFORE_COMMIT
            if ctes:
                sql = f"WITH {', '.join(ctes)} {sql} FROM {', '.join(sources)}"
            self._before_commit_texts[key] = sql
        return sql

    def commit(self, conn: _Session) -> None:
        """Commit; a connection lost during COMMIT is resolved, never guessed (see the module)."""
        try:
            conn.pg.commit()
        except psycopg.Error as exc:
            if not _session_lost(conn.pg, exc):
                raise  # the server refused the commit and rolled back: translated upstream
            self._resolve_lost_commit(conn, exc)

    def _resolve_lost_commit(self, conn: _Session, exc: psycopg.Error) -> None:
        self._discard_broken()
        try:
            self._resolve(conn, exc)
        except OutcomeUnknown as unknown:
            log.event(_log, logging.WARNING, "lost COMMIT: outcome unknown", xid=conn.xid,
                      last_error=str(unknown))
            raise
        except StoreUnavailable as aborted:
            log.event(_log, logging.INFO, "lost COMMIT resolved: not committed, to be retried",
                      xid=conn.xid, last_error=str(aborted))
            raise
        log.event(_log, logging.INFO, "lost COMMIT resolved: committed", xid=conn.xid,
                  last_error=first_line(exc))

    def _resolve(self, conn: _Session, exc: psycopg.Error) -> None:
        if not conn.resolvable:
            raise OutcomeUnknown(f"postgres: connection lost during COMMIT: {exc}") from exc
        if conn.xid is None:
            raise StoreUnavailable(f"postgres: connection lost during COMMIT of a transaction "
                                   f"that wrote nothing: {exc}") from exc
        deadline = time.monotonic() + self._resolve_timeout
        delay = 0.05
        while True:
            status = self._transaction_status(conn.xid, conn.incarnation)
            if status == "committed":
                return
            if status == "aborted":
                raise StoreUnavailable(f"postgres: connection lost during COMMIT; transaction "
                                       f"{conn.xid} did not commit: {exc}") from exc
            if status == "ambiguous":
                raise OutcomeUnknown(
                    f"postgres: connection lost during COMMIT of transaction {conn.xid}, and "
                    f"the server crashed or restarted since: the id reads as committed, but "
                    f"after a crash it may belong to a later transaction") from exc
            # "in progress" (the old session is still finishing) or the server is unreachable
            if time.monotonic() + delay > deadline:
                raise OutcomeUnknown(
                    f"postgres: connection lost during COMMIT of transaction {conn.xid}; its "
                    f"outcome could not be learned within {self._resolve_timeout:g}s "
                    f"(last status: {status or 'server unreachable'})") from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _transaction_status(self, xid: str, incarnation: str | None) -> str | None:
        try:
            with psycopg.connect(self.url, **self.connect_options(autocommit=True)) as probe:
                row = probe.execute(_XACT_FATE, {"xid": xid}).fetchone()
        except psycopg.Error:
            return None
        assert row is not None
        status, now_serving, assigned = row
        # NULL also means an id too old to be known: far older than a commit just sent.
        return lost_commit_fate(None if status is None else str(status),
                                restarted=now_serving != incarnation, assigned=bool(assigned))

    def rollback(self, conn: _Session) -> None:
        """Roll back if a transaction is open; a dead connection is left for the pool to drop."""
        pg = conn.pg
        if pg.broken or pg.closed:
            self._discard_broken()
            return
        try:
            pg.rollback()
        except psycopg.Error:
            self._discard_broken()

    def _discard_broken(self) -> None:
        # One lost connection usually means the server restarted or ended our sessions: test
        # the idle ones now, so the next transactions do not each find a dead one.
        with contextlib.suppress(psycopg.Error):
            self._pool.check()

    def execute(self, conn: _Session, sql: str,
                params: Mapping[str, Any] | Sequence[Any] | None) -> psycopg.Cursor[Any]:
        """Execute one statement (parameters in psycopg's ``%(name)s`` / ``%s`` style)."""
        return conn.pg.execute(sql, params)

    def executemany(self, conn: _Session, sql: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Execute one statement for many parameter sets (pipelined by psycopg).

        Returns how many rows they changed: psycopg sums ``rowcount`` over the executions.
        """
        with conn.pg.cursor() as cursor:
            cursor.executemany(sql, rows)
            return max(cursor.rowcount, 0)

    def execute_returning(self, conn: _Session, sql: str,
                          rows: Sequence[Mapping[str, Any]]) -> list[Row | None]:
        """One statement per parameter set, pipelined (one round trip for all of them)."""
        found: list[Row | None] = []
        with conn.pg.cursor() as cursor:
            cursor.executemany(sql, rows, returning=True)
            while True:
                found.append(cursor.fetchone())
                if not cursor.nextset():
                    break
        return found

    def execute_script(self, conn: _Session, script: str) -> None:
        """Run a schema script inside the open transaction (one simple-protocol message)."""
        conn.pg.execute(script)

    def lock_migrations(self, conn: _Session) -> None:
        """Serialize migrations of this database (held until the transaction ends)."""
        conn.pg.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))",
                        [_MIGRATION_LOCK])

    def convert(self, sql: str) -> str:
        """``:name`` becomes ``%(name)s`` and a literal ``%`` becomes ``%%``.

        Quoted strings, quoted identifiers, comments and ``::`` casts are left alone.
        """

        def replace(match: re.Match[str]) -> str:
            text = match.group(0)
            if match.group(1) is not None:
                return f"%({match.group(1)})s"
            return text.replace("%", "%%")

        return _PARAMETER.sub(replace, sql)

    def explain(self, conn: _Session, sql: str, params: Mapping[str, Any]) -> list[str]:
        """``EXPLAIN`` lines (the plan for these parameter values; nothing is run)."""
        cursor = conn.pg.execute("EXPLAIN " + sql, params)
        return [str(row["QUERY PLAN"]) for row in cursor.fetchall()]

    # -- errors ---------------------------------------------------------------------------------

    def durability(self, conn: _Session) -> tuple[dict[str, str], list[str]]:
        """The server's settings for commits, crash safety and vacuuming, as seen by a
        postroom session (``synchronous_commit`` can differ per session or role)."""
        row = _one(self.execute(conn, _DURABILITY_QUERY, None))
        settings = {name: str(row[name]) for name in _DURABILITY_SETTINGS}
        return settings, durability_warnings(settings)

    def is_transient(self, exc: BaseException) -> bool:
        """Sessions lost, serialization failures, deadlocks and lock timeouts (raised before
        COMMIT, so nothing was committed)."""
        return (isinstance(exc, psycopg.OperationalError)
                or getattr(exc, "sqlstate", None) in _SESSION_ENDED)

    def is_unique_violation(self, exc: BaseException) -> bool:
        """SQLSTATE 23505."""
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def confirm_locked(self, rows: list[T], still: Callable[[T], bool]) -> list[T]:
        """Under READ COMMITTED a locking statement chooses rows from its snapshot and then
        locks them; what committed meanwhile is seen only by a new statement: ask each row
        again."""
        return [row for row in rows if still(row)]

    def retry_delay(self, exc: PostroomError, attempt: int) -> float | None:
        """Retry a failure that committed nothing, with jittered exponential backoff.

        ``StoreUnavailable`` is only raised when nothing was committed: a statement failed
        (the whole transaction rolled back with it), the session was lost before COMMIT was
        sent, or a lost COMMIT was looked up and found aborted. Running the work again cannot
        apply anything twice. A lost COMMIT whose fate is unknown is ``OutcomeUnknown`` and
        is not retried; nor is waiting for a connection that the pool could not make in time.
        """
        if not isinstance(exc, StoreUnavailable) or attempt >= self._retries:
            return None
        if isinstance(exc.__cause__, PoolTimeout):
            return None
        ceiling = min(2.0, 0.02 * 2.0**attempt)
        return ceiling * (0.5 + random.random() / 2)

    # -- time -----------------------------------------------------------------------------------

    def default_clock(self) -> Clock:
        """The server's clock: every host decides with the same time."""
        return ServerClock(self)

    def clock_read(self, tx: Tx, checks: Sequence[Check]) -> Row | None:
        """The ``clock_read`` row, with the first row of each check's query (as JSON, in
        ``tx.checked``) read by the same statement: one round trip where each would be one."""
        if not checks:
            return tx.one("clock_read")
        names = tuple(check.query for check in checks)
        params: dict[str, Any] = {}
        for check in checks:
            if params.keys() & check.params.keys():  # two checks name one parameter alike
                return tx.one("clock_read")
            params.update(check.params)
        statement = self._clock_reads.get(names)
        if statement is None:
            checked = ", ".join(
                f"(SELECT row_to_json(q) FROM ({self.queries[name].sql}) AS q LIMIT 1) "
                f"AS check_{n}" for n, name in enumerate(names))
            statement = self._clock_reads[names] = (
                f"SELECT clock.*, {checked} FROM ({self.queries['clock_read'].sql}) AS clock")
        row = _one(self.execute(tx.conn, statement, params))
        tx.checked = [row[f"check_{n}"] for n in range(len(checks))]
        return row

    @cached_property
    def _clock_reads(self) -> dict[tuple[str, ...], str]:
        """The statement ``clock_read`` with checks, by the checks' query names."""
        return {}

    def source_time(self, clock: Clock, row: Row | None) -> float:
        """The server time read with the high-water, unless the store was given a clock."""
        if isinstance(clock, ServerClock) and row is not None:
            return float(row["server_now"])
        return clock.now()

    def current_time(self, tx: Tx, clock: Clock) -> float:
        """The server's time, read on the transaction's own connection."""
        if isinstance(clock, ServerClock):
            return float(_one(self.execute(tx.conn, _SERVER_NOW, None))["now"])
        return clock.now()

    def catch_up_time(self, tx: Tx) -> None:
        """Raise ``tx.now`` to the high-water committed since ``tx`` took its time."""
        row = tx.one("clock_read")
        if row is not None and row["high_water"] is not None:
            committed = float(row["high_water"])
            tx.now = max(tx.now, committed)
            tx.high_water = max(tx.high_water, committed)

    def clock_shard(self, tx: Tx) -> int:
        """The high-water row of this connection's server process (stable per connection)."""
        return int(tx.conn.pg.info.backend_pid) % _CLOCK_SHARDS

    # -- wake-ups -------------------------------------------------------------------------------

    def listen(self) -> None:
        """Start the store's listening connection (once) and wait until it listens."""
        with self._listener_lock:
            if self._listener is None:
                self._listener = _Listener(self)
                self._listener.start()
            listener = self._listener
        listener.listening.wait(self._connect_timeout)

    def close(self) -> None:
        """Stop listening and close the pool."""
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
        self._pool.close()


class _Listener(threading.Thread):
    """Hears the store's NOTIFY channel on a connection of its own; feeds the wake-up hub."""

    _POLL = 0.25  # how often the loop looks at its stop flag
    _PROBE = 5.0  # how often an idle connection is proven alive

    def __init__(self, dialect: PostgresDialect) -> None:
        super().__init__(name="postroom-listener", daemon=True)
        self._dialect = dialect
        self._stopping = threading.Event()
        self.listening = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5 * self._POLL)

    def run(self) -> None:
        hub = self._dialect.wakeups
        delay = 0.05
        deaf_since: str | None = None  # why the listener last lost (or never got) its session
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._dialect.url, **self._dialect.connect_options(
                        autocommit=True, application_name="postroom-listener")) as pg:
                    pg.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._dialect.channel)))
                    delay = 0.05
                    if deaf_since is not None:
                        log.event(_log, logging.INFO, "listener reconnected",
                                  last_error=deaf_since)
                        deaf_since = None
                    self.listening.set()
                    hub.announce_all()  # whatever was announced while we were deaf
                    self._hear(pg)
            except psycopg.Error as exc:
                if deaf_since is None and not self._stopping.is_set():
                    log.event(_log, logging.WARNING, "listener disconnected; waiters poll "
                              "until it reconnects", last_error=first_line(exc))
                deaf_since = first_line(exc)
            # Not listening: waiters fall back to polling until we are back.
            self._stopping.wait(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, 2.0)

    def _hear(self, pg: psycopg.Connection[Any]) -> None:
        hub = self._dialect.wakeups
        probed = time.monotonic()
        while not self._stopping.is_set():
            heard = False
            for note in pg.notifies(timeout=self._POLL):
                hub.announce((note.payload,))  # at once: a waiter may be idle right now
                heard = True
            if not heard and time.monotonic() - probed > self._PROBE:
                pg.execute("SELECT 1")  # a dead server shows up here, not as silence
                probed = time.monotonic()


#: The schema a store's tables live in: the first schema of ``search_path`` that exists, or
#: NULL when none does (what the schema is then missing from is in the other two columns).
_SCHEMA = ("SELECT current_schema() AS name, current_setting('search_path') AS search_path, "
           "CAST(current_user AS TEXT) AS role")
_SEARCH_PATH_ENTRY = re.compile(r'\s*("(?:[^"]|"")*"|[^,]*?)\s*(?:,|$)')


def missing_schema(search_path: str, role: str) -> str:
    """Why a store cannot open when no schema of ``search_path`` exists, and the remedy.

    ``$user`` stands for ``role``; unquoted names are folded to lower case, as PostgreSQL
    reads them.
    """
    names = []
    for match in _SEARCH_PATH_ENTRY.finditer(search_path):
        entry = match.group(1)
        if not entry:
            continue
        if entry.startswith('"'):
            entry = entry[1:-1].replace('""', '"')
            names.append(role if entry == "$user" else entry)
        else:
            names.append(role if entry == "$user" else entry.lower())
    if not names:
        return ("search_path is empty, so there is no schema for the store's tables: name "
                "one with ?options=-csearch_path%3Dname")
    quoted = [_quoted(name) for name in dict.fromkeys(names)]
    if len(quoted) == 1:
        return (f"schema {quoted[0]} in search_path does not exist: create it with "
                f"CREATE SCHEMA {quoted[0]}")
    return (f"no schema in search_path exists ({', '.join(quoted)}): create the first with "
            f"CREATE SCHEMA {quoted[0]}")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _one(cursor: psycopg.Cursor[Any]) -> Row:
    row: Row | None = cursor.fetchone()
    if row is None:  # pragma: no cover - every caller's statement returns one row
        raise StoreError("postgres: expected a row, got none")
    return row


def _session_lost(pg: psycopg.Connection[Any], exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None)
    return bool(pg.broken or pg.closed or state in _SESSION_ENDED
                or (state is not None and state.startswith("08")))


def _refusal(url: str, timeout: float) -> str:
    """Why one direct connection fails (the pool only logs it), as ``": <reason>"``."""
    try:
        psycopg.connect(url, connect_timeout=max(1, int(timeout))).close()
    except psycopg.Error as exc:
        return f": {' '.join(str(exc).split())}"
    return ""


#: libpq's words for an address that no wait will mend (a server that is down or starting
#: up, or full, may answer later; a database or role that does not exist will not).
_WRONG_ADDRESS = ("does not exist", "authentication failed", "no pg_hba.conf entry",
                  "connection is bad: invalid", "invalid connection option")

