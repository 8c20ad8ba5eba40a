"""The few ASGI pieces the service's apps share, with no web framework: the types of an ASGI
call and ``send_body``, which answers a request with one whole body.

The receiving side of webhooks (``postroom.http.receiving``) and the metrics endpoint are
plain ASGI apps, and the API's dispatcher answers without Starlette's response classes; all
of them answer through ``send_body``, so a response is framed one way everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["Message", "Receive", "Scope", "Send", "send_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def send_body(send: Callable[[Message], Any], status: int, body: bytes,
                    content_type: str, headers: Mapping[str, str] | None = None, *,
                    head: bool = False) -> None:
    """Answer with ``status`` and ``body`` (its ``content-length`` set; left out of the
    answer to a ``HEAD``, whose length it still gives), plus ``headers``."""
    fields = [(b"content-type", content_type.encode("latin-1")),
              (b"content-length", str(len(body)).encode("ascii"))]
    fields += [(key.encode("latin-1"), value.encode("latin-1"))
               for key, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": b"" if head else body})
