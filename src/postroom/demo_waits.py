"""``postroom demo waits``: a durable flow asks a human, survives restarts, continues once.

A task asks alice to approve a refund and waits with a deadline. Nobody answers in time, so
the sweeper times the question out and the flow asks again; the store restarts between every
act; the answer arrives, then its duplicate, then a late answer to the first question; the
process that resumes the flow dies right after its commit; and the follow-up task still runs
exactly once. Each line prints what the database durably says. Time is a manual clock;
the processes that ask and that die are real.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from postroom.clock import ManualClock
from postroom.demo import Checks
from postroom.models import AuthContext, Envelope, FollowUp
from postroom.store import Store

__all__ = ["run_waits_demo"]

_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, so the printed times are readable

FLOW, STEP = "refund-17", "approval"
_ALICE = AuthContext(principal="alice")

# The asking worker, in its own process: claim the task, ask the question (open the wait),
# finish the task, and exit. Nothing of the question lives on in any process's memory.
_ASKER = """
import sys
from postroom import ManualClock, open_store
url, now, expected, deadline = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = open_store(url, clock=ManualClock(now))
claim = store.claim("asker", queues="asks")
opening = store.open_wait("refund-17", "approval", expected, deadline, task_id=claim.task_id,
                          request_id=f"ask-{claim.task_id[:12]}")
store.finish(claim, {"asked": "alice", "generation": opening.generation})
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
    echo(f"5. resume      the flow resumes it: follow-up task ask-again, {child.state}, "
         f"hops {child.hops}, parent refund-17: {child.parent_task_id == ack.task_id}")
    check(again.result == "resumed" and child.hops == 1, "a follow-up one hop further")

    asked = process(_ASKER, clock.now(), 1, _START + 900)
    echo(f"6. ask again   another worker process runs ask-again: open_wait -> "
         f"{asked.stdout.strip()}")
    check(asked.stdout.split() == ["opened", "2"], "generation 2 opened")

    store = restart()
    clock.set(_START + 420)
    answer = store.signal(_ALICE, "mail-2", FLOW, STEP, 2, {"approve": True})
    echo(f"7. answer      {at(clock.now())} (after a restart): alice's mail-2 answers "
         f"generation 2: {answer.result}\n               {wait_row(2)}")
    check(answer.result == "accepted", "the answer accepted")

    high_water = store.info()["time_high_water"]
    clock.set(_START + 480)
    duplicate = store.signal(_ALICE, "mail-2", FLOW, STEP, 2, {"approve": True})
    unmoved = store.info()["time_high_water"] == high_water
    echo(f"8. duplicate   the mail gateway retries mail-2: {duplicate.result} of "
         f"{duplicate.recorded}; time high-water unchanged: {unmoved}")
    check(duplicate.result == "replay" and duplicate.recorded == "accepted" and unmoved,
          "a replay that writes nothing")

    stale = store.signal(_ALICE, "mail-1", FLOW, STEP, 1, {"approve": False})
    echo(f"9. stale       alice's late reply to the first question (mail-1, generation 1): "
         f"{stale.result}\n               {wait_row(2)}")
    check(stale.result == "stale_generation" and store.wait(FLOW, STEP).event_id == "mail-2",
          "the old answer wakes nothing")

    store = restart()
    [pending] = store.continuations()
    echo(f"10. restart    reopen: one continuation to resume: {pending.kind} "
         f"{pending.value}")

    died = process(_RESUMER, clock.now())
    store = restart()
    left = store.continuations()
    echo(f"11. resume     a process resumes it and dies right after the commit (exit code "
         f"{died.returncode}); after a restart: continuations {len(left)}")
    check(died.returncode == 73 and not left, "consumed by the process that died")

    retried = store.resume(FLOW, STEP, 2, FollowUp(
        message_id="apply-refund", queue="refunds",
        payload={"refund": 17, "approval": pending.value}))
    follow_up = store.task(retried.task_id or "")
    echo(f"12. retry      the same resume again: {retried.result}; follow-up apply-refund "
         f"{follow_up.state}, hops {follow_up.hops}")
    check(retried.result == "replay" and follow_up.hops == 2, "the same single follow-up")

    claim = store.claim("refund-worker", queues="refunds")
    if claim is not None:
        store.finish(claim, {"refunded": 120})
    second = store.claim("refund-worker", queues="refunds")
    echo(f"13. follow-up  refund-worker runs apply-refund with payload {claim and claim.payload}"
         f": {store.task(follow_up.task_id).state}; another claim finds "
         f"{'nothing' if second is None else second.task_id}")
    check(claim is not None and second is None, "the follow-up ran exactly once")
    info = store.info()
    store.close()

    return check.closing_audit("14. audit      ", [url],
                               f"(waits {info['waits']}, tasks {info['tasks']})")
