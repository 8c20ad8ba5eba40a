"""Lost sessions and lost commits: nothing half-applied, nothing applied twice.

A session ended before COMMIT is retried (nothing was committed); a COMMIT whose reply was
lost is looked up by transaction id: committed means the caller gets its result, aborted means
a retry, and a fate that cannot be learned is ``OutcomeUnknown``, never a blind retry.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest

import postroom
from postroom import faults
from postroom.db.database import Tx
from postroom.db.postgres import PostgresDialect, lost_commit_fate
from tests import pg
from tests.conftest import require_postgres
from tests.harness.children import spawn
from tests.support import database_of, envelope

FAR = 4_000_000_000.0  # a deadline far ahead of the server clock


def count_tasks(store: postroom.Store) -> int:
    return sum(store.info()["tasks"].values())


def test_a_session_ended_before_commit_is_retried_and_applied_once(own_database, auth):
    with postroom.open_store(own_database) as store:
        ended: list[int] = []
        with faults.armed("receive.before_commit",
                          lambda _: ended.append(pg.terminate_sessions(own_database))):
            ack = store.receive(auth, envelope(deadline=FAR))
        assert ended and ended[0] >= 1
        assert ack.duplicate is False  # the retry stored it; the first attempt left nothing
        assert count_tasks(store) == 1


def test_a_read_whose_session_was_ended_runs_again_on_a_new_one(own_database, auth):
    with postroom.open_store(own_database) as store:
        task_id = store.receive(auth, envelope(deadline=FAR)).task_id
        # The pool keeps the idle session; a server restart (or an operator) ends it.
        assert pg.terminate_sessions(own_database) >= 1
        assert store.task(task_id).state == postroom.TaskState.PENDING
        assert count_tasks(store) == 1


def lose_the_connection_at_commit(monkeypatch, *, commit_first: bool) -> None:
    """The next COMMIT's reply never arrives (once it was, or was not, committed)."""
    original = psycopg.Connection.commit

    def commit(self: psycopg.Connection) -> None:
        monkeypatch.setattr(psycopg.Connection, "commit", original)
        if commit_first:
            original(self)
        self.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Connection, "commit", commit)


def test_a_lost_commit_that_committed_returns_its_result_without_a_retry(
        pg_url, auth, monkeypatch):
    with postroom.open_store(pg_url) as store:
        lose_the_connection_at_commit(monkeypatch, commit_first=True)
        ack = store.receive(auth, envelope(deadline=FAR))
        assert ack.duplicate is False  # a retry would have answered "duplicate"
        assert count_tasks(store) == 1


def test_a_lost_commit_that_did_not_commit_is_retried(pg_url, auth, monkeypatch):
    with postroom.open_store(pg_url) as store:
        lose_the_connection_at_commit(monkeypatch, commit_first=False)
        ack = store.receive(auth, envelope(deadline=FAR))
        assert ack.duplicate is False
        assert count_tasks(store) == 1


def test_a_lost_commit_whose_fate_cannot_be_learned_is_outcome_unknown(
        pg_url, auth, monkeypatch):
    with postroom.open_store(pg_url) as store:
        dialect = database_of(store).dialect
        monkeypatch.setattr(dialect, "_resolve_timeout", 0.2)
        monkeypatch.setattr(dialect, "_transaction_status",
                            lambda xid, started: None)  # unreachable
        lose_the_connection_at_commit(monkeypatch, commit_first=True)
        with pytest.raises(postroom.OutcomeUnknown, match="could not be learned"):
            store.receive(auth, envelope(deadline=FAR))
        monkeypatch.undo()
        assert count_tasks(store) == 1  # it did commit, and it was not run a second time



@pytest.fixture
def crashable() -> Iterator[pg.Cluster]:
    """A private server whose WAL writer flushes only every 10 s, so that a crash just
    before COMMIT reliably loses the transaction (in production: a window of milliseconds).

    Without autovacuum: after crash recovery its ANALYZE may take (and commit) the very id
    the lost transaction had, which the "id not reused" case relies on nobody doing.
    """
    require_postgres()
    cluster = pg.Cluster(wal_writer_delay="10000", autovacuum="off")
    yield cluster
    cluster.destroy()


def crash(cluster: pg.Cluster, kind: str) -> None:
    """``restart``: the server stops at once and starts again. ``backend``: one server process
    is killed, so the postmaster ends every session and runs crash recovery, but does not
    restart (its start time stays the same)."""
    if kind == "restart":
        cluster.restart("immediate")
        return
    life = "SELECT CAST(pg_stat_get_bgwriter_stat_reset_time() AS TEXT)"  # reset by a crash
    with psycopg.connect(cluster.url, autocommit=True) as victim:
        before = victim.execute(life).fetchone()
        os.kill(victim.info.backend_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # until recovery is over and a new session sees a new server life
        try:
            with psycopg.connect(cluster.url, autocommit=True, connect_timeout=2) as probe:
                # (A session that opens before the postmaster has heard of the kill still
                # sees the old life: the crash has not happened yet, so look again.)
                if probe.execute(life).fetchone() != before:
                    return
        except psycopg.Error:
            pass
        assert time.monotonic() < deadline, "the server did not come back"
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["restart", "backend"])
@pytest.mark.parametrize("reused", [True, False], ids=["id-reused", "id-not-reused"])
def test_a_commit_lost_in_a_server_crash_is_never_reported_as_committed(
        crashable, auth, monkeypatch, kind, reused):
    ids: dict[str, int] = {}
    noted = PostgresDialect.before_commit

    def note_the_id(self: PostgresDialect, tx: Tx) -> None:
        noted(self, tx)
        if tx.conn.xid is not None:  # (a duplicate writes nothing, so it has no id)
            ids["ours"] = int(tx.conn.xid)

    def crash_inside_the_commit(_point: str) -> None:
        crash(crashable, kind)
        if reused:  # other clients' transactions take ids up to and past ours
            with psycopg.connect(crashable.url, autocommit=True) as other:
                other.execute("CREATE TABLE traffic (n int)")
                while ids.setdefault("theirs", 0) < ids["ours"]:
                    ids["theirs"] = int(other.execute(
                        "INSERT INTO traffic VALUES (1) RETURNING CAST(pg_current_xact_id() "
                        "AS TEXT)").fetchone()[0])

    monkeypatch.setattr(PostgresDialect, "before_commit", note_the_id)
    with postroom.open_store(crashable.url) as store:
        store.receive(auth, envelope("warm-up", deadline=FAR))
        with faults.armed("receive.before_commit", crash_inside_the_commit):
            if reused:  # its id reads as committed, by someone else: no way to know
                with pytest.raises(postroom.OutcomeUnknown, match="crashed or restarted"):
                    store.receive(auth, envelope("important", deadline=FAR))
            else:  # its id was never handed out again: certainly lost, so run again
                assert store.receive(auth, envelope("important", deadline=FAR)).duplicate is False
        assert count_tasks(store) == (1 if reused else 2)
        assert store.receive(auth, envelope("important", deadline=FAR)).duplicate is not reused


@pytest.mark.parametrize(("status", "restarted", "assigned", "fate"), [
    ("committed", False, True, "committed"),
    ("aborted", False, True, "aborted"),
    ("in progress", False, True, "in progress"),
    (None, False, True, "aborted"),
    ("committed", True, True, "ambiguous"),
    ("aborted", True, True, "aborted"),
    ("in progress", True, True, "aborted"),
    (None, True, False, "aborted"),
])
def test_a_lost_commits_fate_is_read_from_its_id_only_when_the_id_is_surely_its_own(
        status, restarted, assigned, fate):
    assert lost_commit_fate(status, restarted=restarted, assigned=assigned) == fate

# -- wake-ups across processes ------------------------------------------------------------------

def send_from_another_process(url: str, queue: str) -> None:
    """Receive one message in a process of its own, on the system clock."""
    with spawn(1, name="sender", store=url, now=None) as (sender,):
        sender.call("receive", message_id="from-afar", deadline=FAR, queue=queue)


def test_a_waiter_hears_a_commit_made_by_another_process(pg_url):
    with postroom.open_store(pg_url) as store:
        waiter = store.waiter(queues="default")
        send_from_another_process(pg_url, "default")
        assert waiter.wait(timeout=30)


def test_a_waiter_is_not_woken_by_another_processes_other_queue(pg_url):
    with postroom.open_store(pg_url) as store:
        waiter = store.waiter(queues="default")
        send_from_another_process(pg_url, "reviews")
        assert not waiter.wait(timeout=0.3)


def test_stores_in_other_schemas_do_not_wake_each_other(pg_urls):
    here, elsewhere = pg_urls("here"), pg_urls("elsewhere")
    with postroom.open_store(here) as store:
        postroom.open_store(elsewhere).close()
        waiter = store.waiter(queues="default")
        send_from_another_process(elsewhere, "default")
        assert not waiter.wait(timeout=0.3)


def test_a_waiter_is_woken_when_its_listener_reconnects(own_database, auth):
    with postroom.open_store(own_database) as store:
        waiter = store.waiter(queues="default")
        assert not waiter.wait(timeout=0)
        assert pg.terminate_sessions(own_database) >= 1  # the listener among them
        # What was announced while it was deaf is lost: only a poll can find it now.
        assert waiter.wait(timeout=30)
        store.receive(auth, envelope(deadline=FAR))  # the pool's dead sessions are replaced
        assert waiter.wait(timeout=30)
