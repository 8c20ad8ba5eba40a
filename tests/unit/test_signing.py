"""Standard Webhooks signatures, checked against a vector computed here by hand."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

import postroom
from postroom import signing

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = '{"kind":"result","status":"done","task_id":"t"}'


def by_hand(key: bytes, msg_id: str, timestamp: int, body: str) -> str:
    content = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body.encode()
    return "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def test_the_signature_is_the_hmac_of_id_timestamp_and_body_with_the_decoded_key():
    assert signing.signature(SECRET, "reply:t", 1_700_000_000, BODY) == by_hand(
        KEY, "reply:t", 1_700_000_000, BODY)


def test_the_headers_carry_one_signature_per_secret():
    other = signing.new_secret()
    headers = signing.sign([SECRET, other], "reply:t", 1_700_000_000, BODY)
    assert headers["webhook-id"] == "reply:t"
    assert headers["webhook-timestamp"] == "1700000000"
    assert headers["webhook-signature"].split(" ") == [
        by_hand(KEY, "reply:t", 1_700_000_000, BODY),
        by_hand(signing.secret_key(other), "reply:t", 1_700_000_000, BODY)]


def test_a_new_secret_has_at_least_24_random_bytes():
    first, second = signing.new_secret(), signing.new_secret()
    assert first != second and first.startswith("whsec_")
    assert len(signing.secret_key(first)) >= 24


def test_verify_accepts_any_known_secret_within_the_window():
    headers = signing.sign([SECRET], "reply:t", 1000, BODY)
    for now in (1000, 1000 - 300, 1000 + 300):
        assert signing.verify([signing.new_secret(), SECRET], headers, BODY, now=now) == \
            "reply:t"
    for now in (1000 - 301, 1000 + 301):
        with pytest.raises(postroom.BadSignature, match="webhook-timestamp"):
            signing.verify([SECRET], headers, BODY, now=now)


@pytest.mark.parametrize("change", ["body", "id", "timestamp", "secret", "version"])
def test_verify_refuses_anything_altered(change):
    headers = signing.sign([SECRET], "reply:t", 1000, BODY)
    body, secrets = BODY, [SECRET]
    if change == "body":
        body = BODY.replace("done", "failed")
    elif change == "id":
        headers["webhook-id"] = "reply:u"
    elif change == "timestamp":
        headers["webhook-timestamp"] = "1001"
    elif change == "secret":
        secrets = [signing.new_secret()]
    else:
        headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v2,")
    with pytest.raises(postroom.BadSignature):
        signing.verify(secrets, headers, body, now=1000)


@pytest.mark.parametrize(("name", "value"), [("webhook-id", ""), ("webhook-timestamp", "1e3"),
                                             ("webhook-timestamp", "-5"),
                                             ("webhook-signature", "")])
def test_a_malformed_header_is_invalid_input_naming_it(name, value):
    headers = signing.sign([SECRET], "reply:t", 1000, BODY) | {name: value}
    with pytest.raises(postroom.InvalidInput) as refused:
        signing.verify([SECRET], headers, BODY, now=1000)
    assert refused.value.field == name


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!!", "sk_" + SECRET[6:],
                                    "whsec_" + base64.b64encode(b"short").decode()])
def test_a_secret_that_is_not_one_is_refused(secret):
    with pytest.raises(postroom.InvalidInput, match="secret"):
        signing.secret_key(secret)
