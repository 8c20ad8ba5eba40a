"""An idle worker's claim takes no write lock: it looks in a read transaction first.

SQLite's write lock is the whole database's. A claim that finds nothing to do (nothing
claimable, no lease or deadline to sweep) must neither wait behind another writer nor hold
other writers up; only a claim with work to do takes the lock, and decides again under it.
"""

from __future__ import annotations

import pytest

import postroom
from tests.sqlite.conftest import write_lock_held
from tests.support import envelope


def test_an_empty_claim_returns_none_while_another_connection_holds_the_write_lock(
        impatient_store, path):
    with write_lock_held(path):
        assert impatient_store.claim("w") is None


def test_an_empty_claim_batch_returns_nothing_while_another_connection_holds_the_write_lock(
        impatient_store, path):
    with write_lock_held(path):
        assert impatient_store.claim_batch("w", 10, queues=["a", "b"]) == []


def test_an_empty_reply_claim_returns_nothing_while_another_connection_holds_the_write_lock(
        impatient_store, path):
    with write_lock_held(path):
        assert impatient_store.claim_replies("d") == []


def test_a_claim_with_a_task_to_take_waits_for_the_write_lock(impatient_store, path, auth):
    impatient_store.receive(auth, envelope())
    with write_lock_held(path), pytest.raises(postroom.StoreUnavailable):
        impatient_store.claim("w")  # it had work, so it asked for the lock (and gave up)


def test_a_claim_with_only_a_lease_to_recover_waits_for_the_write_lock(
        impatient_store, path, auth, clock):
    impatient_store.receive(auth, envelope(queue="elsewhere"))
    impatient_store.claim("w1", queues="elsewhere")
    clock.advance(impatient_store.settings.lease)
    with write_lock_held(path), pytest.raises(postroom.StoreUnavailable):
        impatient_store.claim("w2")  # its own queue is empty, but its sweep has work


def test_a_reply_claim_with_a_reply_to_deliver_waits_for_the_write_lock(
        impatient_store, path, auth):
    impatient_store.receive(auth, envelope())
    impatient_store.finish(impatient_store.claim("w"), {"ok": True})
    with write_lock_held(path), pytest.raises(postroom.StoreUnavailable):
        impatient_store.claim_replies("d")
