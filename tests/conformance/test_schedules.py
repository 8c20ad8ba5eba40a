"""Periodic schedules on both backends: one task per period, whoever runs the round; missed
periods handled as the schedule says; listed, paused, resumed, removed."""

from __future__ import annotations

import pytest

import postroom
from postroom import Missed, TaskState
from postroom.schedules import period_key
from postroom.validation import task_id_for
from tests.support import SETTINGS, START

HOUR = 3600.0
#: The first whole hour after START (13:46:40 UTC): an hourly schedule's first period.
FIRST = START - START % HOUR + HOUR


def hourly(store, name="report", **fields):
    return store.add_schedule(name, "0 * * * *", operator="alice", queue="reports",
                              payload={"kind": name}, **fields)


def tasks_of(store, name="report"):
    page = store.list_tasks(principal=f"schedule:{name}", limit=1000)
    return sorted(page.items, key=lambda task: task.message_id)


def at(clock, when):
    clock.set(when)


def test_nothing_is_enqueued_before_the_first_period_begins(store, clock):
    hourly(store)
    at(clock, FIRST - 1)
    assert store.enqueue_due_schedules() == []
    assert tasks_of(store) == []


def test_each_period_enqueues_one_task_with_the_schedules_definition(store, clock):
    hourly(store, priority=2, max_attempts=5)
    for hour in range(3):
        at(clock, FIRST + hour * HOUR + 5)
        (ack,) = store.enqueue_due_schedules()
        assert not ack.duplicate
        assert store.enqueue_due_schedules() == []  # the same period again: nothing
    found = tasks_of(store)
    assert [task.message_id for task in found] == [period_key(FIRST + h * HOUR)
                                                   for h in range(3)]
    task = found[0]
    assert (task.queue, task.payload, task.priority, task.max_attempts, task.state) == (
        "reports", {"kind": "report"}, 2, 5, TaskState.PENDING)
    assert task.deadline == FIRST + HOUR  # by default, until the next period begins
    assert task.task_id == task_id_for("schedule:report", period_key(FIRST))


def test_a_ttl_sets_the_deadline_from_the_periods_start(store, clock):
    hourly(store, ttl=600)
    at(clock, FIRST + 1)
    store.enqueue_due_schedules()
    assert tasks_of(store)[0].deadline == FIRST + 600


def test_a_second_hosts_round_of_the_same_period_adds_no_task(store, db_url, clock):
    hourly(store)
    at(clock, FIRST + 1)
    with postroom.open_store(db_url, clock=clock, settings=SETTINGS) as other_host:
        assert len(store.enqueue_due_schedules()) == 1
        assert other_host.enqueue_due_schedules() == []
    assert len(tasks_of(store)) == 1


def test_a_period_enqueued_again_is_a_duplicate_of_its_identity(store, clock):
    from postroom.cron import parse_cron
    from postroom.schedules import ENQUEUE, _enqueue
    from tests.support import database_of

    hourly(store)
    at(clock, FIRST + 1)
    (first,) = store.enqueue_due_schedules()
    database = database_of(store)

    def again(tx):  # as a host would that raced past the schedule's lock
        row = tx.one("schedule_get", schedule="report")
        return _enqueue(tx, store.settings, row, parse_cron("0 * * * *"), FIRST)

    ack = database.write(ENQUEUE, again)
    assert (ack.task_id, ack.duplicate) == (first.task_id, True)
    assert len(tasks_of(store)) == 1


def test_a_period_in_progress_is_enqueued_late_under_either_policy(store, clock):
    hourly(store, name="once")
    hourly(store, name="skip", missed="skip")
    at(clock, FIRST + 50 * 60)  # 50 minutes into the first period: nothing missed yet
    assert len(store.enqueue_due_schedules()) == 2


def test_after_a_long_outage_once_enqueues_the_latest_period_once(store, clock):
    hourly(store, missed="once")
    at(clock, FIRST + 5 * HOUR + 600)  # every host was down for five periods
    assert len(store.enqueue_due_schedules()) == 1
    (task,) = tasks_of(store)
    assert task.message_id == period_key(FIRST + 5 * HOUR)
    assert task.deadline == FIRST + 6 * HOUR
    assert store.enqueue_due_schedules() == []
    assert store.schedule("report").next_at == FIRST + 6 * HOUR


def test_after_a_long_outage_skip_enqueues_nothing_until_the_next_period(store, clock):
    hourly(store, missed="skip")
    at(clock, FIRST + 5 * HOUR + 600)
    assert store.enqueue_due_schedules() == []
    assert tasks_of(store) == []
    assert store.schedule("report").last_period == FIRST + 5 * HOUR  # handled: dropped
    at(clock, FIRST + 6 * HOUR)
    assert len(store.enqueue_due_schedules()) == 1
    assert [t.message_id for t in tasks_of(store)] == [period_key(FIRST + 6 * HOUR)]


def test_a_paused_schedule_enqueues_nothing(store, clock):
    hourly(store)
    assert store.pause_schedule("report", operator="bob")
    assert not store.pause_schedule("report", operator="bob")
    at(clock, FIRST + 1)
    assert store.enqueue_due_schedules() == []
    paused = store.schedule("report")
    assert (paused.paused, paused.updated_by) == (True, "bob")


@pytest.mark.parametrize(("missed", "enqueued"), [("once", 1), ("skip", 0)])
def test_resuming_after_a_long_pause_does_not_backfill_beyond_the_policy(
        store, clock, missed, enqueued):
    hourly(store, missed=missed)
    store.pause_schedule("report", operator="bob")
    at(clock, FIRST + 10 * HOUR + 1)
    assert store.resume_schedule("report", operator="bob")
    assert len(store.enqueue_due_schedules()) == enqueued
    assert len(tasks_of(store)) == enqueued


def test_resuming_a_schedule_that_is_not_paused_is_false(store):
    hourly(store)
    assert not store.resume_schedule("report", operator="bob")


def test_a_removed_schedule_enqueues_nothing_and_its_tasks_stay(store, clock):
    hourly(store)
    at(clock, FIRST + 1)
    store.enqueue_due_schedules()
    assert store.remove_schedule("report")
    assert not store.remove_schedule("report")
    at(clock, FIRST + HOUR + 1)
    assert store.enqueue_due_schedules() == []
    assert len(tasks_of(store)) == 1
    with pytest.raises(postroom.NotFound, match="report"):
        store.schedule("report")


def test_schedules_are_listed_by_name_with_who_made_them(store):
    hourly(store, name="b")
    hourly(store, name="a", missed="skip")
    listed = store.schedules()
    assert [(s.name, s.missed, s.created_by) for s in listed] == [
        ("a", Missed.SKIP, "alice"), ("b", Missed.ONCE, "alice")]
    assert listed[0].next_at == FIRST


def test_adding_the_same_definition_again_changes_nothing(store, clock):
    first = hourly(store)
    clock.advance(10)
    assert hourly(store) == first


def test_adding_another_definition_under_a_name_is_refused_unless_replaced(store, clock):
    hourly(store)
    with pytest.raises(postroom.Conflict, match="report"):
        store.add_schedule("report", "*/5 * * * *", operator="alice")
    at(clock, FIRST + 1)
    store.enqueue_due_schedules()
    replaced = store.add_schedule("report", "30 * * * *", operator="carol", queue="reports",
                                  replace=True)
    assert (replaced.cron, replaced.updated_by, replaced.created_by) == (
        "30 * * * *", "carol", "alice")
    assert replaced.next_at == FIRST + 1800  # after the period it handled
    at(clock, FIRST + 1801)
    assert len(store.enqueue_due_schedules()) == 1


def test_a_zone_places_the_periods_on_its_wall_clock(store, clock):
    store.add_schedule("noon", "0 12 * * *", operator="a", zone="Asia/Kolkata")
    # 12:00 in Kolkata is 06:30 UTC.
    assert store.schedule("noon").next_at % 86400 == 6 * 3600 + 1800


@pytest.mark.parametrize(("fields", "field"), [
    ({"cron": "61 * * * *"}, "cron"), ({"cron": "* * *"}, "cron"),
    ({"zone": "Nowhere/Else"}, "zone"), ({"missed": "twice"}, "missed"),
    ({"ttl": 0}, "ttl"), ({"priority": 11}, "priority"), ({"payload": [1]}, "payload"),
    ({"name": ""}, "name"), ({"queue": 3}, "queue"), ({"max_attempts": 0}, "max_attempts"),
])
def test_a_definition_that_cannot_be_is_refused_naming_the_field(store, fields, field):
    arguments = {"name": "report", "cron": "0 * * * *"} | fields
    with pytest.raises(postroom.InvalidInput) as refused:
        store.add_schedule(arguments.pop("name"), arguments.pop("cron"), operator="a",
                           **arguments)
    assert refused.value.field == field
    assert store.schedules() == []


def test_no_sender_may_take_a_schedules_principal(store):
    from tests.support import envelope

    with pytest.raises(postroom.Unauthorized, match="schedule:"):
        store.receive(postroom.AuthContext(principal="schedule:report"), envelope())


def test_a_scheduled_task_is_worked_like_any_other(store, clock):
    hourly(store)
    at(clock, FIRST + 1)
    store.enqueue_due_schedules()
    claim = store.claim("w", queues="reports")
    assert claim is not None and claim.principal == "schedule:report"
    store.finish(claim, {"ok": True})
    assert store.reply(claim.task_id).requester == "schedule:report"


# -- the audit ----------------------------------------------------------------------------------


@pytest.fixture
def scheduled(store, clock):
    """A store whose hourly schedule enqueued three periods, one of them finished."""
    hourly(store)
    for hour in range(3):
        at(clock, FIRST + hour * HOUR + 1)
        store.enqueue_due_schedules()
    store.finish(store.claim("w", queues="reports"), "ok")
    return store


def audit_checks(store):
    from postroom.audit import audit_database
    from tests.support import database_of

    return {violation.check for violation in audit_database(database_of(store))}


def test_a_store_with_schedules_is_clean_even_after_one_is_removed_and_added_again(
        scheduled, clock):
    assert audit_checks(scheduled) == set()
    scheduled.remove_schedule("report")
    hourly(scheduled)
    assert audit_checks(scheduled) == set()


@pytest.mark.parametrize(("sql", "check"), [
    ("UPDATE schedules SET next_at = last_period", "schedule_next_not_after_last"),
    ("UPDATE schedules SET last_key = '1970-01-12T14:00:00Z'", "schedule_task_ahead"),
    ("UPDATE schedules SET last_task_id = (SELECT min(task_id) FROM tasks WHERE message_id = "
     "'1970-01-12T14:00:00Z')", "schedule_last_task_mismatch"),
    ("UPDATE tasks SET message_id = '1970-01-12T14:00Z' WHERE message_id = "
     "'1970-01-12T14:00:00Z'", "schedule_task_identity"),
])
def test_each_broken_schedule_invariant_is_named(scheduled, sql, check):
    from tests.conformance.test_audit import corrupt

    assert period_key(FIRST) == "1970-01-12T14:00:00Z"
    corrupt(scheduled, sql)
    assert check in audit_checks(scheduled)
