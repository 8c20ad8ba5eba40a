"""``postroom demo``: the durable task lifecycle, end to end, with real processes.

A temporary SQLite store, a requester's webhook receiver on 127.0.0.1, and the processes a
user runs: ``postroom worker`` (twice: the first is SIGKILLed in the middle of its task) and
``postroom dispatch``. The receiver commits the first delivery and drops the connection
without answering, as a lost ACK would. Each step prints what the databases durably say,
not what a process believes: the task row, the reply row, the receiver's effect count.

The receiver runs on the standard library's ``http.server`` with ``ReceiverApp``'s own
checks (``take``), so the demo needs nothing beyond postroom's core dependencies.
"""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

from postroom.audit import audit_url
from postroom.errors import Fenced
from postroom.http.receiving import ReceiverApp
from postroom.models import Attempt, AttemptOutcome, AuthContext, Claim, Envelope
from postroom.receiver import Receiver
from postroom.store import Store

__all__ = ["Checks", "run_demo"]

#: Each worker's lease, in seconds: short, so that a dead worker's task is recovered within
#: the story (a live worker renews every third of it).
_LEASE = 1.0
#: Seconds the dispatcher waits before it delivers again after a failure.
_RETRY = 1.0
#: What the receiver does with the first delivery, once it has committed it.
_DROPPED = "drops the connection without answering"
#: Seconds the demo waits for any one thing a process should do at once.
_PATIENCE = 60.0


def run_demo(echo: Callable[[str], None] = print, folder: Path | None = None) -> bool:
    """Run the story; returns whether every check along the way held."""
    with tempfile.TemporaryDirectory(prefix="postroom-demo-") as scratch:
        root = folder or Path(scratch)
        check = Checks(echo)
        try:
            _story(echo, check, root)
        except _Stuck as stuck:
            check(False, f"{stuck} within {_PATIENCE:g} s")
            for log in sorted(root.glob("*.log")):
                echo(f"--- {log.name} ---\n{log.read_text('utf-8')[-2000:]}")
            echo("\nSOMETHING DID NOT HOLD")
            return False
        return check.held


class Checks:
    """A story's expectations: each one that fails is printed; ``held`` says whether all held."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self.held = True

    def __call__(self, condition: bool, what: str) -> None:
        if not condition:
            self.held = False
            self._echo(f"   !! expected: {what}")

    def closing_audit(self, heading: str, urls: Sequence[str], scope: str) -> bool:
        """Audit every database, print what it found and the verdict; whether all held."""
        violations = [violation for url in urls for violation in audit_url(url)]
        self._echo(f"{heading}{'clean' if not violations else 'VIOLATIONS'}: SPEC §8 "
                   f"invariants {scope}")
        for violation in violations:
            self._echo(f"{' ' * len(heading)}{violation}")
        self(not violations, "a clean audit")
        self._echo("\n" + ("every step held" if self.held else "SOMETHING DID NOT HOLD"))
        return self.held


class _Stuck(Exception):
    """Something a process should have done did not happen in time."""


def _until(condition: Callable[[], bool], what: str) -> None:
    ends = time.monotonic() + _PATIENCE
    while not condition():
        if time.monotonic() > ends:
            raise _Stuck(what)
        time.sleep(0.02)


# -- the requester's receiver ---------------------------------------------------------------


class _Requester(http.server.ThreadingHTTPServer):
    """The requester's webhook receiver on 127.0.0.1: ``ReceiverApp``'s checks and the
    receiver's dedupe, served by the standard library. It takes the first delivery (receipt
    and effect commit) and then drops the connection without a word: its ACK is lost."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Delivery)
        self.app: ReceiverApp | None = None  # set once the endpoint's secret is made
        self.answers: list[str] = []  # what each delivery got, in order
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        """Where the requester's endpoint is."""
        return f"http://127.0.0.1:{self.server_address[1]}/hooks"


class _Delivery(http.server.BaseHTTPRequestHandler):
    server: _Requester

    def do_POST(self) -> None:
        app = self.server.app
        assert app is not None
        headers = {name.lower(): value for name, value in self.headers.items()}
        refused = app.refuse_length(headers)
        status, answer = refused if refused is not None else app.take(
            headers, self.rfile.read(int(headers.get("content-length", "0"))))
        with self.server.lock:
            first = not self.server.answers
            self.server.answers.append(_DROPPED if first and status == 200
                                       else f"{status} {json.dumps(answer)}")
        if first and status == 200:
            self.close_connection = True  # closed with no answer at all
            return
        payload = json.dumps(answer).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the demo tells what happened."""


@contextmanager
def _serving() -> Iterator[_Requester]:
    server = _Requester()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="demo receiver", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)


# -- the processes --------------------------------------------------------------------------


class _Process:
    """A ``postroom`` command in a process of its own, its output in ``<folder>/<name>.log``;
    SIGKILLed when the story ends, if it still runs."""

    def __init__(self, folder: Path, name: str, *args: str) -> None:
        self.name = name
        self.log = folder / f"{name}.log"
        self._out: IO[str] = self.log.open("w", encoding="utf-8")
        # A session of its own: Ctrl-C at a terminal reaches only the demo, which stops it.
        self.popen = subprocess.Popen([sys.executable, "-m", "postroom", *args],
                                      stdin=subprocess.DEVNULL, stdout=self._out,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, signum: int) -> int:
        """Send ``signum`` and return the exit code once the process is gone."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
        try:
            return self.popen.wait(_PATIENCE)
        except subprocess.TimeoutExpired:
            raise _Stuck(f"{self.name} to exit after {signal.Signals(signum).name}") from None

    def output(self) -> str:
        """What it printed so far."""
        return self.log.read_text("utf-8")

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._out.close()


# -- the story ------------------------------------------------------------------------------


def _story(echo: Callable[[str], None], check: Checks, root: Path) -> None:
    url, receiver_url = f"sqlite:///{root / 'postroom.db'}", f"sqlite:///{root / 'receiver.db'}"
    with ExitStack() as stack:
        store = stack.enter_context(Store.open(url))
        receiver = stack.enter_context(Receiver.open(receiver_url))
        requester = stack.enter_context(_serving())
        endpoint = store.add_endpoint("planner", requester.url, allow_private=True,
                                      schedule=[_RETRY])
        requester.app = ReceiverApp(receiver, [endpoint.secrets[0].secret])

        def start(name: str, *args: str) -> _Process:
            process = _Process(root, name, *args)
            stack.callback(process.close)
            return process

        def worker(name: str) -> _Process:
            return start(name, "worker", url, "--import", "postroom.demo_handlers",
                         "--lease", f"{_LEASE:g}", "--poll", "0.1", "--owner", name)

        echo(f"postroom demo: store    {url}\n               receiver {receiver_url}\n"
             f"               serving the requester's webhooks at {requester.url}\n")
        began = time.time()

        def task_row(task_id: str) -> str:
            t = store.task(task_id)
            lease = "-" if t.lease_until is None else f"+{t.lease_until - began:.1f}s"
            return (f"state={t.state} owner={t.owner or '-'} fence={t.fence} "
                    f"attempts={t.attempts} lease_until={lease}")

        def reply_row(task_id: str) -> str:
            r = store.reply(task_id)
            assert r is not None
            return (f"state={r.state} attempts={r.attempts} "
                    f"last_error={json.dumps(r.last_error)}")

        ack = store.receive(AuthContext(principal="planner"), Envelope(
            message_id="review-42", sender="planner", queue="reviews", deadline=began + 3600,
            payload={"review": "pull request 42", "folder": str(root)}))
        task_id = ack.task_id
        echo(f"1. receive      planner's replies go to its endpoint, signed; the task is stored:\n"
             f"                ACK {json.dumps(ack.to_dict())}")
        echo(f"                task {task_row(task_id)}")
        check(not ack.duplicate and store.task(task_id).state == "pending", "stored, pending")

        first = worker("worker-1")
        echo(f"2. claim        `postroom worker --lease {_LEASE:g}` (worker-1, pid "
             f"{first.popen.pid}) claims it; its handler starts the review")
        claim_file = root / "claim-1.json"
        _until(claim_file.exists, "worker-1 to claim the task")
        held = Claim(**json.loads(claim_file.read_text("utf-8")))
        echo(f"                worker-1 holds fence {held.fence}; task {task_row(task_id)}")
        check(held.owner == "worker-1" and held.fence == 1, "worker-1 holds fence 1")

        code = first.stop(signal.SIGKILL)
        echo(f"3. kill         SIGKILL worker-1 in the middle of the review (exit code {code}): "
             f"no finish, no release\n                task {task_row(task_id)}")
        check(code == -signal.SIGKILL and store.task(task_id).owner == "worker-1",
              "the dead worker's claim is still recorded")

        second = worker("worker-2")
        _until((root / "claim-2.json").exists, "worker-2 to recover the task")
        echo(f"4. recover      worker-2 (pid {second.popen.pid}) starts; worker-1's lease runs out "
             f"unrenewed and worker-2 claims the task\n                task {task_row(task_id)}")
        check(store.task(task_id).fence == 2, "worker-2 holds fence 2")

        try:
            store.finish(held, {"verdict": "stale approve"})
            check(False, "the stale commit to be rejected")
        except Fenced as exc:
            echo(f"5. stale commit worker-1's claim, as its handler wrote it down (fence "
                 f"{held.fence}), tries to finish: rejected\n                (Fenced: {exc.reason})"
                 f"\n                task {task_row(task_id)}")

        (root / "go").touch()
        _until(lambda: store.reply(task_id) is not None, "worker-2 to finish the task")
        done = store.task(task_id)
        echo(f"6. done         the review ends; worker-2 commits its result and the reply "
             f"together:\n                task state={done.state} result={json.dumps(done.result)}"
             f"\n                reply {reply_row(task_id)}")
        check(done.state == "done" and done.result["fence"] == 2, "done by worker-2's claim")

        dispatcher = start("dispatcher", "dispatch", url, "--poll", "0.1", "--timeout", "2",
                           "--log-level", "warning", "--owner", "dispatcher")
        def deliveries() -> list[Attempt]:
            return [d for d in store.story(task_id).deliveries if d.outcome is not None]

        def delivery_row(d: Attempt) -> str:
            return (f"delivery {d.attempt}: {d.outcome} (owner {d.owner}, fence {d.fence})"
                    + (f"\n                  {d.error}" if d.error else ""))

        _until(lambda: bool(deliveries()), "the first delivery to be recorded")
        first_delivery = deliveries()[0]
        reply = store.reply(task_id)
        assert reply is not None
        effects = receiver.effect_count(reply.reply_id)
        echo(f"7. deliver #1   `postroom dispatch` POSTs the reply; the receiver commits it, "
             f"then {requester.answers[0]}:\n                the ACK is lost, so the outbox "
             f"records {delivery_row(first_delivery)}\n                receiver effects for "
             f"{reply.reply_id}: {effects}")
        check(requester.answers[0] == _DROPPED and effects == 1
              and first_delivery.outcome is AttemptOutcome.TRANSIENT,
              "one effect, the delivery to be tried again")

        _until(lambda: (r := store.reply(task_id)) is not None and r.state == "sent",
               "the redelivery to be recorded sent")
        again = store.reply(task_id)
        assert again is not None
        last_delivery = deliveries()[-1]
        reused = ("the same reply_id" if again.reply_id == reply.reply_id
                  else f"another reply_id, {again.reply_id}")
        echo(f"8. deliver #2   {_RETRY:g} s later it delivers again, with {reused}; the "
             f"receiver answers\n                "
             f"{requester.answers[-1]}\n                {delivery_row(last_delivery)}"
             f"\n                reply {reply_row(task_id)}")
        check(again.attempts == 2 and again.reply_id == reply.reply_id
              and last_delivery.outcome is AttemptOutcome.DELIVERED, "same reply_id, sent")

        codes = [second.stop(signal.SIGTERM), dispatcher.stop(signal.SIGTERM)]
        stopped = dispatcher.output().splitlines()[-1]
        echo(f"9. stop         SIGTERM worker-2 and the dispatcher: exit codes "
             f"{codes[0]} and {codes[1]}\n                the dispatcher's last word: {stopped}")
        check(codes == [143, 143], "both stop with 143")

        effects = receiver.effect_count(again.reply_id)
        receipt = receiver.receipt(again.reply_id) or {}
        echo(f"10. evidence    task {store.task(task_id).state}, reply {again.state}; "
             f"{len(requester.answers)} deliveries reached the receiver, receiver effects "
             f"{effects}, receipt fingerprint {str(receipt.get('fingerprint', '?'))[:16]}...")
        check(effects == 1 and len(requester.answers) == 2, "two deliveries, exactly one effect")
        check.closing_audit("11. audit       ", [url, receiver_url], "on both databases")
