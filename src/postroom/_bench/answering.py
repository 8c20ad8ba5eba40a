"""An HTTP server that does nothing but answer: the floor under any HTTP figure.

``python -m postroom._bench.answering PORT`` listens on 127.0.0.1:PORT and answers every
request, on a keep-alive connection, with the same ``202 Accepted`` and a two-byte body. It
reads a request only as far as HTTP/1.1 framing needs (the header block, then
``content-length`` bytes): no framework, no routing, no JSON, no store. A client's requests to
it cost what the client, the loopback and one event-loop callback cost, which is the least an
HTTP submission can cost on this machine with that client. It prints ``ready`` when it
listens and runs until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

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


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
