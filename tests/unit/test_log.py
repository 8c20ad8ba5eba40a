"""``postroom.log``: structured events, and library loggers routed through postroom's."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from postroom import log


@pytest.fixture
def library() -> Iterator[logging.Logger]:
    """A library's logger, as psycopg-pool's is, restored afterwards."""
    source = logging.getLogger("tests.library")
    yield source
    source.handlers.clear()
    source.propagate = True


def test_an_event_carries_its_fields_as_attributes_and_in_its_message(caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    log.event(log.get("tasks"), logging.INFO, "lease recovered", task_id="t1", fence=3,
              last_error="lease expired on attempt 1")
    (record,) = caplog.records
    assert (record.name, record.task_id, record.fence) == ("postroom.tasks", "t1", 3)
    assert record.getMessage() == ("lease recovered task_id=t1 fence=3 "
                                   "last_error='lease expired on attempt 1'")


def test_an_event_leaves_out_fields_that_are_none(caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    log.event(log.get("tasks"), logging.INFO, "task cancelled", task_id="t1", owner=None)
    (record,) = caplog.records
    assert not hasattr(record, "owner") and record.getMessage() == "task cancelled task_id=t1"


def test_an_event_below_the_loggers_level_makes_no_record(caplog):
    caplog.set_level(logging.INFO, logger="postroom")
    log.event(log.get("tasks"), logging.DEBUG, "task claimed", task_id="t1")
    assert caplog.records == []


def test_a_routed_librarys_warning_is_re_emitted_under_postroom_at_info(library, caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    log.route("tests.library", "pool")
    library.warning("error connecting in %r: %s", "postroom", "connection refused")
    (record,) = caplog.records
    assert (record.name, record.levelno) == ("postroom.pool", logging.INFO)
    assert record.getMessage() == "error connecting in 'postroom': connection refused"


def test_a_routed_librarys_error_becomes_a_warning_and_its_info_debug(library, caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    library.setLevel(logging.DEBUG)
    log.route("tests.library", "pool")
    library.error("gave up")
    library.info("growing pool")
    assert [(r.name, r.levelno) for r in caplog.records] == [
        ("postroom.pool", logging.WARNING), ("postroom.pool", logging.DEBUG)]


def test_routing_a_library_twice_re_emits_each_record_once(library, caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    log.route("tests.library", "pool")
    log.route("tests.library", "pool")
    library.warning("error connecting")
    assert len(caplog.records) == 1


class Root(logging.Handler):
    """What reaches the root logger's handlers (pytest's own capture also listens on loggers
    that do not propagate, so it cannot tell)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(record.name)


def test_a_routed_library_record_reaches_the_root_only_through_postroom(library, caplog):
    caplog.set_level(logging.DEBUG, logger="postroom")
    log.route("tests.library", "pool")
    root, heard = logging.getLogger(), Root()
    root.addHandler(heard)
    try:
        library.warning("error connecting")
    finally:
        root.removeHandler(heard)
    assert heard.names == ["postroom.pool"]


WARN_UNCONFIGURED = """
import logging
from postroom import log
log.route("psycopg.pool", "pool")
log.event(log.get("tasks"), logging.WARNING, "attempts exhausted", task_id="t1")
logging.getLogger("psycopg.pool").warning("error connecting in 'postroom': refused")
"""


def test_nothing_reaches_stderr_when_the_application_configures_no_logging():
    # Python's last-resort handler prints WARNING records of a logger tree without handlers.
    result = subprocess.run([sys.executable, "-c", WARN_UNCONFIGURED], capture_output=True,
                            text=True, check=True, timeout=60)
    assert result.stderr == ""
