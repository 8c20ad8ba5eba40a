"""Fault points are named, registered on import, and inert until armed."""

import pytest

import postroom
from postroom import faults
from postroom.db.database import Database, Write


def test_every_commit_has_a_before_and_an_after_point():
    names = {p.name for p in faults.registered()}
    for operation in ("receive", "receive_atomic", "claim", "renew", "finish", "fail",
                      "cancel", "sweep", "dispatch.claim", "dispatch.record", "requeue",
                      "prune", "receiver.accept", "migrate"):
        assert {f"{operation}.before_commit", f"{operation}.after_commit"} <= names


def test_delivery_has_points_around_the_remote_commit():
    names = {p.name for p in faults.registered()}
    assert {"delivery.before_remote_commit", "delivery.after_remote_commit"} <= names


def test_an_unarmed_point_does_nothing():
    faults.hit("finish.before_commit")


def test_arming_an_unknown_point_is_refused():
    with pytest.raises(KeyError):
        faults.arm("no.such.point", faults.crash())


def test_an_armed_point_fires_the_given_number_of_times():
    Write("test_only")
    fired = []
    faults.arm("test_only.before_commit", fired.append, times=2)
    for _ in range(3):
        faults.hit("test_only.before_commit")
    assert fired == ["test_only.before_commit"] * 2


def test_an_error_before_commit_rolls_the_transaction_back(store, auth):
    boom = faults.raising(RuntimeError)
    with faults.armed("receive.before_commit", boom), pytest.raises(RuntimeError):
        store.receive(auth, postroom.Envelope(message_id="m", sender="planner", payload={},
                                              deadline=2e6))
    assert store.info()["tasks"] == {}


def test_an_error_after_commit_leaves_the_commit_in_place(store, auth):
    boom = faults.raising(RuntimeError)
    with faults.armed("receive.after_commit", boom), pytest.raises(RuntimeError):
        store.receive(auth, postroom.Envelope(message_id="m", sender="planner", payload={},
                                              deadline=2e6))
    assert store.info()["tasks"] == {"pending": 1}


def test_a_receiver_that_fails_to_open_releases_its_database(tmp_path, monkeypatch):
    closed = []
    # A lambda, so the patched method receives the instance (a bound builtin would not).
    monkeypatch.setattr(Database, "close", lambda self: closed.append(self))  # noqa: PLW0108
    with faults.armed("migrate.before_commit", faults.raising(RuntimeError)), \
            pytest.raises(RuntimeError):
        postroom.Receiver.open(f"sqlite:///{tmp_path / 'receiver.db'}")
    assert len(closed) == 1
