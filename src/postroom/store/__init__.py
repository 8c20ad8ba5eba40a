"""The store: one implementation of the rules over a dialect seam (SQLite, PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from postroom.errors import InvalidInput
from postroom.store.database import Database, Operation, Tx
from postroom.store.dialect import Dialect

__all__ = ["Database", "Dialect", "Operation", "Tx", "dialect_for_url"]


def dialect_for_url(url: str, *, create: bool = True) -> Dialect:
    """The dialect for a database URL.

    ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (three slashes, then the
    path, as SQLAlchemy spells it); ``postgresql://...`` for PostgreSQL. With ``create=False``
    a SQLite file that does not exist is an error instead of a new empty database.
    """
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path or path == ":memory:":
            raise InvalidInput("url", "postroom needs a database file; in-memory SQLite "
                                      "would not survive a restart")
        from postroom.store.sqlite import SQLiteDialect

        return SQLiteDialect(Path(path), create=create)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from postroom.store.postgres import PostgresDialect  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise InvalidInput("url", "PostgreSQL needs the 'postgres' extra: "
                                      "pip install 'postroom[postgres]'") from exc
        dialect: Dialect = PostgresDialect(url)
        return dialect
    raise InvalidInput("url", f"unsupported database URL {url!r}; use sqlite:///path "
                              "or postgresql://...")
