"""SPEC §6: a side effect commits only by consuming a human's approval record in the finish's
own transaction; no payload, signed body or signal is an approval."""

from __future__ import annotations

from dataclasses import replace

import pytest

import postroom
from postroom import SideEffect, TaskState, approvals
from postroom.audit import audit_url
from postroom.db.database import Write
from postroom.signing import new_secret, sign
from tests.support import SETTINGS, START, database_of, envelope, stored

ALICE = postroom.AuthContext(principal="alice", role="human")
BOB = postroom.AuthContext(principal="bob", role="human")
OPERATOR = postroom.AuthContext(principal="ops", role="operator")
REFUND = {"amount": 40, "currency": "EUR"}


def _grant(store, approval_id="refund-17", *, by=ALICE, resource="customer:17", data=None,
           max_uses=1, expires_at=START + 600):
    return store.grant_approval(by, approval_id, action="refund", resource=resource,
                                data=REFUND if data is None else data, expires_at=expires_at,
                                requested_by="planner", max_uses=max_uses)


def _refund(resource="customer:17", data=None, approval_id=None):
    return SideEffect(action="refund", resource=resource, data=REFUND if data is None else data,
                      approval_id=approval_id)


@pytest.fixture
def claim(store, auth):
    store.receive(auth, envelope())
    return store.claim("w")


def _refused_and_nothing_written(store, claim, effect):
    before = stored(store)
    with pytest.raises(postroom.NotApproved) as refused:
        store.finish(claim, "refunded", side_effects=[effect])
    assert stored(store) == before
    assert store.task(claim.task_id).state is TaskState.RUNNING
    assert store.side_effects(claim.task_id) == []
    return refused.value


def test_a_human_grants_an_approval_as_a_durable_record(store):
    approval = _grant(store, max_uses=2)
    assert (approval.granted_by, approval.action, approval.resource, approval.data,
            approval.max_uses, approval.uses, approval.requested_by) == (
        "alice", "refund", "customer:17", REFUND, 2, 0, "planner")
    assert store.approval("refund-17") == approval


@pytest.mark.parametrize("role", [None, "agent", "worker", "operator"])
def test_only_a_principal_with_the_human_role_grants(store, role):
    with pytest.raises(postroom.Unauthorized, match="human"):
        _grant(store, by=postroom.AuthContext(principal="alice", role=role))
    with pytest.raises(postroom.NotFound):
        store.approval("refund-17")


def test_a_retried_grant_returns_the_stored_approval(store):
    assert _grant(store) == _grant(store)


def test_the_same_approval_id_with_other_terms_is_a_collision(store):
    _grant(store)
    with pytest.raises(postroom.PayloadCollision):
        _grant(store, data={"amount": 4000, "currency": "EUR"})


def test_a_side_effect_consumes_its_approval_with_the_finish(store, claim):
    _grant(store)
    store.finish(claim, "refunded", side_effects=[_refund()])
    (effect,) = store.side_effects(claim.task_id)
    assert (effect.action, effect.resource, effect.data, effect.approval_id,
            effect.use_number) == ("refund", "customer:17", REFUND, "refund-17", 1)
    assert store.approval("refund-17").uses == 1
    assert store.task(claim.task_id).state is TaskState.DONE


def test_a_pruned_task_received_again_records_its_own_side_effects(db_url, make_url, clock,
                                                                    auth):
    settings = replace(SETTINGS, retention=60.0)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        _grant(store, max_uses=2, expires_at=START + 3600)
        uses = []
        for _ in range(2):  # the same identity, pruned in between: a new request each time
            task_id = store.receive(auth, envelope(deadline=START + 3600)).task_id
            store.finish(store.claim("w"), "refunded", side_effects=[_refund()])
            (effect,) = store.side_effects(task_id)
            uses.append(effect.use_number)
            store.dispatch(postroom.InProcessTransport(receiver))
            clock.advance(61)
            assert store.prune() == 1
        assert uses == [1, 2] and store.approval("refund-17").uses == 2
    assert audit_url(db_url) == []


def test_a_single_use_approval_allows_one_side_effect(store, auth, claim):
    _grant(store)
    store.finish(claim, "refunded", side_effects=[_refund()])
    store.receive(auth, envelope("m-2"))
    second = store.claim("w")
    refused = _refused_and_nothing_written(store, second, _refund())
    assert "no usable approval" in refused.reason


def test_an_approval_for_a_count_allows_that_many(store, auth):
    _grant(store, max_uses=2)
    for index in range(3):
        store.receive(auth, envelope(f"m-{index}"))
    for _ in range(2):
        store.finish(store.claim("w"), "refunded", side_effects=[_refund()])
    refused = _refused_and_nothing_written(store, store.claim("w"),
                                           _refund(approval_id="refund-17"))
    assert "used up (2 of 2)" in refused.reason


def test_a_missing_approval_refuses(store, claim):
    refused = _refused_and_nothing_written(store, claim, _refund(approval_id="refund-99"))
    assert "no approval 'refund-99'" in refused.reason


def test_an_expired_approval_refuses(store, claim, clock):
    _grant(store, expires_at=START + 10)
    clock.advance(10)
    store.renew(claim)
    refused = _refused_and_nothing_written(store, claim, _refund(approval_id="refund-17"))
    assert "expired" in refused.reason
    _refused_and_nothing_written(store, claim, _refund())


def test_a_revoked_approval_refuses(store, claim):
    _grant(store)
    assert store.revoke_approval(ALICE, "refund-17", reason="changed my mind")
    refused = _refused_and_nothing_written(store, claim, _refund(approval_id="refund-17"))
    assert "revoked" in refused.reason
    _refused_and_nothing_written(store, claim, _refund())


def test_an_approval_for_another_resource_refuses(store, claim):
    _grant(store, resource="customer:18")
    refused = _refused_and_nothing_written(store, claim, _refund(approval_id="refund-17"))
    assert "resource 'customer:18'" in refused.reason
    _refused_and_nothing_written(store, claim, _refund())


def test_an_approval_for_other_data_refuses(store, claim):
    _grant(store)
    more = {"amount": 4000, "currency": "EUR"}
    refused = _refused_and_nothing_written(store, claim, _refund(data=more,
                                                                 approval_id="refund-17"))
    assert "other data" in refused.reason
    _refused_and_nothing_written(store, claim, _refund(data=more))


def test_a_payload_saying_human_approved_is_not_an_approval(store, auth):
    store.receive(auth, envelope(payload={"human_approved": True, "approved_by": "alice"}))
    claim = store.claim("w")
    assert claim.payload["human_approved"] is True
    _refused_and_nothing_written(store, claim, _refund(data={**REFUND,
                                                             "human_approved": True}))


def test_a_signed_body_is_not_an_approval(store, auth):
    body = '{"approved":true,"by":"alice"}'
    headers = sign([new_secret()], "msg-1", int(START), body)
    store.receive(auth, envelope(payload={"body": body, "headers": headers}))
    _refused_and_nothing_written(store, store.claim("w"), _refund())


def test_a_relayed_they_said_yes_signal_is_not_an_approval(store, claim):
    store.finish(claim, "asked", waits=[postroom.OpenWait(
        flow="refund-17", step="approval", deadline=START + 600, responder="alice")])
    receipt = store.signal(postroom.AuthContext(principal="alice"), "yes-1", "refund-17",
                           "approval", 1, {"approved": True})
    assert receipt.result is postroom.SignalResult.ACCEPTED
    resumed = store.resume("refund-17", "approval", 1, postroom.FollowUp(
        message_id="issue", payload={"approved": True}))
    follow_up = store.claim("w")
    assert follow_up.task_id == resumed.task_id
    _refused_and_nothing_written(store, follow_up, _refund())


def test_only_the_granter_or_an_operator_revokes(store):
    _grant(store)
    _grant(store, "refund-18")
    with pytest.raises(postroom.Unauthorized):
        store.revoke_approval(BOB, "refund-17", reason="not mine")
    assert store.approval("refund-17").revoked_at is None
    assert store.revoke_approval(OPERATOR, "refund-18", reason="fraud")
    assert store.approval("refund-18").revoked_by == "ops"


def test_a_second_revocation_changes_nothing(store):
    _grant(store)
    assert store.revoke_approval(ALICE, "refund-17", reason="first")
    assert not store.revoke_approval(ALICE, "refund-17", reason="second")
    assert store.approval("refund-17").revoke_reason == "first"


def test_a_use_that_committed_before_a_revocation_stands(store, claim, db_url):
    _grant(store, max_uses=2)
    store.finish(claim, "refunded", side_effects=[_refund()])
    store.revoke_approval(ALICE, "refund-17", reason="enough")
    assert store.approval("refund-17").uses == 1
    assert audit_url(db_url) == []


def test_a_refused_finish_in_a_group_commit_costs_the_others_nothing(store, auth):
    _grant(store)
    store.receive(auth, envelope("m-1"))
    store.receive(auth, envelope("m-2"))
    first = store.claim("w")
    second = store.claim("w")
    settled = store.settle([
        postroom.Finished(claim=first, result="refunded", side_effects=[_refund()]),
        postroom.Finished(claim=second, result="refunded", side_effects=[_refund()])])
    assert settled[0].ok
    assert isinstance(settled[1].error, postroom.NotApproved)
    assert store.task(second.task_id).state is TaskState.RUNNING


def test_the_audit_finds_a_use_without_its_side_effect(store, claim, db_url):
    _grant(store)
    store.finish(claim, "refunded", side_effects=[_refund()])
    assert audit_url(db_url) == []
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "UPDATE approvals SET uses = 2, max_uses = 2 WHERE approval_id = 'refund-17'", {}))
    assert [violation.check for violation in audit_url(db_url)] == ["approval_uses_mismatch"]


def test_the_audit_finds_a_side_effect_after_its_revocation(store, claim, db_url):
    _grant(store)
    store.finish(claim, "refunded", side_effects=[_refund()])
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "UPDATE approvals SET revoked_at = :at, revoked_by = 'alice', revoke_reason = 'x' "
        "WHERE approval_id = 'refund-17'", {"at": START - 1}))
    database_of(store).write(Write("corrupt"), lambda tx: tx.execute(
        "INSERT INTO approval_events (approval_id, kind, number, principal, at) "
        "VALUES ('refund-17', 'revoked', 0, 'alice', :at)", {"at": START - 1}))
    assert [violation.check for violation in audit_url(db_url)] == ["side_effect_unapproved"]


# -- approval requests as waits ------------------------------------------------------------


def _ask(store, claim, responder="alice"):
    (opening,) = store.finish(claim, "asked", waits=[postroom.OpenWait(
        flow="refund-17", step="approval", deadline=START + 600, responder=responder,
        approval=postroom.ApprovalRequest(action="refund", resource="customer:17",
                                          data=REFUND, expires_at=START + 3600))])
    return opening.generation


def _resumed_follow_up(store, generation):
    [continuation] = store.continuations()
    store.resume("refund-17", "approval", generation, postroom.FollowUp(
        message_id="issue", payload={"answer": continuation.value}))
    return store.claim("w"), continuation.value


def test_a_humans_yes_grants_the_requested_approval_and_resumes_the_flow_once(store, claim):
    generation = _ask(store, claim)
    receipt = store.answer_approval(ALICE, "yes-1", "refund-17", "approval", generation,
                                    approve=True)
    assert receipt.result is postroom.SignalResult.ACCEPTED
    follow_up, value = _resumed_follow_up(store, generation)
    approval = store.approval(value["approval_id"])
    assert (approval.granted_by, approval.requested_by, approval.data, approval.uses) == (
        "alice", claim.task_id, REFUND, 0)
    store.finish(follow_up, "refunded",
                 side_effects=[_refund(approval_id=value["approval_id"])])
    assert store.approval(value["approval_id"]).uses == 1
    assert store.continuations() == []


def test_a_replayed_answer_grants_nothing_again(store, claim):
    generation = _ask(store, claim)
    store.answer_approval(ALICE, "yes-1", "refund-17", "approval", generation, approve=True)
    again = store.answer_approval(ALICE, "yes-1", "refund-17", "approval", generation,
                                  approve=True)
    assert again.result is postroom.SignalResult.REPLAY
    assert len(store.continuations()) == 1


def test_a_humans_no_grants_nothing_and_the_side_effect_is_refused(store, claim):
    generation = _ask(store, claim)
    store.answer_approval(ALICE, "no-1", "refund-17", "approval", generation, approve=False)
    follow_up, value = _resumed_follow_up(store, generation)
    assert value == {"approved": False, "approval_id": None}
    _refused_and_nothing_written(store, follow_up, _refund())


def test_only_the_addressed_human_answers(store, claim):
    generation = _ask(store, claim)
    before = stored(store)
    with pytest.raises(postroom.Unauthorized):
        store.answer_approval(BOB, "yes-1", "refund-17", "approval", generation, approve=True)
    with pytest.raises(postroom.Unauthorized, match="human"):
        store.answer_approval(postroom.AuthContext(principal="alice"), "yes-1", "refund-17",
                              "approval", generation, approve=True)
    assert stored(store) == before
    assert store.continuations() == []


def test_an_answer_after_the_deadline_grants_nothing(store, claim, clock):
    generation = _ask(store, claim)
    clock.advance(600)
    late = store.answer_approval(ALICE, "yes-1", "refund-17", "approval", generation,
                                 approve=True)
    assert late.result is postroom.SignalResult.TOO_LATE
    with pytest.raises(postroom.NotFound):
        store.approval(approvals.request_approval_id("refund-17", "approval", generation))


def test_a_wait_asking_for_an_approval_names_its_responder(store, claim):
    with pytest.raises(postroom.InvalidInput) as refused:
        _ask(store, claim, responder=None)
    assert refused.value.field == "waits[0].responder"


def test_a_signal_to_a_wait_asking_for_an_approval_is_refused(store, claim):
    generation = _ask(store, claim)
    before = stored(store)
    with pytest.raises(postroom.Unauthorized, match="answer_approval"):
        store.signal(postroom.AuthContext(principal="alice"), "relayed-yes", "refund-17",
                     "approval", generation, {"approved": True, "approval_id": "x"})
    assert stored(store) == before
    assert store.receipt("alice", "relayed-yes") is None


def test_a_tasks_story_shows_its_chain_and_the_approval_its_side_effect_used(store, claim):
    _grant(store)
    store.finish(claim, "refunded", side_effects=[_refund()])
    story = store.story(claim.task_id)
    assert story.chain is not None and story.chain.root_task_id == claim.task_id
    assert [(effect.approval_id, effect.use_number) for effect in story.side_effects] == [
        ("refund-17", 1)]


# -- listings ------------------------------------------------------------------------------


def test_approvals_are_listed_newest_first_and_by_granter(store, clock):
    _grant(store, "first")
    clock.advance(1)
    _grant(store, "second", by=BOB)
    clock.advance(1)
    _grant(store, "third")
    assert [item.approval_id for item in store.list_approvals()] == [
        "third", "second", "first"]
    assert [item.approval_id for item in store.list_approvals(granted_by="alice",
                                                              limit=1)] == ["third"]


def test_an_approval_request_is_listed_for_its_responder_until_answered(store, claim):
    generation = _ask(store, claim)
    [asked] = store.approval_requests(responder="alice")
    assert (asked.generation, asked.requested_by, asked.data, asked.answer) == (
        generation, claim.task_id, REFUND, None)
    assert store.approval_requests(responder="bob") == []
    store.answer_approval(ALICE, "no-1", "refund-17", "approval", generation, approve=False)
    assert store.approval_requests() == []


def test_an_approval_request_whose_wait_timed_out_is_not_listed(store, claim, clock):
    _ask(store, claim)
    clock.advance(601)
    store.expire_due()
    assert store.approval_requests(responder="alice") == []


@pytest.mark.parametrize("limit", [0, 1001, "5"])
def test_an_approval_listing_limit_out_of_range_names_the_field(store, limit):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.list_approvals(limit=limit)
    assert refused.value.field == "limit"
