"""Wait decisions take the store's time: never earlier than a time already used (SPEC §5)."""

from __future__ import annotations

import math

import pytest

import postroom
from postroom import ExpireResult, OpenResult, SignalResult, WaitState
from tests.support import START

ALICE = postroom.AuthContext(principal="alice")


def high_water(store: postroom.Store) -> float:
    return store.info()["time_high_water"]


def test_a_caller_with_an_old_clock_cannot_revive_an_expired_deadline(db_url, clock, store):
    store.open_wait("f", "s", 0, START + 10)
    clock.set(START + 12)
    store.open_wait("f", "other", 0, START + 100)  # a decision at +12 moves the high-water
    with postroom.open_store(db_url, clock=postroom.ManualClock(START + 2)) as old_caller:
        receipt = old_caller.signal(ALICE, "e1", "f", "s", 1, "yes")
    assert (receipt.result, receipt.received_at) == (SignalResult.TOO_LATE, START + 12)
    assert store.wait("f", "s").state is WaitState.TIMED_OUT


def test_a_clock_stepping_backwards_does_not_move_decisions_back(store, clock):
    store.open_wait("f", "s", 0, START + 10)
    clock.set(START + 10)
    store.signal(ALICE, "early", "f", "elsewhere", 1, "moves time")
    clock.set(START + 1)  # the clock steps back nine seconds
    assert store.expire("f", "s", 1) is ExpireResult.TIMED_OUT
    assert store.wait("f", "s").ended_at == START + 10
    assert high_water(store) == START + 10


def test_a_decision_with_a_clock_behind_the_high_water_records_the_high_water(store, clock):
    clock.set(START + 5)
    store.open_wait("f", "s", 0, START + 10)
    clock.set(START)
    store.signal(ALICE, "e1", "f", "s", 1, "yes")
    wait = store.wait("f", "s")
    assert (wait.state, wait.opened_at, wait.ended_at) == (WaitState.SIGNALED, START + 5,
                                                           START + 5)


def test_the_high_water_never_decreases_whatever_the_clock_does(store, clock):
    seen = [high_water(store)]
    for step, offset in enumerate((5, 3, 9, 1, 9, 20, 0)):
        clock.set(START + offset)
        store.open_wait("f", f"s{step}", 0, START + 8)
        store.signal(ALICE, f"e{step}", "f", f"s{step}", 1, step)
        seen.append(high_water(store))
    assert seen == sorted(seen) and seen[-1] == START + 20


def test_a_deadline_already_passed_opens_a_wait_the_next_signal_times_out(store, clock):
    clock.set(START + 50)
    assert store.open_wait("f", "s", 0, START + 10).result is OpenResult.OPENED
    assert store.signal(ALICE, "e1", "f", "s", 1, "yes").result is SignalResult.TOO_LATE


@pytest.mark.parametrize("reading", [math.inf, -math.inf, math.nan])
def test_a_clock_reading_that_is_not_a_finite_time_is_refused_and_writes_nothing(
        db_url, reading):
    class Broken:
        def now(self) -> float:
            return reading

    with (postroom.open_store(db_url, clock=Broken()) as broken,
          pytest.raises(postroom.InvalidInput, match="clock")):
        broken.open_wait("f", "s", 0, START + 10)
    with postroom.open_store(db_url, clock=postroom.ManualClock(START)) as store:
        assert store.info()["waits"] == {} and store.info()["time_high_water"] == 0.0


@pytest.mark.parametrize("reading", [math.inf, math.nan])
def test_a_manual_clock_cannot_be_set_to_a_time_that_is_not_finite(reading):
    with pytest.raises(postroom.InvalidInput, match="when"):
        postroom.ManualClock().set(reading)
    with pytest.raises(postroom.InvalidInput, match="seconds"):
        postroom.ManualClock().advance(reading)


def test_a_clock_may_read_any_kind_of_float(db_url):
    class Seconds(float):  # e.g. numpy.float64
        pass

    class Subclassed:
        def now(self) -> float:
            return Seconds(START)

    with postroom.open_store(db_url, clock=Subclassed()) as store:
        assert store.open_wait("f", "s", 0, START + 10).result is OpenResult.OPENED
