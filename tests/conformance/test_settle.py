"""SPEC §10: a worker's group commit. Many handlers' outcomes commit in one transaction, each
fenced and atomic on its own; one refused outcome never costs the others their commit."""

from __future__ import annotations

import dataclasses

import pytest

import postroom
from postroom import Failed, Finished, FollowUp, OpenWait, Released, TaskState
from postroom.db.wakeups import Wakeups
from tests.support import START, envelope, stored


@pytest.fixture
def claims(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(4)])
    return store.claim_batch("w", 4)


def test_finished_failed_and_released_outcomes_commit_together(store, claims):
    settled = store.settle([Finished(claim=claims[0], result={"n": 0}),
                            Failed(claim=claims[1], reason="flaky"),
                            Failed(claim=claims[2], reason="broken", retryable=False),
                            Released(claim=claims[3])])
    assert [s.state for s in settled] == [TaskState.DONE, TaskState.PENDING, TaskState.FAILED,
                                          TaskState.PENDING]
    assert all(s.ok for s in settled)
    assert store.task(claims[0].task_id).result == {"n": 0}
    assert store.reply(claims[0].task_id) is not None
    assert store.reply(claims[2].task_id).status == TaskState.FAILED
    assert store.task(claims[3].task_id).attempts == 0  # released: the attempt given back


def test_a_fenced_outcome_is_reported_and_the_others_commit(store, claims, clock):
    store.cancel(claims[1].task_id)
    settled = store.settle([Finished(claim=claim, result=i) for i, claim in enumerate(claims)])
    assert [s.ok for s in settled] == [True, False, True, True]
    assert isinstance(settled[1].error, postroom.Fenced)
    assert store.task(claims[1].task_id).state == TaskState.CANCELLED
    assert [store.task(c.task_id).state for c in (claims[0], claims[2], claims[3])] == [
        TaskState.DONE] * 3


def test_an_altered_claim_is_fenced_within_a_batch_and_writes_nothing_of_its_own(
        store, claims):
    forged = dataclasses.replace(claims[0], attempt=7)
    before = store.task(claims[0].task_id)
    settled = store.settle([Finished(claim=forged), Finished(claim=claims[1])])
    assert isinstance(settled[0].error, postroom.Fenced) and settled[1].ok
    assert store.task(claims[0].task_id) == before


def test_an_invalid_outcome_is_refused_naming_its_item_and_the_others_commit(store, claims):
    settled = store.settle([Finished(claim=claims[0], result={"bad": float("nan")}),
                            Finished(claim=claims[1], result="ok")])
    assert isinstance(settled[0].error, postroom.InvalidInput)
    assert "outcomes[0].result" in str(settled[0].error)
    assert settled[1].ok
    assert store.task(claims[0].task_id).state == TaskState.RUNNING


def test_something_that_is_not_an_outcome_is_refused_in_its_place(store, claims):
    settled = store.settle([claims[0], Finished(claim=claims[1])])
    assert isinstance(settled[0].error, postroom.InvalidInput) and settled[1].ok


def test_a_finish_whose_wait_cannot_open_undoes_itself_alone(store, claims):
    store.open_wait("f", "s", 0, START + 60)  # generation 1 taken: the finish's wait is stale
    settled = store.settle([
        Finished(claim=claims[0], result="asked",
                 waits=[OpenWait(flow="f", step="s", deadline=START + 60)]),
        Finished(claim=claims[1], result="asked",
                 waits=[OpenWait(flow="g", step="s", deadline=START + 60)])])
    assert isinstance(settled[0].error, postroom.WaitNotOpened)
    assert store.task(claims[0].task_id).state == TaskState.RUNNING
    assert store.reply(claims[0].task_id) is None
    assert settled[1].ok and settled[1].openings[0].generation == 1
    assert store.wait("g", "s").task_id == claims[1].task_id


def test_a_fenced_finish_with_follow_ups_writes_none_of_them_and_the_others_commit(
        store, claims):
    store.cancel(claims[0].task_id)
    settled = store.settle([
        Finished(claim=claims[0], result=1, follow_ups=[FollowUp(message_id="c", payload={})]),
        Finished(claim=claims[1], result=2, follow_ups=[FollowUp(message_id="c", payload={})])])
    assert isinstance(settled[0].error, postroom.Fenced) and settled[1].ok
    spawned = store.claim_batch("w2", 10)
    assert [claim.message_id for claim in spawned] == ["c"]
    assert store.task(spawned[0].task_id).parent_task_id == claims[1].task_id


def test_a_refused_savepoint_takes_back_its_wake_ups_and_counts(store, claims, monkeypatch):
    store.open_wait("f", "s", 0, START + 60)
    waiter = store.waiter(queues=[], replies=True)
    # Only the commit's own announcements are in question here. SQLite's watcher wakes
    # every waiter when it hears a commit while the store's connection is busy (it cannot
    # tell whose commit that was): a hint, which would make this test depend on timing.
    monkeypatch.setattr(Wakeups, "announce_all", lambda self: None)
    settled = store.settle([Finished(claim=claims[0], result="asked",
                                     waits=[OpenWait(flow="f", step="s",
                                                     deadline=START + 60)])])
    assert not settled[0].ok
    assert not waiter.wait(timeout=0)  # no reply was written, so no reply was announced


def test_settling_nothing_writes_nothing(store, claims):
    before = stored(store)
    assert store.settle([]) == []
    assert stored(store) == before


def test_renew_all_extends_every_current_lease_and_explains_the_others(store, claims, clock):
    clock.advance(10)
    store.cancel(claims[2].task_id)
    renewed = store.renew_all(claims)
    assert isinstance(renewed[2], postroom.Fenced)
    for claim in (renewed[0], renewed[1], renewed[3]):
        assert isinstance(claim, postroom.Claim)
        assert claim.lease_until == START + 10 + store.settings.lease
        assert store.task(claim.task_id).lease_until == claim.lease_until


def test_renew_all_fences_an_altered_claim(store, claims):
    renewed = store.renew_all([dataclasses.replace(claims[0], hops=3), claims[1]])
    assert isinstance(renewed[0], postroom.Fenced) and isinstance(renewed[1], postroom.Claim)
    assert store.task(claims[0].task_id).lease_until == claims[0].lease_until


def test_renew_all_refuses_a_mistyped_claim_naming_it(store, claims):
    with pytest.raises(postroom.InvalidInput, match=r"claims\[1\]\.fence"):
        store.renew_all([claims[0], dataclasses.replace(claims[1], fence="1")])


def test_settle_and_claim_commits_the_outcomes_and_takes_the_next_tasks_together(store, auth,
                                                                                 claims):
    store.receive_atomic(auth, [envelope(f"next-{i}") for i in range(3)])
    settled, taken = store.settle_and_claim(
        [Finished(claim=claims[0], result=0), Failed(claim=claims[1], reason="flaky")],
        "w", 5)
    assert [s.state for s in settled] == [TaskState.DONE, TaskState.PENDING]
    # The failed task waits out its backoff; the three new ones are claimed.
    assert sorted(claim.message_id for claim in taken) == ["next-0", "next-1", "next-2"]
    assert all(store.task(claim.task_id).owner == "w" for claim in taken)


def test_settle_and_claim_with_a_fenced_outcome_still_claims(store, auth, claims):
    store.receive(auth, envelope("next"))
    store.cancel(claims[0].task_id)
    settled, taken = store.settle_and_claim([Finished(claim=claims[0])], "w", 1)
    assert isinstance(settled[0].error, postroom.Fenced)
    assert [claim.message_id for claim in taken] == ["next"]


def test_settle_and_claim_with_nothing_to_settle_is_a_claim(store, auth, claims):
    store.receive(auth, envelope("next"))
    settled, taken = store.settle_and_claim([], "w", 2, queues=["default"])
    assert settled == [] and [claim.message_id for claim in taken] == ["next"]
