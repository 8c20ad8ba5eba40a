"""The receiving side of webhooks: a ``Receiver`` behind a plain ASGI app.

Mount ``ReceiverApp(receiver, secrets)`` at the URL an endpoint was registered with (any ASGI
server or framework can serve it; it needs neither). For each POST it:

1. refuses a body over ``max_body`` bytes (413) from its ``content-length`` or as soon as
   more arrives, before reading the rest;
2. checks the Standard Webhooks headers: ``webhook-signature`` must match one of ``secrets``
   (during a rotation the sender signs with old and new secrets, so a receiver holding
   either accepts) and ``webhook-timestamp`` must be within ``tolerance`` of its clock
   (401 otherwise; a missing or malformed header, or a body that is not UTF-8, is 400);
3. takes the reply into the receiver, deduped by ``webhook-id`` (the reply_id) and the
   content fingerprint it computes itself, the receipt and the business effect committing
   together: 200 for a new reply and for a duplicate (``{"duplicate": true}``), 409 for the
   same id with other content, 400 for a body that is not a result document, 503 (with
   ``Retry-After``) when its database is briefly unavailable.

So a delivery whose answer was lost is simply sent again and acknowledged as a duplicate,
with no second effect. A server that does not speak ASGI (``postroom demo``'s, on the
standard library's ``http.server``) asks ``refuse_length`` before it reads a body and
``take`` with it: the same checks, answered the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from postroom import (
    BadSignature,
    InvalidInput,
    PayloadCollision,
    PostroomError,
    Receiver,
    StoreUnavailable,
)
from postroom.http.asgi import Receive, Scope, Send, send_body
from postroom.signing import TOLERANCE, secret_key, verify
from postroom.validation import REPLY_BODY_BYTES, is_decimal

__all__ = ["ReceiverApp"]

class _Refused(Exception):
    """Answer ``status`` with ``problem`` (raised while reading a request)."""

    def __init__(self, status: int, problem: str) -> None:
        super().__init__(problem)
        self.status = status
        self.problem = problem


class ReceiverApp:
    """An ASGI app that takes signed webhook deliveries into ``receiver``.

    ``secrets`` are the endpoint's signing secrets this side knows (``whsec_...``); ``clock``
    gives Unix seconds for the timestamp window.
    """

    def __init__(self, receiver: Receiver, secrets: Sequence[str], *,
                 max_body: int = REPLY_BODY_BYTES, tolerance: float = TOLERANCE,
                 clock: Callable[[], float] = time.time) -> None:
        if not secrets:
            raise InvalidInput("secrets", "a receiver needs at least one secret to verify with")
        for index, secret in enumerate(secrets):
            secret_key(secret, f"secrets[{index}]")
        self.receiver = receiver
        self._secrets = list(secrets)
        self._max_body = max_body
        self._tolerance = tolerance
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            if scope["method"] != "POST":
                raise _Refused(405, "only POST delivers a webhook")
            headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                       for name, value in scope["headers"]}
            body = await self._body(headers, receive)
            # In a thread: the receiver's database is synchronous.
            status, answer = await asyncio.to_thread(self.take, headers, body)
        except _Refused as refused:
            status, answer = refused.status, {"error": refused.problem}
        await send_body(send, status, json.dumps(answer).encode("utf-8"), "application/json",
                        {"retry-after": "1"} if status == 503 else None)

    def refuse_length(self, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]] | None:
        """The answer to a POST whose ``content-length`` (``headers`` in lower case) is
        unreadable or too long, before any of its body is read; ``None`` when it may be
        read."""
        try:
            self._check_length(headers)
        except _Refused as refused:
            return refused.status, {"error": refused.problem}
        return None

    def take(self, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        """Verify one POST (``headers`` in lower case) and take its reply into the receiver:
        the HTTP status to answer and the JSON document to answer with (the module
        docstring lists them). Synchronous: any server can call it, from one of its threads.
        """
        if len(body) > self._max_body:
            return 413, {"error": f"the body may have at most {self._max_body} bytes"}
        try:
            text = body.decode("utf-8")
            reply_id = verify(self._secrets, headers, text, now=self._clock(),
                              tolerance=self._tolerance)
        except UnicodeDecodeError:
            return 400, {"error": "the body is not UTF-8"}
        except BadSignature as exc:
            return 401, {"error": str(exc)}
        except InvalidInput as exc:
            return 400, {"error": str(exc)}
        return self._accept(reply_id, text)

    def _check_length(self, headers: Mapping[str, str]) -> None:
        declared = headers.get("content-length")
        if declared is not None and (not is_decimal(declared)
                                     or int(declared) > self._max_body):
            raise _Refused(413 if is_decimal(declared) else 400,
                           f"the body may have at most {self._max_body} bytes")

    async def _body(self, headers: dict[str, str], receive: Receive) -> bytes:
        self._check_length(headers)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "the client went away mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise _Refused(413, f"the body may have at most {self._max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _accept(self, reply_id: str, body: str) -> tuple[int, dict[str, Any]]:
        """Take the verified reply into the receiver."""
        try:
            ack = self.receiver.accept(reply_id, body)
        except PayloadCollision as exc:
            return 409, {"error": str(exc)}
        except InvalidInput as exc:
            return 400, {"error": str(exc)}
        except StoreUnavailable as exc:
            return 503, {"error": str(exc)}
        except PostroomError as exc:
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        return 200, {"ack": ack.ack, "reply_id": ack.reply_id, "duplicate": ack.duplicate}


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
