"""The Python client and the remote worker, against a real server, on both backends."""

from __future__ import annotations

import asyncio
import enum
import json
import threading

import httpx
import pytest

import postroom
from postroom import Budget
from postroom.client import AsyncClient, Client, RemoteWorker
from postroom.runtime import App, Context, PermanentFailure
from tests.support import START

DEADLINE = START + 3600


def test_an_agent_submits_and_reads_its_task_through_the_client(service):
    agent = service.client("alice")
    ack = agent.submit("c-1", {"n": 1}, deadline=DEADLINE)
    again = agent.submit("c-1", {"n": 1}, deadline=DEADLINE)
    assert (ack.duplicate, again.duplicate, again.task_id) == (False, True, ack.task_id)
    assert agent.task(ack.task_id)["state"] == "pending"


def test_the_client_raises_postrooms_own_errors(service):
    agent = service.client("alice")
    with pytest.raises(postroom.InvalidInput) as invalid:
        agent.submit("c-1", {"n": 1}, deadline=DEADLINE, max_attempts=0)
    with pytest.raises(postroom.NotFound):
        agent.task("0" * 64)
    with pytest.raises(postroom.Unauthorized):
        agent.status()
    assert invalid.value.field == "max_attempts"


def test_the_client_raises_a_payload_collision_as_the_store_does(service):
    agent = service.client("alice")
    agent.submit("c-1", {"n": 1}, deadline=DEADLINE)
    with pytest.raises(postroom.PayloadCollision) as local:
        service.store.receive(postroom.AuthContext(principal="alice", role="agent"),
                              postroom.Envelope(message_id="c-1", payload={"n": 2},
                                                deadline=DEADLINE, sender="alice"))
    with pytest.raises(postroom.PayloadCollision) as remote:
        agent.submit("c-1", {"n": 2}, deadline=DEADLINE)
    assert (remote.value.identity, str(remote.value)) == (local.value.identity, str(local.value))


def test_the_async_client_speaks_the_same_api(service):
    async def run() -> tuple[postroom.Ack, dict]:
        async with AsyncClient(service.url, service.tokens["alice"]) as agent:
            ack = await agent.submit("a-1", {"n": 1}, deadline=DEADLINE)
            return ack, await agent.task(ack.task_id)

    ack, task = asyncio.run(run())
    assert task["task_id"] == ack.task_id and task["principal"] == "alice"


class LosesFirstAnswers(httpx.HTTPTransport):
    """Sends every request, but loses the answer of the first ``count`` of ``paths``: the
    request was served, the client never heard."""

    def __init__(self, paths: tuple[str, ...], count: int = 1) -> None:
        super().__init__()
        self.paths = paths
        self.count = count

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.count and request.url.path.endswith(self.paths):
            self.count -= 1
            response.read()
            response.close()
            raise httpx.ReadError("connection lost", request=request)
        return response


def test_a_lost_answer_is_retried_safely_for_submits_and_outcomes(service):
    agent = Client(service.url, service.tokens["alice"], backoff=0,
                   transport=LosesFirstAnswers(("/v1/tasks",)))
    worker = Client(service.url, service.tokens["wendy"], backoff=0,
                    transport=LosesFirstAnswers(("/finish",)))
    with agent, worker:
        ack = agent.submit("r-1", {"n": 1}, deadline=DEADLINE)
        (claim,) = worker.claim()
        answer = worker.finish(claim, {"ok": True})
    assert ack.duplicate is True  # the first send stored it
    assert answer["replay"] is True  # the first finish committed it
    assert len(service.store.list_tasks().items) == 1
    assert service.store.task(ack.task_id).result == {"ok": True}


def test_a_rerun_whose_answer_is_lost_is_sent_again_and_makes_one_new_task(service):
    task_id = service.client("alice").submit(
        "r-1", {"n": 1}, deadline=DEADLINE, max_attempts=1).task_id
    worker = service.client("wendy")
    (claim,) = worker.claim()
    worker.fail(claim, "broken")
    operator = Client(service.url, service.tokens["olga"], backoff=0,
                      transport=LosesFirstAnswers(("/retry", "/v1/retries")))
    with operator:
        single = operator.retry(task_id, reason="fixed")
        (made,) = service.store.retries(task_id)
        bulk = operator.retry_many(reason="fixed", state="failed")
    assert single["new_task_id"] == made.new_task_id
    # the bulk request is a new decision about the same task: one more, not two
    assert [item["number"] for item in bulk["retries"]] == [2]
    assert len(service.store.retries(task_id)) == 2


def test_a_remote_worker_commits_a_fan_out_as_large_as_a_local_worker_does(service):
    app = App()

    @app.handler("default")
    def fan_out(payload: dict, ctx: Context) -> str:
        for n in range(150):
            ctx.spawn(f"child-{n}", {"n": n}, queue="elsewhere")
        return "spread"

    ack = service.client("alice").submit("f-1", {"n": 1}, deadline=DEADLINE)
    assert RemoteWorker(service.client("wendy"), app, batch=1).run_once() == 1
    assert service.store.task(ack.task_id).result == "spread"
    assert sum(service.store.info()["tasks"].values()) == 151


@pytest.mark.parametrize("payload", [{1: "a"}, {"t": enum.Enum("E", "A").A},
                                     {"n": float("nan")}], ids=["int-key", "enum", "nan"])
def test_a_payload_no_store_takes_is_refused_by_the_client_as_by_the_store(service, payload):
    with pytest.raises(postroom.InvalidEnvelope) as remote:
        service.client("alice").submit("j-1", payload, deadline=DEADLINE)
    with pytest.raises(postroom.InvalidEnvelope) as local:
        service.store.receive(postroom.AuthContext(principal="alice"), postroom.Envelope(
            message_id="j-1", sender="alice", payload=payload, deadline=DEADLINE))
    assert (remote.value.field, str(remote.value)) == (local.value.field, str(local.value))
    assert service.store.list_tasks().items == []


def test_a_signal_value_or_result_no_store_takes_is_refused_naming_it(service):
    service.client("alice").submit("j-2", {"n": 1}, deadline=DEADLINE)
    worker = service.client("wendy")
    (claim,) = worker.claim()
    with pytest.raises(postroom.InvalidInput) as value:
        service.client("hana").signal("e-1", "flow", "ask", 1, {2: "b"})
    with pytest.raises(postroom.InvalidInput) as result:
        worker.settle_many([postroom.Finished(claim=claim, result={3: "c"})])
    assert (value.value.field, result.value.field) == ("value", "outcomes[0].result")
    assert service.store.task(claim.task_id).state == "running"


def test_a_batch_stopped_by_an_item_raises_batch_failed_as_the_store_does(service):
    def items(prefix: str) -> list[dict]:
        return [{"message_id": f"{prefix}-{n}", "payload": {"n": n} if n != 1 else {
            "deep": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}, "deadline": DEADLINE}
            for n in range(3)]

    with pytest.raises(postroom.BatchFailed) as remote:
        service.client("alice").submit_batch(items("h"))
    with pytest.raises(postroom.BatchFailed) as local:
        service.store.receive_batch(postroom.AuthContext(principal="alice"), [
            postroom.Envelope(sender="alice", **item) for item in items("s")])
    assert (remote.value.index, len(remote.value.acks)) == (local.value.index, 1)
    cause, expected = remote.value.__cause__, local.value.__cause__
    assert isinstance(cause, postroom.InvalidInput) and isinstance(expected, postroom.InvalidInput)
    assert (cause.field, str(cause)) == (expected.field, str(expected))


def test_names_holding_a_slash_reach_their_wait_and_queue(service):
    worker, operator = service.client("wendy"), service.client("olga")
    opened = worker.open_wait("orders/17", "ask/price", 0, START + 60, responder="hana")
    found = service.client("hana").wait("orders/17", "ask/price", generation=1)
    receipt = service.client("hana").signal("e-1", "orders/17", "ask/price", 1, "yes")
    paused = operator.pause("eu/refunds", reason="deploy")
    assert (opened["result"], found["flow"], found["step"]) == ("opened", "orders/17",
                                                                "ask/price")
    assert receipt["result"] == "accepted" and paused["paused"] is True
    assert [item.queue for item in service.store.paused_queues()] == ["eu/refunds"]


def test_a_submitted_root_lowers_its_chains_budgets_as_in_process(service):
    agent = service.client("alice")
    ack = agent.submit("b-1", {"n": 1}, deadline=DEADLINE, budget=Budget(tasks=2, cost=5))
    child = agent.submit("b-2", {"n": 2}, deadline=DEADLINE, parent_task_id=ack.task_id,
                         hops=1)
    chain = service.store.chain(ack.task_id)
    assert (chain.max_tasks, chain.max_cost) == (2, 5)
    assert service.store.chain(child.task_id).root_task_id == ack.task_id
    assert service.store.task(child.task_id).hops == 1


def test_a_wait_opened_whose_answer_is_lost_is_sent_again_and_replays_opened(service):
    worker = Client(service.url, service.tokens["wendy"], backoff=0,
                    transport=LosesFirstAnswers(("/v1/waits",)))
    with worker:
        opening = worker.open_wait("flow", "ask", 0, START + 60)
    assert (opening["result"], opening["generation"], opening["replay"]) == ("opened", 1, True)
    assert service.store.wait("flow", "ask").generation == 1


def test_a_remote_worker_runs_an_apps_handlers_with_no_database(service):
    app = App()

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> dict:
        if payload.get("bad"):
            raise PermanentFailure("no")
        ctx.spawn("next", {"after": ctx.task_id}, queue="default")
        ctx.open_wait(f"flow-{ctx.message_id}", "ask", START + 60, responder="hana")
        return {"doubled": payload["n"] * 2}

    agent = service.client("alice")
    good = agent.submit("w-1", {"n": 21}, deadline=DEADLINE)
    bad = agent.submit("w-2", {"n": 0, "bad": True}, deadline=DEADLINE)
    worker = RemoteWorker(service.client("wendy"), app, batch=2)
    assert worker.run_once() == 2
    assert service.store.task(good.task_id).result == {"doubled": 42}
    assert service.store.task(bad.task_id).state == "failed"
    assert service.store.wait("flow-w-1", "ask").responder == "hana"
    assert worker.settled == {"finish": 1, "fail": 1, "release": 0, "fenced": 0}


def test_a_remote_worker_abandons_a_task_whose_claim_is_lost(service):
    app = App()
    store = service.store

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> None:
        store.cancel(ctx.task_id)  # an operator cancels it while it runs

    ack = service.client("alice").submit("x-1", {"n": 1}, deadline=DEADLINE)
    worker = RemoteWorker(service.client("wendy"), app)
    worker.run_once()
    assert worker.settled["fenced"] == 1
    assert store.task(ack.task_id).state == "cancelled"


class CountingTransport(httpx.HTTPTransport):
    """httpx's transport, counting the requests sent to each path."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


def submitted(service, count: int, prefix: str = "r") -> list[str]:
    agent = service.client("alice")
    return [agent.submit(f"{prefix}-{n}", {"n": n}, deadline=DEADLINE).task_id
            for n in range(count)]


def test_a_remote_finish_whose_wait_cannot_open_fails_naming_the_stores_error(service):
    app = App()
    app.handler("default")(lambda payload, ctx: ctx.open_wait("f", "s", DEADLINE) or "asked")
    opened, refused = submitted(service, 2)
    RemoteWorker(service.client("wendy"), app, batch=1).run_once()
    RemoteWorker(service.client("wendy"), app, batch=1).run_once()
    assert service.store.task(opened).state == "done"
    task = service.store.task(refused)
    assert (task.state, task.last_error) == ("pending", (
        "finish refused: WaitNotOpened: wait 'f'/'s' did not open: stale (its generation is "
        "1); nothing was written"))


class Meeting:
    """Handlers that meet in groups of ``size`` (a barrier, broken unless that many run at
    once), counting the most that ran at once."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(size, timeout=30)
        self.running = self.most = 0

    def attend(self) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self._barrier.wait()
        with self._lock:
            self.running -= 1


def test_a_remote_worker_runs_up_to_its_concurrency_of_handlers_at_once(service):
    app, threes = App(), Meeting(3)
    app.handler("default")(lambda payload, ctx: threes.attend())
    task_ids = submitted(service, 6)
    worker = RemoteWorker(service.client("wendy"), app, concurrency=3, batch=6)
    assert worker.run_once() == 6
    assert threes.most == 3
    assert {service.store.task(task_id).state for task_id in task_ids} == {"done"}


def test_a_remote_worker_commits_a_rounds_outcomes_with_one_request(service):
    app = App()
    app.handler("default")(lambda payload, ctx: payload["n"])
    task_ids = submitted(service, 3)
    transport = CountingTransport()
    client = Client(service.url, service.tokens["wendy"], retries=0, transport=transport)
    with client:
        RemoteWorker(client, app, batch=3).run_once()
    assert transport.paths == ["/v1/claims", "/v1/settlements"]
    assert [service.store.task(task_id).result for task_id in task_ids] == [0, 1, 2]


def test_a_remote_worker_fails_a_finish_whose_result_is_not_json_and_settles_the_rest(
        service):
    app = App()
    app.handler("default")(lambda payload, ctx: object() if payload["n"] == 1 else "ok")
    task_ids = submitted(service, 3)
    worker = RemoteWorker(service.client("wendy"), app, batch=3)
    worker.run_once()
    tasks = [service.store.task(task_id) for task_id in task_ids]
    assert [task.state for task in tasks] == ["done", "failed", "done"]
    assert tasks[1].last_error.startswith("finish refused: InvalidInput: result")
    assert worker.settled == {"finish": 2, "fail": 1, "release": 0, "fenced": 0}


def stopped_once(worker: RemoteWorker, ready: threading.Event) -> bool:
    """Run ``worker`` on a thread, stop it once ``ready`` is set: whether ``run`` returned."""
    running = threading.Thread(target=worker.run)
    running.start()
    assert ready.wait(30)
    worker.stop()
    running.join(30)
    return not running.is_alive()


def test_a_running_remote_worker_works_until_stopped_and_settles_what_it_holds(service):
    app, all_started = App(), threading.Event()
    started = []

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> str:
        started.append(ctx.task_id)
        if len(started) == 10:
            all_started.set()
        return "ok"

    task_ids = submitted(service, 10)
    worker = RemoteWorker(service.client("wendy"), app, concurrency=4, poll=0.05)
    assert stopped_once(worker, all_started)
    assert worker.settled["finish"] == 10
    assert {service.store.task(task_id).state for task_id in task_ids} == {"done"}


def test_a_remote_worker_whose_principal_is_revoked_stops_and_raises(service):
    app = App()

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> None:
        service.store.revoke_principal("wendy")

    [task_id] = submitted(service, 1)
    worker = RemoteWorker(service.client("wendy"), app)
    with pytest.raises(postroom.Unauthorized):
        worker.run_once()
    assert service.store.task(task_id).state == "running"  # its lease will run out


def test_a_remote_worker_sends_outcomes_too_large_for_one_request_in_parts(service):
    app = App()
    app.handler("default")(lambda payload, ctx: "x" * 60_000)  # 5 of them pass 256 KiB
    task_ids = submitted(service, 5)
    transport = CountingTransport()
    with Client(service.url, service.tokens["wendy"], retries=0, transport=transport) as client:
        worker = RemoteWorker(client, app, batch=5)
        worker.run_once()
    assert transport.paths.count("/v1/settlements") == 3  # all five, then two and three
    assert worker.settled["finish"] == 5
    assert {service.store.task(task_id).state for task_id in task_ids} == {"done"}


def test_a_remote_worker_renews_every_lease_it_holds_with_one_request(service):
    app, transport = App(), CountingTransport()
    renewed = threading.Event()

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> str:
        assert renewed.wait(30)
        return "ok"

    def watch() -> None:  # lets the handlers end once a renewal went out
        while "/v1/renewals" not in transport.paths:
            threading.Event().wait(0.01)
        renewed.set()

    task_ids = submitted(service, 3)
    threading.Thread(target=watch, daemon=True).start()
    with Client(service.url, service.tokens["wendy"], retries=0, transport=transport) as client:
        RemoteWorker(client, app, batch=3, lease=0.3).run_once()
    renewals = [path for path in transport.paths if "renew" in path]
    assert renewals and set(renewals) == {"/v1/renewals"}
    assert {service.store.task(task_id).state for task_id in task_ids} == {"done"}


def test_a_remote_workers_coroutines_share_one_event_loop(service):
    app, loops = App(), set()

    @app.handler("default")
    async def handle(payload: dict, ctx: Context) -> int:
        loops.add(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return payload["n"]

    task_ids = submitted(service, 4)
    worker = RemoteWorker(service.client("wendy"), app, batch=2)
    assert worker.run_once() == 2 and worker.run_once() == 2
    worker.close()
    assert len(loops) == 1
    assert [service.store.task(task_id).result for task_id in task_ids] == [0, 1, 2, 3]


def test_a_remote_worker_cancels_the_coroutine_of_a_claim_it_lost(service):
    app, ends = App(), []

    @app.handler("default")
    async def handle(payload: dict, ctx: Context) -> None:
        service.store.cancel(ctx.task_id)  # an operator cancels it while it runs
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            ends.append(("cancelled", ctx.cancelled))
            raise

    [task_id] = submitted(service, 1)
    worker = RemoteWorker(service.client("wendy"), app, lease=0.3)
    worker.run_once()
    worker.close()
    assert ends == [("cancelled", True)]
    assert worker.settled["fenced"] == 1
    assert service.store.task(task_id).state == "cancelled"


def test_a_remote_handlers_charge_is_spent_from_its_chains_budget(service):
    app = App()

    @app.handler("default")
    def costly(payload: dict, ctx: Context) -> str:
        ctx.charge(3)
        return "charged"

    ack = service.client("alice").submit("c-1", {"n": 1}, deadline=DEADLINE)
    RemoteWorker(service.client("wendy"), app).run_once()
    assert service.store.task(ack.task_id).state == "done"
    assert service.store.chain(ack.task_id).cost == 3


class Interrupted(BaseException):
    """Not an ``Exception``: what no handler's failure is made of."""


@pytest.mark.parametrize("ending", [Interrupted, SystemExit, KeyboardInterrupt,
                                    asyncio.CancelledError])
@pytest.mark.parametrize("coroutine", [False, True])
def test_a_remote_handler_ending_in_a_base_exception_abandons_only_its_own_task(
        service, coroutine, ending):
    app = App()

    def outcome(payload: dict) -> int:
        if payload["n"] == 0:
            raise ending
        return payload["n"]

    async def handle_async(payload: dict, ctx: Context) -> int:
        return outcome(payload)

    app.handler("default")(handle_async if coroutine else (lambda payload, ctx: outcome(payload)))
    first, second = submitted(service, 2)
    worker = RemoteWorker(service.client("wendy"), app, batch=2)
    assert worker.run_once() == 2
    worker.close()
    assert worker.settled == {"finish": 1, "fail": 0, "release": 0, "fenced": 1}
    assert service.store.task(first).state == "running"  # its lease will run out
    assert service.store.task(second).result == 1


@pytest.mark.parametrize("coroutine", [False, True])
def test_a_stopped_remote_worker_releases_what_outlives_its_grace_and_marks_nothing_done(
        service, coroutine):
    app, started, let_go, ends = App(), threading.Event(), threading.Event(), []

    def block() -> str:
        started.set()
        assert let_go.wait(30)
        return "late"

    async def block_async(payload: dict, ctx: Context) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise
        return "late"

    app.handler("default")(block_async if coroutine else (lambda payload, ctx: block()))
    [task_id] = submitted(service, 1)
    worker = RemoteWorker(service.client("wendy"), app, grace=0.2, poll=0.05)
    returned = stopped_once(worker, started)
    let_go.set()
    assert returned
    assert worker.settled["release"] == 1 and worker.settled["finish"] == 0
    task = service.store.task(task_id)
    assert (task.state, task.attempts) == ("pending", 0)
    assert ends == (["cancelled"] if coroutine else [])


@pytest.mark.parametrize("coroutine", [False, True])
def test_a_remote_handler_past_its_timeout_is_abandoned_and_its_attempt_fails(service,
                                                                             coroutine):
    app, let_go, seen = App(), threading.Event(), []

    def hang(ctx: Context) -> str:
        assert ctx.cancellation.wait(30)  # told it was abandoned
        seen.append("told")
        assert let_go.wait(30)
        return "too late"

    async def hang_async(payload: dict, ctx: Context) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "too late"

    app.handler("default", timeout=0.2)(
        hang_async if coroutine else (lambda payload, ctx: hang(ctx)))
    [task_id] = submitted(service, 1)
    worker = RemoteWorker(service.client("wendy"), app)
    worker.run_once()
    let_go.set()
    worker.close()
    task = service.store.task(task_id)
    assert (task.state, task.attempts) == ("pending", 1)
    assert task.last_error == "timed out: ran past its execution timeout of 0.2s"
    assert seen == ["cancelled" if coroutine else "told"]
    assert worker.settled == {"finish": 0, "fail": 1, "release": 0, "fenced": 0}


def test_a_remote_handlers_timeout_counts_from_when_it_starts_not_while_it_waits_for_a_thread(
        service):
    app, let_go, second_claimed, finished = (App(), threading.Event(), threading.Event(),
                                             threading.Event())

    @app.handler("default", timeout=0.2)
    def handler(payload: dict, ctx: Context) -> str:
        if payload["n"] == 0:
            assert let_go.wait(30)  # abandoned at 0.2 s, its thread busy until let go
            return "too late"
        finished.set()
        return "ok"

    agent = service.client("alice")
    first = agent.submit("t-0", {"n": 0}, deadline=DEADLINE, max_attempts=1).task_id
    second = agent.submit("t-1", {"n": 1}, deadline=DEADLINE).task_id
    worker = RemoteWorker(service.client("wendy"), app, concurrency=1, poll=0.05)
    running = threading.Thread(target=worker.run)
    running.start()
    while service.store.task(second).state != "running":
        assert running.is_alive()
        second_claimed.wait(0.01)
    # Held, waiting for the one thread: twice its timeout passes before it can start.
    assert not finished.wait(0.4)
    let_go.set()
    assert finished.wait(30)
    worker.stop()
    running.join(30)
    assert (service.store.task(first).state, service.store.task(second).state) == (
        "failed", "done")
    assert service.store.task(second).attempts == 1


def test_a_remote_worker_claims_no_more_of_a_capped_queue_than_its_cap_leaves(service):
    service.tokens["wes"] = service.store.add_principal(
        "wes", "worker", queues=("default", "other")).token
    app, agent = App(), service.client("alice")
    for queue in ("default", "other"):
        app.handler(queue)(lambda payload, ctx: "ok")
        for n in range(3):
            agent.submit(f"{queue}-{n}", {"n": n}, deadline=DEADLINE, queue=queue)
    worker = RemoteWorker(service.client("wes"), app, batch=6,
                          queue_concurrency={"default": 1})
    assert worker.run_once() == 4  # one of default's three, and all of other's
    done = [task for task in service.store.list_tasks(state="done").items]
    assert sorted(task.queue for task in done) == ["default", "other", "other", "other"]


def test_a_running_remote_worker_runs_no_more_of_a_queue_at_once_than_its_cap(service):
    service.tokens["wes"] = service.store.add_principal(
        "wes", "worker", queues=("default", "other")).token
    app, pairs, all_done, done = App(), Meeting(2), threading.Event(), []

    @app.handler("default")
    def capped(payload: dict, ctx: Context) -> None:
        pairs.attend()
        done.append(ctx.task_id)
        if len(done) == 8:
            all_done.set()

    app.handler("other")(lambda payload, ctx: "ok")  # quick: its slots free up first
    agent = service.client("alice")
    acks = [agent.submit(f"{queue}-{n}", {"n": n}, deadline=DEADLINE, queue=queue)
            for queue in ("default", "other") for n in range(8)]
    worker = RemoteWorker(service.client("wes"), app, concurrency=6, poll=0.05,
                          queue_concurrency={"default": 2})
    assert stopped_once(worker, all_done)
    assert pairs.most == 2
    assert {service.store.task(ack.task_id).state for ack in acks} == {"done"}


def test_a_remote_workers_timeout_for_a_queue_holds_for_a_handler_that_sets_none(service):
    app = App()

    @app.handler("default")
    async def hang(payload: dict, ctx: Context) -> str:
        await asyncio.sleep(60)
        return "too late"

    [task_id] = submitted(service, 1)
    worker = RemoteWorker(service.client("wendy"), app, timeouts={"default": 0.2})
    worker.run_once()
    worker.close()
    task = service.store.task(task_id)
    assert task.last_error == "timed out: ran past its execution timeout of 0.2s"


@pytest.mark.parametrize(("given", "problem"), [
    ({"queue_concurrency": {"other": 1}}, "queue_concurrency: not a queue this worker claims"),
    ({"queue_concurrency": {"default": 0}}, "queue_concurrency['default']"),
    ({"timeouts": {"default": -1}}, "timeouts['default']"),
])
def test_a_remote_worker_refuses_per_queue_settings_that_cannot_be(service, given, problem):
    app = App()
    app.handler("default")(lambda payload, ctx: None)
    with pytest.raises(postroom.InvalidInput, match=problem.replace("[", r"\[")):
        RemoteWorker(service.client("wendy"), app, **given)


def test_a_refusal_names_its_field_once(service):
    with pytest.raises(postroom.InvalidInput) as invalid:
        service.client("alice").submit("c-1", {"n": 1}, deadline=DEADLINE, max_attempts=0)
    assert invalid.value.field == "max_attempts"
    assert str(invalid.value).count("max_attempts") == 1


def test_a_remote_worker_for_a_queue_without_a_handler_is_refused_when_it_is_made(service):
    app = App()
    app.handler("other")(lambda payload, ctx: "ok")
    with pytest.raises(postroom.InvalidInput) as refused:
        RemoteWorker(service.client("wendy"), app, queues=["default"])
    assert str(refused.value) == "queues: no handler for 'default'"


def test_a_remote_handler_sees_the_owner_its_claim_is_recorded_under(service):
    seen = []
    app = App()
    app.handler("default")(lambda payload, ctx: seen.append(ctx.claim.owner))
    [task_id] = submitted(service, 1)
    RemoteWorker(service.client("wendy"), app).run_once()
    assert seen == ["http:wendy"] == [service.store.story(task_id).attempts[0].owner]


class Level(enum.IntEnum):
    HIGH = 2


@pytest.mark.parametrize(("result", "field"), [
    ({1: "one"}, "result"), ({"level": Level.HIGH}, "result.level"),
    ({"n": 2**70}, "result.n"), ({"x": float("nan")}, "result.x")])
def test_a_remote_result_json_would_not_carry_as_it_is_fails_its_attempt_for_good(
        service, result, field):
    app = App()
    app.handler("default")(lambda payload, ctx: result)
    [task_id] = submitted(service, 1)
    RemoteWorker(service.client("wendy"), app).run_once()
    task = service.store.task(task_id)
    assert (task.state, task.result) == ("failed", None)
    assert task.last_error.startswith(f"finish refused: InvalidInput: {field}: ")


def test_a_remote_follow_up_that_is_not_json_fails_its_attempt_and_costs_the_others_nothing(
        service):
    app = App()

    @app.handler("default")
    def handle(payload: dict, ctx: Context) -> str:
        if payload["n"] == 0:
            ctx.spawn("child", {"x": object()})
        return "ok"

    bad, good = submitted(service, 2)
    worker = RemoteWorker(service.client("wendy"), app, batch=2)
    assert worker.run_once() == 2
    assert service.store.task(bad).state == "failed"
    assert "follow_ups[0].payload.x: object is not a JSON value" in (
        service.store.task(bad).last_error)
    assert service.store.task(good).state == "done"
    assert worker.settled == {"finish": 1, "fail": 1, "release": 0, "fenced": 0}


class RefusesFirstSettlement(httpx.HTTPTransport):
    """Answers the first settlement as a service whose schema refused its first outcome
    would (a 400 naming it, nothing served); serves everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.settlements: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/settlements":
            self.settlements.append(json.loads(request.content))
            if len(self.settlements) == 1:
                return httpx.Response(400, json={
                    "type": "/problems/invalid-input", "title": "Invalid input",
                    "status": 400, "detail": "outcomes[0].result: not taken here",
                    "field": "outcomes[0].result"})
        return super().handle_request(request)


def test_a_settlement_refused_for_one_outcome_fails_that_attempt_and_commits_the_others(
        service):
    app = App()
    app.handler("default")(lambda payload, ctx: "ok")
    submitted(service, 2)
    transport = RefusesFirstSettlement()
    client = Client(service.url, service.tokens["wendy"], retries=0, transport=transport)
    service.opened.append(client)
    worker = RemoteWorker(client, app, batch=2)
    assert worker.run_once() == 2
    first, again = transport.settlements
    refused = first["outcomes"][0]["task_id"]
    assert [(item["task_id"], item["outcome"]) for item in again["outcomes"]] == [
        (refused, "fail"), (first["outcomes"][1]["task_id"], "finish")]
    task = service.store.task(refused)
    assert task.state == "failed"
    assert task.last_error == "finish refused: InvalidInput: outcomes[0].result: not taken here"
    assert worker.settled == {"finish": 1, "fail": 1, "release": 0, "fenced": 0}


class SignalsClaims(httpx.HTTPTransport):
    """Sets ``claiming`` as each claim request is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.claiming = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/claims":
            self.claiming.set()
        return super().handle_request(request)


def test_a_remote_worker_stopped_while_its_claim_waits_hands_back_what_the_claim_brings(
        service):
    ran = []
    app = App()
    app.handler("default")(lambda payload, ctx: ran.append(ctx.task_id))
    transport = SignalsClaims()
    client = Client(service.url, service.tokens["wendy"], retries=0, transport=transport)
    service.opened.append(client)
    worker = RemoteWorker(client, app, poll=5.0)
    running = threading.Thread(target=worker.run)
    running.start()
    assert transport.claiming.wait(30)
    worker.stop()
    [task_id] = submitted(service, 1)  # the claim waiting for work takes it
    running.join(30)
    assert not running.is_alive()
    task = service.store.task(task_id)
    assert ran == [] and (task.state, task.attempts) == ("pending", 0)
    assert worker.settled == {"finish": 0, "fail": 0, "release": 1, "fenced": 0}
