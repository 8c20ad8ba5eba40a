"""The command line, run as a real subprocess (the way users and CI run it)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from contextlib import closing

import pytest

import postroom
from postroom.db import Database, dialect_for_url, redacted_url
from tests.harness import children
from tests.harness.children import python
from tests.support import database_of, envelope


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return children.run(python("-m", "postroom", *args), timeout=120)


def test_demo_tells_the_whole_story_and_succeeds():
    result = run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for evidence in ('"ack": "stored"', "state=pending", "worker-1 holds fence 1",
                     "(exit code -9)", "state=running owner=worker-1 fence=1",
                     "state=running owner=worker-2 fence=2 attempts=2", "rejected",
                     'state=done result={"fence": 2', "drops the connection without answering",
                     "records delivery 1: transient", "delivery 2: delivered",
                     "delivers again, with the same reply_id",
                     '"duplicate": true', "reply state=sent attempts=2",
                     "exit codes 143 and 143", "2 deliveries reached the receiver",
                     "receiver effects 1", "audit       clean", "every step held"):
        assert evidence in out, evidence


def test_audit_of_a_clean_store_exits_zero(db_url, store, auth):
    store.receive(auth, envelope())
    result = run("audit", db_url)
    assert result.returncode == 0 and "clean" in result.stdout


def test_audit_names_each_violation_and_exits_non_zero(db_url, store, auth):
    store.receive(auth, envelope())
    dialect = database_of(store).dialect
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        dialect.execute(conn, "UPDATE tasks SET owner = 'ghost'", ())
        dialect.commit(conn)
    result = run("audit", db_url)
    assert result.returncode == 1
    assert "idle_task_with_owner_or_lease" in result.stdout


def test_init_creates_the_schema_and_running_it_again_changes_nothing(db_url):
    first = run("init", db_url)
    again = run("init", db_url)
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert json.loads(first.stdout)["schema_version"] >= 2  # tasks, then waits
    assert json.loads(again.stdout) == json.loads(first.stdout)


def test_info_shows_the_retention_period(db_url):
    postroom.open_store(db_url).close()
    result = run("info", db_url)
    assert result.returncode == 0 and '"retention_seconds": 604800.0' in result.stdout


def test_init_publishes_a_new_stores_retention_first_hand(db_url):
    result = run("init", db_url, "--retention", "3600")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["retention_seconds"] == 3600.0 and "previous_retention_seconds" not in shown
    with postroom.open_store(db_url) as store:
        assert store.retention == 3600.0


def test_init_changes_a_stores_retention_and_every_opener_then_adopts_it(db_url):
    postroom.open_store(db_url).close()
    result = run("init", db_url, "--retention", "86400")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["previous_retention_seconds"], shown["retention_seconds"]) == (604800.0,
                                                                                 86400.0)
    assert shown["earlier_retention_honoured"]["seconds"] == 604800.0  # it was shortened
    assert json.loads(run("info", db_url).stdout)["retention_seconds"] == 86400.0
    with postroom.open_store(db_url) as store:
        assert store.retention == 86400.0


def test_init_refuses_a_bad_retention_before_touching_the_database(tmp_path):
    path = tmp_path / "new.db"
    result = run("init", f"sqlite:///{path}", "--retention", "nan")
    assert result.returncode == 2 and "retention" in result.stderr
    assert "Traceback" not in result.stderr
    assert not path.exists()


def test_info_on_a_missing_file_creates_nothing(tmp_path):
    path = tmp_path / "typo.db"
    result = run("info", f"sqlite:///{path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not path.exists()


@pytest.mark.parametrize("command", [["info"], ["status"], ["cancel", "t-1", "--reason", "r"]])
def test_a_command_on_a_database_without_a_store_leaves_it_as_it_was(tmp_path, command):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE theirs (x)")
    before = path.read_bytes()
    result = run(command[0], f"sqlite:///{path}", *command[1:])
    assert result.returncode == 2 and "no postroom store" in result.stderr
    assert path.read_bytes() == before  # no tables added, journal mode not switched


def test_info_refuses_an_older_schema_without_upgrading_it(make_url):
    url = make_url("old")
    with closing(Database(dialect_for_url(url))) as database:
        database.migrate("store", target=2)
        result = run("info", url)
        assert result.returncode == 2
        assert "version 2" in result.stderr and "postroom init upgrades it" in result.stderr
        assert database.schema_version("store") == 2


def test_info_says_its_settings_are_postroom_defaults(db_url):
    postroom.open_store(db_url).close()
    shown = json.loads(run("info", db_url).stdout)
    assert shown["settings_from"].startswith("postroom's defaults")


def test_audit_checks_every_url_even_after_one_that_cannot_be_read(tmp_path, db_url, store,
                                                                      auth):
    store.receive(auth, envelope())
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    result = run("audit", missing, db_url)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{missing}: database:")
    assert lines[1] == f"{redacted_url(db_url)}: clean"


def test_audit_reports_a_schema_it_does_not_know_instead_of_checking_it(make_url):
    old, new = make_url("old"), make_url("new")
    with closing(Database(dialect_for_url(old))) as database:
        database.migrate("store", target=2)
    with closing(Database(dialect_for_url(new))) as database:
        latest = database.migrate("store")
        with database.transaction(postroom.db.Write("test.schema")) as tx:
            tx.execute(  # as a later postroom would have left it
                "UPDATE postroom_schema SET version = :v WHERE component = 'store'",
                {"v": latest + 1})
    result = run("audit", old, new)
    assert result.returncode == 1
    assert "schema: store: version 2" in result.stdout and "upgrades it" in result.stdout
    assert "written" not in result.stdout and "wrote it" in result.stdout


def test_audit_leaves_the_files_journal_mode_as_it_found_it(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE theirs (x)")
    run("audit", f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_passwords_are_masked_in_urls_shown():
    assert redacted_url("postgresql://app:s3cret@db:5432/q") == "postgresql://app:***@db:5432/q"
    assert redacted_url("postgresql://db/q?user=app&password=s3cret&sslmode=require") == (
        "postgresql://db/q?user=app&password=***&sslmode=require")
    assert redacted_url("sqlite:///var/lib/postroom.db") == "sqlite:///var/lib/postroom.db"


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_code_2(tmp_path):
    result = run("info", f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: SchemaError: no postroom store at sqlite:///{tmp_path / 'missing' / 'store.db'}"
        ": there is no such file (postroom init creates one)"]


def test_demo_waits_tells_the_durable_flow_and_succeeds():
    result = run("demo", "waits")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for evidence in ("open_wait -> opened 1", "generation 1: waiting", "times out 1 wait",
                     "hops 1, its parent refund-17", "open_wait -> opened 2",
                     "human_approved: true tries the refund: NotApproved",
                     "she said yes\" to the approval request: Unauthorized",
                     "generation 2: accepted", "granted by alice", "replay of accepted",
                     "time high-water unchanged: True", "stale_generation",
                     "exit code 73", "continuations 0", "resume again: replay",
                     "another claim finds nothing", "consuming the approval (uses 1 of 1)",
                     "audit      clean", "every step held"):
        assert evidence in out, evidence


def test_bench_refuses_a_results_file_in_a_missing_folder_before_measuring(tmp_path):
    result = run("bench", "--quick", "--only", "single", "--results",
                 str(tmp_path / "missing" / "results.md"))
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert "raw" not in result.stderr  # nothing was measured


def test_the_worker_help_states_the_quick_handler_time_the_worker_uses():
    from click.testing import CliRunner

    from postroom.cli import main
    from postroom.runtime.worker import QUICK_HANDLER

    shown = CliRunner().invoke(main, ["worker", "--help"], terminal_width=200).output
    assert f"within {QUICK_HANDLER * 1000:g} ms" in " ".join(shown.split())
