"""One process of a multi-process round: a random burst of work on a shared store.

The round's processes are children of ``tests.harness.children`` that import this module for
its two steps: ``burst_open`` (given the round's config and the process's index) opens the
child's own connections, and ``burst``, to which the round releases every child at once, runs
the burst, noting one record per operation (with the ids of any tasks it was ACKed), and
answers how many operations it ran. The parent may SIGKILL it at any moment.
``burst_steps`` registers the same pair of steps for another kind of burst (``wait_burst``).
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from postroom.errors import Fenced
from postroom.models import AuthContext, Claim, Envelope, FollowUp
from postroom.transports import InProcessTransport
from postroom.validation import follow_up_principal, task_id_for
from tests.harness.children import Context, step
from tests.harness.simulation.rounds import ROUND_QUEUES, ROUND_SETTINGS

__all__ = ["Burst", "Call", "burst_steps"]

#: One call of a burst: its name, and what runs it and reports what it did.
Call = tuple[str, Callable[[], dict[str, Any]]]


class Bursting(Protocol):
    """A process's part in a round: built from the round's config, it plans its calls."""

    def calls(self) -> Iterable[Call]:
        """The calls to make, in order (planned lazily or up front)."""
        ...


def burst_steps(name: str, make: Callable[[Context, dict[str, Any]], Bursting]) -> None:
    """Register the steps ``<name>_open`` (``make(context, config)``, which opens the
    process's connections) and ``<name>`` (run its calls, noting ``{"op": name, **what it
    did}`` for each; answers how many ran)."""

    @step(f"{name}_open")
    def _open(ctx: Context, config: dict[str, Any]) -> None:
        ctx.kept[name] = make(ctx, config)

    @step(name)
    def _run(ctx: Context) -> int:
        count = 0
        for op, call in ctx.kept[name].calls():
            ctx.note({"op": op, **call()})
            count += 1
        return count


class Burst:
    """The state of one process's burst."""

    def __init__(self, ctx: Context, config: dict[str, Any]) -> None:
        self.config = config
        self.rng = random.Random(f"{config['seed']}/{config['round']}/{config['index']}")
        self.name = f"r{config['round']}p{config['index']}"
        self.clock = ctx.manual_clock
        self.clock.set(config["base"])
        ctx.open(config["store"], config["receiver"], settings=ROUND_SETTINGS,
                 seed=self.rng.randrange(2**32))
        self.store = ctx.store
        self.transport = InProcessTransport(ctx.receiver)
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


    def calls(self) -> Iterator[Call]:
        """``config["ops"]`` operations, each drawn (by weight) just before it runs."""
        table = self.operations()
        names = list(table)
        weights = [table[name][0] for name in names]

        def acks(name: str) -> dict[str, Any]:
            return {"acks": table[name][1]()}

        for _ in range(self.config["ops"]):
            name = self.rng.choices(names, weights)[0]
            yield name, functools.partial(acks, name)


burst_steps("burst", Burst)
