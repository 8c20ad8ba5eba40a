"""The ``postroom`` command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from bench.runner import SCENARIOS
from bench.scenarios.postgres import DEFAULT_URL as DEFAULT_PG_URL
from postroom.audit import audit_url
from postroom.errors import InvalidInput

__all__ = ["main"]


class _CannotRun(click.ClickException):
    exit_code = 2


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class _Group(click.Group):
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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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
    from postroom.settings import Settings, check_retention
    from postroom.store import redacted_url
    from postroom.store.core import open_store

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
    from postroom.store.core import inspect_store

    click.echo(json.dumps(inspect_store(url), indent=2, sort_keys=True))


@main.command()
@click.argument("urls", nargs=-1, required=True)
def audit(urls: tuple[str, ...]) -> None:
    """Check the SPEC §8 invariants of each database (store and/or receiver).

    Exits 1 and names every violation found; prints "clean" otherwise.
    """
    from postroom.store import redacted_url

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
@click.argument("url")
@click.option("--receiver", "receiver_url", default=None, metavar="URL",
              help="The receiver's database (default: the store's).")
@click.option("--tasks", default=10_000, show_default=True, type=click.IntRange(1, 10_000_000),
              help="Tasks to drain.")
@click.option("--workers", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Worker processes.")
@click.option("--dispatchers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Dispatcher processes.")
@click.option("--kill-every", default=0.5, show_default=True,
              help="Mean seconds between SIGKILLs of a random process (0: none).")
@click.option("--lease", default=2.0, show_default=True, help="Lease seconds (tasks, replies).")
@click.option("--seed", default=0, show_default=True, help="Seed of the kill schedule.")
@click.option("--timeout", default=900.0, show_default=True, help="Give up after seconds.")
def drain(url: str, receiver_url: str | None, **options: Any) -> None:
    """Drain a queue with worker processes that are SIGKILLed at random.

    URL must hold an empty store (SQLite or PostgreSQL). Every process has its own
    connections, as separate hosts would. Exits 1 unless every task ends terminal, every
    reply is sent, the receiver has exactly one effect per task and the audit is clean.
    """
    from postroom.drain import run_drain

    report = run_drain(url, receiver_url, echo=lambda line: click.echo(line, err=True),
                       **options)
    click.echo(json.dumps(report.summary(), indent=2, sort_keys=True))
    if report.problems:
        sys.exit(1)


@main.command()
@click.option("--quick", is_flag=True,
              help="Small sizes, well under a minute: a smoke run, not figures to publish.")
@click.option("--only", multiple=True, type=click.Choice(list(SCENARIOS)),
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
    from bench import report
    from bench.context import FULL, QUICK
    from bench.runner import default_folder, run_bench
    from bench.scenarios.postgres import public_url

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


@main.command("random-audit")
@click.option("--seeds", default=50, show_default=True, type=click.IntRange(min=0),
              help="Seeds to run; each is a fresh store and receiver.")
@click.option("--ops", default=500, show_default=True, type=click.IntRange(min=1),
              help="Operations per seed, each followed by every check.")
@click.option("--rounds", default=40, show_default=True, type=click.IntRange(min=0),
              help="Multi-process rounds on one shared store.")
@click.option("--processes", default=8, show_default=True, type=click.IntRange(1, 64),
              help="Processes per round, released together; some are SIGKILLed.")
@click.option("--wait-rounds", default=40, show_default=True, type=click.IntRange(min=0),
              help="Multi-process wait rounds: contested registrations, signals, deadlines "
                   "and resumes, exactly one winner each.")
@click.option("--wait-processes", default=12, show_default=True, type=click.IntRange(1, 64),
              help="Processes per wait round, released together; some are SIGKILLed.")
@click.option("--first-seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seeds run from this one upwards (to reproduce a reported seed).")
@click.option("--folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the databases here for inspection (default: a temporary folder).")
def random_audit(*, seeds: int, ops: int, rounds: int, processes: int, wait_rounds: int,
                 wait_processes: int, first_seed: int, folder: Path | None) -> None:
    """Run mixed random operations with crashes over many seeds, then multi-process rounds
    of tasks, then multi-process rounds of waits.

    The SPEC §8 invariants and the cross-step checks run after every operation and round.
    Prints a JSON summary; exits 1 if anything was violated, naming the seed, step and
    operation (or the round).
    """
    from postroom.simulation import random_audit as run

    if folder is not None and folder.is_dir() and any(folder.iterdir()):
        # An earlier run's databases would meet this run's operations and fail it for
        # reasons of their own.
        raise click.BadParameter("must be a new or empty folder", param_hint="'--folder'")
    with click.progressbar(length=seeds * ops + rounds + wait_rounds, label="random audit",
                           file=sys.stderr) as bar:
        summary = run(seeds=seeds, ops=ops, rounds=rounds, processes=processes,
                      wait_rounds=wait_rounds, wait_processes=wait_processes,
                      first_seed=first_seed, folder=folder, progress=bar.update)
    report = summary.to_dict()
    click.echo(json.dumps(report, indent=2))
    if report["violations"]:
        sys.exit(1)


@main.command()
@click.option("--check", "check_", is_flag=True,
              help="Compare every step with its expectation; exit 1 on any difference.")
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Run another scenario file instead of the packaged scenarios.json.")
def scenarios(check_: bool, path: Path | None) -> None:
    """Run the wait scenario suite for real: databases, subprocesses, crashes.

    Every case runs on a new database with the audit after every step. Without --check,
    prints what each step did (JSON); with --check, compares it with the frozen
    expectations and checks that every wait fault point has a crash case.
    """
    from postroom import scenarios as suite

    document = suite.load(path)
    name = path.name if path is not None else "scenarios.json"

    def progress(outcome: suite.Outcome) -> None:
        if check_:
            status = "ok  " if not outcome.mismatches else "FAIL"
            click.echo(f"{status} {outcome.group}/{outcome.case} ({len(outcome.reports)} steps)")

    outcomes = suite.run(document, progress=progress)
    if not check_:
        click.echo(json.dumps([{"group": o.group, "case": o.case, "reports": o.reports}
                               for o in outcomes], indent=1, ensure_ascii=False))
        return
    problems = suite.check(document, outcomes)
    for problem in problems:
        click.echo(f"  {problem}")
    groups = len(document["groups"])
    steps = sum(len(o.reports) for o in outcomes)
    if problems:
        click.echo(f"FAIL: {len(problems)} differences from {name}")
        sys.exit(1)
    click.echo(f"PASS: {groups} scenario groups ({len(outcomes)} cases, {steps} steps) "
               f"match {name}")
