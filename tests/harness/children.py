"""Child processes for the tests and the harness: one way to start, talk to, signal and reap them.

Two layers:

- ``Process``: any command. Its stdout is read line by line as it comes (``readline``), its
  stderr kept (``stderr()``), its stdin a pipe (``write``); it can be SIGKILLed (``kill``),
  SIGSTOPped (``pause``/``resume``) or sent any signal, and ``wait`` gives its exit code.
- ``Child``: a ``Process`` that is a fresh Python interpreter speaking the *step protocol*. It
  opens its own store and receiver from URLs (its own connections, never the parent's) with a
  ``ManualClock``, says READY, and then runs one step per line it reads, answering each with
  one line. Between steps it keeps what a real process would keep (its claim), so one child
  can play a worker over many rounds without paying an interpreter start-up per round.

Whatever happens, no child outlives its test:

- ``close()`` (or leaving the with-block, or ``spawn``'s) SIGKILLs what still runs and reaps
  it, on every path out, a failing assertion included;
- what is still open when the interpreter exits (``SystemExit``, e.g. from the harness's
  SIGTERM handler) is closed by ``atexit``;
- on Linux a child asks the kernel to SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``,
  set by a small wrapper that then execs the command, so the pid is the command's), so a
  parent killed by SIGKILL or by a SIGTERM it does not handle (pytest's) leaves no orphan.
  The kernel watches the *thread* that started the child: start children from a thread that
  lives as long as they should (the main thread does);
- each child leads a process group of its own: a signal to it reaches what it started, and
  Ctrl-C at a terminal reaches only the parent, which then closes its children.

The step protocol is JSON lines::

    child  -> parent   {"ready": <pid>}                       store opened, waiting for GO
    parent -> child    {"step": "claim", "args": {...}, "now": 1000031.0}     (GO)
    child  -> parent   {"note": ...}                           any number, while the step runs
    child  -> parent   {"value": ...}  or  {"error": "Fenced", "message": "..."}
    parent closes stdin                                        the child exits 0

Every answer also means "ready for the next GO". ``release(children, step)`` is the GO
barrier: it writes the step to every child back to back (each is blocked reading stdin) and
only then collects the answers, so the children act at the same moment; ``release_each`` gives
each child a step of its own. A crash armed with the ``arm`` step ends the child with
``os._exit(code)`` instead of an answer. The store operations are steps of
``tests.harness.steps``; more can be registered with ``@step`` in a module the child imports
(``Child(..., modules=["tests.harness.simulation.burst"])``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import postroom
from postroom import faults
from tests.support import SETTINGS, START

__all__ = ["ENDED", "TIMEOUT", "Answer", "Child", "ChildError", "Context", "Process", "python",
           "release", "release_each", "run", "serve", "spawn", "step"]

#: Seconds the parent waits for a child's line or exit before failing.
TIMEOUT = 60.0
#: The ``error`` of an answer the child never gave: it ended first.
ENDED = "ended"

_ROOT = Path(__file__).resolve().parents[2]
# Run by a bare interpreter before the command, which it becomes: argv is the parent's pid and
# the command. Checking the parent after setting the signal closes the race with its death.
_LIFELINE = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


class ChildError(AssertionError):
    """A child misbehaved: a step raised, it died or hung, or it broke the protocol."""


def python(*args: str) -> list[str]:
    """The command line of this interpreter with ``args`` (e.g. ``"-m", "tests.harness"``)."""
    return [sys.executable, *args]


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    # The checkout on the path: ``tests.*`` imports from any working directory, which stays
    # the parent's (so relative paths mean the same thing to both).
    merged = {**os.environ, **(env or {})}
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), merged.get("PYTHONPATH")]))
    return merged


#: Every process started and not closed yet: what ``atexit`` closes.
_running: set[Process] = set()


@atexit.register
def _close_all() -> None:
    for process in list(_running):
        process.close()


class Process:
    """One child process running ``argv``, owned by this process until ``close()``."""

    def __init__(self, argv: Sequence[str], *, name: str = "process",
                 env: Mapping[str, str] | None = None) -> None:
        if shutil.which(argv[0]) is None:
            raise FileNotFoundError(f"{name}: no command {argv[0]!r}")
        self.name = name
        self.argv = tuple(argv)
        command = list(argv)
        if sys.platform == "linux":
            command = python("-I", "-S", "-c", _LIFELINE, str(os.getpid()), *argv)
        # Lives as long as the process (close() closes it), so no with-block.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        try:
            self._popen = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                env=_environment(env), text=True, encoding="utf-8", start_new_session=True)
        except BaseException:
            self._stderr.close()
            raise
        _running.add(self)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"{name} stdout", daemon=True)
        self._reader.start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid {self.pid}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """Its process id (also its process group's)."""
        return self._popen.pid

    # -- its output -------------------------------------------------------------------------

    def _read(self) -> None:
        assert self._popen.stdout is not None
        for line in self._popen.stdout:
            if self._hear(line):
                self._lines.put(line)
        self._lines.put(None)

    def _hear(self, line: str) -> bool:
        """Called in the reader thread for each line the moment it arrives (to act at once);
        whether ``readline`` gets it too."""
        return True

    def readline(self, timeout: float = TIMEOUT) -> str | None:
        """The next line it printed, without its newline; ``None`` once its stdout is closed.

        ``ChildError`` when nothing comes for ``timeout`` seconds.
        """
        line = self._next(timeout)
        return None if line is None else line.rstrip("\n")

    def output(self, timeout: float = TIMEOUT) -> str:
        """Everything it prints from now until its stdout closes, as printed.

        ``ChildError`` if that takes more than ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        lines = []
        while (line := self._next(deadline - time.monotonic())) is not None:
            lines.append(line)
        return "".join(lines)

    def _next(self, timeout: float) -> str | None:
        try:
            line = self._lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise ChildError(f"{self.name} said nothing for {timeout:.1f} s{self.tail()}"
                             ) from None
        if line is None:
            self._lines.put(None)  # the end stays the end for the next reader
        return line

    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read()

    def tail(self) -> str:
        """The end of its stderr, set off for an error message (empty if it wrote none)."""
        text = self.stderr().strip()
        return f"\n--- {self.name} stderr ---\n{text[-3000:]}" if text else ""

    # -- its input --------------------------------------------------------------------------

    def write(self, line: str) -> None:
        """Send one line to its stdin; a process already gone hears nothing."""
        assert self._popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._popen.stdin.write(line + "\n")
            self._popen.stdin.flush()

    def close_stdin(self) -> None:
        """End its stdin: it reads end-of-file."""
        assert self._popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # unsent lines to a process already gone
            self._popen.stdin.close()

    # -- signals and exit -------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        """Send ``signum`` to it and to what it started (its process group), if it still runs."""
        if self._popen.poll() is None:  # once reaped, its pid may belong to someone else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signum)

    def kill(self) -> int:
        """SIGKILL it, as a power cut would, and return its exit code once it is gone."""
        self.signal(signal.SIGKILL)
        return self.wait()

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM); ``wait`` for its exit code."""
        self.signal(signal.SIGTERM)

    def pause(self) -> None:
        """Freeze it where it is (SIGSTOP), as a stalled host or a long GC pause would."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process go on (SIGCONT)."""
        self.signal(signal.SIGCONT)

    def poll(self) -> int | None:
        """Its exit code if it has ended, else ``None``."""
        return self._popen.poll()

    def wait(self, timeout: float = TIMEOUT) -> int:
        """Its exit code once it has ended (``-N`` when signal N ended it).

        ``ChildError`` if it is still running after ``timeout`` seconds.
        """
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ChildError(f"{self.name} did not exit in {timeout} s{self.tail()}") from None

    @property
    def killed(self) -> bool:
        """Whether SIGKILL ended it."""
        return self._popen.poll() == -signal.SIGKILL

    def close(self) -> None:
        """SIGKILL it (and its group) if it still runs, reap it and release its pipes; again is
        a no-op."""
        if self not in _running:
            return
        self.signal(signal.SIGKILL)
        self._popen.wait()  # SIGKILL cannot be refused
        self.close_stdin()
        self._reader.join(TIMEOUT)  # before its pipe closes under it
        if self._popen.stdout is not None:
            self._popen.stdout.close()
        self._stderr.close()
        _running.discard(self)


def run(argv: Sequence[str], *, timeout: float = TIMEOUT,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end with its output captured, as ``subprocess.run`` would, but as
    a ``Process`` (so it cannot outlive the caller); ``ChildError`` after ``timeout`` seconds.

    Its stdin is closed at once: it reads end-of-file.
    """
    with Process(argv, name=Path(argv[0]).name, env=env) as process:
        process.close_stdin()
        started = time.monotonic()
        stdout = process.output(timeout)
        code = process.wait(max(timeout - (time.monotonic() - started), 0.0))
        return subprocess.CompletedProcess(list(argv), code, stdout, process.stderr())


# -- the step protocol, the parent's side ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """What a child said about one step: its value, or the error it raised."""

    value: Any = None
    error: str | None = None  # the exception's class name, e.g. "Fenced"; or ENDED
    message: str = ""

    def unwrap(self) -> Any:
        """The value; raises ``ChildError`` if the step raised or the child ended."""
        if self.error == ENDED:
            raise ChildError(self.message)
        if self.error is not None:
            raise ChildError(f"step raised {self.error}: {self.message}")
        return self.value


class Child(Process):
    """A fresh interpreter running steps: start it, send it steps, read its answers and notes.

    It opens ``store`` and ``receiver`` (URLs, each only if given) at start, on a manual clock
    at ``now`` (``None``: the system clock), and imports ``modules`` for steps of their own.
    """

    def __init__(self, *, name: str = "child", store: str | None = None,
                 receiver: str | None = None, now: float | None = START,
                 modules: Sequence[str] = ()) -> None:
        #: Every note it printed, in order (kept even when it is killed mid-step).
        self.notes: list[Any] = []
        self._kill_at: int | None = None
        config = {"name": name, "store": store, "receiver": receiver, "now": now,
                  "modules": list(modules)}
        super().__init__(python("-W", "error", "-c",
                                "from tests.harness.children import serve; serve()",
                                json.dumps(config)), name=name)

    def _hear(self, line: str) -> bool:
        try:
            document = json.loads(line)
        except ValueError:
            return True  # not the protocol: the reader of the answer says so
        if not (isinstance(document, dict) and "note" in document):
            return True
        self.notes.append(document["note"])
        if self._kill_at is not None and len(self.notes) >= self._kill_at:
            self.signal(signal.SIGKILL)
        return False

    def kill_after(self, notes: int) -> None:
        """SIGKILL it the moment it has printed ``notes`` notes in all, wherever it is then."""
        self._kill_at = notes
        if len(self.notes) >= notes:
            self.signal(signal.SIGKILL)

    def _document(self) -> dict[str, Any] | None:
        line = self.readline()
        if line is None:
            return None
        try:
            document: dict[str, Any] = json.loads(line)
        except ValueError:
            raise ChildError(f"{self.name} broke the protocol with {line!r}{self.tail()}") from None
        return document

    def ready(self) -> None:
        """Wait until the child has opened its databases."""
        document = self._document()
        if document is None or "ready" not in document:
            raise ChildError(f"{self.name} did not start with READY but with {document}"
                             f"{self.tail()}")

    def go(self, step: str, /, *, now: float | None = None, **args: Any) -> None:
        """Tell the child to run ``step`` (at time ``now``, if given) without waiting."""
        self.write(json.dumps({"step": step, "args": args, "now": now}))

    def answer(self) -> Answer:
        """The answer to the step sent last (``error`` ``ENDED`` if the child ended first)."""
        document = self._document()
        if document is None:
            return Answer(error=ENDED, message=f"{self.name} ended (exit code {self.wait()}) "
                                               f"without answering{self.tail()}")
        return Answer(value=document.get("value"), error=document.get("error"),
                      message=document.get("message", ""))

    def call(self, step: str, /, *, now: float | None = None, **args: Any) -> Any:
        """Run ``step`` and return its value; ``ChildError`` if it raised."""
        self.go(step, now=now, **args)
        return self.answer().unwrap()

    def exit_code(self) -> int:
        """Close stdin (no more steps) and return the exit code once the child is gone."""
        self.close_stdin()
        return self.wait()

    def unanswered(self) -> list[str]:
        """Lines the child printed that no ``answer()`` has read (after it exited)."""
        lines = []
        while (line := self.readline()) is not None:
            lines.append(line.strip())
        return lines


@contextmanager
def spawn(count: int, *, name: str = "child", **options: Any) -> Iterator[list[Child]]:
    """Start ``count`` children named ``<name>-0 ...`` and wait until every one is READY."""
    with ExitStack() as stack:
        children = [stack.enter_context(Child(name=f"{name}-{index}", **options))
                    for index in range(count)]
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


# -- the step protocol, the child's side -----------------------------------------------------

_T = TypeVar("_T")


class Context:
    """What a child holds between steps: its databases, its clock, its latest claim, and what
    its step modules keep (``kept``)."""

    def __init__(self, name: str, now: float | None, say: Callable[[Any], None]) -> None:
        self.name = name
        self.clock: postroom.Clock = (postroom.SystemClock() if now is None
                                      else postroom.ManualClock(now))
        self.auth = postroom.AuthContext(principal="planner")
        self.claim: postroom.Claim | None = None
        self.kept: dict[str, Any] = {}
        self._say = say
        self._store: postroom.Store | None = None
        self._receiver: postroom.Receiver | None = None

    def open(self, store: str | None, receiver: str | None = None, *,
             settings: postroom.Settings = SETTINGS, seed: int = 0) -> None:
        """Open the store and the receiver at these URLs (each only if given), on this
        child's clock."""
        if store is not None:
            if self._store is not None:
                self._store.close()
            self._store = postroom.open_store(store, clock=self.clock, settings=settings,
                                              seed=seed)
        if receiver is not None:
            if self._receiver is not None:
                self._receiver.close()
            self._receiver = postroom.Receiver.open(receiver, clock=self.clock)

    def _needs(self, held: _T | None, lacking: str) -> _T:
        if held is None:
            raise LookupError(f"{self.name} {lacking}")
        return held

    @property
    def store(self) -> postroom.Store:
        """The store this child opened."""
        return self._needs(self._store, "has no store open")

    @property
    def receiver(self) -> postroom.Receiver:
        """The receiver this child opened."""
        return self._needs(self._receiver, "has no receiver open")

    @property
    def manual_clock(self) -> postroom.ManualClock:
        """This child's clock, which only moves when told to."""
        if not isinstance(self.clock, postroom.ManualClock):
            raise LookupError(f"{self.name} runs on the system clock")
        return self.clock

    @property
    def held(self) -> postroom.Claim:
        """The claim this process holds (its latest)."""
        return self._needs(self.claim, "holds no claim")

    def note(self, record: Any) -> None:
        """Tell the parent something now, while the step runs (``Child.notes``)."""
        self._say({"note": _plain(record)})

    def close(self) -> None:
        """Close what is open."""
        for opened in (self._store, self._receiver):
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


@step("arm")
def _arm(ctx: Context, point: str, code: int, skip: int = 0) -> None:
    """End this process with ``os._exit(code)`` when it next passes the fault point, or once
    it passed it ``skip`` times (the commit of a bulk call's later transaction)."""
    if not skip:
        faults.arm(point, faults.crash(code))
        return
    passed = [0]
    die = faults.crash(code)

    def after_skipping(name: str) -> None:
        passed[0] += 1
        if passed[0] > skip:
            die(name)

    faults.arm(point, after_skipping, times=None)


@step("open")
def _open(ctx: Context, store: str | None = None, receiver: str | None = None) -> None:
    ctx.open(store, receiver)


def _plain(value: Any) -> Any:
    """A step's value as JSON data (records become dicts, enums their values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def serve() -> None:
    """The child's loop: open, READY, then one answer per GO until stdin closes."""
    config = json.loads(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print must not break the protocol

    def say(document: Any) -> None:
        out.write(json.dumps(document) + "\n")
        out.flush()  # before any crash the next step may cause

    for module in ("tests.harness.steps", *config["modules"]):
        importlib.import_module(module)
    ctx = Context(config["name"], config["now"], say)
    ctx.open(config["store"], config["receiver"])
    say({"ready": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        if command["now"] is not None:
            ctx.manual_clock.set(command["now"])
        try:
            value = STEPS[command["step"]](ctx, **command["args"])
        except Exception as exc:
            traceback.print_exc()
            say({"error": type(exc).__name__, "message": str(exc)})
        else:
            say({"value": _plain(value)})
    ctx.close()
