"""Helpers shared by the wait tests: one call per wait operation, and a durable snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import postroom
from tests.support import START, database_of, envelope

FLOW, STEP = "case-a", "details"
ALICE = postroom.AuthContext(principal="alice")

# Every table a wait operation writes, with an order that makes a snapshot deterministic.
_TABLES = {
    "wait_slots": "flow, step",
    "waits": "flow, step, generation",
    "wait_receipts": "principal, event_id",
    "wait_continuations": "flow, step, generation",
    "wait_effects": "flow, step, generation",
    "tasks": "task_id",
}


def snapshot(store: postroom.Store) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table a wait operation writes, as plain data."""
    found = {}
    with database_of(store).reading() as tx:
        for table, order in _TABLES.items():
            cursor = tx.execute(f"SELECT * FROM {table} ORDER BY {order}")
            # A task's id is the store's own key: a rolled-back insert may have spent one
            # (a PostgreSQL sequence does not roll back), so the ids are not compared.
            found[table] = [{column: value for column, value in dict(row).items()
                             if column != "id"} for row in cursor.fetchall()]
        # The time high-water, as the store reads it: which row holds it is the backend's
        # business (a clock row of the writing session, or the newest task's creation).
        found["postroom_clock"] = [{"high_water": tx.one("clock_read")["high_water"]}]
    return found


@dataclass(frozen=True, slots=True)
class WaitCall:
    """One wait operation: bring a fresh store to where the call makes sense, the call, and
    what a retry answers once the call has committed (its replay, or the wait closed)."""

    setup: Callable[[postroom.Store, postroom.ManualClock], None]
    call: Callable[[postroom.Store], Any]
    retried: Callable[[Any], Any]


def _nothing(store: postroom.Store, clock: postroom.ManualClock) -> None:
    pass


def _open(store: postroom.Store, clock: postroom.ManualClock) -> None:
    store.open_wait(FLOW, STEP, 0, START + 10)


def _due(store: postroom.Store, clock: postroom.ManualClock) -> None:
    _open(store, clock)
    clock.set(START + 10)


def _signaled_with_parent(store: postroom.Store, clock: postroom.ManualClock) -> None:
    parent = store.receive(postroom.AuthContext(principal="planner"), envelope("ask"))
    store.open_wait(FLOW, STEP, 0, START + 10, task_id=parent.task_id)
    store.signal(ALICE, "e1", FLOW, STEP, 1, {"approve": True})


OPERATIONS: dict[str, WaitCall] = {
    "open_wait": WaitCall(
        _nothing, lambda s: s.open_wait(FLOW, STEP, 0, START + 10, request_id="r1"),
        lambda first: replace(first, replay=True)),
    "signal": WaitCall(
        _open, lambda s: s.signal(ALICE, "e1", FLOW, STEP, 1, {"approve": True}),
        lambda first: replace(first, result=postroom.SignalResult.REPLAY)),
    "expire": WaitCall(_due, lambda s: s.expire(FLOW, STEP, 1),
                       lambda first: postroom.ExpireResult.CLOSED),
    "expire_due": WaitCall(_due, lambda s: s.expire_due(), lambda first: 0),
    "resume": WaitCall(
        _signaled_with_parent,
        lambda s: s.resume(FLOW, STEP, 1, postroom.FollowUp(message_id="next",
                                                             payload={"n": 1})),
        lambda first: replace(first, result=postroom.ResumeResult.REPLAY)),
}


def wait_points() -> list[str]:
    """Every registered fault point of a wait operation (enumerated, never listed by hand)."""
    from postroom import faults

    return [p.name for p in faults.registered() if p.name.split(".")[0] in OPERATIONS]
