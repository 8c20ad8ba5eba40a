"""Chains (SPEC §7): every task records its chain's root, and a chain runs within budgets.

A chain is a root task and everything spawned from it (follow-ups, a wait's continuation,
and messages its root's sender links to it by ``parent_task_id``). Its row holds the budgets
(the store's settings, lowered by the root's ``Envelope.budget``) and what it has spent: the
tasks admitted to run and the cost units its handlers charged. A new task of the chain reads
the row locked, so concurrent spawns are counted one after another: work past a budget is
stored terminal (``hop_limit``, ``budget_exhausted`` naming the budget) with its reply, and
never runs.

Hops and parents are postroom's: a linked task's hops are its parent's + 1, whatever its
body says, and a message naming a parent is linked only when its sender is the parent's own
principal (postroom's own follow-ups and re-runs are linked by postroom itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from postroom import transitions
from postroom.db.database import Tx
from postroom.errors import NotFound, Unauthorized
from postroom.models import Chain, TaskState
from postroom.settings import Settings
from postroom.validation import FOLLOW_UP_NAMESPACES, CheckedEnvelope

__all__ = ["Placement", "admit", "cancel", "charge", "get", "place"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new task goes: its chain, the hop limit it meets and, if its chain's budget
    is spent, why (``None``: it may run). A root opens its chain with ``opens``."""

    root_task_id: str
    max_hops: int
    budget_spent: str | None = None
    opens: Chain | None = None
    cancelled: str | None = None  # why its chain was cancelled, if it was


def place(tx: Tx, settings: Settings, checked: CheckedEnvelope
          ) -> tuple[CheckedEnvelope, Placement]:
    """The task ``checked`` would make, its hops computed from its parent, and its place.

    A task with a parent locks its chain's row until the transaction ends. ``Unauthorized``
    naming ``parent_task_id`` (nothing written) when the parent is not a task of the
    message's own principal; whether it exists at all is not told.
    """
    if checked.parent_task_id is None:
        return checked, _root(settings, checked, tx.now)
    if checked.retry_of is not None:
        # An operator's re-run takes the place of the task it runs again (its chain and
        # hops), whose parent may long be pruned.
        parent = tx.one("task_parent", task_id=checked.retry_of)
        assert parent is not None  # the re-run task is locked by the re-run
        hops = int(parent["hops"])
    else:
        parent = tx.one("task_parent", task_id=checked.parent_task_id)
        made_by_postroom = checked.principal.startswith(FOLLOW_UP_NAMESPACES)
        if parent is None or not (made_by_postroom or parent["principal"] == checked.principal):
            raise Unauthorized(f"parent_task_id {checked.parent_task_id!r} names no task of "
                               f"principal {checked.principal!r}: a message joins only a "
                               f"chain that its own sender's task is in")
        hops = int(parent["hops"]) + 1
    root = str(parent["root_task_id"] or parent["task_id"])
    row = tx.one("chain_get_locked", root_task_id=root)
    if row is None:  # a chain older than its row (its root pruned before version 10)
        tx.change("chain_insert", root_task_id=root, principal=parent["principal"],
                  max_hops=settings.max_hops, max_tasks=settings.max_chain_tasks,
                  max_cost=settings.max_chain_cost, tasks=1, now=tx.now)
        row = tx.one("chain_get_locked", root_task_id=root)
        assert row is not None
    chain = Chain.from_row(row)
    spent = transitions.chain_budget_spent(tasks=chain.tasks, max_tasks=chain.max_tasks,
                                           cost=chain.cost, max_cost=chain.max_cost)
    placed = replace(checked, hops=hops)
    return placed, Placement(root_task_id=root, max_hops=chain.max_hops, budget_spent=spent,
                             cancelled=chain.cancel_reason if chain.cancelled_at else None)


def _root(settings: Settings, checked: CheckedEnvelope, now: float) -> Placement:
    asked = checked.budget or {}

    def lowered(name: str, default: int | None) -> int | None:
        wanted = asked.get(name)
        if wanted is None or default is None:
            return default if wanted is None else wanted
        return min(default, wanted)

    max_hops = lowered("hops", settings.max_hops)
    max_tasks = lowered("tasks", settings.max_chain_tasks)
    assert max_hops is not None and max_tasks is not None
    opens = Chain(root_task_id=checked.task_id, principal=checked.principal, max_hops=max_hops,
                  max_tasks=max_tasks, max_cost=lowered("cost", settings.max_chain_cost),
                  tasks=0, cost=0, created_at=now)
    return Placement(root_task_id=checked.task_id, max_hops=max_hops, opens=opens)


def admit(tx: Tx, placed: Sequence[tuple[Placement, TaskState]]) -> None:
    """Record new tasks in their chains: a root opens its chain, and each task born
    ``pending`` counts against its chain's task budget."""
    opened = [{"root_task_id": placement.opens.root_task_id,
               "principal": placement.opens.principal, "max_hops": placement.opens.max_hops,
               "max_tasks": placement.opens.max_tasks, "max_cost": placement.opens.max_cost,
               "tasks": int(state is TaskState.PENDING), "now": tx.now}
              for placement, state in placed if placement.opens is not None]
    if opened:
        tx.change_many("chain_insert", opened)
    for placement, state in placed:
        if placement.opens is None and state is TaskState.PENDING:
            tx.change("chain_admit", root_task_id=placement.root_task_id)


def charge(tx: Tx, task_id: str, units: int) -> None:
    """Charge ``units`` to the chain of ``task_id`` (a handler's cost, with its finish).

    A charge is what the work cost, so it is recorded even past the budget; the chain's new
    work is then refused.
    """
    if units:
        tx.change("chain_charge", task_id=task_id, units=units)


def cancel(tx: Tx, root_task_id: str, reason: str) -> list[str]:
    """Mark the chain of ``root_task_id`` cancelled (its row locked first, so no spawn
    slips in after the tasks are read: the chain's new work is born cancelled) and return
    its live tasks, for the caller to cancel each as a single cancel would."""
    tx.change("chain_cancel", root_task_id=root_task_id, reason=reason, now=tx.now)
    return [str(row["task_id"]) for row in tx.all("chain_live_tasks",
                                                  root_task_id=root_task_id)]


def get(tx: Tx, root_task_id: str) -> Chain:
    """The chain whose root is ``root_task_id``; ``NotFound`` if there is none."""
    row = tx.one("chain_get", root_task_id=root_task_id)
    if row is None:
        raise NotFound(f"no chain with root {root_task_id}")
    return Chain.from_row(row)
