"""Where a scenario's time goes: inside the database driver, or in postroom's Python."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from postroom.db import Database

__all__ = ["DriverTime"]

_METHODS = ("begin", "execute", "executemany", "commit", "rollback")


class DriverTime:
    """Time spent inside the database driver, and commits made, while the block runs.

    A diagnostic for an extra, untimed round: it wraps the dialects' methods on their
    instances (which costs a little of its own) and splits the round's time into commits
    (and the fsyncs they wait for), the other statements, and the rest (postroom's Python).
    """

    def __init__(self, databases: list[Database]) -> None:
        self._dialects = [database.dialect for database in databases]
        self.committing = 0.0
        self.statements = 0.0
        self.commits = 0

    @property
    def seconds(self) -> float:
        """All the time spent inside the driver."""
        return self.committing + self.statements

    def __enter__(self) -> DriverTime:
        for dialect in self._dialects:
            for name in _METHODS:
                setattr(dialect, name, self._timed(getattr(dialect, name), name))
        return self

    def __exit__(self, *exc: object) -> None:
        for dialect in self._dialects:
            for name in _METHODS:
                delattr(dialect, name)  # the class's method again

    def _timed(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                if name == "commit":
                    self.committing += spent
                    self.commits += 1
                else:
                    self.statements += spent

        return timed
