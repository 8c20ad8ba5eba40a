"""The limits issue's bar: a global limit per queue holds across processes on PostgreSQL, at
claim time, without a hot row that serializes the claims.

Eight claiming processes (``tests.harness.children``), one queue limited to K = 3, at least 40
rounds; in each round every process claims, holds and finishes tasks of the queue for a short
window, all at once, and says when it held each one and how many of the queue's tasks the
database showed running meanwhile. No instant may see more than 3 held, no reading more than 3
running, and 3 must run at once (so the test can fail). Prints its counts
(``pytest -n 0 -s tests/postgres/test_global_limit.py``).
"""

from __future__ import annotations

import psycopg

from postroom import TaskState
from postroom.audit import audit_url
from tests.harness.children import Answer, release, spawn
from tests.support import envelope

LIMIT = 3
CLAIMERS = 8
ROUNDS = 40
TASKS_PER_ROUND = 12
#: Seconds each process claims for in a round, and holds each task it claimed.
WINDOW, HOLD = 0.2, 0.02


def most_at_once(spans: list[list[float]]) -> int:
    """The most spans ``[start, end, ...]`` that share an instant (an end before a start at
    the same time: spans that only touch do not overlap)."""
    edges = sorted([(span[0], 1) for span in spans] + [(span[1], -1) for span in spans])
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def values(answers: list[Answer], round_: int) -> list[object]:
    failed = [(answer.error, answer.message) for answer in answers if answer.error is not None]
    assert failed == [], f"round {round_}: {failed}"
    return [answer.value for answer in answers]


def test_a_limit_of_3_holds_under_8_claiming_processes_and_is_reached(pg_store, pg_url, auth):
    pg_store.set_queue_limit("capped", LIMIT)
    overlaps, readings, claims = [], [], 0
    with spawn(CLAIMERS, name="claimer", store=pg_url) as children:
        for round_ in range(ROUNDS):
            pg_store.receive_atomic(auth, [envelope(f"r{round_}-{n}", queue="capped")
                                           for n in range(TASKS_PER_ROUND)])
            spans = [span for held in values(release(children, "hold_limited", queue="capped",
                                                     window=WINDOW, hold=HOLD), round_)
                     for span in held]  # type: ignore[attr-defined]
            overlap, reading = most_at_once(spans), max(int(span[2]) for span in spans)
            assert overlap <= LIMIT, f"round {round_}: {overlap} held at once"
            assert reading <= LIMIT, f"round {round_}: the database showed {reading} running"
            overlaps.append(overlap)
            readings.append(reading)
            claims += len(spans)
    reached = sum(overlap == LIMIT for overlap in overlaps)
    print(f"\n{ROUNDS} rounds, {claims} claims by {CLAIMERS} processes: at most "
          f"{max(overlaps)} held at once (the limit reached in {reached} rounds), at most "
          f"{max(readings)} running in the database")
    assert max(overlaps) == LIMIT and max(readings) == LIMIT
    assert pg_store.status().queues["capped"].processing == 0
    assert audit_url(pg_url) == []


def test_claims_of_other_queues_go_on_while_a_claim_holds_every_slot_of_the_limited_one(
        pg_store, pg_url, auth):
    pg_store.set_queue_limit("capped", LIMIT)
    pg_store.receive_atomic(auth, [envelope(f"{queue}-{n}", queue=queue)
                                   for queue in ("capped", "free") for n in range(CLAIMERS)])
    with spawn(CLAIMERS, name="claimer", store=pg_url) as children, \
            psycopg.connect(pg_url) as slow_claim:
        # A claim of the limited queue in flight, holding every one of its slots: were the
        # slots one row every claim goes through, the claims below would wait for it.
        locked = slow_claim.execute("SELECT slot FROM queue_slots WHERE queue = 'capped' "
                                    "FOR UPDATE").fetchall()
        assert len(locked) == LIMIT
        free = values(release(children, "claim", queues=["free"]), 0)
        assert all(claim is not None for claim in free)
        assert values(release(children, "claim", queues=["capped", "free"]), 1) == [None] * 8
        assert values(release(children, "claim", queues=["capped"]), 2) == [None] * 8
        slow_claim.rollback()
        capped = values(release(children, "claim", queues=["capped"]), 3)
    assert sum(claim is not None for claim in capped) == LIMIT
    assert {pg_store.task(c["task_id"]).state for c in capped if c} == {  # type: ignore[index]
        TaskState.RUNNING}
