"""Named SQL queries, written once and resolved per dialect.

Queries live in ``sql/*.sql`` as blocks::

    -- name: claim_tasks
    -- Pick up to :limit claimable tasks of one queue and mark them running.
    WITH picked AS (...{skip_locked}) UPDATE ...

Parameters are written ``:name``. A dialect resolves a query by substituting its
``{fragment}`` markers (the few places where SQLite and PostgreSQL truly differ) and converting
the parameters to its driver's style. Resolution happens once, at store open.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

__all__ = ["Query", "QuerySet", "load_queries", "parse_queries"]

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$")
_FRAGMENT = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Query:
    """One resolved query."""

    name: str
    description: str
    sql: str
    writes: bool  # INSERT / UPDATE / DELETE: a row it touches counts as a write


class QuerySet(Mapping[str, Query]):
    """The queries of one dialect, by name."""

    def __init__(self, queries: dict[str, Query]) -> None:
        self._queries = queries

    def __getitem__(self, name: str) -> Query:
        return self._queries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


def _parse(text: str, source: str) -> dict[str, tuple[str, str]]:
    blocks: dict[str, tuple[str, str]] = {}
    name: str | None = None
    description: list[str] = []
    body: list[str] = []

    def flush() -> None:
        if name is None:
            return
        sql = "\n".join(body).strip().rstrip(";")
        if not sql:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in blocks:
            raise ValueError(f"{source}: query {name!r} defined twice")
        blocks[name] = (" ".join(description), sql)

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            flush()
            name, description, body = match.group(1), [], []
        elif name is not None and not body and line.startswith("--"):
            description.append(line.lstrip("-").strip())
        elif name is not None and (body or line.strip()):
            body.append(line)
    flush()
    return blocks


def parse_queries(text: str, source: str) -> dict[str, str]:
    """The ``-- name:`` blocks of ``text`` (a file called ``source``), as name -> SQL.

    For SQL of a caller's own, run with ``Tx.execute``: no fragments are resolved.
    """
    return {name: sql for name, (_, sql) in _parse(text, source).items()}


def load_queries(fragments: Mapping[str, str],
                 convert: Callable[[str], str]) -> QuerySet:
    """Load every ``sql/*.sql`` file and resolve it for one dialect.

    Raises ``KeyError`` if a query uses a fragment the dialect does not define, so a dialect
    that forgets one fails at open, not at the first claim.
    """
    raw: dict[str, tuple[str, str]] = {}
    folder = resources.files("postroom.db") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, block in _parse(entry.read_text("utf-8"), entry.name).items():
            if name in raw:
                raise ValueError(f"{entry.name}: query {name!r} is also defined elsewhere")
            raw[name] = block
    resolved: dict[str, Query] = {}
    for name, (description, sql) in raw.items():

        def substitute(match: re.Match[str], query: str = name) -> str:
            key = match.group(1)
            if key not in fragments:
                raise KeyError(f"query {query!r} needs fragment {{{key}}}, not defined")
            return fragments[key]

        text = convert(_FRAGMENT.sub(substitute, sql))
        verb = sql.lstrip().split(None, 1)[0].upper()
        writes = verb in {"INSERT", "UPDATE", "DELETE"} or (
            verb == "WITH" and re.search(r"\b(UPDATE|INSERT|DELETE)\b", sql, re.I) is not None)
        resolved[name] = Query(name=name, description=description, sql=text, writes=writes)
    return QuerySet(resolved)
