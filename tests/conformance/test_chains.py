"""SPEC §7: a chain (a root and everything spawned from it) runs within budgets postroom keeps;
its hops and parents are postroom's, never the body's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import postroom
from postroom import Budget, FollowUp, TaskState
from postroom.audit import audit_url
from postroom.db.database import Write
from postroom.validation import follow_up_principal, task_id_for
from tests.support import SETTINGS, START, database_of, envelope, stored

MALLORY = postroom.AuthContext(principal="mallory")


def _spawn(store, claim, *names, charge=0):
    store.finish(claim, "ok", follow_ups=[FollowUp(message_id=name, payload={"n": 2})
                                          for name in names], charge=charge)
    return [store.task(task_id_for(follow_up_principal(claim.task_id), name))
            for name in names]


def test_a_root_records_itself_as_its_chain_with_the_stores_budgets(store, auth):
    ack = store.receive(auth, envelope())
    chain = store.chain(ack.task_id)
    assert store.task(ack.task_id).root_task_id == ack.task_id
    assert (chain.root_task_id, chain.principal, chain.tasks, chain.cost) == (
        ack.task_id, "planner", 1, 0)
    assert (chain.max_hops, chain.max_tasks, chain.max_cost) == (
        SETTINGS.max_hops, SETTINGS.max_chain_tasks, SETTINGS.max_chain_cost)


def chain_rows(store: postroom.Store) -> dict[str, tuple[int, int]]:
    """Every chain row as stored: (tasks admitted, cost charged) by root."""
    return database_of(store).read(lambda tx: {
        row["root_task_id"]: (int(row["tasks"]), int(row["cost"]))
        for row in tx.execute("SELECT root_task_id, tasks, cost FROM chains")})


def test_a_root_alone_within_the_stores_budgets_writes_no_chain_row(store, auth):
    store.receive(auth, envelope())
    assert chain_rows(store) == {}


def test_a_root_that_lowers_a_budget_writes_its_chain_row_at_once(store, auth):
    root = store.receive(auth, envelope(budget=Budget(tasks=5))).task_id
    assert chain_rows(store) == {root: (1, 0)}


def test_a_root_born_terminal_writes_its_chain_row_with_nothing_admitted(store, auth, clock):
    root = store.receive(auth, envelope(deadline=clock.now() - 1)).task_id
    assert store.task(root).state is TaskState.EXPIRED
    assert chain_rows(store) == {root: (0, 0)}
    assert store.chain(root).tasks == 0


def test_a_budget_named_equal_to_the_stores_holds_when_the_stores_settings_change(
        db_url, clock, auth):
    asked = Budget(hops=SETTINGS.max_hops, tasks=SETTINGS.max_chain_tasks)
    with postroom.open_store(db_url, clock=clock, settings=SETTINGS) as store:
        root = store.receive(auth, envelope(budget=asked)).task_id
    wider = replace(SETTINGS, max_hops=SETTINGS.max_hops + 5,
                    max_chain_tasks=SETTINGS.max_chain_tasks + 100)
    with postroom.open_store(db_url, clock=clock, settings=wider) as store:
        _spawn(store, store.claim("w"), "a")
        chain = store.chain(root)
    assert (chain.max_hops, chain.max_tasks) == (SETTINGS.max_hops, SETTINGS.max_chain_tasks)


def test_a_roots_first_spawn_writes_its_chain_row_counting_the_root(store, auth):
    root = store.receive(auth, envelope()).task_id
    _spawn(store, store.claim("w"), "a", "b")
    assert chain_rows(store) == {root: (3, 0)}


def test_a_roots_first_charge_writes_its_chain_row(store, auth):
    root = store.receive(auth, envelope()).task_id
    _spawn(store, store.claim("w"), charge=4)
    assert chain_rows(store) == {root: (1, 4)}


def test_cancelling_a_root_alone_marks_its_chain_for_later_work(store, auth):
    root = store.receive(auth, envelope()).task_id
    assert store.cancel(root, reason="stop")
    assert store.chain(root).cancel_reason == "stop"
    linked = store.receive(auth, envelope("m-2", parent_task_id=root)).task_id
    assert store.task(linked).state is TaskState.CANCELLED


def test_a_root_may_lower_its_chains_budgets_but_never_raise_them(store, auth):
    ack = store.receive(auth, envelope(budget=Budget(hops=2, tasks=10**6, cost=7)))
    chain = store.chain(ack.task_id)
    assert (chain.max_hops, chain.max_tasks, chain.max_cost) == (2, SETTINGS.max_chain_tasks, 7)


def test_a_follow_up_is_in_its_parents_chain_one_hop_further(store, auth):
    root = store.receive(auth, envelope()).task_id
    (child,) = _spawn(store, store.claim("w"), "c")
    assert (child.root_task_id, child.parent_task_id, child.hops) == (root, root, 1)
    (grandchild,) = _spawn(store, store.claim("w"), "g")
    assert (grandchild.root_task_id, grandchild.hops) == (root, 2)
    assert store.chain(grandchild.task_id).tasks == 3


def test_a_linked_message_gets_its_hops_from_its_parent_not_its_body(store, auth):
    root = store.receive(auth, envelope(hops=2)).task_id
    linked = store.receive(auth, envelope("m-2", hops=0, parent_task_id=root)).task_id
    task = store.task(linked)
    assert (task.hops, task.root_task_id, task.parent_task_id) == (3, root, root)
    assert task.state is TaskState.PENDING


def test_a_message_naming_another_principals_task_as_parent_is_refused(store, auth):
    root = store.receive(auth, envelope()).task_id
    before = stored(store)
    with pytest.raises(postroom.Unauthorized, match="parent_task_id"):
        store.receive(MALLORY, envelope("m-2", sender="mallory", parent_task_id=root))
    assert stored(store) == before


def test_a_missing_parent_is_refused_as_a_foreign_one_is(store, auth):
    root = store.receive(auth, envelope()).task_id
    with pytest.raises(postroom.Unauthorized) as foreign:
        store.receive(MALLORY, envelope("m-2", sender="mallory", parent_task_id=root))
    with pytest.raises(postroom.Unauthorized) as missing:
        store.receive(MALLORY, envelope("m-2", sender="mallory", parent_task_id="0" * 64))
    # The refusal does not tell whether the task exists.
    assert str(foreign.value).replace(root, "X") == str(missing.value).replace("0" * 64, "X")


def test_a_message_cannot_link_to_a_follow_up_postroom_made(store, auth):
    store.receive(auth, envelope())
    (child,) = _spawn(store, store.claim("w"), "c")
    with pytest.raises(postroom.Unauthorized, match="parent_task_id"):
        store.receive(auth, envelope("m-2", parent_task_id=child.task_id))


def test_only_a_root_sets_a_budget(store, auth):
    root = store.receive(auth, envelope()).task_id
    with pytest.raises(postroom.InvalidEnvelope) as refused:
        store.receive(auth, envelope("m-2", parent_task_id=root, budget=Budget(tasks=100)))
    assert refused.value.field == "budget"


@pytest.mark.parametrize(("budget", "field"), [
    ({"tasks": 0}, "budget.tasks"), ({"hops": 0}, "budget.hops"), ({"cost": -1}, "budget.cost"),
    ({"tasks": True}, "budget.tasks"), ({"money": 5}, "budget"), ([1], "budget")])
def test_a_budget_out_of_range_is_refused_naming_it(store, auth, budget, field):
    with pytest.raises(postroom.InvalidEnvelope) as refused:
        store.receive(auth, envelope(budget=budget))
    assert refused.value.field == field


def test_a_budget_is_part_of_the_fingerprint_only_when_given(store, auth):
    first = store.receive(auth, envelope())
    assert store.receive(auth, envelope(budget=Budget())).duplicate
    with pytest.raises(postroom.PayloadCollision):
        store.receive(auth, envelope(budget=Budget(tasks=3)))
    assert first.task_id


def test_a_follow_up_at_the_chains_hop_limit_is_stored_hop_limit_with_its_reply(store, auth):
    store.receive(auth, envelope(budget=Budget(hops=2)))
    _spawn(store, store.claim("w"), "c")
    (stopped,) = _spawn(store, store.claim("w"), "g")
    assert stopped.state is TaskState.HOP_LIMIT
    assert "limit of 2" in stopped.last_error
    assert json.loads(store.reply(stopped.task_id).body)["status"] == "hop_limit"
    assert store.claim("w") is None


def test_spawns_past_the_task_budget_are_budget_exhausted_naming_it(store, auth):
    root = store.receive(auth, envelope(budget=Budget(tasks=3))).task_id
    spawned = _spawn(store, store.claim("w"), "a", "b", "c", "d")
    assert [task.state for task in spawned] == [
        TaskState.PENDING, TaskState.PENDING, TaskState.BUDGET_EXHAUSTED,
        TaskState.BUDGET_EXHAUSTED]
    assert "task budget" in spawned[2].last_error
    assert json.loads(store.reply(spawned[3].task_id).body)["status"] == "budget_exhausted"
    assert store.chain(root).tasks == 3


def test_a_charge_commits_with_the_finish_and_spends_the_cost_budget(store, auth):
    root = store.receive(auth, envelope(budget=Budget(cost=5))).task_id
    (child,) = _spawn(store, store.claim("w"), "a", charge=3)
    assert child.state is TaskState.PENDING
    (late,) = _spawn(store, store.claim("w"), "b", charge=2)
    assert late.state is TaskState.BUDGET_EXHAUSTED
    assert "cost budget" in late.last_error
    assert store.chain(root).cost == 5


def test_a_fenced_finish_charges_nothing(store, auth, clock):
    root = store.receive(auth, envelope(budget=Budget(cost=5))).task_id
    claim = store.claim("w", lease=1)
    clock.advance(2)
    with pytest.raises(postroom.Fenced):
        store.finish(claim, "late", charge=4)
    assert store.chain(root).cost == 0


def test_a_charge_out_of_range_is_refused_naming_it(store, auth):
    store.receive(auth, envelope())
    claim = store.claim("w")
    with pytest.raises(postroom.InvalidInput) as refused:
        store.finish(claim, "ok", charge=-1)
    assert refused.value.field == "charge"


def test_the_store_settings_bound_every_chain(make_url, clock, auth):
    settings = replace(SETTINGS, max_chain_tasks=2, max_chain_cost=1)
    with postroom.open_store(make_url("bounded"), clock=clock, settings=settings) as store:
        root = store.receive(auth, envelope(budget=Budget(tasks=50))).task_id
        assert store.chain(root).max_tasks == 2
        spawned = _spawn(store, store.claim("w"), "a", "b")
        assert [task.state for task in spawned] == [TaskState.PENDING,
                                                    TaskState.BUDGET_EXHAUSTED]


def test_an_atomic_batch_links_an_item_to_an_earlier_one(store, auth):
    root = store.receive(auth, envelope()).task_id
    acks = store.receive_atomic(auth, [envelope("m-2"), envelope("m-3", parent_task_id=root)])
    assert store.task(acks[1].task_id).root_task_id == root
    assert store.task(acks[0].task_id).root_task_id == acks[0].task_id


def test_the_audit_finds_a_chain_past_its_task_budget(store, auth, db_url):
    root = store.receive(auth, envelope(budget=Budget(tasks=2))).task_id
    _spawn(store, store.claim("w"), "a")
    assert audit_url(db_url) == []
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "UPDATE chains SET tasks = 1 WHERE root_task_id = :root", {"root": root}))
    assert [violation.check for violation in audit_url(db_url)] == ["chain_over_budget"]


def test_the_audit_finds_a_task_outside_its_parents_chain(store, auth, db_url):
    store.receive(auth, envelope())
    (child,) = _spawn(store, store.claim("w"), "a")
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "UPDATE tasks SET hops = 0 WHERE task_id = :task_id", {"task_id": child.task_id}))
    assert [violation.check for violation in audit_url(db_url)] == ["task_without_chain"]


def test_cancelling_a_root_cancels_every_live_task_of_its_chain(store, auth):
    root = store.receive(auth, envelope()).task_id
    pending, running = _spawn(store, store.claim("w"), "a", "b")
    claim = store.claim("w")
    assert claim is not None and claim.task_id == pending.task_id
    assert store.cancel(root, reason="the customer withdrew")
    for member in (pending.task_id, running.task_id):
        task = store.task(member)
        assert task.state is TaskState.CANCELLED and "withdrew" in task.last_error
        assert json.loads(store.reply(member).body)["status"] == "cancelled"
    with pytest.raises(postroom.Fenced):  # each fenced as a single cancel is
        store.finish(claim, "late")
    assert store.task(root).state is TaskState.DONE
    assert store.chain(root).cancel_reason == "the customer withdrew"


def test_new_work_of_a_cancelled_chain_is_born_cancelled(store, auth):
    root = store.receive(auth, envelope()).task_id
    store.cancel(root, reason="stop")
    linked = store.receive(auth, envelope("m-2", parent_task_id=root)).task_id
    assert store.task(linked).state is TaskState.CANCELLED
    assert "chain was cancelled: stop" in store.task(linked).last_error
    assert store.claim("w") is None


def test_cancelling_a_task_inside_a_chain_cancels_it_alone(store, auth):
    store.receive(auth, envelope())
    first, second = _spawn(store, store.claim("w"), "a", "b")
    assert store.cancel(first.task_id)
    assert store.task(second.task_id).state is TaskState.PENDING
    assert store.chain(first.task_id).cancelled_at is None


def _fan_out(store, claim, *names):
    (opening,) = store.finish(claim, "fanned out", follow_ups=[
        FollowUp(message_id=name, payload={"n": 2}) for name in names],
        waits=[postroom.OpenWait(flow="gather", step="all", deadline=START + 600,
                                 children=True)])
    return opening.generation


def test_a_fan_in_continues_once_when_the_last_child_ends_with_every_outcome(store, auth):
    store.receive(auth, envelope())
    parent = store.claim("w")
    generation = _fan_out(store, parent, "a", "b")
    first = store.claim("w")
    store.finish(first, {"sum": 1})
    assert store.continuations() == []  # one child still runs
    second = store.claim("w")
    store.fail(second, "no luck", retryable=False)
    [continuation] = store.continuations()
    assert (continuation.kind, continuation.generation) == ("signal", generation)
    outcomes = {child["message_id"]: (child["status"], child["result"], child["error"])
                for child in continuation.value["children"]}
    assert outcomes == {"a": ("done", {"sum": 1}, None), "b": ("failed", None, "no luck")}


def test_a_fan_in_whose_children_never_run_continues_at_once(store, auth):
    store.receive(auth, envelope(budget=Budget(tasks=1)))
    _fan_out(store, store.claim("w"), "a")
    [continuation] = store.continuations()
    assert [child["status"] for child in continuation.value["children"]] == [
        "budget_exhausted"]


def test_no_principal_can_answer_a_fan_in(store, auth):
    store.receive(auth, envelope())
    parent = store.claim("w")
    generation = _fan_out(store, parent, "a")
    with pytest.raises(postroom.Unauthorized):
        store.signal(auth, "fake", "gather", "all", generation, {"children": []})
    assert store.continuations() == []


def test_a_fan_in_names_no_responder(store, auth):
    store.receive(auth, envelope())
    with pytest.raises(postroom.InvalidInput) as refused:
        store.finish(store.claim("w"), "x", waits=[postroom.OpenWait(
            flow="gather", step="all", deadline=START + 600, children=True,
            responder="alice")])
    assert refused.value.field == "waits[0].children"


def test_a_fan_in_cancelled_with_its_chain_continues_with_the_cancellations(store, auth):
    root = store.receive(auth, envelope()).task_id
    _fan_out(store, store.claim("w"), "a", "b")
    store.cancel(root, reason="stop")
    [continuation] = store.continuations()
    assert [child["status"] for child in continuation.value["children"]] == [
        "cancelled", "cancelled"]


def test_a_re_run_of_a_follow_up_takes_its_place_in_the_chain(store, auth):
    root = store.receive(auth, envelope(deadline=START + 86_400)).task_id
    [child] = _spawn(store, store.claim("w"), "child")
    store.fail(store.claim("w"), "broken", retryable=False)
    rerun = store.task(store.retry(child.task_id, operator="op", reason="fixed").new_task_id)
    assert (rerun.root_task_id, rerun.hops) == (root, child.hops)


def _send_all(store, receiver):
    while store.dispatch(postroom.InProcessTransport(receiver)).claimed:
        pass


@pytest.fixture
def pruning(db_url, make_url, clock):
    """A store that prunes what ended a minute ago, and the receiver its replies go to."""
    with postroom.open_store(db_url, clock=clock,
                             settings=replace(SETTINGS, retention=60.0)) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        yield store, receiver


def test_a_root_is_pruned_only_after_every_other_task_of_its_chain(pruning, clock, auth):
    store, receiver = pruning
    root = store.receive(auth, envelope(deadline=START + 86_400)).task_id
    [child] = _spawn(store, store.claim("w"), "child")
    store.fail(store.claim("w"), "broken", retryable=False)
    _send_all(store, receiver)
    rerun = store.task(store.retry(child.task_id, operator="op", reason="fixed").new_task_id)
    assert (rerun.root_task_id, rerun.hops) == (root, child.hops)
    clock.advance(61)
    assert store.prune() == 1  # the failed child; the root waits for the re-run
    assert store.task(root).state is TaskState.DONE
    store.finish(store.claim("w"), "ok")
    _send_all(store, receiver)
    clock.advance(61)
    assert store.prune() == 2  # the re-run, then the root
    assert store.list_tasks().items == []


def test_a_pruned_root_received_again_starts_a_chain_of_its_own(pruning, clock, auth):
    store, receiver = pruning
    root = store.receive(auth, envelope(deadline=START + 86_400)).task_id
    _spawn(store, store.claim("w"), "child", charge=5)
    store.finish(store.claim("w"), "ok")
    _send_all(store, receiver)
    clock.advance(61)
    assert store.prune() == 2
    again = store.receive(auth, envelope(deadline=START + 86_400))
    chain = store.chain(again.task_id)
    assert (again.task_id, again.duplicate) == (root, False)
    assert (chain.tasks, chain.cost, chain.created_at) == (1, 0, clock.now())
