"""Eight real processes race for one wait, released together; exactly one wins every round.

Each group runs ``POSTROOM_CONTENTION_ROUNDS`` rounds (default 40) on a new database per round,
checks the winner and the durable outcome, audits, and prints its tally (``pytest -s``).
Which process wins is up to the scheduler and never asserted; that exactly one does is.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import postroom
from postroom import ContinuationKind, WaitState
from postroom.audit import audit_database
from tests.harness.children import Answer, Child, release, release_each, spawn
from tests.support import SETTINGS, START, database_of, envelope

ROUNDS = int(os.environ.get("POSTROOM_CONTENTION_ROUNDS", "40"))
PROCESSES = 8
FLOW, STEP = "race", "answer"
DEADLINE = START + 10
ADDRESS = {"flow": FLOW, "step": STEP, "generation": 1}


@pytest.fixture(scope="module")
def children() -> Iterator[list[Child]]:
    with spawn(PROCESSES, name="racer") as started:
        yield started


def prepare(make_url, name: str) -> tuple[str, postroom.Store]:
    url = make_url(name)
    return url, postroom.open_store(url, clock=postroom.ManualClock(START), settings=SETTINGS)


def values(answers: list[Answer], round_: int) -> list[Any]:
    """Every child's answer; a child that raised fails the round."""
    failed = [(a.error, a.message) for a in answers if a.error is not None]
    assert failed == [], f"round {round_}: {failed}"
    return [a.value for a in answers]


def go(children: list[Child], url: str, round_: int, orders: list[tuple[str, dict[str, Any]]],
       now: float = START) -> list[Any]:
    """Every child opens the round's database (its own connection), then all race at once."""
    values(release(children, "open", store=url), round_)
    return values(release_each([(child, step, args) for child, (step, args)
                                in zip(children, orders, strict=True)], now=now), round_)


def same(operation: str, /, **args: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(operation, dict(args)) for _ in range(PROCESSES)]


def signals(count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` different answers, one per principal."""
    return [("signal", {"principal": f"agent-{i}", "event_id": f"e-{i}", "value": i, **ADDRESS})
            for i in range(count)]


def report(group: str, tally: Counter[str]) -> None:
    print(f"\n{group}: {ROUNDS} rounds x {PROCESSES} processes: {dict(sorted(tally.items()))}")


def test_eight_registrations_of_the_same_generation_open_it_once(children, make_url):
    tally: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        url, store = prepare(make_url, f"register-{round_}")
        expected = round_ % 2  # odd rounds race for generation 2 after a consumed generation 1
        if expected:
            store.open_wait(FLOW, STEP, 0, DEADLINE)
            store.signal(postroom.AuthContext(principal="p"), "e", FLOW, STEP, 1, "yes")
            store.resume(FLOW, STEP, 1, None)
        answers = go(children, url, round_, same("open_wait", flow=FLOW, step=STEP,
                                                 expected_generation=expected,
                                                 deadline=DEADLINE))
        results = Counter(str(a["result"]) for a in answers)
        assert results == {"opened": 1, "stale": PROCESSES - 1}
        assert {a["generation"] for a in answers} == {expected + 1}
        assert store.wait(FLOW, STEP).state is WaitState.WAITING
        assert audit_database(database_of(store)) == []
        store.close()
        tally.update(results)
    report("registrations", tally)


def test_eight_different_signals_to_one_wait_are_accepted_once(children, make_url):
    tally: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        url, store = prepare(make_url, f"signals-{round_}")
        store.open_wait(FLOW, STEP, 0, DEADLINE)
        answers = go(children, url, round_, signals(PROCESSES))
        results = Counter(str(a["result"]) for a in answers)
        assert results == {"accepted": 1, "closed": PROCESSES - 1}
        [winner] = [a for a in answers if a["result"] == "accepted"]
        wait = store.wait(FLOW, STEP)
        assert (wait.state, wait.event_principal, wait.event_id) == (
            WaitState.SIGNALED, winner["principal"], winner["event_id"])
        [continuation] = store.continuations()
        assert continuation.value == int(str(winner["event_id"]).removeprefix("e-"))
        assert audit_database(database_of(store)) == []
        store.close()
        tally.update(results)
    report("signals", tally)


def test_a_signal_at_the_deadline_racing_the_sweeper_always_times_out_once(children, make_url):
    tally: Counter[str] = Counter()
    signalers = PROCESSES // 2
    for round_ in range(ROUNDS):
        url, store = prepare(make_url, f"deadline-{round_}")
        store.open_wait(FLOW, STEP, 0, DEADLINE)
        orders = signals(signalers) + same("expire_due")[signalers:]
        answers = go(children, url, round_, orders, now=DEADLINE)
        answered = Counter(str(a["result"]) for a in answers[:signalers])
        swept = sum(int(a) for a in answers[signalers:])  # type: ignore[call-overload]
        assert set(answered) <= {"too_late", "closed"}
        assert answered["too_late"] + swept == 1  # exactly one decided the timeout
        assert store.wait(FLOW, STEP).state is WaitState.TIMED_OUT
        assert [c.kind for c in store.continuations()] == [ContinuationKind.TIMEOUT]
        assert audit_database(database_of(store)) == []
        store.close()
        tally.update(answered)
        tally["timed out by the sweeper"] += swept
    report("signal at the deadline vs sweeper", tally)


def test_eight_resumes_of_one_continuation_apply_one_effect(children, make_url):
    tally: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        url, store = prepare(make_url, f"resume-{round_}")
        parent = store.receive(postroom.AuthContext(principal="planner"), envelope("ask"))
        store.open_wait(FLOW, STEP, 0, DEADLINE, task_id=parent.task_id)
        store.signal(postroom.AuthContext(principal="p"), "e", FLOW, STEP, 1, "yes")
        answers = go(children, url, round_, same("resume", effect={"message_id": "next",
                                                                   "payload": {}}, **ADDRESS))
        results = Counter(str(a["result"]) for a in answers)
        assert results == {"resumed": 1, "replay": PROCESSES - 1}
        follow_ups = {a["task_id"] for a in answers}
        assert len(follow_ups) == 1 and None not in follow_ups
        assert store.info()["tasks"] == {"pending": 2}  # the parent and one follow-up
        assert audit_database(database_of(store)) == []
        store.close()
        tally.update(results)
    report("resumes", tally)
