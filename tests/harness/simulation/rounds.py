"""Multi-process rounds: real processes with their own connections, racing on one store.

Each round starts P processes (children with the steps of ``tests.harness.simulation.burst``),
waits until every one has opened its connections, then releases them together with GO. Each runs a
random burst of receives, claims, finishes, fails, renewals, dispatches and sweeps, on
its own manual clock (so the processes disagree about time, as hosts do). Some are killed
with SIGKILL after a random number of operations, wherever they are.

After the burst the audit must be clean. Then this process drains the store: it sweeps,
claims and finishes whatever is left, dispatches every reply, and requeues dead ones (an
operator decision, recorded), until nothing is left. Then every task a process was ACKed is
terminal with its reply sent, and the receiver holds exactly one effect per reply.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from postroom.clock import ManualClock
from postroom.receiver import Receiver
from postroom.settings import ExponentialBackoff, Settings
from postroom.store import Store
from postroom.transitions import reply_id_for
from postroom.transports import InProcessTransport
from tests.harness.children import ENDED, Answer, Child, ChildError, release, release_each, spawn
from tests.harness.simulation.checks import Transition, audit_problems, check_transition
from tests.harness.simulation.world import START, TERMINAL, Snapshot, UrlFactory, read_snapshot
from tests.support import database_of

__all__ = ["ROUND_QUEUES", "ROUND_SETTINGS", "Played", "RoundProcess", "RoundsResult",
           "SharedStore", "delivered", "drain", "play_rounds", "release_processes", "run_rounds"]

#: Short leases and backoffs: processes with skewed clocks take over each other's work.
ROUND_SETTINGS = Settings(
    lease=10.0,
    dispatch_lease=10.0,
    max_hops=3,
    delivery_budget=3,
    sweep_limit=20,
    backoff=ExponentialBackoff(base=0.5, cap=5.0),
    delivery_backoff=ExponentialBackoff(base=0.5, cap=5.0),
)
ROUND_QUEUES = ("default", "fast")

#: Operations per process per round.
BURST_OPS = 30
#: Share of processes killed mid-burst.
KILL_RATE = 0.3
_DRAIN_PASSES = 30


@dataclass(kw_only=True, slots=True)
class RoundsResult:
    """What the rounds ran and found."""

    rounds: int = 0
    processes: int = 0
    killed: int = 0
    operations: int = 0
    acked: int = 0
    requeued: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RoundProcess:
    """What one process of a round did: the records it noted, and whether it was SIGKILLed."""

    index: int
    records: list[dict[str, Any]]
    killed: bool


class SharedStore:
    """The store and receiver a round's processes share, as this process holds them.

    This process has its own manual clock and connections, and keeps what the processes
    were ACKed (``acked``), so it can check the databases between two moments of a round.
    """

    def __init__(self, urls: UrlFactory, seed: int) -> None:
        self.clock = ManualClock(START)
        self.store_url, self.receiver_url = urls("store"), urls("receiver")
        self.store = Store.open(self.store_url, clock=self.clock, settings=ROUND_SETTINGS,
                                seed=seed)
        self.receiver = Receiver.open(self.receiver_url, clock=self.clock)
        self.acked: set[str] = set()

    def snapshot(self) -> Snapshot:
        """Both databases now."""
        return read_snapshot(database_of(self.store), database_of(self.receiver))

    def checked(self, before: Snapshot) -> tuple[Snapshot, list[str]]:
        """Both databases now, audited and checked against ``before``."""
        after = self.snapshot()
        step = Transition(forgets=False, retention=self.store.retention, acked=self.acked)
        return after, (audit_problems(database_of(self.store), database_of(self.receiver))
                       + check_transition(before, after, step))

    def drained(self, before: Snapshot, result: RoundsResult) -> tuple[Snapshot, list[str]]:
        """Drain the store (see ``drain``), then check it, every ACKed task delivered."""
        _, problems = drain(self.store, self.receiver, self.clock, result)
        after, found = self.checked(before)
        return after, problems + found + delivered(after, self.acked)

    def close(self) -> None:
        """Close both databases."""
        self.store.close()
        self.receiver.close()


def run_rounds(rounds: int, processes: int, urls: UrlFactory, *, seed: int = 0,
               ops: int = BURST_OPS, kill_rate: float = KILL_RATE,
               on_round: Callable[[], None] | None = None) -> RoundsResult:
    """Run ``rounds`` rounds of ``processes`` processes on one store; stop at a violation."""
    result = RoundsResult()
    if rounds <= 0:
        return result
    rng = random.Random(f"rounds/{seed}")
    shared = SharedStore(urls, seed)

    def play(number: int, previous: Snapshot) -> Played:
        config = {"seed": seed, "round": number, "ops": ops, "store": shared.store_url,
                  "receiver": shared.receiver_url,
                  "base": max(shared.clock.now(), previous.high_water) + 1.0}
        problems = _burst(config, count=processes, rng=rng, kill_rate=kill_rate,
                          result=result, acked=shared.acked)
        burst, found = shared.checked(previous)
        drained, more = shared.drained(burst, result)
        return Played(problems=problems + found + more, drained=drained)

    play_rounds(shared, result, rounds, label="round", seed=seed, play=play,
                on_round=on_round)
    return result


@dataclass(slots=True)
class Played:
    """One round's outcome: its problems, the drained store, and what names the round."""

    problems: list[str]
    drained: Snapshot
    context: dict[str, Any] = field(default_factory=dict)


def play_rounds(shared: SharedStore, result: RoundsResult, rounds: int, *, label: str,
                seed: int, play: Callable[[int, Snapshot], Played],
                on_round: Callable[[], None] | None) -> None:
    """Play ``rounds`` rounds one after another on ``shared``; stop at the first violation.

    Each round starts from the snapshot the previous one drained to. ``shared`` is closed at
    the end.
    """
    try:
        previous = shared.snapshot()
        for number in range(rounds):
            played = play(number, previous)
            result.rounds = number + 1
            result.acked = len(shared.acked)
            if played.problems:
                result.violations.append({label: number, "seed": seed, **played.context,
                                          "problems": played.problems[:20]})
                break
            previous = played.drained
            if on_round is not None:
                on_round()
    finally:
        shared.close()


def _burst(config: dict[str, Any], *, count: int, rng: random.Random, kill_rate: float,
           result: RoundsResult, acked: set[str]) -> list[str]:
    """Start, release and follow the processes of one round; returns its problems."""
    started, problems = release_processes("tests.harness.simulation.burst", "burst", config,
                                          count=count, rng=rng, kill_rate=kill_rate)
    result.processes += count
    for process in started:
        result.killed += process.killed
        for record in process.records:
            result.operations += "op" in record
            acked.update(record.get("acks", ()))
    return problems


def release_processes(module: str, steps: str, config: dict[str, Any], *, count: int,
                      rng: random.Random, kill_rate: float
                      ) -> tuple[list[RoundProcess], list[str]]:
    """Run ``count`` children with the steps of ``module`` together; what each did, and what
    went wrong.

    Each opens its own connections in its step ``<steps>_open``, given ``config`` plus its
    ``index``; only once every one has are they all released into the step ``<steps>``, in
    which each notes one record per operation. A share ``kill_rate`` of them is SIGKILLed
    after a random number (up to ``config["ops"]``) of records.
    """
    kill_after = [rng.randint(1, config["ops"]) if rng.random() < kill_rate else None
                  for _ in range(count)]
    with spawn(count, name=f"round-{config['round']}", modules=[module]) as children:
        opened = release_each([(child, f"{steps}_open", {"config": {**config, "index": index}})
                               for index, child in enumerate(children)])
        problems = [f"process {index} did not get ready: {answer.error}: {answer.message}"
                    for index, answer in enumerate(opened) if answer.error is not None]
        if not problems:
            for child, notes in zip(children, kill_after, strict=True):
                if notes is not None:
                    child.kill_after(notes)
            try:
                answers = release(children, steps)
            except ChildError as exc:  # one of them hangs: the round has failed
                answers = []
                problems.append(str(exc))
            for index, (child, answer) in enumerate(zip(children, answers, strict=False)):
                problems += _problems(f"process {index}", child, answer)
        started = [RoundProcess(index, child.notes, child.killed)
                   for index, child in enumerate(children)]
    return started, problems


def _problems(name: str, child: Child, answer: Answer) -> list[str]:
    """What went wrong with a process of a round, given its answer to the burst."""
    if answer.error not in (None, ENDED):
        return [f"{name}: {answer.error}: {answer.message}{child.tail()}"]
    if answer.error is None:
        code = child.exit_code()  # reaped: a SIGKILL that came after the answer shows now
        return [] if code == 0 or child.killed else [f"{name} exited {code}{child.tail()}"]
    return [] if child.killed else [f"{name}: {answer.message}"]


def drain(store: Store, receiver: Receiver, clock: ManualClock,
           result: RoundsResult) -> tuple[Snapshot, list[str]]:
    """Take everything left to its end: tasks terminal, replies sent."""
    transport = InProcessTransport(receiver)
    snapshot = read_snapshot(database_of(store), database_of(receiver))
    clock.set(max(clock.now(), snapshot.high_water) + 100.0)  # every burst lease has expired
    for _ in range(_DRAIN_PASSES):
        store.sweep()
        while claims := store.claim_batch("drainer", 100, queues=ROUND_QUEUES):
            for claim in claims:
                store.finish(claim, {"drained": True})
        while store.dispatch(transport, owner="drainer", limit=50).claimed:
            pass
        snapshot = read_snapshot(database_of(store), database_of(receiver))
        dead = [reply_id for reply_id, row in snapshot.replies.items() if row["state"] == "dead"]
        for reply_id in dead:
            # The operator reconciled by reply_id: the receiver holds this very content or
            # nothing (the checks hold it to that), so sending again is safe.
            store.requeue_reply(reply_id, operator="round-drain",
                                reason="outcome unknown after a crash; receiver reconciled")
        result.requeued += len(dead)
        if not dead and all(row["state"] in TERMINAL for row in snapshot.tasks.values()) \
                and all(row["state"] == "sent" for row in snapshot.replies.values()):
            return snapshot, []
        clock.advance(60.0)
    return snapshot, [f"the store did not drain in {_DRAIN_PASSES} passes"]


def delivered(snapshot: Snapshot, acked: set[str]) -> list[str]:
    """Every ACKed task terminal and sent; one receiver effect per reply, none extra."""
    problems = []
    for task_id in sorted(acked):
        row = snapshot.tasks.get(task_id)
        reply = snapshot.replies.get(reply_id_for(task_id))
        if row is None:
            problems.append(f"ACKed task {task_id} is not stored")
        elif row["state"] not in TERMINAL or reply is None or reply["state"] != "sent":
            problems.append(f"ACKed task {task_id} is {row['state']}, reply "
                            f"{reply['state'] if reply else 'missing'} after draining")
    for reply_id, reply in snapshot.replies.items():
        receipt = snapshot.receipts.get(reply_id)
        if receipt is None or receipt["fingerprint"] != reply["fingerprint"]:
            problems.append(f"reply {reply_id} is not held by the receiver as sent")
        elif receipt["effects"] != 1:
            problems.append(f"reply {reply_id} has {receipt['effects']} receiver effects")
    if len(snapshot.receipts) != len(snapshot.replies):
        problems.append(f"the receiver holds {len(snapshot.receipts)} receipts for "
                        f"{len(snapshot.replies)} replies")
    return problems
