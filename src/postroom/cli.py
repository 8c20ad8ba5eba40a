"""The ``postroom`` command line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from postroom.audit import audit_url
from postroom.errors import InvalidInput

__all__ = ["main"]

#: ``postroom bench --only`` names, in the order they run, and the default ``--pg-url``.
#: Written here so that ``postroom --help`` imports no benchmark module; a test holds them
#: to ``postroom._bench``'s own.
BENCH_SCENARIOS = ("claim", "receive", "single", "batched", "commit-cost", "signals", "pg-claim",
                   "pg-claim-backlog", "pg-e2e", "pg-latency", "worker", "delivered",
                   "worker-latency", "concurrency",
                   "scheduled", "rss", "pg-workers", "pg-worker-latency", "pg-rss", "steps",
                   "pg-steps", "peers", "pg-peers", "http-submit", "pg-http-submit",
                   "remote-worker", "pg-remote-worker", "profiles", "pg-profiles")
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class _CannotRun(click.ClickException):
    exit_code = 2


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class CommandGroup(click.Group):
    """A postroom error (or a file system one) ends a command with one line on stderr and
    exit code 2.

    (Exit code 1 stays the answer "ran, and found something wrong", e.g. from ``audit``.)
    Ctrl-C exits 130 and SIGTERM 143, both through the commands' own clean-up (child
    processes stopped, temporary schemas and folders removed), which SIGTERM's default
    would skip.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from postroom.errors import PostroomError

        if threading.current_thread() is threading.main_thread():  # where signals are handled
            signal.signal(signal.SIGTERM, _terminated)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(128 + signal.SIGINT)
        except PostroomError as exc:
            raise _CannotRun(f"{type(exc).__name__}: {exc}") from exc
        except BrokenPipeError:
            raise  # click's own handling: the reader went away (| head)
        except OSError as exc:  # a path that cannot be made, read or written
            raise _CannotRun(f"{type(exc).__name__}: {exc}") from exc


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="postroom")
def main() -> None:
    """postroom: durable coordination for multi-agent systems."""
    # (The connection pool's retries reach stderr only through postroom.pool, a level lower
    # than the pool's own: a command's own error already gives the reason, in one line.)


@main.command()
@click.argument("story", type=click.Choice(["tasks", "waits"]), default="tasks")
def demo(story: str) -> None:
    """Run an end-to-end story on a temporary SQLite database.

    tasks (the default), with real `postroom worker` and `postroom dispatch` processes and
    a webhook receiver on 127.0.0.1: receive -> a worker claims -> SIGKILL mid-task ->
    another worker recovers the lease -> the dead worker's stale commit is fenced -> done
    -> the receiver commits the first delivery but its ACK is lost -> redelivery with the
    same reply_id, deduped -> sent, exactly one receiver effect.

    waits: a task asks a human with a deadline -> restart -> timed out, asked again ->
    the answer, its duplicate and a stale one arrive -> the resuming process dies after its
    commit -> the follow-up task runs exactly once.
    """
    if story == "waits":
        from postroom.demo_waits import run_waits_demo

        held = run_waits_demo(click.echo)
    else:
        from postroom.demo import run_demo

        held = run_demo(click.echo)
    if not held:
        sys.exit(1)


@main.command()
@click.argument("url")
@click.option("--retention", type=float, default=None, metavar="SECONDS",
              help="Publish this retention period: inbox identities are kept at least this "
                   "long (a new store publishes 604800, 7 days, unless told otherwise).")
def init(url: str, retention: float | None) -> None:
    """Create or upgrade the store schema at URL, and show the retention period it publishes.

    With --retention, publish a new period (a new store publishes it first-hand). Every
    process prunes by the published period; one whose Settings name another period is refused
    when it opens the store. After a shortening, what the store received until then keeps
    the longer period ("earlier_retention_honoured").
    """
    from postroom.db import redacted_url
    from postroom.settings import Settings, check_retention
    from postroom.store import open_store

    wanted = None if retention is None else check_retention(retention)
    previous: float | None = None
    try:
        store = open_store(url, settings=Settings(retention=wanted))
    except InvalidInput as exc:
        if exc.field != "retention" or wanted is None:
            raise
        store = open_store(url)  # the store publishes another period: change it
        previous = store.publish_retention(wanted)
    with store:
        found = store.info()
        shown: dict[str, object] = {"url": redacted_url(url),
                                    "schema_version": found["schema_version"]}
        if previous is not None:
            shown["previous_retention_seconds"] = previous
        shown["retention_seconds"] = found["retention_seconds"]
        shown["earlier_retention_honoured"] = found["earlier_retention_honoured"]
        click.echo(json.dumps(shown))


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show a store's schema version, counts and time high-water, read-only.

    Also the database settings durability depends on, with a warning for each weak one
    (PostgreSQL with fsync or synchronous_commit off, say), the retention period the store
    publishes, and postroom's default settings: the others an application opens the store
    with are its own.
    Nothing is created, upgraded or written: a store of another schema version is refused.
    """
    from postroom.store import inspect_store

    click.echo(json.dumps(inspect_store(url), indent=2, sort_keys=True))


@main.command()
@click.argument("urls", nargs=-1, required=True)
def audit(urls: tuple[str, ...]) -> None:
    """Check the SPEC §8 invariants of each database (store and/or receiver).

    Exits 1 and names every violation found; prints "clean" otherwise.
    """
    from postroom.db import redacted_url

    failed = False
    for url in urls:
        violations = audit_url(url)
        shown = redacted_url(url)
        if violations:
            failed = True
            for violation in violations:
                click.echo(f"{shown}: {violation}")
        else:
            click.echo(f"{shown}: clean")
    if failed:
        sys.exit(1)


@main.command()
@click.option("--quick", is_flag=True,
              help="Small sizes, well under a minute: a smoke run, not figures to publish.")
@click.option("--only", multiple=True, type=click.Choice(BENCH_SCENARIOS),
              help="Run only this scenario (repeatable); the raw baseline always runs.")
@click.option("--dir", "folder", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Where the temporary databases go (on disk, not tmpfs; "
                                 "default /var/tmp).")
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the Markdown report here (a full run of every scenario, from a "
                   "postroom checkout, rewrites its bench/RESULTS.md unless told otherwise).")
@click.option("--pg-url", default=DEFAULT_PG_URL, show_default=True, metavar="URL",
              envvar="POSTROOM_PG_URL", show_envvar=True,
              help="The PostgreSQL database the pg-* scenarios create (and drop) their "
                   "schemas in; an unreachable server fails the run unless --only leaves "
                   "them out.")
@click.option("--rss-tasks", type=click.IntRange(1, 100_000_000), default=None, metavar="N",
              help="Tasks the long run of the rss and pg-rss scenarios delivers (the issue "
                   "asks for 1,000,000 on SQLite and 100,000 on PostgreSQL; default: 100,000 "
                   "each, 1,000 with --quick).")
@click.option("--peer-tasks", type=click.IntRange(1, 10_000_000), default=None, metavar="N",
              help="Jobs per round of each system in the peers and pg-peers scenarios "
                   "(default 10,000, 100 with --quick).")
@click.option("--before", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="FILE",
              help="An earlier run's JSON report (with the steps scenarios): the Markdown "
                   "report shows its per-step figures beside this run's.")
def bench(quick: bool, only: tuple[str, ...], folder: Path | None,  # noqa: PLR0917
          results: Path | None, pg_url: str, rss_tasks: int | None,
          peer_tasks: int | None, before: Path | None) -> None:
    """Measure postroom against a raw SQLite commit loop and judge the performance bars.

    Prints the report as JSON on stdout (progress goes to stderr). Every figure is also a
    ratio to the raw loop measured in the same run: WAL, synchronous=FULL, one row per
    BEGIN IMMEDIATE transaction, on the same file system. The pg-* scenarios run on the
    PostgreSQL server at --pg-url.
    """
    from postroom._bench import report
    from postroom._bench.context import FULL, QUICK
    from postroom._bench.runner import default_folder, run_bench
    from postroom._bench.scenarios.postgres import public_url

    if results is not None and not results.parent.is_dir():
        # Found out before the minutes of measuring, not after.
        raise click.BadParameter(f"{results.parent} is not a folder", param_hint="'--results'")
    earlier = None
    if before is not None:
        from postroom._bench.scenarios import steps
        try:
            earlier = steps.earlier(json.loads(before.read_text("utf-8")))
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise click.BadParameter(f"{before}: {exc}", param_hint="'--before'") from exc
    words = ["postroom bench", *(["--quick"] if quick else []),
             *(f"--only {name}" for name in only),
             *([f"--pg-url {public_url(pg_url)}"] if pg_url != DEFAULT_PG_URL else []),
             *([f"--results {results}"] if results is not None else []),
             *([f"--rss-tasks {rss_tasks}"] if rss_tasks is not None else []),
             *([f"--peer-tasks {peer_tasks}"] if peer_tasks is not None else []),
             *([f"--before {before}"] if before is not None else [])]
    mode = "quick" if quick else ("partial" if only else "full")
    sizes = QUICK if quick else FULL
    if rss_tasks is not None:
        sizes = dataclasses.replace(sizes, rss_tasks=rss_tasks, pg_rss_tasks=rss_tasks)
    if peer_tasks is not None:
        sizes = dataclasses.replace(sizes, peer_tasks=peer_tasks)
    try:
        outcome = run_bench(sizes=sizes, mode=mode,
                            folder=folder if folder is not None else default_folder(),
                            only=only, pg_url=pg_url, command=" ".join(words),
                            progress=lambda line: click.echo(line, err=True))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if earlier is not None:
        outcome["before"] = earlier
    if results is None and mode == "full":
        results = report.checkout_results()
        if results is None:
            click.echo("not in a postroom checkout: no bench/RESULTS.md to rewrite (--results "
                       "FILE keeps the Markdown report)", err=True)
    if results is not None:
        charts = report.write(outcome, results)
        click.echo(f"wrote {', '.join(str(path) for path in (results, *charts))}", err=True)
    click.echo(json.dumps(outcome, indent=2))


@main.command()
@click.argument("url")
@click.option("--import", "imports", multiple=True, required=True, metavar="MODULE[:NAME]",
              help="Import MODULE and run its App (named app, or NAME); repeatable.")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="Claim from QUEUE (repeatable; default: every queue with a handler).")
@click.option("--concurrency", "concurrencies", multiple=True, metavar="N | QUEUE=N",
              help="Handlers run at once (threads, or tasks on one event loop for async; "
                   "default 16); QUEUE=N caps QUEUE's within that (repeatable).")
@click.option("--timeout", "timeouts", multiple=True, metavar="QUEUE=SECONDS",
              help="QUEUE's execution timeout for a handler that sets none: past it the "
                   "handler is abandoned and its attempt fails as retryable (repeatable).")
@click.option("--prefetch", type=click.IntRange(0, 1024), default=None, metavar="N",
              help="Tasks claimed beyond the free slots (their leases are renewed too); "
                   "default: while handlers end within 5 ms on average, as many as the "
                   "slots run in 5 ms (from the concurrency to 16 times it, at most 1024), "
                   "else none (what was prefetched is then released).")
@click.option("--lease", type=float, default=None, metavar="SECONDS",
              help="Each claim's lease (default: the store's, 30).")
@click.option("--grace", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="On SIGTERM/SIGINT, how long running handlers get before the rest is "
                   "released.")
@click.option("--poll", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="How long an idle worker waits for a wake-up before it looks anyway.")
@click.option("--no-duties", is_flag=True,
              help="Do not run the background duties (lease rescuer, deadline sweeper, wait "
                   "timer, continuation runner, pruner, scheduler).")
@click.option("--owner", default=None, metavar="NAME",
              help="The owner its claims are held under (default: host:pid:random).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info",
              show_default=True, help="What it logs to stderr (a duty's failed round, a "
                                      "handler timed out, started and stopped).")
def worker(url: str, *, imports: tuple[str, ...], queues: tuple[str, ...],
           concurrencies: tuple[str, ...], timeouts: tuple[str, ...], prefetch: int | None,
           lease: float | None, grace: float, poll: float, no_duties: bool,
           owner: str | None, log_level: str) -> None:
    """Run the handlers of --import's App on the store at URL until SIGTERM or SIGINT.

    Claims as many tasks as it has free slots in one transaction (and, while handlers are
    quick, what the slots run in 5 ms more: see --prefetch), wakes on new work,
    renews all of its leases together and group-commits its handlers' outcomes. The first
    SIGTERM or SIGINT stops claiming, releases the prefetched tasks whose handlers have not
    begun, gives running handlers --grace seconds and releases the rest (never marking
    unfinished work done), then exits 143 (130); a second one exits at once.

    URL may instead be a postroom service (http:// or https://), for a host with no access
    to the database: the handlers then run as a worker principal whose token is read from
    POSTROOM_TOKEN, claiming and committing over HTTP (RemoteWorker); a signal stops it the
    same way. --prefetch, --no-duties and --owner are the local worker's only.
    """
    from postroom.runtime.handlers import App

    _log_to_stderr(log_level)
    overall, per_queue = _by_queue(concurrencies, "--concurrency", int)
    _, per_queue_timeouts = _by_queue(timeouts, "--timeout", float, plain=False)
    concurrency = 16 if overall is None else int(overall)  # 0 is refused, never the default
    if url.startswith(("http://", "https://")):
        _remote_worker(url, App.load(*imports), queues=queues, concurrency=concurrency,
                       per_queue=per_queue, timeouts=per_queue_timeouts, lease=lease,
                       poll=poll, grace=grace)
        return

    from postroom.runtime.worker import Worker, WorkerSettings
    from postroom.store import open_store

    settings = WorkerSettings(queues=queues or None, concurrency=concurrency,
                              prefetch=prefetch, lease=lease, grace=grace, poll=poll,
                              duties=not no_duties, owner=owner, queue_concurrency=per_queue,
                              timeouts=per_queue_timeouts)
    app = App.load(*imports)
    with open_store(url) as store:
        running = Worker(store, app, settings)
        _serve_until_signalled(running.run, running.stop,
                               stopping=f"running handlers have {grace:g}s to end")


def _log_to_stderr(level: str) -> None:
    """postroom's log records (and any other library's) at ``level`` and above on stderr;
    httpx's line per request only at debug."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if level != "debug":
        for chatty in ("httpx", "httpcore"):
            logging.getLogger(chatty).setLevel(logging.WARNING)


#: The options of ``postroom worker`` that only a worker on the store itself has.
_LOCAL_ONLY = {"prefetch": "--prefetch", "no_duties": "--no-duties", "owner": "--owner"}


def _remote_worker(url: str, app: Any, *, queues: tuple[str, ...], concurrency: int,
                   per_queue: dict[str, Any], timeouts: dict[str, Any], lease: float | None,
                   poll: float, grace: float) -> None:
    """``postroom worker`` for a service URL: a ``RemoteWorker`` with POSTROOM_TOKEN's
    principal, until a signal."""
    from postroom.client import Client, RemoteWorker

    context = click.get_current_context()
    for name, option in _LOCAL_ONLY.items():
        if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError(f"{option} is the local worker's: a worker of a service "
                                   f"URL has no such setting")
    token = os.environ.get("POSTROOM_TOKEN", "")
    if not token:
        raise click.UsageError("a worker of a service URL needs its principal's token in "
                               "POSTROOM_TOKEN (postroom principal add NAME --role worker)")
    with Client(url, token) as client:
        running = RemoteWorker(client, app, queues=queues or None, concurrency=concurrency,
                               lease=lease if lease is not None else 30.0, poll=poll,
                               grace=grace, queue_concurrency=per_queue, timeouts=timeouts)
        _serve_until_signalled(running.run, running.stop,
                               stopping=f"running handlers have {grace:g}s to end")


def _by_queue(values: tuple[str, ...], option: str, kind: type[int] | type[float], *,
              plain: bool = True) -> tuple[Any, dict[str, Any]]:
    """``QUEUE=VALUE`` options by queue, and the last plain ``VALUE`` (where ``plain``)."""
    overall, by_queue = None, {}
    for value in values:
        queue, equals, number = value.rpartition("=")
        try:
            parsed = kind(number)
        except ValueError:
            parsed = None
        if parsed is None or (equals and not queue) or (not equals and not plain):
            shape = "QUEUE=N or N" if plain else "QUEUE=SECONDS"
            raise click.BadParameter(f"{value!r} is not {shape}", param_hint=option)
        if equals:
            by_queue[queue] = parsed
        else:
            overall = parsed
    return overall, by_queue


def _serve_until_signalled(run: Any, stop: Any, *, stopping: str) -> None:
    """Run ``run()``; the first SIGTERM/SIGINT calls ``stop()`` (then ``run`` returns and the
    command exits 128 + the signal), a second one exits at once. Says so on stderr."""
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if received:
            os._exit(128 + signum)
        received.append(signum)
        name = signal.Signals(signum).name
        sys.stderr.write(f"{name}: stopping ({stopping}); {name} again exits at once\n")
        sys.stderr.flush()
        stop()

    previous = {signum: signal.signal(signum, on_signal)
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        sys.exit(128 + received[0])


# -- delivering replies: endpoints and the dispatcher -------------------------------------------

_STORE_OPTION = click.option(
    "--store", "store_url", required=True, metavar="URL", envvar="POSTROOM_STORE",
    show_envvar=True, help="The store (sqlite:///path.db or postgresql://...).")


def _schedule(text: str) -> str | list[float]:
    """``--schedule``: a preset's name, or delays in seconds separated by commas."""
    from postroom.endpoints import SCHEDULES

    if text in SCHEDULES:
        return text
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a preset ({', '.join(sorted(SCHEDULES))}) "
                                 "nor delays in seconds such as 5,60,600",
                                 param_hint="'--schedule'") from None


def _show_secret(endpoint: Any, what: str) -> None:
    from postroom.db import redacted_url

    click.echo(json.dumps({"principal": endpoint.principal, "url": redacted_url(endpoint.url),
                           "secret": endpoint.secrets[0].secret}))
    click.echo(f"{what}: this is the only time the secret is shown; give it to the "
               "receiver, which verifies every delivery with it", err=True)


@main.group()
def endpoint() -> None:
    """Where each principal's replies are delivered: add, list, rotate, disable, enable and
    remove endpoints. A reply whose requester has no enabled endpoint waits in the outbox
    (its delivery budget kept) until one is added or enabled."""


@endpoint.command("add")
@click.argument("principal")
@click.argument("url")
@_STORE_OPTION
@click.option("--allow-private", is_flag=True,
              help="Let the sender connect to loopback, private and link-local addresses "
                   "(refused otherwise, whatever the URL's host resolves to).")
@click.option("--schedule", "schedule", default="default", show_default=True,
              metavar="NAME|DELAYS",
              help="Retry schedule: default (the store's backoff), standard-webhooks, fast, "
                   "or delays in seconds such as 5,60,600 (the last repeats).")
@click.option("--budget", type=int, default=None, metavar="N",
              help="Delivery attempts per reply, 1..100 (default: the store's).")
@click.option("--concurrency", type=int, default=4, show_default=True, metavar="N",
              help="Deliveries in flight to this endpoint at once.")
def endpoint_add(  # noqa: PLR0917 - click passes every option as an argument
        principal: str, url: str, store_url: str, allow_private: bool, schedule: str,
        budget: int | None, concurrency: int) -> None:
    """Deliver PRINCIPAL's replies to URL, signed with a new secret printed once."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        added = store.add_endpoint(principal, url, allow_private=allow_private,
                                   schedule=_schedule(schedule), budget=budget,
                                   concurrency=concurrency)
    _show_secret(added, "added")


@endpoint.command("list")
@_STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document (secrets left out).")
def endpoint_list(store_url: str, as_json: bool) -> None:
    """Show every endpoint, and how many replies wait for one. Secrets are never shown."""
    import time

    from postroom.db import redacted_url
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        found = store.endpoints()
        waiting = store.awaiting_endpoints()
    now = time.time()
    listed = [item.to_dict(now=now) | {"url": redacted_url(item.url)}
              for item in found.values()]
    if as_json:
        click.echo(json.dumps({"endpoints": listed, "awaiting_endpoint": waiting}, indent=2))
        return
    for item in listed:
        state = "enabled" if item["enabled"] else f"disabled: {item['disabled_reason']}"
        active = sum(secret["active"] for secret in item["secrets"])
        click.echo(f"{item['principal']}  {item['url']}  {state}  schedule {item['schedule']}"
                   f"  budget {item['budget']}  concurrency {item['concurrency']}"
                   f"  secrets {active} active{'  private allowed' * item['allow_private']}")
    for principal, count in sorted(waiting.items()):
        click.echo(f"{principal or '(none)'}: {count} replies wait for an endpoint")
    if not listed and not waiting:
        click.echo("no endpoints")


@endpoint.command("rotate")
@click.argument("principal")
@_STORE_OPTION
@click.option("--expire-old-after", type=float, default=None, metavar="SECONDS",
              help="The older secrets stop signing this long from now (0: at once); "
                   "without it they keep signing too, until a later rotation expires them.")
def endpoint_rotate(principal: str, store_url: str, expire_old_after: float | None) -> None:
    """Add a new signing secret to PRINCIPAL's endpoint, printed once.

    Each delivery is signed with every active secret, so a receiver keeps verifying with
    the old one until it has the new.
    """
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        rotated = store.rotate_endpoint_secret(principal, expire_old_after=expire_old_after)
    _show_secret(rotated, "rotated")


@endpoint.command("disable")
@click.argument("principal")
@_STORE_OPTION
@click.option("--reason", default="disabled by an operator", show_default=True)
def endpoint_disable(principal: str, store_url: str, reason: str) -> None:
    """Stop delivering to PRINCIPAL's endpoint; its replies wait, their budgets kept."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        done = store.disable_endpoint(principal, reason=reason)
    click.echo(json.dumps({"principal": done.principal, "enabled": done.enabled,
                           "disabled_reason": done.disabled_reason}))


@endpoint.command("enable")
@click.argument("principal")
@_STORE_OPTION
def endpoint_enable(principal: str, store_url: str) -> None:
    """Deliver to PRINCIPAL's endpoint again (after a 410, say); what waited goes out now."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        done = store.enable_endpoint(principal)
    click.echo(json.dumps({"principal": done.principal, "enabled": done.enabled}))


@endpoint.command("remove")
@click.argument("principal")
@_STORE_OPTION
def endpoint_remove(principal: str, store_url: str) -> None:
    """Forget PRINCIPAL's endpoint and its secrets; its replies wait for a new one."""
    from postroom.errors import NotFound
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        if not store.remove_endpoint(principal):
            raise NotFound(f"no endpoint for {principal!r}")
    click.echo(json.dumps({"principal": principal, "removed": True}))


# -- periodic schedules -------------------------------------------------------------------------

_OPERATOR_OPTION = click.option(
    "--operator", default=lambda: os.environ.get("USER") or "operator", show_default="$USER",
    metavar="NAME", help="Who makes the change (recorded on the schedule).")


@main.group()
def schedule() -> None:
    """Periodic work: add, list, pause, resume and remove schedules. A schedule enqueues one
    task per period of its cron expression, once across every host running a worker."""


@schedule.command("add")
@click.argument("name")
@_STORE_OPTION
@click.option("--cron", required=True, metavar="EXPR",
              help="minute hour day-of-month month day-of-week, e.g. '*/15 * * * *'.")
@click.option("--queue", default="default", show_default=True, help="The tasks' queue.")
@click.option("--payload", default="{}", show_default=True, metavar="JSON",
              help="The tasks' payload, a JSON object.")
@click.option("--zone", default=None, metavar="IANA",
              help="The zone whose wall clock the expression reads (default: UTC).")
@click.option("--priority", type=int, default=0, show_default=True, help="-10..10.")
@click.option("--max-attempts", type=int, default=3, show_default=True)
@click.option("--ttl", type=float, default=None, metavar="SECONDS",
              help="Each task's deadline after its period's start (default: the next "
                   "period's start).")
@click.option("--missed", type=click.Choice(["once", "skip"]), default="once",
              show_default=True,
              help="After an outage or a pause that let a whole period pass: enqueue the "
                   "latest period once, or skip to the next one.")
@click.option("--replace", is_flag=True, help="Change the definition of an existing schedule.")
@_OPERATOR_OPTION
def schedule_add(  # noqa: PLR0917 - click passes every option as an argument
        name: str, store_url: str, cron: str, queue: str, payload: str, zone: str | None,
        priority: int, max_attempts: int, ttl: float | None, missed: str, replace: bool,
        operator: str) -> None:
    """Enqueue one task per period of --cron under NAME; shows the schedule as JSON.

    Adding it again with the same definition changes nothing; another definition is refused
    unless --replace.
    """
    from postroom.store import open_store

    try:
        document = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="'--payload'") from None
    with open_store(store_url, create=False) as store:
        added = store.add_schedule(name, cron, operator=operator, queue=queue, payload=document,
                                   priority=priority, max_attempts=max_attempts, ttl=ttl,
                                   missed=missed, zone=zone, replace=replace)
    click.echo(json.dumps(added.to_dict()))


@schedule.command("list")
@_STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def schedule_list(store_url: str, as_json: bool) -> None:
    """Show every schedule: its expression, queue, state and next period."""
    from postroom.schedules import period_key
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        found = store.schedules()
    if as_json:
        click.echo(json.dumps({"schedules": [item.to_dict() for item in found]}, indent=2))
        return
    for item in found:
        state = "paused" if item.paused else "active"
        zone = f" ({item.zone})" if item.zone else ""
        click.echo(f"{item.name}  {item.cron!r}{zone}  queue {item.queue}  {state}  missed "
                   f"{item.missed.value}  next {period_key(item.next_at)}")
    if not found:
        click.echo("no schedules")


@schedule.command("pause")
@click.argument("name")
@_STORE_OPTION
@_OPERATOR_OPTION
def schedule_pause(name: str, store_url: str, operator: str) -> None:
    """Enqueue nothing for NAME until it is resumed. Exits 1 if it was paused already."""
    _switch_schedule(name, store_url, operator, paused=True)


@schedule.command("resume")
@click.argument("name")
@_STORE_OPTION
@_OPERATOR_OPTION
def schedule_resume(name: str, store_url: str, operator: str) -> None:
    """Let NAME enqueue again; what its pause let pass is handled by its --missed policy.
    Exits 1 if it was not paused."""
    _switch_schedule(name, store_url, operator, paused=False)


def _switch_schedule(name: str, store_url: str, operator: str, *, paused: bool) -> None:
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        switch = store.pause_schedule if paused else store.resume_schedule
        changed = switch(name, operator=operator)
    if not changed:  # as `postroom pause` and `resume` answer for a queue
        state = "was paused already" if paused else "is not paused"
        click.echo(f"refused: schedule {name} {state}", err=True)
        sys.exit(1)
    click.echo(json.dumps({"name": name, "paused": paused, "changed": changed}))


@schedule.command("remove")
@click.argument("name")
@_STORE_OPTION
def schedule_remove(name: str, store_url: str) -> None:
    """Forget NAME; the tasks it enqueued stay."""
    from postroom.errors import NotFound
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        if not store.remove_schedule(name):
            raise NotFound(f"no schedule {name!r}")
    click.echo(json.dumps({"name": name, "removed": True}))


@main.command()
@click.argument("url")
@click.option("--receiver", "receiver_url", default=None, metavar="URL",
              help="Deliver every reply in this process into this receiver database instead "
                   "of to the requesters' endpoints.")
@click.option("--batch", type=int, default=32, show_default=True, metavar="N",
              help="Replies claimed (and outcomes recorded) per transaction.")
@click.option("--concurrency", type=int, default=16, show_default=True, metavar="N",
              help="Deliveries in flight at once, all endpoints together.")
@click.option("--poll", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="How often to look for work when no wake-up comes.")
@click.option("--owner", default=None, help="The name it claims as (default: host and pid).")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True,
              metavar="SECONDS", help="Bound on connecting to an endpoint.")
@click.option("--timeout", type=float, default=15.0, show_default=True, metavar="SECONDS",
              help="Bound on one whole delivery (a read may not stall longer either).")
@click.option("--lease", type=float, default=None, metavar="SECONDS",
              help="How long a claim holds a reply (default: the store's dispatch lease, "
                   "raised to cover a wait for the endpoint's turn and a delivery).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info",
              show_default=True, help="What it logs to stderr.")
def dispatch(  # noqa: PLR0917 - click passes every option as an argument
        url: str, receiver_url: str | None, batch: int, concurrency: int, poll: float,
        owner: str | None, connect_timeout: float, timeout: float, lease: float | None,
        log_level: str) -> None:
    """Deliver the replies of the store at URL until SIGTERM or Ctrl-C.

    Each reply goes to its requester's endpoint (see `postroom endpoint`), signed; or, with
    --receiver, into that receiver database. It prints one JSON line when it starts and one
    when it stops. On SIGTERM (exit 143) or Ctrl-C (130) it stops claiming, lets the
    deliveries on the wire finish, hands back the replies it had not sent yet and records
    everything; a second signal ends it at once (what it held is recovered when its lease
    ends, and delivered again: the receiver dedupes).
    """
    from postroom.db import redacted_url
    from postroom.receiver import Receiver
    from postroom.runtime.dispatcher import Dispatcher, DispatcherSettings
    from postroom.runtime.transports.webhook import Timeouts
    from postroom.settings import check_lease
    from postroom.store import open_store

    _log_to_stderr(log_level)
    try:
        timeouts = Timeouts(connect=connect_timeout, read=timeout, total=timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--timeout'") from None
    settings = DispatcherSettings(batch=batch, concurrency=concurrency, poll=poll,
                                  timeouts=timeouts,
                                  lease=None if lease is None else check_lease(lease))
    if owner is not None:
        settings = dataclasses.replace(settings, owner=owner)
    with open_store(url) as store:
        receiver = Receiver.open(receiver_url) if receiver_url is not None else None
        try:
            dispatcher = Dispatcher(store, receiver=receiver, settings=settings)
            click.echo(json.dumps({"dispatching": redacted_url(url), "owner": settings.owner,
                                   "to": "receiver" if receiver is not None else "endpoints"}))
            dispatcher.run(handle_signals=True)
        finally:
            if receiver is not None:
                receiver.close()
    report = dispatcher.report
    click.echo(json.dumps({"stopped": dispatcher.exit_code, "sent": report.sent,
                           "retrying": report.retrying, "dead": report.dead,
                           "handed_back": dispatcher.released}))
    if dispatcher.exit_code:
        sys.exit(dispatcher.exit_code)


@main.group()
def principal() -> None:
    """Who may call the HTTP service (`postroom serve`), with which role: add, list, revoke
    principals and rotate their tokens. A token is printed once; only its hash is kept."""


def _show_token(issued: Any, what: str) -> None:
    click.echo(json.dumps({"principal": issued.principal.name,
                           "role": issued.principal.role.value,
                           "queues": list(issued.principal.queues), "token": issued.token}))
    click.echo(f"{what}: this is the only time the token is shown; give it to its holder, "
               "who sends it as 'Authorization: Bearer <token>'", err=True)


@principal.command("add")
@click.argument("name")
@_STORE_OPTION
@click.option("--role", required=True,
              type=click.Choice(["agent", "worker", "human", "operator"]),
              help="agent: submits tasks and reads its own; worker: works the tasks of its "
                   "--queue; human: answers the waits addressed to it; operator: everything.")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="A queue a worker is granted (repeat for more; a worker needs one).")
def principal_add(name: str, store_url: str, role: str, queues: tuple[str, ...]) -> None:
    """Add the principal NAME with a role, and print its first token once."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        issued = store.add_principal(name, role, queues=queues)
    _show_token(issued, "added")


@principal.command("list")
@_STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def principal_list(store_url: str, as_json: bool) -> None:
    """Show every principal, its role and granted queues (never a token)."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        found = store.list_principals()
    if as_json:
        click.echo(json.dumps({"principals": [item.to_dict() for item in found]}, indent=2))
        return
    for item in found:
        queues = f"  queues {','.join(item.queues)}" if item.queues else ""
        click.echo(f"{item.name}  {item.role.value}{queues}"
                   f"{'' if item.active else '  revoked'}")
    if not found:
        click.echo("no principals")


@principal.command("revoke")
@click.argument("name")
@_STORE_OPTION
def principal_revoke(name: str, store_url: str) -> None:
    """Revoke NAME: its tokens stop working at once; the name is never reused."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        revoked = store.revoke_principal(name)
    click.echo(json.dumps({"principal": name, "revoked": True, "already": not revoked}))


@principal.command("rotate")
@click.argument("name")
@_STORE_OPTION
@click.option("--overlap", type=float, default=0.0, show_default=True, metavar="SECONDS",
              help="How long the old token keeps working (0: it stops at once).")
def principal_rotate(name: str, store_url: str, overlap: float) -> None:
    """Make a new token for NAME, printed once; the old one stops after --overlap."""
    from postroom.store import open_store

    with open_store(store_url, create=False) as store:
        issued = store.rotate_token(name, overlap=overlap)
    _show_token(issued, "rotated")


@main.command()
@click.argument("url")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="The port to bind (0: any free one).")
@click.option("--max-body", type=click.IntRange(1, 64 * 1024 * 1024), default=1024 * 1024,
              show_default=True, metavar="BYTES", help="The largest request body accepted.")
@click.option("--timeout", type=click.FloatRange(0.5, 3600), default=30.0, show_default=True,
              metavar="SECONDS", help="Every request is answered within this.")
@click.option("--threads", type=click.IntRange(1, 1024), default=40, show_default=True,
              metavar="N", help="Requests served at once (each holds a thread while it calls "
                                "the store; a claim while it waits for work).")
@click.option("--access-log/--no-access-log", default=False, show_default=True,
              help="Log a line for every request (uvicorn's access log).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info",
              show_default=True, help="What it logs to stderr.")
@click.option("--no-duties", is_flag=True,
              help="Do not run the store's background duties (lease rescuer, deadline "
                   "sweeper, wait timer, pruner, scheduler).")
@click.option("--import", "imports", multiple=True, metavar="MODULE[:NAME]",
              help="Also resume ended waits with the resumers of this App (named app, or "
                   "NAME); repeatable. Its handlers do not run here.")
def serve(  # noqa: PLR0917 - click passes every option as an argument
        url: str, host: str, port: int, max_body: int, timeout: float, threads: int,
        access_log: bool, log_level: str, no_duties: bool, imports: tuple[str, ...]) -> None:
    """Serve the HTTP API (and its OpenAPI document at /openapi.json) for the store at URL
    until SIGTERM or Ctrl-C.

    Callers authenticate with the tokens of `postroom principal add`. Beside it run the
    store's background duties, as on a worker (each is safe on any number of hosts), so
    that a deployment whose workers all reach it over HTTP still times out waits, rescues
    leases, fires schedules and prunes; --no-duties leaves them to workers. With --import,
    the continuation runner resumes ended waits with that App's resumers too.
    """
    from postroom.http.app import Limits
    from postroom.http.app import serve as run
    from postroom.runtime.continuations import ContinuationRunner
    from postroom.runtime.duty import Duties, Duty
    from postroom.runtime.handlers import App
    from postroom.runtime.worker import upkeep_duties
    from postroom.store import open_store

    limits = Limits(max_body=max_body, timeout=timeout, max_poll=min(20.0, timeout / 2),
                    threads=threads)
    _log_to_stderr(log_level)  # beside uvicorn's records, which keep their own handlers
    app = App.load(*imports) if imports else None
    if app is not None and not app.steps:
        raise click.UsageError("--import: that App has no resumer, and the service runs no "
                               "handlers (postroom worker does)")
    if port:
        _refuse_busy(host, port)
    with open_store(url) as store:
        chosen: list[Duty] = [] if no_duties else upkeep_duties(store)
        if app is not None:
            chosen.append(ContinuationRunner(store, app))
        duties = Duties(chosen)
        click.echo(f"duties: {', '.join(duties.names) or 'none'}", err=True)
        duties.start()
        try:
            run(store, host=host, port=port, limits=limits, log_level=log_level,
                access_log=access_log)
        finally:
            duties.stop()


def _refuse_busy(host: str, port: int) -> None:
    """``InvalidInput`` (one line, exit 2) if nothing can listen on ``host:port`` (another
    server holds it, say), before the store is opened: uvicorn would log it and exit 3."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except OSError as exc:
        raise InvalidInput("port", f"cannot listen on {host}:{port}: "
                                   f"{exc.strerror or exc}") from None


# -- the operators' commands: status, list, inspect and their decisions (postroom.cli_ops) ------

def _register_operators() -> None:
    from postroom.cli_ops import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register_operators()
