"""PostgreSQL-only tests: what the dialect adds beyond the shared conformance suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import postroom
from tests import pg
from tests.conftest import UrlFactory, require_postgres


@pytest.fixture
def pg_urls(tmp_path: Path) -> Iterator[UrlFactory]:
    """Fresh PostgreSQL schemas (skipped without a server, failed without one under CI)."""
    require_postgres()
    factory = UrlFactory("postgres", tmp_path)
    yield factory
    factory.cleanup()


@pytest.fixture
def pg_url(pg_urls: UrlFactory) -> str:
    return pg_urls("store")


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of the test's own, for tests that end every session connected to it."""
    require_postgres()
    url = pg.create_database("own")
    yield url
    pg.drop_database(url)


@pytest.fixture
def pg_store(pg_url: str, clock: postroom.ManualClock,
             settings: postroom.Settings) -> Iterator[postroom.Store]:
    with postroom.open_store(pg_url, clock=clock, settings=settings, seed=0) as opened:
        yield opened
