"""The sweep of due waits and the wait lookups walk an index, whatever the number of waits."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

import postroom
from postroom import waits
from postroom.db import Tx, Write
from tests.conformance.test_plans import PG_SORT, explain
from tests.conftest import UrlFactory, backends, require_postgres
from tests.support import SETTINGS, START, analyze, database_of

TABLES = ("waits", "wait_slots", "wait_receipts", "wait_continuations", "wait_effects")
# Partial indexes that hold only the rows a sweep wants: walking their head in order is the
# bounded read we ask for, not a scan of the table.
HEADS = ("USING INDEX waits_due", "USING INDEX waits_by_responder",
         "USING INDEX wait_continuations_unconsumed")
ADDRESS = {"flow": "f", "step": "s-17", "generation": 1}
HOT_QUERIES = {
    "waits_due": {"now": START + 50, "limit": 100},
    "continuations_unconsumed": {"limit": 100, "step": None},
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
                if any(re.search(rf"\b(Seq Scan|Bitmap Heap Scan) on {table}\b", line)
                       for table in TABLES)
                or PG_SORT.search(line)]
    raise AssertionError(f"no plan rules for {dialect}")


#: Waits per backend. PostgreSQL's planner costs plans from statistics, and on tables of a
#: few pages a sequential scan is honestly the cheapest plan; it is shown tables of a size at
#: which the choice matters (SQLite's planner prefers an index whatever the size).
WAITS = {"sqlite": 240, "postgres": 6000}


def in_batches(store: postroom.Store, op: Write, calls: list[Callable[[Tx], object]]) -> None:
    """Apply the rule functions ``calls``, 500 per transaction (building data, fast)."""
    for start in range(0, len(calls), 500):
        database_of(store).write(op, lambda tx, chunk=calls[start:start + 500]: [
            call(tx) for call in chunk])


@pytest.fixture(scope="module", params=backends())
def populated(request, tmp_path_factory):
    """One store per backend, shared by the module's read-only plan tests."""
    if request.param == "postgres":
        require_postgres()
    urls = UrlFactory(request.param, tmp_path_factory.mktemp("wait-plans"))
    with postroom.open_store(urls("store"), clock=postroom.ManualClock(START),
                             settings=SETTINGS, seed=0) as store:
        yield _populate(store)
    urls.cleanup()


def _populate(store: postroom.Store) -> postroom.Store:
    settings = store.settings
    alice = postroom.AuthContext(principal="alice")
    count = WAITS[database_of(store).dialect.name]
    in_batches(store, waits.OPEN_WAIT, [
        lambda tx, index=index: waits.open_wait(tx, waits.check_open(
            settings, flow="f", step=f"s-{index}", expected_generation=0,
            deadline=START + 100 + index % 7, request_id=None, task_id=None))
        for index in range(count)])
    in_batches(store, waits.SIGNAL, [
        lambda tx, index=index: waits.signal(tx, waits.check_signal(
            settings, alice, event_id=f"e-{index}", flow="f", step=f"s-{index}",
            generation=1, value=index))
        for index in range(0, count, 3)])
    in_batches(store, waits.RESUME, [
        lambda tx, index=index: waits.resume(
            tx, settings, waits.check_address(settings, "f", f"s-{index}", 1), None)
        for index in range(0, count, 6)])
    analyze(store)  # plan with real statistics, as production would
    return store


@pytest.mark.parametrize("name", sorted(HOT_QUERIES))
def test_wait_query_uses_an_index_not_a_scan_or_sort(populated, name):
    lines = explain(populated, name, HOT_QUERIES[name])
    assert plan_problems(database_of(populated).dialect.name, lines) == [], "\n".join(lines)
