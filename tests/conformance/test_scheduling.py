"""SPEC §1, §3 and the scheduling issue: run later, priorities without starvation, paused and
limited queues, and re-running a task on purpose."""

from __future__ import annotations

import pytest

import postroom
from postroom import TaskState
from postroom.db.database import Write
from postroom.validation import task_id_for
from tests.support import START, database_of, envelope

# -- run later ----------------------------------------------------------------------------------


def test_a_task_held_until_later_is_stored_at_once_and_claimable_from_then(store, auth, clock):
    ack = store.receive(auth, envelope(not_before=START + 60))
    assert (ack.ack, ack.duplicate) == ("stored", False)
    task = store.task(ack.task_id)
    assert (task.state, task.available_at) == (TaskState.PENDING, START + 60)
    assert store.claim("w") is None
    clock.advance(60)
    assert store.claim("w").task_id == ack.task_id


def test_not_before_is_part_of_the_fingerprint(store, auth):
    store.receive(auth, envelope(not_before=START + 60))
    assert store.receive(auth, envelope(not_before=START + 60)).duplicate
    with pytest.raises(postroom.PayloadCollision):
        store.receive(auth, envelope(not_before=START + 61))


def test_an_envelope_without_scheduling_fields_keeps_its_fingerprint(store, auth):
    from postroom.validation import check_envelope

    plain = check_envelope("planner", envelope().to_dict(), limits=postroom.Limits())
    assert '"not_before"' not in plain.envelope and '"priority"' not in plain.envelope


@pytest.mark.parametrize(("value", "problem"), [(START + 3600, "deadline"),
                                                ("soon", "finite number"), (True, "number")])
def test_a_not_before_that_cannot_be_is_refused_naming_it(store, auth, value, problem):
    with pytest.raises(postroom.InvalidEnvelope, match="not_before") as refused:
        store.receive(auth, envelope(not_before=value))
    assert problem in str(refused.value)


def test_a_task_held_until_later_expires_if_its_deadline_comes_first(store, auth, clock):
    with pytest.raises(postroom.InvalidEnvelope, match="not_before"):
        store.receive(auth, envelope(deadline=START + 10, not_before=START + 20))


# -- priorities ---------------------------------------------------------------------------------


def test_a_higher_priority_is_claimed_first_then_availability_then_arrival(store, auth, clock):
    store.receive(auth, envelope("low", priority=-1))
    clock.advance(1)
    store.receive(auth, envelope("normal-1"))
    store.receive(auth, envelope("high", priority=3))
    clock.advance(1)
    store.receive(auth, envelope("normal-2"))
    order = [claim.message_id for claim in store.claim_batch("w", 4)]
    assert order == ["high", "normal-1", "normal-2", "low"]


def test_tasks_due_at_the_same_moment_are_claimed_in_arrival_order_wherever_rows_are_stored(
        store, auth):
    first = store.receive(auth, envelope("first")).task_id
    second = store.receive(auth, envelope("second")).task_id
    assert store.task(first).available_at == store.task(second).available_at
    # Move the first task's row and back: its claim index entry now points at a newer row
    # version, stored after the second's (on PostgreSQL equal index keys follow the rows'
    # places; every update that changes claim_at, as a release or a retry does, moves one).
    for step in (1, -1):
        database_of(store).write(Write("touch"), lambda tx, step=step: tx.execute(
            "UPDATE tasks SET claim_at = claim_at + :step WHERE task_id = :task_id",
            {"step": step, "task_id": first}))
    assert [store.claim("w").task_id, store.claim("w").task_id] == [first, second]


def test_a_batch_claim_hands_back_tasks_due_at_the_same_moment_in_arrival_order(store, auth):
    # Two message ids whose task ids sort against their arrival: no order of ids stands in.
    names = [f"m-{n}" for n in range(40)]
    first, second = next((a, b) for a in names for b in names
                         if task_id_for("planner", b) < task_id_for("planner", a))
    acks = [store.receive(auth, envelope(name)) for name in (first, second)]
    assert [claim.task_id for claim in store.claim_batch("w", 2)] == [
        ack.task_id for ack in acks]


def test_a_claim_of_several_queues_takes_the_task_that_arrived_first_when_heads_tie(
        store, auth):
    # Due at the same moment in two queues: the one received first goes first, whatever the
    # queues' names or the order they are asked in.
    first = store.receive(auth, envelope("first", queue="z")).task_id
    second = store.receive(auth, envelope("second", queue="a")).task_id
    assert store.task(first).available_at == store.task(second).available_at
    assert [store.claim("w", queues=["a", "z"]).task_id,
            store.claim("w", queues=["a", "z"]).task_id] == [first, second]


def test_a_batch_claim_of_several_queues_takes_their_tasks_in_claim_order(store, auth, clock):
    store.receive(auth, envelope("a-1", queue="a"))
    clock.advance(1)
    store.receive(auth, envelope("b-1", queue="b"))
    clock.advance(1)
    store.receive(auth, envelope("a-2", queue="a"))
    store.receive(auth, envelope("b-2", queue="b"))
    first = store.claim_batch("w", 3, queues=["a", "b"])
    assert [claim.message_id for claim in first] == ["a-1", "b-1", "a-2"]
    assert [claim.message_id for claim in store.claim_batch("w", 3, queues=["a", "b"])] == [
        "b-2"]


def test_the_lowest_priority_is_not_starved_once_it_has_waited_long_enough(store, auth, clock):
    weight = store.settings.priority_weight
    store.receive(auth, envelope("patient", priority=-10))
    clock.advance(20 * weight + 1)  # waited longer than 20 levels are worth
    store.receive(auth, envelope("urgent", priority=10))
    assert store.claim("w").message_id == "patient"


def test_a_fresher_higher_priority_task_still_goes_first_within_the_rule(store, auth, clock):
    weight = store.settings.priority_weight
    store.receive(auth, envelope("older", priority=0))
    clock.advance(weight - 1)  # waited less than one level is worth
    store.receive(auth, envelope("newer", priority=1))
    assert store.claim("w").message_id == "newer"


def test_the_lowest_priority_at_the_largest_weight_is_claimed_when_nothing_else_waits(
        db_url, clock, auth):
    settings = postroom.Settings(priority_weight=postroom.settings.MAX_PRIORITY_WEIGHT)
    with postroom.open_store(db_url, clock=clock, settings=settings) as heavy:
        heavy.receive(auth, envelope("last-in-line", priority=-10))
        assert heavy.claim("w").message_id == "last-in-line"


def test_a_priority_weight_above_the_largest_is_refused_naming_it():
    with pytest.raises(postroom.InvalidInput, match="priority_weight"):
        postroom.Settings(priority_weight=postroom.settings.MAX_PRIORITY_WEIGHT + 1)


@pytest.mark.parametrize("priority", [11, -11, 1.5, True, "1"])
def test_a_priority_out_of_range_is_refused_naming_it(store, auth, priority):
    with pytest.raises(postroom.InvalidEnvelope, match="priority"):
        store.receive(auth, envelope(priority=priority))


def test_a_retried_task_keeps_its_priority(store, auth, clock):
    store.receive(auth, envelope("urgent", priority=5))
    store.fail(store.claim("w"), "flaky")
    clock.advance(10)
    store.receive(auth, envelope("plain"))
    assert store.claim("w").message_id == "urgent"


# -- paused queues ------------------------------------------------------------------------------


def test_a_paused_queues_tasks_are_not_claimed_and_resume_makes_them_claimable(store, auth):
    store.receive(auth, envelope("m-1"))
    assert store.pause_queue("default", operator="op", reason="maintenance")
    assert store.claim("w") is None
    assert store.status().queues["default"].paused
    assert store.resume_queue("default")
    assert store.claim("w") is not None


def test_pausing_lets_running_tasks_finish(store, auth):
    store.receive(auth, envelope("m-1"))
    claim = store.claim("w")
    store.pause_queue("default", operator="op", reason="maintenance")
    store.finish(claim, "ok")
    assert store.task(claim.task_id).state == TaskState.DONE


def test_a_pause_is_recorded_with_who_and_why_and_a_second_pause_keeps_the_first(store):
    assert store.pause_queue("q", operator="alice", reason="deploy")
    assert not store.pause_queue("q", operator="bob", reason="again")
    (paused,) = store.paused_queues()
    assert (paused.queue, paused.operator, paused.reason) == ("q", "alice", "deploy")
    assert store.status().queues["q"].paused  # shown though it holds no task


def test_a_paused_queue_leaves_the_others_claimable(store, auth):
    store.receive(auth, envelope("a", queue="a"))
    store.receive(auth, envelope("b", queue="b"))
    store.pause_queue("a", operator="op", reason="r")
    assert [c.queue for c in store.claim_batch("w", 5, queues=["a", "b"])] == ["b"]


def test_resuming_a_queue_that_is_not_paused_is_false(store):
    assert not store.resume_queue("never")


# -- limits -------------------------------------------------------------------------------------


def test_a_limited_queue_runs_at_most_its_limit_at_once(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(10)])
    store.set_queue_limit("default", 3)
    first = store.claim_batch("w1", 10)
    assert len(first) == 3
    assert store.claim_batch("w2", 10) == []
    store.finish(first[0], "ok")  # a slot is free again once its task stops running
    assert len(store.claim_batch("w2", 10)) == 1


def test_a_limit_slot_comes_back_when_its_task_fails_releases_or_loses_its_lease(
        store, auth, clock):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(5)])
    store.set_queue_limit("default", 2)
    a, b = store.claim_batch("w", 5)
    store.release(a)
    store.fail(b, "flaky")
    c, d = store.claim_batch("w", 5)
    assert {c.fence, d.fence} <= {1, 2}
    clock.advance(store.settings.lease)
    assert len(store.claim_batch("w", 5)) == 2  # their leases ran out: slots free


def test_lowering_a_limit_stops_nothing_and_lifting_it_frees_claims(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(6)])
    store.set_queue_limit("default", 3)
    store.claim_batch("w", 6)
    store.set_queue_limit("default", 1)
    assert store.claim_batch("w", 6) == []
    store.set_queue_limit("default", None)
    assert len(store.claim_batch("w", 6)) == 3
    assert store.queue_limits() == {}


def test_a_limit_set_on_a_busy_queue_counts_the_tasks_already_running(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(6)])
    running = store.claim_batch("w", 2)
    store.set_queue_limit("default", 3)
    assert len(store.claim_batch("w", 6)) == 1
    store.finish(running[0], "ok")  # a task seated by the limit gives its slot back too
    assert len(store.claim_batch("w", 6)) == 1


def test_lowering_a_limit_keeps_counting_the_tasks_whose_slots_it_dropped(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(6)])
    store.set_queue_limit("default", 3)
    first, *_ = store.claim_batch("w", 3)
    store.finish(first, "ok")  # slot 1 free; the two running hold slots 2 and 3
    store.set_queue_limit("default", 2)
    assert store.claim_batch("w", 6) == []  # the two running take the two slots left


def test_below_a_lowered_limit_a_freed_slot_waits_for_the_tasks_beyond_it(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(6)])
    first, second, third = store.claim_batch("w", 3)
    store.set_queue_limit("default", 1)  # the first is seated; two run beyond the limit
    store.finish(first, "ok")
    assert store.claim_batch("w", 6) == []  # two still run: more than the limit of 1
    store.finish(second, "ok")
    assert store.claim_batch("w", 6) == []
    store.finish(third, "ok")
    assert len(store.claim_batch("w", 6)) == 1


@pytest.mark.parametrize("running", [0, -1, 1.5, True, 10**6])
def test_a_limit_that_is_not_a_sensible_count_is_refused(store, running):
    with pytest.raises(postroom.InvalidInput, match="running"):
        store.set_queue_limit("default", running)


# -- a claimer's own cap per queue ---------------------------------------------------------------


def test_a_claim_takes_no_more_of_a_queue_than_its_cap_and_fills_up_from_the_others(
        store, auth):
    store.receive_atomic(auth, [envelope(f"a-{i}", queue="a") for i in range(4)]
                         + [envelope(f"b-{i}", queue="b") for i in range(4)])
    claims = store.claim_batch("w", 5, queues=["a", "b"], per_queue={"a": 1})
    assert sorted(claim.queue for claim in claims) == ["a", "b", "b", "b", "b"]


def test_a_queue_capped_at_zero_gives_nothing_to_this_claim(store, auth):
    store.receive(auth, envelope("a", queue="a"))
    assert store.claim_batch("w", 5, queues=["a"], per_queue={"a": 0}) == []
    assert store.claim("w", queues="a") is not None


def test_settling_and_claiming_together_keeps_to_the_caps(store, auth):
    store.receive_atomic(auth, [envelope(f"a-{i}", queue="a") for i in range(4)])
    first = store.claim("w", queues="a")
    settled, claims = store.settle_and_claim(
        [postroom.Finished(claim=first, result="ok")], "w", 5, queues=["a"], per_queue={"a": 2})
    assert settled[0].ok and len(claims) == 2


def test_a_cap_and_a_global_limit_both_hold(store, auth):
    store.receive_atomic(auth, [envelope(f"a-{i}", queue="a") for i in range(6)])
    store.set_queue_limit("a", 2)
    assert len(store.claim_batch("w1", 5, queues=["a"], per_queue={"a": 3})) == 2
    assert store.claim_batch("w2", 5, queues=["a"], per_queue={"a": 3}) == []


@pytest.mark.parametrize(("per_queue", "problem"), [
    ({"other": 1}, "not one of the queues"), ({"a": -1}, "0..10000"), ({"a": 1.5}, "int"),
    ([("a", 1)], "mapping")])
def test_a_cap_that_cannot_be_is_refused_naming_it(store, per_queue, problem):
    with pytest.raises(postroom.InvalidInput, match="per_queue") as refused:
        store.claim_batch("w", 5, queues=["a"], per_queue=per_queue)
    assert problem in str(refused.value)


# -- re-running on purpose ----------------------------------------------------------------------


@pytest.fixture
def failed(store, auth):
    task_id = store.receive(auth, envelope("m-1", max_attempts=1, priority=2,
                                           correlation_id="c-1")).task_id
    store.fail(store.claim("w"), "broken")
    return task_id


def test_a_failed_task_runs_again_as_a_new_task_linked_to_it(store, failed, clock):
    before = store.task(failed)
    retry = store.retry(failed, operator="alice", reason="the upstream is fixed")
    assert (retry.task_id, retry.number, retry.operator) == (failed, 1, "alice")
    again = store.task(retry.new_task_id)
    assert (again.state, again.retry_of, again.requester, again.correlation_id) == (
        TaskState.PENDING, failed, "planner", "c-1")
    assert (again.payload, again.priority, again.attempts) == ({"n": 1}, 2, 0)
    assert store.task(failed) == before  # the old task and its reply stay as they were
    assert store.retries(failed) == [retry]


def test_each_retry_is_a_new_recorded_decision_and_a_new_task(store, failed):
    first = store.retry(failed, operator="a", reason="one")
    second = store.retry(failed, operator="b", reason="two")
    assert (first.number, second.number) == (1, 2)
    assert first.new_task_id != second.new_task_id


def test_a_retry_sent_again_with_its_request_id_gets_the_rerun_it_made(store, failed):
    first = store.retry(failed, operator="a", reason="fixed", request_id="req-1")
    again = store.retry(failed, operator="a", reason="fixed", request_id="req-1")
    assert again == first and first.request_id == "req-1"
    assert store.retries(failed) == [first]


def test_a_request_id_names_one_decision_per_task(store, auth, failed):
    other = store.receive(auth, envelope("m-2", max_attempts=1)).task_id
    store.fail(store.claim("w"), "broken")
    made = {store.retry(task, operator="a", reason="r", request_id="req-1").new_task_id
            for task in (failed, other)}
    assert len(made) == 2


def test_a_request_id_sent_with_another_reason_is_a_collision_and_writes_nothing(
        store, failed):
    store.retry(failed, operator="a", reason="fixed", request_id="req-1")
    with pytest.raises(postroom.PayloadCollision, match="reason"):
        store.retry(failed, operator="a", reason="something else", request_id="req-1")
    assert len(store.retries(failed)) == 1


def test_retries_without_a_request_id_are_each_a_new_decision(store, failed):
    store.retry(failed, operator="a", reason="r", request_id="req-1")
    store.retry(failed, operator="a", reason="r")
    assert [r.request_id for r in store.retries(failed)] == ["req-1", None]


def test_a_bulk_retry_sent_again_with_its_request_id_reruns_each_task_once(store, auth):
    for i in range(3):
        store.receive(auth, envelope(f"m-{i}", max_attempts=1))
        store.fail(store.claim("w"), "broken")
    first = store.retry_many(operator="a", reason="r", state="failed", request_id="bulk")
    again = store.retry_many(operator="a", reason="r", state="failed", request_id="bulk")
    assert sorted(map(repr, again)) == sorted(map(repr, first)) and len(first) == 3


@pytest.mark.parametrize("request_id", [5, "", "x" * 5000])
def test_a_request_id_that_cannot_be_is_refused_naming_it(store, failed, request_id):
    with pytest.raises(postroom.InvalidInput, match="request_id"):
        store.retry(failed, operator="a", reason="r", request_id=request_id)
    with pytest.raises(postroom.InvalidInput, match="request_id"):
        store.retry_many(operator="a", reason="r", request_id=request_id)
    assert store.retries(failed) == []


def test_a_done_task_cannot_be_run_again(store, auth):
    task_id = store.receive(auth, envelope("m-1")).task_id
    store.finish(store.claim("w"), "ok")
    with pytest.raises(postroom.Conflict, match="done"):
        store.retry(task_id, operator="a", reason="why not")


def test_a_rerun_answers_its_requester_like_the_task_it_repeats(store, failed):
    retry = store.retry(failed, operator="a", reason="r")
    store.finish(store.claim("w"), "fixed")
    reply = store.reply(retry.new_task_id)
    assert (reply.requester, reply.document["correlation_id"]) == ("planner", "c-1")


def test_a_bulk_retry_dry_run_lists_what_it_would_run_and_writes_nothing(store, auth, clock):
    ids = [store.receive(auth, envelope(f"m-{i}", max_attempts=1)).task_id for i in range(3)]
    for _ in ids:
        store.fail(store.claim("w"), "broken")
    listed = store.retry_many(operator="a", reason="r", state="failed", dry_run=True)
    assert sorted(task.task_id for task in listed) == sorted(ids)
    assert all(store.retries(task_id) == [] for task_id in ids)
    done = store.retry_many(operator="a", reason="r", state="failed")
    assert sorted(r.task_id for r in done) == sorted(ids)


def test_a_bulk_retry_of_a_state_that_cannot_be_rerun_is_refused(store):
    with pytest.raises(postroom.InvalidInput, match="state"):
        store.retry_many(operator="a", reason="r", state="done")
