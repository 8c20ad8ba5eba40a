"""``python -m tests.harness scenarios --check`` re-runs the frozen wait scenarios and fails on
a difference."""

from __future__ import annotations

import json

from postroom import faults, waits
from tests.cli.test_harness import harness
from tests.harness import scenarios


def test_every_frozen_scenario_holds_when_run_for_real():
    result = harness("scenarios", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    groups = len(scenarios.load()["groups"])
    assert f"PASS: {groups} scenario groups" in result.stdout
    assert groups >= 11


def test_a_wrong_expectation_fails_the_check_and_names_the_step(tmp_path):
    document = scenarios.load()
    happy = document["groups"][0]
    assert happy["steps"][2]["expect"]["result"] == "accepted"
    happy["steps"][2]["expect"]["result"] = "closed"
    document["groups"] = [happy]
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(document), "utf-8")
    result = harness("scenarios", "--check", "--file", str(path))
    assert result.returncode == 1
    assert 'happy_path/happy_path: step 3 (signal): expected {"result": "closed"' in result.stdout


def test_a_wait_fault_point_without_a_crash_case_fails_the_check():
    document = scenarios.load()
    for group in document["groups"]:
        group["cases"] = [case for case in group.get("cases", [])
                          if case["name"] != "resume.after_consume"]
    problems = scenarios.check(document, [])
    assert problems == ["fault point resume.after_consume has no crash step"]


def test_the_crash_cases_cover_every_registered_wait_fault_point():
    names = {op.name for op in waits.OPERATIONS}
    registered = {p.name for p in faults.registered() if p.name.split(".", 1)[0] in names}
    assert registered == scenarios.crash_points(scenarios.load())
    assert len(registered) == 17


def test_without_check_it_prints_what_each_step_did(tmp_path):
    document = scenarios.load()
    document["groups"] = document["groups"][:1]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(document), "utf-8")
    result = harness("scenarios", "--file", str(path))
    assert result.returncode == 0
    [case] = json.loads(result.stdout)
    assert case["reports"][2] == {"result": "accepted", "received_at": 3}
