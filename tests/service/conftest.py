"""A real HTTP service per test: uvicorn on 127.0.0.1 (a free port) over the ``store``
fixture (both backends), with one principal of every role and a second of each, to try
every role on every route and every principal on another's records."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

import postroom
from postroom.client import Client
from postroom.http.app import Limits, create_app

#: The principals every service test has: name -> (role, granted queues).
PRINCIPALS = {
    "alice": ("agent", ()), "bob": ("agent", ()),
    "wendy": ("worker", ("default",)), "walt": ("worker", ("other",)),
    "hana": ("human", ()), "hugo": ("human", ()),
    "olga": ("operator", ()),
}


@dataclass
class Service:
    """A running service: its URL, its store, and a token per principal."""

    url: str
    store: postroom.Store
    tokens: dict[str, str] = field(default_factory=dict)
    opened: list[httpx.Client | Client] = field(default_factory=list)

    def http(self, name: str | None = None) -> httpx.Client:
        """A plain HTTP client, authenticated as ``name`` (or not at all); closed with the
        service."""
        headers = {} if name is None else {"authorization": f"Bearer {self.tokens[name]}"}
        self.opened.append(httpx.Client(base_url=self.url, headers=headers, timeout=30))
        return self.opened[-1]

    def client(self, name: str) -> Client:
        """The Python client, as ``name``; closed with the service."""
        self.opened.append(Client(self.url, self.tokens[name], retries=0))
        return self.opened[-1]

    def close(self) -> None:
        for opened in self.opened:
            opened.close()


class Server:
    """uvicorn serving ``app`` in a thread of this process, on a free port."""

    def __init__(self, app: object) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


@pytest.fixture
def limits() -> Limits:
    return Limits(max_body=256 * 1024, timeout=10.0, max_poll=2.0)


@pytest.fixture
def service(store: postroom.Store, limits: Limits) -> Iterator[Service]:
    tokens = {name: store.add_principal(name, role, queues=queues).token
              for name, (role, queues) in PRINCIPALS.items()}
    with Server(create_app(store, limits=limits)) as url:
        running = Service(url=url, store=store, tokens=tokens)
        yield running
        running.close()
