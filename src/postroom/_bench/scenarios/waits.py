"""Signals: accepted answers to open waits, one ``signal`` transaction each.

Before each round (untimed), ``sizes.signals`` waits are opened, each the first generation of
a slot of its own (``flow`` = the round, ``step`` = the wait) with a deadline a day away. The
round sends one signal per wait, one at a time, and every one must come back ``accepted``:
its receipt, the wait's end and its continuation commit together, so a signal costs one
durable transaction. Afterwards the store must audit clean and hold exactly one accepted
receipt per wait (``sizes.signals`` per round) and one ``signal`` continuation per wait.
"""

from __future__ import annotations

import time
from collections import Counter

import postroom
from postroom._bench.context import BenchError, Context, Measurement, require_clean_audit

__all__ = ["run"]

_AUTH = postroom.AuthContext(principal="bench")
_DAY = 86_400.0
_STEP = "approval"


class _Rounds:
    """Each round's waits: opened before it, answered by it."""

    def __init__(self, store: postroom.Store, per_round: int) -> None:
        self.store = store
        self.per_round = per_round
        self.opened = 0  # rounds whose waits are open (or answered)

    def waits(self) -> list[tuple[int, str]]:
        """The latest round's waits: (number, flow)."""
        first = (self.opened - 1) * self.per_round
        return [(n, f"round-{self.opened}/{n}") for n in range(first, first + self.per_round)]

    def open(self) -> None:
        """Open the next round's waits, one ``open_wait`` transaction each."""
        self.opened += 1
        deadline = time.time() + _DAY  # far beyond the run: no signal is too late
        for _, flow in self.waits():
            opening = self.store.open_wait(flow, _STEP, 0, deadline)
            if opening.result is not postroom.OpenResult.OPENED:
                raise BenchError(f"open_wait of wait {flow} returned {opening.result}")

    def signal(self) -> int:
        """One signal per open wait of the round; each must be accepted."""
        store = self.store
        for n, flow in self.waits():
            receipt = store.signal(_AUTH, f"event-{n}", flow, _STEP, 1, {"approved": n})
            if receipt.result is not postroom.SignalResult.ACCEPTED:
                raise BenchError(f"the signal of wait {flow} returned {receipt.result}")
        return self.per_round


def _check(store: postroom.Store, rounds: int, per_round: int) -> None:
    """One accepted receipt and one signal continuation per wait, and a clean audit."""
    require_clean_audit(store._db)
    with store._db.reading() as tx:
        receipts = tx.execute("SELECT result FROM wait_receipts").fetchall()
        continuations = tx.execute(
            "SELECT flow, kind, generation FROM wait_continuations").fetchall()
    results = Counter(row["result"] for row in receipts)
    if results != {"accepted": rounds * per_round}:
        raise BenchError(f"{rounds} rounds of {per_round} signals left receipts {results}")
    waits = store.info()["waits"]
    if waits != {"signaled": rounds * per_round}:
        raise BenchError(f"{rounds} rounds of {per_round} signals left waits {waits}")
    per_flow_round = Counter(row["flow"].partition("/")[0] for row in continuations
                             if row["kind"] == "signal" and row["generation"] == 1)
    expected = {f"round-{index}": per_round for index in range(1, rounds + 1)}
    if len(continuations) != rounds * per_round or per_flow_round != expected:
        raise BenchError(f"{len(continuations)} continuations for {rounds} rounds of "
                         f"{per_round} accepted signals (signal continuations per round: "
                         f"{dict(per_flow_round)})")


def run(ctx: Context) -> list[Measurement]:
    """Accepted signals/s, one ``signal`` call (and transaction) per wait."""
    per_round = ctx.sizes.signals
    with postroom.open_store(ctx.target.url("signals")) as store:
        waits = _Rounds(store, per_round)
        waits.open()  # a warm-up round, not timed
        waits.signal()
        ctx.progress(f"signals: {per_round} accepted signals per round, one at a time")
        rounds = ctx.timed_rounds(waits.signal, before=waits.open)
        _check(store, waits.opened, per_round)
    return [Measurement(
        id="signals.accepted", backend=ctx.target.backend, unit="signals/s",
        label="accepted signals, one at a time (one signal per open wait)",
        rounds=rounds, details={"signals_per_round": per_round,
                                "waits_in_store_at_end": waits.opened * per_round})]
