"""``postroom audit`` names each broken wait invariant of SPEC §8, and the keys refuse the rest."""

from __future__ import annotations

import pytest

import postroom
from postroom import FollowUp, SignalResult
from postroom.audit import audit_database
from tests.support import START, database_of, envelope

ALICE = postroom.AuthContext(principal="alice")
BOB = postroom.AuthContext(principal="bob")


@pytest.fixture
def waits_store(store, auth, clock):
    """Every wait outcome and every kind of receipt, in four slots.

    a: generation 1 signaled and resumed with a follow-up task, generation 2 waiting;
    b: generation 1 timed out by a late signal, continuation unconsumed;
    c: generation 1 timed out by expire, resumed with no effect;
    z: an early signal (unknown_wait).
    """
    parent = store.receive(auth, envelope("ask")).task_id
    store.signal(ALICE, "early", "f", "z", 1, "too soon")
    for step in "abc":
        store.open_wait("f", step, 0, START + 10, task_id=parent if step == "a" else None)
    clock.advance(1)
    assert store.signal(ALICE, "e1", "f", "a", 1, {"ok": True}).result is SignalResult.ACCEPTED
    store.signal(ALICE, "e-closed", "f", "a", 1, "second")
    store.resume("f", "a", 1, FollowUp(message_id="next", payload={}))
    store.open_wait("f", "a", 1, START + 100)
    store.signal(ALICE, "e-stale", "f", "a", 1, "old")
    clock.set(START + 10)
    assert store.signal(BOB, "e2", "f", "b", 1, "late").result is SignalResult.TOO_LATE
    store.expire("f", "c", 1)
    store.resume("f", "c", 1, None)
    return store


def write_behind_its_back(store: postroom.Store, sql: str) -> None:
    """Try a write the store never makes; roll it back if the database refuses it."""
    dialect = database_of(store).dialect
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        try:
            dialect.execute(conn, sql, ())
        except BaseException:
            dialect.rollback(conn)
            raise
        dialect.commit(conn)


def checks(store: postroom.Store) -> set[str]:
    return {violation.check for violation in audit_database(database_of(store))}


def test_a_store_with_every_wait_outcome_is_clean(waits_store):
    assert audit_database(database_of(waits_store)) == []


@pytest.mark.parametrize(("sql", "check"), [
    ("UPDATE wait_slots SET generation = 3 WHERE step = 'a'", "slot_generation_mismatch"),
    ("UPDATE wait_slots SET generation = 1 WHERE step = 'a'", "waiting_not_current"),
    ("UPDATE waits SET event_id = NULL WHERE state = 'signaled'", "wait_end_fields"),
    ("UPDATE waits SET ended_at = NULL WHERE state = 'timed_out'", "wait_end_fields"),
    ("DELETE FROM wait_receipts WHERE result = 'accepted'", "signaled_without_its_receipt"),
    ("UPDATE waits SET event_id = 'e-closed' WHERE state = 'signaled'",
     "signaled_without_its_receipt"),
    ("UPDATE wait_receipts SET result = 'accepted' WHERE result = 'too_late'",
     "accepted_receipt_not_adopted"),
    ("UPDATE wait_receipts SET result = 'closed' WHERE result = 'unknown_wait'",
     "receipt_inconsistent_with_wait"),
    ("UPDATE wait_receipts SET generation = 2 WHERE result = 'stale_generation'",
     "receipt_inconsistent_with_wait"),
    ("UPDATE wait_receipts SET received_at = 0 WHERE result = 'too_late'",
     "receipt_inconsistent_with_wait"),
    ("UPDATE waits SET ended_at = deadline - 1 WHERE state = 'timed_out'",
     "timed_out_before_deadline"),
    ("UPDATE wait_continuations SET kind = 'signal' WHERE kind = 'timeout'",
     "ended_wait_without_continuation"),
    ("UPDATE wait_continuations SET value = '\"forged\"' WHERE kind = 'signal'",
     "continuation_value_mismatch"),
    ("UPDATE wait_continuations SET value = '1' WHERE kind = 'timeout'",
     "continuation_value_mismatch"),
    ("UPDATE wait_continuations SET consumed_at = NULL", "continuation_effect_mismatch"),
    ("DELETE FROM wait_effects", "continuation_effect_mismatch"),
    ("UPDATE wait_effects SET kind = 'none' WHERE kind = 'task'", "effect_task_mismatch"),
    ("UPDATE tasks SET hops = hops + 5 WHERE parent_task_id IS NOT NULL",
     "effect_task_mismatch"),
    ("UPDATE tasks SET parent_task_id = NULL", "effect_task_mismatch"),
    ("UPDATE postroom_counts SET high_water = 0 WHERE kind = 'clock'",
     "wait_decided_after_high_water"),
])
def test_each_broken_wait_invariant_is_named(waits_store, sql, check):
    write_behind_its_back(waits_store, sql)
    assert check in checks(waits_store)


@pytest.mark.parametrize("sql", [
    # a second waiting generation in one slot
    "UPDATE waits SET state = 'waiting', ended_at = NULL, event_principal = NULL, "
    "event_id = NULL WHERE step = 'a' AND generation = 1",
    # a second accepted receipt for one generation
    "UPDATE wait_receipts SET result = 'accepted' WHERE event_id = 'e-closed'",
    # a second continuation, a second effect
    "INSERT INTO wait_continuations (flow, step, generation, kind, created_at) "
    "VALUES ('f', 'a', 1, 'timeout', 0)",
    "INSERT INTO wait_effects (flow, step, generation, kind, applied_at) "
    "VALUES ('f', 'a', 1, 'none', 0)",
    # an effect without its continuation, a continuation without its wait
    "INSERT INTO wait_effects (flow, step, generation, kind, applied_at) "
    "VALUES ('f', 'b', 9, 'none', 0)",
    "INSERT INTO wait_continuations (flow, step, generation, kind, created_at) "
    "VALUES ('f', 'x', 1, 'timeout', 0)",
    # a wait outside any slot
    "INSERT INTO waits (flow, step, generation, state, deadline, opened_at) "
    "VALUES ('f', 'x', 1, 'waiting', 0, 0)",
    # a second receipt for one principal's event id
    "INSERT INTO wait_receipts (principal, event_id, flow, step, generation, value, result, "
    "received_at) VALUES ('alice', 'e1', 'f', 'a', 1, '1', 'closed', 0)",
])
def test_the_keys_refuse_a_second_outcome_continuation_or_effect(waits_store, sql):
    with pytest.raises(Exception, match=r"(?i)unique|constraint|foreign key"):
        write_behind_its_back(waits_store, sql)
    assert audit_database(database_of(waits_store)) == []
