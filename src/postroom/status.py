"""What a store holds, read in one read-only transaction: ``postroom info`` (settings, schema,
counts, durability).

Nothing here writes; each function takes a reading transaction.
"""

from __future__ import annotations

from typing import Any

from postroom import retention
from postroom.db import Tx
from postroom.settings import Settings

__all__ = ["info"]


def info(tx: Tx, settings: Settings, *, schema_version: int, settings_from: str
         ) -> dict[str, Any]:
    """Settings, schema version, counts, the time high-water and the database settings that
    durability depends on, with a warning for each weak one.

    ``retention_seconds`` is the period the store publishes (``None`` until its first opener
    publishes one); ``earlier_retention_honoured`` the longer period it still keeps, and
    until when, for what it received before a shortening (``None`` if none).
    ``settings_from`` says whose the other settings shown are: they live in the processes
    that open the store, not in the database.
    """
    durability, warnings = tx.durability()
    published = retention.published(tx)
    clock = tx.one("clock_read")
    unconsumed = tx.one("continuations_unconsumed_count")
    honoured = None
    if published is None:
        warnings.append("no retention period is published yet: the store's next opener "
                        "publishes one")
    elif (running := published.floor(tx.now)) is not None and running[0] > published.value:
        honoured = {"seconds": running[0], "until": running[1]}
    return {
        "dialect": tx.backend,
        "schema_version": schema_version,
        "settings_from": settings_from,
        "retention_seconds": None if published is None else published.value,
        "earlier_retention_honoured": honoured,
        "lease_seconds": settings.lease,
        "dispatch_lease_seconds": settings.dispatch_lease,
        "max_hops": settings.max_hops,
        "delivery_budget": settings.delivery_budget,
        "time_high_water": float(clock["high_water"]) if clock is not None else None,
        "tasks": _counts(tx, "task_counts"),
        "replies": _counts(tx, "reply_counts"),
        "waits": _counts(tx, "wait_counts"),
        "continuations_unconsumed": int(unconsumed["n"]) if unconsumed is not None else 0,
        "durability": durability,
        "warnings": warnings,
    }


def _counts(tx: Tx, query: str) -> dict[str, int]:
    return {row["state"]: int(row["n"]) for row in tx.all(query)}
