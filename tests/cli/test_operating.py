"""The operators' commands (``postroom.cli_ops``) on both backends: reading a store (status,
list, inspect) and recording decisions (cancel, signal, requeue-dead, retry, pause, resume,
limit, prune), with their exit codes: 0 done, 1 refused for the record's state, 2 cannot run.

They run in-process through click's ``CliRunner`` on a store the test fills through the
library; ``test_a_refusal_exits_1_from_a_real_process`` checks one exit code end to end."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

import click
import pytest
from click.testing import CliRunner, Result

import postroom
from postroom import Outcome, ReplyState, TaskState, faults
from postroom.cli import main
from tests.harness import children
from tests.harness.children import python
from tests.support import approved_child, envelope, orphan_from_its_chain


def cli(*args: str) -> Result:
    # The group makes SIGTERM exit through the command's clean-up: not this test process's.
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        signal.signal(signal.SIGTERM, previous)


def shown(result: Result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def utc(seconds: float) -> str:
    """A time as the commands show it to people: UTC, to the second."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def far(message_id: str, **fields: object) -> postroom.Envelope:
    """An envelope whose deadline is an hour from the wall clock the commands run by."""
    return envelope(message_id, deadline=time.time() + 3600, **fields)


class Refusing:
    """A transport whose receiver refuses every reply for good: each one goes dead."""

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> list[Outcome]:
        return [Outcome.permanent("HTTP 400 bad reply") for _ in batch]


@pytest.fixture
def live(db_url: str) -> Iterator[postroom.Store]:
    """The store at ``db_url`` on the wall clock, as the commands open it."""
    with postroom.open_store(db_url) as store:
        yield store


def failed_task(store: postroom.Store, auth: postroom.AuthContext, message_id: str,
                **fields: object) -> str:
    """A task that failed for good (received first in its queue: the next claimed)."""
    task_id = store.receive(auth, far(message_id, **fields)).task_id
    claim = store.claim("w-1", queues=store.task(task_id).queue)
    assert claim is not None and claim.task_id == task_id
    assert store.fail(claim, "boom", retryable=False) is TaskState.FAILED
    return task_id


def dead_reply(store: postroom.Store, auth: postroom.AuthContext, message_id: str) -> str:
    """The reply of a done task that its receiver refused (the task received first)."""
    task_id = store.receive(auth, far(message_id)).task_id
    claim = store.claim("w-1")
    assert claim is not None and claim.task_id == task_id
    store.finish(claim, {"ok": True})
    assert store.dispatch(Refusing()).dead == 1
    reply = store.reply(task_id)
    assert reply is not None and reply.state is ReplyState.DEAD
    return reply.reply_id


# -- status --------------------------------------------------------------------------------------

def test_status_counts_each_stage_apart(db_url, live, auth):
    dead_reply(live, auth, "refused")
    live.receive(auth, far("running"))
    assert live.claim("w-1") is not None
    live.receive(auth, far("waiting"))
    queue = shown(cli("status", db_url, "--json"))["queues"]["default"]
    assert (queue["received"], queue["processing"]) == (1, 1)
    assert queue["outcomes"]["done"] == 1 and queue["deliveries"]["dead"] == 1


def test_status_shows_open_waits_dead_replies_paused_queues_and_limits(db_url, live, auth):
    dead_reply(live, auth, "refused")
    live.open_wait("refund-17", "approve", 0, time.time() + 3600)
    live.pause_queue("billing", operator="ana", reason="invoice run")
    live.set_queue_limit("default", 3)
    document = shown(cli("status", db_url, "--json"))
    assert (document["open_waits"], document["dead_replies"]) == (1, 1)
    assert [(item["queue"], item["operator"], item["reason"])
            for item in document["paused_queues"]] == [("billing", "ana", "invoice run")]
    assert document["queue_limits"] == {"default": 3}


def test_status_table_names_every_stage_and_the_paused_queue(db_url, live, auth):
    live.receive(auth, far("waiting"))
    live.pause_queue("default", operator="ana", reason="deploy")
    result = cli("status", db_url)
    assert result.exit_code == 0
    header, row = result.stdout.splitlines()[:2]
    assert header.split() == ["queue", "received", "processing", "outcomes", "delivery",
                              "awaiting_endpoint", "oldest_pending", "paused", "limit"]
    assert row.split()[:3] == ["default", "1", "0"] and "paused" in row.split()
    assert "paused default by ana" in result.stdout and "deploy" in result.stdout


# -- list ----------------------------------------------------------------------------------------

def test_list_tasks_filters_by_state_and_queue(db_url, live, auth):
    failed = failed_task(live, auth, "c", queue="mail")
    live.receive(auth, far("a", queue="mail"))
    live.receive(auth, far("b"))
    listed = shown(cli("list", db_url, "tasks", "--queue", "mail", "--state", "failed",
                       "--json"))
    assert [task["task_id"] for task in listed["tasks"]] == [failed]
    assert listed["next_cursor"] is None


def test_list_tasks_by_creation_time(db_url, live, auth):
    live.receive(auth, far("old"))
    after = time.time()
    newer = live.receive(auth, far("new")).task_id
    listed = shown(cli("list", db_url, "tasks", "--since", repr(after - 0.0001), "--json"))
    assert [task["task_id"] for task in listed["tasks"]] == [newer]
    assert shown(cli("list", db_url, "tasks", "--since", "1h", "--until",
                     "2000-01-01T00:00", "--json"))["tasks"] == []


def test_list_pages_go_on_from_the_cursor_printed(db_url, live, auth):
    ids = [live.receive(auth, far(f"m-{index}")).task_id for index in range(3)]
    first = cli("list", db_url, "tasks", "--limit", "2")
    assert first.exit_code == 0 and first.stderr.startswith("more: --cursor ")
    cursor = first.stderr.split()[-1]
    rest = shown(cli("list", db_url, "tasks", "--limit", "2", "--cursor", cursor, "--json"))
    seen = [line.split()[0] for line in first.stdout.splitlines()[1:]]
    assert sorted(seen + [task["task_id"] for task in rest["tasks"]]) == sorted(ids)


def test_list_pages_filtered_by_a_duration_go_on_with_the_arguments_printed(db_url, live,
                                                                            auth):
    ids = [live.receive(auth, far(f"m-{index}")).task_id for index in range(3)]
    first = shown(cli("list", db_url, "tasks", "--since", "1h", "--limit", "2", "--json"))
    assert first["next_args"][:2] == ["--cursor", first["next_cursor"]]
    # "1h" stands for a later time now than it did for the first page.
    rest = cli("list", db_url, "tasks", "--since", "1h", "--limit", "2", *first["next_args"])
    assert rest.exit_code == 0, rest.stderr
    seen = [task["task_id"] for task in first["tasks"]]
    assert sorted(seen + [line.split()[0] for line in rest.stdout.splitlines()[1:]]) == (
        sorted(ids))


def test_list_dead_replies_and_open_waits(db_url, live, auth):
    reply_id = dead_reply(live, auth, "refused")
    live.open_wait("refund-17", "approve", 0, time.time() + 3600, responder="ana")
    dead = shown(cli("list", db_url, "dead", "--json"))["dead"]
    assert [(item["reply_id"], item["last_error"]) for item in dead] == [
        (reply_id, "permanent: HTTP 400 bad reply")]
    (wait,) = shown(cli("list", db_url, "waits", "--json"))["waits"]
    assert (wait["flow"], wait["step"], wait["generation"], wait["responder"]) == (
        "refund-17", "approve", 1, "ana")
    assert reply_id in cli("list", db_url, "dead").stdout


def test_list_waits_due_before_a_time(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 600)
    live.open_wait("refund-18", "approve", 0, time.time() + 7200)
    (due,) = shown(cli("list", db_url, "waits", "--due-before",
                       repr(time.time() + 3600), "--json"))["waits"]
    assert due["flow"] == "refund-17"


def test_list_waits_due_before_a_duration_counts_it_from_now(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 600)
    live.open_wait("refund-18", "approve", 0, time.time() + 7200)
    (due,) = shown(cli("list", db_url, "waits", "--due-before", "1h", "--json"))["waits"]
    assert due["flow"] == "refund-17"


def test_list_refuses_a_filter_of_another_kind(db_url, live):
    result = cli("list", db_url, "waits", "--queue", "mail")
    assert result.exit_code == 2 and "--queue does not filter waits" in result.stderr


def test_list_refuses_a_time_it_cannot_read(db_url, live):
    result = cli("list", db_url, "tasks", "--since", "yesterday")
    assert result.exit_code == 2 and "'yesterday' is neither" in result.stderr


# -- inspect -------------------------------------------------------------------------------------

def test_inspect_tells_the_attempts_the_reply_its_deliveries_and_requeue(db_url, live, auth):
    reply_id = dead_reply(live, auth, "refused")
    (dead,) = live.list_dead_replies().items
    task_id = dead.task_id
    live.requeue_reply(reply_id, operator="ana", reason="receiver fixed")
    story = shown(cli("inspect", db_url, task_id, "--json"))
    assert story["task"]["task_id"] == task_id and story["task"]["state"] == "done"
    assert [(item["owner"], item["fence"], item["outcome"]) for item in story["attempts"]] == [
        ("w-1", 1, "done")]
    assert story["reply"]["reply_id"] == reply_id
    assert [item["outcome"] for item in story["deliveries"]] == ["permanent"]
    assert [(item["operator"], item["reason"]) for item in story["requeues"]] == [
        ("ana", "receiver fixed")]


def test_inspect_lists_the_re_runs_of_a_task(db_url, live, auth):
    task_id = failed_task(live, auth, "flaky")
    made = live.retry(task_id, operator="ana", reason="fixed the bug")
    story = shown(cli("inspect", db_url, task_id, "--json"))
    assert [(item["new_task_id"], item["operator"]) for item in story["retries"]] == [
        (made.new_task_id, "ana")]
    assert story["attempts"][0]["error"] == "boom"
    told = cli("inspect", db_url, task_id).stdout
    assert f"-> {made.new_task_id}" in told and "boom" in told and "fence 1" in told


def test_inspect_json_tells_the_chain_and_the_approval_a_side_effect_used(db_url, live):
    made = approved_child(live, time.time())
    story = shown(cli("inspect", db_url, made.child, "--json"))
    assert (story["task"]["parent_task_id"], story["task"]["hops"]) == (made.root, 1)
    chain = story["chain"]
    assert (chain["root_task_id"], chain["max_hops"], chain["tasks"], chain["max_tasks"],
            chain["cost"], chain["max_cost"]) == (made.root, 3, 2, 5, 2, 10)
    (effect,) = story["side_effects"]
    assert (effect["action"], effect["resource"], effect["data_digest"], effect["approval_id"],
            effect["use_number"], effect["granted_by"], effect["granted_at"]) == (
        "refund", "customer:17", made.approval.data_digest, "refund-17", 1, "alice",
        made.approval.granted_at)


def test_inspect_tells_the_chain_and_the_approval_a_side_effect_used(db_url, live):
    made = approved_child(live, time.time())
    (effect,) = live.side_effects(made.child)
    told = cli("inspect", db_url, made.child).stdout
    assert f"chain {made.root}\n" in told
    assert f"  parent {made.root}  hops 1 of max 3  tasks 2/5  cost 2/10\n" in told
    assert (f"side effect 1  refund on customer:17  data {made.approval.data_digest[:12]}…  "
            f"approval refund-17 (use 1)  granted by alice at "
            f"{utc(made.approval.granted_at)}  consumed {utc(effect.created_at)}") in told


def test_inspect_tells_a_root_is_its_own_chains_root(db_url, live, auth):
    task_id = live.receive(auth, far("alone")).task_id
    told = cli("inspect", db_url, task_id).stdout
    assert f"chain {task_id}  (this task is its root)\n" in told
    assert "  parent -  hops 0 of max 4  tasks 1/1000  cost 0 (no cost budget)\n" in told
    assert "side effect" not in told


def test_inspect_of_a_task_without_a_chain_has_no_chain_section(db_url, live, auth):
    task_id = live.receive(auth, far("alone")).task_id
    orphan_from_its_chain(live, task_id)
    assert shown(cli("inspect", db_url, task_id, "--json"))["chain"] is None
    told = cli("inspect", db_url, task_id).stdout
    assert "\nchain " not in told and "budget" not in told


def test_inspect_of_no_such_task_cannot_run(db_url, live):
    result = cli("inspect", db_url, "nope")
    assert result.exit_code == 2 and "NotFound" in result.stderr


# -- cancel --------------------------------------------------------------------------------------

def test_cancel_ends_a_pending_task_recording_who_and_why(db_url, live, auth):
    task_id = live.receive(auth, far("m-1")).task_id
    done = shown(cli("cancel", db_url, task_id, "--reason", "duplicate order",
                     "--operator", "ana"))
    assert done == {"task_id": task_id, "cancelled": True, "operator": "ana"}
    task = live.task(task_id)
    assert task.state is TaskState.CANCELLED
    assert task.last_error == "cancelled by ana: duplicate order"


def test_cancel_of_an_ended_task_is_refused_with_exit_1(db_url, live, auth):
    task_id = failed_task(live, auth, "m-1")
    result = cli("cancel", db_url, task_id, "--reason", "late")
    assert result.exit_code == 1 and "is failed: it has ended" in result.stderr
    assert live.task(task_id).state is TaskState.FAILED


def test_cancel_of_an_ended_root_cancels_its_chain_and_says_the_root_was_not(db_url, live,
                                                                              auth):
    root = live.receive(auth, far("root")).task_id
    claim = live.claim("w-1")
    assert claim is not None and claim.task_id == root
    live.finish(claim, "ok", follow_ups=[postroom.FollowUp(message_id="child", payload={})])
    (child,) = [task.task_id for task in live.list_tasks().items if task.task_id != root]
    done = shown(cli("cancel", db_url, root, "--reason", "stop", "--operator", "ana"))
    assert done == {"task_id": root, "cancelled": False, "state": "done",
                    "chain_cancelled": True, "operator": "ana"}
    assert (live.task(root).state, live.task(child).state) == (TaskState.DONE,
                                                              TaskState.CANCELLED)
    again = cli("cancel", db_url, root, "--reason", "stop")
    assert again.exit_code == 1 and "is done: it has ended" in again.stderr


def test_cancel_without_a_reason_cannot_run(db_url, live, auth):
    task_id = live.receive(auth, far("m-1")).task_id
    assert cli("cancel", db_url, task_id).exit_code == 2
    assert live.task(task_id).state is TaskState.PENDING


# -- signal --------------------------------------------------------------------------------------

def test_signal_answers_the_current_generation(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 3600)
    receipt = shown(cli("signal", db_url, "refund-17", "approve", '{"approved": true}',
                        "--event-id", "e-1", "--principal", "ana"))
    assert (receipt["result"], receipt["generation"], receipt["principal"]) == (
        "accepted", 1, "ana")
    (continuation,) = live.continuations()
    assert continuation.value == {"approved": True}


def test_signal_again_with_the_same_event_is_a_replay(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 3600)
    cli("signal", db_url, "refund-17", "approve", "true", "--event-id", "e-1")
    again = shown(cli("signal", db_url, "refund-17", "approve", "true", "--event-id", "e-1"))
    assert (again["result"], again["recorded"]) == ("replay", "accepted")
    assert len(live.continuations()) == 1


def test_signal_not_accepted_exits_1_and_says_why(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 3600)
    cli("signal", db_url, "refund-17", "approve", "true", "--event-id", "e-1")
    result = cli("signal", db_url, "refund-17", "approve", "false", "--event-id", "e-2")
    assert result.exit_code == 1 and json.loads(result.stdout)["result"] == "closed"


def test_signal_refuses_a_value_that_is_not_json(db_url, live):
    live.open_wait("refund-17", "approve", 0, time.time() + 3600)
    result = cli("signal", db_url, "refund-17", "approve", "yes")
    assert result.exit_code == 2 and "not JSON" in result.stderr
    assert live.wait("refund-17", "approve").state.value == "waiting"


# -- requeue-dead --------------------------------------------------------------------------------

def test_requeue_dead_sends_it_again_recording_who_when_and_why(db_url, live, auth):
    reply_id = dead_reply(live, auth, "refused")
    before = time.time()
    done = shown(cli("requeue-dead", db_url, reply_id, "--reason", "receiver fixed",
                     "--operator", "ana"))
    assert done["requeued"] is True
    (requeue,) = live.requeues(reply_id)
    assert (requeue.operator, requeue.reason) == ("ana", "receiver fixed")
    assert requeue.requeued_at >= before - 1
    assert live.list_dead_replies().items == []


def test_requeue_dead_of_a_reply_that_is_not_dead_exits_1(db_url, live, auth):
    reply_id = dead_reply(live, auth, "refused")
    cli("requeue-dead", db_url, reply_id, "--reason", "once")
    result = cli("requeue-dead", db_url, reply_id, "--reason", "twice")
    assert result.exit_code == 1 and "only a dead reply can be requeued" in result.stderr
    assert len(live.requeues(reply_id)) == 1


# -- retry ---------------------------------------------------------------------------------------

def test_retry_runs_a_failed_task_again_and_prints_the_new_id(db_url, live, auth):
    task_id = failed_task(live, auth, "flaky")
    result = cli("retry", db_url, task_id, "--reason", "fixed the bug", "--operator", "ana")
    assert result.exit_code == 0, result.output
    new_id = result.stdout.strip()
    assert live.task(new_id).retry_of == task_id
    assert live.task(new_id).state is TaskState.PENDING
    assert [(item.operator, item.reason) for item in live.retries(task_id)] == [
        ("ana", "fixed the bug")]


def test_retry_json_shows_the_recorded_decision(db_url, live, auth):
    task_id = failed_task(live, auth, "flaky")
    decision = shown(cli("retry", db_url, task_id, "--reason", "fixed", "--operator", "ana",
                         "--json"))
    (recorded,) = live.retries(task_id)
    assert decision == {"task_id": task_id, "number": 1, "new_task_id": recorded.new_task_id,
                        "operator": "ana", "reason": "fixed",
                        "retried_at": recorded.retried_at, "request_id": None}


def test_retry_of_a_task_that_is_not_re_runnable_exits_1(db_url, live, auth):
    task_id = live.receive(auth, far("m-1")).task_id
    result = cli("retry", db_url, task_id, "--reason", "again")
    assert result.exit_code == 1 and f"refused: task {task_id} is pending" in result.stderr
    assert live.retries(task_id) == []


def test_retry_dry_run_lists_what_would_run_again_and_writes_nothing(db_url, live, auth):
    failed = [failed_task(live, auth, f"f-{index}", queue="mail") for index in range(2)]
    failed_task(live, auth, "other")
    listed = shown(cli("retry", db_url, "--queue", "mail", "--reason", "outage over",
                       "--dry-run", "--json"))
    assert sorted(task["task_id"] for task in listed["would_retry"]) == sorted(failed)
    assert all(live.retries(task_id) == [] for task_id in failed)


def test_a_bulk_retry_cut_short_by_its_limit_says_so(db_url, live, auth):
    for index in range(3):
        failed_task(live, auth, f"f-{index}", queue="mail")
    capped = cli("retry", db_url, "--queue", "mail", "--reason", "r", "--dry-run",
                 "--limit", "2")
    whole = cli("retry", db_url, "--queue", "mail", "--reason", "r", "--dry-run",
                "--limit", "3")
    assert "--limit 2 reached: more tasks match" in capped.stderr
    assert "dry run: 2 tasks would run again" in capped.stderr
    assert "reached" not in whole.stderr


def test_bulk_retry_runs_each_named_task_again(db_url, live, auth):
    failed = [failed_task(live, auth, f"f-{index}", queue="mail") for index in range(3)]
    cancelled = live.receive(auth, far("c", queue="mail")).task_id
    live.cancel(cancelled, reason="oops")
    result = cli("retry", db_url, "--queue", "mail", "--state", "failed", "--reason",
                 "outage over", "--operator", "ana")
    assert result.exit_code == 0, result.output
    pairs = dict(line.split(" -> ") for line in result.stdout.splitlines())
    assert sorted(pairs) == sorted(failed)
    assert all(live.task(new).retry_of == old for old, new in pairs.items())
    assert live.retries(cancelled) == [] and "3 of 3 tasks run again" in result.stderr


def second_commit_fails() -> Callable[[str], None]:
    """A fault action: the second time its point is reached, the disk is full."""
    passed: list[str] = []

    def action(name: str) -> None:
        passed.append(name)
        if len(passed) == 2:
            raise postroom.StoreError("disk full")

    return action


def test_bulk_retry_that_stops_midway_shows_the_re_runs_it_made(db_url, live, auth):
    failed = [failed_task(live, auth, f"f-{index}") for index in range(3)]
    with faults.armed("retry.before_commit", second_commit_fails(), times=None):
        result = cli("retry", db_url, "--state", "failed", "--reason", "outage over")
    assert result.exit_code == 2 and "disk full" in result.stderr
    assert "1 of 3 tasks run again" in result.stderr
    (line,) = result.stdout.splitlines()
    old, new = line.split(" -> ")
    assert [task_id for task_id in failed if live.retries(task_id)] == [old]
    assert live.task(new).retry_of == old


def test_a_bulk_retry_run_again_with_its_request_id_reruns_each_task_once(db_url, live,
                                                                          auth):
    failed = [failed_task(live, auth, f"f-{index}") for index in range(3)]
    command = ("retry", db_url, "--state", "failed", "--reason", "outage over",
               "--request-id", "outage-7")
    with faults.armed("retry.before_commit", second_commit_fails(), times=None):
        assert cli(*command).exit_code == 2
    result = cli(*command)
    assert result.exit_code == 0, result.output
    assert [len(live.retries(task_id)) for task_id in failed] == [1, 1, 1]
    assert "3 of 3 tasks run again" in result.stderr


def test_bulk_retry_takes_only_the_tasks_created_in_the_window(db_url, live, auth):
    failed_task(live, auth, "early")
    after = time.time()
    late = failed_task(live, auth, "late")
    result = cli("retry", db_url, "--since", repr(after - 0.0001), "--until", "0s",
                 "--reason", "outage over")
    assert result.exit_code == 0, result.output
    assert [line.split(" -> ")[0] for line in result.stdout.splitlines()] == [late]


@pytest.mark.parametrize("args", [["--reason", "r"], ["t-1", "--queue", "q", "--reason", "r"],
                                  ["t-1", "--dry-run", "--reason", "r"]])
def test_retry_must_name_one_task_or_filters_not_both(db_url, live, args):
    result = cli("retry", db_url, *args)
    assert result.exit_code == 2 and "TASK_ID" in result.stderr


# -- pause, resume, limit ------------------------------------------------------------------------

def test_pause_keeps_the_queues_tasks_from_being_claimed(db_url, live, auth):
    live.receive(auth, far("m-1"))
    done = shown(cli("pause", db_url, "default", "--reason", "deploy", "--operator", "ana"))
    assert done == {"queue": "default", "paused": True, "operator": "ana", "reason": "deploy"}
    assert live.claim("w-1") is None
    assert [(item.operator, item.reason) for item in live.paused_queues()] == [("ana", "deploy")]


def test_pausing_a_paused_queue_exits_1_and_keeps_the_first_record(db_url, live):
    cli("pause", db_url, "default", "--reason", "deploy", "--operator", "ana")
    result = cli("pause", db_url, "default", "--reason", "other", "--operator", "bo")
    assert result.exit_code == 1 and "paused already, by ana" in result.stderr
    assert [item.operator for item in live.paused_queues()] == ["ana"]


def test_resume_lets_the_queue_be_claimed_again(db_url, live, auth):
    live.receive(auth, far("m-1"))
    live.pause_queue("default", operator="ana", reason="deploy")
    assert shown(cli("resume", db_url, "default")) == {"queue": "default", "paused": False}
    assert live.claim("w-1") is not None


def test_resuming_a_queue_that_is_not_paused_exits_1(db_url, live):
    result = cli("resume", db_url, "default")
    assert result.exit_code == 1 and "is not paused" in result.stderr


def test_limit_sets_and_lifts_a_queues_running_limit(db_url, live):
    assert shown(cli("limit", db_url, "mail", "2")) == {"queue": "mail", "running_limit": 2}
    assert live.queue_limits() == {"mail": 2}
    assert shown(cli("limit", db_url, "mail", "none"))["running_limit"] is None
    assert live.queue_limits() == {}


@pytest.mark.parametrize("running", ["two", "0"])
def test_limit_refuses_what_is_not_a_limit(db_url, live, running):
    result = cli("limit", db_url, "mail", running)
    assert result.exit_code == 2 and live.queue_limits() == {}


# -- prune ---------------------------------------------------------------------------------------

def test_prune_forgets_what_is_past_retention(db_url, store, auth, transport):
    # The fixture's store runs in 1970 on a manual clock: by the wall clock the command runs
    # on, its delivered task is long past the default retention of 7 days.
    task_id = store.receive(auth, envelope("m-1")).task_id
    claim = store.claim("w-1")
    assert claim is not None
    store.finish(claim, {"ok": True})
    assert store.dispatch(transport).sent == 1
    store.receive(auth, envelope("m-2"))  # still pending: kept
    assert shown(cli("prune", db_url)) == {"pruned": 1}
    assert [task.message_id for task in store.list_tasks().items] == ["m-2"]
    with pytest.raises(postroom.NotFound):
        store.task(task_id)


# -- every command -------------------------------------------------------------------------------

def commands(group: click.Group, prefix: str = "postroom") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        yield f"{prefix} {name}", command
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")


@pytest.mark.parametrize("name", [name for name, _ in commands(main)])
def test_every_command_has_help(name):
    result = cli(*name.split()[1:], "--help")
    assert result.exit_code == 0 and "Usage: " in result.stdout


def test_every_command_and_subcommand_is_documented_in_the_readme():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text("utf-8")
    # A subcommand may be named within its group's entry: "endpoint list", not in full.
    missing = [name for name, _ in commands(main)
               if (name if name.count(" ") == 1 else name.removeprefix("postroom "))
               not in readme]
    assert missing == [], f"not in the README: {missing}"


def test_a_refusal_exits_1_from_a_real_process(db_url, live, auth):
    task_id = failed_task(live, auth, "m-1")
    result = children.run(python("-m", "postroom", "cancel", db_url, task_id, "--reason", "x"),
                          timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "it has ended" in result.stderr


@pytest.mark.parametrize("args", [["status", "{url}"], ["list", "{url}", "tasks"],
                                  ["pause", "{url}", "mail", "--reason", "r"]])
def test_a_url_without_a_store_is_refused_and_nothing_is_created(tmp_path, args):
    path = tmp_path / "typo.db"
    result = cli(*(word.format(url=f"sqlite:///{path}") for word in args))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert not path.exists()



def test_a_store_of_an_older_schema_is_not_upgraded_by_an_operators_command(make_url):
    from contextlib import closing

    from postroom.db import Database, dialect_for_url

    url = make_url("old")
    with closing(Database(dialect_for_url(url))) as database:
        database.migrate("store", target=2)
        result = cli("status", url)
        assert result.exit_code == 2 and "postroom init upgrades it" in result.stderr
        assert database.schema_version("store") == 2
