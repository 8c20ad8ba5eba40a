"""``postroom schedule`` as real subprocesses: add, list, pause, resume, remove, and the exit
code of what cannot be."""

from __future__ import annotations

import json

import pytest

from tests.harness import children
from tests.harness.children import python

#: ``db_url`` names a store already made: these commands refuse a URL without one.
STORE_MADE = True


def run(*args: str) -> children.subprocess.CompletedProcess[str]:
    return children.run(python("-m", "postroom", "schedule", *args), timeout=120)


def test_the_schedule_commands_add_list_pause_resume_and_remove(db_url):
    added = run("add", "nightly", "--store", db_url, "--cron", "30 2 * * *", "--zone",
                "Europe/Berlin", "--queue", "reports", "--payload", '{"report": "daily"}',
                "--missed", "skip", "--operator", "alice")
    assert added.returncode == 0, added.stderr
    shown = json.loads(added.stdout)
    assert (shown["cron"], shown["zone"], shown["queue"], shown["payload"], shown["missed"],
            shown["created_by"]) == ("30 2 * * *", "Europe/Berlin", "reports",
                                     {"report": "daily"}, "skip", "alice")
    assert run("pause", "nightly", "--store", db_url, "--operator", "bob").returncode == 0
    listed = json.loads(run("list", "--store", db_url, "--json").stdout)["schedules"]
    assert [(s["name"], s["paused"], s["updated_by"]) for s in listed] == [
        ("nightly", True, "bob")]
    text = run("list", "--store", db_url).stdout
    assert "nightly  '30 2 * * *' (Europe/Berlin)  queue reports  paused" in text
    resumed = run("resume", "nightly", "--store", db_url)
    assert json.loads(resumed.stdout) == {"name": "nightly", "paused": False, "changed": True}
    assert run("remove", "nightly", "--store", db_url).returncode == 0
    assert run("list", "--store", db_url).stdout.strip() == "no schedules"


def test_pausing_a_paused_schedule_or_resuming_a_running_one_exits_1(db_url):
    assert run("add", "nightly", "--store", db_url, "--cron", "0 2 * * *").returncode == 0
    not_paused = run("resume", "nightly", "--store", db_url)
    assert (not_paused.returncode, not_paused.stderr.strip()) == (
        1, "refused: schedule nightly is not paused")
    assert run("pause", "nightly", "--store", db_url).returncode == 0
    again = run("pause", "nightly", "--store", db_url)
    assert (again.returncode, again.stdout, again.stderr.strip()) == (
        1, "", "refused: schedule nightly was paused already")


def test_another_definition_under_a_name_exits_2_unless_replaced(db_url):
    assert run("add", "r", "--store", db_url, "--cron", "0 * * * *").returncode == 0
    refused = run("add", "r", "--store", db_url, "--cron", "*/5 * * * *")
    assert refused.returncode == 2
    assert "Conflict" in refused.stderr and "--replace" in refused.stderr
    replaced = run("add", "r", "--store", db_url, "--cron", "*/5 * * * *", "--replace")
    assert json.loads(replaced.stdout)["cron"] == "*/5 * * * *"


def test_an_invalid_expression_or_payload_exits_2_naming_it(db_url):
    bad_cron = run("add", "r", "--store", db_url, "--cron", "61 * * * *")
    assert bad_cron.returncode == 2 and "cron: minute value 61" in bad_cron.stderr
    bad_payload = run("add", "r", "--store", db_url, "--cron", "* * * * *", "--payload", "{")
    assert bad_payload.returncode == 2 and "--payload" in bad_payload.stderr


def test_removing_a_schedule_that_is_not_there_exits_2(db_url):
    assert run("add", "other", "--store", db_url, "--cron", "0 * * * *").returncode == 0
    gone = run("remove", "never", "--store", db_url)
    assert gone.returncode == 2 and "no schedule 'never'" in gone.stderr


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["pause", "r"], ["resume", "r"],
                                  ["remove", "r"], ["add", "r", "--cron", "0 * * * *"]])
def test_a_url_without_a_store_is_refused_and_nothing_is_created(tmp_path, args):
    path = tmp_path / "typo.db"
    command, *rest = args
    result = run(command, *rest, "--store", f"sqlite:///{path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not path.exists()
