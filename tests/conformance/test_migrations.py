"""Schemas per dialect: versioned migrations, and an upgraded schema equals a fresh one."""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import replace

import pytest

import postroom
import postroom.transitions
from postroom.db import Database, dialect_for_url
from tests.support import database_of, envelope

#: Describe a schema from the database's own catalog: tables, columns, indexes.
SNAPSHOT = {
    "sqlite": [
        'SELECT m.name AS t, p.name AS c, p.type AS ty, p."notnull" AS nn, p.pk AS pk '
        "FROM sqlite_master AS m, pragma_table_info(m.name) AS p "
        "WHERE m.type = 'table' ORDER BY 1, 2",
        "SELECT name, tbl_name, coalesce(sql, '') FROM sqlite_master WHERE type = 'index' "
        "ORDER BY name",
    ],
    "postgres": [
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2",
        "SELECT indexname, tablename, replace(indexdef, current_schema() || '.', '') "
        "FROM pg_indexes "
        "WHERE schemaname = current_schema() ORDER BY 1",
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE connamespace = current_schema()::regnamespace ORDER BY 1",
    ],
}


def snapshot(database: Database) -> list[tuple[object, ...]]:
    dialect = database.dialect
    rows: list[tuple[object, ...]] = []
    with dialect.connection() as conn:
        for sql in SNAPSHOT[dialect.name]:
            rows.extend(tuple(row.values()) if isinstance(row, dict) else tuple(row)
                        for row in dialect.execute(conn, sql, ()).fetchall())
        dialect.rollback(conn)
    # The schema itself is compared; which migration names what is not.
    return [row for row in rows if "postroom_schema" not in map(str, row)]


@pytest.mark.parametrize("component", ["store", "receiver"])
def test_an_upgraded_schema_equals_a_fresh_one(make_url, component):
    fresh = Database(dialect_for_url(make_url("fresh")))
    upgraded = Database(dialect_for_url(make_url("upgraded")))
    try:
        versions = [version for version, _ in fresh.dialect.migrations(component)]
        assert versions == list(range(1, len(versions) + 1)), "migrations are numbered 1..n"
        fresh.migrate(component)
        for version in versions:  # every older release, upgraded one step at a time
            assert upgraded.migrate(component, target=version) == version
        assert snapshot(upgraded) == snapshot(fresh)
        assert upgraded.schema_version(component) == versions[-1]
    finally:
        fresh.close()
        upgraded.close()


def test_migrating_twice_changes_nothing(db_url):
    with postroom.open_store(db_url) as store:
        first = snapshot(database_of(store))
    with postroom.open_store(db_url) as store:
        assert snapshot(database_of(store)) == first
        assert store.info()["schema_version"] == database_of(store).migrate("store")


def test_a_schema_newer_than_the_code_is_refused(db_url):
    with postroom.open_store(db_url) as store:
        database_of(store).migrate("store")
        dialect = database_of(store).dialect
        with dialect.connection() as conn:
            dialect.begin(conn, write=True)
            dialect.execute(conn, "UPDATE postroom_schema SET version = 99", ())
            dialect.commit(conn)
    with pytest.raises(postroom.SchemaError, match="version 99"):
        postroom.open_store(db_url)


def test_opening_without_create_refuses_a_database_without_a_store(db_url):
    with pytest.raises(postroom.StoreError):  # SQLite: no file to open; PostgreSQL: no tables
        postroom.open_store(db_url, create=False)
    database = Database(dialect_for_url(db_url))
    try:
        assert database.schema_version("store") == 0
    finally:
        database.close()


def test_opening_without_create_leaves_an_older_schema_as_it_is(db_url):
    database = Database(dialect_for_url(db_url))
    try:
        database.migrate("store", target=2)
        with pytest.raises(postroom.SchemaError, match="postroom init upgrades it"):
            postroom.open_store(db_url, create=False)
        assert database.schema_version("store") == 2
    finally:
        database.close()


def test_opening_without_create_opens_a_current_store(db_url, auth):
    postroom.open_store(db_url).close()
    with postroom.open_store(db_url, create=False) as store:
        assert store.receive(auth, envelope()).task_id


def test_a_store_upgraded_from_before_published_settings_publishes_its_openers(db_url):
    older = Database(dialect_for_url(db_url))
    try:
        older.migrate("store", target=3)
    finally:
        older.close()
    with postroom.open_store(db_url, settings=postroom.Settings(retention=60.0)) as store:
        assert store.info()["retention_seconds"] == 60.0


def _legacy_task(tx, *, principal: str, message_id: str, parent: str | None,
                 now: float) -> str:
    """Write a finished task and its reply as a store of schema 4 wrote them."""
    from postroom.validation import canonical_json, check_envelope, fingerprint

    fields = {"message_id": message_id, "sender": principal, "payload": {}, "deadline": now + 60,
              "parent_task_id": parent, "hops": 0 if parent is None else 1}
    checked = check_envelope(principal, fields, limits=postroom.Limits())
    task_id = checked.task_id
    body = postroom.transitions.legacy_reply_body(task_id, postroom.TaskState.DONE,
                                                  canonical_json("ok"))
    tx.execute("INSERT INTO inbox VALUES (:t, :p, :m, :f, :e, :now)",
               {"t": task_id, "p": principal, "m": message_id, "f": checked.fingerprint,
                "e": checked.envelope, "now": now})
    tx.execute("INSERT INTO tasks (task_id, principal, message_id, queue, state, payload, "
               "deadline, max_attempts, hops, parent_task_id, attempts, fence, available_at, "
               "result, created_at, updated_at) VALUES (:t, :p, :m, 'default', 'done', '{}', "
               ":d, 3, :h, :parent, 1, 1, :now, '\"ok\"', :now, :now)",
               {"t": task_id, "p": principal, "m": message_id, "d": now + 60,
                "h": checked.hops, "parent": parent, "now": now})
    tx.execute("INSERT INTO replies (reply_id, task_id, status, body, fingerprint, state, "
               "attempts, budget, fence, available_at, created_at, updated_at, sent_at) "
               "VALUES (:r, :t, 'done', :b, :f, 'sent', 1, 3, 1, :now, :now, :now, :now)",
               {"r": "reply:" + task_id, "t": task_id, "b": body, "f": fingerprint(body),
                "now": now})
    return task_id


def test_an_upgrade_routes_earlier_replies_from_their_tasks_and_keeps_their_bodies(make_url):
    from postroom.audit import audit_url
    from postroom.db import Write
    from postroom.validation import follow_up_principal

    url = make_url("v4")
    with closing_database(url) as database:
        database.migrate("store", target=4)
        with database.transaction(Write("test.legacy", timed=False)) as tx:
            root = _legacy_task(tx, principal="planner", message_id="root", parent=None,
                                now=1000.0)
            child = _legacy_task(tx, principal=follow_up_principal(root), message_id="part",
                                 parent=root, now=1001.0)
            tx.execute("UPDATE postroom_clock SET high_water = 1001")  # before version 14
    with postroom.open_store(url) as store:
        bodies = {task_id: store.reply(task_id).body for task_id in (root, child)}
        assert {task_id: store.task(task_id).requester for task_id in (root, child)} == {
            root: "planner", child: "planner"}
        assert {store.reply(task_id).requester for task_id in (root, child)} == {"planner"}
        assert all('"requester"' not in body for body in bodies.values())  # untouched
        # Version 10 gives earlier tasks their chain: the root's, with its row.
        assert {store.task(task_id).root_task_id for task_id in (root, child)} == {root}
        assert (store.chain(child).root_task_id, store.chain(child).principal) == (
            root, "planner")
    assert audit_url(url) == []


def closing_database(url: str):
    from contextlib import closing

    return closing(Database(dialect_for_url(url)))


def _v11_task(tx, *, principal: str, message_id: str, state: str, created_at: float,
              parent: str | None = None, root: str | None = None, fence: int = 0,
              attempts: int = 0, owner: str | None = None, lease_until: float | None = None,
              reply_state: str | None = None) -> str:
    """Write a task as a store of schema 11 kept it: its inbox row beside it, its root named
    even when it is its own, and its reply keyed by reply_id (if ``reply_state``)."""
    from postroom.transitions import Route, reply_content
    from postroom.validation import canonical_json, check_envelope

    deadline = created_at + 4000
    fields = {"message_id": message_id, "sender": principal, "payload": {"n": 1},
              "deadline": deadline, "parent_task_id": parent, "hops": 0 if parent is None else 1}
    checked = check_envelope(principal, fields, limits=postroom.Limits())
    task_id = checked.task_id
    tx.execute("INSERT INTO inbox VALUES (:t, :p, :m, :f, :e, :at)",
               {"t": task_id, "p": principal, "m": message_id, "f": checked.fingerprint,
                "e": checked.envelope, "at": created_at})
    result = canonical_json("ok") if state == "done" else None
    error = "gave up" if state == "failed" else None
    tx.execute("INSERT INTO tasks (task_id, principal, message_id, queue, state, payload, "
               "deadline, max_attempts, hops, parent_task_id, attempts, fence, owner, "
               "lease_until, available_at, claim_at, result, last_error, created_at, "
               "updated_at, requester, root_task_id) VALUES (:t, :p, :m, 'default', :s, "
               "'{\"n\":1}', :d, 3, :h, :parent, :a, :fence, :owner, :lease, :at, :at, "
               ":result, :error, :at, :at, 'planner', :root)",
               {"t": task_id, "p": principal, "m": message_id, "s": state, "d": deadline,
                "h": checked.hops, "parent": parent, "a": attempts, "fence": fence,
                "owner": owner, "lease": lease_until, "at": created_at, "result": result,
                "error": error, "root": root or task_id})
    if reply_state is not None:
        body = reply_content(task_id, postroom.TaskState(state),
                             result or canonical_json({"error": error}),
                             Route("planner", None, parent)).body
        from postroom.validation import fingerprint

        tx.execute("INSERT INTO replies (reply_id, task_id, status, body, fingerprint, "
                   "requester, queue, state, attempts, budget, fence, available_at, "
                   "last_error, created_at, updated_at, sent_at) VALUES (:r, :t, :s, :b, :f, "
                   "'planner', 'default', :rs, 1, 3, 1, :at, :err, :at, :at, :sent)",
                   {"r": "reply:" + task_id, "t": task_id, "s": state, "b": body,
                    "f": fingerprint(body), "rs": reply_state, "at": created_at,
                    "err": "HTTP 400" if reply_state == "dead" else None,
                    "sent": created_at if reply_state == "sent" else None})
    return task_id


def test_an_upgrade_to_one_row_per_task_keeps_every_promise_made(make_url):
    """Version 12 folds the inbox into the tasks and keys replies by their task's integer:
    a store upgraded to it answers as it answered before -- a resend is a duplicate, other
    content a collision, a stale claim fenced, fences keep rising -- and delivers, lists and
    audits as a fresh one does."""
    from postroom.audit import audit_url
    from postroom.db import Write
    from postroom.validation import follow_up_principal

    url = make_url("v11")
    with closing(Database(dialect_for_url(url), clock=postroom.ManualClock(1100.0))) as database:
        database.migrate("store", target=11)
        with database.transaction(Write("test.v11", timed=False)) as tx:
            root = _v11_task(tx, principal="planner", message_id="root", state="done",
                             created_at=1000.0, fence=1, attempts=1, reply_state="sent")
            child = _v11_task(tx, principal=follow_up_principal(root), message_id="part",
                              state="running", created_at=1001.0, parent=root, root=root,
                              fence=3, attempts=2, owner="w1", lease_until=1900.0)
            waiting = _v11_task(tx, principal="planner", message_id="waiting",
                                state="pending", created_at=1002.0, fence=5, attempts=1)
            dead = _v11_task(tx, principal="planner", message_id="dead", state="failed",
                             created_at=1003.0, fence=1, attempts=1, reply_state="dead")
            tx.execute("INSERT INTO chains (root_task_id, principal, max_hops, max_tasks, "
                       "tasks, created_at) VALUES (:r, 'planner', 4, 1000, 2, 1000)",
                       {"r": root})
            for alone in (waiting, dead):
                tx.execute("INSERT INTO chains (root_task_id, principal, max_hops, "
                           "max_tasks, tasks, created_at) VALUES (:r, 'planner', 4, 1000, 1, "
                           "1002)", {"r": alone})
    planner = postroom.AuthContext(principal="planner")
    with postroom.open_store(url, clock=postroom.ManualClock(1100.0)) as store:
        resent = envelope("waiting", payload={"n": 1}, deadline=5002.0)
        assert store.receive(planner, resent).duplicate
        with pytest.raises(postroom.PayloadCollision):
            store.receive(planner, replace(resent, payload={"n": 2}))
        held = store.task(child)
        claim = postroom.Claim(
            task_id=child, owner="w1", fence=3, attempt=2, max_attempts=3, payload={"n": 1},
            queue="default", hops=1, deadline=held.deadline, lease_until=1900.0,
            principal=held.principal, message_id="part", requester="planner")
        with pytest.raises(postroom.Fenced):
            store.finish(replace(claim, fence=2), "stale")
        store.finish(claim, "done at last")
        again = store.claim("w2")
        assert (again.task_id, again.fence, again.attempt) == (waiting, 6, 2)
        assert (store.task(child).root_task_id, store.chain(child).tasks) == (root, 2)
        assert [task.task_id for task in store.list_tasks().items] == [
            dead, waiting, child, root]
        store.requeue_reply(f"reply:{dead}", operator="ops", reason="receiver fixed")
        receiver = postroom.Receiver.open(make_url("receiver"))
        with receiver:
            report = store.dispatch(postroom.InProcessTransport(receiver), limit=10)
            assert (report.claimed, report.sent) == (2, 2)
            assert store.reply(root).state is postroom.ReplyState.SENT
    assert audit_url(url) == []


def test_an_upgrade_keeps_the_time_high_water_beside_the_counts(make_url, auth):
    """Version 14 moves the high-water into postroom_counts: a decision after the upgrade
    still never goes below one committed before it, and the counts are kept."""
    from postroom.db import Write

    url = make_url("v13")
    with closing(Database(dialect_for_url(url), track_time=False)) as database:
        database.migrate("store", target=13)
        with database.transaction(Write("test.v13", timed=False)) as tx:
            tx.execute("UPDATE postroom_clock SET high_water = 5000 WHERE id = 1")
            tx.execute("INSERT INTO postroom_counts (kind, queue, state, shard, n) "
                       "VALUES ('task', 'default', 'done', 1, 7)")
    with postroom.open_store(url, clock=postroom.ManualClock(1000.0)) as store:
        ack = store.receive(auth, envelope("after", deadline=9000.0))
        assert store.task(ack.task_id).created_at == 5000.0
        assert store.status().queues["default"].outcomes[postroom.TaskState.DONE] == 7


def test_a_receiver_upgraded_to_one_row_per_reply_keeps_each_receipt_and_effect(make_url):
    """Version 3 keeps a receipt and its effect in one row: what version 2 held is carried,
    and what its audit named stays named (an effect whose receipt is gone, a receipt without
    its effect); a reply whose effect stands alone is a collision, never a second effect."""
    from postroom.audit import audit_url
    from postroom.db import Write
    from postroom.validation import fingerprint

    def body(task: str) -> str:
        return json.dumps({"kind": "result", "result": 1, "status": "done", "task_id": task},
                          separators=(",", ":"), sort_keys=True)

    url = make_url("receiver-v2")
    with closing(Database(dialect_for_url(url), track_time=False)) as database:
        database.migrate("receiver", target=2)
        with database.transaction(Write("test.v2")) as tx:
            for n, task in enumerate(["whole", "alone"], start=1):
                tx.execute("INSERT INTO receiver_receipts (id, reply_id, fingerprint, body, "
                           "received_at) VALUES (:id, :reply, :f, :b, 1000)",
                           {"id": n, "reply": f"reply:{task}", "f": fingerprint(body(task)),
                            "b": body(task)})
            for n, task in [(1, "whole"), (-1, "orphan")]:
                tx.execute("INSERT INTO receiver_effects VALUES (:id, :reply, :task, 'done', "
                           "'1', 1001)", {"id": n, "reply": f"reply:{task}", "task": task})
    with postroom.Receiver.open(url) as receiver:
        assert {(v.check, v.identity) for v in audit_url(url)} == {
            ("effect_without_receipt", "reply:orphan"),
            ("receipt_without_effect", "reply:alone")}
        assert receiver.accept("reply:whole", body("whole")).duplicate
        with pytest.raises(postroom.PayloadCollision):
            receiver.accept("reply:orphan", body("orphan"))
        assert [receiver.effect_count(f"reply:{task}") for task in ("whole", "alone", "orphan")
                ] == [1, 0, 1]
        assert receiver.receipt("reply:whole")["received_at"] == 1000


def test_an_upgraded_receiver_keeps_its_receipts_and_effects(make_url):
    """Version 2 keys an effect by its receipt: a reply received before the upgrade is still
    a duplicate when delivered again, with its one effect, and other content a collision."""
    from postroom.audit import audit_url
    from postroom.db import Write
    from postroom.validation import fingerprint

    url = make_url("receiver-v1")
    body = '{"kind":"result","result":1,"status":"done","task_id":"t"}'
    with closing(Database(dialect_for_url(url), track_time=False)) as database:
        database.migrate("receiver", target=1)
        with database.transaction(Write("test.v1")) as tx:
            tx.execute("INSERT INTO receiver_receipts VALUES ('reply:t', :f, :b, 1000)",
                       {"f": fingerprint(body), "b": body})
            tx.execute("INSERT INTO receiver_effects VALUES ('reply:t', 't', 'done', '1', 1000)")
    with postroom.Receiver.open(url) as receiver:
        assert receiver.accept("reply:t", body).duplicate
        with pytest.raises(postroom.PayloadCollision):
            receiver.accept("reply:t", body.replace('"result":1', '"result":2'))
        assert not receiver.accept("reply:u", body.replace('"t"', '"u"')).duplicate
        assert (receiver.effect_count("reply:t"), receiver.effect_count("reply:u"),
                receiver.effects_total()) == (1, 1, 2)
    assert audit_url(url) == []
