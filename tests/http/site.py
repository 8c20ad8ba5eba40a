"""A store with something on every dashboard page, served for real on 127.0.0.1 (the
dashboard and browser tests share it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import postroom
from postroom.http.app import build_app
from tests.conformance.test_status import REFUSED
from tests.http.servers import serve
from tests.support import START, envelope


@dataclass(frozen=True)
class Site:
    """The served store, its base URL, a token per role and the records made."""

    store: postroom.Store
    url: str
    tokens: dict[str, str]  # by principal: ops (operator), planner, other (agents), alice (human)
    done: str  # a task done, its reply delivered
    failed: str  # a task failed for good
    dead: str  # a task whose reply is dead
    waiting: str  # the task that opened alice's wait

    def page(self, path: str) -> str:
        return f"{self.url}/dashboard{path}"


def ask_alice(store: postroom.Store) -> None:
    """A task that finishes asking alice to approve a refund (wait refund-19/approval #1)."""
    store.receive(postroom.AuthContext(principal="planner"), envelope(
        "m-ask", sender="planner", queue="asks"))
    store.finish(store.claim("worker-3", queues="asks"), None, waits=[postroom.OpenWait(
        flow="refund-19", step="approval", deadline=START + 3600, responder="alice",
        approval=postroom.ApprovalRequest(action="refund", resource="customer:19",
                                          data={"amount": 40}, expires_at=START + 7200))])


def populate(store: postroom.Store, transport: postroom.Transport) -> dict[str, str]:
    """One task per story the pages tell; returns their ids by name."""
    planner = postroom.AuthContext(principal="planner")
    ids = {name: store.receive(planner, envelope(name, queue=queue)).task_id
           for name, queue in (("done", "mail"), ("failed", "mail"), ("dead", "billing"),
                               ("waiting", "billing"))}
    store.receive(postroom.AuthContext(principal="other"),
                  envelope("theirs", queue="mail", sender="other"))
    store.finish(store.claim("worker-1", queues="mail"), {"answer": 42})
    store.dispatch(transport)
    store.fail(store.claim("worker-1", queues="mail"), "the model refused", retryable=False)
    store.dispatch(transport)
    store.finish(store.claim("worker-2", queues="billing"), {"charged": True})
    store.dispatch(REFUSED)
    claim = store.claim("worker-2", queues="billing")
    store.finish(claim, None, waits=[postroom.OpenWait(
        flow="refund-17", step="approval", deadline=START + 3600, responder="alice")])
    store.open_wait("refund-18", "approval", 0, START + 1800, responder="bob")
    return ids


@contextlib.contextmanager
def site(store: postroom.Store, transport: postroom.Transport) -> Iterator[Site]:
    tokens = {name: store.add_principal(name, role).token for name, role in (
        ("ops", "operator"), ("planner", "agent"), ("other", "agent"), ("alice", "human"))}
    ids = populate(store, transport)
    with serve(build_app(store)) as url:
        yield Site(store=store, url=url, tokens=tokens, **ids)
