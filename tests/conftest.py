"""Shared fixtures: a fresh real database per test, a manual clock, helpers.

``db_url`` is parametrized over the backends under test (``POSTROOM_BACKENDS``, default:
``sqlite,postgres``). Each test gets databases of its own: a temporary SQLite file, or a
PostgreSQL schema created for it and dropped afterwards (see ``tests/pg.py``).

PostgreSQL tests are skipped, visibly, only when the server is unreachable and ``CI`` is not
set; under ``CI=true`` an unreachable server fails them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import postroom
from postroom import faults
from tests import pg
from tests.support import SETTINGS, START


def pytest_sessionstart(session: pytest.Session) -> None:
    # Once per run, before any worker starts: what earlier runs left dead in the catalogs of
    # the tests' database (see tests/pg.py) is cleared, so the run starts at full speed.
    if not hasattr(session.config, "workerinput") and "postgres" in backends() \
            and pg.problem() is None:
        pg.vacuum_catalogs()


def backends() -> list[str]:
    """The backends the suite runs against."""
    chosen = os.environ.get("POSTROOM_BACKENDS", "sqlite,postgres")
    return [name.strip() for name in chosen.split(",") if name.strip()]


def require_postgres() -> None:
    """Skip (or, under CI, fail) the calling test when PostgreSQL cannot be reached."""
    problem = pg.problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{problem} (CI requires PostgreSQL)", pytrace=False)
    pytest.skip(problem)


class UrlFactory:
    """Creates fresh, empty databases of one backend and drops them afterwards."""

    def __init__(self, backend: str, folder: Path, *, admin_url: str = pg.ADMIN_URL) -> None:
        self.backend = backend
        self._folder = folder
        self._admin_url = admin_url
        self._count = 0
        self._cleanups: list[Callable[[], None]] = []

    def __call__(self, name: str = "db") -> str:
        self._count += 1
        if self.backend == "sqlite":
            return f"sqlite:///{self._folder / f'{name}-{self._count}.db'}"
        if self.backend == "postgres":
            url = pg.create_schema(name, self._admin_url)
            self._cleanups.append(lambda: pg.drop_schema(url))
            return url
        raise pytest.UsageError(f"unknown backend {self.backend!r}")

    def cleanup(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()


@pytest.fixture(params=backends())
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        require_postgres()
    return str(request.param)


@pytest.fixture
def make_url(backend: str, tmp_path: Path) -> Iterator[UrlFactory]:
    factory = UrlFactory(backend, tmp_path)
    yield factory
    factory.cleanup()


@pytest.fixture
def db_url(make_url: UrlFactory) -> str:
    return make_url("store")


@pytest.fixture
def clock() -> postroom.ManualClock:
    return postroom.ManualClock(START)


@pytest.fixture
def settings() -> postroom.Settings:
    return SETTINGS


@pytest.fixture
def store(db_url: str, clock: postroom.ManualClock,
          settings: postroom.Settings) -> Iterator[postroom.Store]:
    with postroom.open_store(db_url, clock=clock, settings=settings, seed=0) as opened:
        yield opened


@pytest.fixture
def receiver(make_url: UrlFactory) -> Iterator[postroom.Receiver]:
    with postroom.Receiver.open(make_url("receiver")) as opened:
        yield opened


@pytest.fixture
def transport(receiver: postroom.Receiver) -> postroom.InProcessTransport:
    return postroom.InProcessTransport(receiver)


@pytest.fixture
def auth() -> postroom.AuthContext:
    return postroom.AuthContext(principal="planner")


@pytest.fixture(autouse=True)
def _no_armed_faults() -> Iterator[None]:
    yield
    faults.disarm_all()
