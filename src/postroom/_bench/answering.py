"""An HTTP server that does nothing but answer: the floor under any HTTP figure.

``python -m postroom._bench.answering PORT`` listens on 127.0.0.1:PORT and answers every
request, on a keep-alive connection, with the same ``202 Accepted`` and a two-byte body. It
reads a request only as far as HTTP/1.1 framing needs (the header block, then
``content-length`` bytes): no framework, no routing, no JSON, no store. A client's requests to
it cost what the client, the loopback and one event-loop callback cost, which is the least an
HTTP submission can cost on this machine with that client. It prints ``ready`` when it
listens and runs until it is killed.

``python -m postroom._bench.answering PORT --asgi`` answers the same way through the stack
``postroom serve`` stands on, without postroom: uvicorn with the options ``postroom serve``
gives it, and an ASGI app that reads the body, makes one trip to a worker thread (as every
API request does, to call the store) and answers. What a request costs there, less what it
costs the plain server, is the server's own floor: no framework, no authentication, no store.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["ANSWER", "READY"]

#: What every request is answered with.
ANSWER = (b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\n"
          b"content-length: 2\r\n\r\n{}")
#: Printed on stdout once the server listens.
READY = b"ready"


class _Answering(asyncio.Protocol):
    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head, found, rest = self._buffer.partition(b"\r\n\r\n")
            if not found:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self._buffer = rest[length:]
            assert self._transport is not None
            self._transport.write(ANSWER)


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Answering, "127.0.0.1", port)
    sys.stdout.buffer.write(READY + b"\n")
    sys.stdout.flush()
    await server.serve_forever()


_THREADS = ThreadPoolExecutor(4, thread_name_prefix="answering")


def _nothing() -> None:
    return None


async def _asgi(scope: MutableMapping[str, Any], receive: Callable[[], Any],
                send: Callable[[MutableMapping[str, Any]], Any]) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message["type"] == "http.request" and message.get("more_body", False)
    await asyncio.get_running_loop().run_in_executor(_THREADS, _nothing)
    await send({"type": "http.response.start", "status": 202,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _serve_asgi(port: int) -> None:
    import uvicorn

    from postroom.http.app import UVICORN_OPTIONS

    options = {**UVICORN_OPTIONS, "log_level": "warning", "lifespan": "off"}
    server = uvicorn.Server(uvicorn.Config(_asgi, host="127.0.0.1", port=port, **options))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # it failed to start: say why
            return
        await asyncio.sleep(0.01)
    sys.stdout.buffer.write(READY + b"\n")
    sys.stdout.flush()
    await serving


if __name__ == "__main__":
    if sys.argv[2:] == ["--asgi"]:
        try:  # the loop uvicorn picks when it runs ``postroom serve``
            import uvloop
        except ImportError:
            asyncio.run(_serve_asgi(int(sys.argv[1])))
        else:
            uvloop.run(_serve_asgi(int(sys.argv[1])))
    else:
        asyncio.run(_serve(int(sys.argv[1])))
