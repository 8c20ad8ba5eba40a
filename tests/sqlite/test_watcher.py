"""Other processes' commits wake this store's waiters on SQLite too: the store's watcher.

While a thread waits, it asks ``PRAGMA data_version`` on a read-only connection of its own
when that thread begins and whenever the WAL file is written to (and every millisecond where
file events are unavailable), so it takes no lock a writer waits for; while nobody waits it
does not look. The version does not say what a commit announced, so another connection's
commit wakes every waiter; the store's own commits wake only their channels' waiters.
"""

from __future__ import annotations

import threading

import postroom
from postroom.db import sqlite_watcher
from tests.harness.children import spawn
from tests.sqlite.conftest import write_lock_held
from tests.support import envelope

#: A waiter's polling interval here: a ``wait`` that times out returns False, so True means
#: the watcher heard the commit.
POLL = 10.0


def watchers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if thread.name == "postroom-sqlite-watcher"]


def test_a_commit_from_another_process_wakes_waiters_of_every_queue(store, db_url):
    with spawn(1, store=db_url) as (child,):
        elsewhere = store.waiter(queues="elsewhere")
        child.call("receive", message_id="from-afar", queue="default")
        assert elsewhere.wait(timeout=POLL)  # a hint: it claims, and finds nothing
        assert store.claim("w", queues="elsewhere") is None


def test_a_waiter_hears_another_process_where_the_wal_file_gives_no_events(
        store, db_url, monkeypatch):
    class NoEvents:
        fd = -1

        def __init__(self, path: str) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(sqlite_watcher, "_WalWrites", NoEvents)
    with spawn(1, store=db_url) as (child,):
        waiter = store.waiter(queues="default")
        child.go("receive", message_id="from-afar")
        woke = waiter.wait(timeout=POLL)
        child.answer().unwrap()
        assert woke


def test_listening_takes_no_write_lock_and_hears_the_writer_that_held_it(store, db_url, path):
    with write_lock_held(path) as writer:
        waiter = store.waiter(queues="default")  # starts the watcher while the lock is held
        writer.execute("CREATE TABLE scratch (x)")
        writer.execute("COMMIT")
        assert waiter.wait(timeout=POLL)


def test_a_commit_made_while_nobody_waited_wakes_the_next_wait(store, db_url):
    waiter = store.waiter(queues="default")
    assert not waiter.wait(timeout=0.001)  # it waited, and the watcher went back to sleep
    with spawn(1, store=db_url) as (child,):
        child.call("receive", message_id="while-nobody-waited")
        assert waiter.wait(timeout=POLL)


def test_while_nobody_waits_the_watcher_does_not_follow_the_stores_commits(
        store, auth, monkeypatch):
    looks: list[int] = []
    ask = sqlite_watcher._data_version

    def counted(conn: object) -> int:
        looks.append(1)
        return ask(conn)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_watcher, "_data_version", counted)
    waiter = store.waiter(queues="default")  # the watcher runs from now on
    before = len(looks)
    for n in range(50):
        store.receive(auth, envelope(f"m-{n}"))  # each commit writes the WAL
    assert len(looks) == before
    assert waiter.wait(timeout=POLL)  # the store's own commits woke their channel's waiters


def test_closing_the_store_stops_its_watcher(db_url):
    before = len(watchers())
    store = postroom.open_store(db_url)
    store.waiter(queues="default")
    assert len(watchers()) == before + 1
    store.close()
    assert len(watchers()) == before
