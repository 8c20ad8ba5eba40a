"""``postroom scenarios``: the wait scenario suite, kept as data and re-run for real.

``scenarios.json`` holds groups of cases; each case runs on a new SQLite database, step by
step, and each step carries the outcome it must have (``expect``). ``--check`` runs every
step against a real store -- in this process, in fresh subprocesses (``process``), or in a
subprocess that dies with ``os._exit`` at a fault point (``crash``) -- audits the database
after every step, and compares what happened with what the file says. Nothing is read from
an earlier run.

Times in the file are seconds after ``START``; a step's ``at`` sets the caller's clock (the
store still decides with its high-water mark).

Steps (``do``) and what they report:

- ``task``: receive a task named ``name`` (its message id) -> ``{"task", "hops"}``
- ``open_wait``: -> ``{"result", "generation"}`` (+ ``"replay": true``)
- ``signal``: -> ``{"result", "received_at"}`` (+ ``"recorded"`` for a replay or conflict)
- ``expire`` -> ``{"result"}``; ``expire_due`` -> ``{"timed_out"}``
- ``resume``: -> ``{"result", "kind", "follow_up": null | {"parent", "hops"}}``
- ``continuations`` -> ``{"unconsumed": [[flow, step, generation, kind, value], ...]}``
- ``wait`` -> ``{"state", "event", "ended_at"}``; ``state`` -> every wait, receipt,
  continuation and effect, the task counts and the high-water mark
- ``restart``: close and reopen the store -> ``{"unconsumed"}``
- ``process``: run ``step`` in a new interpreter with its own connection -> its report
- ``crash``: run ``step`` in a new interpreter armed to ``os._exit`` at ``point`` ->
  ``{"exit"}``

A refused call reports ``{"error": "<exception class>"}``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postroom import faults, waits
from postroom.audit import audit_database
from postroom.clock import ManualClock
from postroom.errors import InvalidInput, PostroomError
from postroom.models import AuthContext, Envelope, FollowUp
from postroom.store import Store
from tests.harness import queries
from tests.harness.children import Child, Context, step
from tests.support import database_of

__all__ = ["CRASH_EXIT", "START", "Outcome", "check", "crash_points", "load", "run"]

#: The time every scenario starts at (2026-01-01T00:00:00Z); the file counts from it.
START = 1_767_225_600.0
#: The exit code of a process killed at a fault point.
CRASH_EXIT = 73

Step = dict[str, Any]
Report = dict[str, Any]


def load(path: Path | None = None) -> dict[str, Any]:
    """The scenario file (``scenarios.json`` beside this module by default)."""
    if path is None:
        text = Path(__file__).with_name("scenarios.json").read_text("utf-8")
    else:
        text = path.read_text("utf-8")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InvalidInput("file", f"is not JSON: {exc}") from None
    groups = document.get("groups") if isinstance(document, dict) else None
    if not isinstance(groups, list) or not all(
            isinstance(group, dict) and isinstance(group.get("name"), str)
            and ("steps" in group or "cases" in group) for group in groups):
        raise InvalidInput("file", 'must be an object whose "groups" is a list of groups, '
                                   'each with a "name" and "steps" or "cases"')
    checked: dict[str, Any] = document
    return checked


@dataclass
class Outcome:
    """What one case did: a report per step, and the steps that differed from the file."""

    group: str
    case: str
    reports: list[Report] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def cases(document: dict[str, Any]) -> Iterator[tuple[str, str, list[Step]]]:
    """``(group, case, steps)`` for every case in the file, in order."""
    for group in document["groups"]:
        if "steps" in group:
            yield group["name"], group["name"], group["steps"]
        for case in group.get("cases", []):
            yield group["name"], case["name"], case["steps"]


def run(document: dict[str, Any], *, progress: Callable[[Outcome], None] | None = None,
        folder: Path | None = None) -> list[Outcome]:
    """Run every case on a new database and compare each step with its ``expect``."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="postroom-scenarios-") as scratch:
        root = folder or Path(scratch)
        for index, (group, name, steps) in enumerate(cases(document)):
            outcome = _Case(f"sqlite:///{root / f'case-{index}.db'}").run(group, name, steps)
            outcomes.append(outcome)
            if progress is not None:
                progress(outcome)
    return outcomes


def crash_points(document: dict[str, Any]) -> set[str]:
    """Every fault point some ``crash`` step of the file kills a process at."""
    return {step["point"] for _, _, steps in cases(document) for step in steps
            if step["do"] == "crash"}


def check(document: dict[str, Any], outcomes: list[Outcome]) -> list[str]:
    """Every problem: mismatched steps, and wait fault points no crash step covers."""
    problems = [f"{o.group}/{o.case}: {m}" for o in outcomes for m in o.mismatches]
    wait_operations = {op.name for op in waits.OPERATIONS}
    registered = {p.name for p in faults.registered()
                  if p.name.split(".", 1)[0] in wait_operations}
    problems += [f"fault point {name} has no crash step"
                 for name in sorted(registered - crash_points(document))]
    return problems


# -- running one case -------------------------------------------------------------------------


def _offset(when: float | None) -> float | int | None:
    if when is None:
        return None
    delta = round(when - START, 6)
    return int(delta) if delta == int(delta) else delta


class _Case:
    def __init__(self, url: str) -> None:
        self.url = url
        self.clock = ManualClock(START)
        self.store = Store.open(url, clock=self.clock)
        self.tasks: dict[str, str] = {}  # name -> task_id

    def run(self, group: str, name: str, steps: list[Step]) -> Outcome:
        outcome = Outcome(group, name)
        try:
            for index, step in enumerate(steps):
                report = self.step(step)
                outcome.reports.append(report)
                where = f"step {index + 1} ({step['do']})"
                if "expect" in step and report != step["expect"]:
                    outcome.mismatches.append(f"{where}: expected {json.dumps(step['expect'])}"
                                              f", got {json.dumps(report)}")
                violations = audit_database(database_of(self.store))
                if violations:
                    outcome.mismatches.append(
                        f"{where}: audit: {'; '.join(str(v) for v in violations)}")
        finally:
            self.store.close()
        return outcome

    def step(self, step: Step) -> Report:
        if "at" in step:
            self.clock.set(START + step["at"])
        kind = step["do"]
        if kind == "restart":
            self.store.close()
            self.store = Store.open(self.url, clock=self.clock)
            return {"unconsumed": len(self.store.continuations(limit=10_000))}
        if kind == "state":
            return _state(self.store, self.tasks)
        if kind in ("process", "crash"):
            return self._child(step)
        return perform(self.store, step["do"], step, self.tasks)

    def _child(self, step: Step) -> Report:
        """Run ``step["step"]`` in a child with its own connection (armed to crash at
        ``step["point"]`` for a ``crash`` step)."""
        with Child(name=f"scenario {step['do']}", store=self.url, now=self.clock.now(),
                   modules=[__name__]) as child:
            child.ready()
            if step["do"] == "crash":
                child.call("arm", point=step["point"], code=CRASH_EXIT)
            child.go("scenario", step=step["step"], tasks=self.tasks)
            if step["do"] == "crash":
                return {"exit": child.exit_code()}
            answer = child.answer()
            if answer.error is not None:
                return {"exit": child.exit_code(), "error": answer.error,
                        "stderr": child.stderr()[-2000:]}
        report: Report = answer.value
        self.tasks.update(report.pop("tasks", {}))
        return report


@step("scenario")
def _scenario(ctx: Context, step: Step, tasks: dict[str, str]) -> Report:
    """A scenario's step, run in a child on its own connection and clock."""
    return {**perform(ctx.store, step["do"], step, tasks), "tasks": tasks}


def perform(store: Store, kind: str, step: Step, tasks: dict[str, str]) -> Report:
    """Run one store step and report its outcome as plain data."""
    try:
        return _OPERATIONS[kind](store, step, tasks)
    except PostroomError as exc:
        return {"error": type(exc).__name__}


def _task(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    ack = store.receive(AuthContext(principal="planner"), Envelope(
        message_id=step["name"], sender="planner", payload={"ask": step["name"]},
        deadline=START + 86_400, hops=step.get("hops", 0)))
    tasks[step["name"]] = ack.task_id
    return {"task": step["name"], "hops": store.task(ack.task_id).hops}


def _open_wait(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    opening = store.open_wait(step["flow"], step["step"], step["expected_generation"],
                              START + step["deadline"], request_id=step.get("request_id"),
                              task_id=tasks[step["task"]] if "task" in step else None)
    report: Report = {"result": opening.result.value, "generation": opening.generation}
    if opening.replay:
        report["replay"] = True
    return report


def _signal(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    receipt = store.signal(AuthContext(principal=step["principal"]), step["event_id"],
                           step["flow"], step["step"], step["generation"], step["value"])
    report: Report = {"result": receipt.result.value}
    if receipt.recorded is not receipt.result:
        report["recorded"] = receipt.recorded.value
    report["received_at"] = _offset(receipt.received_at)
    return report


def _expire(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    return {"result": store.expire(step["flow"], step["step"], step["generation"]).value}


def _expire_due(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    return {"timed_out": store.expire_due()}


def _resume(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    effect = step.get("effect")
    resumed = store.resume(step["flow"], step["step"], step["generation"],
                           None if effect is None else FollowUp(**effect))
    follow_up = None
    if resumed.task_id is not None:
        child_task = store.task(resumed.task_id)
        parents = {task_id: name for name, task_id in tasks.items()}
        follow_up = {"parent": parents.get(child_task.parent_task_id or "", "?"),
                     "hops": child_task.hops}
    return {"result": resumed.result.value, "kind": resumed.kind.value,
            "follow_up": follow_up}


def _continuations(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    return {"unconsumed": [[c.flow, c.step, c.generation, c.kind.value, c.value]
                           for c in store.continuations(limit=10_000)]}


def _wait(store: Store, step: Step, tasks: dict[str, str]) -> Report:
    wait = store.wait(step["flow"], step["step"], step.get("generation"))
    return {"state": wait.state.value,
            "event": None if wait.event_id is None else f"{wait.event_principal}/"
                                                        f"{wait.event_id}",
            "ended_at": _offset(wait.ended_at)}


_OPERATIONS: dict[str, Callable[[Store, Step, dict[str, str]], Report]] = {
    "task": _task,
    "open_wait": _open_wait,
    "signal": _signal,
    "expire": _expire,
    "expire_due": _expire_due,
    "resume": _resume,
    "continuations": _continuations,
    "wait": _wait,
}


def _state(store: Store, tasks: dict[str, str]) -> Report:
    """Every wait record, summarized; read in one snapshot."""
    with database_of(store).reading() as tx:
        rows = {name: queries.rows(tx, query) if query in queries.QUERIES
                else [dict(row) for row in tx.all(query)]
                for name, query in _STATE_QUERIES.items()}
    names = {task_id: name for name, task_id in tasks.items()}

    def address(row: dict[str, Any]) -> str:
        return f"{row['flow']}/{row['step']}#{row['generation']}"

    return {
        "waits": {address(r): r["state"] for r in rows["waits"]},
        "receipts": {f"{r['principal']}/{r['event_id']}": r["result"]
                     for r in rows["receipts"]},
        "continuations": {address(r): f"{r['kind']}, "
                                      f"{'unconsumed' if r['consumed_at'] is None else 'consumed'}"
                          for r in rows["continuations"]},
        "effects": {address(r): "none" if r["task_id"] is None
                    else f"task (parent {names.get(r['parent_task_id'], '?')}, "
                         f"hops {r['hops']})"
                    for r in rows["effects"]},
        "tasks": {r["state"]: int(r["n"]) for r in rows["tasks"]},
        "high_water": _offset(float(rows["clock"][0]["high_water"]) or None),
    }


_STATE_QUERIES = {
    "waits": "waits_listing",
    "receipts": "wait_receipts_listing",
    "continuations": "wait_continuations_listing",
    "effects": "wait_effects_listing",
    "tasks": "task_counts",
    "clock": "clock_read",
}
