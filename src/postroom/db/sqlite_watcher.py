"""Hearing other processes' commits on SQLite: one watcher thread per store.

SQLite has no NOTIFY. It has ``PRAGMA data_version``, whose value on a connection changes
whenever *another* connection committed since that connection last looked; asking costs a
look at the WAL index in shared memory, and takes no lock a writer would wait for. So the
store's watcher holds a read-only connection of its own and, while some thread of the
process waits for work (``Wakeups.waited``), asks:

- at once when the first waiter begins to wait: whatever was committed while nobody waited
  changed the version since the watcher last asked, so it wakes that waiter;
- right after the WAL file is written to, then every millisecond for a short while (Linux,
  through inotify: a commit's pages reach the WAL before its fsync and before it becomes
  visible, so a write is only the warning that a commit is coming);
- every ``IDLE`` seconds besides, a net under anything the file events missed (a commit
  whose fsync took longer than ``WINDOW``);
- every millisecond where there are no file events (not Linux, or inotify unavailable):
  2-5% of a core on the busy 2-vCPU VM it was measured on, nearly all of it the cost of
  waking a thread a thousand times a second, against under 0.1% with file events.

While nobody waits the watcher sleeps, file events and all: a busy worker, which claims
without waiting, would otherwise have it follow every one of its own commits (each one
writes the WAL), about a sixth of that worker's CPU on the 2-CPU machine it was measured on.

A changed version wakes every waiter of the store (``announce_all``): it does not say which
channels the commit announced, and a wake-up is a hint the caller checks by claiming. Except
for the store's own commits, which have already woken their waiters, precisely
(``Dialect.after_commit``): the watcher tells them apart by the store's own connection,
whose ``data_version`` changes only for other connections' commits. (When that connection is
busy in a transaction the watcher cannot ask, and wakes everyone.)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from postroom import log
from postroom.db.wakeups import Wakeups

__all__ = ["Watcher"]

_log = log.get("sqlite")

#: How often the version is asked while a commit may be landing (or without file events).
HOT = 0.001
#: How long after the WAL was last written to the watcher keeps asking every ``HOT``.
WINDOW = 0.05
#: How often the version is asked otherwise.
IDLE = 0.25

_IN_MODIFY = 0x2
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_IGNORED = 0x8000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class _WatchLost(Exception):
    """The WAL file the watch was on is gone (deleted, renamed, or its file system unmounted)."""


class _WalWrites:
    """Writes to one file, as Linux inotify reports them; ``fd`` is -1 where it cannot."""

    def __init__(self, path: str) -> None:
        self.fd = -1
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        except (OSError, AttributeError):
            return
        if fd < 0:  # e.g. the user's limit of inotify instances is reached
            return
        watch = int(libc.inotify_add_watch(
            fd, os.fsencode(path), _IN_MODIFY | _IN_DELETE_SELF | _IN_MOVE_SELF))
        if watch < 0:  # e.g. no WAL file: the database is not in WAL mode
            os.close(fd)
            return
        self.fd = fd

    def drain(self) -> None:
        """Read every pending event; ``_WatchLost`` if the watched file went away."""
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    raise _WatchLost
                offset += _EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Watcher(threading.Thread):
    """Watches one SQLite database for other connections' commits; wakes the store's waiters.

    ``own_version`` is the ``data_version`` of the store's own connection, or ``None`` when
    that connection is busy. ``start()`` it, wait for ``listening``, ``stop()`` it.
    """

    def __init__(self, path: str, hub: Wakeups, own_version: Callable[[], int | None]) -> None:
        super().__init__(name="postroom-sqlite-watcher", daemon=True)
        self._path = Path(path).resolve()  # where it is now, whatever the process does later
        self._hub = hub
        self._own_version = own_version
        self._own_seen: int | None = None
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe()  # a byte here ends a wait at once
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)  # a full pipe wakes the watcher anyway
        self.listening = threading.Event()
        hub.on_first_wait(self._poke)

    def _poke(self) -> None:
        """A thread begins to wait: look now."""
        with contextlib.suppress(OSError):  # full (a wake-up is pending) or closed (stopped)
            os.write(self._wake_write, b".")

    def stop(self) -> None:
        """Stop watching and wait for the thread to end."""
        self._stopping.set()
        self._hub.forget_first_wait(self._poke)  # no poke after this: the pipe may close
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b".")
        self.join(timeout=5.0)
        if not self.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)

    def run(self) -> None:
        delay = 0.05
        deaf: str | None = None  # why the watcher last lost (or never got) its connection
        while not self._stopping.is_set():
            try:
                self._watch_once(reconnected=deaf is not None)
                deaf = None
            except (sqlite3.Error, OSError) as exc:
                if deaf is None:
                    log.event(_log, logging.WARNING, "watcher disconnected; waiters poll "
                              "until it reconnects", last_error=str(exc))
                deaf = str(exc)
            except _WatchLost:
                continue  # watch the (new) WAL file at once
            self._stopping.wait(delay)
            delay = min(delay * 2, 2.0)

    def _watch_once(self, *, reconnected: bool) -> None:
        uri = f"{self._path.as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, isolation_level=None,
                                                timeout=1.0)) as conn:
            version = _data_version(conn)
            writes = _WalWrites(f"{self._path}-wal")
            try:
                self._own_seen = self._own_version()
                if reconnected:
                    log.event(_log, logging.INFO, "watcher reconnected")
                if self.listening.is_set():
                    # Watching anew: a commit made while nobody watched went unheard.
                    self._hub.announce_all()
                self.listening.set()
                self._watch(conn, version, writes)
            finally:
                writes.close()

    def _watch(self, conn: sqlite3.Connection, version: int, writes: _WalWrites) -> None:
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        if writes.fd >= 0:
            poller.register(writes.fd, select.POLLIN)
        asleep = select.poll()
        asleep.register(self._wake_read, select.POLLIN)
        hot_until = 0.0
        while not self._stopping.is_set():
            if not self._hub.waited:
                # Until a waiter pokes (a poke made since ``waited`` was read is in the pipe).
                asleep.poll()
                self._drain_pokes()
                if writes.fd >= 0:
                    writes.drain()  # writes made while nobody waited: the version tells
                hot_until = time.monotonic() + WINDOW  # and a commit may be landing
            else:
                hot = writes.fd < 0 or time.monotonic() < hot_until
                ready = poller.poll((HOT if hot else IDLE) * 1000)
                for fd, _ in ready:
                    if fd == self._wake_read:
                        self._drain_pokes()
                    else:
                        writes.drain()
                        hot_until = time.monotonic() + WINDOW
            current = _data_version(conn)
            if current != version:
                version = current
                self._heard()

    def _drain_pokes(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 4096):
                pass

    def _heard(self) -> None:
        """Another connection committed: wake every waiter, unless it was the store's own."""
        own = self._own_version()
        if own is not None and own == self._own_seen:
            return  # the store's own commit: its waiters were woken at commit, precisely
        if own is not None:
            self._own_seen = own
        self._hub.announce_all()


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])
