"""Named SQL queries, written once and resolved per dialect.

Queries live in ``sql/*.sql`` as blocks::

    -- name: claim_tasks
    -- Pick up to :limit claimable tasks of one queue and mark them running.
    WITH picked AS (SELECT task_id FROM tasks WHERE {claimable} ...{skip_locked}) UPDATE ...

Parameters are written ``:name``. A ``{fragment}`` marker is replaced, once, at store open,
by one of:

- a dialect's own fragment (the few places where SQLite and PostgreSQL truly differ:
  ``{skip_locked}``, ``{server_time}``, ...);
- a rule that more than one query states, written once in a ``-- fragment: name`` block of
  the SQL files (``{claimable}``, ``{claim_is_current}``);
- a set of states taken from the enums themselves (``{terminal_task_states}``), so SQL and
  Python cannot disagree about which states are final; or a bound the rules set
  (``{claim_reach}``).

Then the parameters are converted to the driver's style.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources

from postroom.models import ReplyState, TaskState
from postroom.settings import MAX_PRIORITY_WEIGHT
from postroom.validation import PRIORITY_LIMIT

__all__ = ["STATE_FRAGMENTS", "Query", "QuerySet", "load_queries", "parse_queries"]


def _states(states: Iterable[StrEnum]) -> str:
    return ", ".join(f"'{state.value}'" for state in states)


#: Sets of states as SQL lists, from the enums (``state IN ({terminal_task_states})``), and
#: the bounds the rules set.
STATE_FRAGMENTS: Mapping[str, str] = {
    "terminal_task_states": _states(state for state in TaskState if state.terminal),
    "live_task_states": _states(state for state in TaskState if not state.terminal),
    "final_reply_states": _states((ReplyState.SENT, ReplyState.DEAD)),
    # How far past now a claimable task's claim_at can lie: the lowest priority, at the
    # largest weight a level may have. Claims stop their index walk there, so tasks held
    # until later cost them nothing.
    "claim_reach": repr(PRIORITY_LIMIT * MAX_PRIORITY_WEIGHT),
}

_NAME = re.compile(r"^--\s*(name|fragment):\s*([a-z0-9_]+)\s*$")
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


@dataclass(frozen=True, slots=True)
class _Block:
    kind: str  # "name" (a query) or "fragment" (a rule several queries state)
    description: str
    sql: str


def _parse(text: str, source: str) -> dict[str, _Block]:
    blocks: dict[str, _Block] = {}
    kind = name = None
    description: list[str] = []
    body: list[str] = []

    def flush() -> None:
        if name is None or kind is None:
            return
        sql = "\n".join(body).strip().rstrip(";")
        if not sql:
            raise ValueError(f"{source}: {kind} {name!r} is empty")
        if name in blocks:
            raise ValueError(f"{source}: {name!r} defined twice")
        blocks[name] = _Block(kind, " ".join(description), sql)

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            flush()
            kind, name, description, body = match.group(1), match.group(2), [], []
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
    return {name: block.sql for name, block in _parse(text, source).items()
            if block.kind == "name"}


def load_queries(fragments: Mapping[str, str],
                 convert: Callable[[str], str]) -> QuerySet:
    """Load every ``sql/*.sql`` file and resolve it for one dialect.

    ``fragments`` are the dialect's own. Raises ``KeyError`` if a query uses a fragment
    nobody defines, so a dialect that forgets one fails at open, not at the first claim.
    """
    blocks: dict[str, _Block] = {}
    folder = resources.files("postroom.db") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, block in _parse(entry.read_text("utf-8"), entry.name).items():
            if name in blocks or name in fragments or name in STATE_FRAGMENTS:
                raise ValueError(f"{entry.name}: {name!r} is also defined elsewhere")
            blocks[name] = block
    known = {**fragments, **STATE_FRAGMENTS}

    def resolve(sql: str, within: str) -> str:
        def substitute(match: re.Match[str]) -> str:
            key = match.group(1)
            if key in known:
                return known[key]
            block = blocks.get(key)
            if block is None or block.kind != "fragment":
                raise KeyError(f"{within!r} needs fragment {{{key}}}, not defined")
            return resolve(block.sql, key)

        return _FRAGMENT.sub(substitute, sql)

    resolved: dict[str, Query] = {}
    for name, block in blocks.items():
        if block.kind != "name":
            continue
        sql = block.sql
        verb = sql.lstrip().split(None, 1)[0].upper()
        writes = verb in {"INSERT", "UPDATE", "DELETE"} or (
            verb == "WITH" and re.search(r"\b(UPDATE|INSERT|DELETE)\b", sql, re.I) is not None)
        resolved[name] = Query(name=name, description=block.description,
                               sql=convert(resolve(sql, name)), writes=writes)
    return QuerySet(resolved)
