"""Shared fixtures: a fresh real database per test, a manual clock, helpers.

``db_url`` is parametrized over the backends under test (``POSTROOM_BACKENDS``, default:
``sqlite,postgres``). Each test gets databases of its own: a temporary SQLite file, or a
PostgreSQL schema created for it and dropped afterwards (see ``tests/pg.py``); for a test that
opens the ``store`` fixture, one that already holds an empty migrated store.

PostgreSQL tests are skipped, visibly, only when the server is unreachable and ``CI`` is not
set; under ``CI=true`` an unreachable server fails them.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import postroom
from postroom import faults
from tests import pg
from tests.support import SETTINGS, START, migrate_store


@pytest.hookimpl(tryfirst=True)  # before pytest's own tmp_path factory reads the option
def pytest_configure(config: pytest.Config) -> None:
    # The tests' SQLite files (tmp_path) go to a memory file system when there is one: a
    # commit's fsync then costs nothing, which takes a third off the SQLite tests' time.
    # Crash tests kill processes, not the machine, so what they show holds on any file
    # system; the benchmarks, which measure fsync, put their files on disk themselves.
    if hasattr(config, "workerinput") or config.option.basetemp is not None:
        return  # an xdist worker is handed its folder by the controller
    if os.environ.get("POSTROOM_TEST_TMP") == "disk" or not _memory_folder_usable():
        return
    folder = tempfile.mkdtemp(prefix="postroom-tests-", dir=MEMORY_FOLDER)
    config.option.basetemp = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _memory_folder_usable() -> bool:
    try:
        return os.statvfs(MEMORY_FOLDER).f_bavail * os.statvfs(MEMORY_FOLDER).f_frsize \
            > 2 * 1024**3 and os.access(MEMORY_FOLDER, os.W_OK)
    except OSError:
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    # Once per run, before any worker starts: what earlier runs left dead in the catalogs of
    # the tests' database (see tests/pg.py) is cleared, so the run starts at full speed.
    if not hasattr(session.config, "workerinput") and "postgres" in backends() \
            and pg.problem() is None:
        pg.vacuum_catalogs()


#: Where the tests' temporary files go when it exists with room to spare (a tmpfs on Linux);
#: ``POSTROOM_TEST_TMP=disk`` keeps them in the system's temporary folder instead.
MEMORY_FOLDER = "/dev/shm"


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

    def store(self, name: str = "store") -> str:
        """Like calling it, but the database already holds an empty store at the latest
        schema version, as opening one would leave it: on PostgreSQL a schema from
        ``STORE_SCHEMAS``, on SQLite a copy of a migrated file."""
        if self.backend == "postgres":
            url = STORE_SCHEMAS.take(name)
            self._cleanups.append(lambda: STORE_SCHEMAS.give_back(url))
            return url
        url = self(name)
        shutil.copyfile(_migrated_sqlite_file(), url.removeprefix("sqlite:///"))
        return url

    def cleanup(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()


#: The store schemas of this test process (see ``tests/pg.py``), dropped when it ends.
STORE_SCHEMAS = pg.StoreSchemas()


def pytest_unconfigure(config: pytest.Config) -> None:
    STORE_SCHEMAS.close()


@functools.cache
def _migrated_sqlite_file() -> str:
    """A SQLite file holding an empty store at the latest version, made once per process."""
    path = Path(tempfile.mkdtemp(prefix="postroom-template-",
                                 dir=MEMORY_FOLDER if _memory_folder_usable() else None))
    migrate_store(f"sqlite:///{path / 'store.db'}")
    assert not (path / "store.db-wal").exists()  # everything is in the one file
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return str(path / "store.db")


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
def db_url(make_url: UrlFactory, request: pytest.FixtureRequest) -> str:
    # A test that opens the store fixture on it gets it migrated already (the fixture would
    # migrate it first thing): that is the time a fresh store costs, saved. A module that sets
    # STORE_MADE gets it too: its commands refuse a URL without a store (``postroom init``
    # makes one) rather than create it.
    if "store" in request.fixturenames or getattr(request.module, "STORE_MADE", False):
        return make_url.store()
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
