"""One process of a wait round: its part in each of the round's contests, on a shared store.

Its steps are ``wait_burst_open`` and ``wait_burst``, registered as ``burst`` registers its
own (one note per call, each saying what the store answered). The config names
the round's flow, its deadline and the order of the contests; every process plays its part
in each contest in that order, so all of them hit the same slot at about the same moment:

- ``open``: open generation 2 of a slot whose generation 1 ended and was consumed, with its
  own request id; sometimes retry that request id, or ask with a stale or a future
  expected generation;
- ``signals``: answer generation 1 with its own event; sometimes also an event id shared by
  every process of the same principal (same body), a replay of its own event, or its own
  event id with another body (a conflict);
- ``deadline``: with its clock at the wait's deadline exactly, either answer (too late) or
  expire that generation or sweep every due wait;
- ``resume``: resume the one continuation with a follow-up of its own, or with no effect;
  sometimes resume again.

Between contests: list the continuations, answer generation 2 of the ``open`` slot early,
or let the clock tick. Each line says what the store answered, for the parent to judge.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from postroom.models import AuthContext, FollowUp
from tests.harness.children import Context
from tests.harness.simulation.burst import Call, burst_steps
from tests.harness.simulation.rounds import ROUND_SETTINGS

__all__ = ["CONTESTS", "WaitBurst"]

#: The contests of a wait round, each on its own step of the round's flow.
CONTESTS = ("open", "signals", "deadline", "resume")


class WaitBurst:
    """The calls one process makes in a wait round."""

    def __init__(self, ctx: Context, config: dict[str, Any]) -> None:
        self.config = config
        self.rng = random.Random(f"waits/{config['seed']}/{config['round']}/{config['index']}")
        self.name = f"r{config['round']}p{config['index']}"
        self.flow = str(config["flow"])
        self.clock = ctx.manual_clock
        self.clock.set(config["base"])
        ctx.open(config["store"], settings=ROUND_SETTINGS, seed=self.rng.randrange(2**32))
        self.store = ctx.store
        self.auth = AuthContext(principal=f"agent-{config['index'] % 3}")

    def calls(self) -> list[Call]:
        """This process's calls: its part in each contest, in the round's order."""
        parts: dict[str, Callable[[], list[Call]]] = {
            "open": self.open_part, "signals": self.signals_part,
            "deadline": self.deadline_part, "resume": self.resume_part}
        calls: list[Call] = []
        for contest in self.config["order"]:
            calls += parts[contest]()
            if self.rng.random() < 0.5:
                calls.append(self.extra())
        return calls

    # -- the contests -------------------------------------------------------------------------

    def open_part(self) -> list[Call]:
        own = f"{self.name}-open"
        calls = [("open_wait", lambda: self._open(1, own))]
        if self.rng.random() < 0.5:
            calls.append(("open_wait_retry", lambda: self._open(1, own)))
        roll = self.rng.random()
        if roll < 0.2:
            calls.append(("open_wait_stale", lambda: self._open(0, None)))
        elif roll < 0.4:
            calls.append(("open_wait_next", lambda: self._open(2, f"{self.name}-next")))
        return calls

    def signals_part(self) -> list[Call]:
        own, rng = self.name, self.rng
        calls = [("signal", lambda: self._signal("signals", own, 1, {"from": own}))]
        if rng.random() < 0.5:
            shared = f"shared-{self.config['round']}"  # one event id per principal and round
            calls.append(("signal_shared", lambda: self._signal("signals", shared, 1, "same")))
        if rng.random() < 0.5:
            calls.append(("signal_replay", lambda: self._signal("signals", own, 1, {"from": own})))
        if rng.random() < 0.2:
            calls.append(("signal_conflict",
                          lambda: self._signal("signals", own, 1, {"from": "someone else"})))
        return calls

    def deadline_part(self) -> list[Call]:
        roll = self.rng.random()
        if roll < 0.5:
            return [("signal_at_deadline", lambda: self._at_deadline(
                lambda: self._signal("deadline", f"{self.name}-late", 1, "late")))]
        if roll < 0.75:
            return [("expire", lambda: self._at_deadline(self._expire))]
        return [("expire_due", lambda: self._at_deadline(self._expire_due))]

    def resume_part(self) -> list[Call]:
        calls = [("resume", lambda: self._resume(self._effect()))]
        if self.rng.random() < 0.3:
            calls.append(("resume_again", lambda: self._resume(self._effect())))
        return calls

    def extra(self) -> Call:
        """Something else a process does meanwhile."""
        roll = self.rng.random()
        if roll < 0.4:
            return "continuations", lambda: {"listed": len(self.store.continuations())}
        if roll < 0.7:
            return "signal_early", lambda: self._signal("open", f"{self.name}-early", 2, "early")
        seconds = self.rng.uniform(0.0, 0.5)
        return "tick", lambda: {"now": self.clock.advance(seconds)}

    # -- the calls ----------------------------------------------------------------------------

    def _open(self, expected: int, request_id: str | None) -> dict[str, Any]:
        opening = self.store.open_wait(self.flow, "open", expected, self.config["far"],
                                       request_id=request_id)
        return {"contest": "open", "expected": expected, "request_id": request_id,
                "result": opening.result.value, "generation": opening.generation,
                "replay": opening.replay}

    def _signal(self, step: str, event_id: str, generation: int, value: Any) -> dict[str, Any]:
        receipt = self.store.signal(self.auth, event_id, self.flow, step, generation, value)
        return {"contest": step, "principal": self.auth.principal, "event_id": event_id,
                "result": receipt.result.value, "recorded": receipt.recorded.value}

    def _at_deadline(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self.clock.set(self.config["deadline"])
        return call()

    def _expire(self) -> dict[str, Any]:
        result = self.store.expire(self.flow, "deadline", 1)
        return {"contest": "deadline", "result": result.value,
                "timed_out": int(result.value == "timed_out")}

    def _expire_due(self) -> dict[str, Any]:
        return {"contest": "deadline", "result": "swept", "timed_out": self.store.expire_due()}

    def _effect(self) -> FollowUp | None:
        if self.rng.random() < 0.5:
            return None
        return FollowUp(message_id=f"next-{self.name}", payload={"by": self.name})

    def _resume(self, effect: FollowUp | None) -> dict[str, Any]:
        resumption = self.store.resume(self.flow, "resume", 1, effect)
        return {"contest": "resume", "result": resumption.result.value,
                "kind": resumption.kind.value, "task_id": resumption.task_id,
                "effect": None if effect is None else effect.message_id}


burst_steps("wait_burst", WaitBurst)
