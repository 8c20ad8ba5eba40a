"""Helpers for runtime tests: a worker run in a thread of the test, and waiting for a state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import postroom
from postroom.runtime import App
from postroom.runtime.worker import Worker, WorkerSettings

#: Seconds a runtime test waits for something that should happen at once.
PATIENCE = 30.0

FAST = WorkerSettings(poll=0.05, grace=5.0, duties=False)


def far() -> float:
    """A deadline an hour away on the wall clock (runtime tests run on real time)."""
    return time.time() + 3600


def send(store: postroom.Store, message_id: str, payload: dict[str, object] | None = None,
         **fields: object) -> str:
    """Receive one task from ``planner``; its task_id."""
    values: dict[str, object] = {"message_id": message_id, "sender": "planner",
                                 "payload": payload or {}, "deadline": far()}
    values.update(fields)
    envelope = postroom.Envelope(**values)  # type: ignore[arg-type]
    return store.receive(postroom.AuthContext(principal="planner"), envelope).task_id


def eventually(check: Callable[[], bool], *, timeout: float = PATIENCE) -> None:
    """Wait until ``check()`` holds (a runtime test's only way to wait; never a sleep of a
    guessed length)."""
    ends = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < ends, "it did not happen in time"
        time.sleep(0.01)


@contextmanager
def running(store: postroom.Store, app: App, settings: WorkerSettings = FAST, *,
            clock: postroom.Clock | None = None) -> Iterator[Worker]:
    """A worker running in a thread until the block ends (then stopped, and joined);
    ``clock`` measures its execution timeouts."""
    worker = Worker(store, app, settings, clock=clock)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"


def state(store: postroom.Store, task_id: str) -> postroom.TaskState:
    """The task's state now."""
    return store.task(task_id).state
