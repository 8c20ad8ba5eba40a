"""Periodic schedules in the randomized audit, registered into the tables on import:

- ``SNAPSHOT_TABLES``: the schedules;
- ``OPERATIONS``: ``schedule_add`` (a new one, the same again, another definition refused),
  ``schedule_pause`` / ``schedule_resume`` / ``schedule_remove``, and ``schedule_round``,
  which must enqueue exactly the period each due schedule's missed policy names, under the
  identity of the schedule and the period, and move the schedule on past it (and, for the
  schedules' own mix, ``PERIODS_PASS``: the clock moving by minutes or by an outage of an
  hour or more);
- ``CHECKS``: a schedule only moves forward (its next period and the last one it handled
  never go back while it lives).
"""

from __future__ import annotations

from collections.abc import Iterator

from postroom.cron import parse_cron
from postroom.errors import Conflict, NotFound
from postroom.schedules import period_key
from postroom.validation import task_id_for
from tests.harness.simulation.checks import CHECKS, Transition
from tests.harness.simulation.operations import (
    OPERATIONS,
    Action,
    Operation,
    Step,
    born_state,
)
from tests.harness.simulation.world import SNAPSHOT_TABLES, Snapshot, Table, World

__all__ = ["DEFINITIONS", "PERIODS_PASS", "SCHEDULE_CHECKS", "SCHEDULE_OPERATIONS",
           "SCHEDULE_TABLES"]

#: The schedules the simulation works on, by name: (cron, queue, missed).
DEFINITIONS = {
    "minutely": ("* * * * *", "default", "once"),
    "even-minutes": ("*/2 * * * *", "fast", "skip"),
    "office": ("*/3 0-1,8-17 * * 1-5", "slow", "once"),
}

SCHEDULE_TABLES = [Table("schedules", "snapshot_schedules", "name", "store")]


def _schedules(snapshot: Snapshot) -> dict[str, dict[str, object]]:
    return snapshot.tables["schedules"]  # type: ignore[return-value]


def plan_schedule_add(world: World) -> Action:
    """An operator adds a schedule: new, again as it is, or under its name with another
    expression (refused)."""
    name = world.rng.choice(sorted(DEFINITIONS))
    cron, queue, missed = DEFINITIONS[name]
    other = world.rng.random() < 0.2
    if other:
        cron = "7 * * * *"

    def act(step: Step) -> str:
        held = _schedules(step.before).get(name)
        try:
            added = step.world.store.add_schedule(name, cron, operator="simulation",
                                                  queue=queue, missed=missed)
        except Conflict:
            step.expect(held is not None and held["cron"] != cron,
                        f"adding {name} ({cron}) was refused as another definition")
            step.expect(_schedules(step.after()).get(name) == held,
                        f"a refused add changed schedule {name}")
            return "refused"
        step.expect(held is None or held["cron"] == cron,
                    f"schedule {name} was {held and held['cron']}, {cron} was accepted")
        row = _schedules(step.after()).get(name)
        step.expect(row is not None and row["next_at"] == added.next_at,
                    f"schedule {name} added, not stored as returned")
        if held is not None:
            step.expect(row == held, f"adding {name} again as it is changed it")
            return "same"
        step.expect(added.next_at == parse_cron(cron).next_after(step.now),
                    f"new schedule {name}'s first period is not the first after now")
        return "added"

    return act


def _plan_change(kind: str, weight: float) -> Operation:
    def plan(world: World) -> Action:
        names = sorted(_schedules(world.last)) or sorted(DEFINITIONS)
        name = world.rng.choice([*names, "never-added"])

        def act(step: Step) -> str:
            held = _schedules(step.before).get(name)
            store = step.world.store
            try:
                if kind == "remove":
                    changed = store.remove_schedule(name)
                elif kind == "pause":
                    changed = store.pause_schedule(name, operator="simulation")
                else:
                    changed = store.resume_schedule(name, operator="simulation")
            except NotFound:
                step.expect(held is None, f"{kind} of stored schedule {name}: NotFound")
                return "not_found"
            row = _schedules(step.after()).get(name)
            if kind == "remove":
                step.expect(changed == (held is not None) and row is None,
                            f"remove of {name} said {changed}, it is {row}")
            else:
                assert held is not None and row is not None
                wanted = kind == "pause"
                step.expect(changed == (bool(held["paused"]) != wanted)
                            and bool(row["paused"]) == wanted,
                            f"{kind} of {name} said {changed}, paused is {row['paused']}")
            return "changed" if changed else "unchanged"

        return act

    return Operation(name=f"schedule_{kind}", weight=weight, plan=plan)


def plan_schedule_round(world: World) -> Action:
    """A scheduler's round: each due schedule enqueues the period its policy names."""

    def act(step: Step) -> str:
        acks = step.world.store.enqueue_due_schedules()
        expected: dict[str, tuple[str, float]] = {}
        handled = {}
        for name, row in _schedules(step.before).items():
            if row["paused"] or float(row["next_at"]) > step.now:  # type: ignore[arg-type]
                continue
            cron = parse_cron(row["cron"], row["zone"])
            first = float(row["next_at"])  # type: ignore[arg-type]
            latest = cron.latest(first, step.now)
            period = first if latest is None else latest
            handled[name] = (period, cron.next_after(period))
            if latest is None or row["missed"] == "once":
                expected[task_id_for(f"schedule:{name}", period_key(period))] = (name, period)
        step.expect(sorted(ack.task_id for ack in acks) == sorted(expected),
                    f"the round enqueued {len(acks)} tasks, expected {sorted(expected.values())}")
        after = step.after()
        for ack in acks:
            name, period = expected[ack.task_id]
            step.expect(ack.duplicate == (ack.task_id in step.before.tasks),
                        f"{name} {period_key(period)}: duplicate={ack.duplicate}")
            task = after.tasks.get(ack.task_id)
            step.expect(task is not None, f"{name} {period_key(period)} ACKed, not stored")
            assert task is not None
            if not ack.duplicate:
                state = born_state(handled[name][1], 0, step.now, step.world.settings.max_hops)
                step.expect(task["state"] == state, f"{name}'s task born {task['state']}")
            step.world.acked.add(ack.task_id)
        for name, (period, following) in handled.items():
            row = _schedules(after)[name]
            step.expect((row["last_period"], row["next_at"]) == (period, following),
                        f"{name} handled up to {row['last_period']}, next {row['next_at']}; "
                        f"expected {period}, {following}")
        if not handled:
            return "idle"
        return "skipped" if len(acks) < len(handled) else "enqueued"

    return act


def plan_periods_pass(world: World) -> Action:
    """Time passes by periods: a minute or a few (rounds keep up), or an outage of an hour or
    more (every host down: whole periods pass without a round)."""
    minutes = world.rng.choice((1, 1, 2, 3, 61, 125))

    def act(step: Step) -> str:
        step.world.clock.set(step.now + 60.0 * minutes)
        return "outage" if minutes > 60 else "minutes"

    return act


def schedules_only_move_forward(before: Snapshot, after: Snapshot, _: Transition
                                ) -> Iterator[str]:
    """While a schedule lives, its next period and the last one it handled never go back."""
    for name, row in _schedules(before).items():
        now = _schedules(after).get(name)
        if now is None or now["created_at"] != row["created_at"]:
            continue  # removed (and perhaps added again): a new schedule
        if float(now["next_at"]) < float(row["next_at"]):  # type: ignore[arg-type]
            yield f"schedule {name}'s next period went back to {now['next_at']}"
        if row["last_period"] is not None and (
                now["last_period"] is None
                or float(now["last_period"]) < float(row["last_period"])):  # type: ignore[arg-type]
            yield f"schedule {name}'s last period went back to {now['last_period']}"


SCHEDULE_OPERATIONS = [
    Operation(name="schedule_add", weight=2, plan=plan_schedule_add),
    Operation(name="schedule_round", weight=6, plan=plan_schedule_round),
    _plan_change("pause", 1),
    _plan_change("resume", 1),
    _plan_change("remove", 0.5),
]
#: Outages of whole periods: run with the schedules' own mix only, since jumps of hours would
#: end every lease and deadline of the task pipeline's seeds.
PERIODS_PASS = Operation(name="periods_pass", weight=6, plan=plan_periods_pass)
SCHEDULE_CHECKS = [schedules_only_move_forward]

SNAPSHOT_TABLES.extend(SCHEDULE_TABLES)
OPERATIONS.extend(SCHEDULE_OPERATIONS)
CHECKS.extend(SCHEDULE_CHECKS)
