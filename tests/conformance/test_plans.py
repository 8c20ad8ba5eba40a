"""Claim cost must not grow with the backlog: the hot queries walk an index head.

The plans are read from the database itself (``EXPLAIN``) on a populated, analyzed store.
"""

from __future__ import annotations

import pytest

import postroom
from tests.support import START, envelope

HOT_QUERIES = {
    "claim_tasks": {"queue": "default", "now": START, "limit": 1, "owner": "w",
                    "lease_until": START + 30},
    "claim_head": {"queue": "default", "now": START},
    "tasks_lease_expired": {"now": START, "limit": 100},
    "tasks_deadline_passed": {"now": START, "limit": 100},
    "claim_replies": {"now": START, "limit": 1, "owner": "d", "lease_until": START + 30},
    "replies_lease_expired": {"now": START, "limit": 100},
}


def plan_problems(dialect: str, lines: list[str]) -> list[str]:
    """Lines of a plan that mean a scan of a whole table or a sort of the backlog."""
    text = "\n".join(lines)
    if dialect == "sqlite":
        return [line for line in lines
                if line.startswith(("SCAN tasks", "SCAN replies")) or "TEMP B-TREE" in line]
    if dialect == "postgres":
        return [line for line in lines
                if "Seq Scan on tasks" in line or "Seq Scan on replies" in line
                or (" Sort " in f" {line} " and "Sort Key" not in text)]
    raise AssertionError(f"no plan rules for {dialect}")


@pytest.fixture
def populated(store, auth):
    batch = [envelope(f"m-{i}", queue="default" if i % 2 else "other") for i in range(2000)]
    for start in range(0, len(batch), 500):
        store.receive_atomic(auth, batch[start:start + 500])
    for claim in store.claim_batch("w", 50):
        store.finish(claim, None)
    store.claim_batch("w", 50)
    dialect = store.database.dialect
    with dialect.connection() as conn:
        dialect.execute(conn, "ANALYZE", ())  # plan with real statistics, as production would
    return store


def explain(store: postroom.Store, name: str, params: dict[str, object]) -> list[str]:
    """The plan of the named query, as the store's database would run it."""
    dialect = store.database.dialect
    with dialect.connection() as conn:
        lines = dialect.explain(conn, dialect.queries[name].sql, params)
    assert lines, "no plan"
    return lines


@pytest.mark.parametrize("name", sorted(HOT_QUERIES))
def test_hot_query_uses_an_index_not_a_scan_or_sort(populated, name):
    lines = explain(populated, name, HOT_QUERIES[name])
    assert plan_problems(populated.database.dialect.name, lines) == [], "\n".join(lines)


def test_every_query_resolves_for_the_dialect(store):
    queries = store.database.dialect.queries
    assert len(queries) > 40
    for query in queries.values():
        assert "{" not in query.sql, f"{query.name} has an unresolved fragment"
        assert query.description, f"{query.name} is not described"
