"""HTTP webhooks: POST one reply to its endpoint, signed as Standard Webhooks says.

``Webhooks.deliver(endpoint, outgoing)`` sends the reply's canonical body (``content-type:
application/json``) with ``webhook-id`` (the reply_id), ``webhook-timestamp`` and one
``webhook-signature`` per active secret, and reads the answer as an ``Outcome``
(``outcome_for``):

- 2xx: delivered (new or duplicate: the receiver dedupes by ``webhook-id``);
- 409: collision: the receiver holds this id with other content (dead at once);
- 410: gone: the reply is dead and the endpoint disabled;
- 3xx: a failure (redirects are never followed: a delivery goes where it was registered);
- 408, 429, 5xx: transient, retried no earlier than ``Retry-After`` (seconds or an HTTP
  date) says; other 4xx: permanent;
- a timeout, a refused or dropped connection: transient (the receiver may have committed;
  its dedupe makes the redelivery safe).

Every request is bounded: connecting, each read and write, and the whole exchange.

**Which addresses it connects to.** Loopback, private (RFC 1918, unique local), link-local
(with the 169.254.169.254 metadata service), unspecified, multicast, reserved and other
non-global addresses (IPv4 embedded in IPv6 included) are refused unless the endpoint allows
private addresses. The check is made on the address actually connected to: the connection's
network backend (``GuardedBackend``) resolves the host itself, drops the refused addresses,
and connects to an address it checked, so a DNS answer that changes between a check and the
connection (rebinding) cannot get through. TLS still verifies, and SNI and ``Host`` still
name, the URL's host. Proxies from the environment are not used: through one, the address
connected to would be the proxy's.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import anyio
import httpcore
import httpx

from postroom import AddressRefused, Endpoint, Outcome, Outgoing, __version__
from postroom.endpoints import address_refusal as refusal
from postroom.signing import sign
from postroom.validation import is_decimal

__all__ = ["MAX_RETRY_AFTER", "GuardedBackend", "Timeouts", "Webhooks", "outcome_for",
           "refusal", "retry_after"]

#: The longest ``Retry-After`` honoured, in seconds: a day. A receiver asking for more still
#: gets its next try a day later, not never.
MAX_RETRY_AFTER = 86_400.0
#: The most of a response body read (and thrown away) so that its connection can be reused.
_DRAIN = 4096


class Timeouts:
    """How long one delivery may take: to connect (resolution included), for each read and
    write, and for the whole exchange."""

    __slots__ = ("connect", "read", "total")

    def __init__(self, *, connect: float = 5.0, read: float = 10.0,
                 total: float = 15.0) -> None:
        for name, value in (("connect", connect), ("read", read), ("total", total)):
            if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"timeouts.{name} must be a finite number of seconds > 0")
        self.connect = float(connect)
        self.read = float(read)
        self.total = float(total)

    def __repr__(self) -> str:
        return f"Timeouts(connect={self.connect}, read={self.read}, total={self.total})"


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """A network backend that resolves each host itself and connects only to addresses
    ``refusal`` does not refuse (all of them when ``allow_private``)."""

    def __init__(self, *, allow_private: bool,
                 inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._allow_private = allow_private
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        """Connect to the first address of ``host`` that may be used; ``AddressRefused`` when
        there is none, before any connection is attempted."""
        started = time.monotonic()
        try:
            with anyio.fail_after(timeout):
                answers = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(str(answer[4][0]) for answer in answers))
        refused = {address: refusal(address) for address in addresses}
        usable = [address for address in addresses
                  if self._allow_private or refused[address] is None]
        if not usable:
            found = ", ".join(f"{address} ({refused[address]})" for address in addresses)
            raise AddressRefused(f"{host} resolves only to addresses not connected to "
                                 f"without allow_private: {found or 'none'}")
        last: Exception | None = None
        for address in usable:
            left = None if timeout is None else max(timeout - (time.monotonic() - started), 0.0)
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=left, local_address=local_address,
                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc  # the next address may answer (an IPv6 one down, say)
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        """Never: an endpoint is a URL, not a socket file."""
        raise AddressRefused("webhooks are not delivered to unix sockets")

    async def sleep(self, seconds: float) -> None:
        """Sleep as the inner backend does."""
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose connections ``GuardedBackend`` makes.

    httpx builds its pool without a way to choose the network backend, so the pool is made
    here (with the same TLS context and limits) and put in its place; the test that a refused
    address is never connected to pins this to the httpx in use.
    """

    def __init__(self, *, allow_private: bool, limits: httpx.Limits) -> None:
        super().__init__(trust_env=False, limits=limits)
        ssl_context = httpx.create_ssl_context(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(allow_private=allow_private))


def retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from ``now`` (whole seconds, or an HTTP date), at most
    ``MAX_RETRY_AFTER``; ``None`` when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if is_decimal(value):
        return min(float(int(value[:12])), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(when - now, 0.0), MAX_RETRY_AFTER)


def outcome_for(status: int, headers: Mapping[str, str], *, now: float) -> Outcome:
    """What an HTTP answer means for the delivery (see the module docstring).

    A transient outcome's ``delay`` is the ``Retry-After`` asked for (``None`` without one):
    the dispatcher retries no earlier than that, nor earlier than its schedule says.
    """
    if 200 <= status < 300:
        return Outcome.delivered()
    if status == 409:
        return Outcome.collision("HTTP 409: the receiver holds this webhook-id with other "
                                 "content")
    if status == 410:
        return Outcome.gone("HTTP 410 Gone")
    if 300 <= status < 400:
        location = headers.get("location", "")[:200]
        return Outcome.transient(f"HTTP {status}: redirects are not followed"
                                 + (f" (to {location})" if location else ""))
    if status in (408, 429) or status >= 500:
        return Outcome.transient(f"HTTP {status}",
                                 delay=retry_after(headers.get("retry-after"), now))
    if 400 <= status < 500:
        return Outcome.permanent(f"HTTP {status}")
    return Outcome.transient(f"HTTP {status}: not a final answer")


class Webhooks:
    """Delivers replies to endpoints over HTTP; one per dispatcher, used from one event loop.

    ``clock`` gives the signature's timestamp (Unix seconds; the receiver holds it to its own
    clock). Close with ``aclose``.
    """

    def __init__(self, *, timeouts: Timeouts | None = None, max_connections: int = 100,
                 clock: Callable[[], float] = time.time) -> None:
        self.timeouts = timeouts if timeouts is not None else Timeouts()
        self._clock = clock
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        timeout = httpx.Timeout(self.timeouts.read, connect=self.timeouts.connect,
                                pool=self.timeouts.total)
        # One pool that refuses private addresses and one that allows them: an endpoint's
        # permission decides which pool its connections come from, so a connection made for
        # an allowed endpoint is never reused for one that is not.
        self._clients = {
            allowed: httpx.AsyncClient(
                transport=_GuardedTransport(allow_private=allowed, limits=limits),
                timeout=timeout, follow_redirects=False, trust_env=False,
                headers={"user-agent": f"postroom/{__version__} (webhooks)"})
            for allowed in (False, True)}

    async def deliver(self, endpoint: Endpoint, outgoing: Outgoing) -> Outcome:
        """POST ``outgoing`` to ``endpoint``; what happened, as an ``Outcome``.

        Never raises for what the network or the receiver did: that is the outcome.
        """
        now = self._clock()
        secrets = endpoint.signing_secrets(now)
        if not secrets:
            return Outcome.transient(f"endpoint {endpoint.principal!r} has no active secret")
        headers = sign(secrets, outgoing.reply_id, int(now), outgoing.body)
        headers["content-type"] = "application/json"
        client = self._clients[endpoint.allow_private]
        try:
            async with asyncio.timeout(self.timeouts.total):
                async with client.stream("POST", endpoint.url, headers=headers,
                                         content=outgoing.body.encode("utf-8")) as response:
                    await _drain(response)
                    return outcome_for(response.status_code, response.headers,
                                       now=self._clock())
        except AddressRefused as exc:
            return Outcome.transient(f"address refused: {exc}")
        except (TimeoutError, httpx.TimeoutException):
            return Outcome.transient(f"timed out (no answer within "
                                     f"{self.timeouts.total:g} s); the receiver may have it")
        except httpx.HTTPError as exc:
            return Outcome.transient(f"{type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        """Close every connection."""
        for client in self._clients.values():
            await client.aclose()


async def _drain(response: httpx.Response) -> None:
    """Read a little of the body, so that a short answer leaves its connection reusable;
    a long one is cut off (its connection is then closed), since nothing in it counts."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > _DRAIN:
            return
