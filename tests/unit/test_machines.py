"""The transition tables of ``postroom.machines`` against the code that makes the moves.

Each piece of code that moves a record (a decision in ``postroom.transitions``, or a guarded
statement that sets a state itself) is run over a small grid of inputs, and every move it
makes -- ``(source, target)`` -- must be exactly one row of its table among the events that
piece of code stands for. The other way round, every row must be made by some piece of code.
A source is the state the decision was given, or else the states the statement that applies
or selects its rows demands (``state = 'running'`` in its SQL); a target is what the decision
or the statement sets. Nothing touches a database.
"""

import io
import re
from contextlib import redirect_stdout
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest

from postroom import machines
from postroom import transitions as t
from postroom.db.queries import load_queries
from postroom.db.sqlite import SQLiteDialect
from postroom.machines import MACHINES, Transition
from postroom.models import OutcomeKind, ReplyState, TaskState, WaitState

README = Path(__file__).resolve().parents[2] / "README.md"
REDRAW = "python -m postroom.machines README.md"

#: The SQL as the store runs it on SQLite (fragments resolved, ``:name`` parameters kept).
QUERIES = load_queries(SQLiteDialect.fragments, lambda sql: sql)

_GUARD = re.compile(r"(?<!SET )\b(?:\w+\.)?state (?:= '(\w+)'|IN \(([^)]*)\))")
_SETS = re.compile(r"\bSET state = '(\w+)'")
_INSERT = re.compile(r"INSERT INTO \w+ \(([^)]*)\)\s*VALUES \((.*)\)", re.DOTALL)


#: The predicate of the index of live replies, which each query walking it repeats for SQLite's
#: sake (fragment ``live_reply``): a state it allows, not one it demands.
_LIVE_REPLY = "state IN ('pending', 'sending') AND parked_at IS NULL"


def guards(name: str) -> set[str]:
    """The states statement ``name`` demands of the rows it reads or changes."""
    found = set()
    for equal, listed in _GUARD.findall(QUERIES[name].sql.replace(_LIVE_REPLY, "")):
        found |= {equal} if equal else {item.strip(" '") for item in listed.split(",")}
    assert found, f"statement {name} demands no state"
    return found


def _top_level(values: str) -> list[str]:
    """``values`` split at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(values):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(values[start:index].strip())
            start = index + 1
    return [*items, values[start:].strip()]


def sets(name: str) -> str:
    """The state statement ``name`` writes as a literal (an UPDATE's SET, an INSERT's value)."""
    sql = QUERIES[name].sql
    if (update := _SETS.search(sql)) is not None:
        return update.group(1)
    insert = _INSERT.search(sql)
    assert insert is not None, f"statement {name} sets no state"
    columns = [column.strip() for column in insert.group(1).split(",")]
    value = dict(zip(columns, _top_level(insert.group(2)), strict=True))["state"]
    assert value.startswith("'"), f"statement {name} takes its state as {value}"
    return value.strip("'")


@dataclass(frozen=True)
class Made:
    """The moves one piece of code (``by``) was seen to make, and the table events it
    stands for."""

    by: str
    events: tuple[str, ...]
    moves: frozenset[tuple[object, object]]


def made(by, events, moves):
    return Made(by, events, frozenset(moves))


def statement(name, events, state):
    """The move a statement makes by itself: from the states it demands (or, inserting, from
    nothing) to the state it writes."""
    target = state(sets(name))
    sources = ({None} if QUERIES[name].sql.lstrip().upper().startswith("INSERT")
               else {state(source) for source in guards(name)})
    return made(name, events, {(source, target) for source in sources})


NOW = 100.0
ATTEMPTS = [(attempt, limit) for attempt, limit in product((1, 2, 3), (1, 2, 3))
            if attempt <= limit]


def task_moves() -> list[Made]:
    running = {TaskState(state) for state in guards("task_apply_owned")}  # the owner's calls
    received = {t.initial_state(deadline=deadline, hops=hops, max_hops=4, now=NOW,
                                budget_spent=spent, chain_cancelled=cancelled).to_state
                for deadline, hops, spent, cancelled in product(
                    (NOW - 1, NOW, NOW + 1), (0, 3, 4, 5), (None, "the task budget"),
                    (None, "by its root"))}
    failed = {t.fail(attempt=attempt, max_attempts=limit, retryable=retryable,
                     reason="r", now=NOW, delay=1.0).to_state
              for (attempt, limit), retryable in product(ATTEMPTS, (True, False))}
    lease = {t.lease_expired(attempts=attempt, max_attempts=limit, now=NOW).to_state
             for attempt, limit in ATTEMPTS}
    cancelled = {(state, decision.to_state) for state in TaskState
                 if (decision := t.cancel(state=state, reason="r", now=NOW))}
    return [
        made("initial_state", ("received", "received past deadline", "received at hop limit",
                               "received past its chain's budget",
                               "received into a cancelled chain"),
             {(None, target) for target in received}),
        statement("claim_tasks", ("claim",), TaskState),
        made("finish", ("finish",),
             {(source, t.finish(result_json="1", now=NOW).to_state)
              for source in running}),
        made("fail", ("fail, retryable", "fail, final"),
             {(source, target) for source in running for target in failed}),
        made("lease_expired", ("lease expired", "lease expired, attempts exhausted"),
             {(TaskState(source), target) for source in guards("tasks_lease_expired")
              for target in lease}),
        made("deadline_passed", ("deadline passed",),
             {(TaskState(source), t.deadline_passed(state=TaskState(source), deadline=NOW,
                                                    now=NOW).to_state)
              for source in guards("tasks_deadline_passed")}),
        made("cancel", ("cancel",), cancelled),
        made("release", ("release",),
             {(source, t.release(now=NOW, delay=0.0).to_state) for source in running}),
    ]


#: The events of a delivery outcome, by its kind: each kind is a piece of code of its own,
#: since three kinds end in ``dead``.
DELIVERY_EVENTS = {
    OutcomeKind.DELIVERED: ("delivered",),
    OutcomeKind.TRANSIENT: ("transient failure", "transient failure, budget spent"),
    OutcomeKind.PERMANENT: ("permanent failure",),
    OutcomeKind.COLLISION: ("collision",),
    OutcomeKind.GONE: ("endpoint gone",),
}


def reply_moves() -> list[Made]:
    sending = {ReplyState(state) for state in guards("reply_apply_owned")}
    delivered = [
        made(f"delivery {kind}", DELIVERY_EVENTS[kind],
             {(source, t.delivery(kind, detail="d", attempt=attempt, budget=budget, now=NOW,
                                  delay=1.0).to_state)
              for source in sending for attempt, budget in ATTEMPTS})
        for kind in OutcomeKind]
    return [
        statement("reply_insert", ("created",), ReplyState),
        statement("claim_replies", ("claim",), ReplyState),
        *delivered,
        made("reply_lease_expired", ("publisher lease expired",
                                     "publisher lease expired, budget spent"),
             {(ReplyState(source), t.reply_lease_expired(attempt=attempt, budget=budget,
                                                         now=NOW).to_state)
              for source in guards("replies_lease_expired") for attempt, budget in ATTEMPTS}),
        made("reply_release", ("release",),
             {(ReplyState(source), t.reply_release(now=NOW, delay=0.0).to_state)
              for source in guards("reply_release_owned")}),
        statement("reply_requeue", ("operator requeue",), ReplyState),
    ]


STATES = [None, *WaitState]
TIMES = (NOW - 1, NOW, NOW + 1)  # against a deadline of NOW


def wait_moves() -> list[Made]:
    signals = {(state, decision.end.to_state)
               for current, generation, state, now in product((0, 1, 2), (1, 2), STATES, TIMES)
               if (decision := t.signal_wait(current=current, generation=generation,
                                             state=state, deadline=NOW, now=now)).end}

    def expiries(states):
        return {(state, decision.end.to_state) for state, now in product(states, TIMES)
                if (decision := t.expire_wait(state=state, deadline=NOW, now=now)).end}

    return [
        statement("wait_insert", ("open",), WaitState),
        made("signal_wait", ("signal accepted", "signal too late"), signals),
        made("expire_wait (expire)", ("expire",), expiries(STATES)),
        made("expire_wait (expire_due)", ("sweep",),
             expiries([WaitState(state) for state in guards("waits_due")])),
    ]


MOVES = {"task": task_moves, "reply": reply_moves, "wait": wait_moves}

#: Rows whose code is being written, by machine and event.
AWAITED: set[tuple[str, str]] = set()


def rows_made(name: str) -> dict[Transition, list[str]]:
    """Each row of machine ``name``, with the pieces of code seen to make it."""
    rows: dict[Transition, list[str]] = {row: [] for row in MACHINES[name].transitions}
    for piece in MOVES[name]():
        for (source, target), event in product(piece.moves, piece.events):
            if (row := Transition(source, event, target)) in rows:
                rows[row].append(piece.by)
    return rows


def test_the_live_replies_predicate_is_the_one_the_queries_repeat():
    assert _LIVE_REPLY in QUERIES["claim_replies"].sql
    assert _LIVE_REPLY in QUERIES["replies_lease_expired"].sql


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_move_the_code_makes_is_one_row_of_its_table(name):
    table = MACHINES[name].transitions
    unlisted = []
    for piece in MOVES[name]():
        assert piece.moves, f"{piece.by} made no move over the grid"
        for source, target in sorted(piece.moves, key=str):
            rows = [row for row in table if row.event in piece.events
                    and (row.source, row.target) == (source, target)]
            if len(rows) != 1:
                unlisted.append(f"{piece.by}: {source} -> {target} matches {rows} "
                                f"among the events {piece.events}")
    assert unlisted == [], f"moves the code makes that the {name} table does not list once"


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_row_of_a_table_is_a_move_the_code_makes(name):
    unmade = [row for row, makers in rows_made(name).items()
              if not makers and (name, row.event) not in AWAITED]
    assert unmade == [], f"rows of the {name} table that no code makes"


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_event_stands_for_one_piece_of_code(name):
    owners: dict[str, list[str]] = {}
    for piece in MOVES[name]():
        for event in piece.events:
            owners.setdefault(event, []).append(piece.by)
    events = {row.event for row in MACHINES[name].transitions}
    assert {event: by for event, by in owners.items() if len(by) > 1} == {}
    assert sorted(set(owners) - events) == [], "events the code claims and the table lacks"
    assert sorted(events - set(owners) - {event for machine, event in AWAITED
                                          if machine == name}) == []


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_state_is_in_its_table(name):
    machine = MACHINES[name]
    named = {row.target for row in machine.transitions} | {
        row.source for row in machine.transitions if row.source is not None}
    assert [state for state in machine.states if state not in named] == []
    assert all(isinstance(row.target, machine.states) for row in machine.transitions)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_a_state_and_an_event_lead_to_one_state(name):
    seen: dict[tuple[object, str], object] = {}
    for row in MACHINES[name].transitions:
        assert (row.source, row.event) not in seen, f"{row} is listed twice"
        seen[row.source, row.event] = row.target


def test_a_task_state_is_terminal_exactly_when_its_table_has_no_way_out():
    assert machines.TASK_MACHINE.terminal() == tuple(s for s in TaskState if s.terminal)


def test_the_ends_of_replies_and_waits():
    # A dead reply is no end: an operator may requeue it (SPEC §4).
    assert machines.REPLY_MACHINE.terminal() == (ReplyState.SENT,)
    assert machines.WAIT_MACHINE.terminal() == (WaitState.SIGNALED, WaitState.TIMED_OUT)
    assert machines.TASK_MACHINE.initial() == (TaskState.PENDING, TaskState.CANCELLED,
                                               TaskState.EXPIRED, TaskState.HOP_LIMIT,
                                               TaskState.BUDGET_EXHAUSTED)
    assert machines.REPLY_MACHINE.initial() == (ReplyState.PENDING,)
    assert machines.WAIT_MACHINE.initial() == (WaitState.WAITING,)


def test_a_drawing_lists_the_rows_in_order_between_the_start_and_the_ends():
    machine = machines.Machine("wait", WaitState, machines.WAIT_TRANSITIONS[:2])
    assert machine.mermaid() == ("stateDiagram-v2\n"
                                 "    [*] --> waiting : open\n"
                                 "    waiting --> signaled : signal accepted\n"
                                 "    signaled --> [*]\n")


def _drawings(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for match in machines.DRAWING.finditer(text):
        found.setdefault(match.group("name"), []).append(match.group("body"))
    return found


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_the_readme_draws_each_table_as_it_is(name):
    drawn = _drawings(README.read_text("utf-8")).get(name, [])
    assert len(drawn) == 1, (
        f"README.md should draw the {name} machine once (a mermaid fence right below "
        f"<!-- state machine: {name} -->); it does {len(drawn)} times")
    assert drawn[0] == MACHINES[name].mermaid(), (
        f"README.md's drawing of the {name} machine differs from its table in "
        f"postroom/machines.py: redraw it with `{REDRAW}`")


def test_the_readme_draws_no_machine_that_does_not_exist():
    assert sorted(set(_drawings(README.read_text("utf-8"))) - set(MACHINES)) == []


def test_redrawing_replaces_only_the_drawings(tmp_path):
    stale = ("# Title\n\n<!-- state machine: wait -->\n```mermaid\nstateDiagram-v2\n"
             "    old --> [*]\n```\n\nprose\n\n```mermaid\nflowchart LR\n```\n")
    page = tmp_path / "page.md"
    page.write_text(stale, "utf-8")
    with redirect_stdout(io.StringIO()) as out:
        assert machines.main([str(page)]) == 0
    assert page.read_text("utf-8") == stale.replace(
        "stateDiagram-v2\n    old --> [*]\n", machines.WAIT_MACHINE.mermaid())
    assert out.getvalue() == f"{page}: redrew wait\n"
    with redirect_stdout(io.StringIO()) as out:
        assert machines.main([str(page)]) == 0
    assert out.getvalue() == f"{page}: wait already current\n"


def test_printing_the_drawings_gives_markdown_the_readme_can_take(tmp_path):
    with redirect_stdout(io.StringIO()) as out:
        assert machines.main([]) == 0
    assert _drawings(out.getvalue()) == {name: [machine.mermaid()]
                                         for name, machine in MACHINES.items()}
