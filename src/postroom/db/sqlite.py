"""SQLite: the embedded backend (one host, WAL, ``synchronous=FULL``).

SQLite allows one writer at a time. Every write transaction starts with ``BEGIN IMMEDIATE``
so it takes the write lock before reading what it will decide on; that serializes decisions
(and makes the high-water mark a plain row) and never upgrades a read snapshot into a write,
which SQLite would refuse with ``SQLITE_BUSY`` without waiting.

Because that lock is the whole database's, a write that may well find nothing to do (an idle
worker's claim) looks first in a read transaction, which takes no lock a writer waits for
(``one_writer``). Other processes' commits reach this store's waiters through a watcher
thread (``listen``, see ``postroom.db.sqlite_watcher``).
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from postroom.db.dialect import Dialect
from postroom.db.sqlite_watcher import Watcher

__all__ = ["SQLiteDialect"]

#: The pauses between looks at a write lock held by another connection: short at first (a
#: commit holds it for well under a millisecond), then every 5 ms until the busy timeout.
_LOCK_PAUSES = (0.00005, 0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032)
_LOCK_PAUSE_AFTER = 0.005
_TRANSIENT_CODES = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517),
    getattr(sqlite3, "SQLITE_BUSY_RECOVERY", 261),
}

_UNIQUE_CODES = {
    getattr(sqlite3, "SQLITE_CONSTRAINT_UNIQUE", 2067),
    getattr(sqlite3, "SQLITE_CONSTRAINT_PRIMARYKEY", 1555),
}

_SYNCHRONOUS = {0: "off", 1: "normal", 2: "full", 3: "extra"}
_FULL = 2


class SQLiteDialect(Dialect):
    """A single SQLite database file, shared by threads through one locked connection."""

    name: ClassVar[str] = "sqlite"
    fragments: ClassVar[Mapping[str, str]] = {
        # Row locks are not needed: BEGIN IMMEDIATE already serializes every write
        # transaction.
        "skip_locked": "",
        "skip_locked_slots": "",
        "for_update": "",
        "for_share": "",
        # The claims are UPDATE ... RETURNING on tables with constraints. Under the default
        # ABORT, SQLite keeps a statement journal to undo a half-done statement, and its
        # buffer is allocated and freed around every claim; glibc hands it back to the
        # kernel each time, and faulting it in again cost a claim more than its SQL did.
        # Under FAIL, an error stops the statement where it is: never seen here, since a
        # failed statement fails its transaction, which Database rolls back whole.
        "or_fail": "OR FAIL",
        # The host's clock is the only clock there is.
        "server_time": "NULL",
        # Ids follow creation (see Dialect.ids_follow_creation): the newest task is the one
        # of the greatest id, and the table walked by id is the order of creation, its
        # created_at bounds turned into bounds on id by the caller.
        "newest_task_created": ("(SELECT (SELECT created_at FROM tasks ORDER BY id DESC "
                                "LIMIT 1) AS created_at)"),
        "tasks_newest_first": "tasks.id DESC",
        "tasks_walk": "tasks.id < :walk_below AND tasks.id > :walk_above AND",
        # NULL-safe equality.
        "same_as": "IS",
        # Append a new attempt to a row's history (a JSON array; the SET reads the row as it
        # was, so attempts + 1 and fence + 1 are the new attempt's), and close the last one.
        "history_open": ("json_insert(coalesce(history, '[]'), '$[#]', json_object("
                         "'attempt', attempts + 1, 'fence', fence + 1, 'owner', :owner, "
                         "'started_at', :now))"),
        "history_close": ("json_set(history, '$[#-1].ended_at', :now, '$[#-1].outcome', "
                          ":ended, '$[#-1].error', :last_error)"),
    }
    driver_error: ClassVar[type[BaseException]] = sqlite3.Error
    one_writer: ClassVar[bool] = True
    ids_follow_creation: ClassVar[bool] = True

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 busy_timeout: float = 30.0, cache_mib: int = 2) -> None:
        # A page cache of SQLite's own default size: the pages a claim or a finish walks
        # stay in it, the rest come from the OS's cache; a larger one only grows a long-lived
        # worker's memory with the file (64 MiB grew a worker's RSS by 26% over 100,000
        # tasks, and a dispatcher's 2.8x).
        self.path = str(path)
        self._read_only = read_only
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
        # Whether the connection's busy timeout is 0 (it is, from a write transaction's BEGIN
        # until the next read transaction's): set only when it changes, not twice per write.
        self._waits_itself = False
        self._watcher: Watcher | None = None
        self._watcher_lock = threading.Lock()
        try:
            self._conn = self._connect(cache_mib)
        except sqlite3.Error as exc:
            raise self.translate(exc) from exc

    def _connect(self, cache_mib: int) -> sqlite3.Connection:
        # Looking at a database (audit, info) must neither leave an empty file behind nor
        # change the file: read-only, and its journal mode stays as found.
        read_only = self._read_only
        target = f"{Path(self.path).resolve().as_uri()}?mode=ro" if read_only else self.path
        conn = sqlite3.connect(target, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False, uri=read_only)
        conn.row_factory = sqlite3.Row
        # Switching to WAL needs a moment of exclusive access; another process opening the
        # same new file at the same time may hold it, so wait for it like any other lock.
        deadline = time.monotonic() + self._busy_timeout
        while not read_only and conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in _TRANSIENT_CODES or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA cache_size = {-1024 * int(cache_mib)}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The store's connection, held exclusively by this thread for one transaction."""
        with self._lock:
            yield self._conn

    def begin(self, conn: sqlite3.Connection, *, write: bool) -> None:
        """``BEGIN IMMEDIATE`` for writes, a deferred snapshot for reads.

        A write waits for another process's write lock by looking again after a short pause
        (``_LOCK_PAUSES``, then every 5 ms), up to the busy timeout: SQLite's own
        busy handler sleeps 1, 2, 5, 10 ms and more between looks, many times as long as a
        postroom commit holds the lock, so two busy processes lost most of their time to it.
        SQLite's handler is therefore off (a busy timeout of 0) from a write's BEGIN until the
        next read's: the statements of a write hold the lock already and never wait, while a
        read may still have to wait (for another connection's recovery of the WAL, say).
        """
        if not write:
            if self._waits_itself:
                conn.execute(f"PRAGMA busy_timeout = {round(self._busy_timeout * 1000)}")
                self._waits_itself = False
            conn.execute("BEGIN")
            return
        if not self._waits_itself:
            conn.execute("PRAGMA busy_timeout = 0")
            self._waits_itself = True
        deadline = None
        for pause in itertools.chain(_LOCK_PAUSES, itertools.repeat(_LOCK_PAUSE_AFTER)):
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in _TRANSIENT_CODES:
                    raise
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self._busy_timeout
                if now + pause > deadline:
                    raise
            time.sleep(pause)

    def commit(self, conn: sqlite3.Connection) -> None:
        """Commit; with ``synchronous=FULL`` the WAL is on disk when this returns."""
        conn.execute("COMMIT")

    def rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back if a transaction is open."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def execute(self, conn: sqlite3.Connection, sql: str,
                params: Mapping[str, Any] | Sequence[Any]) -> sqlite3.Cursor:
        """Execute one statement."""
        return conn.execute(sql, params)

    def executemany(self, conn: sqlite3.Connection, sql: str,
                    rows: Sequence[Mapping[str, Any]]) -> int:
        """Execute one statement per parameter set; return how many rows they changed.

        Counted from the connection's total: the cursor's ``rowcount`` stays 0 for statements
        with ``RETURNING`` (the guarded ones).
        """
        before = conn.total_changes
        conn.executemany(sql, rows)
        return conn.total_changes - before

    def execute_script(self, conn: sqlite3.Connection, script: str) -> None:
        """Run a script statement by statement inside the open transaction.

        (``executescript`` would commit first, breaking the migration's atomicity.)
        """
        buffer = ""
        for line in script.splitlines(keepends=True):
            buffer += line
            if sqlite3.complete_statement(buffer):
                if buffer.strip():
                    conn.execute(buffer)
                buffer = ""
        if buffer.strip() and not buffer.strip().startswith("--"):
            conn.execute(buffer)

    def is_transient(self, exc: BaseException) -> bool:
        """Busy and locked (another connection holds the lock past the busy timeout)."""
        return getattr(exc, "sqlite_errorcode", None) in _TRANSIENT_CODES

    def is_unique_violation(self, exc: BaseException) -> bool:
        """A UNIQUE or PRIMARY KEY constraint failed."""
        return getattr(exc, "sqlite_errorcode", None) in _UNIQUE_CODES

    def describe(self, exc: BaseException) -> str:
        """``exc`` in one line, naming the database file."""
        return f"sqlite {self.path}: {exc}"

    def durability(self, conn: sqlite3.Connection) -> tuple[dict[str, str], list[str]]:
        """The journal mode and ``synchronous`` level of postroom's connection."""
        journal = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
        level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
        settings = {"journal_mode": journal, "synchronous": _SYNCHRONOUS.get(level, str(level))}
        warnings = []
        if level < _FULL:
            warnings.append(f"synchronous is {settings['synchronous']}: a power failure can "
                            "lose commits that were already acknowledged")
        return settings, warnings

    def explain(self, conn: sqlite3.Connection, sql: str,
                params: Mapping[str, Any]) -> list[str]:
        """``EXPLAIN QUERY PLAN`` lines."""
        return [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]

    def listen(self) -> None:
        """Start the store's watcher (once) and wait until it watches."""
        with self._watcher_lock:
            if self._watcher is None:
                self._watcher = Watcher(self.path, self.wakeups, self._own_version)
                self._watcher.start()
            watcher = self._watcher
        watcher.listening.wait(self._busy_timeout)

    def _own_version(self) -> int | None:
        """``data_version`` of the store's connection; ``None`` while another thread uses it."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the watcher, then close the connection."""
        with self._watcher_lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
        with self._lock:
            self._conn.close()
