"""The store: one implementation of the rules over a dialect seam (SQLite, PostgreSQL)."""

from __future__ import annotations

import re
from pathlib import Path

from postroom.db.database import Database, Tx, Write
from postroom.db.dialect import Dialect
from postroom.errors import InvalidInput

__all__ = ["Database", "Dialect", "Tx", "Write", "dialect_for_url", "redacted_url",
           "sqlite_path"]


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and output."""
    url = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///`` URL (as given: relative or absolute); ``None`` for
    another scheme."""
    return url[len("sqlite:///"):] if url.startswith("sqlite:///") else None


def dialect_for_url(url: str, *, read_only: bool = False) -> Dialect:
    """The dialect for a database URL.

    ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (three slashes, then the
    path, as SQLAlchemy spells it); ``postgresql://...`` for PostgreSQL. ``read_only`` is for
    looking only (audit, info): a SQLite file that does not exist is an error instead of a
    new empty database, and the file is opened read-only, its journal mode left as found.
    """
    path = sqlite_path(url)
    if path is not None:
        if not path or path == ":memory:":
            raise InvalidInput("url", "postroom needs a database file; in-memory SQLite "
                                      "would not survive a restart")
        from postroom.db.sqlite import SQLiteDialect

        return SQLiteDialect(Path(path), read_only=read_only)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from postroom.db.postgres import PostgresDialect
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise InvalidInput("url", "PostgreSQL needs the 'postgres' extra: "
                                      "pip install 'postroom[postgres]'") from exc
        dialect: Dialect = PostgresDialect(url)
        return dialect
    raise InvalidInput("url", f"unsupported database URL {url!r}; use sqlite:///path "
                              "or postgresql://...")
