"""Store settings and retry backoff policies, validated when they are built."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from postroom.errors import InvalidInput
from postroom.validation import (
    DEFAULT_LIMITS,
    FOLLOW_UP_NAMESPACES,
    MAX_CHAIN_BUDGET,
    Limits,
    check_text,
)

__all__ = ["DEFAULT_RETENTION", "DELIVERY_BUDGETS", "LEASES", "MAX_PRIORITY_WEIGHT",
           "MAX_RETENTION", "Backoff", "ExponentialBackoff", "FixedBackoff", "Settings",
           "check_lease", "check_retention"]

_DAY = 86_400.0
#: The retention period a new store publishes unless its first opener gives one: 7 days.
DEFAULT_RETENTION = 7 * _DAY
#: The longest retention period a store may publish: 3,650 days.
MAX_RETENTION = 3650 * _DAY
#: The shortest and longest lease, in seconds (a task's, a delivery's; a store's default or
#: one call's): a millisecond to a day.
LEASES = (0.001, _DAY)
#: The most a priority level may be worth (seconds of waiting): claims look this many
#: seconds per level past now for a task of the lowest priority, and no further.
MAX_PRIORITY_WEIGHT = 3600.0
#: The delivery budgets a store may be given (``postroom audit`` holds stored replies to it).
DELIVERY_BUDGETS = range(1, 101)


class Backoff(Protocol):
    """How long to wait before the next try, after ``attempt`` tries (1-based) failed."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ExponentialBackoff:
    """``min(cap, base * 2**(attempt-1))``, scaled by a random factor in ``[1-jitter, 1]``.

    The jitter spreads retries of many tasks that failed together (e.g. a dependency outage)
    so they do not come back in lockstep.
    """

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        _positive("backoff.base", self.base)
        _positive("backoff.cap", self.cap)
        if type(self.jitter) not in (int, float) or not 0.0 <= self.jitter <= 1.0:
            raise InvalidInput("backoff.jitter", f"must be a number in 0..1, got "
                                                 f"{self.jitter!r}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after ``attempt`` failed tries."""
        exponent = min(max(attempt, 1) - 1, 64)
        ceiling = min(self.cap, self.base * 2.0**exponent)
        return ceiling * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True, kw_only=True, slots=True)
class FixedBackoff:
    """The same delay every time (for tests and predictable demos)."""

    seconds: float = 1.0

    def __post_init__(self) -> None:
        if type(self.seconds) not in (int, float) or not (
                math.isfinite(self.seconds) and self.seconds >= 0):
            raise InvalidInput("backoff.seconds", f"must be a finite number >= 0, got "
                                                  f"{self.seconds!r}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Always ``seconds``."""
        return float(self.seconds)


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """How a store behaves. Every value is checked here, before the store opens."""

    #: Seconds a claim holds a task before the lease must be renewed.
    lease: float = 30.0
    #: Messages arriving with ``hops >= max_hops`` are stored as ``hop_limit``; a chain's
    #: hops count from its root (a root's envelope may lower it for its chain).
    max_hops: int = 4
    #: Tasks a chain (its root and everything spawned from it) may admit to run; the rest of
    #: its new work is stored ``budget_exhausted``. A root's envelope may lower it.
    max_chain_tasks: int = 1000
    #: Cost units a chain's handlers may charge (``ctx.charge``) before its new work is
    #: stored ``budget_exhausted``; ``None``: no cost budget unless a root's envelope sets one.
    max_chain_cost: int | None = None
    #: Delivery attempts per reply before it is ``dead`` (business attempts count apart).
    delivery_budget: int = 3
    #: Seconds a publisher holds a reply it is delivering.
    dispatch_lease: float = 30.0
    #: Inbox identities are kept at least this many seconds. The period is the store's, published
    #: in its database (``postroom info`` shows it): ``None`` takes the published one, and the
    #: store's first opener publishes its own (``DEFAULT_RETENTION`` if ``None``). A number
    #: that differs from the published period is refused at open; ``postroom init URL
    #: --retention SECONDS`` changes it.
    retention: float | None = None
    #: Task retry backoff after a retryable failure.
    backoff: Backoff = field(default_factory=ExponentialBackoff)
    #: Reply redelivery backoff after a transient delivery failure.
    delivery_backoff: Backoff = field(default_factory=ExponentialBackoff)
    #: At most this many expired leases / passed deadlines are handled per sweep.
    sweep_limit: int = 100
    #: Seconds of waiting one priority level is worth: a task runs before one of a lower
    #: priority unless that one became claimable more than ``difference * priority_weight``
    #: seconds earlier. Priorities order a queue, and the lowest is never starved (it waits
    #: at most ``20 * priority_weight`` behind fresher work of the highest). At most
    #: ``MAX_PRIORITY_WEIGHT``; the processes sharing a store should use one weight (a task's
    #: turn is set by the process that stores it).
    priority_weight: float = 60.0
    #: Principals allowed to send messages; ``None`` admits every authenticated principal.
    allowed_sources: frozenset[str] | None = None
    #: Input limits (may only be lowered).
    limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        check_lease(self.lease)
        _bounded("priority_weight", self.priority_weight, 0.0, MAX_PRIORITY_WEIGHT)
        check_lease(self.dispatch_lease, "dispatch_lease")
        if self.retention is not None:
            check_retention(self.retention)
        if not isinstance(self.limits, Limits):
            raise InvalidInput("limits", f"must be a Limits, got {type(self.limits).__name__}")
        for name in ("backoff", "delivery_backoff"):
            if not callable(getattr(getattr(self, name), "delay", None)):
                raise InvalidInput(name, "must be a Backoff: an object with "
                                         "delay(attempt, rng) -> seconds")
        budgets = DELIVERY_BUDGETS
        for name, value, low, high in (("max_hops", self.max_hops, 1, 1024),
                                       ("delivery_budget", self.delivery_budget, budgets[0],
                                        budgets[-1]),
                                       ("sweep_limit", self.sweep_limit, 1, 100_000),
                                       ("max_chain_tasks", self.max_chain_tasks, 1,
                                        MAX_CHAIN_BUDGET)):
            if type(value) is not int or not low <= value <= high:
                raise InvalidInput(name, f"must be an int in {low}..{high}, got {value!r}")
        if self.max_chain_cost is not None and (
                type(self.max_chain_cost) is not int
                or not 0 <= self.max_chain_cost <= MAX_CHAIN_BUDGET):
            raise InvalidInput("max_chain_cost", f"must be None or an int in "
                                                 f"0..{MAX_CHAIN_BUDGET}, got "
                                                 f"{self.max_chain_cost!r}")
        if self.allowed_sources is not None:
            if not isinstance(self.allowed_sources, frozenset):
                raise InvalidInput("allowed_sources", "must be a frozenset of principals")
            for source in self.allowed_sources:
                check_text(source, "allowed_sources", max_bytes=self.limits.text_bytes)
                if source.startswith(FOLLOW_UP_NAMESPACES):
                    # No caller can authenticate as one (see ``inbox.principal_of``): allowing
                    # it would be a setting that never takes effect.
                    reserved = " or ".join(map(repr, FOLLOW_UP_NAMESPACES))
                    raise InvalidInput("allowed_sources", f"{source!r} is reserved: names "
                                                          f"beginning with {reserved} "
                                                          "identify follow-ups")


def check_lease(seconds: float, field: str = "lease") -> float:
    """``seconds`` as a lease, or ``InvalidInput`` naming ``field``."""
    _bounded(field, seconds, *LEASES)
    return float(seconds)


def check_retention(seconds: float) -> float:
    """``seconds`` as a retention period, or ``InvalidInput`` naming ``retention``."""
    _bounded("retention", seconds, 0.0, MAX_RETENTION)
    return float(seconds)


def _positive(name: str, value: float) -> None:
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
        raise InvalidInput(name, f"must be a finite number > 0, got {value!r}")


def _bounded(name: str, value: float, low: float, high: float) -> None:
    if type(value) not in (int, float) or not (math.isfinite(value) and low <= value <= high):
        raise InvalidInput(name, f"must be a number in {low}..{high} seconds, got {value!r}")
