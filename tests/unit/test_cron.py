"""Cron expressions: parsing names the field, and the next fire time agrees with a brute-force
walk over every minute."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from postroom.cron import parse_cron
from postroom.errors import InvalidInput


def at(*fields: int, zone: str | None = None) -> float:
    return datetime(*fields, tzinfo=UTC).timestamp() if zone is None else datetime(
        *fields).astimezone(parse_zone(zone)).timestamp()


def parse_zone(name: str):
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def utc(when: float) -> datetime:
    return datetime.fromtimestamp(when, UTC)


def brute_next(cron, when: float, limit_minutes: int) -> float | None:
    """The first minute after ``when`` whose wall time (its first occurrence) matches."""
    zone = parse_zone(cron.zone) if cron.zone else UTC
    minute = math.floor(when / 60) * 60
    for _ in range(limit_minutes):
        minute += 60
        wall = datetime.fromtimestamp(minute, zone)
        if wall.fold == 0 and cron.matches(wall):
            return float(minute)
    return None


def test_every_quarter_hour_of_office_hours_on_weekdays():
    cron = parse_cron("*/15 9-17 * * 1-5")
    saturday = at(2026, 12, 5, 12)
    assert utc(cron.next_after(saturday)) == datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    assert utc(cron.next_after(at(2026, 12, 7, 9, 0))) == datetime(2026, 12, 7, 9, 15,
                                                                   tzinfo=UTC)


def test_the_next_fire_time_is_strictly_after_the_time_given():
    cron = parse_cron("0 * * * *")
    assert cron.next_after(at(2026, 1, 1, 10)) == at(2026, 1, 1, 11)
    assert cron.next_after(at(2026, 1, 1, 10) - 0.5) == at(2026, 1, 1, 10)


def test_both_day_fields_restricted_match_either_as_vixie_cron_does():
    cron = parse_cron("0 0 13 * 5")  # the 13th, and every Friday
    assert utc(cron.next_after(at(2026, 12, 1))) == datetime(2026, 12, 4, tzinfo=UTC)  # Fri
    assert utc(cron.next_after(at(2026, 12, 11))) == datetime(2026, 12, 13, tzinfo=UTC)


def test_one_day_field_starred_makes_the_other_decide():
    assert utc(parse_cron("0 0 * * 0").next_after(at(2026, 12, 1))) == datetime(
        2026, 12, 6, tzinfo=UTC)  # Sunday
    # '*/10' starts with '*', so both must hold: a Sunday (7 = 0) that is the 1st, 11th,
    # 21st or 31st.
    assert utc(parse_cron("0 0 */10 * 7").next_after(at(2026, 12, 1))) == datetime(
        2027, 1, 31, tzinfo=UTC)


def test_a_leap_day_schedule_waits_for_a_leap_year():
    assert utc(parse_cron("0 12 29 2 *").next_after(at(2026, 1, 1))) == datetime(
        2028, 2, 29, 12, tzinfo=UTC)


def test_a_wall_time_in_the_spring_gap_does_not_fire_and_the_autumn_fold_fires_once():
    cron = parse_cron("30 2 * * *", "Europe/Berlin")
    # 2026-03-29 02:30 does not exist in Berlin: the next one is the day after, 00:30 UTC.
    assert utc(cron.next_after(at(2026, 3, 28, 12))) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)
    # 2026-10-25 02:30 happens twice: it fires at the first (CEST, 00:30 UTC), not the second.
    first = cron.next_after(at(2026, 10, 24, 12))
    assert utc(first) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert utc(cron.next_after(first)) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)


def test_the_latest_fire_time_of_a_long_gap_is_found():
    cron = parse_cron("*/5 * * * *")
    assert cron.latest(at(2026, 1, 1), at(2026, 12, 31, 23, 58)) == at(2026, 12, 31, 23, 55)
    assert cron.latest(at(2026, 1, 1), at(2026, 1, 1, 0, 4)) is None
    assert cron.latest(at(2026, 1, 1), at(2026, 1, 1, 0, 5)) == at(2026, 1, 1, 0, 5)


@pytest.mark.parametrize(("expression", "problem"), [
    ("* * * *", "has 4 fields"), ("60 * * * *", "minute value 60 is outside 0-59"),
    ("* 24 * * *", "hour value 24"), ("* * 0 * *", "day-of-month value 0"),
    ("* * * 13 *", "month value 13"), ("* * * * 8", "day-of-week value 8"),
    ("5-1 * * * *", "runs backwards"), ("*/0 * * * *", "step 0"), ("a * * * *", "not a number"),
    ("0 0 30 2 *", "can never fire"), (7, "must be a string"),
])
def test_an_invalid_expression_is_refused_naming_cron(expression, problem):
    with pytest.raises(InvalidInput, match=problem) as refused:
        parse_cron(expression)
    assert refused.value.field == "cron"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", 3])
def test_an_unknown_zone_is_refused_naming_zone(zone):
    with pytest.raises(InvalidInput) as refused:
        parse_cron("* * * * *", zone)
    assert refused.value.field == "zone"


def _part(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    single = number.map(str)
    span = st.tuples(number, number).map(lambda pair: f"{min(pair)}-{max(pair)}")
    stepped = st.tuples(st.sampled_from(["*", None]), number, st.integers(1, 12)).map(
        lambda parts: f"{parts[0] or parts[1]}/{parts[2]}")
    item = st.one_of(st.just("*"), single, span, stepped)
    return st.lists(item, min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(_part(0, 59), _part(0, 23), _part(1, 31), _part(1, 12),
                        _part(0, 7)).map(" ".join)
MOMENTS = st.floats(at(2020, 1, 1), at(2030, 1, 1))
ZONES = st.sampled_from([None, "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                         "Asia/Kolkata"])


@settings(max_examples=150, deadline=None)
@given(EXPRESSIONS, MOMENTS, ZONES)
def test_the_next_fire_time_is_the_first_matching_minute_of_a_brute_force_walk(
        expression, when, zone):
    try:
        cron = parse_cron(expression, zone)
    except InvalidInput:
        assume(False)
        raise
    expected = brute_next(cron, when, limit_minutes=3 * 24 * 60)
    assume(expected is not None)  # a sparse expression: the walk would take too long
    assert cron.next_after(when) == expected


@settings(max_examples=100, deadline=None)
@given(EXPRESSIONS, MOMENTS, st.integers(1, 5000))
def test_the_latest_fire_time_of_a_gap_is_the_last_of_a_walk_through_it(
        expression, when, minutes):
    try:
        cron = parse_cron(expression)
    except InvalidInput:
        assume(False)
        raise
    until = when + 60 * minutes
    found, moment = None, cron.next_after(when)
    for _ in range(minutes + 1):
        if moment > until:
            break
        found, moment = moment, cron.next_after(moment)
    assert cron.latest(when, until) == found
