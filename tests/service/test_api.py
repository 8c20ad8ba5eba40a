"""The HTTP API through a real server on 127.0.0.1, on both backends."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from postroom import AuthContext, InvalidInput
from postroom.http.app import ROUTES, create_app
from postroom.http.routing import Answer, Limits, Route
from tests.service.conftest import Server
from tests.support import START

DEADLINE = START + 3600


def submit(http: httpx.Client, message_id: str = "m-1", **fields: object) -> httpx.Response:
    body = {"message_id": message_id, "payload": {"n": 1}, "deadline": DEADLINE, **fields}
    return http.post("/v1/tasks", json=body)


def claim(service, worker: str = "wendy", **body: object) -> dict:
    answer = service.http(worker).post("/v1/claims", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["claims"][0]


def test_a_submitted_task_is_accepted_with_its_location(service):
    with service.http("alice") as http:
        answer = submit(http)
        assert answer.status_code == 202
        ack = answer.json()
        assert ack == {"ack": "stored", "task_id": ack["task_id"], "duplicate": False}
        task = http.get(answer.headers["location"]).json()
    assert (task["task_id"], task["principal"], task["state"]) == (
        ack["task_id"], "alice", "pending")


def test_a_resent_task_replays_the_same_answer_as_a_duplicate(service):
    with service.http("alice") as http:
        first, again = submit(http), submit(http)
    assert again.status_code == first.status_code == 202
    assert again.headers["location"] == first.headers["location"]
    assert again.json() == {**first.json(), "duplicate": True}


def test_the_same_message_with_other_content_is_a_409_and_leaves_the_task(service):
    with service.http("alice") as http:
        first = submit(http, payload={"n": 1}).json()
        clash = submit(http, payload={"n": 2})
        kept = http.get(f"/v1/tasks/{first['task_id']}").json()
    assert clash.status_code == 409
    assert clash.headers["content-type"] == "application/problem+json"
    assert clash.json()["type"] == "/problems/payload-collision"
    assert kept["payload"] == {"n": 1}


def test_the_sender_is_the_authenticated_principal_never_the_body(service):
    with service.http("alice") as http:
        answer = submit(http, sender="bob")
    assert answer.status_code == 400 and answer.json()["field"] == "sender"


def test_an_invalid_field_is_a_problem_naming_it(service):
    with service.http("alice") as http:
        answer = submit(http, max_attempts=11)
    problem = answer.json()
    assert answer.status_code == 400
    assert (problem["type"], problem["field"], problem["status"]) == (
        "/problems/invalid-input", "max_attempts", 400)


def test_a_prefix_batch_keeps_the_committed_prefix_and_names_the_failing_item(service):
    items = [{"message_id": f"b-{n}", "payload": {"n": n}, "deadline": DEADLINE}
             for n in range(4)]
    items[2]["payload"] = {"deep": too_deep()}
    with service.http("alice") as http:
        failed = http.post("/v1/batches", json={"envelopes": items})
        items[2]["payload"] = {"n": 2}
        resumed = http.post("/v1/batches", json={"envelopes": items})
    problem = failed.json()
    assert failed.status_code == 400
    assert problem["failed_index"] == 2
    assert problem["field"].startswith("envelopes[2].payload")
    assert [ack["duplicate"] for ack in problem["acks"]] == [False, False]
    assert [ack["duplicate"] for ack in resumed.json()["acks"]] == [True, True, False, False]


def too_deep() -> object:
    nested: object = 1
    for _ in range(20):
        nested = [nested]
    return nested


def test_an_atomic_batch_with_a_bad_item_stores_nothing(service):
    items = [{"message_id": "a-1", "payload": {"n": 1}, "deadline": DEADLINE},
             {"message_id": "a-2", "payload": {"n": too_deep()}, "deadline": DEADLINE}]
    with service.http("alice") as http:
        refused = http.post("/v1/batches/atomic", json={"envelopes": items})
        listed = http.get("/v1/tasks").json()
    assert refused.status_code == 400 and refused.json()["field"].startswith("envelopes[1]")
    assert listed["items"] == []


def test_a_body_that_is_not_json_is_a_400_naming_the_body(service):
    with service.http("alice") as http:
        answer = http.post("/v1/tasks", content=b'{"n": NaN}',
                           headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["field"] == "body"


def test_a_number_too_long_to_convert_is_a_400_naming_the_body(service):
    with service.http("alice") as http:
        answer = http.post("/v1/tasks", content=b'{"message_id": "m", "payload": {"n": '
                           + b"9" * 5000 + b'}, "deadline": 1}',
                           headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["field"] == "body"


def test_a_filter_the_listing_does_not_take_is_a_400_naming_it(service):
    with service.http("alice") as http:
        submit(http)
        misspelt = http.get("/v1/tasks", params={"stat": "failed"})
        health = http.get("/healthz", params={"probe": "1"})  # takes no filters: ignored
    assert misspelt.status_code == 400 and misspelt.json()["field"] == "stat"
    assert health.status_code == 200


def test_tasks_are_listed_in_pages_by_cursor_with_filters(service):
    with service.http("alice") as http:
        for n in range(3):
            submit(http, f"p-{n}", queue="q" if n else "default")
            service.store.clock.advance(1)
        first = http.get("/v1/tasks", params={"limit": 1, "queue": "q"}).json()
        second = http.get("/v1/tasks", params={"limit": 1, "queue": "q",
                                               "cursor": first["next_cursor"]}).json()
    assert [item["message_id"] for item in first["items"] + second["items"]] == ["p-2", "p-1"]
    assert second["next_cursor"] is None


def test_a_claim_waits_for_work_and_wakes_when_it_arrives(service):
    def later() -> None:
        time.sleep(0.3)
        with service.http("alice") as http:
            submit(http)

    submitter = threading.Thread(target=later)
    submitter.start()
    started = time.monotonic()
    claimed = claim(service, wait=5)
    waited = time.monotonic() - started
    submitter.join()  # its answer may still be on the way when the claim wakes
    assert claimed["payload"] == {"n": 1} and claimed["fence"] == 1
    assert waited < 2.0


def test_a_claim_waits_no_longer_than_the_service_allows(service, limits):
    started = time.monotonic()
    answer = service.http("wendy").post("/v1/claims", json={"wait": 60})
    assert answer.json() == {"claims": []}
    assert limits.max_poll <= time.monotonic() - started < limits.max_poll + 2


def test_a_worker_claims_only_from_the_queues_it_is_granted(service):
    answer = service.http("wendy").post("/v1/claims", json={"queues": ["other"]})
    assert answer.status_code == 403 and answer.json()["field"] == "queues[0]"


def test_finishing_writes_the_result_and_a_retry_is_answered_as_a_replay(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    held = claim(service)
    with service.http("wendy") as worker:
        done = worker.post(f"/v1/tasks/{task_id}/finish",
                           json={"fence": held["fence"], "result": {"ok": 1}})
        again = worker.post(f"/v1/tasks/{task_id}/finish",
                            json={"fence": held["fence"], "result": {"ok": 1}})
    assert done.json()["replay"] is False and again.json()["replay"] is True
    assert service.store.task(task_id).result == {"ok": 1}


def _opening_waits(*steps: str) -> list[dict]:
    return [{"flow": "replayed", "step": step, "deadline": DEADLINE} for step in steps]


def _sent_twice(service, verb: str, body: dict,
                between: Callable[[str], object] = lambda task_id: None) -> tuple[dict, dict]:
    """The answers to ``verb`` (finish, fail, release) of a claim on a new task, sent with
    ``body`` (and the claim's fence) and then sent again, after ``between(task_id)``."""
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    sent = {"fence": claim(service)["fence"], **body}
    with service.http("wendy") as worker:
        first = worker.post(f"/v1/tasks/{task_id}/{verb}", json=sent).json()
        between(task_id)
        again = worker.post(f"/v1/tasks/{task_id}/{verb}", json=sent).json()
    return first, again


def _replayed(first: dict) -> dict:
    """``first``, an outcome's answer, as its replay answers it."""
    return {**first, "replay": True,
            "waits": [{**opening, "replay": True} for opening in first["waits"]]}


def test_a_finish_sent_again_after_it_committed_replays_the_waits_it_opened(service):
    first, again = _sent_twice(service, "finish",
                               {"result": "asked", "waits": _opening_waits("b", "a")})
    assert [(opening["step"], opening["generation"]) for opening in first["waits"]] == [
        ("b", 1), ("a", 1)]
    assert again == _replayed(first)


def test_a_replayed_finish_answers_the_generation_it_opened_not_a_later_one(service):
    someone = AuthContext(principal="someone")
    service.store.open_wait("replayed", "a", 0, DEADLINE)  # generation 1: another's
    service.store.signal(someone, "e-1", "replayed", "a", 1, "yes")
    service.store.resume("replayed", "a", 1, None)
    opened_later = []

    def reopened_by_the_same_task(task_id: str) -> None:
        service.store.signal(someone, "e-2", "replayed", "a", 2, "yes")
        service.store.resume("replayed", "a", 2, None)
        opened_later.append(
            service.store.open_wait("replayed", "a", 2, DEADLINE, task_id=task_id).generation)

    first, again = _sent_twice(
        service, "finish", {"result": "asked", "waits": [
            {**wait, "expected_generation": 1} for wait in _opening_waits("a")]},
        between=reopened_by_the_same_task)
    assert (first["waits"][0]["generation"], opened_later) == (2, [3])
    assert again == _replayed(first)


def test_a_replayed_fail_answers_as_its_first_answer_did(service):
    first, again = _sent_twice(service, "fail", {"reason": "flaky"})
    assert first == {"state": "pending", "replay": False}
    assert again == {"state": "pending", "replay": True}


def test_a_settled_finish_sent_again_replays_the_waits_it_opened(service):
    [held] = held_tasks(service, 1)
    outcome = {"task_id": held["task_id"], "fence": held["fence"], "outcome": "finish",
               "waits": _opening_waits("a", "b")}
    first, again = settle(service, outcome), settle(service, outcome)
    assert [opening["step"] for opening in first.json()["settled"][0]["waits"]] == ["a", "b"]
    assert again.json()["settled"][0] == _replayed(first.json()["settled"][0])


def test_a_stale_fence_is_409_lease_lost_and_writes_nothing(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    held = claim(service)
    with service.http("wendy") as worker:
        stale = worker.post(f"/v1/tasks/{task_id}/finish",
                            json={"fence": held["fence"] + 1, "result": 1})
    assert stale.status_code == 409 and stale.json()["type"] == "/problems/lease-lost"
    assert service.store.task(task_id).state == "running"


def test_a_worker_cannot_send_back_claim_fields_for_the_server_to_trust(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    held = claim(service)
    with service.http("wendy") as worker:
        forged = worker.post(f"/v1/tasks/{task_id}/finish", json={
            "fence": held["fence"], "result": 1, "payload": {"n": 99}, "owner": "x"})
    assert forged.status_code == 400
    assert service.store.task(task_id).state == "running"


def test_a_failure_returns_the_task_for_a_retry_and_release_gives_the_attempt_back(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    held = claim(service)
    with service.http("wendy") as worker:
        failed = worker.post(f"/v1/tasks/{task_id}/fail",
                             json={"fence": held["fence"], "reason": "flaky"})
        service.store.clock.advance(10)
        again = claim(service)
        released = worker.post(f"/v1/tasks/{task_id}/release", json={"fence": again["fence"]})
    assert failed.json()["state"] == "pending" and released.json()["state"] == "pending"
    assert service.store.task(task_id).attempts == 1


def held_tasks(service, count: int) -> list[dict]:
    """``count`` tasks alice submitted, claimed by wendy with one request."""
    with service.http("alice") as http:
        for n in range(count):
            submit(http, f"s-{n}")
    answer = service.http("wendy").post("/v1/claims", json={"limit": count})
    assert len(answer.json()["claims"]) == count
    return answer.json()["claims"]


def settle(service, *outcomes: dict) -> httpx.Response:
    return service.http("wendy").post("/v1/settlements", json={"outcomes": list(outcomes)})


def test_a_settlement_commits_each_outcome_and_answers_each_in_its_place(service):
    done, failed, released = held_tasks(service, 3)
    answer = settle(
        service,
        {"task_id": done["task_id"], "fence": done["fence"], "outcome": "finish",
         "result": {"ok": 1}},
        {"task_id": failed["task_id"], "fence": failed["fence"], "outcome": "fail",
         "reason": "bad input", "retryable": False},
        {"task_id": released["task_id"], "fence": released["fence"], "outcome": "release"})
    assert answer.status_code == 200, answer.text
    assert [(item["task_id"], item["state"], item["replay"])
            for item in answer.json()["settled"]] == [
        (done["task_id"], "done", False), (failed["task_id"], "failed", False),
        (released["task_id"], "pending", False)]
    store = service.store
    assert store.task(done["task_id"]).result == {"ok": 1}
    assert store.task(failed["task_id"]).last_error == "bad input"
    assert store.task(released["task_id"]).attempts == 0


def test_a_settled_outcome_with_a_stale_fence_is_lease_lost_and_costs_the_others_nothing(
        service):
    stale, fresh = held_tasks(service, 2)
    answer = settle(
        service,
        {"task_id": stale["task_id"], "fence": stale["fence"] + 1, "outcome": "finish"},
        {"task_id": fresh["task_id"], "fence": fresh["fence"], "outcome": "finish"})
    first, second = answer.json()["settled"]
    assert first["problem"]["type"] == "/problems/lease-lost" and "state" not in first
    assert second["state"] == "done"
    assert service.store.task(stale["task_id"]).state == "running"


def test_a_settlement_sent_again_after_it_committed_is_answered_as_a_replay(service):
    [held] = held_tasks(service, 1)
    outcome = {"task_id": held["task_id"], "fence": held["fence"], "outcome": "fail",
               "reason": "flaky"}
    first, again = settle(service, outcome), settle(service, outcome)
    assert first.json()["settled"][0] == {"task_id": held["task_id"], "state": "pending",
                                          "replay": False, "waits": []}
    assert again.json()["settled"][0] == {**first.json()["settled"][0], "replay": True}
    assert service.store.task(held["task_id"]).attempts == 1


def test_an_outcome_carrying_another_outcomes_field_is_refused_naming_it(service):
    finish, fail = held_tasks(service, 2)
    answer = settle(
        service,
        {"task_id": finish["task_id"], "fence": finish["fence"], "outcome": "finish",
         "reason": "not a finish's"},
        {"task_id": fail["task_id"], "fence": fail["fence"], "outcome": "fail"})
    assert [(item["problem"]["status"], item["problem"]["field"])
            for item in answer.json()["settled"]] == [
        (400, "outcomes[0].reason"), (400, "outcomes[1].reason")]
    assert {service.store.task(item["task_id"]).state for item in (finish, fail)} == {
        "running"}


def test_an_outcome_the_store_refuses_is_named_by_its_place_in_the_request(service):
    stale, deep = held_tasks(service, 2)
    nested: object = 1
    for _ in range(40):  # deeper than the store takes, which the schema cannot say
        nested = [nested]
    answer = settle(
        service,
        {"task_id": stale["task_id"], "fence": stale["fence"] + 1, "outcome": "release"},
        {"task_id": deep["task_id"], "fence": deep["fence"], "outcome": "finish",
         "result": nested})
    problem = answer.json()["settled"][1]["problem"]
    assert problem["status"] == 400 and problem["field"].startswith("outcomes[1].")


def test_a_settlement_claims_the_next_tasks_in_the_same_transaction(service):
    [held] = held_tasks(service, 1)
    with service.http("alice") as http:
        waiting = submit(http, "next").json()["task_id"]
    answer = service.http("wendy").post("/v1/settlements", json={
        "outcomes": [{"task_id": held["task_id"], "fence": held["fence"], "outcome": "finish"}],
        "claim": {"limit": 5, "lease": 60}})
    [claimed] = answer.json()["claims"]
    assert answer.json()["settled"][0]["state"] == "done"
    assert (claimed["task_id"], claimed["lease_until"]) == (waiting, START + 60)
    assert service.store.task(waiting).owner == "http:wendy"


def test_a_settlement_claims_only_from_the_queues_the_worker_is_granted(service):
    [held] = held_tasks(service, 1)
    answer = service.http("wendy").post("/v1/settlements", json={
        "outcomes": [{"task_id": held["task_id"], "fence": held["fence"], "outcome": "finish"}],
        "claim": {"queues": ["other"]}})
    assert answer.status_code == 403 and answer.json()["field"] == "claim.queues[0]"
    assert service.store.task(held["task_id"]).state == "running"


def two_queue_worker(service, per_queue: int = 3) -> httpx.Client:
    """A worker granted ``default`` and ``other``, with ``per_queue`` tasks pending in each
    (``default``'s submitted first)."""
    service.tokens["wes"] = service.store.add_principal(
        "wes", "worker", queues=("default", "other")).token
    with service.http("alice") as http:
        for queue in ("default", "other"):
            for n in range(per_queue):
                submit(http, f"{queue}-{n}", queue=queue)
    return service.http("wes")


def test_a_claim_takes_no_more_of_a_queue_than_its_per_queue_cap(service):
    worker = two_queue_worker(service)
    answer = worker.post("/v1/claims", json={"limit": 6, "per_queue": {"default": 1}})
    assert answer.status_code == 200, answer.text
    queues = [service.store.task(held["task_id"]).queue for held in answer.json()["claims"]]
    assert sorted(queues) == ["default", "other", "other", "other"]


def test_a_settlements_claim_keeps_to_its_per_queue_caps(service):
    worker = two_queue_worker(service, per_queue=2)
    [held] = worker.post("/v1/claims", json={"queues": ["default"]}).json()["claims"]
    answer = worker.post("/v1/settlements", json={
        "outcomes": [{"task_id": held["task_id"], "fence": held["fence"], "outcome": "finish"}],
        "claim": {"limit": 4, "per_queue": {"default": 0, "other": 1}}})
    assert answer.status_code == 200, answer.text
    [claimed] = answer.json()["claims"]
    assert service.store.task(claimed["task_id"]).queue == "other"


@pytest.mark.parametrize(("per_queue", "field"), [
    ({"default": -1}, "per_queue.default"),
    ({"default": "2"}, "per_queue.default"),
    ({f"q{n}": 1 for n in range(65)}, "per_queue"),
    ({"elsewhere": 1}, "per_queue"),  # not a queue of this claim
])
def test_a_per_queue_cap_that_cannot_be_is_400_naming_the_field(service, per_queue, field):
    answer = service.http("wendy").post("/v1/claims", json={"per_queue": per_queue})
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.text


def test_renewals_move_each_lease_held_and_answer_each_other_in_its_place(service):
    held, stale = held_tasks(service, 2)
    answer = service.http("wendy").post("/v1/renewals", json={"lease": 90, "claims": [
        {"task_id": held["task_id"], "fence": held["fence"]},
        {"task_id": stale["task_id"], "fence": stale["fence"] + 1},
        {"task_id": "0" * 64, "fence": 1}]})
    assert answer.status_code == 200, answer.text
    renewed, lost, unknown = answer.json()["renewed"]
    assert renewed == {"task_id": held["task_id"], "fence": held["fence"],
                       "lease_until": START + 90}
    assert (lost["task_id"], lost["problem"]["type"]) == (stale["task_id"],
                                                         "/problems/lease-lost")
    assert unknown["problem"]["status"] == 404
    assert service.store.task(held["task_id"]).lease_until == START + 90
    assert service.store.task(stale["task_id"]).lease_until != START + 90


def test_a_renewal_moves_the_lease(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    held = claim(service, lease=10)
    renewed = service.http("wendy").post(f"/v1/tasks/{task_id}/renew",
                                         json={"fence": held["fence"], "lease": 60})
    assert renewed.json()["lease_until"] == START + 60


def test_a_human_answers_the_wait_addressed_to_it_once(service):
    with service.http("olga") as operator:
        opened = operator.post("/v1/waits", json={
            "flow": "refund-1", "step": "approve", "deadline": START + 60,
            "responder": "hana"}).json()
    with service.http("hana") as human:
        listed = human.get("/v1/waits").json()["items"]
        path = f"/v1/waits/refund-1/approve/{opened['generation']}/signal"
        answer = human.post(path, json={"event_id": "e-1", "value": {"ok": True}}).json()
        again = human.post(path, json={"event_id": "e-1", "value": {"ok": True}}).json()
    assert [wait["flow"] for wait in listed] == ["refund-1"]
    assert (answer["result"], again["result"]) == ("accepted", "replay")


def test_an_operators_answer_to_a_wait_not_opened_yet_is_kept_as_an_early_signal(service):
    path = "/v1/waits/refund-2/approve/1/signal"
    with service.http("hana") as human:
        hidden = human.post(path, json={"event_id": "e-0", "value": 1})
    with service.http("olga") as operator:
        early = operator.post(path, json={"event_id": "e-1", "value": 1}).json()
        again = operator.post(path, json={"event_id": "e-1", "value": 1}).json()
    assert hidden.status_code == 404
    assert (early["result"], again["result"]) == ("unknown_wait", "replay")


@pytest.mark.parametrize("generation", ["¹", "٣", "-1", "1.0", "12345678901"])
@pytest.mark.parametrize("tail", ["signal", "approval"])
def test_a_generation_that_is_not_ascii_digits_is_a_400_naming_it(service, generation, tail):
    body = {"event_id": "e-1", "value": 1} if tail == "signal" else {"event_id": "e-1",
                                                                     "approve": True}
    with service.http("hana") as human:
        answer = human.post(f"/v1/waits/refund-1/approve/{generation}/{tail}", json=body)
    assert answer.status_code == 400 and answer.json()["field"] == "generation"


def test_operators_cancel_retry_pause_and_resume(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    with service.http("olga") as operator:
        paused = operator.post("/v1/queues/default/pause", json={"reason": "deploy"}).json()
        queues = operator.get("/v1/queues").json()["paused"]
        cancelled = operator.post(f"/v1/tasks/{task_id}/cancel", json={}).json()
        rerun = operator.post(f"/v1/tasks/{task_id}/retry", json={"reason": "try again"})
        dry = operator.post("/v1/retries", json={"reason": "all", "dry_run": True}).json()
        resumed = operator.post("/v1/queues/default/resume").json()
    assert paused["paused"] and [item["operator"] for item in queues] == ["olga"]
    assert cancelled["cancelled"] is True
    assert rerun.status_code == 201 and rerun.json()["operator"] == "olga"
    assert [item["task_id"] for item in dry["tasks"]] == [task_id]
    assert resumed["resumed"] is True


def test_cancelling_an_ended_root_answers_that_its_chain_not_it_was_cancelled(service):
    import postroom

    with service.http("alice") as http:
        root = submit(http).json()["task_id"]
    claim = service.store.claim("w-1")
    assert claim is not None and claim.task_id == root
    service.store.finish(claim, "ok", follow_ups=[postroom.FollowUp(message_id="c", payload={})])
    with service.http("olga") as operator:
        first = operator.post(f"/v1/tasks/{root}/cancel", json={}).json()
        again = operator.post(f"/v1/tasks/{root}/cancel", json={}).json()
    assert first == {"task_id": root, "cancelled": False, "state": "done",
                     "chain_cancelled": True}
    assert again == {"task_id": root, "cancelled": False}


def test_a_dead_reply_is_requeued_by_an_operator_with_a_reason(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    service.store.cancel(task_id)
    claims = service.store.claim_replies("d", limit=1)
    service.store.record_delivery(claims[0], _permanent())
    with service.http("olga") as operator:
        dead = operator.get("/v1/replies/dead").json()["items"]
        requeued = operator.post(f"/v1/replies/{dead[0]['reply_id']}/requeue",
                                 json={"reason": "receiver fixed"})
    assert requeued.status_code == 200
    assert service.store.reply(task_id).state == "pending"


def test_requeuing_a_reply_that_is_not_dead_is_409_with_the_stores_reason(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
    service.store.cancel(task_id)
    reply_id = service.store.reply(task_id).reply_id
    with service.http("olga") as operator:
        again = operator.post(f"/v1/replies/{reply_id}/requeue", json={"reason": "why not"})
    assert again.status_code == 409
    assert "only a dead reply can be requeued; it is pending" in again.json()["detail"]


def _permanent():
    import postroom

    return postroom.Outcome.permanent("422 refused")


def test_status_counts_the_four_stages_and_the_audit_is_clean(service):
    with service.http("alice") as http:
        submit(http)
    with service.http("olga") as operator:
        status = operator.get("/v1/status").json()
        audit = operator.get("/v1/audit").json()
    assert status["queues"]["default"]["received"] == 1
    assert audit == {"ok": True, "violations": []}


def test_a_body_over_the_limit_is_refused_from_its_content_length(service, limits):
    with service.http("alice") as http:
        answer = http.post("/v1/tasks", content=b"{" + b" " * limits.max_body + b"}",
                           headers={"content-type": "application/json"})
    assert answer.status_code == 413 and answer.json()["type"] == "/problems/too-large"


def test_a_streamed_body_over_the_limit_is_refused_before_it_ends(service, limits):
    host, port = service.url.removeprefix("http://").split(":")
    chunk = b" " * 65536
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/tasks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                     b"\r\ntransfer-encoding: chunked\r\nauthorization: Bearer "
                     + service.tokens["alice"].encode() + b"\r\n\r\n")
        for _ in range(limits.max_body // len(chunk) + 1):  # over the limit, never ended
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        while b"}" not in answer:
            answer += conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"/problems/too-large" in answer


def test_every_request_is_answered_within_the_timeout(store):
    def slow(call):
        """Sleep."""
        time.sleep(3)
        return Answer(body={})

    route = Route(method="GET", path="/slow", handler=slow, roles=None)
    app = create_app(store, limits=Limits(timeout=0.5, max_poll=0.1), routes=[route])
    with Server(app) as url:
        started = time.monotonic()
        answer = httpx.get(f"{url}/slow", timeout=10)
    assert answer.status_code == 503 and answer.json()["type"] == "/problems/timeout"
    assert time.monotonic() - started < 2


def test_no_more_calls_run_at_once_than_the_service_has_threads_and_the_rest_wait(store):
    running, most, lock = 0, 0, threading.Lock()
    all_queued = threading.Event()

    def busy(call):
        """Hold a thread until every request has arrived."""
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        all_queued.wait(10)
        time.sleep(0.05)
        with lock:
            running -= 1
        return Answer(body={})

    route = Route(method="GET", path="/busy", handler=busy, roles=None)
    app = create_app(store, limits=Limits(threads=2), routes=[route])
    with Server(app) as url:
        answers: list[int] = []

        def ask() -> None:
            answers.append(httpx.get(f"{url}/busy", timeout=10).status_code)

        askers = [threading.Thread(target=ask) for _ in range(5)]
        for asker in askers:
            asker.start()
        time.sleep(0.3)  # the five requests reach the server; two of them run
        all_queued.set()
        for asker in askers:
            asker.join()
    assert answers == [200] * 5
    assert most == 2


@pytest.mark.parametrize("threads", [0, 1025])
def test_a_thread_count_outside_its_range_is_refused_naming_it(threads):
    with pytest.raises(InvalidInput) as refused:
        Limits(threads=threads)
    assert refused.value.field == "threads"


def test_a_missing_or_bad_token_is_one_401(service):
    with httpx.Client(base_url=service.url) as http:
        answers = [http.get("/v1/me"), http.get("/v1/me", headers={"authorization": "Bearer x"}),
                   http.get("/v1/me", headers={"authorization": "Basic eDp5"})]
    assert {answer.status_code for answer in answers} == {401}
    assert len({answer.content for answer in answers}) == 1
    assert answers[0].headers["www-authenticate"].startswith("Bearer")


def _tasks_of(service, principal: str) -> int:
    return len(service.store.list_tasks(principal=principal).items)


def test_a_token_revoked_after_its_first_use_is_refused_next_and_stores_nothing(service):
    with service.http("alice") as http:
        assert submit(http, "m-1").status_code == 202
        service.store.revoke_principal("alice")
        refused = submit(http, "m-2")
    assert refused.status_code == 401 and refused.json()["type"] == "/problems/unauthenticated"
    assert _tasks_of(service, "alice") == 1


def test_a_token_rotated_out_after_its_first_use_is_refused_on_a_read(service):
    with service.http("alice") as http:
        answer = submit(http)
        service.store.rotate_token("alice")
        refused = http.get(answer.headers["location"])
    assert refused.status_code == 401


def test_a_revoked_token_is_refused_where_its_call_reads_nothing(service):
    with service.http("alice") as http:
        assert http.get("/v1/me").status_code == 200
        assert http.post("/v1/claims", json={}).status_code == 403
        service.store.revoke_principal("alice")
        answers = [http.get("/v1/me"), http.post("/v1/claims", json={}),
                   http.post("/v1/tasks", json={"message_id": 5})]
    assert [answer.status_code for answer in answers] == [401, 401, 401]


def test_a_batch_under_a_token_revoked_after_its_first_use_is_refused_and_stores_nothing(
        service):
    with service.http("alice") as http:
        assert submit(http, "m-1").status_code == 202
        service.store.revoke_principal("alice")
        refused = http.post("/v1/batches", json={"envelopes": [
            {"message_id": "m-2", "payload": {}, "deadline": DEADLINE}]})
    assert refused.status_code == 401
    assert _tasks_of(service, "alice") == 1


def test_health_readiness_and_the_openapi_document_need_no_token(service):
    with httpx.Client(base_url=service.url) as http:
        health, ready = http.get("/healthz"), http.get("/readyz")
        document = http.get("/openapi.json").json()
    assert health.json() == ready.json() == {"ok": True}
    assert document["openapi"] == "3.1.0"
    assert {(route.method.lower(), route.path) for route in ROUTES} == {
        (method, path) for path, item in document["paths"].items() for method in item}


def test_a_method_an_api_path_does_not_serve_is_405_naming_the_methods_it_does(service):
    with service.http("alice") as http:
        answer = http.delete("/v1/tasks")
    assert answer.status_code == 405
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == "/problems/method-not-allowed"
    assert answer.headers["allow"] == "GET, HEAD, POST"


def test_head_is_answered_as_get_without_a_body(service):
    with httpx.Client(base_url=service.url) as http:
        answer = http.head("/healthz")
    assert answer.status_code == 200 and answer.content == b""
    assert answer.headers["content-type"] == "application/json"


def test_a_path_parameter_arrives_decoded_and_a_path_outside_the_api_is_404(service):
    with service.http("alice") as http:
        task_id = submit(http).json()["task_id"]
        escaped = "".join(f"%{ord(char):02X}" for char in task_id)
        found = http.get(f"/v1/tasks/{escaped}")
        missing = http.get("/v1/tasks/")
        elsewhere = http.get("/v2/tasks")
    assert found.status_code == 200 and found.json()["task_id"] == task_id
    assert missing.status_code == elsewhere.status_code == 404
    assert missing.json()["type"] == elsewhere.json()["type"] == "/problems/not-found"


def test_every_answer_carries_a_request_id_of_its_own(service):
    with service.http("alice") as http:
        ids = [http.get("/healthz").headers["x-request-id"] for _ in range(3)]
        ids.append(http.get("/v1/tasks/nothing-here").headers["x-request-id"])
    assert len(set(ids)) == 4
    assert all(len(found) == 32 and int(found, 16) >= 0 for found in ids)

