"""The webhook transport against real servers on 127.0.0.1: what each answer means, what
is never done (follow a redirect, connect to a refused address), and the signatures sent."""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest

import postroom
from postroom import OutcomeKind, signing
from postroom.runtime.transports.webhook import Timeouts, Webhooks
from tests.http.servers import RawServer, answer, refusing_port, serve

SECRET = signing.new_secret()
BODY = json.dumps({"kind": "result", "task_id": "t-1", "status": "done", "result": 1})


def endpoint(url: str, *, allow_private: bool = True,
             secrets: tuple[str, ...] = (SECRET,)) -> postroom.Endpoint:
    return postroom.Endpoint(
        principal="planner", url=url, allow_private=allow_private,
        secrets=tuple(postroom.EndpointSecret(secret=secret, created_at=0.0)
                      for secret in secrets),
        schedule=postroom.Schedule(name="default"), budget=3, concurrency=4,
        created_at=0.0, updated_at=0.0)


OUTGOING = postroom.Outgoing(reply_id="reply:t-1", body=BODY, fingerprint="f")


def deliver(target: postroom.Endpoint, *, timeouts: Timeouts | None = None
            ) -> postroom.Outcome:
    async def go() -> postroom.Outcome:
        webhooks = Webhooks(timeouts=timeouts or Timeouts(connect=2, read=2, total=3))
        try:
            return await webhooks.deliver(target, OUTGOING)
        finally:
            await webhooks.aclose()

    return asyncio.run(go())


class Answering:
    """An ASGI app answering ``status`` (with ``headers``) and keeping what it was sent."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append((scope["path"], {k.decode(): v.decode()
                                              for k, v in scope["headers"]}, body))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(k.encode(), v.encode()) for k, v in self.headers.items()]})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.parametrize(("status", "kind"), [
    (200, OutcomeKind.DELIVERED), (201, OutcomeKind.DELIVERED), (204, OutcomeKind.DELIVERED),
    (409, OutcomeKind.COLLISION), (410, OutcomeKind.GONE),
    (400, OutcomeKind.PERMANENT), (401, OutcomeKind.PERMANENT), (404, OutcomeKind.PERMANENT),
    (413, OutcomeKind.PERMANENT), (422, OutcomeKind.PERMANENT),
    (408, OutcomeKind.TRANSIENT), (429, OutcomeKind.TRANSIENT), (500, OutcomeKind.TRANSIENT),
    (502, OutcomeKind.TRANSIENT), (503, OutcomeKind.TRANSIENT),
    (301, OutcomeKind.TRANSIENT), (302, OutcomeKind.TRANSIENT), (307, OutcomeKind.TRANSIENT),
])
def test_each_answer_is_read_as_its_outcome(status, kind):
    app = Answering(status)
    with serve(app) as url:
        outcome = deliver(endpoint(url + "/hook"))
    assert outcome.kind is kind, outcome
    assert str(status) in outcome.detail or kind is OutcomeKind.DELIVERED
    assert len(app.requests) == 1


def test_the_request_is_the_signed_canonical_body():
    app = Answering(200)
    with serve(app) as url:
        deliver(endpoint(url + "/hook"))
    path, headers, body = app.requests[0]
    assert (path, body.decode()) == ("/hook", BODY)
    assert headers["content-type"] == "application/json"
    assert headers["webhook-id"] == "reply:t-1"
    assert signing.verify([SECRET], headers, BODY, now=int(headers["webhook-timestamp"])) \
        == "reply:t-1"


def test_during_a_rotation_each_active_secret_signs_and_either_verifies():
    old, new = signing.new_secret(), signing.new_secret()
    app = Answering(200)
    with serve(app) as url:
        deliver(endpoint(url, secrets=(new, old)))
    _, headers, body = app.requests[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    now = int(headers["webhook-timestamp"])
    for known in ([old], [new]):
        assert signing.verify(known, headers, body.decode(), now=now) == "reply:t-1"
    with pytest.raises(postroom.BadSignature):
        signing.verify([signing.new_secret()], headers, body.decode(), now=now)


def test_a_redirect_is_not_followed():
    target = Answering(200)
    with serve(target) as elsewhere:
        app = Answering(302, {"location": elsewhere + "/stolen"})
        with serve(app) as url:
            outcome = deliver(endpoint(url))
    assert outcome.kind is OutcomeKind.TRANSIENT and "not followed" in outcome.detail
    assert target.requests == []


def test_retry_after_is_carried_as_the_earliest_retry():
    with serve(Answering(503, {"retry-after": "120"})) as url:
        outcome = deliver(endpoint(url))
    assert (outcome.kind, outcome.delay) == (OutcomeKind.TRANSIENT, 120.0)
    with serve(Answering(429)) as url:
        assert deliver(endpoint(url)).delay is None


def test_a_receiver_that_never_answers_times_out_as_transient():
    async def silent(line, headers, body):
        await asyncio.sleep(30)

    with RawServer(silent) as server:
        outcome = deliver(endpoint(server.url), timeouts=Timeouts(connect=1, read=0.5,
                                                                  total=1))
    assert outcome.kind is OutcomeKind.TRANSIENT and "timed out" in outcome.detail


def test_a_dropped_connection_and_a_refused_one_are_transient():
    async def hang_up(line, headers, body):
        return None

    with RawServer(hang_up) as server:
        dropped = deliver(endpoint(server.url))
    refused = deliver(endpoint(f"http://127.0.0.1:{refusing_port()}"))
    assert dropped.kind is OutcomeKind.TRANSIENT and server.accepted == 1
    assert refused.kind is OutcomeKind.TRANSIENT and "Connect" in refused.detail


# -- which addresses are connected to ------------------------------------------------------


def test_loopback_is_refused_without_a_connection_unless_allowed():
    async def ok(line, headers, body):
        return answer(200)

    with RawServer(ok) as server:
        for url in (server.url, f"http://localhost:{server.port}"):
            refused = deliver(endpoint(url, allow_private=False))
            assert refused.kind is OutcomeKind.TRANSIENT, refused
            assert "address refused" in refused.detail and "loopback" in refused.detail
        assert server.accepted == 0  # nothing ever reached the listener
        assert deliver(endpoint(server.url, allow_private=True)).kind is OutcomeKind.DELIVERED
        assert server.accepted == 1


@pytest.mark.parametrize("host", ["169.254.169.254", "10.0.0.1", "192.168.1.1", "[::1]",
                                  "[fd00::1]", "0.0.0.0", "[::ffff:127.0.0.1]"])
def test_private_metadata_and_other_local_addresses_are_refused_before_connecting(host):
    outcome = deliver(endpoint(f"http://{host}:8080/hook", allow_private=False))
    assert outcome.kind is OutcomeKind.TRANSIENT and "address refused" in outcome.detail


def test_the_address_checked_is_the_one_connected_to(monkeypatch):
    # A name that resolves to a public address when the endpoint is registered and to
    # loopback when it is delivered to (DNS rebinding): the check is made on what the
    # connection would use, so nothing is connected.
    async def rebinding(host, port, **kwargs):
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(anyio, "getaddrinfo", rebinding)

    async def ok(line, headers, body):
        return answer(200)

    with RawServer(ok) as server:
        outcome = deliver(endpoint(f"http://hooks.example.com:{server.port}/",
                                   allow_private=False))
        assert outcome.kind is OutcomeKind.TRANSIENT and "127.0.0.1 (loopback)" in \
            outcome.detail
        assert server.accepted == 0
        # Allowed, the very same name connects to the address it resolved to.
        allowed = deliver(endpoint(f"http://hooks.example.com:{server.port}/",
                                   allow_private=True))
        assert allowed.kind is OutcomeKind.DELIVERED and server.accepted == 1
