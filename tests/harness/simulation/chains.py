"""Chain budgets in the randomized audit (SPEC §7), registered into the tables on import:

- ``SNAPSHOT_TABLES``: the chains, their budgets and what each has spent;
- ``OPERATIONS``: ``receive_budgeted`` (a root lowering its chain's hop, task and cost
  budgets, so that they run out within a few spawns) and ``spawn`` (finishing a claim with
  follow-ups and a charge: each follow-up is born ``pending`` and counted, or terminal with
  its reply: ``hop_limit``, ``budget_exhausted`` naming the task or the cost budget, ...);
- ``CHECKS``: a chain's budgets never change and what it spent never goes back; it admits no
  task past its task budget, counts every task it admits, and no task at or past its
  hop limit, or spawned once its cost was spent, ever runs.

``admit`` is the model of a new task's birth in its chain; the waits' resumes use it too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from postroom.errors import Fenced
from postroom.models import Budget, Claim, FollowUp, TaskState
from postroom.settings import Settings
from postroom.transitions import reply_id_for
from postroom.validation import follow_up_principal, task_id_for
from tests.harness.simulation.checks import CHECKS, Transition
from tests.harness.simulation.operations import (
    OPERATIONS,
    Action,
    Operation,
    Step,
    is_current,
    pick_claim,
    receive_one,
)
from tests.harness.simulation.world import SNAPSHOT_TABLES, Row, Snapshot, Table, World

__all__ = ["CHAIN_CHECKS", "CHAIN_OPERATIONS", "CHAIN_TABLES", "admit", "chain_of", "state_of",
           "stored_or_default"]

CHAIN_TABLES = [Table("chains", "snapshot_chains", "root_task_id", "store")]

#: What the budget of an exhausted follow-up's error names, by the model's verdict.
_NAMES_BUDGET = {"tasks_spent": "task budget", "cost_spent": "cost budget"}


def _chains(snapshot: Snapshot) -> Mapping[str, Row]:
    return snapshot.tables["chains"]


def chain_of(snapshot: Snapshot, task_id: str, settings: Settings) -> Row | None:
    """The chain of a stored task: its row, or what a root without one stands for (the
    store's budgets, the root admitted, nothing charged: see ``postroom.chains``); ``None``
    if the task is not stored, or is a member of a chain with no row."""
    task = snapshot.tasks.get(task_id)
    if task is None:
        return None
    return stored_or_default(snapshot, task["root_task_id"] or task_id, settings)


def stored_or_default(snapshot: Snapshot, root: str, settings: Settings) -> Row | None:
    """The row of the chain of ``root``, or the chain a stored root without one stands for."""
    stored = _chains(snapshot).get(root)
    task = snapshot.tasks.get(root)
    if stored is not None or task is None or task["root_task_id"] != root:
        return stored
    return {"root_task_id": root, "principal": task["principal"],
            "max_hops": settings.max_hops, "max_tasks": settings.max_chain_tasks,
            "max_cost": settings.max_chain_cost, "tasks": 1, "cost": 0,
            "cancelled_at": None, "created_at": task["received_at"]}


def admit(chain: dict[str, Any], *, deadline: float, hops: int, now: float) -> str:
    """The verdict on a new task of ``chain`` (a mutable copy of its row), counting it in
    ``chain["tasks"]`` when it is admitted: ``pending``, or why it is born terminal
    (``tasks_spent`` and ``cost_spent`` are both ``budget_exhausted``)."""
    if chain["cancelled_at"] is not None:
        return TaskState.CANCELLED.value
    if deadline <= now:
        return TaskState.EXPIRED.value
    if hops >= chain["max_hops"]:
        return TaskState.HOP_LIMIT.value
    if chain["tasks"] >= chain["max_tasks"]:
        return "tasks_spent"
    if chain["max_cost"] is not None and chain["cost"] >= chain["max_cost"]:
        return "cost_spent"
    chain["tasks"] += 1
    return TaskState.PENDING.value


def state_of(verdict: str) -> str:
    """The task state an ``admit`` verdict is stored as."""
    return TaskState.BUDGET_EXHAUSTED.value if verdict in _NAMES_BUDGET else verdict


def _budgeted(world: World, chain: Row | None) -> bool:
    settings = world.settings
    return chain is not None and (chain["max_tasks"] < settings.max_chain_tasks
                                  or chain["max_cost"] is not None
                                  or chain["max_hops"] < settings.max_hops)


# -- operations -------------------------------------------------------------------------------


def plan_receive_budgeted(world: World) -> Action:
    """A new root that lowers its chain's budgets: a hop or two, a few tasks, a little cost."""
    rng = world.rng
    auth, envelope = world.new_envelope(hops=0)
    budget = Budget(hops=rng.choice((1, 2, None)), tasks=rng.randint(1, 4),
                    cost=rng.choice((None, 0, 1, 2, 4)))
    envelope = replace(envelope, budget=budget)
    task_id = task_id_for(auth.principal, envelope.message_id)

    def act(step: Step) -> str:
        outcome = receive_one(step, auth, envelope)
        held = _chains(step.before).get(task_id)
        row = _chains(step.after()).get(task_id)
        settings = step.world.settings
        wanted = (min(settings.max_hops, budget.hops or settings.max_hops),
                  min(settings.max_chain_tasks, budget.tasks or settings.max_chain_tasks),
                  budget.cost)
        if outcome == "stored" and held is None:
            found = None if row is None else (row["max_hops"], row["max_tasks"],
                                              row["max_cost"])
            step.expect(found == wanted, f"root {task_id} opened its chain with budgets "
                                         f"{found}, expected {wanted}")
        return outcome

    return act


def plan_spawn(world: World) -> Action | None:
    """Finish a claim (mostly a current one of a budgeted chain) with follow-ups and a charge
    of cost units, so its chain's budgets run out."""
    rng = world.rng
    now = max(world.clock.now(), world.last.high_water)
    budgeted = [claim for claim in world.claims if is_current(claim, world.last, now)
                and _budgeted(world, chain_of(world.last, claim.task_id, world.settings))]
    if budgeted and rng.random() < 0.8:
        claim: Claim | None = rng.choice(budgeted)
    else:
        claim = pick_claim(world, current=True if rng.random() < 0.85 else None)
    if claim is None:
        return None
    charge = rng.choice((0, 0, 1, 2, 3))
    children = [FollowUp(message_id=f"spawn-{index}",
                         payload={"parent": claim.message_id, "spawn": index})
                for index in range(rng.randint(1, 3))]

    def act(step: Step) -> str:
        before, now = step.before, step.now
        current = is_current(claim, before, now)
        try:
            step.world.store.finish(claim, {"spawned": len(children)}, follow_ups=children,
                                    charge=charge)
        except Fenced:
            step.expect(not current, f"spawn with a current claim of {claim.task_id} was fenced")
            step.expect(step.after().tasks == before.tasks
                        and _chains(step.after()) == _chains(before),
                        f"a fenced spawn from {claim.task_id} changed tasks or chains")
            return "fenced"
        step.expect(current, f"spawn with a stale claim committed on {claim.task_id}")
        return _check_spawn(step, claim.task_id, children, charge)

    return act


def _check_spawn(step: Step, task_id: str, children: list[FollowUp], charge: int) -> str:
    """The parent is done, its chain charged, and each follow-up born as its chain allows."""
    before, after, now = step.before, step.after(), step.now
    parent = before.tasks[task_id]
    root = parent["root_task_id"] or task_id
    held = stored_or_default(before, root, step.world.settings)
    step.expect(held is not None, f"the chain {root} of {task_id} is not stored")
    assert held is not None
    chain = {**held, "cost": held["cost"] + charge}
    verdicts = []
    for child in children:
        child_id = task_id_for(follow_up_principal(task_id), child.message_id)
        row = after.tasks.get(child_id)
        if child_id in before.tasks:  # the parent's identity ran before it was pruned
            step.expect(row == before.tasks[child_id], f"a duplicate follow-up {child_id} "
                                                       f"changed")
            continue
        verdict = admit(chain, deadline=parent["deadline"], hops=parent["hops"] + 1, now=now)
        verdicts.append(verdict)
        state = state_of(verdict)
        found = None if row is None else (row["state"], row["parent_task_id"], row["hops"],
                                          row["root_task_id"])
        step.expect(found == (state, task_id, parent["hops"] + 1, root),
                    f"follow-up {child.message_id} of {task_id} is {found}; expected {state} "
                    f"in chain {root} one hop below its parent")
        reply = after.replies.get(reply_id_for(child_id))
        if state == TaskState.PENDING:
            step.expect(reply is None, f"pending follow-up {child_id} has a reply")
        else:
            step.expect(reply is not None and reply["status"] == state,
                        f"follow-up {child_id} born {state} with reply {reply}")
        if verdict in _NAMES_BUDGET:
            error = step.world.store.task(child_id).last_error or ""
            step.expect(_NAMES_BUDGET[verdict] in error,
                        f"follow-up {child_id} exhausted the {_NAMES_BUDGET[verdict]}, its "
                        f"error says {error!r}")
        step.world.acked.add(child_id)
    spent = _chains(after).get(root)
    step.expect(spent is not None and (spent["tasks"], spent["cost"])
                == (chain["tasks"], chain["cost"]),
                f"chain {root} spent {spent and (spent['tasks'], spent['cost'])}, expected "
                f"{(chain['tasks'], chain['cost'])} (tasks, cost)")
    done = after.tasks[task_id]
    reply = after.replies.get(reply_id_for(task_id))
    step.expect(done["state"] == TaskState.DONE and reply is not None
                and reply["status"] == "done",
                f"spawning task {task_id} is {done['state']} with reply {reply}")
    return "+".join(sorted(set(verdicts))) or "duplicates"


# -- checks -----------------------------------------------------------------------------------

_FIXED = ("principal", "max_hops", "max_tasks", "max_cost", "created_at")


def chains_never_go_back(before: Snapshot, after: Snapshot, step: Transition
                         ) -> Iterator[str]:
    """A chain stays until its root is pruned (the last of its tasks), its budgets never
    change, and what it has spent (tasks admitted, cost charged) never goes back; a
    cancelled chain stays so."""
    for root, row in _chains(before).items():
        now = _chains(after).get(root)
        if now is None:
            pruned = step.forgets and root not in after.tasks and not any(
                task["root_task_id"] == root for task in after.tasks.values())
            if not pruned:
                yield f"chain {root} disappeared"
            continue
        if any(now[name] != row[name] for name in _FIXED):
            yield f"chain {root} changed its budgets from {row} to {now}"
        if now["tasks"] < row["tasks"] or now["cost"] < row["cost"]:
            yield f"chain {root} spent less than before: {now['tasks']} tasks, {now['cost']} cost"
        if row["cancelled_at"] is not None and now["cancelled_at"] != row["cancelled_at"]:
            yield f"cancelled chain {root} changed its cancellation"


def _admitted(row: Row) -> bool:
    return row["attempts"] > 0 or row["state"] in (TaskState.PENDING, TaskState.RUNNING)


def chains_stay_within_budgets(before: Snapshot, after: Snapshot, _: Transition
                               ) -> Iterator[str]:
    """No chain admits more than its task budget, and it counts every task it admits;
    no task at or past its chain's hop limit runs; nothing is spawned into a chain whose cost
    budget is spent."""
    chains = _chains(after)
    born: dict[str, int] = {}
    for task_id, row in after.tasks.items():
        root = row["root_task_id"] or task_id
        chain = chains.get(root)
        if chain is None:
            continue  # the kernel's audit names a task without its chain
        if _admitted(row) and row["hops"] >= chain["max_hops"]:
            yield f"task {task_id} at hop {row['hops']} ran or waits to run in chain {root} " \
                  f"of {chain['max_hops']} hops"
        if task_id in before.tasks or not _admitted(row):
            continue
        if task_id == root and root in _chains(before):
            continue  # a root received again after it was pruned: its chain was counted then
        born[root] = born.get(root, 0) + 1
        if (task_id != root and chain["max_cost"] is not None
                and chain["cost"] >= chain["max_cost"]):
            yield f"task {task_id} was admitted to chain {root} whose cost budget is spent " \
                  f"({chain['cost']} of {chain['max_cost']})"
    for root, chain in chains.items():
        if chain["tasks"] > chain["max_tasks"]:
            yield f"chain {root} admitted {chain['tasks']} of {chain['max_tasks']} tasks"
        was = _chains(before).get(root)
        grew = chain["tasks"] - (0 if was is None else was["tasks"])
        # (Between snapshots far apart, a round's, a task admitted may since be cancelled,
        # expired or pruned: only an admitted task left uncounted is sure to be wrong.)
        if grew < born.get(root, 0):
            yield f"chain {root} counted {grew} more tasks; {born.get(root, 0)} were admitted"


CHAIN_OPERATIONS = [
    Operation(name="receive_budgeted", weight=3, plan=plan_receive_budgeted),
    Operation(name="spawn", weight=5, plan=plan_spawn),
]
CHAIN_CHECKS = [chains_never_go_back, chains_stay_within_budgets]

SNAPSHOT_TABLES.extend(CHAIN_TABLES)
OPERATIONS.extend(CHAIN_OPERATIONS)
CHECKS.extend(CHAIN_CHECKS)
