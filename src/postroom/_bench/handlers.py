"""The handlers ``postroom worker --import postroom._bench.handlers`` runs in the runtime
scenarios (``scenarios/runtime.py``).

- ``bench``: does nothing, so a task costs only what the runtime and the store do for it;
- ``bench-started``: returns when it started, on the host's monotonic clock (shared by every
  process), so the bench can read from the database how long a task waited to start;
- ``bench-io``: awaits 50 ms, an I/O-bound call, so concurrency is what sets the rate.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from postroom.runtime.handlers import App, Context

__all__ = ["IO_SECONDS", "QUEUES", "app"]

#: How long an I/O-bound task awaits.
IO_SECONDS = 0.05
#: The queue of each kind of task.
QUEUES = {"trivial": "bench", "started": "bench-started", "io": "bench-io"}

app = App()


@app.handler(QUEUES["trivial"])
def trivial(payload: dict[str, Any], ctx: Context) -> None:
    """Nothing: the task is done."""


@app.handler(QUEUES["started"])
def started(payload: dict[str, Any], ctx: Context) -> dict[str, float]:
    """When the handler started (``time.monotonic()``, and ``time.time()`` to compare with
    the store's times)."""
    return {"started": time.monotonic(), "started_wall": time.time()}


@app.handler(QUEUES["io"])
async def io_bound(payload: dict[str, Any], ctx: Context) -> None:
    """Await ``IO_SECONDS``, as a call to a slow service would."""
    await asyncio.sleep(IO_SECONDS)
