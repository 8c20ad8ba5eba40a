"""The PostgreSQL dialect: parameters, time authority, sessions, error translation, retries."""

from __future__ import annotations

import threading
import time

import psycopg
import psycopg.errors
import pytest
from psycopg_pool import PoolTimeout

import postroom
from postroom import faults
from postroom.db import Database, dialect_for_url
from postroom.db.postgres import (
    _CLOCK_SHARDS,
    NETWORK,
    PostgresDialect,
    durability_warnings,
)
from postroom.db.sqlite import SQLiteDialect
from tests.support import START, database_of, envelope


def raw(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


# -- opening ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("wrong", "answer"), [
    ("/postroom_no_such_database", 'database "postroom_no_such_database" does not exist'),
    ("?port=not-a-port", 'invalid integer value "not-a-port"')])
def test_an_address_no_wait_will_mend_fails_at_once_saying_what_was_answered(pg_url, wrong,
                                                                           answer):
    from tests.pg import ADMIN_URL, with_database

    url = (with_database(ADMIN_URL, wrong[1:]) if wrong.startswith("/")
           else ADMIN_URL + wrong)
    with pytest.raises(postroom.StoreError, match=answer) as refused:
        PostgresDialect(url, connect_timeout=30)
    # Not StoreUnavailable, "try again", which a server that is down gets after the wait.
    assert not isinstance(refused.value, postroom.StoreUnavailable)
    assert "\n" not in str(refused.value)


# -- parameters ---------------------------------------------------------------------------------

def test_named_parameters_become_psycopg_placeholders(pg_store):
    convert = database_of(pg_store).dialect.convert
    assert convert("WHERE a = :a AND b < :b_2") == "WHERE a = %(a)s AND b < %(b_2)s"


def test_literals_casts_comments_and_percent_signs_survive_conversion(pg_store):
    convert = database_of(pg_store).dialect.convert
    sql = "SELECT 'reply:' || x::text, '50%' -- :not_a_parameter\nFROM t WHERE y LIKE :p"
    assert convert(sql) == ("SELECT 'reply:' || x::text, '50%%' -- :not_a_parameter\n"
                            "FROM t WHERE y LIKE %(p)s")


# -- time ---------------------------------------------------------------------------------------

def server_now(url: str) -> float:
    with raw(url) as conn:
        return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])


def test_decisions_use_the_server_clock_not_the_hosts(pg_url, auth, monkeypatch):
    with postroom.open_store(pg_url) as store:
        before = server_now(pg_url)
        monkeypatch.setattr(time, "time", lambda: 0.0)  # a host whose clock is far off
        ack = store.receive(auth, envelope(deadline=before + 3600))
        claim = store.claim("w")
        monkeypatch.undo()
        after = server_now(pg_url)
    assert claim is not None and claim.task_id == ack.task_id
    assert before <= claim.lease_until - store.settings.lease <= after


def test_the_server_clock_is_the_default_time_source(pg_url):
    with postroom.open_store(pg_url) as store:
        before = server_now(pg_url)
        reading = store.clock.now()
        assert before <= reading <= server_now(pg_url)


def test_a_decision_never_goes_below_the_greatest_high_water_row(pg_store, pg_url, auth):
    with raw(pg_url) as conn:  # some other connection's row holds the latest decision
        conn.execute("UPDATE postroom_counts SET high_water = %s "
                     "WHERE kind = 'clock' AND shard = 17", [START + 500])
    ack = pg_store.receive(auth, envelope(deadline=START + 3600))
    assert pg_store.task(ack.task_id).created_at == START + 500


def test_the_high_water_is_kept_in_one_row_per_shard(pg_store, pg_url):
    with raw(pg_url) as conn:
        ids = [row[0] for row in conn.execute(
            "SELECT shard FROM postroom_counts WHERE kind = 'clock' ORDER BY shard")]
    assert ids == list(range(_CLOCK_SHARDS))


def test_a_write_advances_the_row_of_its_server_process(pg_store, pg_url, auth):
    database = database_of(pg_store)
    with database.transaction(postroom.db.Write("probe")) as tx:
        shard = database.dialect.clock_shard(tx)
        assert shard == tx.conn.pg.info.backend_pid % _CLOCK_SHARDS
        tx.change("stream_create", principal="p", stream="s")
        tx.now = START + 42
    with raw(pg_url) as conn:
        rows = conn.execute("SELECT shard FROM postroom_counts WHERE high_water = %s",
                            [START + 42]).fetchall()
    assert rows == [(shard,)]


def test_writers_on_different_rows_do_not_wait_for_each_other(pg_store, pg_url):
    sql = database_of(pg_store).dialect.queries["clock_advance"].sql
    with raw(pg_url) as first, raw(pg_url) as second:
        first.execute("BEGIN")
        first.execute(sql, {"now": START + 1, "shard": 1})  # holds row 1 until it commits
        second.execute("SET lock_timeout = '2s'")
        second.execute("BEGIN")
        second.execute(sql, {"now": START + 2, "shard": 2})  # would time out if it waited
        second.execute("COMMIT")
        first.execute("COMMIT")



def test_a_decision_made_after_waiting_for_a_slot_lock_is_not_earlier_than_the_holders(
        own_database, auth):
    with postroom.open_store(own_database, clock=postroom.ManualClock(START)) as setup:
        setup.open_wait("f", "s", 0, START + 10)  # generation 1, answered and resumed
        setup.signal(auth, "e0", "f", "s", 1, "yes")
        setup.resume("f", "s", 1, None)
    late = postroom.open_store(own_database, clock=postroom.ManualClock(START + 101))
    early = postroom.open_store(own_database, clock=postroom.ManualClock(START + 100))
    holding, go, out = threading.Event(), threading.Event(), {}

    def hold(_point: str) -> None:
        holding.set()
        go.wait(30)

    def open_generation_2() -> None:  # decides at START + 101, holding the slot's lock
        with faults.armed("open_wait.after_wait_insert", hold):
            out["opened"] = late.open_wait("f", "s", 1, START + 100.5)

    def answer_it() -> None:  # reads its time (START + 100) before that commit, then waits
        out["answer"] = early.signal(auth, "e1", "f", "s", 2, "in time?")

    opener = threading.Thread(target=open_generation_2)
    opener.start()
    assert holding.wait(30)
    answerer = threading.Thread(target=answer_it)
    answerer.start()
    with raw(own_database) as conn:  # until the answer waits for the slot's lock
        while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND wait_event_type = 'Lock'").fetchone()[0]:
            time.sleep(0.01)
    go.set()
    opener.join(30)
    answerer.join(30)
    late.close()
    early.close()
    assert out["opened"].result is postroom.OpenResult.OPENED
    assert out["answer"].result is postroom.SignalResult.TOO_LATE  # as on SQLite
    assert out["answer"].received_at == START + 101


def test_a_resume_that_reads_a_continuation_committed_after_its_time_uses_the_later_time(
        pg_url, auth):
    with postroom.open_store(pg_url, clock=postroom.ManualClock(START)) as setup:
        setup.open_wait("f", "s", 0, START + 500)
    early = postroom.open_store(pg_url, clock=postroom.ManualClock(START + 100))
    late = postroom.open_store(pg_url, clock=postroom.ManualClock(START + 101))
    timed, go, out = threading.Event(), threading.Event(), {}
    dialect = database_of(early).dialect
    decide = dialect.decision_time

    def take_the_time_then_pause(tx, clock, checks=()):
        now = decide(tx, clock, checks)
        timed.set()
        go.wait(30)
        return now

    dialect.decision_time = take_the_time_then_pause

    def resume() -> None:  # takes START + 100, then reads the continuation
        out["resumed"] = early.resume("f", "s", 1, None)

    resumer = threading.Thread(target=resume)
    resumer.start()
    assert timed.wait(30)
    late.signal(auth, "e1", "f", "s", 1, "yes")  # the continuation, at START + 101
    go.set()
    resumer.join(30)
    early.close()
    with raw(pg_url) as conn:
        created, consumed = conn.execute(
            "SELECT created_at, consumed_at FROM wait_continuations").fetchone()
    late.close()
    assert out["resumed"].result is postroom.ResumeResult.RESUMED
    assert (created, consumed) == (START + 101, START + 101)

# -- sessions -----------------------------------------------------------------------------------

def test_store_sessions_carry_an_idle_in_transaction_guard(pg_store):
    dialect = database_of(pg_store).dialect
    with dialect.connection() as conn:
        value = dialect.execute(conn, "SHOW idle_in_transaction_session_timeout", ()).fetchone()
    assert value["idle_in_transaction_session_timeout"] == "1min"


def test_store_sessions_notice_a_vanished_server_within_about_a_minute(pg_store):
    dialect = database_of(pg_store).dialect
    with dialect.connection() as conn:
        parameters = conn.pg.info.get_parameters()
    assert {name: parameters.get(name) for name in NETWORK} == {
        "keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
        "keepalives_count": "3", "tcp_user_timeout": "60000"}


def test_network_settings_given_in_the_url_are_kept(pg_url):
    with postroom.open_store(pg_url + "&keepalives_idle=7") as store:
        dialect = database_of(store).dialect
        with dialect.connection() as conn:
            parameters = conn.pg.info.get_parameters()
    assert parameters["keepalives_idle"] == "7" and parameters["keepalives_count"] == "3"


def test_a_session_idle_inside_a_transaction_is_ended_and_its_locks_released(
        pg_store, pg_url, auth):
    ack = pg_store.receive(auth, envelope())
    dialect = PostgresDialect(pg_url, idle_in_transaction_timeout=0.2)
    try:
        with dialect.connection() as conn, pytest.raises(psycopg.Error):
            dialect.begin(conn, write=True)
            dialect.execute(conn, "UPDATE tasks SET owner = 'frozen' WHERE task_id = %s",
                            [ack.task_id])
            time.sleep(0.6)  # the process freezes mid-transaction (server-side timeout)
            with raw(pg_url) as other:
                other.execute("SET lock_timeout = '5s'")
                other.execute("UPDATE tasks SET owner = NULL WHERE task_id = %s", [ack.task_id])
            dialect.execute(conn, "SELECT 1", ())  # the frozen session was ended
    finally:
        dialect.close()
    assert pg_store.task(ack.task_id).owner is None


def test_processes_opening_a_fresh_store_together_create_it_once(pg_url):
    go = threading.Barrier(8)
    errors: list[BaseException] = []

    def open_it() -> None:
        go.wait()
        try:
            postroom.open_store(pg_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


def test_the_postgres_schema_mirrors_the_sqlite_schema(pg_url, tmp_path):
    def shape(url: str) -> dict[str, set[str]]:
        database = Database(dialect_for_url(url))
        try:
            database.migrate("store")
            database.migrate("receiver")
            dialect = database.dialect
            sql = ("SELECT m.name AS t, p.name AS c FROM sqlite_master AS m, "
                   "pragma_table_info(m.name) AS p WHERE m.type = 'table' "
                   "UNION ALL SELECT 'index', name FROM sqlite_master WHERE type = 'index'"
                   if dialect.name == "sqlite" else
                   "SELECT table_name AS t, column_name AS c FROM information_schema.columns "
                   "WHERE table_schema = current_schema() UNION ALL SELECT 'index', indexname "
                   "FROM pg_indexes WHERE schemaname = current_schema()")
            found: dict[str, set[str]] = {}
            with dialect.connection() as conn:
                for row in dialect.execute(conn, sql, ()).fetchall():
                    if not row["c"].startswith("sqlite_autoindex") and not (
                            row["c"].endswith(("_pkey", "_key"))):  # implicit, named per dialect
                        found.setdefault(row["t"], set()).add(row["c"])
                dialect.rollback(conn)
            return found
        finally:
            database.close()

    mirrored = shape(f"sqlite:///{tmp_path / 'mirror.db'}")
    # Where ids do not follow creation, an index keeps that order; SQLite's table is it.
    assert not PostgresDialect.ids_follow_creation and SQLiteDialect.ids_follow_creation
    mirrored["index"].add("tasks_by_created")
    assert shape(pg_url) == mirrored


# -- errors and retries -------------------------------------------------------------------------

@pytest.mark.parametrize(("error", "expected"), [
    (psycopg.errors.UniqueViolation("duplicate key"), postroom.Conflict),
    (psycopg.errors.SerializationFailure("could not serialize"), postroom.StoreUnavailable),
    (psycopg.errors.DeadlockDetected("deadlock detected"), postroom.StoreUnavailable),
    (psycopg.errors.AdminShutdown("terminating connection"), postroom.StoreUnavailable),
    (psycopg.errors.IdleInTransactionSessionTimeout("idle"), postroom.StoreUnavailable),
    (psycopg.OperationalError("server closed the connection"), postroom.StoreUnavailable),
    (psycopg.errors.UndefinedTable("no such table"), postroom.StoreError),
])
def test_driver_errors_are_translated_at_the_boundary(pg_store, error, expected):
    translated = database_of(pg_store).dialect.translate(error)
    assert type(translated) is expected
    assert str(error) in str(translated)


def test_only_failures_that_committed_nothing_are_retried(pg_store):
    dialect = database_of(pg_store).dialect
    transient = postroom.StoreUnavailable("connection lost")
    delays = [dialect.retry_delay(transient, attempt) for attempt in range(8)]
    assert all(delay is not None and 0 < delay <= 2.0 for delay in delays)
    assert dialect.retry_delay(transient, 8) is None  # the budget is spent
    assert dialect.retry_delay(postroom.OutcomeUnknown("lost during COMMIT"), 0) is None
    assert dialect.retry_delay(postroom.Conflict("duplicate key"), 0) is None
    try:
        raise postroom.StoreUnavailable("no connection") from PoolTimeout("timed out")
    except postroom.StoreUnavailable as waited:
        assert dialect.retry_delay(waited, 0) is None  # already waited the pool's timeout


def test_a_connection_lent_after_a_read_can_write_without_begin(pg_store, auth):
    pg_store.task(pg_store.receive(auth, envelope()).task_id)  # a read-only transaction
    dialect = database_of(pg_store).dialect
    with dialect.connection() as conn:  # the same pooled connection, used raw
        dialect.execute(conn, "UPDATE tasks SET correlation_id = 'raw'", ())
    assert pg_store.task(pg_store.claim("w").task_id).correlation_id == "raw"


# -- durability settings ------------------------------------------------------------------------

def test_info_reports_the_servers_durability_settings_as_a_session_sees_them(pg_url):
    with postroom.open_store(pg_url + "%20-csynchronous_commit%3Doff") as store:
        info = store.info()
    assert info["durability"]["synchronous_commit"] == "off"
    assert set(info["durability"]) == {"fsync", "synchronous_commit", "full_page_writes",
                                       "autovacuum"}
    assert any(w.startswith("synchronous_commit is off") for w in info["warnings"])


@pytest.mark.parametrize(("setting", "weak"), [("fsync", "off"), ("synchronous_commit", "off"),
                                               ("full_page_writes", "off"),
                                               ("autovacuum", "off")])
def test_each_weakened_server_setting_has_its_own_warning(setting, weak):
    strong = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
              "autovacuum": "on"}
    assert durability_warnings(strong) == []
    [warning] = durability_warnings({**strong, setting: weak})
    assert warning.startswith(f"{setting} is off: ")
