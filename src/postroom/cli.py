"""The ``postroom`` command line."""

from __future__ import annotations

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
BENCH_SCENARIOS = ("claim", "single", "batched", "commit-cost", "signals", "pg-claim", "pg-e2e",
                   "pg-latency")
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
    # The connection pool logs every failed attempt; a command's own error already gives
    # the reason, in one line.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


@main.command()
@click.argument("story", type=click.Choice(["tasks", "waits"]), default="tasks")
def demo(story: str) -> None:
    """Run an end-to-end story on a temporary SQLite database.

    tasks (the default): receive -> claim -> the worker dies -> restart -> lease recovered
    -> the stale worker's commit is rejected -> done -> the first delivery loses its ACK ->
    redelivery with the same reply_id -> sent, exactly one receiver effect.

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
def bench(quick: bool, only: tuple[str, ...], folder: Path | None,
          results: Path | None, pg_url: str) -> None:
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
    words = ["postroom bench", *(["--quick"] if quick else []),
             *(f"--only {name}" for name in only),
             *([f"--pg-url {public_url(pg_url)}"] if pg_url != DEFAULT_PG_URL else []),
             *([f"--results {results}"] if results is not None else [])]
    mode = "quick" if quick else ("partial" if only else "full")
    try:
        outcome = run_bench(sizes=QUICK if quick else FULL, mode=mode,
                            folder=folder if folder is not None else default_folder(),
                            only=only, pg_url=pg_url, command=" ".join(words),
                            progress=lambda line: click.echo(line, err=True))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if results is None and mode == "full":
        results = report.checkout_results()
        if results is None:
            click.echo("not in a postroom checkout: no bench/RESULTS.md to rewrite (--results "
                       "FILE keeps the Markdown report)", err=True)
    if results is not None:
        report.write(outcome, results)
        click.echo(f"wrote {results}", err=True)
    click.echo(json.dumps(outcome, indent=2))


@main.command()
@click.argument("url")
@click.option("--import", "imports", multiple=True, required=True, metavar="MODULE[:NAME]",
              help="Import MODULE and run its App (named app, or NAME); repeatable.")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="Claim from QUEUE (repeatable; default: every queue with a handler).")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Handlers run at once (threads, or tasks on one event loop for async).")
@click.option("--prefetch", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Tasks claimed beyond the free slots (their leases are renewed too).")
@click.option("--lease", type=float, default=None, metavar="SECONDS",
              help="Each claim's lease (default: the store's, 30).")
@click.option("--grace", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="On SIGTERM/SIGINT, how long running handlers get before the rest is "
                   "released.")
@click.option("--poll", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="How long an idle worker waits for a wake-up before it looks anyway.")
@click.option("--no-duties", is_flag=True,
              help="Do not run the background duties (lease rescuer, deadline sweeper, wait "
                   "timer, continuation runner, pruner).")
@click.option("--owner", default=None, metavar="NAME",
              help="The owner its claims are held under (default: host:pid:random).")
def worker(url: str, *, imports: tuple[str, ...], queues: tuple[str, ...], concurrency: int,
           prefetch: int, lease: float | None, grace: float, poll: float, no_duties: bool,
           owner: str | None) -> None:
    """Run the handlers of --import's App on the store at URL until SIGTERM or SIGINT.

    Claims as many tasks as it has free slots in one transaction, wakes on new work,
    renews all of its leases together and group-commits its handlers' outcomes. The first
    SIGTERM or SIGINT stops claiming, gives running handlers --grace seconds and releases
    the rest (never marking unfinished work done), then exits 143 (130); a second one
    exits at once.
    """
    from postroom.runtime.handlers import App
    from postroom.runtime.worker import Worker, WorkerSettings
    from postroom.store import open_store

    settings = WorkerSettings(queues=queues or None, concurrency=concurrency,
                              prefetch=prefetch, lease=lease, grace=grace, poll=poll,
                              duties=not no_duties, owner=owner)
    app = App.load(*imports)
    with open_store(url) as store:
        running = Worker(store, app, settings)
        _serve_until_signalled(running.run, running.stop,
                               stopping=f"running handlers have {grace:g}s to end")


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
