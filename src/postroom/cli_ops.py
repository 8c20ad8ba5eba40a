"""The operators' commands of ``postroom``: read what a store holds (``status``, ``list``,
``inspect``) and record operators' decisions (``cancel``, ``signal``, ``requeue-dead``,
``retry``, ``pause``, ``resume``, ``limit``, ``prune``).

Every one takes the store's URL as its first argument, as ``init``, ``info``, ``worker`` and
``dispatch`` do. The reading ones print tables for people and one JSON document with
``--json``; the writing ones print one JSON line of what they recorded. Exit codes: 0 done;
1 the store refused the decision for the record's state (a task already ended or not
re-runnable, a reply not dead, a queue already paused, a signal not accepted); 2 it cannot
run (bad input, no such task or reply, the store unreachable: ``cli.CommandGroup``).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from postroom import models
from postroom.chains import cancel_answer
from postroom.errors import Conflict, Fenced

if TYPE_CHECKING:
    from postroom.models import Chain, Page, Reply, Retry, Task, Wait
    from postroom.store import Store

__all__ = ["COMMANDS"]


# -- shared options and helpers ------------------------------------------------------------------

def _default_operator() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment or the password database
        return "operator"


_OPERATOR = click.option(
    "--operator", default=_default_operator, show_default="the OS user", metavar="NAME",
    help="Who decides: recorded with the decision.")
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document.")


def _reason(what: str) -> Callable[[Any], Any]:
    return click.option("--reason", required=True, metavar="TEXT",
                        help=f"Why {what}: recorded with the decision.")


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A ``TIME`` option: seconds since the epoch (1767225600), ISO 8601 (2026-01-01T00:00,
    UTC unless it names an offset) or a duration ago (90s, 15m, 2h, 7d)."""
    return _parse_moment(value, ahead=False)


def _moment_ahead(ctx: click.Context, param: click.Parameter,
                  value: str | None) -> float | None:
    """``_moment`` for a time that is usually to come (a deadline): a duration is from now."""
    return _parse_moment(value, ahead=True)


def _parse_moment(value: str | None, *, ahead: bool) -> float | None:
    if value is None:
        return None
    text = value.strip()
    if (span := _AGO.fullmatch(text)) is not None:
        seconds = float(span[1]) * _UNITS[span[2]]
        return time.time() + (seconds if ahead else -seconds)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither seconds since the epoch, ISO 8601 nor "
                                 f"a duration {'from now' if ahead else 'ago'} such as 15m, "
                                 "2h or 7d") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _time_option(name: str, help_text: str, *, ahead: bool = False) -> Callable[[Any], Any]:
    return click.option(name, callback=_moment_ahead if ahead else _moment, default=None,
                        metavar="TIME", help=help_text)


def _plain(value: Any) -> Any:
    """``value`` (records, states, their lists and maps) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name))
                for field in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _echo_json(document: Any, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(_plain(document), indent=indent))


def _when(seconds: float | None) -> str:
    """A time for people: UTC, to the second."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns aligned to their widest cell, a header line first."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[index]) for row in [list(headers), *cells])
              for index in range(len(headers))]
    for row in [list(headers), *cells]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=True)).rstrip())


def _refused(message: str) -> NoReturn:
    """End the command with exit code 1: it ran, and the store refused the decision."""
    click.echo(f"refused: {message}", err=True)
    sys.exit(1)


@contextmanager
def _refusals() -> Iterator[None]:
    """A decision the record's state refuses (``Conflict``, ``Fenced``) exits 1, not 2."""
    try:
        yield
    except (Conflict, Fenced) as exc:
        _refused(str(exc))


def _open(url: str) -> Store:
    """The store at ``url``: an operator's command creates and upgrades none."""
    from postroom.store import open_store

    return open_store(url, create=False)


# -- reading: status, list, inspect --------------------------------------------------------------

@click.command()
@click.argument("url")
@_JSON
def status(url: str, as_json: bool) -> None:
    """Show each queue's work stage by stage, read in one snapshot, never merged: received
    (pending) and processing (running) tasks; the business outcomes (done, failed, cancelled,
    expired, hop_limit: cumulative); the replies' delivery (pending, sending, sent, dead, and
    how many await an endpoint). Then the open waits, dead replies, continuations to resume,
    paused queues (who, when, why) and running limits."""
    with _open(url) as store:
        found = store.status()
        paused = store.paused_queues()
        limits = store.queue_limits()
    if as_json:
        _echo_json({**_plain(found), "paused_queues": paused, "queue_limits": limits})
        return
    rows = []
    for name, queue in sorted(found.queues.items()):
        outcomes = " ".join(f"{state.value}={count}" for state, count in queue.outcomes.items()
                            if count)
        deliveries = " ".join(f"{state.value}={count}"
                              for state, count in queue.deliveries.items() if count)
        age = "-" if queue.oldest_pending_age is None else f"{queue.oldest_pending_age:.0f}s"
        rows.append([name, queue.received, queue.processing, outcomes or "-",
                     deliveries or "-", queue.awaiting_endpoint, age,
                     "paused" if queue.paused else "-", limits.get(name, "-")])
    if rows:
        _table(["queue", "received", "processing", "outcomes", "delivery",
                "awaiting_endpoint", "oldest_pending", "paused", "limit"], rows)
    else:
        click.echo("no queues yet")
    click.echo(f"open waits {found.open_waits}, dead replies {found.dead_replies}, "
               f"continuations to resume {found.continuations_unconsumed}")
    for item in paused:
        click.echo(f"paused {item.queue} by {item.operator} at {_when(item.paused_at)}: "
                   f"{item.reason}")


_KINDS = {"tasks": ("state", "queue", "principal", "since", "until"),
          "waits": ("due_before",), "dead": ()}


@click.command("list")
@click.argument("url")
@click.argument("kind", type=click.Choice(sorted(_KINDS)))
@click.option("--state", default=None, help="tasks: only those in this state.")
@click.option("--queue", default=None, help="tasks: only those of this queue.")
@click.option("--principal", default=None, help="tasks: only those this principal sent.")
@_time_option("--since", "tasks: created after this time (seconds since the epoch, ISO "
                         "8601, or a duration ago: 15m, 2h, 7d).")
@_time_option("--until", "tasks: created before this time.")
@_time_option("--due-before", "waits: only those whose deadline comes before this time "
                              "(a duration is from now: 1h, the waits due within the hour).",
              ahead=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="At most this many.")
@click.option("--cursor", default=None, help="Go on after the page that printed it.")
@_JSON
def list_(url: str, kind: str, as_json: bool, limit: int, cursor: str | None,
          **filters: Any) -> None:
    """List tasks (newest first), open waits (earliest deadline first) or dead replies (the
    longest dead first), a page at a time; the cursor of the next page goes to stderr (and
    into the JSON as next_cursor)."""
    given = {name for name, value in filters.items() if value is not None}
    if stray := sorted(given - set(_KINDS[kind])):
        option = "--" + stray[0].replace("_", "-")
        raise click.UsageError(f"{option} does not filter {kind}")
    # A cursor holds the filters it was made with; a time given as a duration is resolved
    # now, so the next page is asked for with the times this one used.
    times = [item for name in ("since", "until", "due_before") if filters[name] is not None
             for item in ("--" + name.replace("_", "-"), repr(filters[name]))]
    with _open(url) as store:
        if kind == "tasks":
            tasks = store.list_tasks(state=filters["state"], queue=filters["queue"],
                                     principal=filters["principal"],
                                     created_after=filters["since"],
                                     created_before=filters["until"], limit=limit,
                                     cursor=cursor)
            _show_page(kind, tasks, _TASK_COLUMNS, _task_row, as_json=as_json, times=times)
        elif kind == "waits":
            waits = store.list_waits(due_before=filters["due_before"], limit=limit,
                                     cursor=cursor)
            _show_page(kind, waits, _WAIT_COLUMNS, _wait_row, as_json=as_json, times=times)
        else:
            dead = store.list_dead_replies(limit=limit, cursor=cursor)
            _show_page(kind, dead, _REPLY_COLUMNS, _reply_row, as_json=as_json, times=times)


T = TypeVar("T")


def _show_page(kind: str, page: Page[T], columns: Sequence[str],
               row: Callable[[T], Sequence[object]], *, as_json: bool,
               times: Sequence[str]) -> None:
    """A page, and how to ask for the next: its cursor, with the ``times`` this page was
    listed with (a duration resolved to the time it stood for)."""
    more = (None if page.next_cursor is None
            else ["--cursor", page.next_cursor, *times])
    if as_json:
        _echo_json({kind: page.items, "next_cursor": page.next_cursor, "next_args": more})
        return
    _table(columns, [row(item) for item in page.items])
    if more is not None:
        click.echo(f"more: {' '.join(more)}", err=True)


_TASK_COLUMNS = ("task_id", "queue", "state", "attempts", "created", "last_error")
_WAIT_COLUMNS = ("flow", "step", "generation", "deadline", "task_id", "responder")
_REPLY_COLUMNS = ("reply_id", "task_id", "queue", "requester", "attempts", "last_error")


def _task_row(item: Task) -> list[object]:
    return [item.task_id, item.queue, item.state.value, f"{item.attempts}/{item.max_attempts}",
            _when(item.created_at), _short(item.last_error)]


def _wait_row(item: Wait) -> list[object]:
    return [item.flow, item.step, item.generation, _when(item.deadline), item.task_id or "-",
            item.responder or "-"]


def _reply_row(item: Reply) -> list[object]:
    return [item.reply_id, item.task_id, item.queue or "-", item.requester or "-",
            f"{item.attempts}/{item.budget}", _short(item.last_error)]


@click.command()
@click.argument("url")
@click.argument("task_id")
@_JSON
def inspect(url: str, task_id: str, as_json: bool) -> None:
    """Show a task's whole durable story: its identity, its chain (root, parent, hops, the
    budgets and what was spent), each side effect it committed with the approval it used
    (who granted it, when it was consumed), each attempt (owner, fence, start, end, outcome,
    error), its reply and every delivery attempt, the requeues of that reply, the waits it
    opened and the operators' re-runs of it."""
    with _open(url) as store:
        story = store.story(task_id)
        retries = store.retries(task_id)
    if as_json:
        _echo_json({**_plain(story), "retries": retries})
        return
    task = story.task
    click.echo(f"task {task.task_id}  {task.state.value}  queue {task.queue}  "
               f"priority {task.priority}")
    click.echo(f"  from {task.principal} message {task.message_id}  requester "
               f"{task.requester or '-'}  correlation {task.correlation_id or '-'}")
    click.echo(f"  parent {task.parent_task_id or '-'}  hops {task.hops}  retry of "
               f"{task.retry_of or '-'}")
    click.echo(f"  created {_when(task.created_at)}  updated {_when(task.updated_at)}  "
               f"deadline {_when(task.deadline)}  not before {_when(task.not_before)}")
    click.echo(f"  attempts {task.attempts}/{task.max_attempts}  fence {task.fence}  owner "
               f"{task.owner or '-'}  lease until {_when(task.lease_until)}")
    if task.last_error:
        click.echo(f"  last error: {task.last_error}")
    click.echo(f"  payload {json.dumps(task.payload)}")
    if story.chain is not None:
        _chain(task, story.chain)
    for effect in story.side_effects:
        click.echo(f"side effect {effect.number}  {effect.action} on {effect.resource}  data "
                   f"{effect.data_digest[:12]}…  approval {effect.approval_id} (use "
                   f"{effect.use_number})  granted by {effect.granted_by or '-'} at "
                   f"{_when(effect.granted_at)}  consumed {_when(effect.created_at)}")
    _attempts("attempts", story.attempts)
    reply = story.reply
    if reply is None:
        click.echo("reply: none yet (the task has not ended)")
    else:
        click.echo(f"reply {reply.reply_id}  {reply.state.value}  attempts "
                   f"{reply.attempts}/{reply.budget}  fence {reply.fence}  sent "
                   f"{_when(reply.sent_at)}")
        click.echo(f"  body {reply.body}")
        _attempts("deliveries", story.deliveries)
    for requeue in story.requeues:
        click.echo(f"requeued {_when(requeue.requeued_at)} by {requeue.operator}: "
                   f"{requeue.reason} (after {requeue.previous_attempts} attempts, "
                   f"{_short(requeue.previous_error)})")
    for wait in story.waits:
        click.echo(f"wait {wait.flow}/{wait.step} generation {wait.generation}  "
                   f"{wait.state.value}  deadline {_when(wait.deadline)}")
    for retry in retries:
        click.echo(f"re-run {retry.number} {_when(retry.retried_at)} by {retry.operator}: "
                   f"{retry.reason} -> {retry.new_task_id}")


def _chain(task: Task, chain: Chain) -> None:
    root = chain.root_task_id
    click.echo(f"chain {root}{'  (this task is its root)' if root == task.task_id else ''}")
    cost = (f"cost {chain.cost} (no cost budget)" if chain.max_cost is None
            else f"cost {chain.cost}/{chain.max_cost}")
    click.echo(f"  parent {task.parent_task_id or '-'}  hops {task.hops} of max "
               f"{chain.max_hops}  tasks {chain.tasks}/{chain.max_tasks}  {cost}")
    if chain.cancelled_at is not None:
        click.echo(f"  cancelled {_when(chain.cancelled_at)}: {chain.cancel_reason}")


def _attempts(title: str, attempts: Sequence[Any]) -> None:
    if not attempts:
        click.echo(f"{title}: none")
        return
    click.echo(f"{title}:")
    for item in attempts:
        outcome = "running" if item.outcome is None else item.outcome.value
        click.echo(f"  {item.attempt}. fence {item.fence}  {item.owner}  "
                   f"{_when(item.started_at)} -> {_when(item.ended_at)}  {outcome}"
                   f"{'  ' + _short(item.error) if item.error else ''}")


# -- operators' decisions ------------------------------------------------------------------------

@click.command()
@click.argument("url")
@click.argument("task_id")
@_reason("it is cancelled")
@_OPERATOR
def cancel(url: str, task_id: str, reason: str, operator: str) -> None:
    """Cancel a pending or running task (a running one's claim is fenced: its owner's
    outcome is refused) and, for a chain's root, every live task of its chain, even once
    the root itself has ended. Prints whether the task itself was cancelled, and its state
    when it was not (its chain's tasks were). Exits 1 if nothing was left to cancel."""
    with _open(url) as store:
        acted = store.cancel(task_id, reason=f"cancelled by {operator}: {reason}")
        state = store.task(task_id).state
    if not acted:
        _refused(f"task {task_id} is {state.value}: it has ended")
    click.echo(json.dumps({**cancel_answer(task_id, acted, state), "operator": operator}))


@click.command()
@click.argument("url")
@click.argument("flow")
@click.argument("step")
@click.argument("value")
@click.option("--generation", type=int, default=None,
              help="The wait generation answered (default: the current one).")
@click.option("--event-id", default=None, metavar="ID",
              help="The answer's identity: the same again is a replay, never a second "
                   "answer (default: a new one, printed).")
@click.option("--principal", default=_default_operator, show_default="the OS user",
              metavar="NAME", help="Who answers (a wait with a responder adopts only its).")
def signal(  # noqa: PLR0917 - click passes every option as an argument
        url: str, flow: str, step: str, value: str, generation: int | None,
        event_id: str | None, principal: str) -> None:
    """Answer the wait FLOW/STEP with VALUE (JSON: "yes", 42, {"approved": true}).

    Prints the receipt. Exits 1 unless the answer is accepted (or a replay of an accepted
    one): too_late, stale_generation, closed, unknown_wait and conflict say why.
    """
    from postroom.models import AuthContext, SignalResult

    try:
        answer = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="'VALUE'") from None
    with _open(url) as store:
        if generation is None:
            generation = store.wait(flow, step).generation
        receipt = store.signal(AuthContext(principal=principal),
                               event_id if event_id is not None else str(uuid.uuid4()),
                               flow, step, generation, answer)
    _echo_json(receipt, indent=None)
    if SignalResult.ACCEPTED not in (receipt.result, receipt.recorded) or (
            receipt.result is SignalResult.CONFLICT):
        sys.exit(1)


@click.command("requeue-dead")
@click.argument("url")
@click.argument("reply_id")
@_reason("it is sent again")
@_OPERATOR
def requeue_dead(url: str, reply_id: str, reason: str, operator: str) -> None:
    """Send a dead reply again: a decision recorded with who, when and why (`postroom
    inspect` shows it). Reconcile with the receiver first: a receiver that holds the reply
    acknowledges it as a duplicate, with no second effect. Exits 1 if it is not dead."""
    with _open(url) as store, _refusals():
        store.requeue_reply(reply_id, operator=operator, reason=reason)
    click.echo(json.dumps({"reply_id": reply_id, "requeued": True, "operator": operator,
                           "reason": reason}))


@click.command()
@click.argument("url")
@click.argument("task_id", required=False)
@click.option("--queue", default=None, help="Bulk: the tasks of this queue.")
@click.option("--state", type=click.Choice(["failed", "expired", "cancelled"]), default=None,
              help="Bulk: the tasks in this state (default: all three).")
@_time_option("--since", "Bulk: created after this time (seconds since the epoch, ISO "
                         "8601, or a duration ago: 15m, 2h, 7d).")
@_time_option("--until", "Bulk: created before this time.")
@click.option("--limit", type=click.IntRange(1, 1000), default=1000, show_default=True,
              help="Bulk: at most this many, newest first.")
@click.option("--dry-run", is_flag=True, help="Bulk: list what would run again; write nothing.")
@click.option("--request-id", default=None,
              help="Name this decision: the same command run again with the same id (it was "
                   "interrupted, or its answer was lost) re-runs no task a second time.")
@_reason("it runs again")
@_OPERATOR
@_JSON
def retry(  # noqa: PLR0917 - click passes every option as an argument
        url: str, task_id: str | None, queue: str | None, state: str | None,
        since: float | None, until: float | None, limit: int, dry_run: bool,
        request_id: str | None, reason: str, operator: str, as_json: bool) -> None:
    """Run a failed, expired or cancelled task again as a new task linked to it (the old
    one keeps its state and reply); prints the new task's id (with --json, the recorded
    decision). Exits 1 if the task is in another state.

    Without TASK_ID, every task the filters name (at least one of --queue, --state,
    --since, --until), each its own recorded decision; with --dry-run, only listed.
    """
    bulk = {"--queue": queue, "--state": state, "--since": since, "--until": until}
    named = [option for option, given in bulk.items() if given is not None]
    if task_id is not None:
        if named or dry_run:
            raise click.UsageError(f"{(named or ['--dry-run'])[0]} is for a bulk re-run: "
                                   "leave out TASK_ID")
        with _open(url) as store, _refusals():
            decision = store.retry(task_id, operator=operator, reason=reason,
                                   request_id=request_id)
        if as_json:
            _echo_json(decision, indent=None)
        else:
            click.echo(decision.new_task_id)
        return
    if not named:
        raise click.UsageError("name a TASK_ID, or the tasks with --queue, --state, --since "
                               "or --until")
    with _open(url) as store:
        # A dry run lists the tasks (one more than the limit, to tell whether it cut the
        # list short); each is then re-run on its own, for the progress bar.
        found = [item for item in store.retry_many(
            operator=operator, reason=reason, state=state, queue=queue, created_after=since,
            created_before=until, dry_run=True, limit=limit + 1)
            if isinstance(item, models.Task)]
        chosen = found[:limit]
        if len(found) > limit:  # said first: a list cut short must not read as whole
            click.echo(f"--limit {limit} reached: more tasks match (raise --limit, or narrow "
                       "them with --since/--until)", err=True)
        if dry_run:
            if as_json:
                _echo_json({"would_retry": chosen})
            else:
                _table(_TASK_COLUMNS, [_task_row(task) for task in chosen])
                click.echo(f"dry run: {len(chosen)} tasks would run again", err=True)
            return
        made: list[Retry] = []
        try:
            with click.progressbar(chosen, label="re-running", file=sys.stderr) as tasks:
                for task in tasks:
                    made.append(store.retry(task.task_id, operator=operator, reason=reason,
                                            request_id=request_id))
        finally:  # each re-run committed on its own: show those made even if one failed
            if as_json:
                _echo_json({"retried": made})
            else:
                for item in made:
                    click.echo(f"{item.task_id} -> {item.new_task_id}")
            click.echo(f"{len(made)} of {len(chosen)} tasks run again", err=True)


@click.command()
@click.argument("url")
@click.argument("queue")
@_reason("it is paused")
@_OPERATOR
def pause(url: str, queue: str, reason: str, operator: str) -> None:
    """Pause QUEUE for every worker on every host: none of its tasks is claimed until
    `postroom resume` (running ones finish). Exits 1 if it was paused already (the first
    pause's record stands)."""
    with _open(url) as store:
        if not store.pause_queue(queue, operator=operator, reason=reason):
            first = next(item for item in store.paused_queues() if item.queue == queue)
            _refused(f"queue {queue} was paused already, by {first.operator} at "
                     f"{_when(first.paused_at)}: {first.reason}")
    click.echo(json.dumps({"queue": queue, "paused": True, "operator": operator,
                           "reason": reason}))


@click.command()
@click.argument("url")
@click.argument("queue")
def resume(url: str, queue: str) -> None:
    """Resume a paused QUEUE: its workers hear of it and claim again. Exits 1 if it was not
    paused."""
    with _open(url) as store:
        if not store.resume_queue(queue):
            _refused(f"queue {queue} is not paused")
    click.echo(json.dumps({"queue": queue, "paused": False}))


def _running(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    """``limit``'s RUNNING: a number of tasks, or ``none`` for no limit."""
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number of tasks nor none") from None


@click.command()
@click.argument("url")
@click.argument("queue")
@click.argument("running", metavar="N|none", callback=_running)
def limit(url: str, queue: str, running: int | None) -> None:
    """Let at most RUNNING tasks of QUEUE run at once across every host (none: no limit).
    Enforced when tasks are claimed: lowering it stops nothing that runs."""
    with _open(url) as store:
        store.set_queue_limit(queue, running)
    click.echo(json.dumps({"queue": queue, "running_limit": running}))


def _no_length() -> Iterator[int]:
    """Nothing, and no length to tell: click's progress bar over it counts, not fills."""
    yield from ()


@click.command()
@click.argument("url")
def prune(url: str) -> None:
    """Forget what is past the store's published retention period: messages whose task has
    ended and whose reply is sent, with their records, a batch per transaction. A progress
    bar on stderr counts them as it goes (how many there are is not known ahead); prints the
    total."""
    with _open(url) as store, click.progressbar(
            _no_length(), label="pruning", show_pos=True, file=sys.stderr) as bar:
        pruned = store.prune(progress=lambda total: bar.update(total - bar.pos))
    click.echo(json.dumps({"pruned": pruned}))


#: Registered on ``postroom``'s group by ``postroom.cli``.
COMMANDS = (status, list_, inspect, cancel, signal, requeue_dead, retry, pause, resume, limit,
            prune)
