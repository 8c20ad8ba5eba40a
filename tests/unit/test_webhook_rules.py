"""The webhook transport's pure rules: answers as outcomes, Retry-After, which addresses
are refused, and retry schedules."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from postroom import OutcomeKind, Schedule
from postroom.endpoints import SCHEDULES, check_schedule
from postroom.runtime.transports.webhook import (
    MAX_RETRY_AFTER,
    outcome_for,
    refusal,
    retry_after,
)

NOW = 1_700_000_000.0


@pytest.mark.parametrize(("status", "kind"), [
    *[(code, OutcomeKind.DELIVERED) for code in (200, 202, 204, 299)],
    (409, OutcomeKind.COLLISION), (410, OutcomeKind.GONE),
    *[(code, OutcomeKind.TRANSIENT) for code in (300, 301, 302, 303, 307, 308)],
    *[(code, OutcomeKind.TRANSIENT) for code in (408, 429, 500, 502, 503, 504, 599)],
    *[(code, OutcomeKind.PERMANENT) for code in (400, 401, 403, 404, 405, 413, 415, 422)],
])
def test_each_status_class_has_its_outcome(status, kind):
    assert outcome_for(status, {}, now=NOW).kind is kind


def test_retry_after_in_seconds_or_as_a_date_and_capped():
    assert retry_after("120", NOW) == 120.0
    assert retry_after(formatdate(NOW + 90, usegmt=True), NOW) == pytest.approx(90.0)
    assert retry_after(formatdate(NOW - 90, usegmt=True), NOW) == 0.0
    assert retry_after("9" * 40, NOW) == MAX_RETRY_AFTER
    for unreadable in (None, "", "soon", "-1", "1.5"):
        assert retry_after(unreadable, NOW) is None
    assert outcome_for(503, {"retry-after": "30"}, now=NOW).delay == 30.0
    assert outcome_for(404, {"retry-after": "30"}, now=NOW).delay is None


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.0.1", "private"),
    ("fd12:3456::1", "private"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"), ("100.64.0.1", "not globally routable"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"),
    ("2002:7f00:1::", "loopback"), ("64:ff9b::a9fe:a9fe", "link-local"),
    ("240.0.0.1", "reserved"),
])
def test_local_and_special_addresses_are_refused(address, reason):
    found = refusal(address)
    assert found is not None and found.startswith(reason), found


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111",
                                     "93.184.216.34"])
def test_global_addresses_are_used(address):
    assert refusal(address) is None


def test_a_schedule_takes_its_delays_in_turn_then_repeats_the_last_with_jitter():
    schedule = Schedule(name="custom", delays=(1.0, 10.0, 100.0), jitter=0.5)
    rng = random.Random(0)
    delays = [schedule.delay(attempt, rng) for attempt in range(1, 7)]
    for delay, base in zip(delays, (1, 10, 100, 100, 100, 100), strict=True):
        assert base * 0.5 <= delay <= base
    assert Schedule(name="default").delay(3, rng) is None  # the store's backoff


def test_the_standard_webhooks_preset_and_explicit_schedules():
    assert SCHEDULES["standard-webhooks"].delays == (5, 300, 1800, 7200, 18000, 36000, 36000)
    assert check_schedule("fast") is SCHEDULES["fast"]
    assert check_schedule((2, 4)).delays == (2.0, 4.0)
    with pytest.raises(ValueError, match="preset"):
        check_schedule(Schedule(name="fast", delays=(1.0,)))
