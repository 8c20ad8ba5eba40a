"""procrastinate (PostgreSQL, server defaults): ``WORKERS`` processes of its own worker, each
with its default concurrency (1)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import procrastinate

QUEUE = "bench"


def main(argv: list[str]) -> None:
    """``schema URL 0``, ``enqueue URL N`` or ``work URL 0``."""
    command, url, number = argv[0], argv[1], int(argv[2])
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(queue=QUEUE, name="trivial")
    def trivial(n: int) -> None:
        """Nothing: the job is done."""

    async def enqueue() -> float:
        async with app.open_async():
            start = time.perf_counter()
            for n in range(number):
                await trivial.defer_async(n=n)
            return time.perf_counter() - start

    if command == "schema":
        with app.open():
            app.schema_manager.apply_schema()
    elif command == "enqueue":
        print(json.dumps({"seconds": asyncio.run(enqueue())}))
    else:
        app.run_worker(queues=[QUEUE], install_signal_handlers=True)


if __name__ == "__main__":
    main(sys.argv[1:])
