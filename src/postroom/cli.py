"""The ``postroom`` command line."""

from __future__ import annotations

import json
import sys

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
