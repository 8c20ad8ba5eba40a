"""Schemas per dialect: versioned migrations, and an upgraded schema equals a fresh one."""

from __future__ import annotations

import pytest

import postroom
from postroom.db import Database, dialect_for_url
from tests.support import database_of

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


def test_a_store_upgraded_from_before_published_settings_publishes_its_openers(db_url):
    older = Database(dialect_for_url(db_url))
    try:
        older.migrate("store", target=3)
    finally:
        older.close()
    with postroom.open_store(db_url, settings=postroom.Settings(retention=60.0)) as store:
        assert store.info()["retention_seconds"] == 60.0
