"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

import postroom
from postroom.db import Database, Tx, dialect_for_url
from postroom.db.database import Write

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
    """Every row of the tasks and replies, and the counts with the time high-water: what a
    refused call must leave exactly as it was."""
    def read(tx: Tx) -> dict[str, list[dict[str, object]]]:
        return {table: [dict(row) for row in tx.execute(f"SELECT * FROM {table} ORDER BY {key}")]
                for table, key in (("tasks", "id"), ("replies", "id"),
                                   ("postroom_counts", "kind, queue, state, shard"))}

    return database_of(store).read(read)


@dataclass(frozen=True)
class ApprovedChild:
    """What ``approved_child`` made: a root, its follow-up, and the approval the follow-up's
    side effect used."""

    root: str
    child: str
    approval: postroom.Approval


def approved_child(store: postroom.Store, now: float, queue: str = "chained") -> ApprovedChild:
    """A root (its chain lowered to 3 hops, 5 tasks, 10 cost units) that charges 2 units and
    spawns a follow-up, which commits a refund under alice's approval ``refund-17``."""
    root = store.receive(postroom.AuthContext(principal="planner"), envelope(
        "chain-root", queue=queue, deadline=now + 3600,
        budget=postroom.Budget(hops=3, tasks=5, cost=10))).task_id
    claim = store.claim("worker-r", queues=queue)
    assert claim is not None and claim.task_id == root
    store.finish(claim, "spawned", charge=2, follow_ups=[postroom.FollowUp(
        message_id="refund", payload={"customer": 17})])
    approval = store.grant_approval(
        postroom.AuthContext(principal="alice", role="human"), "refund-17", action="refund",
        resource="customer:17", data={"amount": 40}, expires_at=now + 3600,
        requested_by="planner")
    claim = store.claim("worker-c", queues=queue)
    assert claim is not None and store.task(claim.task_id).parent_task_id == root
    store.finish(claim, "refunded", side_effects=[postroom.SideEffect(
        action="refund", resource="customer:17", data={"amount": 40})])
    return ApprovedChild(root=root, child=claim.task_id, approval=approval)


def orphan_from_its_chain(store: postroom.Store, task_id: str) -> None:
    """Make ``task_id`` a member of a chain with neither its root nor its row any more, as a
    chain whose root was pruned before version 10 left it (``postroom audit`` reports it):
    its story then has no chain."""
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "UPDATE tasks SET root_task_id = 'a-root-long-pruned' WHERE task_id = :task",
        {"task": task_id}))


def migrate_store(url: str) -> None:
    """Create the store's schema at ``url`` at the latest version, opening nothing else."""
    database = Database(dialect_for_url(url))
    try:
        database.migrate("store")
    finally:
        database.close()
