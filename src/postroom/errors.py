"""The exception tree of postroom.

Every error postroom raises on purpose is a ``PostroomError``::

    PostroomError
    ├── Unauthorized            (also PermissionError)  the principal may not do this
    │   ├── Unconfirmed                                 a confirmed token no longer authenticates
    │   ├── BadSignature                                a webhook's signature or timestamp fails
    │   └── NotApproved                                 a side effect has no usable approval
    ├── InvalidInput            (also ValueError)       refused before any write; names the field
    │   └── InvalidEnvelope                             ... for a field of an Envelope
    ├── Conflict                                        same identity, different meaning
    │   ├── PayloadCollision                            same id, different content fingerprint
    │   └── WaitNotOpened                               a finish's wait could not open
    ├── Fenced                                          a stale owner or fence; nothing written
    ├── BatchFailed                                     item-by-item batch stopped; has the prefix
    ├── NotFound                (also LookupError)      no such task / reply
    ├── DeliveryError                                   a transport could not deliver a reply
    │   ├── TransientDeliveryError                      try again later (ACK lost, timeout, 5xx)
    │   │   └── AddressRefused                          the endpoint's address is not to be used
    │   └── PermanentDeliveryError                      will never succeed as sent (4xx)
    └── StoreError                                      the database, translated at the boundary
        ├── StoreUnavailable                            transient, nothing committed: safe to retry
        ├── OutcomeUnknown                              the connection died during COMMIT
        └── SchemaError                                 missing or newer schema than this code

Database driver exceptions never escape: the store translates them with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from postroom.models import Ack, WaitOpening

__all__ = [
    "AddressRefused",
    "BadSignature",
    "BatchFailed",
    "Conflict",
    "DeliveryError",
    "Fenced",
    "InvalidEnvelope",
    "InvalidInput",
    "NotApproved",
    "NotFound",
    "OutcomeUnknown",
    "PayloadCollision",
    "PermanentDeliveryError",
    "PostroomError",
    "SchemaError",
    "StoreError",
    "StoreUnavailable",
    "TransientDeliveryError",
    "Unauthorized",
    "Unconfirmed",
    "WaitNotOpened",
]


class PostroomError(Exception):
    """Base class of every error postroom raises on purpose."""


class Unauthorized(PostroomError, PermissionError):
    """The authenticated principal is not an allowed source, or does not match the sender."""


class Unconfirmed(Unauthorized):
    """A token that ``Store.confirming`` was to confirm no longer authenticates its principal
    (revoked, rotated out or expired): the transaction was rolled back."""


class BadSignature(Unauthorized):
    """A webhook's ``webhook-signature`` matches none of the receiver's secrets, or its
    ``webhook-timestamp`` is outside the tolerated window: the request is not believed."""


class NotApproved(Unauthorized):
    """A side effect found no usable human approval of its action, resource and data: none
    granted, or the one named expired, revoked, used up, or granted for another resource or
    other data. The finish that declared it wrote nothing. ``reason`` says which."""

    def __init__(self, action: str, resource: str, reason: str) -> None:
        self.action = action
        self.resource = resource
        self.reason = reason
        super().__init__(f"side effect {action!r} on {resource!r} is not approved: {reason}")


class InvalidInput(PostroomError, ValueError):
    """An argument broke a documented limit. Raised before anything is written.

    ``field`` names the offending field (dotted for nested values, e.g. ``payload.a.b``).
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidEnvelope(InvalidInput):
    """A field of an ``Envelope`` broke a documented limit."""


class Conflict(PostroomError):
    """The same identity was used again with a different meaning."""


class PayloadCollision(Conflict):
    """The same identity arrived with a different content fingerprint.

    The stored record is untouched; ``identity`` names it.
    """

    def __init__(self, identity: str, detail: str = "") -> None:
        self.identity = identity
        self.detail = detail
        message = f"{identity} already exists with different content"
        super().__init__(f"{message}: {detail}" if detail else message)


class WaitNotOpened(Conflict):
    """A wait that ``finish`` was to open with the task's result did not open, so the finish
    wrote nothing: the slot was not at the expected generation (``stale``), its current
    generation is still waiting (``busy``) or its continuation is unconsumed
    (``pending_continuation``). ``opening`` is what ``open_wait`` answered."""

    def __init__(self, opening: WaitOpening) -> None:
        self.opening = opening
        super().__init__(f"wait {opening.flow!r}/{opening.step!r} did not open: "
                         f"{opening.result.value} (its generation is {opening.generation}); "
                         f"nothing was written")


class Fenced(PostroomError):
    """The caller's claim is no longer the current one, so nothing was written.

    Raised when the task or reply is not in the expected state, the owner or fence does not
    match, the lease has expired, or the deadline has passed. ``decided_at`` is the decision
    time when time decided it (a lease or deadline that ran out): the store keeps that time
    as it keeps every decision's, so a clock stepping back cannot make the same call succeed.
    """

    def __init__(self, identity: str, reason: str, *, decided_at: float | None = None) -> None:
        self.identity = identity
        self.reason = reason
        self.decided_at = decided_at
        super().__init__(f"{identity}: {reason}")


class BatchFailed(PostroomError):
    """An item-by-item batch stopped at ``index``.

    ``acks`` holds the ACKs of the committed prefix (items ``0 .. index-1``); they are durable.
    The failing item's own error is the ``__cause__``.
    """

    def __init__(self, acks: Sequence[Ack], index: int, error: BaseException) -> None:
        self.acks = list(acks)
        self.index = index
        self.error = error
        super().__init__(f"batch stopped at item {index} after {index} committed: {error}")


class NotFound(PostroomError, LookupError):
    """No record with that identity exists."""


class DeliveryError(PostroomError):
    """A transport could not deliver a reply."""


class TransientDeliveryError(DeliveryError):
    """Delivery may succeed later: the ACK was lost, a timeout, a connection error, a 5xx."""


class AddressRefused(TransientDeliveryError):
    """The sender would not connect: the endpoint's host resolved only to addresses it refuses
    (loopback, private, link-local, metadata, ...) and the endpoint does not allow them.

    Nothing was sent. Transient, since a DNS answer may change; the budget ends it.
    """


class PermanentDeliveryError(DeliveryError):
    """Delivery will never succeed for this content (e.g. a 4xx other than 408/429)."""


class StoreError(PostroomError):
    """The database failed in a way postroom could not hide."""


class StoreUnavailable(StoreError):
    """A transient database condition (locked, busy, connection lost); safe to retry.

    Raised only when the transaction certainly committed nothing: a retry cannot double it.
    """


class OutcomeUnknown(StoreError):
    """The connection was lost while COMMIT was in flight and its fate could not be learned.

    The operation may or may not have taken effect. Read the record back before acting again;
    postroom's idempotent operations (``receive``, delivery) may simply be repeated.
    """


class SchemaError(StoreError):
    """The database's schema is missing, damaged, or newer than this code."""
