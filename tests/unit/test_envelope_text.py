"""The envelope's canonical text, assembled around the payload's for speed, equals
``canonical_json`` of the whole envelope."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from postroom.validation import DEFAULT_LIMITS, canonical_json, check_envelope

_SAFE_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                     min_size=1,
                     max_size=20)


def _document(fields: dict[str, object]) -> dict[str, object]:
    return {"kind": "task", "queue": "default", "max_attempts": 3, "hops": 0,
            "correlation_id": None, "parent_task_id": None, **fields}


def test_envelope_text_is_the_canonical_json_of_the_envelope():
    fields = {"message_id": "m", "sender": "s", "payload": {"b": [1, 2.5], "a": "é"},
              "deadline": 12.5, "queue": "q", "correlation_id": "c"}
    checked = check_envelope("s", fields, limits=DEFAULT_LIMITS)
    assert checked.envelope == canonical_json(_document(fields) | {"deadline": 12.5})


def test_envelope_text_survives_values_that_look_like_the_queue_key():
    tricky = ',"queue":"x"'
    fields = {"message_id": tricky, "sender": "s", "payload": {"queue": tricky, tricky: 1},
              "deadline": 1, "queue": tricky, "correlation_id": tricky,
              "parent_task_id": tricky}
    checked = check_envelope("s", fields, limits=DEFAULT_LIMITS)
    assert checked.envelope == canonical_json(_document(fields) | {"deadline": 1.0})


@given(message_id=_SAFE_TEXT, queue=_SAFE_TEXT, correlation=st.none() | _SAFE_TEXT,
       payload=st.dictionaries(_SAFE_TEXT, st.integers(-10, 10) | _SAFE_TEXT, max_size=4),
       deadline=st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_envelope_text_equals_canonical_json_for_any_fields(message_id, queue, correlation,
                                                            payload, deadline):
    fields = {"message_id": message_id, "sender": "s", "payload": payload,
              "deadline": deadline, "queue": queue, "correlation_id": correlation}
    checked = check_envelope("s", fields, limits=DEFAULT_LIMITS)
    assert checked.envelope == canonical_json(_document(fields) | {"deadline": deadline})
