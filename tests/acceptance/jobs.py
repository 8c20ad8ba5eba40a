"""The handlers the acceptance tests' ``postroom worker`` processes import
(``--import tests.acceptance.jobs``).

``work`` takes a little while (so that a kill lands mid-run) and answers with its input and
the fence it ran under. ``held`` marks that it started (``<folder>/<task_id>.<fence>``) and
works until ``<folder>/go`` exists; told to stop first, it ends unfinished, and says so in
its result, so a task done with ``finished: false`` would be a task wrongly done.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from postroom.runtime import App, Context

app = App()


@app.handler("work")
def work(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    time.sleep(payload.get("seconds", 0.1))
    return {"n": payload["n"], "fence": ctx.fence}


@app.handler("held")
def held(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    folder = Path(payload["folder"])
    (folder / f"{ctx.task_id}.{ctx.fence}").touch()
    while not (folder / "go").exists():
        if ctx.cancellation.wait(0.01):
            return {"finished": False, "fence": ctx.fence}
    return {"finished": True, "fence": ctx.fence}
