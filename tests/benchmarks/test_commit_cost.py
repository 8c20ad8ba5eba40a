"""The pieces that price a commit by its pages: a loop that writes k pages per commit, a WAL
frame counter, and the ceiling derived from both. Counts, not speeds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import postroom
from bench.context import Measurement, Rounds
from bench.runner import add_page_ceilings
from bench.scenarios.commit_cost import PagedCommitLoop
from bench.wal_frames import WalFrames
from tests.support import envelope

_FRAME = 4096 + 24
_HEADER = 32


def wal_frames(path: Path) -> int:
    size = Path(f"{path}-wal").stat().st_size
    return (size - _HEADER) // _FRAME if size else 0


def truncate_wal(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()


def test_a_paged_commit_writes_one_wal_frame_per_page(tmp_path):
    path = tmp_path / "paged.db"
    loop = PagedCommitLoop(path, pages=3, commits=10)
    try:
        truncate_wal(path)
        assert loop.round() == 10
        assert wal_frames(path) == 30
    finally:
        loop.close()


def test_wal_frames_counts_what_a_block_commits_and_restores_checkpoints(tmp_path):
    with postroom.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        auth = postroom.AuthContext(principal="planner")
        with WalFrames([store.database]) as idle:
            pass
        with WalFrames([store.database]) as one:
            store.receive(auth, envelope("m-1", deadline=4_102_444_800))
        assert idle.frames == 0 and one.frames >= 2
        with store.database.dialect.connection() as conn:
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert wal_frames(tmp_path / "s.db") == 0


def _row(id_: str, ratio: float, **details: float) -> Measurement:
    return Measurement(id=id_, label=id_, backend="sqlite", unit="commits/s",
                       rounds=Rounds(rates=(1.0,), ratios=(ratio,)), details=dict(details))


def test_the_page_ceiling_interpolates_the_commit_cost_at_the_frames_per_commit():
    single = _row("e2e.single", 0.05, wal_frames_per_commit=3.5, commits_per_task=6)
    huge = _row("e2e.batched", 0.5, wal_frames_per_commit=400.0, commits_per_task=0.01)
    add_page_ceilings([_row("commit_cost.pages_1", 1.0, pages_per_commit=1),
                       _row("commit_cost.pages_6", 0.75, pages_per_commit=6), single, huge])
    ceiling = "ratio_if_commits_cost_bare_commits_of_as_many_pages"
    assert single.details[ceiling] == pytest.approx((1.0 - 0.25 * 2.5 / 5) / 6, abs=1e-4)
    assert ceiling not in huge.details  # beyond the pages measured: no guess
