"""SPEC §1: refusing an oversized value costs time bounded by the limit, not by the value.

Timing is not asserted (it depends on the machine); what a refusal allocates is, and it is
the same everywhere: walking, copying or encoding a value too big to accept would allocate in
proportion to it, so a refusal that allocates a small, fixed amount has not looked at more
than the limit allows.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from postroom import InvalidInput
from postroom.validation import DEFAULT_LIMITS, check_json, check_text

#: Well above what checking a value within the limits may take (the payload limit is 64 KiB),
#: far below what walking or encoding any of the values below would.
SMALL = 1024 * 1024


def refusal(check: Callable[[], object]) -> tuple[InvalidInput, int]:
    """The refusal ``check`` raises, and the most memory it allocated on the way."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput) as refused:
            check()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return refused.value, peak


def payload(value: object) -> Callable[[], object]:
    return lambda: check_json(value, "payload", limits=DEFAULT_LIMITS, require_object=True)


@pytest.fixture
def ten_million() -> Iterator[list[int]]:
    yield [0] * 10**7


def test_a_list_of_ten_million_values_is_refused_before_it_is_walked(ten_million):
    refused, peak = refusal(payload({"items": ten_million}))
    assert (refused.field, refused.problem) == ("payload", "has more than 10000 values")
    assert peak < SMALL


def test_a_dict_of_a_million_keys_is_refused_before_it_is_walked():
    keys = dict.fromkeys(map(str, range(10**6)), 0)
    refused, peak = refusal(payload({"index": keys}))
    assert (refused.field, refused.problem) == ("payload", "has more than 10000 values")
    assert peak < SMALL


def test_a_string_of_200_megabytes_is_refused_before_it_is_encoded():
    refused, peak = refusal(payload({"text": "x" * (200 * 1024 * 1024)}))
    assert refused.field == "payload"
    assert refused.problem.startswith("is at least 209715")
    assert refused.problem.endswith("bytes as canonical JSON; the limit is 65536")
    assert peak < SMALL


def test_a_non_ascii_string_of_200_megabytes_is_refused_before_it_is_encoded():
    refused, peak = refusal(payload({"text": "é" * (100 * 1024 * 1024)}))
    assert refused.field == "payload" and "the limit is 65536" in refused.problem
    assert peak < SMALL


def test_many_keys_that_together_pass_the_size_limit_are_refused_by_their_size():
    refused, _ = refusal(payload({f"key-{i:05}-" + "k" * 100: None for i in range(1000)}))
    assert refused.field == "payload" and "bytes as canonical JSON" in refused.problem


def test_a_structure_nested_a_hundred_thousand_levels_is_refused_at_the_depth_limit():
    deep: list[object] = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    refused, peak = refusal(payload({"deep": deep}))
    assert refused.field == "payload.deep" + "[0]" * 15
    assert refused.problem == "nesting deeper than 16 levels"
    assert peak < SMALL


def test_shared_lists_that_would_unfold_into_ten_to_the_fifteen_values_are_refused():
    value: object = [0] * 10
    for _ in range(14):  # 16 levels with the payload itself: only the count is too much
        value = [value] * 10
    refused, peak = refusal(payload({"tree": value}))
    assert (refused.field, refused.problem) == ("payload", "has more than 10000 values")
    assert peak < SMALL


def test_a_text_field_of_200_megabytes_is_refused_before_it_is_encoded():
    text = "é" * (100 * 1024 * 1024)
    refused, peak = refusal(lambda: check_text(text, "message_id", max_bytes=128))
    assert refused.field == "message_id"
    assert refused.problem == ("is 104857600 characters, so at least 104857600 bytes of "
                               "UTF-8; the limit is 128")
    assert peak < SMALL
