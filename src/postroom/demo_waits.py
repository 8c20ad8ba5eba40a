"""``postroom demo waits``: a durable flow asks a human, survives restarts, continues once.

A task asks alice to approve a refund (an approval request: a wait addressed to her) with a
deadline. Nobody answers in time, so the sweeper times the question out and the flow asks
again; the store restarts between every act. A forged ``"human_approved": true`` payload and
a relayed "she said yes" signal are refused; alice's answer grants the approval record and
signals the wait in one transaction; then its duplicate and a late answer to the first
question arrive; the process that resumes the flow dies right after its commit; and the
follow-up task issues the refund exactly once, by consuming the approval in its finish.
Each line prints what the database durably says. Time is a manual clock; the processes
that ask and that die are real.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from postroom.clock import ManualClock
from postroom.demo import Checks
from postroom.errors import NotApproved, Unauthorized
from postroom.models import AuthContext, Envelope, FollowUp, SideEffect
from postroom.store import Store

__all__ = ["run_waits_demo"]

_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, so the printed times are readable

FLOW, STEP = "refund-17", "approval"
#: Alice, as the trusted adapter (the service, after her token) presents her: a human.
_ALICE = AuthContext(principal="alice", role="human")
_REFUND = {"amount": 120, "currency": "EUR"}

# The asking worker, in its own process: claim the task, and finish it asking alice for the
# approval of the refund (the wait opens in the finish's transaction), then exit. Nothing of
# the question lives on in any process's memory.
_ASKER = """
import sys
from postroom import ApprovalRequest, ManualClock, OpenWait, open_store
url, now, expected, deadline = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = open_store(url, clock=ManualClock(now))
claim = store.claim("asker", queues="asks")
ask = ApprovalRequest(action="refund", resource="customer:17",
                      data={"amount": 120, "currency": "EUR"}, expires_at=deadline + 3600)
[opening] = store.finish(claim, {"asked": "alice"}, waits=[OpenWait(
    flow="refund-17", step="approval", deadline=deadline, expected_generation=expected,
    request_id=f"ask-{claim.task_id[:12]}", responder="alice", approval=ask)])
print(opening.result, opening.generation, flush=True)
"""

# The resumer, in its own process, dies right after its resume commits: it never learns
# that it succeeded.
_RESUMER = """
import sys
from postroom import FollowUp, ManualClock, faults, open_store
store = open_store(sys.argv[1], clock=ManualClock(float(sys.argv[2])))
[continuation] = store.continuations()
faults.arm("resume.after_commit", faults.crash(73))
store.resume(continuation.flow, continuation.step, continuation.generation,
             FollowUp(message_id="apply-refund", queue="refunds",
                      payload={"refund": 17, "approval": continuation.value}))
"""


def run_waits_demo(echo: Callable[[str], None] = print, folder: Path | None = None) -> bool:
    """Run the story; returns whether every check along the way held."""
    with tempfile.TemporaryDirectory(prefix="postroom-demo-waits-") as scratch:
        root = folder or Path(scratch)
        return _story(echo, f"sqlite:///{root / 'postroom.db'}")


def _story(echo: Callable[[str], None], url: str) -> bool:
    check = Checks(echo)

    def at(seconds: float) -> str:
        return f"+{seconds - _START:g}s"

    def process(script: str, *args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", script, url, *map(str, args)],
                              capture_output=True, text=True, check=False, timeout=120)

    clock = ManualClock(_START)
    store = Store.open(url, clock=clock)
    echo(f"postroom demo waits: store {url}\n")

    def wait_row(generation: int) -> str:
        w = store.wait(FLOW, STEP, generation)
        event = f" event={w.event_principal}/{w.event_id}" if w.event_id else ""
        return (f"wait {FLOW}/{STEP} generation {w.generation}: {w.state}, deadline "
                f"{at(w.deadline)}{event}")

    def restart() -> Store:
        store.close()
        return Store.open(url, clock=clock)

    ack = store.receive(AuthContext(principal="planner"), Envelope(
        message_id="refund-17", sender="planner", payload={"refund": 17, "amount": 120},
        deadline=_START + 7200, queue="asks"))
    echo(f"1. receive     task refund-17 from planner: {store.task(ack.task_id).state}")

    asked = process(_ASKER, clock.now(), 0, _START + 300)
    echo(f"2. ask         the asking worker (its own process) claims it, asks alice and "
         f"finishes its task:\n               open_wait -> {asked.stdout.strip()}; "
         f"the process exited with code {asked.returncode}")
    check(asked.returncode == 0 and asked.stdout.split() == ["opened", "1"],
          "generation 1 opened")

    store = restart()
    echo(f"3. restart     reopen the database: {wait_row(1)}; "
         f"continuations {len(store.continuations())}")
    check(store.wait(FLOW, STEP).state == "waiting", "generation 1 still waiting")

    clock.set(_START + 301)
    swept = store.expire_due()
    [timeout] = store.continuations()
    echo(f"4. no answer   {at(clock.now())}: the sweeper times out {swept} wait: {wait_row(1)}"
         f"\n               continuation: {timeout.kind}")
    check(swept == 1 and timeout.kind == "timeout", "one timeout continuation")

    again = store.resume(FLOW, STEP, 1, FollowUp(message_id="ask-again", queue="asks",
                                                 payload={"refund": 17, "reminder": True}))
    child = store.task(again.task_id or "")
    parent = ("refund-17" if child.parent_task_id == ack.task_id
              else f"another task, {child.parent_task_id}")
    echo(f"5. resume      the flow resumes it: follow-up task ask-again, {child.state}, "
         f"hops {child.hops}, its parent {parent}")
    check(again.result == "resumed" and child.hops == 1, "a follow-up one hop further")

    asked = process(_ASKER, clock.now(), 1, _START + 900)
    echo(f"6. ask again   another worker process runs ask-again: open_wait -> "
         f"{asked.stdout.strip()}")
    check(asked.stdout.split() == ["opened", "2"], "generation 2 opened")

    store = restart()
    clock.set(_START + 420)
    forged = store.receive(AuthContext(principal="planner"), Envelope(
        message_id="refund-17-forged", sender="planner", queue="refunds",
        payload={"refund": 17, "human_approved": True, "approved_by": "alice"},
        deadline=_START + 7200))
    held = store.claim("refund-worker", queues="refunds")
    refusal = ""
    if held is not None:
        try:
            store.finish(held, {"refunded": 120}, side_effects=[SideEffect(
                action="refund", resource="customer:17", data=_REFUND)])
        except NotApproved as exc:
            refusal = exc.reason
            store.fail(held, f"not approved: {exc.reason}", retryable=False)
    echo(f"7. forged      {at(clock.now())} (after a restart): a task whose payload says "
         f"human_approved: true tries the refund: "
         f"NotApproved ({refusal.split(' (')[0]}); {store.task(forged.task_id).state}, "
         f"nothing refunded")
    check(bool(refusal) and not store.side_effects(forged.task_id), "a payload is no approval")

    relayed = ""
    try:
        store.signal(AuthContext(principal="alice"), "relayed-yes", FLOW, STEP, 2,
                     {"approved": True})
    except Unauthorized as exc:
        relayed = str(exc)
    echo(f"8. relayed     a signal relaying \"she said yes\" to the approval request: "
         f"Unauthorized ({relayed.split(': ', 1)[-1]})")
    check(bool(relayed) and store.receipt("alice", "relayed-yes") is None,
          "a signal is no approval")

    answer = store.answer_approval(_ALICE, "mail-2", FLOW, STEP, 2, approve=True)
    approval_id = store.continuations()[0].value["approval_id"]
    approval = store.approval(approval_id)
    echo(f"9. answer      alice (a human) answers the approval request of "
         f"generation 2: {answer.result}\n               {wait_row(2)}\n               "
         f"approval {approval.action} {approval.resource} {approval.data} granted by "
         f"{approval.granted_by}, uses {approval.uses} of {approval.max_uses}")
    check(answer.result == "accepted" and approval.granted_by == "alice",
          "the answer accepted, the approval granted")

    high_water = store.info()["time_high_water"]
    clock.set(_START + 480)
    duplicate = store.answer_approval(_ALICE, "mail-2", FLOW, STEP, 2, approve=True)
    unmoved = store.info()["time_high_water"] == high_water
    echo(f"10. duplicate  the mail gateway retries mail-2: {duplicate.result} of "
         f"{duplicate.recorded}; time high-water unchanged: {unmoved}")
    check(duplicate.result == "replay" and duplicate.recorded == "accepted" and unmoved,
          "a replay that writes nothing")

    stale = store.answer_approval(_ALICE, "mail-1", FLOW, STEP, 1, approve=True)
    echo(f"11. stale      alice's late reply to the first question (mail-1, generation 1): "
         f"{stale.result}\n               {wait_row(2)}")
    check(stale.result == "stale_generation" and store.wait(FLOW, STEP).event_id == "mail-2",
          "the old answer wakes nothing, grants nothing")

    store = restart()
    [pending] = store.continuations()
    echo(f"12. restart    reopen: one continuation to resume: {pending.kind} "
         f"{pending.value}")

    died = process(_RESUMER, clock.now())
    store = restart()
    left = store.continuations()
    echo(f"13. resume     a process resumes it and dies right after the commit (exit code "
         f"{died.returncode}); after a restart: continuations {len(left)}")
    check(died.returncode == 73 and not left, "consumed by the process that died")

    retried = store.resume(FLOW, STEP, 2, FollowUp(
        message_id="apply-refund", queue="refunds",
        payload={"refund": 17, "approval": pending.value}))
    follow_up = store.task(retried.task_id or "")
    echo(f"14. retry      the same resume again: {retried.result}; follow-up apply-refund "
         f"{follow_up.state}, hops {follow_up.hops}")
    check(retried.result == "replay" and follow_up.hops == 2, "the same single follow-up")

    claim = store.claim("refund-worker", queues="refunds")
    if claim is not None:
        store.finish(claim, {"refunded": 120}, side_effects=[SideEffect(
            action="refund", resource="customer:17", data=_REFUND,
            approval_id=claim.payload["approval"]["approval_id"])])
    second = store.claim("refund-worker", queues="refunds")
    effects = store.side_effects(follow_up.task_id)
    used = store.approval(approval_id)
    echo(f"15. follow-up  refund-worker runs apply-refund with payload {claim and claim.payload}"
         f": {store.task(follow_up.task_id).state}; another claim finds "
         f"{'nothing' if second is None else second.task_id}\n               the refund "
         f"commits with its finish, consuming the approval (uses {used.uses} of "
         f"{used.max_uses}): {len(effects)} side effect record, issued from it after the "
         f"commit")
    check(claim is not None and second is None and len(effects) == 1 and used.uses == 1,
          "the follow-up ran exactly once, its refund approved once")
    info = store.info()
    store.close()

    return check.closing_audit("16. audit      ", [url],
                               f"(waits {info['waits']}, tasks {info['tasks']})")
