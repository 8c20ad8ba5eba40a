"""huey (``SqliteHuey``): WAL, ``synchronous=FULL`` (``fsync=True``), its own consumer with
``WORKERS`` worker processes (``worker_type="process"``)."""

from __future__ import annotations

import json
import sys
import time

from huey import SqliteHuey  # type: ignore[import-untyped]
from huey.consumer import Consumer  # type: ignore[import-untyped]

QUEUE = "bench"


def _huey(path: str) -> SqliteHuey:
    # results=False: the trivial task returns nothing, as postroom's bench handler does.
    return SqliteHuey(QUEUE, filename=path, fsync=True, journal_mode="wal", results=False)


def main(argv: list[str]) -> None:
    """``enqueue PATH N`` or ``work PATH WORKERS``."""
    command, path, number = argv[0], argv[1], int(argv[2])
    huey = _huey(path)

    @huey.task()  # type: ignore[untyped-decorator]
    def trivial(n: int) -> None:
        """Nothing: the job is done."""

    if command == "enqueue":
        start = time.perf_counter()
        for n in range(number):
            trivial(n)
        print(json.dumps({"seconds": time.perf_counter() - start}))
    else:
        Consumer(huey, workers=number, worker_type="process", periodic=False).run()


if __name__ == "__main__":
    main(sys.argv[1:])
