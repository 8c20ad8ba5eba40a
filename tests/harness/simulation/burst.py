"""One process of a multi-process round: a random burst of work on a shared store.

Run as ``python -m tests.harness.simulation.burst CONFIG_JSON``. The process opens its own
connections, prints ``READY``, waits for ``GO`` on stdin (so every process of the round
starts together), then runs its burst, printing one JSON line per operation (with the ids of
any tasks it was ACKed) and ``{"done": true}`` at the end. An unexpected error is printed as
``{"error": ...}`` and exits 3. The parent may SIGKILL it at any moment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from postroom.clock import ManualClock
from postroom.errors import Fenced
from postroom.models import AuthContext, Claim, Envelope, FollowUp
from postroom.receiver import Receiver
from postroom.store import Store
from postroom.transports import InProcessTransport
from postroom.validation import follow_up_principal, task_id_for
from tests.harness.simulation.rounds import ROUND_QUEUES, ROUND_SETTINGS

__all__ = ["Burst", "main", "serve"]

class Burst:
    """The state of one process's burst."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.rng = random.Random(f"{config['seed']}/{config['round']}/{config['index']}")
        self.name = f"r{config['round']}p{config['index']}"
        self.clock = ManualClock(config["base"])
        self.store = Store.open(config["store"], clock=self.clock, settings=ROUND_SETTINGS,
                                seed=self.rng.randrange(2**32))
        self.receiver = Receiver.open(config["receiver"], clock=self.clock)
        self.transport = InProcessTransport(self.receiver)
        self.auth = AuthContext(principal=f"agent-{config['index'] % 3}")
        self.sent: list[Envelope] = []
        self.claims: list[Claim] = []
        self.task_ids: list[str] = []
        self.counter = 0

    def envelope(self) -> Envelope:
        self.counter += 1
        deadline = self.clock.now() + (self.rng.uniform(5.0, 60.0) if self.rng.random() < 0.1
                                       else 100_000.0)
        return Envelope(message_id=f"{self.name}-{self.counter}", sender=self.auth.principal,
                        payload={"n": self.counter, "by": self.name}, deadline=deadline,
                        max_attempts=self.rng.randint(1, 3), queue=self.rng.choice(ROUND_QUEUES),
                        hops=self.rng.choice((0, 0, 2)))

    def receive(self) -> list[str]:
        envelope = self.envelope()
        ack = self.store.receive(self.auth, envelope)
        self.sent.append(envelope)
        self.task_ids.append(ack.task_id)
        return [ack.task_id]

    def receive_atomic(self) -> list[str]:
        batch = [self.envelope() for _ in range(self.rng.randint(2, 4))]
        if self.sent and self.rng.random() < 0.5:
            batch.append(self.rng.choice(self.sent))
        acks = self.store.receive_atomic(self.auth, batch)
        self.sent.extend(batch)
        self.task_ids.extend(ack.task_id for ack in acks)
        return [ack.task_id for ack in acks]

    def resend(self) -> list[str]:
        if not self.sent:
            return self.receive()
        return [self.store.receive(self.auth, self.rng.choice(self.sent)).task_id]

    def claim(self) -> list[str]:
        limit = self.rng.choice((1, 1, 2, 3))
        self.claims.extend(self.store.claim_batch(self.name, limit, queues=ROUND_QUEUES))
        return []

    def _held(self) -> Claim | None:
        return self.claims.pop(self.rng.randrange(len(self.claims))) if self.claims else None

    def finish(self) -> list[str]:
        claim = self._held()
        if claim is None:
            return []
        children = ([FollowUp(message_id="next", payload={"after": claim.message_id})]
                    if self.rng.random() < 0.3 else [])
        try:
            self.store.finish(claim, {"by": self.name}, follow_ups=children)
        except Fenced:
            return []
        return [task_id_for(follow_up_principal(claim.task_id), child.message_id)
                for child in children]

    def fail(self) -> list[str]:
        claim = self._held()
        if claim is not None:
            with contextlib.suppress(Fenced):
                self.store.fail(claim, "burst failure", retryable=self.rng.random() < 0.8)
        return []

    def renew(self) -> list[str]:
        claim = self._held()
        if claim is not None:
            with contextlib.suppress(Fenced):
                self.claims.append(self.store.renew(claim))
        return []

    def dispatch(self) -> list[str]:
        self.store.dispatch(self.transport, owner=self.name, limit=self.rng.randint(1, 3))
        return []

    def sweep(self) -> list[str]:
        self.store.sweep()
        return []

    def cancel(self) -> list[str]:
        if self.task_ids:
            self.store.cancel(self.rng.choice(self.task_ids), reason="burst cancel")
        return []

    def tick(self) -> list[str]:
        self.clock.advance(self.rng.uniform(0.0, 4.0))
        return []

    def operations(self) -> dict[str, tuple[float, Callable[[], list[str]]]]:
        return {
            "receive": (4, self.receive), "receive_atomic": (1, self.receive_atomic),
            "resend": (1, self.resend), "claim": (4, self.claim), "finish": (4, self.finish),
            "fail": (1, self.fail), "renew": (1, self.renew), "dispatch": (3, self.dispatch),
            "sweep": (1, self.sweep), "cancel": (0.5, self.cancel),
            "tick": (2, self.tick),
        }


def _say(record: Any) -> None:
    sys.stdout.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    sys.stdout.flush()


def serve(calls: Iterable[tuple[str, Callable[[], dict[str, Any]]]]) -> int:
    """Say READY, wait for GO, then run each call, printing ``{"op": name, **what it did}``.

    Returns the exit code: 0 when every call ran, 2 without GO, 3 after an unexpected error
    (printed as ``{"error": ...}``).
    """
    _say("READY")
    if sys.stdin.readline().strip() != "GO":
        return 2
    try:
        for name, call in calls:
            _say({"op": name, **call()})
    except Exception as exc:
        _say({"error": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc(limit=8)})
        return 3
    _say({"done": True})
    return 0


def main(argv: list[str]) -> int:
    """Open, report READY, wait for GO, run the burst."""
    config = json.loads(argv[0])
    burst = Burst(config)
    table = burst.operations()
    names = list(table)
    weights = [table[name][0] for name in names]

    def acks(name: str) -> dict[str, Any]:
        return {"acks": table[name][1]()}

    def calls() -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
        for _ in range(config["ops"]):
            name = burst.rng.choices(names, weights)[0]
            yield name, functools.partial(acks, name)

    return serve(calls())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
