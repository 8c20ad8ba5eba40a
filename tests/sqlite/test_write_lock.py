"""A write waits for another connection's write lock, looking again after short pauses.

SQLite's own busy handler sleeps 1, 2, 5, 10 ms and more between looks; postroom looks
again sooner (the lock is held for well under a millisecond by a postroom commit). A read
keeps the connection's busy timeout; a write's other statements run under the lock its
``BEGIN IMMEDIATE`` took, so they never wait.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import postroom
from postroom.db.sqlite import SQLiteDialect
from tests.sqlite.conftest import BUSY_TIMEOUT, write_lock_held
from tests.support import database_of, envelope


@contextmanager
def lock_held_for(path: Path, seconds: float) -> Iterator[None]:
    """Another connection, in a thread of its own, holds the write lock for ``seconds``."""
    taken = threading.Event()

    def hold() -> None:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(seconds)
            other.execute("ROLLBACK")

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    try:
        yield
    finally:
        holder.join()


def test_a_write_waits_for_another_connections_lock_and_goes_ahead_once_it_is_released(
        impatient_store, path, auth):
    impatient_store.receive(auth, envelope())
    with lock_held_for(path, BUSY_TIMEOUT / 4):
        claim = impatient_store.claim("w")  # waits for the lock, then takes the task
    assert claim is not None and impatient_store.task(claim.task_id).owner == "w"


def test_a_read_after_a_write_that_waited_has_the_connections_busy_timeout(
        impatient_store, path, auth):
    with lock_held_for(path, BUSY_TIMEOUT / 4):
        impatient_store.receive(auth, envelope())
    assert isinstance(database_of(impatient_store).dialect, SQLiteDialect)
    with database_of(impatient_store).reading() as tx:
        assert tx.execute("PRAGMA busy_timeout").fetchone()[0] == round(BUSY_TIMEOUT * 1000)


def test_a_write_lock_held_past_the_busy_timeout_is_store_unavailable_naming_the_file(
        impatient_store, path, auth):
    with write_lock_held(path):
        try:
            impatient_store.receive(auth, envelope())
        except postroom.StoreUnavailable as exc:
            assert str(path) in str(exc)
        else:
            raise AssertionError("the write went ahead while another connection held the lock")
