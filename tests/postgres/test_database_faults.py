"""Database faults during a run: sessions ended by the server, and the server restarted.

Workers and dispatchers reconnect on their own and the run completes with nothing lost or
doubled. The restart happens on a private cluster (``tests/pg.Cluster``) so that tests running
in parallel against the shared server are not disturbed; ending sessions is confined to a
database of the test's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests import pg
from tests.conftest import require_postgres
from tests.harness.drain import run_drain


def on_ticks(action: Callable[[], object], *, times: int,
             after: float = 0.05) -> Callable[[float], None]:
    """A progress hook that runs ``action`` on each of ``times`` consecutive progress reports,
    once the run is ``after`` of the way through (and not yet finished)."""
    done: list[float] = []

    def hook(fraction: float) -> None:
        if len(done) < times and after <= fraction < 1.0:
            done.append(fraction)
            action()

    hook.done = done  # type: ignore[attr-defined]
    return hook


def test_a_run_survives_its_sessions_being_terminated(own_database):
    ended: list[int] = []
    hook = on_ticks(lambda: ended.append(pg.terminate_sessions(own_database, wait=False)),
                    times=3)
    report = run_drain(own_database, tasks=1000, workers=4, dispatchers=2, kill_every=0,
                       lease=1.0, timeout=240, echo=lambda line: None, on_progress=hook)
    assert report.problems == []
    assert len(ended) == 3 and all(count > 0 for count in ended)


@pytest.fixture
def cluster() -> Iterator[pg.Cluster]:
    require_postgres()
    private = pg.Cluster()
    yield private
    private.destroy()


def test_a_run_survives_a_postgres_restart(cluster):
    # "immediate" is a crash: no checkpoint, sessions cut, recovery at the next start.
    hook = on_ticks(lambda: cluster.restart("immediate"), times=1, after=0.2)
    report = run_drain(cluster.url, tasks=1000, workers=4, dispatchers=2, kill_every=0,
                       lease=1.0, timeout=240, echo=lambda line: None, on_progress=hook)
    assert len(hook.done) == 1  # type: ignore[attr-defined]
    assert report.problems == []
