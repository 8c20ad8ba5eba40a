"""The bar for periodic schedules: a cron schedule run by 4 host processes on one PostgreSQL
store for 100 periods of a manual clock they share makes exactly 100 tasks, one per period,
while hosts are SIGKILLed mid-run and restarted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import postroom
from postroom.audit import audit_database
from postroom.schedules import period_key
from tests import pg
from tests.conftest import require_postgres
from tests.harness.children import Process, python
from tests.harness.scheduler_host import FileClock, set_time
from tests.support import SETTINGS, START, database_of

HOSTS = 4
PERIODS = 100
MINUTE = 60.0
#: The every-minute schedule's first period: the first whole minute after START.
FIRST = START - START % MINUTE + MINUTE


@pytest.fixture
def pg_url() -> Iterator[str]:
    require_postgres()
    url = pg.create_schema("schedule_hosts")
    try:
        yield url
    finally:
        pg.drop_schema(url)


def host(url: str, clock_file: Path, number: int) -> Process:
    return Process(python("-m", "tests.harness.scheduler_host", url, str(clock_file)),
                   name=f"scheduler-host-{number}")


def wait_for_task(store: postroom.Store, task_id: str, hosts: list[Process]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            store.task(task_id)
            return
        except postroom.NotFound:
            time.sleep(0.005)  # real processes at work: nothing to advance but wall time
    raise AssertionError(f"no host enqueued {task_id}; "
                         + "; ".join(f"{h.name}: {h.tail()}" for h in hosts))


def test_four_hosts_killed_and_restarted_enqueue_exactly_one_task_per_period(
        pg_url, tmp_path):
    clock_file = tmp_path / "clock"
    set_time(clock_file, START)
    started = time.monotonic()
    killed = 0
    with postroom.open_store(pg_url, clock=FileClock(clock_file), settings=SETTINGS) as store:
        store.add_schedule("tick", "* * * * *", operator="bar", queue="ticks")
        hosts = [host(pg_url, clock_file, number) for number in range(HOSTS)]
        everyone = list(hosts)
        try:
            for process in hosts:
                assert process.readline() == "ready", process.tail()
            for period in range(PERIODS):
                start = FIRST + period * MINUTE
                set_time(clock_file, start + 1)
                if period % 10 == 3 or period == 50:
                    # Mid-run: the hosts are in their rounds for this period right now.
                    victims = range(HOSTS - 1) if period == 50 else [(period // 10) % HOSTS]
                    for index in victims:
                        hosts[index].kill()
                        killed += 1
                        hosts[index] = host(pg_url, clock_file, len(everyone))
                        everyone.append(hosts[index])
                task_id = postroom.validation.task_id_for("schedule:tick", period_key(start))
                wait_for_task(store, task_id, hosts)
            set_time(clock_file, FIRST + PERIODS * MINUTE - 1)  # the last period, still
            time.sleep(0.3)  # let every host run a round more: nothing may come of it
            tasks = store.list_tasks(principal="schedule:tick", limit=1000).items
        finally:
            for process in everyone:
                process.close()
        elapsed = time.monotonic() - started
        assert sorted(task.message_id for task in tasks) == [
            period_key(FIRST + n * MINUTE) for n in range(PERIODS)]
        assert store.schedule("tick").last_period == FIRST + (PERIODS - 1) * MINUTE
        assert audit_database(database_of(store)) == []
    print(f"\nschedule bar: {len(tasks)} tasks for {PERIODS} periods, {HOSTS} hosts, "
          f"{killed} SIGKILLs, {elapsed:.1f} s")
