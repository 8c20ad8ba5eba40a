"""Multi-process wait rounds: real processes released together, racing on a few shared slots.

Each round prepares four contested things on a flow of its own, in this process:

- ``open``:     generation 1 ended and consumed; who opens generation 2?
- ``signals``:  generation 1 waiting, its deadline far away; whose answer is accepted?
- ``deadline``: generation 1 waiting until a deadline every contender's clock is set to;
  is it timed out by a late answer, by ``expire``, or by a sweep?
- ``resume``:   a continuation (of a wait with a parent task) to consume; whose effect?

Then P processes (children with the steps of ``tests.harness.simulation.wait_burst``) open
their own connections and are released together with GO; some are SIGKILLed wherever they
are. After the burst the audit and the cross-step checks must hold, and each contest must
have exactly one winner in the durable records, agreeing with everything a process
reported (a process killed after its commit may have won without saying so; one that said
it won must be the winner). Then this process settles the round -- answers what still
waits, resumes what is unconsumed, drains the tasks and replies -- and checks again, so
every round starts from a quiet store.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from postroom.models import AuthContext, Envelope
from postroom.store import Store
from postroom.validation import task_id_for
from postroom.waits import WaitAddress, follow_up_namespace
from tests.harness.simulation.rounds import (
    KILL_RATE,
    Played,
    RoundProcess,
    RoundsResult,
    SharedStore,
    play_rounds,
    release_processes,
)
from tests.harness.simulation.wait_burst import CONTESTS
from tests.harness.simulation.waits import current
from tests.harness.simulation.world import Row, Snapshot, UrlFactory

__all__ = ["WaitRoundsResult", "run_wait_rounds"]

#: How far the contested waits' deadlines are from the round's start (the ``deadline``
#: contest excepted): beyond any clock the rounds reach, so nothing else is ever due.
FAR = 10_000_000.0
#: The ``deadline`` contest's deadline, after the round's start.
DEADLINE_AFTER = 30.0
#: Lines a wait burst prints, roughly (a killed process dies after 1..this many).
WAIT_BURST_OPS = 10

_OPERATOR = AuthContext(principal="operator")


@dataclass(kw_only=True, slots=True)
class WaitRoundsResult(RoundsResult):
    """What the wait rounds ran and found; ``winners`` tallies how each contest was won."""

    winners: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Round:
    number: int
    flow: str
    base: float
    parent: str  # the task the ``resume`` contest's wait was opened with

    @property
    def deadline(self) -> float:
        return self.base + DEADLINE_AFTER


def run_wait_rounds(rounds: int, processes: int, urls: UrlFactory, *, seed: int = 0,
                    kill_rate: float = KILL_RATE,
                    on_round: Callable[[], None] | None = None) -> WaitRoundsResult:
    """Run ``rounds`` wait rounds of ``processes`` processes on one store; stop at a violation."""
    result = WaitRoundsResult()
    if rounds <= 0:
        return result
    rng = random.Random(f"wait-rounds/{seed}")
    shared = SharedStore(urls, seed)

    def play(number: int, previous: Snapshot) -> Played:
        base = max(shared.clock.now(), previous.high_water) + 1.0
        shared.clock.set(base)
        contest = _prepare(shared.store, number, base)
        shared.acked.add(contest.parent)
        prepared, problems = shared.checked(previous)
        order = rng.sample(CONTESTS, len(CONTESTS))
        config = {"seed": seed, "round": number, "store": shared.store_url, "base": base,
                  "flow": contest.flow, "far": base + FAR, "deadline": contest.deadline,
                  "order": order, "ops": WAIT_BURST_OPS}
        started, burst_problems = release_processes(
            "tests.harness.simulation.wait_burst", "wait_burst", config, count=processes,
            rng=rng, kill_rate=kill_rate)
        result.processes += processes
        result.killed += sum(process.killed for process in started)
        result.operations += sum("op" in r for p in started for r in p.records)
        burst, found = shared.checked(prepared)
        problems += burst_problems + found
        problems += _judge(contest, started, burst, result.winners, shared.acked)
        _settle(shared.store, contest)
        settled, found = shared.checked(burst)
        drained, more = shared.drained(settled, result)
        return Played(problems=problems + found + _quiet(settled) + more, drained=drained,
                      context={"order": order})

    play_rounds(shared, result, rounds, label="wait_round", seed=seed, play=play,
                on_round=on_round)
    return result


def _prepare(store: Store, number: int, base: float) -> _Round:
    """Set the round's four contests up on a flow of its own."""
    flow = f"round-{number}"
    far = base + FAR
    store.open_wait(flow, "open", 0, far)
    store.signal(_OPERATOR, f"{flow}/open/1", flow, "open", 1, "answered")
    store.resume(flow, "open", 1, None)
    store.open_wait(flow, "signals", 0, far)
    store.open_wait(flow, "deadline", 0, base + DEADLINE_AFTER)
    ask = Envelope(message_id=f"ask-{number}", sender="planner", payload={"round": number},
                   deadline=far)
    parent = store.receive(AuthContext(principal="planner"), ask).task_id
    store.open_wait(flow, "resume", 0, far, task_id=parent)
    store.signal(_OPERATOR, f"{flow}/resume/1", flow, "resume", 1, {"approve": True})
    return _Round(number=number, flow=flow, base=base, parent=parent)


def _settle(store: Store, contest: _Round) -> None:
    """Answer every wait still waiting and resume every continuation, with no effect."""
    for step in ("open", "signals", "deadline", "resume"):
        wait = store.wait(contest.flow, step)
        if wait.state == "waiting":
            store.signal(_OPERATOR, f"settle/{contest.flow}/{step}/{wait.generation}",
                         contest.flow, step, wait.generation, "settled")
    while listed := store.continuations():
        for continuation in listed:
            store.resume(continuation.flow, continuation.step, continuation.generation, None)


def _quiet(snapshot: Snapshot) -> list[str]:
    """After settling, nothing waits and nothing is left to resume."""
    waiting = [key for key, row in snapshot.tables["waits"].items() if row["state"] == "waiting"]
    unconsumed = [key for key, row in snapshot.tables["wait_continuations"].items()
                  if row["consumed_at"] is None]
    return ([f"waits still waiting after settling: {waiting[:3]}"] if waiting else []) + (
        [f"continuations unconsumed after settling: {unconsumed[:3]}"] if unconsumed else [])


# -- judging the contests ---------------------------------------------------------------------


def _records(started: list[RoundProcess], contest: str, *ops: str
             ) -> Iterator[tuple[RoundProcess, dict[str, Any]]]:
    for process in started:
        for record in process.records:
            if record.get("contest") == contest and record.get("op") in ops:
                yield process, record


def _judge(contest: _Round, started: list[RoundProcess], after: Snapshot,
           winners: Counter[str], acked: set[str]) -> list[str]:
    """Exactly one winner per contest, agreeing with every report; tallies how it was won."""
    killed = any(process.killed for process in started)
    problems: list[str] = []
    for judge in (_judge_open, _judge_signals, _judge_deadline, _judge_resume):
        found, outcome = judge(contest, started, after, killed=killed)
        problems += [f"{judge.__name__.removeprefix('_judge_')}: {p}" for p in found]
        winners[outcome] += 1
    effect = after.tables["wait_continuations"].get((contest.flow, "resume", 1))
    if effect is not None and effect["effect_task_id"] is not None:
        acked.add(effect["effect_task_id"])
    return problems


Judged = tuple[list[str], str]


def _judge_open(contest: _Round, started: list[RoundProcess], after: Snapshot, *,
                killed: bool) -> Judged:
    flow = contest.flow
    generation = current(after, (flow, "open"))
    wait = after.tables["waits"].get((flow, "open", 2))
    winner = None if wait is None else wait["request_id"]
    problems = []
    said = [(p.index, r) for p, r in _records(started, "open", "open_wait", "open_wait_retry")
            if r["result"] == "opened" and not r["replay"]]
    if generation not in (1, 2) or (generation == 2) != (wait is not None):
        problems.append(f"the slot is at generation {generation}, generation 2 is {wait}")
    if len(said) > 1 or any(r["request_id"] != winner for _, r in said):
        problems.append(f"opened by {len(said)} ({said}); the durable winner is {winner}")
    for process, record in _records(started, "open", "open_wait", "open_wait_retry"):
        mine = record["request_id"] == winner
        want = ("opened", 2, record["op"] == "open_wait_retry") if mine else ("stale", 2, False)
        got = (record["result"], record["generation"], record["replay"])
        if got != want:
            problems.append(f"process {process.index} {record['op']} got {got}, expected "
                            f"{want} (winner {winner})")
    for process, record in _records(started, "open", "open_wait_stale", "open_wait_next"):
        if record["result"] == "opened":
            problems.append(f"process {process.index} {record['op']} opened {record}")
    if not said and not killed and winner is None and any(_records(started, "open",
                                                                   "open_wait")):
        problems.append("nobody opened generation 2, though every process lived")
    return problems, "open:opened" if winner is not None else "open:undecided"


def _judge_signals(contest: _Round, started: list[RoundProcess], after: Snapshot, *,
                   killed: bool) -> Judged:
    address = (contest.flow, "signals", 1)
    wait = after.tables["waits"][address]
    receipts = after.tables["wait_receipts"]
    accepted = [key for key, row in receipts.items()
                if (row["flow"], row["step"], row["generation"]) == address
                and row["result"] == "accepted"]
    adopted = (wait["event_principal"], wait["event_id"])
    problems = []
    if wait["state"] not in ("waiting", "signaled") or (
            (wait["state"] == "signaled") != (accepted == [adopted])):
        problems.append(f"wait is {wait['state']} with accepted receipts {accepted}")
    said = [(p.index, r["principal"], r["event_id"])
            for p, r in _records(started, "signals", "signal", "signal_shared")
            if r["result"] == "accepted"]
    if len(said) > 1 or any((principal, event) != adopted for _, principal, event in said):
        problems.append(f"accepted by {said}; the wait adopted {adopted}")
    for process, record in _records(started, "signals", "signal", "signal_shared",
                                    "signal_replay", "signal_conflict"):
        stored = receipts.get((record["principal"], record["event_id"]))
        allowed = {"signal": {"accepted", "closed"},
                   "signal_shared": {"accepted", "closed", "replay"},
                   "signal_replay": {"replay"}, "signal_conflict": {"conflict"}}[record["op"]]
        if record["result"] not in allowed or stored is None \
                or record["recorded"] != stored["result"]:
            problems.append(f"process {process.index} {record['op']} got {record}; "
                            f"the receipt is {stored}")
    if wait["state"] == "waiting" and not killed and any(_records(started, "signals",
                                                                  "signal")):
        problems.append("no answer was accepted, though every process lived")
    return problems, f"signals:{'accepted' if wait['state'] == 'signaled' else 'undecided'}"


def _judge_deadline(contest: _Round, started: list[RoundProcess], after: Snapshot, *,
                    killed: bool) -> Judged:
    address = (contest.flow, "deadline", 1)
    wait = after.tables["waits"][address]
    late = [row for row in after.tables["wait_receipts"].values()
            if (row["flow"], row["step"], row["generation"]) == address]
    too_late = [(row["principal"], row["event_id"]) for row in late
                if row["result"] == "too_late"]
    problems = []
    if any(row["result"] not in ("too_late", "closed") for row in late):
        problems.append(f"an answer at the deadline was recorded {[r['result'] for r in late]}")
    reports = list(_records(started, "deadline", "signal_at_deadline", "expire", "expire_due"))
    allowed = {"signal_at_deadline": ("too_late", "closed"), "expire": ("timed_out", "closed"),
               "expire_due": ("swept",)}
    problems += [f"process {p.index} {r['op']} at the deadline got {r['result']}"
                 for p, r in reports if r["result"] not in allowed[r["op"]]]
    decided = [(p.index, r) for p, r in reports
               if r["result"] == "too_late" or int(r.get("timed_out", 0)) > 0]
    swept = [r for _, r in decided if r["result"] != "too_late"]
    if reports and wait["state"] != "timed_out":
        problems.append(f"the wait is {wait['state']} after {len(reports)} calls at its deadline")
    if len(too_late) > 1 or len(decided) > 1 or (too_late and swept):
        problems.append(f"decided more than once: too_late receipts {too_late}, reports "
                        f"{decided}")
    for index, record in decided:
        if record["result"] == "too_late" and (record["principal"],
                                               record["event_id"]) not in too_late:
            problems.append(f"process {index} said too_late; the receipts say {too_late}")
    if wait["state"] == "timed_out" and not decided and not killed:
        problems.append("timed out, but no process said it decided it, though all lived")
    if wait["state"] != "timed_out":
        return problems, "deadline:undecided"
    return problems, "deadline:too_late" if too_late else "deadline:swept"


def _judge_resume(contest: _Round, started: list[RoundProcess], after: Snapshot, *,
                  killed: bool) -> Judged:
    address = (contest.flow, "resume", 1)
    row: Row = after.tables["wait_continuations"][address]
    task_id = row["effect_task_id"]
    reports = list(_records(started, "resume", "resume", "resume_again"))
    resumed = [(p.index, r) for p, r in reports if r["result"] == "resumed"]
    children = [key for key, task in after.tasks.items()
                if task["parent_task_id"] == contest.parent]
    problems = []
    if reports and row["consumed_at"] is None:
        problems.append(f"unconsumed after {len(reports)} resumes")
    if children != ([] if task_id is None else [task_id]) or row["effects"] > 1:
        problems.append(f"effect {task_id} ({row['effects']} effects), follow-ups {children}")
    if len(resumed) > 1:
        problems.append(f"resumed by {len(resumed)} processes: {resumed}")
    namespace = follow_up_namespace(WaitAddress(*address))
    for index, record in resumed:
        named = None if record["effect"] is None else task_id_for(namespace, record["effect"])
        if named != task_id:
            problems.append(f"process {index} resumed with effect {record['effect']}; the "
                            f"durable effect is {task_id}")
    for process, record in reports:
        if (record["task_id"], record["kind"]) != (task_id, "signal"):
            problems.append(f"process {process.index} {record['op']} reported {record}; the "
                            f"effect is {task_id}")
    if reports and not resumed and not killed:
        problems.append("consumed, but no process said it resumed, though all lived")
    if row["consumed_at"] is None:
        return problems, "resume:undecided"
    return problems, f"resume:{'follow-up' if task_id else 'no effect'}"
