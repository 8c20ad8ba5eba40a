"""The sweep of due waits and the wait lookups walk an index, whatever the number of waits."""

from __future__ import annotations

import pytest

import postroom
from tests.conformance.test_plans import explain
from tests.support import START

TABLES = ("waits", "wait_slots", "wait_receipts", "wait_continuations", "wait_effects")
# Partial indexes that hold only the rows a sweep wants: walking their head in order is the
# bounded read we ask for, not a scan of the table.
HEADS = ("USING INDEX waits_due", "USING INDEX wait_continuations_unconsumed")
ADDRESS = {"flow": "f", "step": "s-17", "generation": 1}
HOT_QUERIES = {
    "waits_due": {"now": START + 50, "limit": 100},
    "continuations_unconsumed": {"limit": 100},
    "wait_slot_lock": {"flow": "f", "step": "s-17"},
    "wait_get": ADDRESS,
    "wait_by_request": {"flow": "f", "step": "s-17", "request_id": "r"},
    "wait_receipt_get": {"principal": "alice", "event_id": "e-17"},
    "continuation_get": ADDRESS,
}


def plan_problems(dialect: str, lines: list[str]) -> list[str]:
    """Lines of a plan that scan a whole wait table or sort rows."""
    if dialect == "sqlite":
        return [line for line in lines
                if (any(line.startswith(f"SCAN {table}") for table in TABLES)
                    and not line.endswith(HEADS))
                or "TEMP B-TREE" in line]
    if dialect == "postgres":
        return [line for line in lines
                if any(f"Seq Scan on {table}" in line for table in TABLES)
                or " Sort " in f" {line} "]
    raise AssertionError(f"no plan rules for {dialect}")


@pytest.fixture
def populated(store, clock):
    alice = postroom.AuthContext(principal="alice")
    for index in range(240):
        store.open_wait("f", f"s-{index}", 0, START + 100 + index % 7)
    for index in range(0, 240, 3):
        store.signal(alice, f"e-{index}", "f", f"s-{index}", 1, index)
    for index in range(0, 240, 6):
        store.resume("f", f"s-{index}", 1, None)
    dialect = store.database.dialect
    with dialect.connection() as conn:
        dialect.execute(conn, "ANALYZE", ())  # plan with real statistics, as production would
    return store


@pytest.mark.parametrize("name", sorted(HOT_QUERIES))
def test_wait_query_uses_an_index_not_a_scan_or_sort(populated, name):
    lines = explain(populated, name, HOT_QUERIES[name])
    assert plan_problems(populated.database.dialect.name, lines) == [], "\n".join(lines)
