"""Shared fixtures: a fresh real database per test, a manual clock, helpers.

``db_url`` is parametrized over the backends under test (``POSTROOM_BACKENDS``, default:
every backend this machine has). Each test gets databases of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import postroom
from postroom import faults
from tests.support import SETTINGS, START


def backends() -> list[str]:
    """The backends the suite runs against."""
    chosen = os.environ.get("POSTROOM_BACKENDS", "sqlite")
    return [name.strip() for name in chosen.split(",") if name.strip()]


class UrlFactory:
    """Creates fresh, empty databases of one backend and drops them afterwards."""

    def __init__(self, backend: str, folder: Path) -> None:
        self.backend = backend
        self._folder = folder
        self._count = 0
        self._cleanups: list[Callable[[], None]] = []

    def __call__(self, name: str = "db") -> str:
        self._count += 1
        if self.backend == "sqlite":
            return f"sqlite:///{self._folder / f'{name}-{self._count}.db'}"
        raise pytest.UsageError(f"unknown backend {self.backend!r}")

    def cleanup(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()


@pytest.fixture(params=backends())
def backend(request: pytest.FixtureRequest) -> str:
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
