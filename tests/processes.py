"""Real subprocesses for crash and concurrency tests.

A *child* is a fresh Python interpreter running ``main()`` below. It opens its own store and
receiver from URLs (its own connections, never the parent's) with a ``ManualClock``, prints
READY, and then runs one *step* per line it reads on stdin, answering with one line on stdout.
Between steps it keeps what a real process would keep (its claim), so one child can play a
worker over many rounds without paying an interpreter start-up per round.

The protocol is JSON lines::

    child  -> parent   {"ready": <pid>}                       store opened, waiting for GO
    parent -> child    {"step": "claim", "args": {...}, "now": 1000031.0}     (GO)
    child  -> parent   {"value": ...}  or  {"error": "Fenced", "message": "..."}
    parent closes stdin                                        the child exits 0

Every answer also means "ready for the next GO". A crash armed with the ``arm`` step ends the
child with ``os._exit(code)`` instead of an answer; ``Child.exit_code()`` reports it.

``release(children, step)`` is the GO barrier: it writes the step to every child back to back
(each is blocked reading stdin) and only then collects the answers, so the children act at the
same moment; ``release_each`` gives each child a step of its own. More steps can be registered
with ``@step`` in a module the child imports (``Child(..., modules=["tests.waits.steps"])``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import postroom
from postroom import faults
from tests.support import SETTINGS, START, envelope

#: Seconds the parent waits for a child's line or exit before failing the test.
TIMEOUT = 60.0

_ROOT = Path(__file__).resolve().parents[1]


# -- the parent's side ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """What a child said about one step: its value, or the error it raised."""

    value: Any = None
    error: str | None = None  # the exception's class name, e.g. "Fenced"
    message: str = ""

    def unwrap(self) -> Any:
        """The value; raises ``ChildError`` if the step raised."""
        if self.error is not None:
            raise ChildError(f"step raised {self.error}: {self.message}")
        return self.value


class ChildError(AssertionError):
    """A child misbehaved: a step raised, it died, or it stopped answering."""


class Child:
    """One subprocess: start it, send it steps, read its answers, see how it ended."""

    def __init__(self, *, name: str = "child", store: str | None = None,
                 receiver: str | None = None, now: float = START,
                 modules: Sequence[str] = ()) -> None:
        self.name = name
        config = {"name": name, "store": store, "receiver": receiver, "now": now,
                  "modules": list(modules)}
        # Lives as long as the child (stop() closes it), so no with-block.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-W", "error", "-c", "from tests.processes import main; main()",
             json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=_ROOT,
            text=True, encoding="utf-8")
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _line(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise ChildError(f"{self.name} said nothing for {TIMEOUT} s{self._tail()}") from None
        if line is None:
            raise ChildError(f"{self.name} ended (exit code {self._process.wait(TIMEOUT)}) "
                             f"without answering{self._tail()}")
        document: dict[str, Any] = json.loads(line)
        return document

    def ready(self) -> None:
        """Wait until the child has opened its databases."""
        if "ready" not in self._line():
            raise ChildError(f"{self.name} did not start with READY{self._tail()}")

    def go(self, step: str, /, *, now: float | None = None, **args: Any) -> None:
        """Tell the child to run ``step`` (at time ``now``, if given) without waiting."""
        assert self._process.stdin is not None
        line = json.dumps({"step": step, "args": args, "now": now})
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()

    def answer(self) -> Answer:
        """The answer to the step sent last."""
        line = self._line()
        return Answer(value=line.get("value"), error=line.get("error"),
                      message=line.get("message", ""))

    def call(self, step: str, /, *, now: float | None = None, **args: Any) -> Any:
        """Run ``step`` and return its value; ``ChildError`` if it raised."""
        self.go(step, now=now, **args)
        return self.answer().unwrap()

    def exit_code(self) -> int:
        """Close stdin (no more steps) and return the exit code once the child is gone."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            return self._process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ChildError(f"{self.name} did not exit{self._tail()}") from None

    def unanswered(self) -> list[str]:
        """Lines the child printed that no ``answer()`` has read (after it exited)."""
        lines = []
        while (line := self._lines.get(timeout=TIMEOUT)) is not None:
            lines.append(line.strip())
        return lines

    def stderr(self) -> str:
        """Everything the child wrote to stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read()

    def _tail(self) -> str:
        text = self.stderr().strip()
        return f"\n--- {self.name} stderr ---\n{text[-3000:]}" if text else ""

    def stop(self) -> None:
        """End the child (if it still runs) and release its pipes."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait(TIMEOUT)
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                pipe.close()
        self._reader.join(TIMEOUT)
        self._stderr.close()


@contextmanager
def spawn(count: int, *, name: str = "child", **options: Any) -> Iterator[list[Child]]:
    """Start ``count`` children named ``<name>-0 ...`` and wait until every one is READY."""
    with ExitStack() as stack:
        children = []
        for index in range(count):
            child = Child(name=f"{name}-{index}", **options)
            stack.callback(child.stop)
            children.append(child)
        for child in children:
            child.ready()
        yield children


def release(children: Sequence[Child], step: str, /, *, now: float | None = None,
            **args: Any) -> list[Answer]:
    """GO: send ``step`` to every child back to back, then collect every answer, in order."""
    return release_each([(child, step, args) for child in children], now=now)


def release_each(orders: Sequence[tuple[Child, str, Mapping[str, Any]]], *,
                 now: float | None = None) -> list[Answer]:
    """GO with a step and arguments of its own for each child; answers in order."""
    for child, step, args in orders:
        child.go(step, now=now, **args)
    return [child.answer() for child, _, _ in orders]


# -- the child's side -------------------------------------------------------------------------


class Context:
    """What a child holds between steps: its databases, its clock and its latest claims."""

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.clock = postroom.ManualClock(now)
        self.auth = postroom.AuthContext(principal="planner")
        self.store: postroom.Store | None = None
        self.receiver: postroom.Receiver | None = None
        self.claim: postroom.Claim | None = None

    def open(self, store: str | None, receiver: str | None) -> None:
        """Open the store and the receiver at these URLs (each only if given)."""
        if store is not None:
            if self.store is not None:
                self.store.close()
            self.store = postroom.open_store(store, clock=self.clock, settings=SETTINGS, seed=0)
        if receiver is not None:
            if self.receiver is not None:
                self.receiver.close()
            self.receiver = postroom.Receiver.open(receiver, clock=self.clock)

    @property
    def held(self) -> postroom.Claim:
        """The claim this process holds (its latest)."""
        if self.claim is None:
            raise LookupError(f"{self.name} holds no claim")
        return self.claim

    def transport(self) -> postroom.InProcessTransport:
        """A transport to this process's own connection to the receiver."""
        if self.receiver is None:
            raise LookupError(f"{self.name} has no receiver open")
        return postroom.InProcessTransport(self.receiver)

    def close(self) -> None:
        """Close what is open."""
        for opened in (self.store, self.receiver):
            if opened is not None:
                opened.close()


Step = Callable[..., Any]
STEPS: dict[str, Step] = {}


def step(name: str) -> Callable[[Step], Step]:
    """Register a step under ``name``: called as ``fn(context, **args)`` in the child."""

    def register(fn: Step) -> Step:
        STEPS[name] = fn
        return fn

    return register


def _store(ctx: Context) -> postroom.Store:
    if ctx.store is None:
        raise LookupError(f"{ctx.name} has no store open")
    return ctx.store


@step("arm")
def _arm(ctx: Context, point: str, code: int) -> None:
    faults.arm(point, faults.crash(code))


@step("open")
def _open(ctx: Context, store: str | None = None, receiver: str | None = None) -> None:
    ctx.open(store, receiver)


@step("receive")
def _receive(ctx: Context, message_id: str, **fields: Any) -> postroom.Ack:
    return _store(ctx).receive(ctx.auth, envelope(message_id, **fields))


@step("receive_each")
def _receive_each(ctx: Context, message_ids: list[str], **fields: Any) -> list[dict[str, Any]]:
    """Receive each message in a transaction of its own; each one's ACK or error."""
    answers: list[dict[str, Any]] = []
    for message_id in message_ids:
        try:
            ack = _store(ctx).receive(ctx.auth, envelope(message_id, **fields))
            answers.append({"message_id": message_id, "duplicate": ack.duplicate})
        except postroom.PostroomError as exc:
            answers.append({"message_id": message_id, "error": f"{type(exc).__name__}: {exc}"})
    return answers


@step("receive_at")
def _receive_at(ctx: Context, message_id: str, stream: str, seq: int) -> postroom.Ack:
    return _store(ctx).receive(ctx.auth, envelope(message_id),
                               position=postroom.Position(stream=stream, seq=seq))


@step("receive_atomic")
def _receive_atomic(ctx: Context, message_ids: list[str]) -> list[postroom.Ack]:
    return _store(ctx).receive_atomic(ctx.auth, [envelope(m) for m in message_ids])


@step("claim")
def _claim(ctx: Context, owner: str | None = None) -> postroom.Claim | None:
    ctx.claim = _store(ctx).claim(owner or ctx.name)
    return ctx.claim


@step("renew")
def _renew(ctx: Context) -> postroom.Claim:
    ctx.claim = _store(ctx).renew(ctx.held)
    return ctx.claim


@step("finish")
def _finish(ctx: Context, result: Any = None) -> None:
    _store(ctx).finish(ctx.held, result)


@step("fail")
def _fail(ctx: Context, reason: str, retryable: bool = True) -> postroom.TaskState:
    return _store(ctx).fail(ctx.held, reason, retryable=retryable)


@step("release")
def _release(ctx: Context, delay: float = 0.0) -> None:
    _store(ctx).release(ctx.held, delay=delay)


@step("cancel")
def _cancel(ctx: Context, task_id: str) -> bool:
    return _store(ctx).cancel(task_id)


@step("sweep")
def _sweep(ctx: Context) -> postroom.Swept:
    return _store(ctx).sweep()


@step("dispatch")
def _dispatch(ctx: Context, owner: str | None = None, limit: int = 1) -> postroom.DispatchReport:
    return _store(ctx).dispatch(ctx.transport(), owner=owner or ctx.name, limit=limit)


@step("dispatch_all")
def _dispatch_all(ctx: Context, limit: int = 1) -> int:
    """Dispatch until nothing is due; how many replies this process sent."""
    sent = 0
    while (report := _dispatch(ctx, limit=limit)).claimed:
        sent += report.sent
    return sent


@step("requeue")
def _requeue(ctx: Context, reply_id: str, operator: str, reason: str) -> None:
    _store(ctx).requeue_reply(reply_id, operator=operator, reason=reason)


@step("prune")
def _prune(ctx: Context) -> int:
    return _store(ctx).prune()


@step("publish_retention")
def _publish_retention(ctx: Context, seconds: float) -> float | None:
    return _store(ctx).publish_retention(seconds)


def _plain(value: Any) -> Any:
    """A step's value as JSON data (records become dicts, enums their values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def main() -> None:
    """The child's loop: open, READY, then one answer per GO until stdin closes."""
    config = json.loads(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print must not break the protocol
    for module in config["modules"]:
        __import__(module)
    ctx = Context(config["name"], config["now"])
    ctx.open(config["store"], config["receiver"])

    def say(document: dict[str, Any]) -> None:
        out.write(json.dumps(document) + "\n")
        out.flush()  # before any crash the next step may cause

    say({"ready": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        if command["now"] is not None:
            ctx.clock.set(command["now"])
        try:
            value = STEPS[command["step"]](ctx, **command["args"])
        except Exception as exc:
            traceback.print_exc()
            say({"error": type(exc).__name__, "message": str(exc)})
        else:
            say({"value": _plain(value)})
    ctx.close()
