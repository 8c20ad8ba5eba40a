"""What the PostgreSQL dialect logs: the pool's messages through postroom, lost COMMITs
resolved (INFO) or not (WARNING), and its listener's reconnects."""

from __future__ import annotations

import logging

import pytest

import postroom
from tests import pg
from tests.postgres.test_sessions import FAR, lose_the_connection_at_commit
from tests.support import database_of, envelope


def messages(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records
            if record.name == name]


class Root(logging.Handler):
    """What reaches the root logger's handlers (pytest's own capture also listens on loggers
    that do not propagate, so it cannot tell)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name, record.levelno, record.getMessage()))


def test_the_pools_messages_reach_the_application_only_through_postroom_pool(pg_url,
                                                                            caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    postroom.open_store(pg_url).close()
    root, heard = logging.getLogger(), Root()
    root.addHandler(heard)
    try:
        logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "postroom",
                                                  "no")
    finally:
        root.removeHandler(heard)
    assert heard.seen == [("postroom.pool", logging.INFO, "error connecting in 'postroom': no")]


def test_a_lost_commit_that_committed_is_logged_at_info(pg_url, auth, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="postroom")
    with postroom.open_store(pg_url) as store:
        lose_the_connection_at_commit(monkeypatch, commit_first=True)
        store.receive(auth, envelope(deadline=FAR))
    ((level, message),) = messages(caplog, "postroom.postgres")
    assert level == logging.INFO and message.startswith("lost COMMIT resolved: committed xid=")


def test_a_lost_commit_that_did_not_commit_is_logged_at_info_before_its_retry(
        pg_url, auth, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="postroom")
    with postroom.open_store(pg_url) as store:
        lose_the_connection_at_commit(monkeypatch, commit_first=False)
        store.receive(auth, envelope(deadline=FAR))
    ((level, message),) = messages(caplog, "postroom.postgres")
    assert level == logging.INFO
    assert message.startswith("lost COMMIT resolved: not committed, to be retried")


def test_a_lost_commit_whose_fate_is_unknown_is_logged_at_warning(
        pg_url, auth, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="postroom")
    with postroom.open_store(pg_url) as store:
        dialect = database_of(store).dialect
        monkeypatch.setattr(dialect, "_resolve_timeout", 0.2)
        monkeypatch.setattr(dialect, "_transaction_status", lambda xid, started: None)
        lose_the_connection_at_commit(monkeypatch, commit_first=True)
        with pytest.raises(postroom.OutcomeUnknown):
            store.receive(auth, envelope(deadline=FAR))
    ((level, message),) = messages(caplog, "postroom.postgres")
    assert level == logging.WARNING and message.startswith("lost COMMIT: outcome unknown")


def test_a_listener_that_loses_its_session_warns_then_logs_its_reconnect(own_database,
                                                                        caplog):
    caplog.set_level(logging.INFO, logger="postroom")
    with postroom.open_store(own_database) as store:
        waiter = store.waiter(queues="default")
        assert pg.terminate_sessions(own_database) >= 1  # the listener among them
        assert waiter.wait(timeout=30)  # woken by the reconnect
    found = messages(caplog, "postroom.postgres")
    assert [level for level, _ in found] == [logging.WARNING, logging.INFO], found
    assert found[0][1].startswith("listener disconnected")
    assert found[1][1].startswith("listener reconnected")
