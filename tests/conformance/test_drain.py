"""The multi-host simulation, small: processes SIGKILLed at random while a queue drains.

(``postroom drain URL`` runs the full size: 10,000 tasks.)
"""

from __future__ import annotations

import math

import pytest

import postroom
from tests.harness.drain import run_drain
from tests.support import envelope


def test_a_drain_with_random_sigkills_loses_nothing_and_doubles_nothing(db_url):
    report = run_drain(db_url, tasks=300, workers=8, dispatchers=2, kill_every=0.25,
                       lease=1.0, seed=7, timeout=240, echo=lambda line: None)
    assert report.problems == []
    assert report.kills > 0
    assert report.effects == report.distinct_effects == 300


def test_a_drain_refuses_a_receiver_that_already_holds_effects(store, auth, make_url):
    used = make_url("receiver")
    with postroom.Receiver.open(used) as receiver:
        store.receive(auth, envelope())
        store.finish(store.claim("w"), None)
        assert store.dispatch(postroom.InProcessTransport(receiver)).sent == 1
    with pytest.raises(postroom.InvalidInput, match="receiver already holds effects"):
        run_drain(make_url("fresh"), used, tasks=10, echo=lambda line: None)


@pytest.mark.parametrize(("option", "value"), [("kill_every", -1.0), ("kill_every", math.nan),
                                               ("timeout", math.inf), ("timeout", 0.0)])
def test_a_drain_refuses_a_time_that_is_not_a_sane_number_of_seconds(db_url, option, value):
    with pytest.raises(postroom.InvalidInput, match=option):
        run_drain(db_url, tasks=10, echo=lambda line: None, **{option: value})
