"""``postroom demo``: the durable task lifecycle, end to end, on a temporary SQLite database.

Each step prints what the databases durably say, not what the code believes: the task row,
the reply row, the receiver's effect count. Time is a manual clock, so "35 seconds later" is
exact; the vanishing worker is a real process that dies without tidying up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from postroom import faults
from postroom.audit import audit_url
from postroom.clock import ManualClock
from postroom.errors import Fenced, TransientDeliveryError
from postroom.models import AuthContext, Envelope
from postroom.outbox import AFTER_REMOTE_COMMIT
from postroom.receiver import Receiver
from postroom.settings import FixedBackoff, Settings
from postroom.store import Store
from postroom.transports import InProcessTransport

__all__ = ["Checks", "run_demo"]

_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, so the printed times are readable
_SETTINGS = Settings(lease=30.0, delivery_backoff=FixedBackoff(seconds=5.0))

# The vanishing worker: claims the task in its own process, then dies mid-work.
_WORKER = """
import os, sys
from postroom import ManualClock, open_store
from postroom.demo import _SETTINGS
store = open_store(sys.argv[1], clock=ManualClock(float(sys.argv[2])), settings=_SETTINGS)
claim = store.claim("worker-1")
print(claim.fence, claim.attempt, claim.lease_until, flush=True)
os._exit(9)  # no finish, no cleanup: the process is simply gone
"""


def run_demo(echo: Callable[[str], None] = print, folder: Path | None = None) -> bool:
    """Run the story; returns whether every check along the way held."""
    with tempfile.TemporaryDirectory(prefix="postroom-demo-") as scratch:
        root = folder or Path(scratch)
        return _story(echo, f"sqlite:///{root / 'postroom.db'}",
                      f"sqlite:///{root / 'receiver.db'}")


class Checks:
    """A story's expectations: each one that fails is printed; ``held`` says whether all held."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self.held = True

    def __call__(self, condition: bool, what: str) -> None:
        if not condition:
            self.held = False
            self._echo(f"   !! expected: {what}")

    def closing_audit(self, heading: str, urls: Sequence[str], scope: str) -> bool:
        """Audit every database, print what it found and the verdict; whether all held."""
        violations = [violation for url in urls for violation in audit_url(url)]
        self._echo(f"{heading}{'clean' if not violations else 'VIOLATIONS'}: SPEC §8 "
                   f"invariants {scope}")
        for violation in violations:
            self._echo(f"{' ' * len(heading)}{violation}")
        self(not violations, "a clean audit")
        self._echo("\n" + ("every step held" if self.held else "SOMETHING DID NOT HOLD"))
        return self.held


def _story(echo: Callable[[str], None], url: str, receiver_url: str) -> bool:
    check = Checks(echo)
    clock = ManualClock(_START)
    store = Store.open(url, clock=clock, settings=_SETTINGS)
    receiver = Receiver.open(receiver_url)
    echo(f"postroom demo: store {url}\n               receiver {receiver_url}\n")

    def task_row(task_id: str) -> str:
        t = store.task(task_id)
        return (f"state={t.state} owner={t.owner} fence={t.fence} attempts={t.attempts} "
                f"lease_until={'-' if t.lease_until is None else f'+{t.lease_until - _START:g}s'}")

    auth = AuthContext(principal="planner")
    envelope = Envelope(message_id="review-42", sender="planner",
                        payload={"review": "pull request 42"}, deadline=_START + 3600)
    ack = store.receive(auth, envelope)
    task_id = ack.task_id
    echo(f"1. receive      ACK {json.dumps(ack.to_dict())}")
    echo(f"                task {task_row(task_id)}")
    check(not ack.duplicate and store.task(task_id).state == "pending", "stored, pending")

    echo("2. claim        worker-1 claims it in its own process ...")
    child = subprocess.run([sys.executable, "-c", _WORKER, url, str(clock.now())],
                           capture_output=True, text=True, check=False)
    fence = child.stdout.split()[0] if child.stdout else "?"
    echo(f"                worker-1 got fence {fence}, then its process died "
         f"(exit code {child.returncode}) before finishing")
    check(child.returncode == 9 and fence == "1", "worker-1 held fence 1 and died")
    store.close()

    echo("3. restart      reopen the database: nothing is cleared")
    store = Store.open(url, clock=clock, settings=_SETTINGS)
    echo(f"                task {task_row(task_id)}")
    check(store.task(task_id).owner == "worker-1", "the dead worker's claim is still recorded")

    clock.advance(35.0)
    claim = store.claim("worker-2")
    echo("4. recover      35 s later the lease has expired; worker-2 claims")
    echo(f"                task {task_row(task_id)}")
    check(claim is not None and claim.fence == 2, "worker-2 holds fence 2")
    assert claim is not None

    stale = replace(claim, owner="worker-1", fence=1)  # what worker-1 still holds
    try:
        store.finish(stale, {"verdict": "stale approve"})
        check(False, "the stale commit to be rejected")
    except Fenced as exc:
        echo(f"5. stale commit worker-1 comes back and tries to finish with fence 1: "
             f"rejected\n                (Fenced: {exc.reason})")
    echo(f"                task {task_row(task_id)}")

    store.finish(claim, {"verdict": "approve", "notes": 3})
    reply = store.reply(task_id)
    assert reply is not None
    echo(f"6. done         worker-2 finishes: task {store.task(task_id).state}; reply "
         f"{reply.reply_id[:22]}... is {reply.state} in the outbox (same transaction)")
    check(reply.state == "pending", "the reply waits in the outbox")

    transport = InProcessTransport(receiver)
    with faults.armed(AFTER_REMOTE_COMMIT,
                      faults.raising(lambda _: TransientDeliveryError("ACK lost in transit"))):
        first = store.dispatch(transport)
    reply = store.reply(task_id)
    assert reply is not None
    echo(f"7. deliver #1   the receiver commits, but its ACK is lost: reply {reply.state}, "
         f"attempts {reply.attempts}\n                last_error: {reply.last_error}\n"
         f"                receiver effects for this reply: "
         f"{receiver.effect_count(reply.reply_id)}")
    check(first.retrying == 1 and receiver.effect_count(reply.reply_id) == 1,
          "one effect, reply pending again")
    first_id = reply.reply_id

    clock.advance(5.0)
    second = store.dispatch(transport)
    reply = store.reply(task_id)
    assert reply is not None
    receipt = receiver.receipt(reply.reply_id)
    echo(f"8. deliver #2   redelivery reuses reply_id {reply.reply_id == first_id}: "
         f"the receiver answers duplicate; reply {reply.state}, attempts {reply.attempts}")
    check(second.sent == 1 and reply.reply_id == first_id, "same reply_id, sent")
    effects = receiver.effect_count(reply.reply_id)
    echo(f"9. evidence     task {store.task(task_id).state}, reply {reply.state}, "
         f"receiver effects {effects}, receipt fingerprint "
         f"{(receipt or {}).get('fingerprint', '?')[:16]}...")
    check(effects == 1, "exactly one receiver effect")
    store.close()
    receiver.close()

    return check.closing_audit("10. audit       ", [url, receiver_url], "on both databases")

