"""Submit over HTTP (one client, one keep-alive connection) against in-process ``receive``, one
at a time, on the same backend: ``python -m tests.service.measure_submit [sqlite] [postgres]``.

Rounds alternate (in-process, then HTTP, on fresh databases of their own) so that both see
the same disk and the same neighbours; prints one JSON line per backend with the median
rates and their ratio (the issue's bar: HTTP >= 0.5x in-process). Not a ``postroom bench``
scenario (yet): a measurement from a checkout, on a quiet machine.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

import postroom
from postroom._bench.runner import default_folder
from postroom.http.app import create_app
from tests import pg

TASKS = 300
ROUNDS = 3


def _url(backend: str, folder: Path, name: str, made: list[str]) -> str:
    if backend == "sqlite":
        return f"sqlite:///{folder / name}.db"
    made.append(pg.create_schema(name, pg.ADMIN_URL))
    return made[-1]


def in_process(url: str) -> float:
    """Tasks/s of ``receive``, one at a time."""
    auth = postroom.AuthContext(principal="bench")
    with postroom.open_store(url) as store:
        deadline = time.time() + 86_400
        start = time.perf_counter()
        for n in range(TASKS):
            store.receive(auth, postroom.Envelope(message_id=f"m-{n}", sender="bench",
                                                  payload={"n": n}, deadline=deadline))
        return TASKS / (time.perf_counter() - start)


def over_http(url: str) -> float:
    """Tasks/s of ``POST /v1/tasks`` from one client on one keep-alive connection."""
    with postroom.open_store(url) as store:
        token = store.add_principal("bench", "agent").token
        server = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=0,
                                               log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                              headers={"authorization": f"Bearer {token}"}) as http:
                http.get("/healthz")
                deadline = time.time() + 86_400
                start = time.perf_counter()
                for n in range(TASKS):
                    answer = http.post("/v1/tasks", json={
                        "message_id": f"m-{n}", "payload": {"n": n}, "deadline": deadline})
                    assert answer.status_code == 202, answer.text
                return TASKS / (time.perf_counter() - start)
        finally:
            server.should_exit = True
            thread.join()


def main(backends: list[str]) -> None:
    for backend in backends:
        folder = Path(tempfile.mkdtemp(prefix="measure-submit-", dir=default_folder()))
        made: list[str] = []
        try:
            local, remote = [], []
            for index in range(ROUNDS):
                local.append(in_process(_url(backend, folder, f"local{index}", made)))
                remote.append(over_http(_url(backend, folder, f"http{index}", made)))
        finally:
            shutil.rmtree(folder)
            for url in made:
                pg.drop_schema(url)
        receive, submit = statistics.median(local), statistics.median(remote)
        print(json.dumps({"backend": backend, "tasks_per_round": TASKS, "rounds": ROUNDS,
                          "receive_per_s": round(receive, 1),
                          "http_submit_per_s": round(submit, 1),
                          "ratio": round(submit / receive, 3)}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["sqlite", "postgres"])
