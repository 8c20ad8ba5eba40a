"""oban-py (PostgreSQL, server defaults; Python >= 3.12): ``WORKERS`` processes, each one
Oban instance running the ``bench`` queue with a limit of 10 jobs at once."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any
from urllib.parse import unquote

from oban import Oban, worker  # type: ignore[import-not-found,unused-ignore]
from psycopg_pool import AsyncConnectionPool

QUEUE = "bench"
LIMIT = 10


@worker(queue=QUEUE)  # type: ignore[untyped-decorator,unused-ignore]
class Trivial:
    """Nothing: the job is done."""

    async def process(self, job: Any) -> None:
        """Return at once."""


def _schema(url: str) -> str:
    """The schema the bench's URL puts first on ``search_path`` (oban's ``prefix``)."""
    options = unquote(url).partition("search_path=")[2]
    return options.split("&")[0].split(",")[0] or "public"


async def _main(command: str, url: str, number: int) -> None:
    prefix = _schema(url)
    async with AsyncConnectionPool(url, min_size=1, max_size=LIMIT + 2, open=False) as pool:
        if command == "schema":
            from oban.schema import install  # type: ignore[import-not-found,unused-ignore]

            await install(pool, prefix=prefix)
        elif command == "enqueue":
            async with Oban(pool=pool, prefix=prefix):
                start = time.perf_counter()
                for n in range(number):
                    await Trivial.enqueue({"n": n})  # type: ignore[attr-defined]
                print(json.dumps({"seconds": time.perf_counter() - start}))
        else:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            async with Oban(pool=pool, prefix=prefix, queues={QUEUE: LIMIT}):
                await stop.wait()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
