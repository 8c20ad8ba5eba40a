"""``postroom drain``: worker hosts crash at random while a queue drains; nothing is lost.

The multi-host simulation. Worker and dispatcher processes, each with its own connections
(on PostgreSQL, its own sessions: as separate as separate hosts), drain one queue of tasks
while the conductor SIGKILLs one of them at random every so often and starts a replacement
under a new name. A killed worker leaves running claims behind; their leases expire and the
survivors' claims recover them. A killed dispatcher leaves replies ``sending``; their leases
expire too, and the receiver's dedupe turns the redelivery into a duplicate ACK.

The receiver's business effect is a row in ``drain_effects``, a table with no unique key, so
a second effect of one reply would show up as a second row rather than be refused. At the
end the conductor checks that every task is terminal, every reply sent, there is exactly one
effect per task, and ``postroom audit`` is clean on both databases.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from postroom.audit import audit_database
from postroom.db.database import Tx
from postroom.errors import Fenced, InvalidInput, PostroomError
from postroom.models import AuthContext, Envelope, TaskState
from postroom.receiver import Receiver
from postroom.settings import FixedBackoff, Settings
from postroom.store import Store, open_store
from postroom.transports import InProcessTransport
from tests.harness.children import Process, python
from tests.support import database_of

__all__ = ["DrainReport", "run_drain"]

QUEUE = "drain"
_TERMINAL = tuple(state.value for state in TaskState if state.terminal)
_EFFECTS_TABLE = ("CREATE TABLE IF NOT EXISTS drain_effects "
                  "(reply_id TEXT NOT NULL, task_id TEXT NOT NULL, status TEXT NOT NULL)")


def simulation_settings(lease: float) -> Settings:
    """The settings every process of a drain shares.

    Short leases so that a killed process's work comes back quickly; a delivery budget large
    enough that random dispatcher kills never exhaust it (what is checked is that every reply
    is sent, not how many tries it took); short fixed backoffs.
    """
    return Settings(lease=lease, dispatch_lease=lease, delivery_budget=100,
                    backoff=FixedBackoff(seconds=0.05),
                    delivery_backoff=FixedBackoff(seconds=0.05))


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainReport:
    """What a drain did and what the databases say at its end."""

    tasks: int
    workers: int
    dispatchers: int
    kills: int
    deaths: int  # children that exited on their own (e.g. could not connect) and were replaced
    seconds: float
    task_states: dict[str, int] = field(default_factory=dict)
    reply_states: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    distinct_effects: int = 0
    violations: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def problems(self) -> list[str]:
        """Every way the run fell short of "nothing lost, nothing doubled"."""
        found = []
        terminal = sum(self.task_states.get(state, 0) for state in _TERMINAL)
        if terminal != self.tasks or sum(self.task_states.values()) != self.tasks:
            found.append(f"{terminal} of {self.tasks} tasks terminal: {self.task_states}")
        if self.reply_states.get("sent", 0) != self.tasks:
            found.append(f"{self.reply_states.get('sent', 0)} of {self.tasks} replies sent: "
                         f"{self.reply_states}")
        if self.effects != self.tasks or self.distinct_effects != self.tasks:
            found.append(f"{self.effects} effects for {self.distinct_effects} replies; "
                         f"expected exactly one for each of {self.tasks}")
        found.extend(f"audit: {violation}" for violation in self.violations)
        if self.timed_out:
            found.append("timed out before the queue drained")
        return found

    def summary(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {**asdict(self), "problems": self.problems}


class _Children:
    """The worker and dispatcher processes, by slot (``worker-3``); a slot's process is
    replaced under a new owner name (``worker-3.2``)."""

    def __init__(self, store_url: str, receiver_url: str, lease: float, batch: int) -> None:
        self._args = {"worker": [store_url, str(lease), str(batch)],
                      "dispatcher": [store_url, receiver_url, str(lease), str(batch)]}
        self.running: dict[str, Process] = {}
        self._generation: dict[str, int] = {}

    def start(self, slot: str) -> None:
        """Start the slot's next process (closing its previous one)."""
        if slot in self.running:
            self.running[slot].close()
        role = slot.split("-", 1)[0]
        self._generation[slot] = self._generation.get(slot, 0) + 1
        owner = f"{slot}.{self._generation[slot]}"
        self.running[slot] = Process(
            python("-m", "tests.harness.drain", role, owner, *self._args[role]), name=owner)

    def kill(self, slot: str) -> None:
        """SIGKILL the slot's process, wherever it is."""
        self.running[slot].kill()

    def reap(self) -> list[str]:
        """Slots whose process exited by itself."""
        return [slot for slot, child in self.running.items() if child.poll() is not None]

    def last_words(self, slot: str) -> str:
        """How the slot's process ended: its exit code and the last line of its stderr."""
        child = self.running[slot]
        said = child.stderr().strip().splitlines()[-1:]
        return f"{child.name} exited {child.poll()}" + "".join(f": {line}" for line in said)

    def stop_all(self) -> None:
        """SIGKILL and reap every process."""
        for child in self.running.values():
            child.close()


def run_drain(store_url: str, receiver_url: str | None = None, *, tasks: int = 10_000,
              workers: int = 8, dispatchers: int = 2, kill_every: float = 0.5,
              lease: float = 2.0, batch: int = 10, seed: int = 0, timeout: float = 900.0,
              echo: Callable[[str], None] = print,
              on_progress: Callable[[float], None] | None = None) -> DrainReport:
    """Run a drain on fresh databases and report; see the module docstring.

    ``kill_every`` is the mean number of seconds between SIGKILLs (0: no kills).
    ``on_progress(fraction_terminal)`` is called about five times a second (a test's hook
    for its own disruptions: ending sessions, restarting the server).
    """
    if tasks < 1 or workers < 1 or dispatchers < 1:
        raise InvalidInput("drain", "needs at least one task, worker and dispatcher")
    for name, value in (("kill_every", kill_every), ("timeout", timeout)):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidInput(name, f"must be a finite number of seconds >= 0, got {value!r}")
    if timeout == 0:
        raise InvalidInput("timeout", "must be more than 0 seconds")
    receiver_url = receiver_url or store_url
    settings = simulation_settings(lease)
    with open_store(store_url, settings=settings) as store:
        if sum(store.info()["tasks"].values()):
            raise InvalidInput("url", "the store is not empty: a drain needs a fresh database")
        with Receiver.open(receiver_url) as receiver:
            # Effects left by an earlier run would answer this one's deliveries as
            # duplicates and pass the count check without this run having done anything.
            if receiver.effects_total():
                raise InvalidInput("receiver", "the receiver already holds effects: a drain "
                                               "needs a fresh database")
            _run_sql(database_of(receiver).dialect, _EFFECTS_TABLE)
        _enqueue(store, tasks, echo)
        children = _Children(store_url, receiver_url, lease, batch)
        slots = ([f"worker-{i}" for i in range(workers)]
                 + [f"dispatcher-{i}" for i in range(dispatchers)])
        conductor = _Conductor(store, children, slots, tasks=tasks, kill_every=kill_every,
                               rng=random.Random(seed), echo=echo, on_progress=on_progress)
        try:
            conductor.run(timeout)
        finally:
            children.stop_all()
    return _report(store_url, receiver_url, settings, tasks=tasks, workers=workers,
                   dispatchers=dispatchers, kills=conductor.kills, deaths=conductor.deaths,
                   seconds=conductor.seconds, timed_out=conductor.timed_out)


class _Conductor:
    """Starts the children, kills one now and then, replaces the dead, watches progress."""

    _TICK = 0.2

    def __init__(self, store: Store, children: _Children, slots: list[str], *, tasks: int,
                 kill_every: float, rng: random.Random, echo: Callable[[str], None],
                 on_progress: Callable[[float], None] | None) -> None:
        self._store = store
        self._children = children
        self._slots = slots
        self._tasks = tasks
        self._kill_every = kill_every
        self._rng = rng
        self._echo = echo
        self._on_progress = on_progress
        self.kills = self.deaths = 0
        self.seconds = 0.0
        self.timed_out = False

    def _next_kill(self, now: float) -> float:
        if self._kill_every <= 0:
            return float("inf")
        return now + self._rng.expovariate(1 / self._kill_every)

    def run(self, timeout: float) -> None:
        children = self._children
        started = time.monotonic()
        for slot in self._slots:
            children.start(slot)
        next_kill = self._next_kill(started)
        last_echo = 0.0
        while True:
            time.sleep(self._TICK)
            now = time.monotonic()
            self.seconds = now - started
            for slot in children.reap():
                self.deaths += 1
                self._echo(f"drain: {children.last_words(slot)}; replaced")
                children.start(slot)
            if now >= next_kill:
                slot = self._rng.choice(self._slots)
                children.kill(slot)
                children.start(slot)
                self.kills += 1
                next_kill = self._next_kill(now)
            counts = _counts(self._store)
            if counts is None:
                continue  # the database is unreachable for a moment: keep going
            terminal, sent, dead = counts
            if self._on_progress is not None:
                self._on_progress(terminal / self._tasks)
            if now - last_echo >= 2.0:
                self._echo(f"drain: {terminal}/{self._tasks} terminal, {sent} replies sent, "
                           f"{self.kills} kills, {self.seconds:.1f}s")
                last_echo = now
            if (terminal == sent == self._tasks) or dead:
                return  # drained; or a reply can never be sent and the run has failed
            if self.seconds > timeout:
                self.timed_out = True
                return


def _enqueue(store: Store, tasks: int, echo: Callable[[str], None]) -> None:
    auth = AuthContext(principal="drain")
    deadline = store.clock.now() + 86_400.0
    for start in range(0, tasks, 500):
        store.receive_atomic(auth, [
            Envelope(message_id=f"drain-{n}", sender="drain", payload={"n": n},
                     deadline=deadline, max_attempts=10, queue=QUEUE)
            for n in range(start, min(start + 500, tasks))])
    echo(f"drain: {tasks} tasks enqueued")


def _counts(store: Store) -> tuple[int, int, int] | None:
    try:
        info = store.info()
    except PostroomError:
        return None
    terminal = sum(info["tasks"].get(state, 0) for state in _TERMINAL)
    return terminal, info["replies"].get("sent", 0), info["replies"].get("dead", 0)


def _report(store_url: str, receiver_url: str, settings: Settings, **fields: Any) -> DrainReport:
    with open_store(store_url, settings=settings) as store:
        info = store.info()
        violations = [str(v) for v in audit_database(database_of(store))]
        with Receiver.open(receiver_url) as receiver:
            if receiver_url != store_url:
                violations += [str(v) for v in audit_database(database_of(receiver))]
            row = _run_sql(database_of(receiver).dialect,
                           "SELECT count(*) AS n, count(DISTINCT reply_id) AS d "
                           "FROM drain_effects")
    return DrainReport(task_states=info["tasks"], reply_states=info["replies"],
                       effects=int(row["n"]), distinct_effects=int(row["d"]),
                       violations=violations, **fields)


def _run_sql(dialect: Any, sql: str) -> Any:
    """Run one statement of the drain's own (its effects table) and return its first row."""
    with dialect.connection() as conn:
        dialect.begin(conn, write=True)
        cursor = dialect.execute(conn, sql, ())
        row = cursor.fetchone() if sql.startswith("SELECT") else None
        dialect.commit(conn)
    return row


# -- the child processes ------------------------------------------------------------------------

def _worker(owner: str, url: str, lease: str, batch: str) -> None:
    store = open_store(url, settings=simulation_settings(float(lease)))
    waiter = store.waiter(queues=QUEUE)
    while True:
        try:
            claims = store.claim_batch(owner, int(batch), queues=QUEUE)
            if not claims:
                waiter.wait(timeout=0.5)
                continue
            for claim in claims:
                n = int(claim.payload["n"])
                # Fenced: our lease ran out and the task went back; another worker has it.
                with contextlib.suppress(Fenced):
                    store.finish(claim, {"n": n, "square": n * n, "by": owner})
        except PostroomError as exc:
            # The database is away (restart, sessions ended): back off and claim again.
            print(f"{owner}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.2)


def _dispatcher(owner: str, url: str, receiver_url: str, lease: str, batch: str) -> None:
    store = open_store(url, settings=simulation_settings(float(lease)))
    record = ("INSERT INTO drain_effects (reply_id, task_id, status) "
              "VALUES (:reply_id, :task_id, :status)")

    def effect(tx: Tx, document: dict[str, Any]) -> None:
        task_id = document["task_id"]
        tx.execute(record, {"reply_id": "reply:" + task_id, "task_id": task_id,
                            "status": document["status"]})

    receiver = Receiver.open(receiver_url, effect=effect)
    transport = InProcessTransport(receiver)
    waiter = store.waiter(queues=(), replies=True)
    while True:
        try:
            report = store.dispatch(transport, owner=owner, limit=int(batch) * 5)
            if report.claimed == 0:
                waiter.wait(timeout=0.5)
        except PostroomError as exc:
            print(f"{owner}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.2)


def _child(argv: list[str]) -> None:
    role, *args = argv
    if role == "worker":
        _worker(*args)
    else:
        _dispatcher(*args)


if __name__ == "__main__":
    _child(sys.argv[1:])
