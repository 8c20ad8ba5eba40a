"""SQLite-only tests: what the embedded backend adds beyond the shared conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

import postroom
from postroom.db import Database
from postroom.db.sqlite import SQLiteDialect

#: A busy timeout short enough that a claim which does wait for the write lock fails fast.
BUSY_TIMEOUT = 0.2


@pytest.fixture
def backend() -> str:
    """Every test here runs on SQLite only."""
    return "sqlite"


@pytest.fixture
def path(db_url: str) -> Path:
    """The file of ``db_url`` (and of the ``store`` fixture)."""
    return Path(db_url.removeprefix("sqlite:///"))


@pytest.fixture
def impatient_store(path: Path, clock: postroom.ManualClock,
                    settings: postroom.Settings) -> Iterator[postroom.Store]:
    """A store that waits at most ``BUSY_TIMEOUT`` seconds for SQLite's write lock."""
    database = Database(SQLiteDialect(path, busy_timeout=BUSY_TIMEOUT), clock=clock)
    database.migrate("store")
    store = postroom.Store(database, settings=settings, seed=0)
    yield store
    store.close()


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holds the database's write lock (``BEGIN IMMEDIATE``) meanwhile,
    and rolls back at the end unless the test committed."""
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            yield other
        finally:
            if other.in_transaction:  # the test may have committed it
                other.execute("ROLLBACK")
