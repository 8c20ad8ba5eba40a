"""Webhook signatures as Standard Webhooks defines them: pure functions, no I/O, no clock.

A delivery carries three headers:

- ``webhook-id``: the reply_id (the same on every redelivery, so the receiver dedupes by it);
- ``webhook-timestamp``: when it was signed, in whole seconds since the Unix epoch;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256>`` of ``"{id}.{timestamp}.{body}"``, one per
  active secret, separated by spaces, so that a receiver that knows either the old or the new
  secret accepts a delivery made during a rotation.

A secret is ``whsec_`` followed by the base64 of its key bytes; the HMAC key is those bytes.
The receiver checks that one signature matches one of its secrets (compared in constant time)
and that the timestamp is within ``TOLERANCE`` of its own clock, which bounds how long a
captured request can be replayed (the id dedupes replays inside the window).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
from collections.abc import Mapping, Sequence

from postroom.errors import BadSignature, InvalidInput
from postroom.validation import is_decimal

__all__ = ["PREFIX", "SECRET_BYTES", "TOLERANCE", "new_secret", "secret_key", "sign",
           "signature", "verify"]

#: What every secret starts with.
PREFIX = "whsec_"
#: Random bytes in a new secret (Standard Webhooks asks for 24 to 64).
SECRET_BYTES = 32
#: Seconds a signature's timestamp may be off the receiver's clock, either way.
TOLERANCE = 300.0
#: The signature scheme postroom writes and reads (others in the header are ignored).
_VERSION = "v1"


def new_secret() -> str:
    """A fresh secret: ``whsec_`` + base64 of ``SECRET_BYTES`` random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str, field: str = "secret") -> bytes:
    """The HMAC key of ``secret``: the base64-decoded part after ``whsec_``.

    ``InvalidInput`` naming ``field`` for anything else, or for a key under 24 bytes.
    """
    if type(secret) is not str or not secret.startswith(PREFIX):
        raise InvalidInput(field, f"must be a string starting with {PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(field, f"must be {PREFIX!r} followed by base64") from None
    if len(key) < 24:
        raise InvalidInput(field, f"its key has {len(key)} bytes; at least 24 are needed")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """``v1,<base64 HMAC-SHA256(key, "{msg_id}.{timestamp}.{body}")>``."""
    content = f"{msg_id}.{timestamp}.{body}".encode()
    digest = hmac.new(secret_key(secret), content, hashlib.sha256).digest()
    return f"{_VERSION},{base64.b64encode(digest).decode('ascii')}"


def sign(secrets_: Sequence[str], msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three webhook headers for ``body``, signed with every one of ``secrets_``."""
    if not secrets_:
        raise InvalidInput("secrets", "at least one secret is needed to sign")
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(timestamp)),
            "webhook-signature": " ".join(signature(secret, msg_id, int(timestamp), body)
                                          for secret in secrets_)}


def verify(secrets_: Sequence[str], headers: Mapping[str, str], body: str, *, now: float,
           tolerance: float = TOLERANCE) -> str:
    """Check a delivery's headers against ``body``; return its ``webhook-id``.

    ``headers`` are keyed in lower case. A missing or malformed header is ``InvalidInput``
    naming it; a timestamp more than ``tolerance`` seconds from ``now`` or no signature that
    matches one of ``secrets_`` is ``BadSignature``.
    """
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    offered = headers.get("webhook-signature")
    for name, value in (("webhook-id", msg_id), ("webhook-timestamp", stamp),
                        ("webhook-signature", offered)):
        if not value:
            raise InvalidInput(name, "header missing")
    assert msg_id is not None and stamp is not None and offered is not None
    if not is_decimal(stamp) or len(stamp) > 12:
        raise InvalidInput("webhook-timestamp", "must be whole seconds since the Unix epoch")
    timestamp = int(stamp)
    if not math.isfinite(now) or abs(now - timestamp) > tolerance:
        raise BadSignature(f"webhook-timestamp {timestamp} is more than {tolerance:g} s from "
                           f"the receiver's time {int(now)}")
    wanted = [signature(secret, msg_id, timestamp, body) for secret in secrets_]
    for candidate in offered.split(" "):
        # Every candidate is compared with every secret, each in constant time: how long
        # this takes tells nothing about how much of a signature was right.
        if any(hmac.compare_digest(candidate.encode(), expected.encode())
               for expected in wanted):
            return msg_id
    raise BadSignature("webhook-signature matches none of the receiver's secrets")
