"""Flow control in the randomized audit: paused and limited queues, and re-runs on purpose.

Importing this module registers them into the simulation's shared tables:

- ``SNAPSHOT_TABLES``: paused queues, queue limits and their slots, operators' re-runs;
- ``OPERATIONS``: pause and resume a queue, set, change or lift a limit, re-run one task, and
  re-run in bulk (``retry_many``, a dry run included);
- ``CHECKS``: a re-run's record never changes, and only pruning takes it away.

(Envelopes held until later and priorities come with every received message, see
``World.new_envelope``; the claim holds itself to pauses, limits and a claimer's caps, see
``operations._claim_bounds``.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from postroom.errors import Conflict, NotFound
from postroom.models import Retry, Task, TaskState
from tests.harness.simulation.checks import CHECKS, Transition
from tests.harness.simulation.operations import OPERATIONS, Action, Operation, Step, pick_task
from tests.harness.simulation.world import QUEUES, SNAPSHOT_TABLES, Snapshot, Table, World

__all__ = ["SCHEDULING_CHECKS", "SCHEDULING_OPERATIONS", "SCHEDULING_TABLES"]

#: The states an operator may run a task again from.
RERUNNABLE = ("cancelled", "expired", "failed")

SCHEDULING_TABLES = [
    Table("paused_queues", "snapshot_paused_queues", "queue", "store"),
    Table("queue_limits", "snapshot_queue_limits", "queue", "store"),
    Table("queue_slots", "snapshot_queue_slots", ("queue", "slot"), "store"),
    Table("task_retries", "snapshot_task_retries", ("task_id", "number"), "store"),
]


def plan_pause(world: World) -> Action:
    """Pause a queue (a paused one again: the first record stands)."""
    queue = world.rng.choice(QUEUES)

    def act(step: Step) -> str:
        was = step.before.tables["paused_queues"].get(queue)
        paused = step.world.store.pause_queue(queue, operator="op", reason="simulated pause")
        step.expect(paused == (was is None), f"pause of {queue} (paused: {was is not None}) "
                                             f"returned {paused}")
        now = step.after().tables["paused_queues"].get(queue)
        step.expect(now is not None and (was is None or now == was),
                    f"paused {queue} is recorded as {now}, was {was}")
        return "paused" if paused else "already"

    return act


def plan_resume(world: World) -> Action:
    """Resume a queue, usually a paused one."""
    paused = list(world.last.tables["paused_queues"])
    queue = world.rng.choice(paused if paused and world.rng.random() < 0.8 else QUEUES)

    def act(step: Step) -> str:
        was = queue in step.before.tables["paused_queues"]
        resumed = step.world.store.resume_queue(queue)
        step.expect(resumed == was, f"resume of {queue} (paused: {was}) returned {resumed}")
        step.expect(queue not in step.after().tables["paused_queues"],
                    f"{queue} is still paused after its resume")
        return "resumed" if resumed else "not_paused"

    return act


def plan_set_limit(world: World) -> Action:
    """Limit a queue to 1..3 tasks at once, change its limit, or lift it."""
    queue = world.rng.choice(QUEUES)
    running = world.rng.choice((None, 1, 2, 3))

    def act(step: Step) -> str:
        step.world.store.set_queue_limit(queue, running)
        after = step.after()
        limit = after.tables["queue_limits"].get(queue)
        step.expect((None if limit is None else limit["running"]) == running,
                    f"{queue} is limited to {limit} after setting {running}")
        if running is None:
            return "lifted"
        # The tasks running now take the free slots: the limit counts them from now on.
        runs = {task_id for task_id, row in after.tasks.items()
                if row["queue"] == queue and row["state"] == TaskState.RUNNING}
        seated = {slot["task_id"] for slot in after.tables["queue_slots"].values()
                  if slot["queue"] == queue and slot["task_id"] in runs
                  and after.tasks[slot["task_id"]]["fence"] == slot["fence"]}
        step.expect(len(seated) == min(running, len(runs)),
                    f"{queue} limited to {running} seats {len(seated)} of its {len(runs)} "
                    f"running tasks")
        return "limited"

    return act


def _reruns(snapshot: Snapshot, task_id: str) -> int:
    return sum(1 for key in snapshot.tables["task_retries"] if key[0] == task_id)


def _check_rerun(step: Step, task_id: str, rerun: Retry) -> None:
    """A re-run is the next numbered decision about the task, and makes a new task."""
    after = step.after()
    number = _reruns(step.before, task_id) + 1
    record = after.tables["task_retries"].get((task_id, number))
    step.expect(rerun.number == number and record is not None
                and record["new_task_id"] == rerun.new_task_id,
                f"re-run {rerun.number} of {task_id} (expected {number}) is recorded as "
                f"{record}")
    new = after.tasks.get(rerun.new_task_id)
    step.expect(new is not None and new["retry_of"] == task_id and new["attempts"] == 0
                and rerun.new_task_id not in step.before.tasks,
                f"the re-run of {task_id} made {new}")
    step.world.acked.add(rerun.new_task_id)


def plan_retry(world: World) -> Action | None:
    """Run a task again: a failed, expired or cancelled one, or (refused) another; often
    naming the request (one of a few ids), so that some are the same request sent again."""
    named = [(key[0], row["request_id"]) for key, row in world.last.tables[
        "task_retries"].items() if row["request_id"] is not None]
    if named and world.rng.random() < 0.25:  # a request whose answer was lost, sent again
        task_id, request_id = world.rng.choice(named)
    else:
        task_id = pick_task(world, lambda row: row["state"] in RERUNNABLE, 0.85)
        request_id = world.rng.choice((None, "req-1", "req-2"))
    if task_id is None:
        return None

    def act(step: Step) -> str:
        was = step.before.tasks.get(task_id)
        made = [row for key, row in step.before.tables["task_retries"].items()
                if key[0] == task_id and request_id is not None
                and row["request_id"] == request_id]
        try:
            rerun = step.world.store.retry(task_id, operator="op", reason="simulated re-run",
                                           request_id=request_id)
        except NotFound:
            step.expect(was is None, f"retry of stored task {task_id}: NotFound")
            return "not_found"
        except Conflict:
            step.expect(was is not None and was["state"] not in RERUNNABLE,
                        f"retry of {task_id} ({was and was['state']}) refused")
            return "refused"
        step.expect(was is not None and was["state"] in RERUNNABLE,
                    f"retry of {task_id} ({was and was['state']}) was accepted")
        if made:
            _check_replayed(step, task_id, rerun, made[0])
            return "replayed"
        _check_rerun(step, task_id, rerun)
        return "rerun"

    return act


def _check_replayed(step: Step, task_id: str, rerun: Retry, made: Mapping[str, Any]) -> None:
    """The same request again gets the re-run it made, and nothing is written."""
    step.expect((rerun.number, rerun.new_task_id) == (made["number"], made["new_task_id"]),
                f"request {rerun.request_id} re-running {task_id} again answered "
                f"{rerun.number}/{rerun.new_task_id}, it made {made}")
    after = step.after()
    step.expect(after.tables["task_retries"] == step.before.tables["task_retries"]
                and after.tasks.keys() == step.before.tasks.keys(),
                f"request {rerun.request_id} re-running {task_id} again wrote something")


def plan_retry_many(world: World) -> Action:
    """Run again, in bulk, the tasks of one rerunnable state (of one queue, or any), newest
    first, at most a few; sometimes only listing them (a dry run)."""
    rng = world.rng
    state = rng.choice(RERUNNABLE)
    queue = rng.choice((None, *QUEUES))
    limit = rng.randint(1, 4)
    dry_run = rng.random() < 0.3

    def act(step: Step) -> str:
        matching = {task_id for task_id, row in step.before.tasks.items()
                    if row["state"] == state and queue in (None, row["queue"])}
        answers = step.world.store.retry_many(operator="op", reason="simulated bulk re-run",
                                              state=state, queue=queue, limit=limit,
                                              dry_run=dry_run)
        step.expect(len(answers) == min(limit, len(matching)),
                    f"retry_many of {len(matching)} {state} tasks (limit {limit}) answered "
                    f"{len(answers)}")
        if dry_run:
            listed = {answer.task_id for answer in answers if isinstance(answer, Task)}
            step.expect(listed <= matching and len(listed) == len(answers),
                        f"a dry run listed {listed - matching or answers}")
            step.expect(step.after().tables["task_retries"]
                        == step.before.tables["task_retries"], "a dry run re-ran a task")
            return "listed"
        for answer in answers:
            step.expect(isinstance(answer, Retry) and answer.task_id in matching,
                        f"retry_many answered {answer}")
            assert isinstance(answer, Retry)
            _check_rerun(step, answer.task_id, answer)
        return "rerun" if answers else "none"

    return act


def reruns_never_change(before: Snapshot, after: Snapshot, step: Transition
                        ) -> Iterator[str]:
    """An operator's recorded re-run never changes; only pruning its task takes it away."""
    for key, row in before.tables["task_retries"].items():
        now = after.tables["task_retries"].get(key)
        if now is None and not step.forgets:
            yield f"re-run {key} disappeared"
        elif now is not None and now != row:
            yield f"re-run {key} changed from {row} to {now}"


SCHEDULING_OPERATIONS = [
    Operation(name="pause_queue", weight=2, plan=plan_pause),
    Operation(name="resume_queue", weight=3, plan=plan_resume),
    Operation(name="set_queue_limit", weight=2, plan=plan_set_limit),
    Operation(name="retry", weight=2, plan=plan_retry),
    Operation(name="retry_many", weight=1, plan=plan_retry_many),
]

SCHEDULING_CHECKS = [reruns_never_change]

SNAPSHOT_TABLES.extend(SCHEDULING_TABLES)
OPERATIONS.extend(SCHEDULING_OPERATIONS)
CHECKS.extend(SCHEDULING_CHECKS)
