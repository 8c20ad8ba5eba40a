"""Real processes racing on waits, released together (READY/GO).

A minimal harness until the shared one (``tests/processes.py``) lands: each child is a fresh
interpreter that prints READY, then runs one JSON step per stdin line and answers with one
JSON line. A child lives for many rounds (each round opens its own store on a new database),
so a round costs a few transactions, not eight interpreter start-ups.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import postroom

_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120.0


class Child:
    """One subprocess with its own connection, driven over stdin/stdout."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Lives as long as the child; closed in stop().
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-W", "error", "-c",
             "from tests.concurrency.wait_children import main; main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=_ROOT,
            text=True, encoding="utf-8")

    def send(self, step: str, args: dict[str, Any]) -> None:
        """GO: hand the child one step without waiting for its answer."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"step": step, "args": args}) + "\n")
        self._process.stdin.flush()

    def receive(self) -> Any:
        """The child's next line: READY, or the answer to the step sent last."""
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise AssertionError(f"{self.name} died: {self._stderr.read()[-3000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"{self.name}: {answer['error']}")
        return answer.get("value")

    def stop(self) -> None:
        """Close stdin and wait for the child to exit."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(TIMEOUT)
        finally:
            if self._process.poll() is None:
                self._process.kill()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._stderr.close()


@contextmanager
def spawn(count: int) -> Iterator[list[Child]]:
    """Start ``count`` children and wait until every one has said READY."""
    with ExitStack() as stack:
        children = []
        for index in range(count):
            child = Child(f"child-{index}")
            stack.callback(child.stop)
            children.append(child)
        for child in children:
            if child.receive() != "ready":
                raise AssertionError(f"{child.name} did not say READY")
        yield children


def release(children: Sequence[Child],
            steps: Sequence[tuple[str, dict[str, Any]]]) -> list[Any]:
    """GO: write each child its step back to back (each is blocked reading), then collect."""
    for child, (step, args) in zip(children, steps, strict=True):
        child.send(step, args)
    return [child.receive() for child in children]


# -- the child's side -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def main() -> None:
    """Say READY, then run one step per line until stdin closes."""
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print must not break the protocol
    store: postroom.Store | None = None
    clock = postroom.ManualClock()

    def say(document: dict[str, Any]) -> None:
        out.write(json.dumps(document) + "\n")
        out.flush()

    say({"value": "ready"})
    for line in sys.stdin:
        command = json.loads(line)
        args = command["args"]
        try:
            if command["step"] == "open":
                if store is not None:
                    store.close()
                clock.set(args["now"])
                store = postroom.open_store(args["url"], clock=clock)
                value: Any = "ready"
            else:
                assert store is not None
                value = _run(store, command["step"], args)
        except Exception as exc:
            say({"error": f"{type(exc).__name__}: {exc}"})
        else:
            say({"value": _plain(value)})
    if store is not None:
        store.close()


def _run(store: postroom.Store, step: str, args: dict[str, Any]) -> Any:
    if step == "signal":
        auth = postroom.AuthContext(principal=args.pop("principal"))
        return store.signal(auth, **args)
    if step == "resume":
        effect = args.pop("effect")
        return store.resume(**args, effect=postroom.FollowUp(**effect) if effect else None)
    return getattr(store, step)(**args)
