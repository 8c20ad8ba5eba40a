"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import postroom
from postroom.db import Database, Tx

#: The manual clock's starting time in every test.
START = 1_000_000.0

#: Store settings of every test (and every test subprocess): fixed backoffs, so the times a
#: test advances to are exact.
SETTINGS = postroom.Settings(backoff=postroom.FixedBackoff(seconds=10.0),
                             delivery_backoff=postroom.FixedBackoff(seconds=5.0))


def envelope(message_id: str = "m-1", **fields: object) -> postroom.Envelope:
    """An envelope from ``planner`` with a far deadline, overridable field by field."""
    values: dict[str, object] = {"message_id": message_id, "sender": "planner",
                                 "payload": {"n": 1}, "deadline": START + 3600}
    values.update(fields)
    return postroom.Envelope(**values)  # type: ignore[arg-type]


def database_of(holder: postroom.Store | postroom.Receiver) -> Database:
    """The database under a store or receiver, for tests that look at what it holds.

    The product offers no such hatch: tests reach in here, in one place.
    """
    database: Database = holder._db
    return database


def latest_schema(store: postroom.Store, component: str = "store") -> int:
    """The newest schema version this postroom ships for ``component`` on the store's dialect."""
    return database_of(store).dialect.migrations(component)[-1][0]


def analyze(store: postroom.Store) -> None:
    """Gather planner statistics for the store's own tables, as production's would be.

    On PostgreSQL a bare ANALYZE would visit every schema of the shared tests' database,
    and deadlock with another test process dropping its schema.
    """
    dialect = database_of(store).dialect
    with dialect.connection() as conn:
        if dialect.name == "sqlite":
            dialect.execute(conn, "ANALYZE", ())
            return
        tables = [row["tablename"] for row in dialect.execute(
            conn, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()", ())]
        dialect.execute(conn, "ANALYZE " + ", ".join(f'"{name}"' for name in tables), ())


def stored(store: postroom.Store) -> dict[str, list[dict[str, object]]]:
    """Every row of the tasks, replies and time high-water tables: what a refused call must
    leave exactly as it was."""
    def read(tx: Tx) -> dict[str, list[dict[str, object]]]:
        return {table: [dict(row) for row in tx.execute(f"SELECT * FROM {table} ORDER BY 1")]
                for table in ("tasks", "replies", "postroom_clock")}

    return database_of(store).read(read)
