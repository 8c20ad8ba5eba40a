"""The verification harness's commands, run from a checkout: ``python -m tests.harness``.

- ``random-audit``: the randomized audit (mixed operations with crashes over many seeds, then
  multi-process rounds of tasks and of waits), every invariant checked after every step;
- ``drain URL``: worker and dispatcher processes drain a queue while one of them is SIGKILLed
  at random;
- ``scenarios``: the wait scenario suite, re-run for real and compared with
  ``scenarios.json``.

They share the product CLI's error handling: one line on stderr and exit code 2 when a
command cannot run, exit code 1 when it ran and found something wrong.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from postroom.cli import CommandGroup

__all__ = ["main"]


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """postroom's verification harness (randomized audit, drain, wait scenarios)."""


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
    from tests.harness.drain import run_drain

    report = run_drain(url, receiver_url, echo=lambda line: click.echo(line, err=True),
                       **options)
    click.echo(json.dumps(report.summary(), indent=2, sort_keys=True))
    if report.problems:
        sys.exit(1)


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
    from tests.harness.simulation import random_audit as run

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
    from tests.harness import scenarios as suite

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
