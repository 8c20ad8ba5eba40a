"""SPEC §5: waits, signals, timeouts and continuations, on every backend."""

from __future__ import annotations

import pytest

import postroom
from postroom import (
    ContinuationKind,
    ExpireResult,
    FollowUp,
    OpenResult,
    ResumeResult,
    SignalResult,
    TaskState,
    WaitState,
)
from postroom.audit import audit_database
from tests.support import START, database_of, envelope

FLOW, STEP = "case-a", "details"
ALICE = postroom.AuthContext(principal="alice")
BOB = postroom.AuthContext(principal="bob")


def open_first(store: postroom.Store, deadline: float = START + 10, **options: object) -> int:
    opening = store.open_wait(FLOW, STEP, 0, deadline, **options)
    assert opening.result is OpenResult.OPENED
    return opening.generation


def high_water(store: postroom.Store) -> float:
    return store.info()["time_high_water"]


def counts(store: postroom.Store) -> tuple[dict[str, int], int]:
    info = store.info()
    return info["waits"], info["continuations_unconsumed"]


@pytest.fixture
def parent(store, auth):
    """A task that asks the question: the parent of the follow-up a resume enqueues."""
    return store.task(store.receive(auth, envelope("ask", hops=1, queue="asks")).task_id)


# -- open_wait ---------------------------------------------------------------------------------


def test_the_first_registration_opens_generation_one(store, clock):
    opening = store.open_wait(FLOW, STEP, 0, START + 10)
    assert (opening.result, opening.generation, opening.replay) == (OpenResult.OPENED, 1, False)
    wait = store.wait(FLOW, STEP)
    assert (wait.generation, wait.state, wait.deadline) == (1, WaitState.WAITING, START + 10)
    assert (wait.opened_at, wait.ended_at, wait.event_id) == (START, None, None)


def test_a_registration_with_an_old_expected_generation_is_stale(store):
    open_first(store)
    opening = store.open_wait(FLOW, STEP, 0, START + 10)
    assert (opening.result, opening.generation) == (OpenResult.STALE, 1)


def test_a_registration_ahead_of_the_slot_is_stale(store):
    assert store.open_wait(FLOW, STEP, 3, START + 10).result is OpenResult.STALE
    with pytest.raises(postroom.NotFound):
        store.wait(FLOW, STEP)


def test_a_new_generation_is_busy_while_the_current_one_waits(store):
    open_first(store)
    assert store.open_wait(FLOW, STEP, 1, START + 20).result is OpenResult.BUSY


def test_a_new_generation_waits_for_the_continuation_to_be_consumed(store):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    assert store.open_wait(FLOW, STEP, 1, START + 20).result is OpenResult.PENDING_CONTINUATION
    store.resume(FLOW, STEP, 1, None)
    opening = store.open_wait(FLOW, STEP, 1, START + 20)
    assert (opening.result, opening.generation) == (OpenResult.OPENED, 2)
    assert store.wait(FLOW, STEP, 1).state is WaitState.SIGNALED


def test_a_refused_registration_writes_nothing_and_does_not_move_time(store, clock):
    open_first(store)
    before = (counts(store), high_water(store))
    clock.advance(5)
    for expected in (0, 1, 7):
        assert store.open_wait(FLOW, STEP, expected, START + 20).result is not OpenResult.OPENED
    assert (counts(store), high_water(store)) == before


def test_slots_are_independent(store):
    open_first(store)
    assert store.open_wait(FLOW, "other-step", 0, START + 10).result is OpenResult.OPENED
    assert store.open_wait("other-flow", STEP, 0, START + 10).result is OpenResult.OPENED


def test_a_retried_request_id_replays_the_opening_instead_of_stale(store):
    first = store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    again = store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    assert (again.result, again.generation, again.replay) == (OpenResult.OPENED, 1, True)
    assert first.replay is False
    assert store.open_wait(FLOW, STEP, 0, START + 10).result is OpenResult.STALE


def test_a_request_id_replays_even_after_later_generations_opened(store):
    store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    store.resume(FLOW, STEP, 1, None)
    store.open_wait(FLOW, STEP, 1, START + 20, request_id="r-2")
    again = store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    assert (again.result, again.generation, again.replay) == (OpenResult.OPENED, 1, True)


@pytest.mark.parametrize("change", [{"deadline": START + 11}, {"expected_generation": 1}])
def test_a_request_id_with_other_arguments_is_a_collision_and_writes_nothing(store, change):
    store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    before = counts(store)
    arguments = {"expected_generation": 0, "deadline": START + 10} | change
    with pytest.raises(postroom.PayloadCollision, match="r-1"):
        store.open_wait(FLOW, STEP, request_id="r-1", **arguments)
    assert counts(store) == before


def test_a_request_id_belongs_to_its_slot(store):
    store.open_wait(FLOW, STEP, 0, START + 10, request_id="r-1")
    assert store.open_wait(FLOW, "s2", 0, START + 10, request_id="r-1").replay is False


def test_a_parent_task_must_exist(store):
    with pytest.raises(postroom.NotFound, match="no task"):
        store.open_wait(FLOW, STEP, 0, START + 10, task_id="missing")
    assert counts(store) == ({}, 0)


def test_a_wait_records_its_parent_task(store, parent):
    open_first(store, task_id=parent.task_id)
    assert store.wait(FLOW, STEP).task_id == parent.task_id


# -- signal ------------------------------------------------------------------------------------


def test_an_accepted_signal_ends_the_wait_with_a_signal_continuation(store, clock):
    open_first(store)
    clock.advance(3)
    receipt = store.signal(ALICE, "e1", FLOW, STEP, 1, {"answer": "yes"})
    assert (receipt.result, receipt.recorded, receipt.received_at) == (
        SignalResult.ACCEPTED, SignalResult.ACCEPTED, START + 3)
    wait = store.wait(FLOW, STEP)
    assert (wait.state, wait.ended_at, wait.event_principal, wait.event_id) == (
        WaitState.SIGNALED, START + 3, "alice", "e1")
    [continuation] = store.continuations()
    assert (continuation.kind, continuation.value, continuation.generation) == (
        ContinuationKind.SIGNAL, {"answer": "yes"}, 1)


def test_the_deadline_is_strict_a_signal_exactly_at_it_is_too_late(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 10)
    receipt = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    assert receipt.result is SignalResult.TOO_LATE
    assert store.wait(FLOW, STEP).state is WaitState.TIMED_OUT
    [continuation] = store.continuations()
    assert (continuation.kind, continuation.value) == (ContinuationKind.TIMEOUT, None)


def test_a_signal_just_before_the_deadline_is_accepted(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 9.999)
    assert store.signal(ALICE, "e1", FLOW, STEP, 1, "yes").result is SignalResult.ACCEPTED


def test_a_late_signal_times_the_wait_out_itself_without_waiting_for_a_sweep(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 500)
    assert store.signal(ALICE, "e1", FLOW, STEP, 1, "yes").result is SignalResult.TOO_LATE
    assert store.expire_due() == 0
    assert store.expire(FLOW, STEP, 1) is ExpireResult.CLOSED


def test_a_signal_to_an_ended_generation_is_closed(store):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    assert store.signal(ALICE, "e2", FLOW, STEP, 1, "no").result is SignalResult.CLOSED
    assert store.signal(BOB, "e1", FLOW, STEP, 1, "no").result is SignalResult.CLOSED
    assert store.wait(FLOW, STEP).event_id == "e1"


def test_a_signal_to_an_older_generation_is_stale_and_never_wakes_the_new_one(store):
    open_first(store)
    store.expire(FLOW, STEP, 1)
    store.signal(ALICE, "e0", FLOW, STEP, 1, "first")
    store.resume(FLOW, STEP, 1, None)
    store.open_wait(FLOW, STEP, 1, START + 20)
    receipt = store.signal(ALICE, "late", FLOW, STEP, 1, "answer to the first question")
    assert receipt.result is SignalResult.STALE_GENERATION
    assert store.wait(FLOW, STEP).state is WaitState.WAITING


@pytest.mark.parametrize(("flow", "generation"), [("nobody", 1), (FLOW, 2)])
def test_a_signal_to_a_wait_that_does_not_exist_is_unknown_wait(store, flow, generation):
    open_first(store)
    receipt = store.signal(ALICE, "e1", flow, STEP, generation, "yes")
    assert receipt.result is SignalResult.UNKNOWN_WAIT
    assert store.wait(FLOW, STEP).state is WaitState.WAITING


def test_an_early_signal_stays_unknown_wait_after_the_wait_opens(store):
    early = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    open_first(store)
    again = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    assert (early.result, again.result, again.recorded) == (
        SignalResult.UNKNOWN_WAIT, SignalResult.REPLAY, SignalResult.UNKNOWN_WAIT)
    assert store.wait(FLOW, STEP).state is WaitState.WAITING
    assert store.signal(ALICE, "e2", FLOW, STEP, 1, "yes").result is SignalResult.ACCEPTED


def test_a_replay_returns_the_original_receipt_after_the_deadline_and_the_end(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 3)
    first = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    clock.set(START + 20)
    store.expire_due()
    again = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    assert (again.result, again.recorded, again.received_at) == (
        SignalResult.REPLAY, SignalResult.ACCEPTED, first.received_at)
    assert store.wait(FLOW, STEP).state is WaitState.SIGNALED


@pytest.mark.parametrize(("flow", "step", "generation", "value"), [
    (FLOW, STEP, 1, "no"),
    (FLOW, STEP, 2, "yes"),
    (FLOW, "other", 1, "yes"),
    ("other", STEP, 1, "yes"),
])
def test_the_same_event_id_with_another_body_is_a_conflict(store, flow, step, generation,
                                                            value):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    receipt = store.signal(ALICE, "e1", flow, step, generation, value)
    assert (receipt.result, receipt.recorded) == (SignalResult.CONFLICT, SignalResult.ACCEPTED)
    assert (receipt.flow, receipt.step, receipt.generation) == (FLOW, STEP, 1)


def test_replays_and_conflicts_write_nothing_and_do_not_move_time(store, clock):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    before = (counts(store), high_water(store))
    clock.advance(60)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    store.signal(ALICE, "e1", FLOW, STEP, 1, "no")
    assert (counts(store), high_water(store)) == before


def test_every_new_receipt_moves_time_even_when_nothing_was_adopted(store, clock):
    clock.advance(5)
    store.signal(ALICE, "early", FLOW, STEP, 1, "yes")
    assert high_water(store) == START + 5


def test_event_ids_are_scoped_by_principal(store):
    open_first(store)
    by_alice = store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    by_bob = store.signal(BOB, "e1", FLOW, STEP, 1, "something else")
    assert (by_alice.result, by_bob.result) == (SignalResult.ACCEPTED, SignalResult.CLOSED)
    assert store.signal(BOB, "e1", FLOW, STEP, 1, "something else").result is (
        SignalResult.REPLAY)


def test_one_tenant_cannot_jam_another_tenants_event_id(store):
    store.signal(BOB, "e1", "elsewhere", STEP, 1, "jam")
    open_first(store)
    assert store.signal(ALICE, "e1", FLOW, STEP, 1, "yes").result is SignalResult.ACCEPTED


def test_a_signal_needs_an_allowed_principal_and_writes_nothing_otherwise(db_url, clock):
    settings = postroom.Settings(allowed_sources=frozenset({"alice"}))
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        open_first(store)
        with pytest.raises(postroom.Unauthorized):
            store.signal(BOB, "e1", FLOW, STEP, 1, "yes")
        with pytest.raises(postroom.Unauthorized):
            store.signal("alice", "e1", FLOW, STEP, 1, "yes")  # type: ignore[arg-type]
        assert store.wait(FLOW, STEP).state is WaitState.WAITING
        assert store.signal(ALICE, "e1", FLOW, STEP, 1, "yes").result is SignalResult.ACCEPTED


# -- expire and the sweep ----------------------------------------------------------------------


def test_expire_before_the_deadline_is_not_due_and_writes_nothing(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 9)
    assert store.expire(FLOW, STEP, 1) is ExpireResult.NOT_DUE
    assert counts(store) == ({"waiting": 1}, 0)


def test_expire_at_the_deadline_times_out_with_one_timeout_continuation(store, clock):
    open_first(store, deadline=START + 10)
    clock.set(START + 10)
    assert store.expire(FLOW, STEP, 1) is ExpireResult.TIMED_OUT
    assert store.expire(FLOW, STEP, 1) is ExpireResult.CLOSED
    wait = store.wait(FLOW, STEP)
    assert (wait.state, wait.ended_at, wait.event_id) == (WaitState.TIMED_OUT, START + 10, None)
    assert [c.kind for c in store.continuations()] == [ContinuationKind.TIMEOUT]


def test_expire_after_an_accepted_signal_is_closed(store, clock):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    clock.advance(100)
    assert store.expire(FLOW, STEP, 1) is ExpireResult.CLOSED
    assert store.wait(FLOW, STEP).state is WaitState.SIGNALED


def test_expire_of_an_unknown_wait(store):
    assert store.expire(FLOW, STEP, 1) is ExpireResult.UNKNOWN_WAIT


def test_the_sweep_times_out_only_due_waits(store, clock):
    for index, deadline in enumerate((START + 5, START + 10, START + 50)):
        store.open_wait(FLOW, f"s{index}", 0, deadline)
    clock.set(START + 10)
    assert store.expire_due() == 2
    states = [store.wait(FLOW, f"s{index}").state for index in range(3)]
    assert states == [WaitState.TIMED_OUT, WaitState.TIMED_OUT, WaitState.WAITING]
    assert store.expire_due() == 0


def test_the_sweep_works_in_bounded_batches_until_none_is_due(db_url, clock):
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(sweep_limit=3)) as store:
        for index in range(8):
            store.open_wait(FLOW, f"s{index}", 0, START + 1)
        clock.advance(1)
        assert store.expire_due() == 8
        assert store.info()["waits"] == {"timed_out": 8}


def test_an_idle_sweep_writes_nothing_and_does_not_move_time(store, clock):
    open_first(store, deadline=START + 100)
    before = high_water(store)
    clock.advance(10)
    assert store.expire_due() == 0
    assert high_water(store) == before


# -- resume ------------------------------------------------------------------------------------


def test_resume_enqueues_the_follow_up_as_a_child_of_the_waits_task(store, parent, clock):
    open_first(store, task_id=parent.task_id)
    store.signal(ALICE, "e1", FLOW, STEP, 1, {"approve": True})
    clock.advance(1)
    resumed = store.resume(FLOW, STEP, 1, FollowUp(message_id="next", payload={"go": 1}))
    assert (resumed.result, resumed.kind) == (ResumeResult.RESUMED, ContinuationKind.SIGNAL)
    child = store.task(resumed.task_id)
    assert (child.parent_task_id, child.hops, child.state) == (
        parent.task_id, parent.hops + 1, TaskState.PENDING)
    assert (child.queue, child.deadline, child.payload) == (parent.queue, parent.deadline,
                                                            {"go": 1})
    assert store.continuations() == []


def test_a_retried_resume_replays_without_a_second_effect(store, parent):
    open_first(store, task_id=parent.task_id)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    first = store.resume(FLOW, STEP, 1, FollowUp(message_id="next", payload={}))
    tasks_before = store.info()["tasks"]
    again = store.resume(FLOW, STEP, 1, FollowUp(message_id="other", payload={"x": 1}))
    assert (again.result, again.task_id) == (ResumeResult.REPLAY, first.task_id)
    assert store.info()["tasks"] == tasks_before


def test_the_follow_up_is_claimed_and_run_like_any_task(store, parent):
    open_first(store, task_id=parent.task_id)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    resumed = store.resume(FLOW, STEP, 1, FollowUp(message_id="next", payload={"n": 2},
                                                  queue="follow-ups"))
    claim = store.claim("w", queues="follow-ups")
    assert claim is not None and claim.task_id == resumed.task_id
    store.finish(claim, "done")
    assert store.claim("w", queues="follow-ups") is None


def test_a_timeout_continuation_is_resumed_like_a_signal_one(store, parent, clock):
    open_first(store, task_id=parent.task_id, deadline=START + 1)
    clock.advance(1)
    store.expire_due()
    resumed = store.resume(FLOW, STEP, 1, FollowUp(message_id="ask-again", payload={}))
    assert (resumed.result, resumed.kind) == (ResumeResult.RESUMED, ContinuationKind.TIMEOUT)
    assert store.task(resumed.task_id).parent_task_id == parent.task_id


def test_every_generation_may_use_the_same_follow_up_message_id(store, parent):
    task_ids = []
    for generation in (1, 2):
        store.open_wait(FLOW, STEP, generation - 1, START + 10, task_id=parent.task_id)
        store.signal(ALICE, f"e{generation}", FLOW, STEP, generation, "yes")
        task_ids.append(store.resume(FLOW, STEP, generation,
                                     FollowUp(message_id="next", payload={})).task_id)
    assert len(set(task_ids)) == 2


def test_resume_without_an_effect_consumes_the_continuation_and_enqueues_nothing(store):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    resumed = store.resume(FLOW, STEP, 1, None)
    assert (resumed.result, resumed.task_id) == (ResumeResult.RESUMED, None)
    assert store.info()["tasks"] == {} and store.continuations() == []


def test_a_follow_up_needs_a_wait_with_a_parent_task_and_nothing_is_consumed(store):
    open_first(store)
    store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
    with pytest.raises(postroom.InvalidInput) as refused:
        store.resume(FLOW, STEP, 1, FollowUp(message_id="next", payload={}))
    assert refused.value.field == "effect"
    assert len(store.continuations()) == 1


@pytest.mark.parametrize("generation", [1, 2])
def test_resume_without_a_continuation_is_not_found(store, generation):
    open_first(store)
    with pytest.raises(postroom.NotFound, match="no continuation"):
        store.resume(FLOW, STEP, generation, None)


def test_unconsumed_continuations_are_listed_oldest_first_and_survive_a_restart(
        db_url, clock, store):
    for index in range(3):
        store.open_wait(FLOW, f"s{index}", 0, START + 10)
    for index in (2, 0, 1):
        clock.advance(1)
        store.signal(ALICE, f"e{index}", FLOW, f"s{index}", 1, index)
    store.close()
    with postroom.open_store(db_url, clock=clock) as reopened:
        listed = reopened.continuations()
        assert [(c.step, c.value) for c in listed] == [("s2", 2), ("s0", 0), ("s1", 1)]
        assert [c.step for c in reopened.continuations(limit=2)] == ["s2", "s0"]
        for continuation in listed:
            reopened.resume(continuation.flow, continuation.step, continuation.generation, None)
        assert reopened.continuations() == []


def test_pruning_keeps_a_task_while_its_wait_may_still_need_it(db_url, clock, transport):
    settings = postroom.Settings(retention=60.0)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        ask = store.receive(postroom.AuthContext(principal="planner"), envelope("ask"))
        store.open_wait(FLOW, STEP, 0, START + 1000, task_id=ask.task_id)
        store.finish(store.claim("w"), "asked")
        store.dispatch(transport)
        clock.advance(120)
        assert store.prune() == 0
        store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
        assert store.prune() == 0
        store.resume(FLOW, STEP, 1, None)
        assert store.prune() == 1


def test_pruning_a_finished_follow_up_leaves_the_wait_audit_clean(db_url, clock, transport):
    settings = postroom.Settings(retention=60.0)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        ask = store.receive(postroom.AuthContext(principal="planner"), envelope("ask"))
        store.open_wait(FLOW, STEP, 0, START + 1000, task_id=ask.task_id)
        store.signal(ALICE, "e1", FLOW, STEP, 1, "yes")
        follow_up = store.resume(FLOW, STEP, 1, FollowUp(message_id="next", payload={}))
        for _ in range(2):
            store.finish(store.claim("w"), "done")
        store.dispatch(transport, limit=2)
        clock.advance(120)
        assert store.prune() == 2  # the asking task and its follow-up
        with pytest.raises(postroom.NotFound):
            store.task(str(follow_up.task_id))
        assert audit_database(database_of(store)) == []
