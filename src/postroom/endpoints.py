"""Endpoints: where each principal's replies are delivered, and the replies that wait for one.

A reply goes to its requester (the principal that sent the task's chain). Each principal has
at most one endpoint: a URL, signing secrets (several while one is rotated in), whether the
sender may connect to private addresses for it, a retry schedule, a delivery budget and how
many deliveries may be in flight to it at once. An endpoint that answers 410 Gone is disabled
(with when and why) in the transaction that records the reply dead; an operator enables it.

A reply that comes due while its requester has no enabled endpoint is *parked* when a routed
claim reaches it (``park``): it leaves the head of the claimable replies without being
claimed, so it spends no attempt, and a backlog of such replies costs later claims nothing.
Adding or enabling the requester's endpoint makes its parked replies due at once, and wakes
the dispatchers.

Secrets are kept as they are: the sender computes an HMAC with each, so it needs the secret
itself, not a hash of it. Whoever can read the store's database can therefore sign as
postroom; protect it as you protect the secrets.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from postroom import log
from postroom.db import Tx, Write
from postroom.db.dialect import Row
from postroom.db.wakeups import REPLIES_CHANNEL
from postroom.errors import Conflict, InvalidInput, NotFound
from postroom.models import Endpoint, EndpointSecret, Schedule
from postroom.settings import DELIVERY_BUDGETS, Settings
from postroom.validation import MAX_DELAY, check_bool, check_int, check_number, check_text

__all__ = [
    "ADD",
    "CHANGE",
    "CONCURRENCY",
    "DEFAULT_CONCURRENCY",
    "MAX_URL_BYTES",
    "REMOVE",
    "SCHEDULES",
    "EndpointRequest",
    "add",
    "awaiting",
    "check_request",
    "check_schedule",
    "check_url",
    "disable",
    "enable",
    "find",
    "get",
    "listed",
    "park",
    "remove",
    "rotate",
    "stopped_by_gone",
]

ADD = Write("endpoint.add")
CHANGE = Write("endpoint.change")
REMOVE = Write("endpoint.remove")

_log = log.get("endpoints")

#: The longest endpoint URL, in UTF-8 bytes.
MAX_URL_BYTES = 2048
#: How many deliveries may be in flight to one endpoint at once.
CONCURRENCY = range(1, 257)
DEFAULT_CONCURRENCY = 4
#: The most delays an explicit schedule may list.
_MAX_DELAYS = 32

#: Retry schedules by name. ``default`` is the store's own ``delivery_backoff``;
#: ``standard-webhooks`` is the schedule Standard Webhooks publishes (retries 5 s, 5 min,
#: 30 min, 2 h, 5 h, 10 h and 10 h after the attempt before: give it a budget of 8 to use
#: all of it); ``fast`` doubles from 1 s to a minute, for endpoints that recover quickly.
SCHEDULES: dict[str, Schedule] = {
    "default": Schedule(name="default"),
    "standard-webhooks": Schedule(name="standard-webhooks",
                                  delays=(5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0,
                                          36000.0)),
    "fast": Schedule(name="fast", delays=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)),
}

_CONTROL = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointRequest:
    """An endpoint to add, every field checked."""

    principal: str
    url: str
    allow_private: bool
    schedule: Schedule
    budget: int
    concurrency: int


def check_url(url: object) -> str:
    """An endpoint URL: ``http`` or ``https``, a host, no credentials, no fragment, no spaces
    or control characters, at most ``MAX_URL_BYTES``."""
    text = check_text(url, "url", max_bytes=MAX_URL_BYTES)
    if _CONTROL.search(text):
        raise InvalidInput("url", "must not contain spaces or control characters")
    try:
        parts = urlsplit(text)
        port = parts.port  # raises for a port that is not a number in range
    except ValueError as exc:
        raise InvalidInput("url", f"is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput("url", f"must be http:// or https://, got {parts.scheme or 'none'}")
    if not parts.hostname:
        raise InvalidInput("url", "names no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("url", "must not carry credentials: a receiver authenticates "
                                  "deliveries by their signature")
    if parts.fragment:
        raise InvalidInput("url", "must not have a #fragment")
    if port == 0:
        raise InvalidInput("url", "port 0 is not a port")
    return text


def address_refusal(address: str) -> str | None:
    """Why the sender does not connect to ``address`` (an IP address) without
    ``allow_private``, or ``None``. The webhook transport asks it of every address it
    connects to; ``check_request`` of a URL naming an address, when it is added.

    An IPv4 address inside an IPv6 one (mapped, 6to4, NAT64, Teredo) is judged as itself.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = address_refusal(str(embedded))
            return None if inner is None else f"{inner} (inside {ip})"
    for reason, refused in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                            ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                            ("reserved", ip.is_reserved), ("private", ip.is_private)):
        if refused:
            return reason
    return None if ip.is_global else "not globally routable"


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def check_schedule(schedule: object) -> Schedule:
    """A retry schedule: a ``Schedule``, a preset's name (``SCHEDULES``), or a sequence of
    delays in seconds (each finite, ``0..MAX_DELAY``, at most 32 of them)."""
    if isinstance(schedule, Schedule):
        delays: object = schedule.delays
        name = schedule.name
    elif isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise InvalidInput("schedule", f"unknown schedule {schedule!r}; the presets are "
                                           f"{', '.join(sorted(SCHEDULES))}, or give delays")
        return SCHEDULES[schedule]
    else:
        delays, name = schedule, "custom"
    if not isinstance(delays, (list, tuple)) or len(delays) > _MAX_DELAYS:
        raise InvalidInput("schedule", f"must be a preset's name or at most {_MAX_DELAYS} "
                                       "delays in seconds")
    checked = []
    for index, delay in enumerate(delays):
        seconds = check_number(delay, f"schedule[{index}]")
        if not 0 <= seconds <= MAX_DELAY:
            raise InvalidInput(f"schedule[{index}]", f"must be in 0..{MAX_DELAY:g} seconds")
        checked.append(seconds)
    if name != "custom" and (name not in SCHEDULES or SCHEDULES[name].delays != tuple(checked)):
        raise InvalidInput("schedule", f"{name!r} is not a preset with these delays; name an "
                                       "explicit schedule 'custom'")
    jitter = schedule.jitter if isinstance(schedule, Schedule) else Schedule(name=name).jitter
    if type(jitter) not in (int, float) or not 0.0 <= jitter <= 1.0:
        raise InvalidInput("schedule.jitter", f"must be a number in 0..1, got {jitter!r}")
    return Schedule(name=name, delays=tuple(checked), jitter=float(jitter))


def check_request(settings: Settings, *, principal: str, url: str, allow_private: bool,
                  schedule: object, budget: int | None, concurrency: int) -> EndpointRequest:
    """Check an endpoint to add; ``budget=None`` is the store's ``delivery_budget``."""
    check_text(principal, "principal", max_bytes=settings.limits.text_bytes)
    checked, private = check_url(url), check_bool(allow_private, "allow_private")
    if not private:
        _refuse_private_address(checked)
    return EndpointRequest(
        principal=principal, url=checked, allow_private=private,
        schedule=check_schedule(schedule),
        budget=settings.delivery_budget if budget is None else check_int(
            budget, "budget", low=DELIVERY_BUDGETS[0], high=DELIVERY_BUDGETS[-1]),
        concurrency=check_int(concurrency, "concurrency", low=CONCURRENCY[0],
                              high=CONCURRENCY[-1]))


def _refuse_private_address(url: str) -> None:
    """Refuse a URL whose host is an address the sender never connects to without
    ``allow_private`` (a name is judged by the addresses it resolves to, when delivering)."""
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return
    reason = address_refusal(host)
    if reason is not None:
        raise InvalidInput("url", f"{host} is a {reason} address: deliveries to it are "
                                  "refused unless allow_private is set (--allow-private)")


def _endpoint(tx: Tx, row: Row) -> Endpoint:
    secrets = tuple(EndpointSecret(secret=item["secret"], created_at=float(item["created_at"]),
                                   expires_at=None if item["expires_at"] is None
                                   else float(item["expires_at"]))
                    for item in tx.all("endpoint_secrets_of", principal=row["principal"]))
    schedule = row["schedule"]
    delays = tuple(float(delay) for delay in json.loads(row["delays"]))
    preset = SCHEDULES.get(schedule)
    return Endpoint(
        principal=row["principal"], url=row["url"], secrets=secrets,
        allow_private=bool(row["allow_private"]),
        schedule=preset if preset is not None and preset.delays == delays
        else Schedule(name=schedule, delays=delays),
        budget=int(row["budget"]), concurrency=int(row["concurrency"]),
        created_at=float(row["created_at"]), updated_at=float(row["updated_at"]),
        disabled_at=None if row["disabled_at"] is None else float(row["disabled_at"]),
        disabled_reason=row["disabled_reason"])


def find(tx: Tx, principal: str) -> Endpoint | None:
    """``principal``'s endpoint, or ``None``."""
    row = tx.one("endpoint_get", principal=principal)
    return None if row is None else _endpoint(tx, row)


def get(tx: Tx, principal: str) -> Endpoint:
    """``principal``'s endpoint; ``NotFound`` if it has none."""
    found = find(tx, principal)
    if found is None:
        raise NotFound(f"no endpoint for {principal!r}")
    return found


def listed(tx: Tx) -> list[Endpoint]:
    """Every endpoint, by principal."""
    return [_endpoint(tx, row) for row in tx.all("endpoints_all")]


def _unpark(tx: Tx, principal: str) -> None:
    """``principal``'s parked replies are due now, and the dispatchers hear of it."""
    if tx.change("replies_unpark", principal=principal, now=tx.now):
        tx.notify(REPLIES_CHANNEL)


def add(tx: Tx, request: EndpointRequest, secret: str) -> Endpoint:
    """Register ``request`` with its first signing ``secret``; ``Conflict`` if the principal
    already has an endpoint (remove it first, or rotate its secret)."""
    inserted = tx.one("endpoint_insert", principal=request.principal, url=request.url,
                      allow_private=int(request.allow_private),
                      schedule=request.schedule.name,
                      delays=json.dumps(list(request.schedule.delays)),
                      budget=request.budget, concurrency=request.concurrency, now=tx.now)
    if inserted is None:
        raise Conflict(f"{request.principal!r} already has an endpoint: remove it first, or "
                       "rotate its secret")
    tx.change("endpoint_secret_insert", principal=request.principal, secret=secret, now=tx.now)
    _unpark(tx, request.principal)
    tx.log(_log, logging.INFO, "endpoint added", principal=request.principal,
           state="enabled")
    return get(tx, request.principal)


def remove(tx: Tx, principal: str) -> bool:
    """Forget ``principal``'s endpoint and its secrets; ``False`` if it had none. Its replies
    are parked as they come due, until another endpoint is added."""
    removed = tx.change("endpoint_delete", principal=principal) > 0
    if removed:
        tx.log(_log, logging.INFO, "endpoint removed", principal=principal, state="removed")
    return removed


def rotate(tx: Tx, principal: str, secret: str, *,
           expire_old_after: float | None) -> Endpoint:
    """Add ``secret`` as ``principal``'s newest; with ``expire_old_after``, the older ones
    stop signing that many seconds from now (0: at once), else they keep signing too.

    Secrets already expired are forgotten.
    """
    get(tx, principal)
    tx.change("endpoint_secrets_forget", principal=principal, now=tx.now)
    tx.change("endpoint_secret_insert", principal=principal, secret=secret, now=tx.now)
    if expire_old_after is not None:
        newest = tx.all("endpoint_secrets_of", principal=principal)[0]["secret_id"]
        tx.change("endpoint_secrets_expire", principal=principal, keep=int(newest),
                  expires_at=tx.now + expire_old_after)
    tx.change("endpoint_touch", principal=principal, now=tx.now)
    tx.log(_log, logging.INFO, "endpoint secret rotated", principal=principal)
    return get(tx, principal)


def disable(tx: Tx, principal: str, reason: str) -> Endpoint:
    """Stop delivering to ``principal``'s endpoint, recording when and ``reason``; one already
    disabled keeps its first reason. Its replies are parked as they come due."""
    get(tx, principal)
    if tx.one("endpoint_disable", principal=principal, reason=reason, now=tx.now) is not None:
        tx.log(_log, logging.WARNING, "endpoint disabled", principal=principal,
               state="disabled", last_error=reason)
    return get(tx, principal)


def enable(tx: Tx, principal: str) -> Endpoint:
    """Deliver to ``principal``'s endpoint again; its parked replies are due at once."""
    get(tx, principal)
    if tx.one("endpoint_enable", principal=principal, now=tx.now) is not None:
        tx.log(_log, logging.INFO, "endpoint enabled", principal=principal, state="enabled")
    _unpark(tx, principal)
    return get(tx, principal)


def stopped_by_gone(tx: Tx, principal: str | None, reply_id: str) -> None:
    """An endpoint answered 410 Gone for ``reply_id``: disable it, in the transaction that
    records the reply dead (an endpoint already disabled, or removed meanwhile, stays so)."""
    if principal is None:
        return
    when = datetime.fromtimestamp(tx.now, UTC).isoformat(timespec="seconds")
    reason = f"410 Gone at {when} (delivering {reply_id})"
    if tx.one("endpoint_disable", principal=principal, reason=reason, now=tx.now) is not None:
        tx.log(_log, logging.WARNING, "endpoint disabled", principal=principal,
               reply_id=reply_id, state="disabled", last_error=reason)


def park(tx: Tx, limit: int) -> int:
    """Park the replies at the head of the claimable ones (the ``limit`` a claim would pick)
    whose requester has no enabled endpoint; returns how many."""
    rows = tx.all("replies_park", now=tx.now, limit=limit)
    if rows:
        # More replies may be due behind the ones just parked: the dispatchers look again at
        # once rather than at their next poll, so a backlog of replies with no endpoint never
        # delays the ones behind it by more than the claims that park it.
        tx.notify(REPLIES_CHANNEL)
    for row in rows:
        tx.log(_log, logging.DEBUG, "reply parked: no endpoint", reply_id=row["reply_id"],
               principal=row["requester"], state="pending")
    return len(rows)


def awaiting(tx: Tx) -> dict[str, int]:
    """How many replies are parked waiting for an endpoint, by requester (``""`` for the
    few old replies that name none)."""
    return {row["requester"] or "": int(row["n"]) for row in tx.all("replies_parked_counts")}
