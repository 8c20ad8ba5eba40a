"""RFC 9457 problem details: every error the service answers, as ``application/problem+json``.

A ``Problem`` is raised anywhere while a request is served and answered as::

    {"type": "/problems/lease-lost", "title": "Lease lost", "status": 409,
     "detail": "...", "field": "fence"}

``type`` is a path relative to the service; ``field`` (when one is to blame) names the
request field as postroom's validation does (``envelopes[2].payload``). ``problem_for``
translates postroom's exception tree: the service adds nothing of its own to the meaning.

Not-found answers are one constant (``NOT_FOUND``) whatever was looked for: "there is none"
and "it is not yours" must read the same, byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

from postroom import (
    BatchFailed,
    Conflict,
    Fenced,
    InvalidInput,
    NotApproved,
    NotFound,
    PayloadCollision,
    PostroomError,
    StoreUnavailable,
    Unauthorized,
    WaitNotOpened,
)

__all__ = ["CONTENT_TYPE", "NOT_FOUND", "Problem", "problem_for"]

CONTENT_TYPE = "application/problem+json"


class Problem(Exception):
    """An error answer: ``status``, a ``kind`` (the last part of its ``type``), a ``title``,
    a ``detail``, and any extension members (``field``, ``acks``, ...)."""

    def __init__(self, status: int, kind: str, title: str, detail: str, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def document(self) -> dict[str, Any]:
        """The problem+json body."""
        return {"type": f"/problems/{self.kind}", "title": self.title, "status": self.status,
                "detail": self.detail, **self.extra}

    def body(self) -> bytes:
        """The encoded body."""
        return json.dumps(self.document(), ensure_ascii=False).encode("utf-8")


#: The one answer for "no such record" and "not yours".
NOT_FOUND = Problem(404, "not-found", "Not found", "no such record, or not visible to you")


def problem_for(exc: PostroomError) -> Problem:
    """The problem that answers a postroom error raised by the store."""
    if isinstance(exc, BatchFailed):
        cause = exc.error
        inner = problem_for(cause) if isinstance(cause, PostroomError) else Problem(
            500, "internal", "Internal error", type(cause).__name__)
        extra = dict(inner.extra)
        if "field" in extra:
            extra["field"] = f"envelopes[{exc.index}].{extra['field']}"
        return Problem(inner.status, inner.kind, inner.title, inner.detail,
                       headers=inner.headers, **extra,
                       acks=[ack.to_dict() for ack in exc.acks], failed_index=exc.index)
    if isinstance(exc, InvalidInput):
        return Problem(400, "invalid-input", "Invalid input", str(exc), field=exc.field)
    if isinstance(exc, NotApproved):
        return Problem(403, "not-approved", "Not approved", str(exc), action=exc.action,
                       resource=exc.resource, reason=exc.reason)
    if isinstance(exc, Unauthorized):
        return Problem(403, "forbidden", "Forbidden", str(exc))
    if isinstance(exc, Fenced):
        if exc.identity.startswith("reply "):  # an operator's requeue: the store's reason
            return Problem(409, "lease-lost", "Not current", str(exc))
        # A task's claim: the same words whatever the reason, so that a worker learns
        # nothing of who holds the task now.
        return Problem(409, "lease-lost", "Lease lost",
                       "the claim is no longer current: another worker holds the task, or "
                       "its lease or deadline ran out; nothing was written")
    if isinstance(exc, PayloadCollision):
        return Problem(409, "payload-collision", "Payload collision", str(exc),
                       identity=exc.identity, collision=exc.detail)
    if isinstance(exc, WaitNotOpened):
        opening = exc.opening
        return Problem(409, "wait-not-opened", "Wait not opened", str(exc),
                       flow=opening.flow, step=opening.step, result=opening.result.value,
                       generation=opening.generation)
    if isinstance(exc, Conflict):
        return Problem(409, "conflict", "Conflict", str(exc))
    if isinstance(exc, NotFound):
        return NOT_FOUND
    if isinstance(exc, StoreUnavailable):
        return Problem(503, "unavailable", "Store unavailable", str(exc),
                       headers={"retry-after": "1"})
    return Problem(500, "internal", "Internal error", type(exc).__name__)
