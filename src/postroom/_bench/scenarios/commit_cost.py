"""What a durable SQLite commit costs by the pages it writes.

The raw loop's commit appends about one WAL frame (one page). postroom's commits write
several: a row, the index entries its change moves, and the time high-water. This scenario
runs the raw loop's transaction (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` ...
``COMMIT``) rewriting ``pages`` rows that each fill a page of their own, so that every commit
writes that many frames, and measures commits/s against the raw loop like every other
figure. Successive commits take the next rows of a set of ``_ROWS``, so that a checkpoint
copies back a few hundred distinct pages, as a store's does, not the same few again. With
the WAL frames per commit that the end-to-end scenarios count, it tells what their commits
alone cost on this disk, short of any statement or Python.
"""

from __future__ import annotations

from pathlib import Path

from postroom._bench.context import BenchError, Context, Measurement, SQLiteTarget
from postroom._bench.scenarios.raw_sqlite import durable_connection

__all__ = ["PagedCommitLoop", "run"]

_ROWS = 256


class PagedCommitLoop:
    """Commits that each rewrite ``pages`` one-page rows (so ``pages`` WAL frames)."""

    def __init__(self, path: Path, *, pages: int, commits: int) -> None:
        self.pages = pages
        self.commits = commits
        self._conn = durable_connection(path)
        page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
        # Three quarters of a page: two rows never share one, and none overflows it.
        self._row_bytes = page_size * 3 // 4 // 8 * 8
        self._rows = max(_ROWS, pages)
        self._conn.execute("CREATE TABLE IF NOT EXISTS pages (id INTEGER PRIMARY KEY, body BLOB)")
        self._conn.executemany("INSERT OR IGNORE INTO pages (id, body) VALUES (?, ?)",
                               [(row, bytes(self._row_bytes)) for row in range(self._rows)])
        self._written = 0

    def round(self) -> int:
        """Make ``commits`` commits; return how many."""
        conn = self._conn
        for _ in range(self.commits):
            self._written += 1
            # New content every commit: SQLite leaves a page alone when a row is rewritten
            # with the bytes it already holds.
            body = self._written.to_bytes(8, "little") * (self._row_bytes // 8)
            first = self._written * self.pages
            conn.execute("BEGIN IMMEDIATE")
            for row in range(first, first + self.pages):
                conn.execute("UPDATE pages SET body = ? WHERE id = ?", (body, row % self._rows))
            conn.execute("COMMIT")
        return self.commits

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def run(ctx: Context) -> list[Measurement]:
    """One figure per page count in ``sizes.commit_pages``."""
    target = ctx.target
    if not isinstance(target, SQLiteTarget):
        raise BenchError("the commit cost is a SQLite figure")
    rows = []
    for pages in ctx.sizes.commit_pages:
        ctx.progress(f"commit cost: {pages} pages per commit")
        loop = PagedCommitLoop(target.path(f"commit-cost-{pages}"), pages=pages,
                               commits=ctx.sizes.raw_commits)
        try:
            loop.round()  # warm-up: the first round grows the WAL file
            rounds = ctx.timed_rounds(loop.round)
        finally:
            loop.close()
        rows.append(Measurement(
            id=f"commit_cost.pages_{pages}", backend="sqlite", unit="commits/s",
            label=f"bare commit loop writing {pages} page{'s' if pages > 1 else ''} "
                  "(WAL frames) per commit",
            rounds=rounds, details={"pages_per_commit": pages}))
    return rows
