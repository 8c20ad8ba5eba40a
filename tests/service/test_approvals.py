"""Human approvals through a real server: a task asks, the addressed human answers through
the service, the flow resumes once, and the worker's finish commits its side effect only by
consuming the approval."""

from __future__ import annotations

import asyncio

import httpx

import postroom
from postroom.client import AsyncClient, RemoteWorker
from postroom.runtime import App, Context
from tests.support import START

DEADLINE = START + 3600
REFUND = {"amount": 40, "currency": "EUR"}
ASK = {"action": "refund", "resource": "customer:17", "data": REFUND,
       "expires_at": START + 3600}
EFFECT = {"action": "refund", "resource": "customer:17", "data": REFUND}
FLOW, STEP = "refund-17", "approval"


def _claimed(service, message_id: str) -> dict[str, object]:
    """Submit a task as alice and claim it as wendy, over HTTP."""
    with service.http("alice") as agent:
        agent.post("/v1/tasks", json={"message_id": message_id, "payload": {"n": 1},
                                      "deadline": DEADLINE})
    [held] = service.http("wendy").post("/v1/claims", json={}).json()["claims"]
    return held


def _ask(service) -> tuple[str, int]:
    """A task that finishes by asking hana for the refund's approval; its task and the
    wait's generation."""
    held = _claimed(service, "m-ask")
    answer = service.http("wendy").post(f"/v1/tasks/{held['task_id']}/finish", json={
        "fence": held["fence"], "result": "asked", "waits": [{
            "flow": FLOW, "step": STEP, "deadline": START + 600, "responder": "hana",
            "approval": ASK}]})
    assert answer.status_code == 200, answer.text
    return str(held["task_id"]), answer.json()["waits"][0]["generation"]


def _answer(http: httpx.Client, generation: int, event_id: str = "yes-1",
            approve: bool = True) -> httpx.Response:
    return http.post(f"/v1/waits/{FLOW}/{STEP}/{generation}/approval",
                     json={"event_id": event_id, "approve": approve})


def _finish(service, held: dict[str, object], effect: dict[str, object]) -> httpx.Response:
    return service.http("wendy").post(f"/v1/tasks/{held['task_id']}/finish", json={
        "fence": held["fence"], "result": "refunded", "side_effects": [effect]})


def test_the_addressed_humans_approval_grants_the_record_and_resumes_the_flow_once(service):
    task_id, generation = _ask(service)
    hana = service.client("hana")
    [asked] = hana.approval_requests()["items"]
    receipt = hana.answer_approval("yes-1", FLOW, STEP, generation, approve=True)
    [continuation] = service.store.continuations()
    approval = hana.approval(asked["approval_id"])
    assert receipt["result"] == "accepted"
    assert continuation.value == {"approved": True, "approval_id": asked["approval_id"]}
    assert (approval["granted_by"], approval["requested_by"], approval["data"],
            approval["uses"]) == ("hana", task_id, REFUND, 0)
    assert hana.approval_requests()["items"] == []


def test_another_human_an_agent_and_an_operator_cannot_answer_it(service):
    _, generation = _ask(service)
    refused = {name: _answer(service.http(name), generation).status_code
               for name in ("hugo", "alice", "wendy", "olga")}
    assert refused == {"hugo": 404, "alice": 403, "wendy": 403, "olga": 403}
    assert service.store.continuations() == []
    assert service.store.list_approvals() == []
    assert service.store.wait(FLOW, STEP, generation).state is postroom.WaitState.WAITING


def test_another_humans_refusal_is_the_same_404_as_a_missing_wait(service):
    _, generation = _ask(service)
    hugo = service.http("hugo")
    mine_not = _answer(hugo, generation)
    missing = hugo.post(f"/v1/waits/nope/{STEP}/1/approval",
                        json={"event_id": "yes-1", "approve": True})
    assert (mine_not.status_code, mine_not.content) == (missing.status_code, missing.content)


def test_a_replayed_answer_is_a_replay_and_grants_nothing_again(service):
    _, generation = _ask(service)
    hana = service.http("hana")
    first = _answer(hana, generation).json()
    again = _answer(hana, generation).json()
    [approval] = service.store.list_approvals()
    assert (first["result"], again["result"]) == ("accepted", "replay")
    assert approval.granted_by == "hana" and len(service.store.continuations()) == 1


def test_a_denial_resumes_the_flow_and_grants_nothing(service):
    _, generation = _ask(service)
    denied = _answer(service.http("hana"), generation, "no-1", approve=False).json()
    [continuation] = service.store.continuations()
    assert denied["result"] == "accepted"
    assert continuation.value == {"approved": False, "approval_id": None}
    assert service.store.list_approvals() == []


def test_a_finish_with_a_side_effect_is_refused_without_the_approval_and_commits_with_it(
        service):
    _, generation = _ask(service)
    held = _claimed(service, "m-refund")
    refused = _finish(service, held, EFFECT)
    assert refused.status_code == 403 and refused.json()["type"].endswith("/not-approved")
    assert service.store.task(str(held["task_id"])).state is postroom.TaskState.RUNNING
    _answer(service.http("hana"), generation)
    done = _finish(service, held, EFFECT)
    [effect] = service.store.side_effects(str(held["task_id"]))
    assert done.status_code == 200, done.text
    assert service.store.approval(effect.approval_id).uses == 1


def test_an_approval_for_other_data_does_not_let_the_finish_commit(service):
    _, generation = _ask(service)
    _answer(service.http("hana"), generation)
    held = _claimed(service, "m-refund")
    refused = _finish(service, held, {**EFFECT, "data": {**REFUND, "amount": 4000}})
    assert refused.status_code == 403
    assert service.store.side_effects(str(held["task_id"])) == []


def test_a_human_grants_lists_and_revokes_its_own_approvals(service):
    hana = service.client("hana")
    granted = hana.grant_approval("a-1", requested_by="alice", **ASK)
    listed = hana.approvals()["items"]
    revoked = hana.revoke_approval("a-1", reason="changed my mind")
    assert granted["granted_by"] == "hana" and [item["approval_id"] for item in listed] == [
        "a-1"]
    assert revoked == {"approval_id": "a-1", "revoked": True}
    assert service.store.approval("a-1").revoked_by == "hana"


def test_no_human_sees_or_revokes_another_humans_approval(service):
    service.client("hana").grant_approval("a-1", requested_by="alice", **ASK)
    hugo = service.http("hugo")
    answers = [hugo.get("/v1/approvals/a-1"),
               hugo.post("/v1/approvals/a-1/revoke", json={"reason": "no"})]
    missing = [hugo.get("/v1/approvals/a-2"),
               hugo.post("/v1/approvals/a-2/revoke", json={"reason": "no"})]
    assert [(item.status_code, item.content) for item in answers] == [
        (item.status_code, item.content) for item in missing]
    assert hugo.get("/v1/approvals").json()["items"] == []
    assert hugo.get("/v1/approvals", params={"granted_by": "hana"}).json()["items"] == []
    assert service.store.approval("a-1").revoked_at is None


def test_only_humans_grant_approvals(service):
    statuses = {name: service.http(name).post("/v1/approvals", json={
        "approval_id": f"a-{name}", "requested_by": "alice", **ASK}).status_code
        for name in ("alice", "wendy", "olga")}
    assert statuses == {"alice": 403, "wendy": 403, "olga": 403}
    assert service.store.list_approvals() == []


def test_an_operator_lists_every_approval_and_every_request(service):
    _ask(service)
    service.client("hana").grant_approval("a-1", requested_by="alice", **ASK)
    olga = service.client("olga")
    assert [item["approval_id"] for item in olga.approvals()["items"]] == ["a-1"]
    assert [item["responder"] for item in olga.approval_requests()["items"]] == ["hana"]


def test_the_async_client_answers_an_approval_request(service):
    _, generation = _ask(service)

    async def answer() -> object:
        async with AsyncClient(service.url, service.tokens["hana"], retries=0) as hana:
            return await hana.answer_approval("yes-1", FLOW, STEP, generation, approve=True)

    receipt = asyncio.run(answer())
    assert isinstance(receipt, dict) and receipt["result"] == "accepted"


def test_a_remote_worker_commits_the_side_effect_its_handler_declares(service):
    service.client("hana").grant_approval("a-1", requested_by="alice", **ASK)
    app = App()

    @app.handler("default")
    def refund(payload: dict, ctx: Context) -> str:
        ctx.side_effect("refund", "customer:17", REFUND)
        return "refunded"

    ack = service.client("alice").submit("m-refund", {"n": 1}, deadline=DEADLINE)
    worker = RemoteWorker(service.client("wendy"), app)
    assert worker.run_once() == 1
    [effect] = service.store.side_effects(ack.task_id)
    assert effect.approval_id == "a-1" and service.store.approval("a-1").uses == 1


def _refused_both_ways(service, outcome: postroom.Finished) -> tuple[Exception, Exception]:
    """The error the store refuses ``outcome`` with in process, and the error the client
    raises for the service's refusal of the same outcome (neither writes anything)."""
    [local] = service.store.settle([outcome])
    try:
        service.client("wendy").settle(outcome)
    except postroom.PostroomError as exc:
        remote: Exception = exc
    else:
        raise AssertionError("the service took an outcome the store refuses")
    assert local.error is not None
    return local.error, remote


def test_the_client_raises_not_approved_as_the_store_does(service):
    _ask(service)
    service.client("alice").submit("m-refund", {"n": 1}, deadline=DEADLINE)
    [claim] = service.client("wendy").claim()
    effect = postroom.SideEffect(**EFFECT)
    local, remote = _refused_both_ways(
        service, postroom.Finished(claim=claim, result="refunded", side_effects=[effect]))
    assert type(remote) is type(local) is postroom.NotApproved
    assert (remote.action, remote.resource, remote.reason, str(remote)) == (
        local.action, local.resource, local.reason, str(local))


def test_the_client_raises_wait_not_opened_as_the_store_does(service):
    _ask(service)  # FLOW/STEP is waiting: another generation cannot open
    service.client("alice").submit("m-again", {"n": 1}, deadline=DEADLINE)
    [claim] = service.client("wendy").claim()
    again = postroom.OpenWait(flow=FLOW, step=STEP, deadline=START + 600,
                              expected_generation=1)
    local, remote = _refused_both_ways(
        service, postroom.Finished(claim=claim, result="asked again", waits=[again]))
    assert type(remote) is type(local) is postroom.WaitNotOpened
    assert (remote.opening, str(remote)) == (local.opening, str(local))
