"""The yardstick: a raw SQLite commit loop, as durable as postroom's SQLite store.

WAL, ``synchronous=FULL``, one row per ``BEGIN IMMEDIATE`` ... ``COMMIT``, on the same file
system as the scenarios' databases. It does nothing postroom does not also have to do for a
commit, so ``postroom figure / raw commits/s`` is the share of the disk's commit rate that
survives postroom's rules, SQL and Python.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from postroom._bench.context import Measurement, Rounds

__all__ = ["RawCommitLoop", "durable_connection"]

_ROW = "x" * 100  # about the size of a small task row's text


def durable_connection(path: Path) -> sqlite3.Connection:
    """A connection as durable as postroom's: WAL, ``synchronous=FULL``, explicit BEGINs."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


class RawCommitLoop:
    """Measures commits per second in rounds; every round is kept."""

    def __init__(self, path: Path, *, commits: int) -> None:
        self.commits = commits
        self.rates: list[float] = []
        self._conn = durable_connection(path)
        self._conn.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, body TEXT)")

    def round(self) -> float:
        """Commit ``commits`` one-row transactions; record and return commits/s."""
        conn = self._conn
        start = time.perf_counter()
        for _ in range(self.commits):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO rows (body) VALUES (?)", (_ROW,))
            conn.execute("COMMIT")
        rate = self.commits / (time.perf_counter() - start)
        self.rates.append(rate)
        return rate

    def measurement(self) -> Measurement:
        """Every round so far as one row (the median is the yardstick)."""
        return Measurement(
            id="raw_sqlite", backend="sqlite", unit="commits/s",
            label="raw SQLite commit loop (WAL, synchronous=FULL, 1 row per BEGIN IMMEDIATE)",
            rounds=Rounds(rates=tuple(self.rates), ratios=(1.0,) * len(self.rates)),
            details={"commits_per_round": self.commits})

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
