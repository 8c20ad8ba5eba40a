"""How many pages a scenario's commits write: WAL frames, counted on SQLite."""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

from postroom._bench.context import BenchError
from postroom.db import Database
from postroom.db.sqlite import SQLiteDialect

__all__ = ["WalFrames"]

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
                raise BenchError("WAL frames are counted on SQLite only")
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
