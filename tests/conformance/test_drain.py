"""The multi-host simulation, small: processes SIGKILLed at random while a queue drains.

(``postroom drain URL`` runs the full size: 10,000 tasks.)
"""

from __future__ import annotations

from postroom.drain import run_drain


def test_a_drain_with_random_sigkills_loses_nothing_and_doubles_nothing(db_url):
    report = run_drain(db_url, tasks=300, workers=8, dispatchers=2, kill_every=0.25,
                       lease=1.0, seed=7, timeout=240, echo=lambda line: None)
    assert report.problems == []
    assert report.kills > 0
    assert report.effects == report.distinct_effects == 300
