"""Settings and backoffs are checked when they are built, naming the field, not when used."""

from __future__ import annotations

import math
from typing import Any

import pytest

import postroom
from postroom import ExponentialBackoff, FixedBackoff, Settings


@pytest.mark.parametrize(("field", "value"), [
    ("lease", 0), ("lease", math.inf), ("lease", "30"), ("dispatch_lease", -1.0),
    ("retention", math.nan), ("retention", 3651 * 86_400.0),
    ("max_hops", 0), ("max_hops", True), ("delivery_budget", 101), ("sweep_limit", 1.5),
    ("limits", None), ("limits", {"text_bytes": 64}),
    ("backoff", None), ("backoff", 5.0), ("delivery_backoff", "exponential"),
    ("allowed_sources", {"planner"}),
])
def test_a_settings_value_out_of_its_range_or_type_is_refused_naming_it(field: str,
                                                                       value: Any) -> None:
    with pytest.raises(postroom.InvalidInput) as refused:
        Settings(**{field: value})
    assert refused.value.field == field


@pytest.mark.parametrize(("field", "value"), [
    ("base", 0.0), ("cap", math.inf), ("jitter", 1.5), ("jitter", "0.5"), ("jitter", True),
])
def test_an_exponential_backoff_value_out_of_range_or_type_is_refused(field: str,
                                                                      value: Any) -> None:
    with pytest.raises(postroom.InvalidInput) as refused:
        ExponentialBackoff(**{field: value})
    assert refused.value.field == f"backoff.{field}"


def test_any_object_with_a_delay_method_is_a_backoff() -> None:
    class Constant:
        def delay(self, attempt: int, rng: object) -> float:
            return 2.0

    settings = Settings(backoff=Constant(), delivery_backoff=FixedBackoff(seconds=0))
    assert settings.backoff.delay(1, None) == 2.0  # type: ignore[arg-type]


@pytest.mark.parametrize("source", ["task:x", "wait:[\"flow\",\"step\",1]"])
def test_an_allowed_source_in_a_follow_up_namespace_is_refused(source: str) -> None:
    # No caller can authenticate as such a principal (they name follow-ups), so allowing one
    # would be a setting that can never take effect.
    with pytest.raises(postroom.InvalidInput, match="reserved") as refused:
        Settings(allowed_sources=frozenset({"planner", source}))
    assert refused.value.field == "allowed_sources"
