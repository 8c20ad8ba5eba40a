"""The ``postroom`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from postroom.audit import audit_url

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="postroom")
def main() -> None:
    """postroom: durable coordination for multi-agent systems."""


@main.command()
def demo() -> None:
    """Run the end-to-end story on a temporary SQLite database.

    receive -> claim -> the worker dies -> restart -> lease recovered -> the stale worker's
    commit is rejected -> done -> the first delivery loses its ACK -> redelivery with the
    same reply_id -> sent, exactly one receiver effect.
    """
    from postroom.demo import run_demo

    if not run_demo(click.echo):
        sys.exit(1)


@main.command()
@click.argument("url")
def init(url: str) -> None:
    """Create or upgrade the store schema at URL."""
    from postroom.store.core import open_store

    with open_store(url) as store:
        click.echo(json.dumps({"url": url, "schema_version": store.info()["schema_version"]}))


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show a store's settings (retention included), schema version and counts."""
    from postroom.store.core import open_store

    with open_store(url) as store:
        click.echo(json.dumps(store.info(), indent=2, sort_keys=True))


@main.command()
@click.argument("urls", nargs=-1, required=True)
def audit(urls: tuple[str, ...]) -> None:
    """Check the SPEC §8 invariants of each database (store and/or receiver).

    Exits 1 and names every violation found; prints "clean" otherwise.
    """
    failed = False
    for url in urls:
        violations = audit_url(url)
        if violations:
            failed = True
            for violation in violations:
                click.echo(f"{url}: {violation}")
        else:
            click.echo(f"{url}: clean")
    if failed:
        sys.exit(1)


@main.command()
@click.option("--quick", is_flag=True,
              help="Small sizes, a few seconds: a smoke run, not figures to publish.")
@click.option("--only", multiple=True, type=click.Choice(["claim", "single", "batched"]),
              help="Run only this scenario (repeatable); the raw baseline always runs.")
@click.option("--dir", "folder", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Where the temporary databases go (on disk, not tmpfs; "
                                 "default /var/tmp).")
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the Markdown report here (a full run of every scenario writes "
                   "bench/RESULTS.md unless told otherwise).")
def bench(quick: bool, only: tuple[str, ...], folder: Path | None,
          results: Path | None) -> None:
    """Measure postroom against a raw SQLite commit loop and judge the performance bars.

    Prints the report as JSON on stdout (progress goes to stderr). Every figure is also a
    ratio to the raw loop measured in the same run: WAL, synchronous=FULL, one row per
    BEGIN IMMEDIATE transaction, on the same file system.
    """
    from bench import report
    from bench.context import FULL, QUICK
    from bench.runner import default_folder, run_bench

    words = ["postroom bench", *(["--quick"] if quick else []),
             *(f"--only {name}" for name in only)]
    try:
        outcome = run_bench(sizes=QUICK if quick else FULL, mode="quick" if quick else "full",
                            folder=folder if folder is not None else default_folder(),
                            only=only, command=" ".join(words),
                            progress=lambda line: click.echo(line, err=True))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if results is None and not quick and not only:
        results = report.RESULTS
    if results is not None:
        report.write(outcome, results)
        click.echo(f"wrote {results}", err=True)
    click.echo(json.dumps(outcome, indent=2))
