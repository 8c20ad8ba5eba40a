"""The wake-up hub: announcements are coalesced, never lost between waits, and a reconnect
wakes everyone. (Pure Python: the carriers -- commits, NOTIFY -- are tested per backend.)"""

from __future__ import annotations

import threading

from postroom.db.wakeups import Waiter, Wakeups


def test_a_waiter_returns_at_once_for_work_announced_since_it_was_made():
    hub = Wakeups()
    waiter = Waiter(hub, ["default"])
    hub.announce(["default"])
    assert waiter.wait(timeout=0) is True


def test_a_burst_of_announcements_wakes_a_waiter_once():
    hub = Wakeups()
    waiter = Waiter(hub, ["default"])
    for _ in range(100):
        hub.announce(["default"])
    assert waiter.wait(timeout=0) is True
    assert waiter.wait(timeout=0) is False


def test_announcements_for_other_channels_do_not_wake_a_waiter():
    hub = Wakeups()
    waiter = Waiter(hub, ["default", "reviews"])
    hub.announce(["builds"])
    assert waiter.wait(timeout=0) is False
    hub.announce(["reviews"])
    assert waiter.wait(timeout=0) is True


def test_announce_all_wakes_every_waiter():
    hub = Wakeups()
    waiters = [Waiter(hub, ["a"]), Waiter(hub, ["b"])]
    hub.announce_all()
    assert [waiter.wait(timeout=0) for waiter in waiters] == [True, True]


def test_a_waiter_times_out_without_an_announcement():
    assert Waiter(Wakeups(), ["default"]).wait(timeout=0.01) is False


def test_a_blocked_waiter_is_woken_by_another_thread():
    hub = Wakeups()
    waiter = Waiter(hub, ["default"])
    ready = threading.Event()
    woke: list[bool] = []

    def wait() -> None:
        ready.set()
        woke.append(waiter.wait(timeout=30))

    thread = threading.Thread(target=wait)
    thread.start()
    ready.wait()
    hub.announce(["default"])
    thread.join(timeout=30)
    assert woke == [True]
