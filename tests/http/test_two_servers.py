"""Two ``postroom serve`` processes over one store, as behind a load balancer: they report
the same metrics (derived from the store, not from what each process did) and accept each
other's dashboard sessions (no session state in a process)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx

import postroom
from postroom.http.dashboard import COOKIE
from tests.cli.test_principals_and_serve import free_port
from tests.harness.children import Process, python
from tests.support import envelope


@contextlib.contextmanager
def serving(url: str) -> Iterator[str]:
    """``postroom serve url`` in a subprocess; yields its base URL once it answers."""
    port = free_port()
    with Process(python("-m", "postroom", "serve", url, "--port", str(port),
                        "--log-level", "warning"), name=f"serve-{port}") as served:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=5)
                break
            except httpx.TransportError:
                assert served.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        yield base


def samples(text: str) -> list[str]:
    """The figures read from the store (not each process's own submission counters)."""
    return sorted(line for line in text.splitlines()
                  if line and not line.startswith("#") and "_age_seconds" not in line
                  and not line.startswith("postroom_http_"))


def test_two_serving_processes_report_the_same_metrics_and_share_sessions(db_url):
    with postroom.open_store(db_url) as store:
        token = store.add_principal("ops", "operator").token
        planner = postroom.AuthContext(principal="planner")
        deadline = time.time() + 3600  # the servers keep real time
        store.receive_atomic(planner, [envelope("a", deadline=deadline),
                                       envelope("b", queue="other", deadline=deadline)])
        store.finish(store.claim("w"), {"ok": True})
    with serving(db_url) as first, serving(db_url) as second, httpx.Client() as browser:
        scraped = [httpx.get(f"{base}/metrics", timeout=10).text for base in (first, second)]
        login = browser.post(f"{first}/dashboard/login", data={"token": token})
        session = login.cookies[COOKIE]
        overview = httpx.get(f"{second}/dashboard/", headers={"cookie": f"{COOKIE}={session}"})
    assert samples(scraped[0]) == samples(scraped[1])
    assert 'postroom_tasks_finished_total{queue="default",state="done"} 1.0' in scraped[0]
    assert all("postroom_http_idempotency_duplicates_total 0.0" in text for text in scraped)
    assert overview.status_code == 200 and 'id="stages"' in overview.text
