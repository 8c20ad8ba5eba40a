"""The harness's own whole-table reads (``snapshot.sql``), run through ``Tx.execute``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from postroom.db import Tx
from postroom.db.queries import parse_queries

__all__ = ["QUERIES", "rows"]

#: Every query of ``snapshot.sql`` by name.
QUERIES = parse_queries((Path(__file__).with_name("snapshot.sql")).read_text("utf-8"),
                        "snapshot.sql")


def rows(tx: Tx, name: str, **params: Any) -> list[dict[str, Any]]:
    """Every row of the harness query ``name``, as dicts."""
    return [dict(row) for row in tx.execute(QUERIES[name], params).fetchall()]
