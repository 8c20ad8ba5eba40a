"""Waits in the randomized audit (SPEC §5, §8): operations, a model of their outcomes, checks.

Importing this module registers waits into the simulation's shared tables:

- ``SNAPSHOT_TABLES``: slots, generations, signal receipts, and continuations with their
  effects;
- ``OPERATIONS``: ``open_wait`` (the expected generation, a stale one, a retried request id),
  signals (to the current generation, early, stale, exactly at or just before a deadline,
  replays, conflicts, the same event id from another principal), expiry of one generation and
  the sweep, resumes with and without the standard follow-up effect, and listing (and
  resuming) the continuations a restarted process finds;
- ``CHECKS``: receipts and ended waits never change, slots never go back, a continuation
  appears exactly when its wait ends, a consumed continuation stays consumed with its one
  effect.

Each operation holds its call to a model (``WaitModel``): the wait tables as SPEC §5 says
they must be after the call, built from the snapshot before it and the decision time, and
compared with what the databases hold row by row, column by column, together with the time
high-water (moved to the decision time by a call that writes; left alone by one that writes
nothing: a replay, a conflict, a stale registration, a sweep with nothing due). The model is
written from the SPEC, not from ``postroom.waits``, so the two can disagree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from postroom.errors import InvalidInput, NotFound, PayloadCollision
from postroom.models import (
    ContinuationKind,
    ExpireResult,
    FollowUp,
    OpenResult,
    ResumeResult,
    SignalResult,
    WaitState,
)
from postroom.transitions import reply_id_for
from postroom.validation import canonical_json, task_id_for
from postroom.waits import WaitAddress, follow_up_namespace
from tests.harness.simulation.chains import admit, chain_of, state_of, stored_or_default
from tests.harness.simulation.checks import CHECKS, KEEPERS, Transition
from tests.harness.simulation.operations import (
    OPERATIONS,
    Action,
    Operation,
    Step,
)
from tests.harness.simulation.world import (
    PRINCIPALS,
    QUEUES,
    SNAPSHOT_TABLES,
    Row,
    Snapshot,
    Table,
    World,
)

__all__ = ["SLOTS", "WAIT_CHECKS", "WAIT_OPERATIONS", "WAIT_TABLES", "WaitModel"]

#: The slots the simulation works on: few, so that generations pile up and calls collide.
SLOTS: tuple[tuple[str, str], ...] = (
    ("order-1", "approval"),
    ("order-1", "shipping"),
    ("order-2", "approval"),
    ("注文-3", "承認"),
)

Address = tuple[str, str, int]
Slot = tuple[str, str]

WAIT_TABLES: list[Table] = [
    Table("wait_slots", "snapshot_wait_slots", ("flow", "step"), "store"),
    Table("waits", "snapshot_waits", ("flow", "step", "generation"), "store"),
    Table("wait_receipts", "snapshot_wait_receipts", ("principal", "event_id"), "store"),
    Table("wait_continuations", "snapshot_wait_continuations",
          ("flow", "step", "generation"), "store"),
]
_NAMES = tuple(table.name for table in WAIT_TABLES)

#: The continuation kind each terminal wait state is written with.
_KIND = {WaitState.SIGNALED.value: ContinuationKind.SIGNAL.value,
         WaitState.TIMED_OUT.value: ContinuationKind.TIMEOUT.value}

#: Just before a deadline: the last moment a signal is still accepted.
_JUST_BEFORE = 0.001


# -- reading a snapshot -----------------------------------------------------------------------


def _slots(snapshot: Snapshot) -> Mapping[Slot, Row]:
    return snapshot.tables["wait_slots"]


def _waits(snapshot: Snapshot) -> Mapping[Address, Row]:
    return snapshot.tables["waits"]


def _receipts(snapshot: Snapshot) -> Mapping[tuple[str, str], Row]:
    return snapshot.tables["wait_receipts"]


def _continuations(snapshot: Snapshot) -> Mapping[Address, Row]:
    return snapshot.tables["wait_continuations"]


def current(snapshot: Snapshot, slot: Slot) -> int:
    """The slot's current generation (0 before its first wait)."""
    row = _slots(snapshot).get(slot)
    return 0 if row is None else int(row["generation"])


def _openable(snapshot: Snapshot, slot: Slot) -> bool:
    """Whether the slot's next generation may open: none yet, or ended and consumed."""
    generation = current(snapshot, slot)
    if generation == 0:
        return True
    continuation = _continuations(snapshot).get((*slot, generation))
    return continuation is not None and continuation["consumed_at"] is not None


def _waiting(snapshot: Snapshot) -> list[Address]:
    return [address for address, row in _waits(snapshot).items() if row["state"] == "waiting"]


# -- the model --------------------------------------------------------------------------------


class WaitModel:
    """The databases as a call must leave them: the snapshot before it plus the call's writes.

    Only the wait tables are modelled row by row; every other table must be left as it was,
    except for the follow-up tasks a resume enqueues (``follow_ups``, each held to its parent
    and effect) and the replies of those born terminal.
    """

    def __init__(self, step: Step) -> None:
        self.step = step
        self.now = step.now
        self.tables: dict[str, dict[Any, Row]] = {
            name: dict(step.before.tables[name]) for name in _NAMES}
        self.writes = False
        self.follow_ups: dict[str, tuple[Row, FollowUp]] = {}

    def wait(self, address: Address) -> Row | None:
        """The generation as the model holds it now."""
        return self.tables["waits"].get(address)

    def open(self, address: Address, *, deadline: float, task_id: str | None,
             request_id: str | None) -> None:
        """The slot moves to ``address``'s generation, which is inserted, waiting."""
        flow, step, generation = address
        self.tables["wait_slots"][(flow, step)] = {"flow": flow, "step": step,
                                                   "generation": generation}
        self.tables["waits"][address] = {
            "flow": flow, "step": step, "generation": generation, "state": "waiting",
            "deadline": deadline, "task_id": task_id, "request_id": request_id,
            "opened_at": self.now, "ended_at": None, "event_principal": None, "event_id": None}
        self.writes = True

    def receipt(self, principal: str, event_id: str, address: Address, value: str,
                result: SignalResult) -> None:
        """A new receipt for the event."""
        flow, step, generation = address
        self.tables["wait_receipts"][(principal, event_id)] = {
            "principal": principal, "event_id": event_id, "flow": flow, "step": step,
            "generation": generation, "value": value, "result": result.value,
            "received_at": self.now}
        self.writes = True

    def end(self, address: Address, state: WaitState, *, value: str | None = None,
            event: tuple[str, str] | None = None) -> None:
        """The generation ends now, with its one continuation."""
        wait = self.tables["waits"][address]
        self.tables["waits"][address] = {
            **wait, "state": state.value, "ended_at": self.now,
            "event_principal": None if event is None else event[0],
            "event_id": None if event is None else event[1]}
        flow, step, generation = address
        self.tables["wait_continuations"][address] = {
            "flow": flow, "step": step, "generation": generation, "kind": _KIND[state.value],
            "value": value, "created_at": self.now, "consumed_at": None, "effects": 0,
            "effect_kind": None, "effect_task_id": None, "applied_at": None}
        self.writes = True

    def consume(self, address: Address, follow_up: tuple[str, Row, FollowUp] | None) -> None:
        """The continuation is consumed now, with its one effect: no task, or the follow-up
        ``(task_id, parent task row, effect)``."""
        row = self.tables["wait_continuations"][address]
        task_id = None if follow_up is None else follow_up[0]
        self.tables["wait_continuations"][address] = {
            **row, "consumed_at": self.now, "effects": 1,
            "effect_kind": "none" if task_id is None else "task", "effect_task_id": task_id,
            "applied_at": self.now}
        if follow_up is not None:
            self.follow_ups[follow_up[0]] = follow_up[1:]
        self.writes = True

    def check(self) -> None:
        """Raise ``Broken`` unless the databases hold exactly what the model says."""
        step = self.step
        before, after = step.before, step.after()
        problems: list[str] = []
        for name, expected in self.tables.items():
            problems += _differences(name, expected, after.tables[name])
        for name, rows in after.tables.items():
            if name in self.tables:
                continue
            was = before.tables[name]
            if name == "tasks":
                added = rows.keys() - was.keys()
                if added != self.follow_ups.keys():
                    problems.append(f"tasks added {sorted(added)}, expected follow-ups "
                                    f"{sorted(self.follow_ups)}")
                was = {**was, **{key: rows[key] for key in added}}
            elif name == "chains":  # each follow-up admitted counts in its chain
                chains = {key: dict(row) for key, row in was.items()}
                for parent, effect in self.follow_ups.values():
                    root = parent["root_task_id"] or parent["task_id"]
                    if root not in chains:  # a root alone gets its row with its first child
                        found = stored_or_default(before, root, self.step.world.settings)
                        if found is not None:
                            chains[root] = dict(found)
                    chain = chains.get(root)
                    if chain is not None:
                        admit(chain, deadline=_follow_up_deadline(parent, effect),
                              hops=parent["hops"] + 1, now=self.now)
                was = chains
            elif name == "replies":
                born = {reply_id_for(task_id) for task_id in self.follow_ups}
                was = {**was, **{key: rows[key] for key in rows.keys() - was.keys()
                                 if key in born}}
            problems += _differences(name, was, rows)
        high_water = self.now if self.writes else before.high_water
        if after.high_water != high_water:
            problems.append(f"time high-water is {after.high_water}, expected {high_water} "
                            f"({'a write' if self.writes else 'nothing written'})")
        step.expect(not problems, "; ".join(problems[:6]))
        for task_id, (parent, effect) in self.follow_ups.items():
            _check_follow_up(step, task_id, parent, effect)


def _differences(name: str, expected: Mapping[Any, Row], actual: Mapping[Any, Row]
                 ) -> list[str]:
    found = []
    for key in sorted(expected.keys() | actual.keys(), key=repr):
        want, have = expected.get(key), actual.get(key)
        if want == have:
            continue
        if want is None or have is None:
            found.append(f"{name} {key}: expected {want}, found {have}")
        else:
            columns = sorted(c for c in want.keys() | have.keys() if want.get(c) != have.get(c))
            found.append(f"{name} {key}: " + ", ".join(
                f"{c} expected {want.get(c)!r}, found {have.get(c)!r}" for c in columns))
    return found


def decide_open(before: Snapshot, slot: Slot, expected: int, *, deadline: float,
                request_id: str | None, task_id: str | None) -> tuple[str, int]:
    """What ``open_wait`` must answer: ``(outcome, generation)``.

    Outcomes are the ``OpenResult`` values, ``replay`` (a retried request id, answered as
    its first call was), ``collision`` (a request id reused with other arguments) and
    ``not_found`` (a task_id that is not stored).
    """
    if request_id is not None:
        for address, row in _waits(before).items():
            if address[:2] == slot and row["request_id"] == request_id:
                asked = (address[2] - 1, row["deadline"], row["task_id"])
                same = asked == (expected, deadline, task_id)
                return ("replay" if same else "collision"), address[2]
    generation = current(before, slot)
    if generation != expected:
        return OpenResult.STALE.value, generation
    if generation > 0:
        if _waits(before)[(*slot, generation)]["state"] == "waiting":
            return OpenResult.BUSY.value, generation
        if not _openable(before, slot):
            return OpenResult.PENDING_CONTINUATION.value, generation
    if task_id is not None and task_id not in before.tasks:
        return "not_found", generation
    return OpenResult.OPENED.value, generation + 1


def decide_signal(before: Snapshot, address: Address, now: float) -> SignalResult:
    """The outcome of a never-seen event for ``address`` at decision time ``now``."""
    generation = current(before, (address[0], address[1]))
    if address[2] > generation:
        return SignalResult.UNKNOWN_WAIT
    if address[2] < generation:
        return SignalResult.STALE_GENERATION
    wait = _waits(before)[address]
    if wait["state"] != "waiting":
        return SignalResult.CLOSED
    return SignalResult.ACCEPTED if now < wait["deadline"] else SignalResult.TOO_LATE


def decide_expire(wait: Row | None, now: float) -> ExpireResult:
    """The outcome of expiring one generation at decision time ``now``."""
    if wait is None:
        return ExpireResult.UNKNOWN_WAIT
    if wait["state"] != "waiting":
        return ExpireResult.CLOSED
    return ExpireResult.NOT_DUE if now < wait["deadline"] else ExpireResult.TIMED_OUT


# -- choosing arguments -----------------------------------------------------------------------


def _pick(world: World, items: Sequence[Any], preferred: Sequence[Any] = (),
          chance: float = 0.8) -> Any:
    """One of ``preferred`` with probability ``chance`` (if any), else one of ``items``."""
    if preferred and world.rng.random() < chance:
        return world.rng.choice(preferred)
    return world.rng.choice(items) if items else None


def _decision_time(world: World) -> float:
    return max(world.clock.now(), world.last.high_water)


def _deadline(world: World) -> float:
    """Soon, later, much later, or (rarely) already passed."""
    now, rng = _decision_time(world), world.rng
    low, high = rng.choice(((-10.0, 0.0), (1.0, 30.0), (1.0, 30.0), (30.0, 600.0),
                            (600.0, 3000.0)))
    return now + rng.uniform(low, high)


def _later(world: World) -> None:
    """A repeat often comes some time after the original: then a repeat that moved the time
    high-water (which only a write may do) would show."""
    if world.rng.random() < 0.5:
        world.clock.advance(world.rng.uniform(0.1, 30.0))


def _fresh(world: World, prefix: str) -> str:
    world.counter += 1
    return f"{prefix}-{world.counter}"


def _value(world: World) -> Any:
    """A signal's value: any JSON, null and non-ASCII text included."""
    rng = world.rng
    return rng.choice((None, True, rng.randint(-(10**6), 10**6), rng.uniform(-1, 1), "yes",
                       "承認", {"approve": rng.choice((True, False)), "by": "ü"},
                       [1, {"n": rng.randint(0, 9)}]))


def _parent(world: World) -> str | None:
    """A wait's task_id: mostly a stored task, sometimes none, rarely one never stored."""
    roll = world.rng.random()
    if roll < 0.03:
        return "no-such-task"
    if roll < 0.4 or not world.last.tasks:
        return None
    return str(world.rng.choice(sorted(world.last.tasks)))


# -- open_wait --------------------------------------------------------------------------------


def _open(slot: Slot, expected: int, deadline: float, request_id: str | None,
          task_id: str | None) -> Action:
    def act(step: Step) -> str:
        world, model = step.world, WaitModel(step)
        outcome, generation = decide_open(step.before, slot, expected, deadline=deadline,
                                          request_id=request_id, task_id=task_id)
        label = f"open_wait {slot} expecting {expected} (request {request_id!r})"
        try:
            opening = world.store.open_wait(*slot, expected, deadline, request_id=request_id,
                                            task_id=task_id)
        except PayloadCollision:
            step.expect(outcome == "collision", f"{label}: PayloadCollision, expected {outcome}")
            model.check()
            return "collision"
        except NotFound:
            step.expect(outcome == "not_found", f"{label}: NotFound, expected {outcome}")
            model.check()
            return "not_found"
        answered = ("replay" if opening.replay else opening.result.value, opening.generation)
        step.expect(answered == (outcome, generation),
                    f"{label}: answered {answered}, expected {(outcome, generation)}")
        if outcome == OpenResult.OPENED.value:
            model.open((*slot, generation), deadline=deadline, task_id=task_id,
                       request_id=request_id)
        model.check()
        return outcome

    return act


def plan_open_wait(world: World) -> Action:
    """Open the next generation of a slot with the right expected generation."""
    before = world.last
    slot = _pick(world, SLOTS, [s for s in SLOTS if _openable(before, s)], chance=0.7)
    request_id = _fresh(world, "ask") if world.rng.random() < 0.6 else None
    return _open(slot, current(before, slot), _deadline(world), request_id, _parent(world))


def plan_open_wait_stale(world: World) -> Action:
    """A registration that expects a generation the slot is not at."""
    slot = _pick(world, SLOTS)
    generation = current(world.last, slot)
    expected = world.rng.choice([g for g in (generation - 1, generation + 1, generation + 3)
                                 if g >= 0])
    request_id = _fresh(world, "ask") if world.rng.random() < 0.5 else None
    return _open(slot, expected, _deadline(world), request_id, _parent(world))


def plan_open_wait_retry(world: World) -> Action | None:
    """A registration retried with its request id (its answer was lost), or the request id
    reused with another deadline."""
    asked = [(address, row) for address, row in _waits(world.last).items()
             if row["request_id"] is not None]
    if not asked:
        return None
    address, row = world.rng.choice(asked)
    deadline = row["deadline"] if world.rng.random() < 0.8 else row["deadline"] + 1.0
    _later(world)
    return _open(address[:2], address[2] - 1, deadline, row["request_id"], row["task_id"])


# -- signal -----------------------------------------------------------------------------------


def _signal(principal: str, event_id: str, address: Address, value: Any) -> Action:
    body = canonical_json(value)

    def act(step: Step) -> str:
        world, model, before = step.world, WaitModel(step), step.before
        stored = _receipts(before).get((principal, event_id))
        label = f"signal {principal}/{event_id} to {address}"
        receipt = world.store.signal(world.auth(principal), event_id, *address, value)
        if stored is not None:
            held = (stored["flow"], stored["step"], stored["generation"], stored["value"])
            result = SignalResult.REPLAY if held == (*address, body) else SignalResult.CONFLICT
            answered = (receipt.result, receipt.recorded.value, receipt.received_at,
                        (receipt.flow, receipt.step, receipt.generation))
            step.expect(answered == (result, stored["result"], stored["received_at"],
                                     held[:3]),
                        f"{label}: answered {answered}; the event was recorded "
                        f"{stored['result']} at {stored['received_at']} for {held[:3]}")
            model.check()
            if result is SignalResult.CONFLICT:
                return "conflict"
            opened_since = (stored["result"] == SignalResult.UNKNOWN_WAIT
                            and (*held[:3],) in _waits(before))
            return f"replay:{stored['result']}" + (":opened_since" if opened_since else "")
        result = decide_signal(before, address, step.now)
        step.expect((receipt.result, receipt.recorded, receipt.received_at)
                    == (result, result, step.now),
                    f"{label}: answered {receipt.result}/{receipt.recorded} at "
                    f"{receipt.received_at}; expected {result} at {step.now}")
        model.receipt(principal, event_id, address, body, result)
        if result is SignalResult.ACCEPTED:
            model.end(address, WaitState.SIGNALED, value=body, event=(principal, event_id))
        elif result is SignalResult.TOO_LATE:
            model.end(address, WaitState.TIMED_OUT)
        model.check()
        return result.value

    return act


def _new_signal(world: World, address: Address) -> Action:
    return _signal(world.rng.choice(PRINCIPALS), _fresh(world, "ev"), address, _value(world))


def plan_signal(world: World) -> Action:
    """A new answer, mostly to a slot's current generation while it waits."""
    before = world.last
    slot = _pick(world, SLOTS, [a[:2] for a in _waiting(before)], chance=0.85)
    return _new_signal(world, (*slot, max(current(before, slot), 1)))


def plan_signal_early(world: World) -> Action:
    """An answer to a generation that has not opened yet (it may open later)."""
    slot = _pick(world, SLOTS)
    return _new_signal(world, (*slot, current(world.last, slot) + world.rng.choice((1, 1, 2))))


def plan_signal_stale(world: World) -> Action | None:
    """An answer to a generation older than the slot's current one."""
    slots = [slot for slot in SLOTS if current(world.last, slot) >= 2]
    if not slots:
        return None
    slot = world.rng.choice(slots)
    return _new_signal(world, (*slot, world.rng.randint(1, current(world.last, slot) - 1)))


def plan_signal_at_deadline(world: World) -> Action | None:
    """The clock reaches a waiting generation's deadline (or the moment just before it),
    and an answer arrives then: at the deadline it is too late, just before it is not."""
    now = _decision_time(world)
    due = [address for address in _waiting(world.last)
           if _waits(world.last)[address]["deadline"] >= now]
    if not due:
        return None
    address = world.rng.choice(sorted(due))
    deadline = float(_waits(world.last)[address]["deadline"])
    before = deadline - _JUST_BEFORE
    world.clock.set(before if before >= now and world.rng.random() < 0.3 else deadline)
    return _new_signal(world, address)


def _recorded(world: World) -> list[Row]:
    return list(_receipts(world.last).values())


def plan_signal_replay(world: World) -> Action | None:
    """An event sent again unchanged; often an early one whose generation has opened since."""
    receipts = _recorded(world)
    if not receipts:
        return None
    opened = [r for r in receipts if r["result"] == SignalResult.UNKNOWN_WAIT
              and (r["flow"], r["step"], r["generation"]) in _waits(world.last)]
    row = _pick(world, receipts, opened, chance=0.4)
    _later(world)
    return _signal(row["principal"], row["event_id"],
                   (row["flow"], row["step"], row["generation"]), json.loads(row["value"]))


def plan_signal_conflict(world: World) -> Action | None:
    """An event id sent again with another body: another value or another generation."""
    receipts = _recorded(world)
    if not receipts:
        return None
    row = world.rng.choice(receipts)
    address = (row["flow"], row["step"], row["generation"])
    value = json.loads(row["value"])
    if world.rng.random() < 0.7:
        value = {"changed": _fresh(world, "value")}
    else:
        address = (row["flow"], row["step"], row["generation"] + 1)
    _later(world)
    return _signal(row["principal"], row["event_id"], address, value)


def plan_signal_other_principal(world: World) -> Action | None:
    """An event id another principal used, with the same body: a different event."""
    receipts = _recorded(world)
    if not receipts:
        return None
    row = world.rng.choice(receipts)
    other = world.rng.choice([p for p in PRINCIPALS if p != row["principal"]])
    return _signal(other, row["event_id"], (row["flow"], row["step"], row["generation"]),
                   json.loads(row["value"]))


# -- expiry -----------------------------------------------------------------------------------


def plan_expire(world: World) -> Action:
    """Expire one generation: mostly a waiting one (often once its deadline has come)."""
    before, rng = world.last, world.rng
    waiting = _waiting(before)
    known = sorted(_waits(before))
    unknown = [(*slot, current(before, slot) + 1) for slot in SLOTS]
    address = _pick(world, known + unknown, waiting, chance=0.7)
    row = _waits(before).get(address)
    if row is not None and row["state"] == "waiting" and rng.random() < 0.4:
        world.clock.set(max(_decision_time(world), row["deadline"] + rng.uniform(0.0, 5.0)))

    def act(step: Step) -> str:
        model = WaitModel(step)
        expected = decide_expire(model.wait(address), step.now)
        result = step.world.store.expire(*address)
        step.expect(result is expected, f"expire {address}: {result}, expected {expected}")
        if result is ExpireResult.TIMED_OUT:
            model.end(address, WaitState.TIMED_OUT)
        model.check()
        return result.value

    return act


def plan_expire_due(world: World) -> Action:
    """The sweeper times out every waiting generation whose deadline has come (often the
    clock has just passed the earliest one)."""
    deadlines = sorted(_waits(world.last)[a]["deadline"] for a in _waiting(world.last))
    if deadlines and world.rng.random() < 0.5:
        world.clock.set(max(_decision_time(world), deadlines[0] + world.rng.uniform(0.0, 60.0)))

    def act(step: Step) -> str:
        model = WaitModel(step)
        due = sorted(a for a in _waiting(step.before)
                     if _waits(step.before)[a]["deadline"] <= step.now)
        count = step.world.store.expire_due()
        step.expect(count == len(due), f"expire_due timed out {count}; {len(due)} were due")
        for address in due:
            model.end(address, WaitState.TIMED_OUT)
        model.check()
        return "timed_out" if count else "idle"

    return act


# -- resume and continuations -----------------------------------------------------------------


def _effect(world: World, address: Address, *, standard: float = 0.75) -> FollowUp | None:
    """The standard effect (a follow-up task) with probability ``standard``, else none."""
    if world.rng.random() >= standard:
        return None
    rng = world.rng
    return FollowUp(message_id=rng.choice(("next", "continue")),
                    payload={"after": list(address), "n": rng.randint(0, 99)},
                    queue=rng.choice((None, *QUEUES)),
                    deadline=rng.choice((None, _decision_time(world) + rng.uniform(30, 900))))


def _resume_call(step: Step, model: WaitModel, address: Address,
                 effect: FollowUp | None) -> str:
    """Resume ``address`` and hold the answer to ``model``, which it updates."""
    world, before = step.world, step.before
    continuation = model.tables["wait_continuations"].get(address)
    wait = model.wait(address)
    label = f"resume {address} with {'a follow-up' if effect else 'no effect'}"
    expected: str
    if continuation is None:
        expected = "not_found"
    elif continuation["consumed_at"] is not None:
        expected = ResumeResult.REPLAY.value
    elif effect is not None and (wait is None or wait["task_id"] is None):
        expected = "invalid"
    elif effect is not None and wait is not None and wait["task_id"] not in before.tasks:
        expected = "not_found"
    else:
        expected = ResumeResult.RESUMED.value
    try:
        resumption = world.store.resume(*address, effect)
    except NotFound:
        step.expect(expected == "not_found", f"{label}: NotFound, expected {expected}")
        return "not_found"
    except InvalidInput as exc:
        step.expect(expected == "invalid", f"{label}: {exc}, expected {expected}")
        return "invalid"
    assert continuation is not None and wait is not None
    follow_up = None
    if expected == ResumeResult.RESUMED.value and effect is not None:
        follow_up = task_id_for(follow_up_namespace(WaitAddress(*address)), effect.message_id)
    task_id = follow_up if expected == ResumeResult.RESUMED.value \
        else continuation["effect_task_id"]
    answered = (resumption.result.value, resumption.kind.value, resumption.task_id)
    step.expect(answered == (expected, continuation["kind"], task_id),
                f"{label}: answered {answered}, expected "
                f"{(expected, continuation['kind'], task_id)}")
    if expected == ResumeResult.RESUMED.value:
        model.consume(address, None if follow_up is None or effect is None
                      else (follow_up, before.tasks[wait["task_id"]], effect))
    return expected


def _follow_up_deadline(parent: Row, effect: FollowUp) -> float:
    return float(parent["deadline"] if effect.deadline is None else effect.deadline)


def _check_follow_up(step: Step, task_id: str, parent: Row, effect: FollowUp) -> None:
    """The follow-up task: its parent, one hop further, its queue, deadline and state."""
    row = step.after().tasks.get(task_id)
    step.expect(row is not None, f"the follow-up {task_id} of a resume is not stored")
    assert row is not None
    deadline = _follow_up_deadline(parent, effect)
    hops = parent["hops"] + 1
    # Born in its parent's chain: cancelled with it, or within its hop, task and cost budgets.
    chain = chain_of(step.before, parent["task_id"], step.world.settings)
    step.expect(chain is not None, f"the parent {parent['task_id']} of {task_id} has no chain")
    assert chain is not None
    state = state_of(admit(dict(chain), deadline=deadline, hops=hops, now=step.now))
    queue = parent["queue"] if effect.queue is None else effect.queue
    found = (row["parent_task_id"], row["hops"], row["deadline"], row["queue"], row["state"])
    want = (parent["task_id"], hops, deadline, queue, state)
    step.expect(found == want, f"follow-up {task_id} is {found}, expected {want}")
    step.world.acked.add(task_id)


def _resume(address: Address, effect: FollowUp | None) -> Action:
    def act(step: Step) -> str:
        model = WaitModel(step)
        outcome = _resume_call(step, model, address, effect)
        model.check()
        return outcome

    return act


def plan_resume(world: World) -> Action:
    """Resume a continuation: mostly an unconsumed one, with the standard effect or none."""
    before = world.last
    continuations = _continuations(before)
    unconsumed = sorted(a for a, row in continuations.items() if row["consumed_at"] is None)
    others = sorted(continuations) + _waiting(before) + [(*SLOTS[0], 999)]
    address = _pick(world, others, unconsumed, chance=0.85)
    wait = _waits(before).get(address)
    has_parent = wait is not None and wait["task_id"] is not None
    return _resume(address, _effect(world, address, standard=0.75 if has_parent else 0.1))


def plan_resume_replay(world: World) -> Action | None:
    """Resume a consumed continuation again, with either effect: no second effect."""
    consumed = sorted(a for a, row in _continuations(world.last).items()
                      if row["consumed_at"] is not None)
    if not consumed:
        return None
    address = world.rng.choice(consumed)
    return _resume(address, _effect(world, address, standard=0.5))


def _check_listing(step: Step, limit: int) -> list[Address]:
    """List unconsumed continuations; they must be the model's, oldest first."""
    before = step.before
    rows = sorted((row for row in _continuations(before).values() if row["consumed_at"] is None),
                  key=lambda r: (r["created_at"], r["flow"], r["step"], r["generation"]))[:limit]
    listed = step.world.store.continuations(limit=limit)
    found = [(c.flow, c.step, c.generation, c.kind.value, c.value, c.task_id, c.created_at,
              c.consumed_at) for c in listed]
    want = [(r["flow"], r["step"], r["generation"], r["kind"],
             None if r["value"] is None else json.loads(r["value"]),
             _waits(before)[(r["flow"], r["step"], r["generation"])]["task_id"],
             r["created_at"], None) for r in rows]
    step.expect(found == want, f"continuations(limit={limit}) listed {found[:3]}..., "
                               f"expected {want[:3]}...")
    return [(r["flow"], r["step"], r["generation"]) for r in rows]


def plan_continuations(world: World) -> Action:
    """A process (usually just restarted) lists what is left to resume."""
    restart = world.rng.random() < 0.7
    limit = world.rng.choice((1, 3, 100))

    def act(step: Step) -> str:
        if restart:
            step.world.restart()
        listed = _check_listing(step, limit)
        WaitModel(step).check()
        return f"listed_{min(len(listed), 3)}{'+' if len(listed) > 3 else ''}"

    return act


def plan_recover(world: World) -> Action:
    """A restarted process lists the unconsumed continuations and resumes every one."""

    def act(step: Step) -> str:
        world = step.world
        world.restart()
        model = WaitModel(step)
        listed = _check_listing(step, 100)
        for address in listed:
            wait = _waits(step.before)[address]
            effect = _effect(world, address, standard=0.9 if wait["task_id"] else 0.0)
            _resume_call(step, model, address, effect)
        model.check()
        return "resumed" if listed else "idle"

    return act


WAIT_OPERATIONS: list[Operation] = [
    Operation(name="open_wait", weight=10, plan=plan_open_wait),
    Operation(name="open_wait_stale", weight=2, plan=plan_open_wait_stale),
    Operation(name="open_wait_retry", weight=2, plan=plan_open_wait_retry),
    Operation(name="signal", weight=10, plan=plan_signal),
    Operation(name="signal_early", weight=2, plan=plan_signal_early),
    Operation(name="signal_stale", weight=2, plan=plan_signal_stale),
    Operation(name="signal_at_deadline", weight=3, plan=plan_signal_at_deadline),
    Operation(name="signal_replay", weight=4, plan=plan_signal_replay),
    Operation(name="signal_conflict", weight=2, plan=plan_signal_conflict),
    Operation(name="signal_other_principal", weight=2, plan=plan_signal_other_principal),
    Operation(name="expire", weight=3, plan=plan_expire),
    Operation(name="expire_due", weight=3, plan=plan_expire_due),
    Operation(name="resume", weight=8, plan=plan_resume),
    Operation(name="resume_replay", weight=2, plan=plan_resume_replay),
    Operation(name="continuations", weight=2, plan=plan_continuations),
    Operation(name="recover", weight=1, plan=plan_recover),
]


# -- checks between two snapshots -------------------------------------------------------------


def wait_receipts_never_change(before: Snapshot, after: Snapshot, _: Transition
                               ) -> Iterator[str]:
    """A signal receipt, once written, stays exactly as it was."""
    for key, row in _receipts(before).items():
        now = _receipts(after).get(key)
        if now != row:
            yield f"receipt {key} was {row}, now {now}"


def ended_waits_never_change(before: Snapshot, after: Snapshot, _: Transition
                             ) -> Iterator[str]:
    """An ended generation never changes again; a waiting one keeps what it was opened with."""
    fixed = ("deadline", "task_id", "request_id", "opened_at")
    for key, row in _waits(before).items():
        now = _waits(after).get(key)
        if now is None:
            yield f"wait {key} disappeared"
        elif row["state"] != "waiting" and now != row:
            yield f"ended wait {key} changed from {row} to {now}"
        elif any(now[column] != row[column] for column in fixed):
            yield f"wait {key} changed what it was opened with"


def slots_never_go_back(before: Snapshot, after: Snapshot, _: Transition) -> Iterator[str]:
    """A slot's generation only grows."""
    for key, row in _slots(before).items():
        now = _slots(after).get(key)
        if now is None or now["generation"] < row["generation"]:
            yield f"slot {key} went from generation {row['generation']} to " \
                  f"{None if now is None else now['generation']}"


def continuations_come_with_their_end(before: Snapshot, after: Snapshot, _: Transition
                                      ) -> Iterator[str]:
    """A continuation is written exactly when its wait ends: once, of the matching kind."""
    for key, row in _waits(after).items():
        was = _waits(before).get(key)
        if row["state"] == "waiting" or (was is not None and was["state"] != "waiting"):
            continue
        continuation = _continuations(after).get(key)
        if key in _continuations(before):
            yield f"wait {key} ended now, but had a continuation already"
        elif continuation is None or (continuation["kind"], continuation["created_at"]) != (
                _KIND[row["state"]], row["ended_at"]):
            yield f"wait {key} ended {row['state']} at {row['ended_at']} with continuation " \
                  f"{continuation}"
    for key in _continuations(after).keys() - _continuations(before).keys():
        was = _waits(before).get(key)
        if was is not None and was["state"] != "waiting":
            yield f"a continuation appeared for wait {key}, which had ended before"


def consumed_continuations_stay_consumed(before: Snapshot, after: Snapshot, _: Transition
                                         ) -> Iterator[str]:
    """A continuation never changes; once consumed it stays so, with its one effect."""
    for key, row in _continuations(before).items():
        now = _continuations(after).get(key)
        if now is None:
            yield f"continuation {key} disappeared"
        elif row["consumed_at"] is not None and now != row:
            yield f"consumed continuation {key} changed from {row} to {now}"
        elif (now["kind"], now["value"], now["created_at"]) != (
                row["kind"], row["value"], row["created_at"]):
            yield f"continuation {key} changed its kind, value or time"
    for key, row in _continuations(after).items():
        if row["effects"] > 1:
            yield f"continuation {key} has {row['effects']} effects"


def parents_still_needed(snapshot: Snapshot) -> set[str]:
    """The tasks of waits still waiting or with an unconsumed continuation: a resume may
    still enqueue their follow-up, so pruning keeps them."""
    return {row["task_id"] for address, row in _waits(snapshot).items()
            if row["task_id"] is not None
            and _continuations(snapshot).get(address, {}).get("consumed_at") is None}


WAIT_CHECKS = [
    wait_receipts_never_change,
    ended_waits_never_change,
    slots_never_go_back,
    continuations_come_with_their_end,
    consumed_continuations_stay_consumed,
]

SNAPSHOT_TABLES.extend(WAIT_TABLES)
OPERATIONS.extend(WAIT_OPERATIONS)
CHECKS.extend(WAIT_CHECKS)
KEEPERS.append(parents_still_needed)
