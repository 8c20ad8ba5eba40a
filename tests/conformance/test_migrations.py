"""Schemas per dialect: versioned migrations, and an upgraded schema equals a fresh one."""

from __future__ import annotations

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
        with database.transaction(Write("test.legacy")) as tx:
            root = _legacy_task(tx, principal="planner", message_id="root", parent=None,
                                now=1000.0)
            child = _legacy_task(tx, principal=follow_up_principal(root), message_id="part",
                                 parent=root, now=1001.0)
            tx.execute("UPDATE postroom_clock SET high_water = 1001")
    with postroom.open_store(url) as store:
        bodies = {task_id: store.reply(task_id).body for task_id in (root, child)}
        assert {task_id: store.task(task_id).requester for task_id in (root, child)} == {
            root: "planner", child: "planner"}
        assert {store.reply(task_id).requester for task_id in (root, child)} == {"planner"}
        assert all('"requester"' not in body for body in bodies.values())  # untouched
    assert audit_url(url) == []


def closing_database(url: str):
    from contextlib import closing

    return closing(Database(dialect_for_url(url)))
