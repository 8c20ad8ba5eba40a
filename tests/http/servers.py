"""Real servers on 127.0.0.1 for the webhook tests: an ASGI app under uvicorn in a thread,
and a bare TCP listener that does what no well-behaved server would (drop a connection after
committing, never answer), counting the connections it accepts."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn


def _bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on 127.0.0.1; yields its base URL."""
    sock = _bound()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


Handler = Callable[[bytes, dict[str, str], bytes], Awaitable[bytes | None]]


class RawServer:
    """A TCP server on 127.0.0.1 that reads one HTTP/1.1 request per connection and hands
    it to ``handler(request_line, headers, body)``: the bytes it returns are written back,
    ``None`` closes the connection without a word. ``accepted`` counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self._sock = _bound()
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, sock=self._sock)
            self._started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")
            headers = {name.strip().lower(): value.strip() for name, value in
                       (item.split(":", 1) for item in fields if ":" in item)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answer = await self.handler(line.encode("latin-1"), headers, body)
            if answer is not None:
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    def __enter__(self) -> RawServer:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            while self._tasks:  # each closes its connection as it ends
                await asyncio.sleep(0.01)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._sock.close()


def refusing_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    sock = _bound()
    port = sock.getsockname()[1]
    sock.close()
    return port


def answer(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """An HTTP/1.1 response, closing its connection."""
    lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", "connection: close",
             *(f"{name}: {value}" for name, value in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Switch:
    """An ASGI app that passes every request to ``app``, set once the URL is known (an
    endpoint's secret is made when it is added, and it is added with the server's URL)."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, "the test set no app"
        await self.app(scope, receive, send)
