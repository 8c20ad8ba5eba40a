"""Runtime tests run on real time (leases, wake-ups): a store with the system clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import postroom
from tests.support import SETTINGS


@pytest.fixture
def store(db_url: str) -> Iterator[postroom.Store]:
    with postroom.open_store(db_url, settings=SETTINGS, seed=0) as opened:
        yield opened
