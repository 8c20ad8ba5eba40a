"""Claim cost must not grow with the backlog: the hot queries walk an index head.

The plans are read from the database itself (``EXPLAIN``) on a populated, analyzed store.
"""

from __future__ import annotations

import re

import pytest

import postroom
from postroom import tasks, transitions
from tests.support import START, analyze, database_of, envelope

HOT_QUERIES = {
    "claim_tasks": {"queue": "default", "now": START, "limit": 1, "owner": "w",
                    "lease_until": START + 30},
    "claim_order": {"queue": "default", "now": START, "limit": 50},
    "tasks_lease_expired": {"now": START, "limit": 100},
    "tasks_deadline_passed": {"now": START, "limit": 100},
    "claim_replies": {"now": START, "limit": 1, "owner": "d", "lease_until": START + 30,
                      "routed": 1},
    "replies_park": {"now": START, "limit": 10},  # a dispatcher's batch, not a sweep's
    "replies_lease_expired": {"now": START, "limit": 100},
}


#: The partial index each hot query must walk: the one that holds only the rows it wants.
INDEX = {
    "claim_tasks": "tasks_claimable",
    "claim_order": "tasks_claimable",
    "tasks_lease_expired": "tasks_running_leases",
    "tasks_deadline_passed": "tasks_live_deadlines",
    "claim_replies": "replies_live",
    "replies_park": "replies_live",
    "replies_lease_expired": "replies_live",
}

PG_SCAN = re.compile(r"\b(Seq Scan|Bitmap Heap Scan|Bitmap Index Scan) on (tasks|replies)\b")
PG_SORT = re.compile(r"^\s*(->\s*)?(Incremental )?Sort\s+\(")


def plan_problems(dialect: str, lines: list[str]) -> list[str]:
    """Lines of a plan that mean a scan of a whole table or a sort of the backlog.

    On PostgreSQL a bitmap scan counts as a scan: it collects every matching row before the
    LIMIT applies, so its cost grows with the backlog like a sort's.
    """
    if dialect == "sqlite":
        return [line for line in lines
                if line.startswith(("SCAN tasks", "SCAN replies")) or "TEMP B-TREE" in line]
    if dialect == "postgres":
        return [line for line in lines if PG_SCAN.search(line) or PG_SORT.search(line)]
    raise AssertionError(f"no plan rules for {dialect}")


@pytest.fixture
def populated(store, auth):
    batch = [envelope(f"m-{i}", queue="default" if i % 2 else "other") for i in range(2000)]
    for start in range(0, len(batch), 500):
        store.receive_atomic(auth, batch[start:start + 500])
    # Most tasks finished (so most replies exist), some running, the rest pending: the shape
    # of a store that has been working for a while, which is what the planner must face.
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 1200)])
    store.claim_batch("w", 50)
    analyze(store)  # plan with real statistics, as production would
    return store


def explain(store: postroom.Store, name: str, params: dict[str, object]) -> list[str]:
    """The plan of the named query, as the store's database would run it."""
    dialect = database_of(store).dialect
    with dialect.connection() as conn:
        lines = dialect.explain(conn, dialect.queries[name].sql, params)
    assert lines, "no plan"
    return lines


@pytest.mark.parametrize("name", sorted(HOT_QUERIES))
def test_hot_query_uses_an_index_not_a_scan_or_sort(populated, name):
    lines = explain(populated, name, HOT_QUERIES[name])
    assert plan_problems(database_of(populated).dialect.name, lines) == [], "\n".join(lines)
    assert any(INDEX[name] in line for line in lines), "\n".join(lines)


@pytest.mark.parametrize("name", ["claim_tasks", "claim_order"])
def test_a_claim_walks_the_claimable_index_no_further_than_its_reach(populated, name):
    # Tasks held until later sit in the index past now + the claim's reach: the range the
    # index is walked over ends before them, so a future backlog costs a claim nothing.
    lines = explain(populated, name, HOT_QUERIES[name])
    if database_of(populated).dialect.name == "sqlite":
        bounded = [line for line in lines if "tasks_claimable" in line and "claim_at<" in line]
    else:
        bounded = [line for line in lines if "Index Cond" in line and "claim_at <=" in line]
    assert bounded, "\n".join(lines)


def test_every_query_resolves_for_the_dialect(store):
    queries = database_of(store).dialect.queries
    assert len(queries) > 40
    for query in queries.values():
        assert not re.search(r"\{[a-z_]+\}", query.sql), f"{query.name} has an unresolved fragment"
        assert query.description, f"{query.name} is not described"


def test_the_plan_rules_catch_a_scan_and_a_sort():
    assert plan_problems("sqlite", ["SCAN tasks", "USE TEMP B-TREE FOR ORDER BY"]) == [
        "SCAN tasks", "USE TEMP B-TREE FOR ORDER BY"]
    postgres = ["Limit", "  ->  Sort  (cost=1..2)", "        Sort Key: available_at",
                "        ->  Seq Scan on tasks  (cost=0..9)",
                "  ->  Bitmap Heap Scan on replies", "  ->  Index Scan using tasks_pkey on tasks"]
    assert plan_problems("postgres", postgres) == [postgres[1], postgres[3], postgres[4]]


def test_an_owners_decision_never_walks_the_tasks_that_share_its_deadline(store, auth):
    # No ANALYZE: a server with autovacuum off plans without statistics. A guard comparing
    # the deadline by equality was then answered from the deadline index, walking every live
    # task with that deadline (a batch received together shares one) for each decision.
    deadline = START + 3600
    for start in range(0, 3000, 500):
        store.receive_atomic(auth, [envelope(f"m-{i}", deadline=deadline)
                                    for i in range(start, start + 500)])
    store.finish_batch([(claim, None) for claim in store.claim_batch("w", 1000)])
    claim = store.claim_batch("w", 50)[0]
    params = tasks._owned(claim, transitions.finish(result_json="null", now=START), START,
                          store.settings)
    lines = explain(store, "task_apply_owned", params)
    assert not any("tasks_live_deadlines" in line for line in lines), "\n".join(lines)
    assert plan_problems(database_of(store).dialect.name, lines) == [], "\n".join(lines)


#: The look a claim takes before SQLite's write lock (``Database.write_if``), and the partial
#: indexes whose heads it probes: the claim's and its sweep's.
DUE_QUERIES = {
    "tasks_due": ({"queue": "default", "now": START},
                  {"tasks_claimable", "tasks_running_leases", "tasks_live_deadlines"}),
    "replies_due": ({"now": START}, {"replies_live"}),
    # Inside the claim: whether its sweep has anything to do.
    "claim_look": ({"queue": "default", "now": START},
                   {"tasks_running_leases", "tasks_live_deadlines"}),
}


@pytest.mark.parametrize("name", sorted(DUE_QUERIES))
def test_a_claims_look_for_work_probes_index_heads_not_a_scan_or_sort(populated, name):
    params, indexes = DUE_QUERIES[name]
    lines = explain(populated, name, params)
    assert plan_problems(database_of(populated).dialect.name, lines) == [], "\n".join(lines)
    assert {index for index in indexes if any(index in line for line in lines)} == indexes, \
        "\n".join(lines)
