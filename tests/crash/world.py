"""The parent's side of a crash test: the databases, reopened the way a restarted process would.

A ``World`` holds a store URL and a receiver URL and opens them lazily, so ``restart()`` (close
everything) followed by any read is exactly "reopen the database". It also knows the tasks
the test expects to converge and drives them through the rest of the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import postroom
from postroom import Outcome, ReplyState, TaskState
from postroom.audit import audit_url
from postroom.transitions import reply_id_for
from postroom.validation import task_id_for
from tests.support import SETTINGS, START, envelope

AUTH = postroom.AuthContext(principal="planner")
#: The result every worker in these tests finishes with.
RESULT = {"answer": 42}


def task_id(message_id: str = "m-1") -> str:
    """The task id of ``message_id`` sent by ``planner``."""
    return task_id_for(AUTH.principal, message_id)


class Recording:
    """A transport that keeps every outcome its inner transport answered."""

    def __init__(self, inner: postroom.Transport) -> None:
        self.inner = inner
        self.outcomes: list[Outcome] = []

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> Sequence[Outcome]:
        outcomes = self.inner.deliver(batch)
        self.outcomes.extend(outcomes)
        return outcomes


class Refusing:
    """A transport whose receiver refuses everything for good: replies become ``dead``."""

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> Sequence[Outcome]:
        raise postroom.PermanentDeliveryError("refused: the receiver was misconfigured")


class World:
    """One crash test's databases and expectations, seen from the surviving parent."""

    def __init__(self, store_url: str, receiver_url: str) -> None:
        self.store_url = store_url
        self.receiver_url = receiver_url
        self.clock = postroom.ManualClock(START)
        #: Tasks that must end terminal, with their reply sent and received exactly once.
        self.expected: list[str] = []
        #: What the crashing child answered to each step before the armed one, by step name.
        self.answers: dict[str, Any] = {}
        self._store: postroom.Store | None = None
        self._receiver: postroom.Receiver | None = None

    # -- databases ------------------------------------------------------------------------------

    @property
    def store(self) -> postroom.Store:
        """The store, (re)opened on first use."""
        if self._store is None:
            self._store = postroom.open_store(self.store_url, clock=self.clock,
                                              settings=SETTINGS, seed=0)
        return self._store

    @property
    def receiver(self) -> postroom.Receiver:
        """The receiver, (re)opened on first use."""
        if self._receiver is None:
            self._receiver = postroom.Receiver.open(self.receiver_url, clock=self.clock)
        return self._receiver

    def reopen(self) -> tuple[postroom.Store, postroom.Receiver]:
        """Open both databases now, as a restarted process does before anything else."""
        return self.store, self.receiver

    def restart(self) -> None:
        """Close both databases; the next use reopens them, as a restarted process would."""
        for opened in (self._store, self._receiver):
            if opened is not None:
                opened.close()
        self._store = self._receiver = None

    def audit(self) -> None:
        """Both databases satisfy every invariant of SPEC §8."""
        for url in (self.store_url, self.receiver_url):
            violations = audit_url(url)
            assert violations == [], f"audit of {url}: " + "; ".join(map(str, violations))

    # -- the pipeline ---------------------------------------------------------------------------

    def expect(self, *message_ids: str) -> None:
        """The tasks of these messages must converge (whoever stores them)."""
        for message_id in message_ids:
            if task_id(message_id) not in self.expected:
                self.expected.append(task_id(message_id))

    def receive(self, message_id: str = "m-1") -> postroom.Ack:
        """Send ``message_id`` (again) and expect its task to converge."""
        self.expect(message_id)
        return self.store.receive(AUTH, envelope(message_id))

    def task(self, message_id: str = "m-1") -> postroom.Task:
        """The task of ``message_id`` as stored."""
        return self.store.task(task_id(message_id))

    def reply(self, message_id: str = "m-1") -> postroom.Reply | None:
        """The reply of ``message_id``'s task, if it has one."""
        return self.store.reply(task_id(message_id))

    def effects(self, message_id: str = "m-1") -> int:
        """How many business effects the receiver applied for that task's reply."""
        return self.receiver.effect_count(reply_id_for(task_id(message_id)))

    @property
    def dead_claim(self) -> postroom.Claim:
        """The claim the crashed child held (as a restarted worker would have kept it)."""
        return postroom.Claim(**self.answers["claim"])

    def work(self, owner: str = "w-restarted") -> postroom.Claim:
        """Claim the next task and finish it with ``RESULT``."""
        claim = self.store.claim(owner)
        assert claim is not None, "nothing was claimable"
        self.store.finish(claim, RESULT)
        return claim

    def recover(self) -> None:
        """What time and a restart do for a worker that died holding a claim."""
        lease_until = self.task().lease_until
        assert lease_until is not None, "the task is not held by anyone"
        self.clock.set(max(self.clock.now(), lease_until))
        assert self.store.sweep().leases_recovered == 1
        assert self.task().state == TaskState.PENDING

    def dispatch(self) -> list[Outcome]:
        """Deliver every reply that is due; return what the receiver answered."""
        transport = Recording(postroom.InProcessTransport(self.receiver))
        while self.store.dispatch(transport, owner="d-restarted").claimed:
            pass
        return transport.outcomes

    def assert_converged(self) -> None:
        """Every expected task is terminal, its reply sent and received exactly once."""
        assert self.expected, "the scenario expects no task"
        for expected in self.expected:
            task = self.store.task(expected)
            reply = self.store.reply(expected)
            assert task.state.terminal, f"task {expected} is still {task.state}"
            assert reply is not None and reply.state == ReplyState.SENT, reply
            assert self.receiver.effect_count(reply.reply_id) == 1
        assert self.receiver.effects_total() == len(self.expected)
