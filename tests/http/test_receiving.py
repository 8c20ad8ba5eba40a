"""The receiving app (``postroom.http.receiving``) under a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import time

import httpx
import pytest

import postroom
from postroom import signing
from postroom.http.receiving import ReceiverApp
from postroom.validation import canonical_json
from tests.http.servers import serve

SECRET = signing.new_secret()


def body(task_id: str = "t-1", result: object = 1) -> str:
    return canonical_json({"kind": "result", "task_id": task_id, "status": "done",
                           "result": result})


def signed(text: str, *, reply_id: str = "reply:t-1", secrets: tuple[str, ...] = (SECRET,),
           at: float | None = None) -> dict[str, str]:
    stamp = int(time.time() if at is None else at)
    return signing.sign(list(secrets), reply_id, stamp, text) | {
        "content-type": "application/json"}


@pytest.fixture
def app(receiver):
    return ReceiverApp(receiver, [SECRET], max_body=4096)


def post(url: str, text: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, content=text.encode(), headers=headers, timeout=10)


def test_a_new_reply_then_its_duplicate_are_acknowledged_with_one_effect(app, receiver):
    with serve(app) as url:
        first = post(url, body(), signed(body()))
        again = post(url, body(), signed(body()))
    assert (first.status_code, first.json()["duplicate"]) == (200, False)
    assert (again.status_code, again.json()["duplicate"]) == (200, True)
    assert receiver.effect_count("reply:t-1") == 1


def test_the_same_id_with_other_content_is_409(app, receiver):
    with serve(app) as url:
        assert post(url, body(), signed(body())).status_code == 200
        other = body(result=2)
        assert post(url, other, signed(other)).status_code == 409
    assert receiver.effect_count("reply:t-1") == 1


@pytest.mark.parametrize("damage", ["signature", "secret", "stale", "future"])
def test_a_bad_signature_or_a_timestamp_out_of_the_window_is_401(app, receiver, damage):
    headers = {
        "signature": lambda: signed(body()) | {"webhook-signature": "v1,AAAA"},
        "secret": lambda: signed(body(), secrets=(signing.new_secret(),)),
        "stale": lambda: signed(body(), at=time.time() - 301),
        # A minute out, not a second: the stamp is truncated to whole seconds and the
        # server starts before the POST, which could bring 301 s back inside the window.
        "future": lambda: signed(body(), at=time.time() + 360),
    }[damage]()
    with serve(app) as url:
        assert post(url, body(), headers).status_code == 401
    assert receiver.receipt("reply:t-1") is None


def test_a_tampered_body_fails_its_signature(app, receiver):
    with serve(app) as url:
        assert post(url, body(result=9), signed(body())).status_code == 401


def test_either_secret_of_a_rotation_is_accepted(receiver):
    old, new = signing.new_secret(), signing.new_secret()
    both = signed(body(), secrets=(new, old))
    for known in (old, new):
        with serve(ReceiverApp(receiver, [known])) as url:
            assert post(url, body(), both).status_code == 200


@pytest.mark.parametrize("case", ["no headers", "bad timestamp", "not a result", "wrong id",
                                  "not utf-8"])
def test_a_malformed_delivery_is_400(app, receiver, case):
    text = body()
    if case == "no headers":
        headers = {"content-type": "application/json"}
    elif case == "bad timestamp":
        headers = signed(text) | {"webhook-timestamp": "soon"}
    elif case == "not a result":
        text = '{"kind": "task"}'
        headers = signed(text)
    elif case == "wrong id":
        headers = signed(text, reply_id="reply:other")
    else:
        with serve(app) as url:
            raw = b"\xff\xfe"
            response = httpx.post(url, content=raw, headers=signed("x"), timeout=10)
        assert response.status_code == 400
        return
    with serve(app) as url:
        assert post(url, text, headers).status_code == 400
    assert receiver.effects_total() == 0


def test_an_oversized_body_is_refused_before_it_is_read(app, receiver):
    big = body(result="x" * 5000)
    with serve(app) as url:
        declared = post(url, big, signed(big))

        def chunks():  # no content-length: refused as the bytes pass the limit
            for _ in range(100):
                yield b"x" * 1024

        streamed = httpx.post(url, content=chunks(), headers=signed(big), timeout=10)
    assert (declared.status_code, streamed.status_code) == (413, 413)
    assert receiver.effects_total() == 0


def test_only_post_delivers(app):
    with serve(app) as url:
        assert httpx.get(url, timeout=10).status_code == 405


def test_a_receiver_needs_a_valid_secret(receiver):
    with pytest.raises(postroom.InvalidInput, match="secrets"):
        ReceiverApp(receiver, [])
    with pytest.raises(postroom.InvalidInput, match=r"secrets\[0\]"):
        ReceiverApp(receiver, ["not-a-secret"])


def test_a_database_briefly_unavailable_is_503_with_retry_after(app, receiver, monkeypatch):
    def unavailable(reply_id: str, text: str) -> postroom.ReceiverAck:
        raise postroom.StoreUnavailable("sqlite: database is locked")

    monkeypatch.setattr(receiver, "accept", unavailable)
    text = body()
    with serve(app) as url:
        answer = post(url, text, signed(text))
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    assert "locked" in answer.json()["error"]
