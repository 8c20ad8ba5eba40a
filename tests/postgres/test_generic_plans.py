"""Claim cost stays flat under prepared statements too.

psycopg prepares a statement after a few executions, and after five more PostgreSQL may
switch it to a plan made once for any parameter values (a generic plan), which cannot see the
LIMIT. It does so only when that plan is estimated as cheap as the custom ones; these tests
read the plan a prepared hot query really gets after many executions (``EXPLAIN EXECUTE``),
and it must still walk its partial index, not scan or sort.
"""

from __future__ import annotations

import re

import pytest
from psycopg.sql import Literal

import postroom
from tests import pg
from tests.conformance.test_plans import HOT_QUERIES, INDEX, plan_problems
from tests.conftest import require_postgres
from tests.support import START, analyze, database_of, envelope

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: The types psycopg gives these Python values when it binds them.
_TYPES = {float: "double precision", int: "bigint", str: "text"}


@pytest.fixture(scope="module")
def populated():
    """A store that has worked for a while: 20,000 tasks, 12,000 done, some running."""
    require_postgres()
    url = pg.create_schema("generic")
    store = postroom.open_store(url, clock=postroom.ManualClock(START))
    auth = postroom.AuthContext(principal="planner")
    for start in range(0, 20_000, 5_000):
        store.receive_atomic(auth, [envelope(f"m-{i}", queue="default" if i % 2 else "other")
                                    for i in range(start, start + 5_000)])
    for _ in range(2):
        store.finish_batch([(claim, None) for claim in store.claim_batch("w", 6_000)])
    store.claim_batch("w", 50)
    analyze(store)  # plan with real statistics, as production would
    yield store
    store.close()
    pg.drop_schema(url)


def prepared_plan(store, name: str) -> list[str]:
    """The plan of ``name`` prepared with ``$n`` parameters, after it ran ten times."""
    dialect = database_of(store).dialect
    params = HOT_QUERIES[name]
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    sql = _PLACEHOLDER.sub(number, dialect.queries[name].sql).replace("%%", "%")
    types = ", ".join(_TYPES[type(params[key])] for key in order)
    values = ", ".join(Literal(params[key]).as_string() for key in order)
    statement = f"hot_{name}"
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)  # rolled back: the claims below change nothing
        dialect.execute(conn, f"PREPARE {statement} ({types}) AS {sql}", None)
        for _ in range(10):  # past the five custom plans PostgreSQL makes before choosing
            dialect.execute(conn, f"EXECUTE {statement}({values})", None).fetchall()
        rows = dialect.execute(conn, f"EXPLAIN EXECUTE {statement}({values})",
                               None).fetchall()
        dialect.rollback(conn)  # a PREPARE inside a rolled-back transaction goes with it
    return [str(row["QUERY PLAN"]) for row in rows]


@pytest.mark.parametrize("name", sorted(HOT_QUERIES))
def test_a_prepared_hot_query_keeps_walking_its_index(populated, name):
    lines = prepared_plan(populated, name)
    assert plan_problems("postgres", lines) == [], "\n".join(lines)
    assert any(INDEX[name] in line for line in lines), "\n".join(lines)
