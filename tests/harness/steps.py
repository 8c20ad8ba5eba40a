"""The store operations as steps a child runs (see ``tests.harness.children``).

Every child imports this module; each step answers what the store returned, as JSON data.
Steps act for ``planner`` (the child's ``auth``) unless they name a principal, and a claim a
step takes is the child's until the next one (``finish``, ``renew`` and ``fail`` use it).
"""

from __future__ import annotations

import time
from typing import Any

import postroom
from postroom.models import Retry
from tests.harness.children import Context, step
from tests.support import envelope

# -- tasks and replies -------------------------------------------------------------------------


@step("receive")
def _receive(ctx: Context, message_id: str, **fields: Any) -> postroom.Ack:
    return ctx.store.receive(ctx.auth, envelope(message_id, **fields))


@step("receive_each")
def _receive_each(ctx: Context, message_ids: list[str], **fields: Any) -> list[dict[str, Any]]:
    """Receive each message in a transaction of its own; each one's ACK or error."""
    answers: list[dict[str, Any]] = []
    for message_id in message_ids:
        try:
            ack = ctx.store.receive(ctx.auth, envelope(message_id, **fields))
            answers.append({"message_id": message_id, "duplicate": ack.duplicate})
        except postroom.PostroomError as exc:
            answers.append({"message_id": message_id, "error": f"{type(exc).__name__}: {exc}"})
    return answers


@step("receive_at")
def _receive_at(ctx: Context, message_id: str, stream: str, seq: int) -> postroom.Ack:
    return ctx.store.receive(ctx.auth, envelope(message_id),
                             position=postroom.Position(stream=stream, seq=seq))


@step("receive_atomic")
def _receive_atomic(ctx: Context, message_ids: list[str]) -> list[postroom.Ack]:
    return ctx.store.receive_atomic(ctx.auth, [envelope(m) for m in message_ids])


@step("claim")
def _claim(ctx: Context, owner: str | None = None,
           queues: list[str] | None = None) -> postroom.Claim | None:
    ctx.claim = ctx.store.claim(owner or ctx.name, queues=queues or ("default",))
    return ctx.claim


@step("hold_limited")
def _hold_limited(ctx: Context, queue: str, window: float, hold: float) -> list[list[float]]:
    """For ``window`` seconds, claim one task of ``queue`` at a time, hold it ``hold`` seconds
    and finish it. Each claim is ``[held_from, held_until, running]``: a span inside the
    task's time running (from after its claim committed to before its finish began, on the
    host's monotonic clock, which every process shares) and how many tasks of the queue the
    database showed running in the middle of it."""
    held: list[list[float]] = []
    ends = time.monotonic() + window
    while time.monotonic() < ends:
        claim = ctx.store.claim(ctx.name, queues=queue)
        if claim is None:
            time.sleep(0.002)
            continue
        held_from = time.monotonic()
        time.sleep(hold / 2)
        running = ctx.store.status().queues[queue].processing
        time.sleep(hold / 2)
        held.append([held_from, time.monotonic(), running])
        ctx.store.finish(claim, "held")
    return held


@step("renew")
def _renew(ctx: Context) -> postroom.Claim:
    ctx.claim = ctx.store.renew(ctx.held)
    return ctx.claim


@step("finish")
def _finish(ctx: Context, result: Any = None) -> None:
    ctx.store.finish(ctx.held, result)


@step("settle")
def _settle(ctx: Context, result: Any = None) -> list[str | None]:
    """Finish the held claim through the group commit; each outcome's error, if any."""
    settled = ctx.store.settle([postroom.Finished(claim=ctx.held, result=result)])
    return [None if s.error is None else type(s.error).__name__ for s in settled]


@step("renew_all")
def _renew_all(ctx: Context) -> list[str | None]:
    """Renew the held claim through the batch call, keeping the renewed claim."""
    (renewed,) = ctx.store.renew_all([ctx.held])
    if isinstance(renewed, postroom.Fenced):
        return ["Fenced"]
    ctx.claim = renewed
    return [None]


@step("fail")
def _fail(ctx: Context, reason: str, retryable: bool = True) -> postroom.TaskState:
    return ctx.store.fail(ctx.held, reason, retryable=retryable)


@step("release")
def _release(ctx: Context, delay: float = 0.0) -> None:
    ctx.store.release(ctx.held, delay=delay)


@step("cancel")
def _cancel(ctx: Context, task_id: str) -> bool:
    return ctx.store.cancel(task_id)


@step("retry")
def _retry(ctx: Context, task_id: str, request_id: str | None = None) -> str:
    """Run a cancelled (failed, expired) task again; the new task's id."""
    return ctx.store.retry(task_id, operator="op", reason="test",
                           request_id=request_id).new_task_id


@step("retry_many")
def _retry_many(ctx: Context, state: str, request_id: str | None = None) -> list[str]:
    """Run again every task in ``state``, newest first; the new tasks' ids."""
    reruns = ctx.store.retry_many(operator="op", reason="test", state=state,
                                  request_id=request_id)
    return [rerun.new_task_id for rerun in reruns if isinstance(rerun, Retry)]


# -- human approvals ------------------------------------------------------------------------

#: The approval the approval steps grant, revoke and use (alice's refund of customer 17).
HUMAN = postroom.AuthContext(principal="alice", role="human")
REFUND = postroom.SideEffect(action="refund", resource="customer:17",
                             data={"amount": 40, "currency": "EUR"})


@step("grant")
def _grant(ctx: Context, approval_id: str, expires_at: float, max_uses: int = 1
           ) -> postroom.Approval:
    return ctx.store.grant_approval(HUMAN, approval_id, action=REFUND.action,
                                    resource=REFUND.resource, data=REFUND.data,
                                    expires_at=expires_at, requested_by="planner",
                                    max_uses=max_uses)


@step("revoke")
def _revoke(ctx: Context, approval_id: str) -> bool:
    return ctx.store.revoke_approval(HUMAN, approval_id, reason="test")


@step("answer_approval")
def _answer_approval(ctx: Context, event_id: str, flow: str, step: str, generation: int, *,
                     approve: bool) -> postroom.SignalReceipt:
    return ctx.store.answer_approval(HUMAN, event_id, flow, step, generation, approve=approve)


@step("finish_refund")
def _finish_refund(ctx: Context) -> str | None:
    """Finish the held claim with the refund as its side effect; ``None`` if it committed,
    else the refusal's class (``NotApproved``: nothing written)."""
    try:
        ctx.store.finish(ctx.held, "refunded", side_effects=[REFUND])
    except postroom.NotApproved:
        return "NotApproved"
    return None


@step("pause")
def _pause(ctx: Context, queue: str) -> bool:
    return ctx.store.pause_queue(queue, operator="op", reason="test")


@step("resume_queue")
def _resume_queue(ctx: Context, queue: str) -> bool:
    return ctx.store.resume_queue(queue)


@step("limit")
def _limit(ctx: Context, queue: str, running: int | None) -> None:
    ctx.store.set_queue_limit(queue, running)


@step("sweep")
def _sweep(ctx: Context) -> postroom.Swept:
    return ctx.store.sweep()


@step("dispatch")
def _dispatch(ctx: Context, owner: str | None = None, limit: int = 1) -> postroom.DispatchReport:
    """Deliver due replies to this child's own connection to the receiver."""
    transport = postroom.InProcessTransport(ctx.receiver)
    return ctx.store.dispatch(transport, owner=owner or ctx.name, limit=limit)


@step("dispatch_all")
def _dispatch_all(ctx: Context, limit: int = 1) -> int:
    """Dispatch until nothing is due; how many replies this process sent."""
    sent = 0
    while (report := _dispatch(ctx, limit=limit)).claimed:
        sent += report.sent
    return sent


@step("requeue")
def _requeue(ctx: Context, reply_id: str, operator: str, reason: str) -> None:
    ctx.store.requeue_reply(reply_id, operator=operator, reason=reason)


@step("prune")
def _prune(ctx: Context) -> int:
    return ctx.store.prune()


@step("publish_retention")
def _publish_retention(ctx: Context, seconds: float) -> float | None:
    return ctx.store.publish_retention(seconds)


# -- endpoints -----------------------------------------------------------------------------------


@step("add_endpoint")
def _add_endpoint(ctx: Context, principal: str, url: str, **options: Any) -> str:
    """Register an endpoint; its secret (as the CLI shows it once)."""
    return ctx.store.add_endpoint(principal, url, **options).secrets[0].secret


@step("rotate_endpoint")
def _rotate_endpoint(ctx: Context, principal: str) -> int:
    """Add a secret to an endpoint; how many it has now."""
    return len(ctx.store.rotate_endpoint_secret(principal).secrets)


@step("remove_endpoint")
def _remove_endpoint(ctx: Context, principal: str) -> bool:
    return ctx.store.remove_endpoint(principal)


@step("claim_and_release")
def _claim_and_release(ctx: Context, owner: str | None = None) -> list[str]:
    """Claim due replies for their endpoints and hand them back unsent, as a stopping
    dispatcher does; the ids it could not hand back."""
    claims = ctx.store.claim_replies(owner or ctx.name, limit=10, routed=True)
    return ctx.store.release_replies(claims)


# -- waits ---------------------------------------------------------------------------------------


@step("open_wait")
def _open_wait(ctx: Context, **args: Any) -> postroom.WaitOpening:
    return ctx.store.open_wait(**args)


@step("signal")
def _signal(ctx: Context, principal: str, **args: Any) -> postroom.SignalReceipt:
    return ctx.store.signal(postroom.AuthContext(principal=principal), **args)


@step("expire")
def _expire(ctx: Context, **args: Any) -> postroom.ExpireResult:
    return ctx.store.expire(**args)


@step("expire_due")
def _expire_due(ctx: Context) -> int:
    return ctx.store.expire_due()


@step("resume")
def _resume(ctx: Context, effect: dict[str, Any] | None, **args: Any) -> postroom.Resumption:
    follow_up = None if effect is None else postroom.FollowUp(**effect)
    return ctx.store.resume(**args, effect=follow_up)


@step("open_waits_on")
def _open_waits_on(ctx: Context, task_ids: list[str], flow: str,
                   deadline: float) -> list[dict[str, Any]]:
    """Open one wait per task (step ``answer`` of ``<flow>/<n>``), each in its own transaction,
    each with that task as its parent; each one's result, or ``NotFound``."""
    answers: list[dict[str, Any]] = []
    for n, task_id in enumerate(task_ids):
        try:
            opening = ctx.store.open_wait(f"{flow}/{n}", "answer", 0, deadline, task_id=task_id)
            answers.append({"task_id": task_id, "result": opening.result.value})
        except postroom.NotFound:
            answers.append({"task_id": task_id, "result": "not_found"})
    return answers


# -- periodic schedules ------------------------------------------------------------------------


@step("schedule_add")
def _schedule_add(ctx: Context, schedule: str, cron: str = "0 * * * *",
                  **fields: Any) -> postroom.Periodic:
    return ctx.store.add_schedule(schedule, cron, operator="op", **fields)


@step("schedule_pause")
def _schedule_pause(ctx: Context, schedule: str) -> bool:
    return ctx.store.pause_schedule(schedule, operator="op")


@step("schedule_resume")
def _schedule_resume(ctx: Context, schedule: str) -> bool:
    return ctx.store.resume_schedule(schedule, operator="op")


@step("schedule_remove")
def _schedule_remove(ctx: Context, schedule: str) -> bool:
    return ctx.store.remove_schedule(schedule)


@step("schedule_round")
def _schedule_round(ctx: Context, limit: int = 100) -> list[postroom.Ack]:
    """One round of the due schedules; the ACK of each period's task."""
    return ctx.store.enqueue_due_schedules(limit=limit)

# -- principals of the HTTP service ---------------------------------------------------------------


@step("add_principal")
def _add_principal(ctx: Context, principal: str, role: str,
                   queues: list[str] | None = None) -> str:
    """Add a principal; its token (as the CLI shows it once)."""
    return ctx.store.add_principal(principal, role, queues=queues or ()).token


@step("rotate_token")
def _rotate_token(ctx: Context, principal: str) -> str:
    """A new token for a principal (the old one stops at once)."""
    return ctx.store.rotate_token(principal).token
