"""The bench's own pieces, each without a run: the loop that writes k pages per commit, the
WAL frame counter, the ceiling derived from both, where the report goes, and what a missing
PostgreSQL extra says. Counts and words, not speeds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import postroom
from postroom._bench import runner
from postroom._bench.context import QUICK, Measurement, Rounds
from postroom._bench.report import checkout_results
from postroom._bench.runner import add_page_ceilings
from postroom._bench.scenarios.commit_cost import PagedCommitLoop
from postroom._bench.wal_frames import WalFrames
from tests.support import database_of, envelope

_HEADER = 32


def wal_frames(path: Path, page_size: int = 4096) -> int:
    size = Path(f"{path}-wal").stat().st_size
    return (size - _HEADER) // (page_size + 24) if size else 0


def truncate_wal(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()


@pytest.mark.parametrize("page_size", [1024, 4096, 16384])
def test_a_paged_commit_writes_one_wal_frame_per_page(tmp_path, page_size):
    path = tmp_path / "paged.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("VACUUM")
    conn.close()
    loop = PagedCommitLoop(path, pages=3, commits=100)  # 300 rows: the set of 256 wraps
    try:
        truncate_wal(path)
        assert loop.round() == 100
        assert wal_frames(path, page_size) == 300
    finally:
        loop.close()


def test_wal_frames_counts_what_a_block_commits_and_restores_checkpoints(tmp_path):
    with postroom.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        auth = postroom.AuthContext(principal="planner")
        with WalFrames([database_of(store)]) as idle:
            pass
        with WalFrames([database_of(store)]) as one:
            store.receive(auth, envelope("m-1", deadline=4_102_444_800))
        assert idle.frames == 0 and one.frames >= 2
        with database_of(store).dialect.connection() as conn:
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert wal_frames(tmp_path / "s.db") == 0


def _row(id_: str, ratio: float, **details: float) -> Measurement:
    return Measurement(id=id_, label=id_, backend="sqlite", unit="commits/s",
                       rounds=Rounds(rates=(1.0,), ratios=(ratio,)), details=dict(details))


CEILING = "ratio_if_commits_cost_bare_commits_of_as_many_pages"


def test_the_page_ceiling_prices_a_commit_by_a_fixed_cost_plus_a_cost_per_page():
    # relative times 1.0 + 0.1 per page beyond the first: 1.0, 1.5, 2.1 at 1, 6 and 12 pages
    curve = [_row(f"commit_cost.pages_{pages}", 1 / (0.9 + 0.1 * pages), pages_per_commit=pages)
             for pages in (1, 6, 12)]
    single = _row("e2e.single", 0.05, wal_frames_per_commit=3.5, commits_per_task=6)
    add_page_ceilings([*curve, single])
    assert single.details[CEILING] == pytest.approx(1 / (0.9 + 0.35) / 6, abs=1e-4)


def test_the_page_ceiling_is_not_bent_by_one_noisy_point():
    line = {pages: 1 / (0.9 + 0.1 * pages) for pages in (1, 2, 4, 6, 8, 12)}
    noisy = {**line, 6: line[6] * 1.3}  # one round of a neighbour's burst
    priced = []
    for ratios in (line, noisy):
        single = _row("e2e.single", 0.05, wal_frames_per_commit=6.0, commits_per_task=6)
        add_page_ceilings([_row(f"commit_cost.pages_{pages}", ratio, pages_per_commit=pages)
                           for pages, ratio in ratios.items()] + [single])
        priced.append(single.details[CEILING])
    assert priced[1] == pytest.approx(priced[0], rel=0.05)


def test_the_page_ceiling_does_not_extrapolate():
    batched = _row("e2e.batched", 0.5, wal_frames_per_commit=400.0, commits_per_task=0.01)
    add_page_ceilings([_row("commit_cost.pages_1", 1.0, pages_per_commit=1),
                       _row("commit_cost.pages_6", 0.75, pages_per_commit=6), batched])
    assert CEILING not in batched.details


def test_only_a_checkout_has_a_results_file_of_record(tmp_path):
    root = Path(__file__).resolve().parents[2]
    assert checkout_results(root) == root / "bench" / "RESULTS.md"
    assert checkout_results(tmp_path) is None


def test_postgres_scenarios_without_the_extra_say_what_to_install(monkeypatch):
    def missing(url: str) -> None:
        raise ModuleNotFoundError("No module named 'psycopg'")

    monkeypatch.setattr(runner.postgres, "PostgresTarget", missing)
    with pytest.raises(ValueError, match=r"pip install 'postroom\[postgres\]'"):
        runner.run_bench(sizes=QUICK, mode="quick", folder=runner.default_folder(),
                         only=["pg-claim"])
