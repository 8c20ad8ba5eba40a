"""The audit covers the flow-control tables: re-run records and limited queues' slots."""

from __future__ import annotations

import pytest

from tests.conformance.test_audit import corrupt
from tests.conformance.test_schedules import audit_checks
from tests.support import envelope


@pytest.fixture
def controlled(store, auth):
    """A store with a failed task run again twice, and a queue limited to 2 with one running."""
    store.receive(auth, envelope("broken"))
    claim = store.claim("w")
    store.fail(claim, "nope", retryable=False)
    for n in (1, 2):
        store.retry(claim.task_id, operator="ops", reason=f"again {n}")
    store.set_queue_limit("limited", 2)
    store.receive(auth, envelope("bounded", queue="limited"))
    assert store.claim("w", queues="limited") is not None
    return store


def test_a_store_with_re_runs_and_a_limited_queue_is_clean(controlled):
    assert audit_checks(controlled) == set()


@pytest.mark.parametrize(("sql", "check"), [
    ("UPDATE tasks SET state = 'done' WHERE task_id IN (SELECT task_id FROM task_retries)",
     "retry_of_unrerunnable_task"),
    ("UPDATE tasks SET retry_of = NULL WHERE task_id IN "
     "(SELECT new_task_id FROM task_retries WHERE number = 1)", "retry_link_mismatch"),
    ("DELETE FROM task_retries WHERE number = 2", "retry_link_mismatch"),
    ("DELETE FROM task_retries WHERE number = 1", "retry_numbers_gap"),
    ("DELETE FROM queue_slots WHERE slot = 2", "limit_slots_mismatch"),
    ("INSERT INTO queue_slots (queue, slot) VALUES ('limited', 3)", "limit_slots_mismatch"),
    ("UPDATE queue_slots SET task_id = (SELECT task_id FROM queue_slots WHERE slot = 1), "
     "fence = (SELECT fence FROM queue_slots WHERE slot = 1) WHERE slot = 2",
     "slot_held_twice"),
    ("UPDATE tasks SET queue = 'other' WHERE state = 'running'", "slot_of_another_queue"),
    ("UPDATE tasks SET claim_at = NULL WHERE state = 'pending'", "pending_without_claim_at"),
])
def test_each_broken_flow_control_invariant_is_named(controlled, sql, check):
    corrupt(controlled, sql)
    assert check in audit_checks(controlled)
