"""The ``postroom`` command line."""

from __future__ import annotations

import json
import sys
from typing import Any

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
@click.argument("url")
@click.option("--receiver", "receiver_url", default=None, metavar="URL",
              help="The receiver's database (default: the store's).")
@click.option("--tasks", default=10_000, show_default=True, help="Tasks to drain.")
@click.option("--workers", default=8, show_default=True, help="Worker processes.")
@click.option("--dispatchers", default=2, show_default=True, help="Dispatcher processes.")
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
