"""The handlers ``postroom demo`` runs in its real worker processes (``postroom worker URL
--import postroom.demo_handlers``).

``reviews`` writes down the claim it runs under (``<folder>/claim-<fence>.json``: what its
worker holds, readable after the worker is gone) and then works until ``<folder>/go`` exists,
so the demo decides when a review ends and can kill its worker in the middle of one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from postroom.runtime import App, Context

__all__ = ["app", "review"]

app = App()


@app.handler("reviews")
def review(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Review ``payload["review"]`` once ``payload["folder"]``/go exists."""
    folder = Path(payload["folder"])
    written = folder / f"claim-{ctx.fence}.json.part"
    written.write_text(json.dumps(dataclasses.asdict(ctx.claim)), "utf-8")
    os.replace(written, folder / f"claim-{ctx.fence}.json")  # never read half-written
    gate = folder / "go"
    while not gate.exists() and not ctx.cancellation.wait(0.01):
        pass
    return {"verdict": "approve", "review": payload["review"], "fence": ctx.fence}
