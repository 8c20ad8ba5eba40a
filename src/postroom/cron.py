"""Cron expressions: when a schedule's periods begin.

Five fields, ``minute hour day-of-month month day-of-week``, each ``*``, a number, a range
``a-b``, any of them with a step (``*/15``, ``1-30/2``, ``5/10`` = from 5 to the end by 10),
and comma-separated lists of those. Months run 1-12, days of the week 0-7 (0 and 7 are
Sunday). As in Vixie cron, when both day fields are restricted (neither starts with ``*``) a
day matches if *either* does; otherwise both must (one of them being every day).

Times are wall-clock times in a zone (UTC unless an IANA name is given, read with the
standard ``zoneinfo``). Across a daylight-saving change a wall time that does not exist (the
spring gap) does not fire, and one that happens twice (the autumn fold) fires once, the first
time. Resolution is the minute: a fire time is a whole minute, in seconds since the epoch.
"""

from __future__ import annotations

import calendar
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from postroom.errors import InvalidInput
from postroom.validation import is_decimal

__all__ = ["Cron", "parse_cron"]

#: Each field's name and its lowest and highest value.
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12),
           ("day-of-week", 0, 7))
_MINUTE = timedelta(minutes=1)
#: Whatever the expression, a fire time is found within this many steps of the walk (each
#: step moves to the next month, day, hour or minute that can match; a few years at most).
_MAX_STEPS = 200_000


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression in a zone; ``next_after(t)`` is its next fire time."""

    expression: str
    zone: str | None  # an IANA name; None: UTC
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    #: Vixie cron's rule: both day fields restricted, so either one makes a day match.
    either_day: bool

    def matches_day(self, year: int, month: int, day: int) -> bool:
        """Whether the day fields (and the month) let ``year-month-day`` fire."""
        if month not in self.months:
            return False
        weekday = (calendar.weekday(year, month, day) + 1) % 7  # Python's Monday=0 to Sunday=0
        if self.either_day:
            return day in self.days or weekday in self.weekdays
        return day in self.days and weekday in self.weekdays

    def matches(self, moment: datetime) -> bool:
        """Whether the wall time ``moment`` (its minute) is one the expression names."""
        return (moment.minute in self.minutes and moment.hour in self.hours
                and self.matches_day(moment.year, moment.month, moment.day))

    def next_after(self, when: float) -> float:
        """The first fire time strictly after ``when`` (seconds since the epoch)."""
        zone = _zone(self.zone)
        local = datetime.fromtimestamp(math.floor(when / 60) * 60, zone).replace(tzinfo=None)
        candidate = local + _MINUTE
        for _ in range(_MAX_STEPS):
            if candidate.month not in self.months:
                candidate = _month_after(candidate)
            elif not self.matches_day(candidate.year, candidate.month, candidate.day):
                candidate = datetime(candidate.year, candidate.month, candidate.day) + timedelta(
                    days=1)
            elif candidate.hour not in self.hours:
                candidate = candidate.replace(minute=0) + timedelta(hours=1)
            elif candidate.minute not in self.minutes:
                candidate += _MINUTE
            else:
                fired = _instant(candidate, zone)
                if fired is not None and fired > when:
                    return fired
                candidate += _MINUTE
        raise AssertionError(f"cron {self.expression!r}: no fire time found")  # pragma: no cover

    def latest(self, after: float, until: float) -> float | None:
        """The last fire time in ``(after, until]``, or ``None`` if none is.

        Looks back from ``until`` over a window that doubles until it holds a fire time, so
        it costs about as much for a gap of a year as for one of an hour.
        """
        first = self.next_after(after)
        if first > until:
            return None
        window = 60.0
        while True:
            start = max(after, until - window)
            found = self.next_after(start)
            if found <= until:
                break
            window *= 2
        while (following := self.next_after(found)) <= until:
            found = following
        return found

    def __str__(self) -> str:
        return self.expression if self.zone is None else f"{self.expression} ({self.zone})"


def parse_cron(expression: object, zone: object = None) -> Cron:
    """Parse ``expression`` in ``zone`` (an IANA name, or ``None`` for UTC).

    ``InvalidInput`` naming ``cron`` (and which of its fields is wrong, and why) or ``zone``.
    An expression that can never fire (``0 0 30 2 *``) is refused too.
    """
    if type(expression) is not str:
        raise InvalidInput("cron", f"must be a string, got {type(expression).__name__}")
    parts = expression.split()
    if len(parts) != len(_FIELDS):
        raise InvalidInput("cron", f"{expression!r} has {len(parts)} fields; a cron expression "
                                   "has 5: minute hour day-of-month month day-of-week")
    sets = [_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    if zone is not None:
        _zone(_zone_name(zone))
    minutes, hours, days, months, weekdays = sets
    cron = Cron(expression=" ".join(parts), zone=zone if zone is None else str(zone),
                minutes=minutes, hours=hours, days=days, months=months,
                weekdays=frozenset(day % 7 for day in weekdays),
                either_day=not parts[2].startswith("*") and not parts[4].startswith("*"))
    if not cron.either_day and not any(day <= _longest(month) for month in months
                                       for day in days):
        raise InvalidInput("cron", f"{expression!r} can never fire: no month it names has "
                                   "the day it names")
    return cron


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        span, _, step_text = item.partition("/")
        step = _number(step_text, name, 1, high - low + 1, "step") if step_text else 1
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first_text, _, last_text = span.partition("-")
            first = _number(first_text, name, low, high)
            last = _number(last_text, name, low, high)
            if first > last:
                raise InvalidInput("cron", f"{name} range {span!r} runs backwards")
        else:
            first = _number(span, name, low, high)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


def _number(text: str, name: str, low: int, high: int, what: str = "value") -> int:
    if not is_decimal(text):
        raise InvalidInput("cron", f"{name} {what} {text!r} is not a number")
    value = int(text)
    if not low <= value <= high:
        raise InvalidInput("cron", f"{name} {what} {value} is outside {low}-{high}")
    return value


def _zone_name(zone: object) -> str:
    if type(zone) is not str or not zone:
        raise InvalidInput("zone", f"must be an IANA time zone name, got {zone!r}")
    return zone


def _zone(name: str | None) -> tzinfo:
    if name is None:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput("zone", f"{name!r} is not a known IANA time zone") from None


def _longest(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _month_after(moment: datetime) -> datetime:
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1)


def _instant(wall: datetime, zone: tzinfo) -> float | None:
    """The instant of wall time ``wall`` in ``zone`` (its first, if it happens twice), or
    ``None`` if the zone skips it."""
    placed = wall.replace(tzinfo=zone, fold=0)
    instant = placed.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant.timestamp()
