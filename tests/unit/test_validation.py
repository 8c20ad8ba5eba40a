"""The validator of SPEC §1, without a database: it never crashes, and what it accepts is
canonical JSON that round-trips within the limits."""

from __future__ import annotations

import pytest

from postroom import InvalidEnvelope, InvalidInput
from postroom.validation import DEFAULT_LIMITS, check_envelope, check_json, check_text


@pytest.mark.parametrize(("payload", "field", "problem"), [
    ({"a": {"\ud800": 1}}, "payload.a", "has a key that is not valid UTF-8"),
    ({"a": ["ok", "\udfff"]}, "payload.a[1]", "is not valid UTF-8"),
    ({"\udc80": {"deep": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}}, "payload", "has a key"),
])
def test_text_that_is_not_utf8_is_refused_at_its_dotted_path(payload, field, problem):
    with pytest.raises(InvalidInput, match=problem) as refused:
        check_json(payload, "payload", limits=DEFAULT_LIMITS, require_object=True)
    assert refused.value.field == field


@pytest.mark.parametrize("text", ["\x00", "m-\x00", "\x00m"])
def test_text_fields_refuse_nul_which_postgresql_cannot_store(text):
    with pytest.raises(InvalidInput, match="U\\+0000") as refused:
        check_text(text, "queue", max_bytes=128)
    assert refused.value.field == "queue"


def test_nul_inside_json_is_escaped_and_accepted():
    assert check_json({"k\x00": "v\x00"}, "payload", limits=DEFAULT_LIMITS,
                      require_object=True) == '{"k\\u0000":"v\\u0000"}'


class Uncomparable:
    """A value whose comparisons raise, as a hostile or buggy caller's object might."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __ne__ = __eq__
    __hash__ = object.__hash__


def test_a_kind_that_cannot_be_compared_is_refused_not_crashed_on():
    fields = {"message_id": "m", "sender": "p", "payload": {}, "deadline": 1.0,
              "kind": Uncomparable()}
    with pytest.raises(InvalidEnvelope) as refused:
        check_envelope("p", fields, limits=DEFAULT_LIMITS)
    assert refused.value.field == "kind"
