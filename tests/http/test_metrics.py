"""``/metrics``: the store in Prometheus' format, every figure read from durable rows at
scrape time, so every process serving the store reports the same."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

import postroom
from postroom.http.app import build_app
from postroom.http.metrics import CONTENT_TYPE, MetricsApp, SubmissionCounters, registry_for
from tests.conformance.test_status import REFUSED
from tests.http.servers import serve
from tests.support import START, envelope


def scrape(store: postroom.Store) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape served over HTTP, by name and sorted labels."""
    with serve(MetricsApp(registry_for(store))) as url:
        answer = httpx.get(f"{url}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == CONTENT_TYPE
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text)
            for sample in family.samples}


def test_every_metric_is_prefixed_postroom(store, auth):
    store.receive(auth, envelope("m"))
    assert all(name.startswith("postroom_") for name, _ in scrape(store))


def test_tasks_are_counted_per_state_and_queue(store, auth):
    store.receive_atomic(auth, [envelope("a", queue="a"), envelope("b", queue="a"),
                                envelope("c", queue="b")])
    store.claim("w", queues="a")
    samples = scrape(store)
    assert samples["postroom_tasks", (("queue", "a"), ("state", "pending"))] == 1
    assert samples["postroom_tasks", (("queue", "a"), ("state", "running"))] == 1
    assert samples["postroom_tasks", (("queue", "b"), ("state", "pending"))] == 1


def test_finished_tasks_are_a_counter_per_terminal_state(store, auth):
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    store.finish(store.claim("w"), None)
    store.fail(store.claim("w"), "no", retryable=False)
    samples = scrape(store)
    assert samples["postroom_tasks_finished_total", (("queue", "default"),
                                                     ("state", "done"))] == 1
    assert samples["postroom_tasks_finished_total", (("queue", "default"),
                                                     ("state", "failed"))] == 1


def test_the_oldest_pending_task_is_aged(store, auth, clock):
    store.receive(auth, envelope("m"))
    clock.advance(7)
    assert scrape(store)["postroom_oldest_pending_task_age_seconds",
                         (("queue", "default"),)] == 7


def test_queue_wait_and_run_time_are_histograms_of_the_window(store, auth, clock):
    store.receive(auth, envelope("m"))
    clock.advance(2)
    claim = store.claim("w")
    clock.advance(20)
    store.finish(claim, None)
    samples = scrape(store)
    queue = ("queue", "default")
    assert samples["postroom_queue_wait_seconds_bucket", (("le", "1.0"), queue)] == 0
    assert samples["postroom_queue_wait_seconds_bucket", (("le", "2.5"), queue)] == 1
    assert samples["postroom_queue_wait_seconds_gsum", (queue,)] == 2
    assert samples["postroom_run_seconds_bucket", (("le", "10.0"), queue)] == 0
    assert samples["postroom_run_seconds_bucket", (("le", "30.0"), queue)] == 1
    assert samples["postroom_run_seconds_gcount", (queue,)] == 1


def test_attempts_fenced_commits_and_lease_expiries_come_from_task_histories(
        store, auth, clock, settings):
    store.receive(auth, envelope("m", max_attempts=3))
    store.claim("w1")
    clock.advance(settings.lease + 1)
    store.sweep()  # w1's lease expired: the task is pending again
    store.fail(store.claim("w2"), "flaky")  # a retryable failure, committed through its fence
    clock.advance(60)  # past the retry's backoff
    store.finish(store.claim("w3"), None)
    samples = scrape(store)
    queue = ("queue", "default")
    assert {outcome: samples["postroom_attempts", (("outcome", outcome), queue)]
            for outcome in ("lease_expired", "retry", "done")} == {
        "lease_expired": 1, "retry": 1, "done": 1}
    assert samples["postroom_fenced_commits", (queue,)] == 2
    assert samples["postroom_lease_expiries", (queue,)] == 1


def test_the_outbox_is_counted_aged_and_its_deliveries_counted_by_result(
        store, auth, clock, transport):
    store.receive_atomic(auth, [envelope("a"), envelope("b"), envelope("c")])
    for _ in range(3):
        store.finish(store.claim("w"), None)
    store.dispatch(transport)  # one sent
    store.dispatch(REFUSED)  # one dead
    clock.advance(5)
    samples = scrape(store)
    queue = ("queue", "default")
    assert samples["postroom_replies", (queue, ("state", "pending"))] == 1
    assert samples["postroom_replies", (queue, ("state", "dead"))] == 1
    assert samples["postroom_replies_sent_total", (queue,)] == 1
    assert samples["postroom_dead_replies", ()] == 1
    assert samples["postroom_outbox_oldest_pending_age_seconds", (queue,)] == 5
    assert samples["postroom_delivery_attempts", (queue, ("result", "delivered"))] == 1
    assert samples["postroom_delivery_attempts", (queue, ("result", "permanent"))] == 1


def test_open_waits_and_wait_outcomes_are_counted(store):
    store.open_wait("f", "s1", 0, START + 10)
    opened = store.open_wait("f", "s2", 0, START + 10)
    store.signal(postroom.AuthContext(principal="h"), "e", "f", "s2", opened.generation, 1)
    samples = scrape(store)
    assert samples["postroom_open_waits", ()] == 1
    assert samples["postroom_waits", (("state", "signaled"),)] == 1
    assert samples["postroom_waits", (("state", "waiting"),)] == 1


def test_every_process_serving_one_store_reports_the_same(db_url, clock, settings, auth):
    with postroom.open_store(db_url, clock=clock, settings=settings) as worker_side, \
            postroom.open_store(db_url, clock=clock, settings=settings) as other:
        worker_side.receive_atomic(auth, [envelope("a"), envelope("b")])
        worker_side.finish(worker_side.claim("w"), None)
        assert scrape(other) == scrape(worker_side)
        assert scrape(other)["postroom_tasks_finished_total", (("queue", "default"),
                                                               ("state", "done"))] == 1


def test_a_store_that_cannot_be_read_reports_only_that_it_is_down(db_url, clock, settings):
    store = postroom.open_store(db_url, clock=clock, settings=settings)
    store.close()
    assert scrape(store) == {("postroom_store_up", ()): 0}


def test_submission_counters_are_this_processs_own(store):
    registry = registry_for(store)
    counters = SubmissionCounters(registry)
    counters.duplicates.inc()
    assert registry.get_sample_value("postroom_http_idempotency_duplicates_total") == 1
    assert registry.get_sample_value("postroom_http_idempotency_conflicts_total") == 0


def test_only_get_reads_the_metrics(store):
    with serve(MetricsApp(registry_for(store))) as url:
        assert httpx.post(f"{url}/metrics").status_code == 405


def test_the_service_counts_the_duplicates_and_conflicts_it_answered(store):
    token = store.add_principal("planner", "agent").token
    deadline = START + 3600

    def item(message_id: str, n: int) -> dict[str, object]:
        return {"message_id": message_id, "payload": {"n": n}, "deadline": deadline}

    with serve(build_app(store)) as url, httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {token}"}) as http:
        assert http.post("/v1/tasks", json=item("a", 1)).status_code == 202
        assert http.post("/v1/tasks", json=item("a", 1)).json()["duplicate"] is True
        assert http.post("/v1/tasks", json=item("a", 2)).status_code == 409
        batch = http.post("/v1/batches", json={"envelopes": [item("a", 1), item("b", 1)]})
        assert [ack["duplicate"] for ack in batch.json()["acks"]] == [True, False]
        refused = http.post("/v1/batches", json={"envelopes": [item("b", 1), item("a", 9)]})
        assert refused.status_code == 409
        assert http.post("/v1/batches/atomic", json={
            "envelopes": [item("c", 1), item("b", 2)]}).status_code == 409
        samples = {sample.name: sample.value for family in text_string_to_metric_families(
            http.get("/metrics").text) for sample in family.samples}
    # duplicates: "a" again, "a" in the first batch, "b" before the refused item
    assert samples["postroom_http_idempotency_duplicates_total"] == 3
    assert samples["postroom_http_idempotency_conflicts_total"] == 3


def test_head_answers_a_scrapes_headers_without_its_body(store):
    with serve(MetricsApp(registry_for(store))) as url:
        got, head = httpx.get(f"{url}/metrics"), httpx.head(f"{url}/metrics")
    assert (head.status_code, head.headers["content-type"], head.content) == (
        200, CONTENT_TYPE, b"")
    assert int(head.headers["content-length"]) > 0 and got.content
