"""How many pages a scenario's commits write: WAL frames, counted on SQLite; and, per
commit, the WAL (frames on SQLite, bytes on PostgreSQL), statements and round trips."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

from postroom._bench.context import BenchError
from postroom.db import Database
from postroom.db.sqlite import SQLiteDialect

__all__ = ["Commit", "CommitCosts", "WalFrames"]

_WAL_HEADER = 32
_FRAME_HEADER = 24


class WalFrames:
    """WAL frames appended to SQLite databases while the block runs.

    A diagnostic for an extra, untimed round. Each database's WAL is checkpointed and emptied
    first, and automatic checkpoints are held off during the block so that the WAL only
    grows: its size at the end counts every frame (one page each) that the block's commits
    wrote. Afterwards the automatic checkpoint is restored and the WAL emptied again.
    """

    def __init__(self, databases: list[Database]) -> None:
        self._dialects: list[SQLiteDialect] = []
        for database in databases:
            if not isinstance(database.dialect, SQLiteDialect):
                raise BenchError("WAL frames are counted on SQLite only")  # see CommitCosts
            self._dialects.append(database.dialect)
        self._restore = ExitStack()
        self.frames = 0

    def __enter__(self) -> WalFrames:
        with ExitStack() as undo:  # a database that fails leaves the others as they were
            for dialect in self._dialects:
                with dialect.connection() as conn:
                    _truncate(conn, dialect.path)
                    saved = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
                    conn.execute("PRAGMA wal_autocheckpoint = 0")
                undo.callback(_restore, dialect, saved)
            self._restore = undo.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._restore:  # every database is restored, even if one fails
            for dialect in self._dialects:
                with dialect.connection() as conn:
                    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                    size = os.path.getsize(dialect.path + "-wal")
                    if size:
                        self.frames += (size - _WAL_HEADER) // (page + _FRAME_HEADER)


def _restore(dialect: SQLiteDialect, saved: int) -> None:
    with dialect.connection() as conn:
        conn.execute(f"PRAGMA wal_autocheckpoint = {saved}")
        _truncate(conn, dialect.path)


def _truncate(conn: Any, path: str) -> None:
    busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    if busy:
        raise BenchError(f"{path}: the WAL could not be checkpointed (another connection "
                         "is reading it), so its frames cannot be counted")


@dataclass(frozen=True)
class Commit:
    """One commit seen by ``CommitCosts``: which database, the WAL it appended (frames on
    SQLite, bytes on PostgreSQL), and the statements and round trips since the previous
    commit on that database; and the time since the previous commit on any of them (the
    step's), of which so much was spent in the COMMIT (and the fsync it waits for) and so
    much in the other calls into the driver (the rest is Python)."""

    database: str
    wal: float
    statements: int
    round_trips: int
    seconds: float = 0.0
    in_commit: float = 0.0
    in_statements: float = 0.0


class CommitCosts:
    """Every commit of the named databases while the block runs, with what it cost.

    A diagnostic for an extra, untimed round (a counting hook used only by the bench): it
    wraps the dialects' methods on their instances, as ``DriverTime`` does, and counts at
    the driver. A statement is one SQL statement (``BEGIN``, each ``execute``, each parameter
    set of an ``executemany``, ``COMMIT``); a round trip is one wait for the database: the
    ``BEGIN`` (sent by psycopg ahead of the first statement), each ``execute``, each
    ``executemany`` (pipelined by psycopg on PostgreSQL, one call to SQLite), the
    ``COMMIT``. The WAL is read after each commit: on SQLite from the WAL file's size (with
    automatic checkpoints held off, as ``WalFrames`` does), on PostgreSQL as the difference
    of ``pg_current_wal_lsn()`` read on a connection of its own (the server's whole WAL:
    another client's writes in between count too, so take a median over many commits).
    """

    def __init__(self, databases: dict[str, Database]) -> None:
        self._databases = databases
        self.commits: list[Commit] = []
        self._stack = ExitStack()
        self._counts: dict[str, list[int]] = {}
        self._wal: dict[str, Callable[[], float]] = {}
        # Since the previous commit (of any database): when it ended, and the time spent
        # in statements. Reading the WAL after a commit is left out of the next step's time.
        self._mark = time.perf_counter()
        self._in_statements = 0.0

    def __enter__(self) -> CommitCosts:
        with ExitStack() as stack:
            for name, database in self._databases.items():
                dialect = database.dialect
                self._counts[name] = [0, 0]
                if isinstance(dialect, SQLiteDialect):
                    stack.enter_context(WalFrames([database]))
                    with dialect.connection() as conn:  # not from inside a commit: it holds it
                        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                    self._wal[name] = _Growth(partial(_frames_in_wal, dialect.path, page))
                else:
                    self._wal[name] = _lsn_reader(stack, dialect)
                for method in _COUNTED:
                    setattr(dialect, method, self._counted(name, getattr(dialect, method),
                                                           method))
                stack.callback(_unwrap, dialect)
            self._stack = stack.pop_all()
        for name in self._databases:
            self._wal[name]()  # the starting point of each database's WAL
        self._mark = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _counted(self, name: str, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
        counts = self._counts[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = method(*args, **kwargs)
            end = time.perf_counter()
            statements = len(args[2]) if kind in {"executemany", "execute_returning"} else 1
            counts[0] += statements
            counts[1] += 1
            if kind != "commit":
                self._in_statements += end - start
                return result
            self.commits.append(Commit(name, self._wal[name](), counts[0], counts[1],
                                       seconds=end - self._mark, in_commit=end - start,
                                       in_statements=self._in_statements))
            counts[0] = counts[1] = 0
            self._in_statements = 0.0
            self._mark = time.perf_counter()
            return result

        return counted


_COUNTED = ("begin", "execute", "executemany", "execute_returning", "commit")


def _unwrap(dialect: Any) -> None:
    for method in _COUNTED:
        if method in vars(dialect):
            delattr(dialect, method)  # the class's method again


class _Growth:
    """The growth of a counter between calls: the first call sets the starting point."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self._last: float | None = None

    def __call__(self) -> float:
        now = self._read()
        grown = 0.0 if self._last is None else now - self._last
        self._last = now
        return grown


def _frames_in_wal(path: str, page: int) -> float:
    size = os.path.getsize(path + "-wal")
    return float((size - _WAL_HEADER) // (page + _FRAME_HEADER)) if size else 0.0


def _lsn_reader(stack: ExitStack, dialect: Any) -> Callable[[], float]:
    import psycopg

    conn = stack.enter_context(psycopg.connect(dialect.url, autocommit=True))
    return _Growth(lambda: float(conn.execute(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]))  # type: ignore[index]
