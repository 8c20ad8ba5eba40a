"""Wake-ups: "work may be available on these channels", delivered to waiting threads.

A committed transaction announces the channels it made work for (a task's queue, or the
replies channel); ``Tx.notify`` collects them, and the dialect emits each channel once per
transaction. Whatever carries the announcement (a commit in this process, a PostgreSQL
``NOTIFY`` heard by the store's listener), it ends here, in a ``Wakeups`` hub, as a bump of a
per-channel counter. A ``Waiter`` remembers the counters it last saw, so:

- a burst of announcements wakes a waiter once (they are coalesced, never queued);
- an announcement made while the waiter was busy (say, between an empty claim and the next
  ``wait``) is not lost: the next ``wait`` returns at once;
- a reconnect of the listener wakes every waiter (``announce_all``), because announcements
  made while it was deaf are gone and only a poll can find their work.

A wake-up is a hint, never a promise: the caller always claims to find out, and its
``timeout`` is the polling interval that covers whatever no announcement reached.

The hub also tells whether any thread waits now (``waited``), and calls what asked
(``on_first_wait``) when a thread begins to wait while none did: SQLite's watcher looks for
other processes' commits only while someone waits, and looks at once when someone begins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from postroom.clock import finite_time
from postroom.errors import InvalidInput

__all__ = ["REPLIES_CHANNEL", "Waiter", "Wakeups"]

#: The longest a ``Waiter.wait`` may be asked to block: a day (it is a polling interval).
_MAX_TIMEOUT = 86_400.0

#: The channel announced when a reply becomes due for delivery.
REPLIES_CHANNEL = "postroom_replies"


class Wakeups:
    """Per-channel announcement counters shared by every waiter of one store."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._counts: dict[str, int] = {}
        self._everything = 0
        self._waiting = 0  # threads blocked in ``wait``
        self._on_first_wait: list[Callable[[], None]] = []

    @property
    def waited(self) -> bool:
        """Whether some thread waits now (blocked in ``wait``)."""
        return self._waiting > 0

    def on_first_wait(self, call: Callable[[], None]) -> None:
        """Call ``call`` (under the hub's lock: it must not block) whenever a thread begins
        to wait while none did."""
        with self._changed:
            self._on_first_wait.append(call)

    def forget_first_wait(self, call: Callable[[], None]) -> None:
        """Stop calling ``call`` (given to ``on_first_wait``); once this returns it is not
        being called either."""
        with self._changed:
            self._on_first_wait = [other for other in self._on_first_wait if other != call]

    def announce(self, channels: Iterable[str]) -> None:
        """Record that work may be available on ``channels`` and wake their waiters."""
        with self._changed:
            for channel in channels:
                self._counts[channel] = self._counts.get(channel, 0) + 1
            self._changed.notify_all()

    def announce_all(self) -> None:
        """Wake every waiter: announcements may have been missed (e.g. after a reconnect)."""
        with self._changed:
            self._everything += 1
            self._changed.notify_all()

    def _mark(self, channels: frozenset[str]) -> int:
        return self._everything + sum(self._counts.get(channel, 0) for channel in channels)

    def mark(self, channels: frozenset[str]) -> int:
        """A token that changes whenever one of ``channels`` (or everything) is announced."""
        with self._changed:
            return self._mark(channels)

    def wait(self, channels: frozenset[str], since: int, timeout: float) -> int | None:
        """Block until the mark of ``channels`` differs from ``since``; the new mark, or None.

        Returns at once if it already differs; ``None`` when ``timeout`` seconds pass first.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._changed:
            counted = False
            try:
                while True:
                    current = self._mark(channels)
                    if current != since:
                        return current
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    if not counted:
                        counted = True
                        self._waiting += 1
                        if self._waiting == 1:
                            for call in self._on_first_wait:
                                call()
                    self._changed.wait(remaining)
            finally:
                if counted:
                    self._waiting -= 1


class Waiter:
    """Waits for work on a fixed set of channels; create one per polling loop.

    Typical use, in a worker::

        waiter = store.waiter(queues=["default"])
        while running:
            claims = store.claim_batch(owner, 10)
            if not claims:
                waiter.wait(timeout=1.0)   # the poll interval
                continue
            ...

    The waiter starts counting when it is created, so work announced between the waiter's
    creation (or its last ``wait``) and the next ``wait`` makes that ``wait`` return at once.
    """

    def __init__(self, hub: Wakeups, channels: Iterable[str]) -> None:
        self._hub = hub
        self._channels = frozenset(channels)
        self._seen = hub.mark(self._channels)

    @property
    def channels(self) -> frozenset[str]:
        """The channels this waiter wakes for."""
        return self._channels

    def interrupt(self) -> None:
        """Make a ``wait`` in progress (or the next one) return ``True`` at once: for a loop
        that is asked to stop while it waits. Every waiter of the store wakes; a wake-up is a
        hint, so that costs them one look."""
        self._hub.announce_all()

    def wait(self, timeout: float) -> bool:
        """Block until work may be available (``True``) or ``timeout`` seconds pass (``False``).

        Either way the caller should claim next: ``False`` is simply the polling fallback.
        ``timeout`` is a finite number of seconds, at least 0 (NaN would never wait, so a
        polling loop would spin).
        """
        seconds = finite_time(timeout, "timeout")
        if not 0 <= seconds <= _MAX_TIMEOUT:
            raise InvalidInput("timeout",
                               f"must be in 0..{_MAX_TIMEOUT:g} seconds, got {timeout!r}")
        mark = self._hub.wait(self._channels, self._seen, seconds)
        if mark is None:
            return False
        self._seen = mark
        return True
