"""SPEC §7, §9: concurrent spawns into one chain, from separate processes released together,
never admit more tasks than the chain's budget (each spawn locks the chain's row)."""

from __future__ import annotations

from collections import Counter

from postroom import Budget, FollowUp, OpenWait, TaskState
from postroom.audit import audit_url
from postroom.validation import task_id_for
from tests.harness.children import release, release_each, spawn
from tests.support import START, envelope

ROUNDS = 40
SPAWNERS = 8
BUDGET = 4  # the root and three more


def test_eight_processes_spawning_into_one_chain_never_exceed_its_task_budget(store, db_url,
                                                                              auth):
    admitted: Counter[int] = Counter()
    with spawn(SPAWNERS, name="spawner", store=db_url) as spawners:
        for round_ in range(ROUNDS):
            root = store.receive(auth, envelope(f"root-{round_}",
                                                budget=Budget(tasks=BUDGET))).task_id
            answers = release_each([
                (child, "receive", {"message_id": f"spawn-{round_}-{index}",
                                    "parent_task_id": root})
                for index, child in enumerate(spawners)])
            assert [a.error for a in answers] == [None] * SPAWNERS, f"round {round_}"
            states = Counter(store.task(task_id_for("planner", f"spawn-{round_}-{index}")).state
                             for index in range(SPAWNERS))
            assert states == {TaskState.PENDING: BUDGET - 1,
                              TaskState.BUDGET_EXHAUSTED: SPAWNERS - BUDGET + 1}, (
                f"round {round_}: {states}")
            assert store.chain(root).tasks == BUDGET, f"round {round_}"
            admitted[states[TaskState.PENDING]] += 1
    print(f"\nchain contention: {ROUNDS} rounds x {SPAWNERS} processes, budget {BUDGET} tasks: "
          f"admitted per round {dict(admitted)}, never more")
    assert admitted == {BUDGET - 1: ROUNDS}
    assert audit_url(db_url) == []


FAN_ROUNDS = 20


def test_children_ending_at_once_answer_their_fan_in_exactly_once(store, db_url, auth):
    with spawn(SPAWNERS, name="worker", store=db_url) as workers:
        for round_ in range(FAN_ROUNDS):
            store.receive(auth, envelope(f"parent-{round_}"))
            parent = store.claim("w")
            assert parent is not None
            store.finish(parent, "fanned out", follow_ups=[
                FollowUp(message_id=f"child-{index}", payload={"n": index})
                for index in range(SPAWNERS)],
                waits=[OpenWait(flow=f"gather-{round_}", step="all", deadline=START + 3600,
                                children=True)])
            claims = release(workers, "claim")
            assert all(answer.value is not None for answer in claims), f"round {round_}"
            ended = release(workers, "finish", result="ok")
            assert [answer.error for answer in ended] == [None] * SPAWNERS, f"round {round_}"
            [continuation] = store.continuations()
            assert continuation.flow == f"gather-{round_}", f"round {round_}"
            assert [child["status"] for child in continuation.value["children"]] == (
                ["done"] * SPAWNERS), f"round {round_}"
            store.resume(continuation.flow, "all", 1, None)
    print(f"\nfan-in: {FAN_ROUNDS} rounds, {SPAWNERS} children ending at once: exactly one "
          f"continuation each round")
    assert audit_url(db_url) == []
