"""The wait operations as steps a child process runs (see ``tests.processes``).

A child imports this module (``Child(..., modules=["tests.wait_steps"])``) to be able to run
them; each answers what the store returned.
"""

from __future__ import annotations

from typing import Any

import postroom
from tests.processes import Context, step


def _store(ctx: Context) -> postroom.Store:
    if ctx.store is None:
        raise LookupError(f"{ctx.name} has no store open")
    return ctx.store


@step("open_wait")
def _open_wait(ctx: Context, **args: Any) -> postroom.WaitOpening:
    return _store(ctx).open_wait(**args)


@step("signal")
def _signal(ctx: Context, principal: str, **args: Any) -> postroom.SignalReceipt:
    return _store(ctx).signal(postroom.AuthContext(principal=principal), **args)


@step("expire")
def _expire(ctx: Context, **args: Any) -> postroom.ExpireResult:
    return _store(ctx).expire(**args)


@step("expire_due")
def _expire_due(ctx: Context) -> int:
    return _store(ctx).expire_due()


@step("resume")
def _resume(ctx: Context, effect: dict[str, Any] | None, **args: Any) -> postroom.Resumption:
    follow_up = None if effect is None else postroom.FollowUp(**effect)
    return _store(ctx).resume(**args, effect=follow_up)


@step("open_waits_on")
def _open_waits_on(ctx: Context, task_ids: list[str], flow: str,
                   deadline: float) -> list[dict[str, Any]]:
    """Open one wait per task (step ``answer`` of ``<flow>/<n>``), each in its own transaction,
    each with that task as its parent; each one's result, or ``NotFound``."""
    answers: list[dict[str, Any]] = []
    for n, task_id in enumerate(task_ids):
        try:
            opening = _store(ctx).open_wait(f"{flow}/{n}", "answer", 0, deadline,
                                            task_id=task_id)
            answers.append({"task_id": task_id, "result": opening.result.value})
        except postroom.NotFound:
            answers.append({"task_id": task_id, "result": "not_found"})
    return answers
