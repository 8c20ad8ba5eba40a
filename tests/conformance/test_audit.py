"""``postroom audit`` finds each kind of broken invariant, and nothing in a healthy store."""

from __future__ import annotations

import pytest

import postroom
from postroom.audit import audit_database, audit_url
from postroom.validation import fingerprint
from tests.support import START, database_of, envelope


def corrupt(store: postroom.Store, sql: str) -> None:
    """Break the database behind the store's back (the store never writes like this)."""
    dialect = database_of(store).dialect
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        dialect.execute(conn, sql, ())
        dialect.commit(conn)


@pytest.fixture
def busy_store(store, auth, transport, clock):
    """A store with a task in every stage: pending, running, done+sent, failed+pending."""
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(4)])
    store.finish(store.claim("w"), {"ok": 1})
    store.dispatch(transport)
    store.fail(store.claim("w"), "nope", retryable=False)
    store.claim("w")
    return store


def checks(store: postroom.Store) -> set[str]:
    return {violation.check for violation in audit_database(database_of(store))}


def test_a_healthy_store_and_receiver_are_clean(busy_store, receiver):
    assert audit_database(database_of(busy_store)) == []
    assert audit_database(database_of(receiver)) == []


@pytest.fixture
def limited_store(store, auth):
    """A store with a queue limited to 2, one slot held by a running task, and a re-run."""
    store.receive_atomic(auth, [envelope(f"m-{i}", not_before=START + 60 * i)
                                for i in range(3)])
    store.set_queue_limit("default", 2)
    claim = store.claim("w")
    store.cancel(claim.task_id)
    store.retry(claim.task_id, operator="op", reason="again")
    store.receive(auth, envelope("m-again"))
    store.claim("w")
    return store


def test_a_healthy_limited_store_is_clean(limited_store):
    assert audit_database(database_of(limited_store)) == []


@pytest.mark.parametrize(("sql", "check"), [
    ("DELETE FROM queue_slots WHERE slot = 2", "limit_slots_mismatch"),
    ("UPDATE queue_limits SET running = 3", "limit_slots_mismatch"),
    ("UPDATE queue_slots SET task_id = (SELECT task_id FROM queue_slots WHERE task_id IS NOT "
     "NULL), fence = (SELECT fence FROM queue_slots WHERE task_id IS NOT NULL)",
     "slot_held_twice"),
    ("UPDATE tasks SET queue = 'other' WHERE state = 'running'", "slot_of_another_queue"),
    ("DELETE FROM task_retries", "retry_link_mismatch"),
    ("UPDATE tasks SET available_at = not_before - 1 WHERE not_before > available_at - 1 "
     "AND state = 'pending' AND attempts = 0", "available_before_not_before"),
])
def test_each_broken_scheduling_invariant_is_named(limited_store, sql, check):
    corrupt(limited_store, sql)
    assert check in checks(limited_store)


@pytest.mark.parametrize(("sql", "check"), [
    ("DELETE FROM replies WHERE status = 'failed'", "terminal_task_without_reply"),
    ("UPDATE tasks SET state = 'pending', owner = NULL, lease_until = NULL "
     "WHERE state = 'done'", "reply_for_live_task"),
    ("UPDATE tasks SET owner = NULL WHERE state = 'running'", "running_without_owner_or_lease"),
    ("UPDATE tasks SET owner = 'ghost' WHERE state = 'pending'",
     "idle_task_with_owner_or_lease"),
    ("UPDATE tasks SET attempts = max_attempts + 1, fence = 99 WHERE state = 'running'",
     "attempts_out_of_range"),
    ("UPDATE tasks SET fence = 0 WHERE state = 'running'", "fence_below_attempts"),
    ("UPDATE replies SET attempts = budget + 1, fence = 99 WHERE state = 'sent'",
     "reply_attempts_over_budget"),
    ("UPDATE replies SET status = 'cancelled' WHERE state = 'sent'", "reply_status_mismatch"),
    ("UPDATE replies SET state = 'dead', last_error = NULL WHERE state = 'pending'",
     "dead_reply_without_error"),
    ("UPDATE tasks SET ended_at = NULL WHERE state = 'done'", "task_end_mismatch"),
    ("UPDATE tasks SET ended_at = created_at WHERE state = 'pending'", "task_end_mismatch"),
    ("UPDATE tasks SET envelope = envelope || ' ' WHERE state = 'pending'",
     "task_fingerprint"),
    ("UPDATE replies SET body = body || ' ' WHERE state = 'sent'", "reply_fingerprint"),
    ("UPDATE tasks SET message_id = 'forged' WHERE state = 'pending'", "task_identity"),
    ("UPDATE replies SET task_id = 'another' WHERE state = 'sent'", "reply_status_mismatch"),
    ("UPDATE tasks SET updated_at = updated_at + 100 WHERE state = 'done'",
     "decided_after_high_water"),
    ("UPDATE replies SET budget = 101 WHERE state = 'pending'", "budget_out_of_range"),
    ("UPDATE replies SET budget = 0 WHERE state = 'pending'", "budget_out_of_range"),
    ("UPDATE replies SET attempts = 0 WHERE state = 'sent'", "budget_out_of_range"),
    ("UPDATE tasks SET last_error = 'rewritten' WHERE state = 'failed'", "reply_content"),
    ("UPDATE replies SET parked_at = 1 WHERE state = 'sent'", "parked_not_pending"),
])
def test_each_broken_invariant_is_named(busy_store, sql, check):
    corrupt(busy_store, sql)
    assert check in checks(busy_store)


def test_a_sending_reply_due_before_its_lease_ends_is_named(busy_store):
    assert len(busy_store.claim_replies("d")) == 1
    assert checks(busy_store) == set()
    corrupt(busy_store, "UPDATE replies SET available_at = available_at - 60 "
                        "WHERE state = 'sending'")
    assert checks(busy_store) == {"sending_without_owner_or_lease"}


def corrupt_receipts(receiver: postroom.Receiver, sql: str) -> None:
    dialect = database_of(receiver).dialect
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        dialect.execute(conn, sql, ())
        dialect.commit(conn)


def test_a_receiver_effect_without_its_receipt_is_named(receiver):
    receiver.accept("reply:t", '{"kind":"result","result":1,"status":"done","task_id":"t"}')
    corrupt_receipts(receiver, "UPDATE receiver_receipts "
                               "SET fingerprint = NULL, body = NULL, received_at = NULL")
    assert [v.check for v in audit_database(database_of(receiver))] == ["effect_without_receipt"]


def test_a_receipt_without_its_effect_is_named(receiver):
    receiver.accept("reply:t", '{"kind":"result","result":1,"status":"done","task_id":"t"}')
    corrupt_receipts(receiver, "UPDATE receiver_receipts "
                               "SET task_id = NULL, status = NULL, result = NULL, "
                               "applied_at = NULL")
    assert [v.check for v in audit_database(database_of(receiver))] == ["receipt_without_effect"]


def rewrite_receipts(receiver: postroom.Receiver, body: str) -> None:
    """Replace every receipt's body with ``body`` and a fingerprint that matches it."""
    dialect = database_of(receiver).dialect
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        dialect.execute(conn, f"UPDATE receiver_receipts SET body = '{body}', "
                              f"fingerprint = '{fingerprint(body)}'", ())
        dialect.commit(conn)


def test_a_receipt_rewritten_consistently_is_named_by_its_effect(receiver):
    receiver.accept("reply:t", '{"kind":"result","result":1,"status":"done","task_id":"t"}')
    rewrite_receipts(receiver, '{"kind":"result","result":2,"status":"done","task_id":"t"}')
    assert [v.check for v in audit_database(database_of(receiver))] == ["effect_content"]


def test_a_receipt_naming_another_task_than_its_reply_id_is_named(receiver):
    receiver.accept("reply:t", '{"kind":"result","result":1,"status":"done","task_id":"t"}')
    rewrite_receipts(receiver, '{"kind":"result","result":1,"status":"done","task_id":"u"}')
    assert "receipt_identity" in {v.check for v in audit_database(database_of(receiver))}


def test_a_database_without_postroom_tables_is_reported(make_url):
    url = make_url("nothing")
    postroom.Receiver.open(url).close()
    with postroom.Receiver.open(url) as receiver:
        dialect = database_of(receiver).dialect
        with dialect.connection() as conn:
            dialect.begin(conn, write=True)
            dialect.execute(conn, "DROP TABLE postroom_schema", ())
            dialect.commit(conn)
    assert [v.check for v in audit_url(url)] == ["schema"]


def test_auditing_a_missing_sqlite_file_reports_it_and_creates_nothing(tmp_path):
    missing = tmp_path / "missing.db"
    [violation] = audit_url(f"sqlite:///{missing}")
    assert violation.check == "database"
    assert not missing.exists()


def test_every_audit_query_is_a_listed_check_and_every_listed_check_has_its_query(store):
    from postroom.audit import CHECKS

    queries = {name for name in database_of(store).dialect.queries
               if name.startswith("audit_") and not name.endswith("_contents")}
    listed = {f"audit_{component}_{check}" for component, checks in CHECKS.items()
              for check in checks}
    assert queries == listed
