"""Chains (SPEC §7): every task records its chain's root, and a chain runs within budgets.

A chain is a root task and everything spawned from it (follow-ups, a wait's continuation,
and messages its root's sender links to it by ``parent_task_id``). Its row holds the budgets
(the store's settings, lowered by the root's ``Envelope.budget``) and what it has spent: the
tasks admitted to run and the cost units its handlers charged. A new task of the chain reads
the row locked, so concurrent spawns are counted one after another: work past a budget is
stored terminal (``hop_limit``, ``budget_exhausted`` naming the budget) with its reply, and
never runs.

Most roots never spawn, so a root born to run that names no budget gets no row when it is
received (it would cost every receive a b-tree of its own): its chain is then the store's
budgets with one task admitted and nothing charged, and the first transaction that needs
the row -- a spawn, a charge, a cancel -- writes exactly that, locked, with the budgets of
the store that writes it. A root whose envelope names a budget (even one equal to the
store's: it must hold if the store's settings change), or that is born terminal (none
admitted), gets its row at once.

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

__all__ = ["Placement", "admit", "cancel", "charge", "find", "get", "place"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new task goes: its chain, the hop limit it meets and, if its chain's budget
    is spent, why (``None``: it may run). A root opens its chain with ``opens``."""

    root_task_id: str
    max_hops: int
    budget_spent: str | None = None
    opens: Chain | None = None
    cancelled: str | None = None  # why its chain was cancelled, if it was
    asked: bool = False  # a root whose envelope named budgets: its row keeps them


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
    chain = _locked(tx, settings, root, principal=parent["principal"])
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
    return Placement(root_task_id=checked.task_id, max_hops=max_hops, opens=opens,
                     asked=checked.budget is not None)


def admit(tx: Tx, settings: Settings, placed: Sequence[tuple[Placement, TaskState]]) -> None:
    """Record new tasks in their chains: a root opens its chain (its row written only if it
    differs from the store's budgets with the root admitted, see the module docstring), and
    each other task born ``pending`` counts against its chain's task budget."""
    opened = [{"root_task_id": placement.opens.root_task_id,
               "principal": placement.opens.principal, "max_hops": placement.opens.max_hops,
               "max_tasks": placement.opens.max_tasks, "max_cost": placement.opens.max_cost,
               "tasks": int(state is TaskState.PENDING), "now": tx.now}
              for placement, state in placed
              if placement.opens is not None
              and (placement.asked
                   or not _as_stored_by_default(settings, placement.opens, state))]
    if opened:
        tx.change_many("chain_insert", opened)
    for placement, state in placed:
        if placement.opens is None and state is TaskState.PENDING:
            tx.change("chain_admit", root_task_id=placement.root_task_id)


def _as_stored_by_default(settings: Settings, opens: Chain, state: TaskState) -> bool:
    """Whether a new root's chain is what a missing row stands for: the store's budgets,
    the root admitted to run, nothing charged."""
    return (state is TaskState.PENDING and opens.max_hops == settings.max_hops
            and opens.max_tasks == settings.max_chain_tasks
            and opens.max_cost == settings.max_chain_cost)


def _by_default(settings: Settings, root_task_id: str, principal: str,
                created_at: float) -> Chain:
    """The chain of a root that has no row yet (see the module docstring)."""
    return Chain(root_task_id=root_task_id, principal=principal, max_hops=settings.max_hops,
                 max_tasks=settings.max_chain_tasks, max_cost=settings.max_chain_cost,
                 tasks=1, cost=0, created_at=created_at)


def _locked(tx: Tx, settings: Settings, root_task_id: str, *, principal: str) -> Chain:
    """The chain of ``root_task_id``, its row locked until the transaction ends: written
    first if the chain has none (``principal`` names the chain's sender when its root is
    no longer there to tell, as for a chain whose root was pruned before version 10)."""
    row = tx.one("chain_get_locked", root_task_id=root_task_id)
    if row is None:
        root = tx.one("task_chain_of", task_id=root_task_id)
        opened = _by_default(settings, root_task_id,
                             principal if root is None else str(root["principal"]),
                             tx.now if root is None else float(root["created_at"]))
        tx.change("chain_insert", root_task_id=root_task_id, principal=opened.principal,
                  max_hops=opened.max_hops, max_tasks=opened.max_tasks,
                  max_cost=opened.max_cost, tasks=opened.tasks, now=opened.created_at)
        row = tx.one("chain_get_locked", root_task_id=root_task_id)
        assert row is not None
    return Chain.from_row(row)


def _root_of(tx: Tx, task_id: str) -> tuple[str, str]:
    """The root of ``task_id``'s chain, and the principal of the task."""
    row = tx.one("task_chain_of", task_id=task_id)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return str(row["root_task_id"] or row["task_id"]), str(row["principal"])


def charge(tx: Tx, settings: Settings, task_id: str, units: int) -> None:
    """Charge ``units`` to the chain of ``task_id`` (a handler's cost, with its finish).

    A charge is what the work cost, so it is recorded even past the budget; the chain's new
    work is then refused.
    """
    if units:
        root, principal = _root_of(tx, task_id)
        _locked(tx, settings, root, principal=principal)
        tx.change("chain_charge", root_task_id=root, units=units)


def cancel(tx: Tx, settings: Settings, root_task_id: str, reason: str) -> list[str]:
    """Mark the chain of ``root_task_id`` cancelled (its row locked first, so no spawn
    slips in after the tasks are read: the chain's new work is born cancelled) and return
    its live tasks, for the caller to cancel each as a single cancel would."""
    _, principal = _root_of(tx, root_task_id)
    _locked(tx, settings, root_task_id, principal=principal)
    tx.change("chain_cancel", root_task_id=root_task_id, reason=reason, now=tx.now)
    return [str(row["task_id"]) for row in tx.all("chain_live_tasks",
                                                  root_task_id=root_task_id)]


def find(tx: Tx, settings: Settings, root_task_id: str) -> Chain | None:
    """The chain whose root is ``root_task_id`` (as its row has it, or as a root without
    one stands for), or ``None`` if there is neither."""
    row = tx.one("chain_get", root_task_id=root_task_id)
    if row is not None:
        return Chain.from_row(row)
    root = tx.one("task_chain_of", task_id=root_task_id)
    if root is None or root["root_task_id"] is not None:
        return None
    return _by_default(settings, root_task_id, str(root["principal"]),
                       float(root["created_at"]))


def get(tx: Tx, settings: Settings, root_task_id: str) -> Chain:
    """The chain whose root is ``root_task_id``; ``NotFound`` if there is none."""
    chain = find(tx, settings, root_task_id)
    if chain is None:
        raise NotFound(f"no chain with root {root_task_id}")
    return chain


def cancel_answer(task_id: str, acted: bool, state: TaskState) -> dict[str, object]:
    """What a cancel of ``task_id`` did (``acted``: ``Store.cancel``'s answer; ``state``: the
    task's state after it), as the CLI and the API answer it: ``cancelled``, whether the task
    itself was; an ended chain root whose live tasks it cancelled answers its ``state`` and
    ``chain_cancelled: true``."""
    cancelled = acted and state is TaskState.CANCELLED
    answer: dict[str, object] = {"task_id": task_id, "cancelled": cancelled}
    if acted and not cancelled:
        answer.update(state=state.value, chain_cancelled=True)
    return answer
