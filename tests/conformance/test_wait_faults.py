"""A failure at any wait fault point leaves all or nothing, and the retry converges.

In-process (an exception at the point), quick and on every backend; the same points kill a
real subprocess in ``tests/crash`` (``wait_scenarios.py``) and in ``postroom scenarios``
(group ``crash_windows``).
"""

from __future__ import annotations

import pytest

import postroom
from postroom import faults
from postroom.audit import audit_database
from tests.support import database_of
from tests.wait_support import OPERATIONS, snapshot, wait_points


class Injected(Exception):
    pass


def test_every_wait_operation_has_its_commit_points_and_seams():
    assert set(wait_points()) == {
        "open_wait.before_commit", "open_wait.after_commit", "open_wait.after_wait_insert",
        "signal.before_commit", "signal.after_commit", "signal.after_receipt_insert",
        "signal.after_terminal_update",
        "expire.before_commit", "expire.after_commit", "expire.after_terminal_update",
        "expire_due.before_commit", "expire_due.after_commit",
        "expire_due.after_terminal_update",
        "resume.before_commit", "resume.after_commit", "resume.after_consume",
        "resume.after_follow_up_insert",
    }


@pytest.mark.parametrize("point", wait_points())
def test_a_failure_at_a_wait_fault_point_leaves_all_or_nothing(make_url, point):
    operation = OPERATIONS[point.split(".")[0]]

    def fresh() -> tuple[postroom.Store, postroom.ManualClock]:
        clock = postroom.ManualClock(1_000_000.0)
        store = postroom.open_store(make_url(), clock=clock)
        operation.setup(store, clock)
        return store, clock

    control, _ = fresh()
    expected_answer = operation.call(control)
    expected = snapshot(control)
    control.close()

    store, _ = fresh()
    before = snapshot(store)
    with faults.armed(point, faults.raising(Injected)), \
            pytest.raises(Injected):
        operation.call(store)
    committed = point.endswith(".after_commit")
    assert snapshot(store) == (expected if committed else before)
    assert audit_database(database_of(store)) == []

    retry = operation.call(store)
    assert retry == (operation.retried(expected_answer) if committed else expected_answer)
    assert snapshot(store) == expected
    assert audit_database(database_of(store)) == []
    store.close()
