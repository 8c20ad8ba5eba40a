"""``Store``: the public face of one postroom database.

Each method validates its arguments, opens one named transaction, and hands the work to the
module that owns the rule (``inbox``, ``tasks``, ``outbox``, ``waits``). Methods are synchronous and
short: nothing slow (a handler, a network call) ever runs inside a transaction.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from postroom import (
    approvals,
    audit,
    chains,
    endpoints,
    inbox,
    outbox,
    principals,
    queues,
    retention,
    schedules,
    signing,
    status,
    tasks,
    transitions,
    transports,
    waits,
)
from postroom.audit import Violation
from postroom.clock import Clock, finite_time
from postroom.db.database import Check, Database, Tx
from postroom.db.dialect import Row
from postroom.db.wakeups import REPLIES_CHANNEL, Waiter
from postroom.endpoints import DEFAULT_CONCURRENCY
from postroom.errors import (
    BatchFailed,
    Fenced,
    InvalidInput,
    SchemaError,
    StoreError,
    Unauthorized,
    Unconfirmed,
)
from postroom.models import (
    Ack,
    Approval,
    AskedApproval,
    AuthContext,
    Chain,
    Claim,
    CommittedEffect,
    Continuation,
    DispatchReport,
    Endpoint,
    Envelope,
    ExpireResult,
    Failed,
    Finished,
    FollowUp,
    Observation,
    OpenWait,
    Outcome,
    Page,
    Periodic,
    Position,
    Released,
    Reply,
    ReplyClaim,
    ReplyState,
    Requeue,
    Resumption,
    Retry,
    Settled,
    Settlement,
    SideEffect,
    SignalReceipt,
    StoreStatus,
    Swept,
    Task,
    TaskState,
    TaskStory,
    Wait,
    WaitOpening,
    WaitState,
)
from postroom.settings import Settings, check_lease, check_retention
from postroom.transports import Transport
from postroom.validation import (
    MAX_BATCH,
    MAX_CHAIN_BUDGET,
    MAX_DELAY,
    REPLY_ID_BYTES,
    TASK_ID_BYTES,
    CheckedEnvelope,
    check_batch,
    check_bool,
    check_claim,
    check_int,
    check_json,
    check_limit,
    check_number,
    check_outcome,
    check_pair,
    check_queues,
    check_reply_claim,
    check_text,
    follow_up_principal,
)

__all__ = ["Confirmed", "Store", "open_store"]


@dataclass(slots=True)
class Confirmed:
    """What a ``Store.confirming`` block confirmed: how many of its transactions confirmed
    the token (none: the block made no transaction, and confirmed nothing)."""

    transactions: int = 0



#: What recording a batch of delivery outcomes made: counts by state, the fenced, the claims.
_Recorded = tuple[dict[ReplyState, int], list[str], list[ReplyClaim]]


class Store:
    """Tasks, replies and their durable evidence in one database.

    Open with ``open_store(url)``; safe to share between threads (SQLite serializes them on
    one connection, PostgreSQL uses a pool).
    """

    def __init__(self, database: Database, *, settings: Settings | None = None,
                 seed: int | None = None) -> None:
        """Use ``database`` (its schema migrated) as a store.

        Adopts the retention period the store publishes, publishing the one in ``settings``
        (or the default) if it has none yet; ``InvalidInput`` naming ``retention`` if
        ``settings`` asks for another one than the store publishes.
        """
        self._db = database
        settings = settings if settings is not None else Settings()
        adopted = self._db.write(retention.PUBLISH, lambda tx: retention.adopt(
            tx, settings.retention))
        self._settings = replace(settings, retention=adopted)
        self._rng = random.Random(seed)

    @classmethod
    def open(cls, url: str, *, clock: Clock | None = None, settings: Settings | None = None,
             seed: int | None = None) -> Store:
        """Open the store at ``url``, creating or upgrading its schema."""
        from postroom.db import dialect_for_url

        database = Database(dialect_for_url(url), clock=clock)
        try:
            database.migrate("store")
            return cls(database, settings=settings, seed=seed)
        except BaseException:  # e.g. refused settings: release the connections at once
            database.close()
            raise

    # -- receiving ----------------------------------------------------------------------------

    def receive(self, auth: AuthContext, envelope: Envelope, *,
                position: Position | None = None) -> Ack:
        """Store one message and its task; the ACK is returned only after the commit."""
        checked = inbox.check(self._settings, auth, envelope)
        position = inbox.check_position(self._settings, position)
        return self._db.write(inbox.RECEIVE, lambda tx: inbox.store_message(
            tx, self._settings, checked, position))

    def receive_batch(self, auth: AuthContext, envelopes: Iterable[Envelope], *,
                      positions: Iterable[Position | None] | None = None) -> list[Ack]:
        """Store messages one commit at a time.

        ``envelopes`` may be any iterable of at most ``MAX_BATCH``; it is read once, before
        anything is stored. On the first failure raises ``BatchFailed`` carrying the ACKs of
        the committed prefix and the failing index; replaying that prefix yields duplicates,
        not new tasks.
        """
        envelopes, places = _batch(envelopes, positions)
        acks: list[Ack] = []
        for index, (envelope, position) in enumerate(zip(envelopes, places, strict=True)):
            try:
                acks.append(self.receive(auth, envelope, position=position))
            except Exception as exc:  # whatever stopped it, the committed prefix is durable
                raise BatchFailed(acks, index, exc) from exc
        return acks

    def receive_atomic(self, auth: AuthContext, envelopes: Iterable[Envelope], *,
                       positions: Iterable[Position | None] | None = None) -> list[Ack]:
        """Store all messages (any iterable of at most ``MAX_BATCH``) in one transaction (one
        fsync), or none of them.

        Every item is validated before anything is written; a collision rolls back the whole
        batch and raises ``PayloadCollision``.
        """
        envelopes, places = _batch(envelopes, positions)
        checked = [(_indexed(index, inbox.check, self._settings, auth, envelope),
                    _indexed(index, inbox.check_position, self._settings, position))
                   for index, (envelope, position) in enumerate(zip(envelopes, places,
                                                                    strict=True))]

        def each(tx: Tx) -> list[Ack]:
            return [inbox.store_message(tx, self._settings, item, position)
                    for item, position in checked]

        if any(position is not None for _, position in checked):
            return self._db.write(inbox.RECEIVE_ATOMIC, each)
        return self._db.write_batch(inbox.RECEIVE_ATOMIC, lambda tx: inbox.store_all(
            tx, self._settings, [item for item, _ in checked]), each)

    def watermark(self, auth: AuthContext, stream: str) -> int:
        """The highest ``seq`` of ``stream`` such that every lower one is stored (0: none)."""
        principal = inbox.principal_of(self._settings, auth)
        check_text(stream, "stream", max_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: inbox.watermark(tx, principal, stream))

    # -- tasks ----------------------------------------------------------------------------------

    def claim(self, owner: str, *, queues: Sequence[str] | str = ("default",),
              lease: float | None = None) -> Claim | None:
        """Claim the next claimable task of ``queues`` (oldest available first), or ``None``."""
        claims = self.claim_batch(owner, 1, queues=queues, lease=lease)
        return claims[0] if claims else None

    def claim_batch(self, owner: str, limit: int, *, queues: Sequence[str] | str = ("default",),
                    lease: float | None = None,
                    per_queue: Mapping[str, int] | None = None) -> list[Claim]:
        """Claim up to ``limit`` tasks in one transaction, the first of ``queues`` in claim
        order (priority, then availability, then arrival), handed back in that order; of a
        queue named in ``per_queue``, at most that many (a worker's own cap on the queue,
        apart from any global limit)."""
        check_text(owner, "owner", max_bytes=self._settings.limits.text_bytes)
        check_limit(limit)
        names = check_queues(queues, self._settings.limits)
        caps = _per_queue(per_queue, names)
        seconds = self._lease(lease, self._settings.lease)
        wanted = [name for name in names if caps.get(name, limit) > 0]
        if not wanted:
            return []
        return self._db.write_if(
            tasks.CLAIM, lambda tx: tasks.due(tx, wanted), lambda tx: tasks.claim(
                tx, self._settings, owner=owner, queues=names, limit=limit, lease=seconds,
                per_queue=caps), otherwise=[])

    def renew(self, claim: Claim, *, lease: float | None = None) -> Claim:
        """Extend ``claim``'s lease; returns the claim with its new ``lease_until``."""
        check_claim(claim)
        seconds = self._lease(lease, self._settings.lease)
        return self._db.write(tasks.RENEW, lambda tx: tasks.renew(tx, claim, lease=seconds))

    def finish(self, claim: Claim, result: Any = None, *, follow_ups: Sequence[FollowUp] = (),
               waits: Sequence[OpenWait] = (), charge: int = 0,
               side_effects: Sequence[SideEffect] = ()) -> list[WaitOpening]:
        """Mark the task done with ``result``; its reply, its follow-ups and its waits commit
        with it, in one transaction.

        A task that asks the outside world finishes by opening its wait (``OpenWait``, whose
        ``task_id`` is this task): the answer later resumes the flow with a follow-up of this
        task. ``charge`` cost units are charged to the task's chain first, so its follow-ups
        see what the chain has left: those past a budget are stored ``budget_exhausted`` (or
        ``hop_limit``) with their replies, and never run. Each of ``side_effects`` consumes a
        use of a human's approval of exactly its action, resource and data, and is recorded
        with it (``side_effects``): the external effect is performed from that record after
        the commit. Returns the openings, in order. Raises ``Fenced`` if the claim is no
        longer current, ``NotApproved`` if a side effect has no usable approval and
        ``WaitNotOpened`` if a wait cannot open; in each case nothing is written.
        """
        check_claim(claim)
        result_json = check_json(result, "result", limits=self._settings.limits,
                                 require_object=False)
        children = _follow_ups(self._settings, claim, follow_ups)
        opens = _waits(self._settings, claim, waits)
        units = _charge(charge)
        effects = _effects(self._settings, side_effects)
        asks = _asks(self._settings, waits)
        return self._db.write(tasks.FINISH, lambda tx: tasks.finish(
            tx, self._settings, claim, result_json=result_json, follow_ups=children,
            opens=opens, charge=units, effects=effects, asks=asks))

    def finish_batch(self, items: Iterable[tuple[Claim, Any]]) -> None:
        """Finish several claims in one transaction; if any is fenced, none is finished."""
        prepared = []
        for index, item in enumerate(check_batch(items, "items")):
            claim, result = check_pair(item, f"items[{index}]")
            prepared.append((_indexed(index, check_claim, claim, prefix="items"),
                             _indexed(index, check_json, result, "result", prefix="items",
                                      limits=self._settings.limits, require_object=False)))

        def each(tx: Tx) -> None:
            for claim, result_json in prepared:
                tasks.finish(tx, self._settings, claim, result_json=result_json, follow_ups=())

        self._db.write_batch(tasks.FINISH,
                           lambda tx: tasks.finish_all(tx, self._settings, prepared), each)

    def fail(self, claim: Claim, reason: str, *, retryable: bool = True) -> TaskState:
        """Report a failure; returns ``pending`` (retry after backoff) or ``failed``."""
        check_claim(claim)
        check_text(reason, "reason", max_bytes=4096)
        check_bool(retryable, "retryable")
        delay = self._settings.backoff.delay(claim.attempt, self._rng)
        return self._db.write(tasks.FAIL, lambda tx: tasks.fail(
            tx, self._settings, claim, reason=reason, retryable=retryable, delay=delay))

    def release(self, claim: Claim, *, delay: float = 0.0) -> None:
        """Hand a claimed task back unfinished, claimable again after ``delay`` seconds.

        For a worker that stops (a graceful shutdown): not a failure, so the attempt is given
        back (``attempts - 1``; the fence never goes back) and however often workers stop,
        the task keeps all of its ``max_attempts``. ``Fenced`` (nothing written) if the claim
        is no longer current, as for ``finish``.
        """
        check_claim(claim)
        seconds = _delay(delay)
        self._db.write(tasks.RELEASE, lambda tx: tasks.release(
            tx, self._settings, claim, delay=seconds))

    def settle(self, outcomes: Iterable[Settlement]) -> list[Settled]:
        """Commit many handlers' outcomes (``Finished``, ``Failed``, ``Released``) in one
        transaction: a worker's group commit, one fsync for all.

        Each outcome is fenced and atomic on its own, exactly as ``finish``, ``fail`` or
        ``release`` would apply it: one that is refused (its claim is not current, a wait
        cannot open, a follow-up collides, an argument is invalid) is reported with its
        error in its ``Settled``, writes nothing, and costs the others nothing. Returns one
        ``Settled`` per outcome, in order, once the transaction committed; a failure of the
        transaction itself (the database unavailable) raises, and then nothing committed.
        """
        settled, _ = self._settle(outcomes, None)
        return settled

    def settle_and_claim(self, outcomes: Iterable[Settlement], owner: str, limit: int, *,
                         queues: Sequence[str] | str = ("default",),
                         lease: float | None = None, per_queue: Mapping[str, int] | None = None,
                         ) -> tuple[list[Settled], list[Claim]]:
        """``settle(outcomes)`` and ``claim_batch(owner, limit, ...)`` in one transaction:
        a busy worker hands its handlers' outcomes in and takes the next tasks with one
        commit. Both halves are exactly what the two calls would do (each outcome fenced
        and atomic on its own, the claims swept and guarded), and both are returned only
        once the transaction committed."""
        check_text(owner, "owner", max_bytes=self._settings.limits.text_bytes)
        check_limit(limit)
        names = check_queues(queues, self._settings.limits)
        caps = _per_queue(per_queue, names)
        seconds = self._lease(lease, self._settings.lease)
        return self._settle(outcomes, lambda tx: tasks.claim(
            tx, self._settings, owner=owner, queues=names, limit=limit, lease=seconds,
            per_queue=caps))

    def _settle(self, outcomes: Iterable[Settlement],
                then: Callable[[Tx], list[Claim]] | None) -> tuple[list[Settled], list[Claim]]:
        prepared: dict[int, tasks.Settling] = {}
        refused: dict[int, Settled] = {}
        for index, outcome in enumerate(check_batch(outcomes, "outcomes")):
            try:
                prepared[index] = _indexed(index, _settling, self._settings, self._rng,
                                           outcome, prefix="outcomes")
            except (InvalidInput, Unauthorized) as exc:
                claim = getattr(outcome, "claim", None)
                refused[index] = Settled(task_id=getattr(claim, "task_id", ""), error=exc)
        ordered = sorted(prepared)

        def work(tx: Tx) -> tuple[list[Settled], list[Claim]]:
            done = tasks.settle(tx, self._settings, [prepared[index] for index in ordered])
            return done, then(tx) if then is not None else []

        done, claims = (self._db.write(tasks.SETTLE, work) if ordered or then is not None
                        else ([], []))
        refused.update(zip(ordered, done, strict=True))
        return [refused[index] for index in range(len(refused))], claims

    def renew_all(self, claims: Iterable[Claim], *,
                  lease: float | None = None) -> list[Claim | Fenced]:
        """Extend many claims' leases in one transaction (a worker renews all of its running
        handlers together). One answer per claim, in order: the renewed claim, or the
        ``Fenced`` that says why it is no longer current (nothing written for it)."""
        checked = [check_claim(claim, f"claims[{index}]")
                   for index, claim in enumerate(check_batch(claims, "claims"))]
        seconds = self._lease(lease, self._settings.lease)
        if not checked:
            return []
        return self._db.write(tasks.RENEW_ALL, lambda tx: tasks.renew_all(
            tx, checked, lease=seconds))

    # -- operators' flow control: re-runs, paused and limited queues -------------------------

    def retry(self, task_id: str, *, operator: str, reason: str,
              deadline: float | None = None, request_id: str | None = None) -> Retry:
        """Run a failed, expired or cancelled task again: a recorded operator decision (who,
        when, why) that makes a new task linked to the old one (``retry_of``), never a
        rewrite of the old task's terminal state or its reply.

        The new task has the old one's payload, queue, limits, priority, chain and requester;
        its deadline is ``deadline``, or as far from now as the old one's was from its
        creation. ``Conflict`` for a task in another state, ``NotFound`` for none.

        With ``request_id`` the decision is idempotent: calling again with the same id (say
        after ``OutcomeUnknown``) returns the re-run the first call made instead of making
        a second; the same id with another operator or reason is a ``PayloadCollision``.
        """
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        check_text(reason, "reason", max_bytes=4096)
        when = None if deadline is None else check_number(deadline, "deadline")
        request = None if request_id is None else check_text(
            request_id, "request_id", max_bytes=self._settings.limits.text_bytes)
        return self._db.write(tasks.RETRY, lambda tx: tasks.retry(
            tx, self._settings, task_id, operator=operator, reason=reason, deadline=when,
            request_id=request))

    def retry_many(self, *, operator: str, reason: str,
                   state: TaskState | str | None = None, queue: str | None = None,
                   created_after: float | None = None, created_before: float | None = None,
                   dry_run: bool = False, limit: int = 1000,
                   request_id: str | None = None) -> list[Task | Retry]:
        """Run again every failed, expired or cancelled task that the filters name (``state``
        one of those three, or all of them), at most ``limit``, newest first, each its own
        recorded decision in a transaction of its own. With ``dry_run``, only list the tasks
        that would be run again (as ``Task``), writing nothing. A ``request_id`` is each
        task's own (see ``retry``): the same bulk request sent again, after it stopped half
        way or its answer was lost, re-runs each task once."""
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        check_text(reason, "reason", max_bytes=4096)
        if request_id is not None:
            check_text(request_id, "request_id", max_bytes=self._settings.limits.text_bytes)
        check_bool(dry_run, "dry_run")
        check_limit(limit)
        states = ([status.check_state(state, TaskState)] if state is not None
                  else sorted(tasks.RERUNNABLE))
        if any(wanted not in tasks.RERUNNABLE for wanted in states):
            raise InvalidInput("state", f"only failed, expired or cancelled tasks can be run "
                                        f"again, not {states[0].value}")
        chosen: list[Task] = []
        for wanted in states:
            cursor: str | None = None
            while len(chosen) < limit:
                page = self.list_tasks(state=wanted, queue=queue, created_after=created_after,
                                       created_before=created_before,
                                       limit=min(1000, limit - len(chosen)), cursor=cursor)
                chosen.extend(page.items)
                cursor = page.next_cursor
                if cursor is None:
                    break
        if dry_run:
            return list(chosen)
        return [self.retry(task.task_id, operator=operator, reason=reason,
                           request_id=request_id) for task in chosen]

    def retries(self, task_id: str) -> list[Retry]:
        """The recorded re-runs of ``task_id``, oldest first."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: [Retry.from_row(row) for row in tx.all(
            "task_retries_of", task_id=task_id)])

    def pause_queue(self, queue: str, *, operator: str, reason: str) -> bool:
        """Pause ``queue`` for every host, durably: none of its tasks is claimed until
        ``resume_queue`` (running ones finish). ``False`` if it was paused already."""
        check_text(queue, "queue", max_bytes=self._settings.limits.text_bytes)
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        check_text(reason, "reason", max_bytes=4096)
        return self._db.write(queues.PAUSE, lambda tx: queues.pause(
            tx, queue, operator=operator, reason=reason))

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused queue; ``False`` if it was not paused."""
        check_text(queue, "queue", max_bytes=self._settings.limits.text_bytes)
        return self._db.write(queues.RESUME, lambda tx: queues.resume(tx, queue))

    def paused_queues(self) -> list[queues.Paused]:
        """Every paused queue: who paused it, when and why."""
        return self._db.read(queues.paused)

    def set_queue_limit(self, queue: str, running: int | None) -> None:
        """Let at most ``running`` tasks of ``queue`` run at once across every host (``None``
        lifts the limit). Enforced when tasks are claimed; lowering it stops nothing."""
        check_text(queue, "queue", max_bytes=self._settings.limits.text_bytes)
        if running is not None:
            check_int(running, "running", low=1, high=queues.MAX_LIMIT)
        self._db.write(queues.LIMIT, lambda tx: queues.set_limit(tx, queue, running))

    def queue_limits(self) -> dict[str, int]:
        """Every limited queue and how many of its tasks may run at once."""
        return self._db.read(queues.limits)

    # -- periodic schedules ---------------------------------------------------------------------

    def add_schedule(
            self, name: str, cron: str, *, operator: str, queue: str = "default",
            payload: Any = None, priority: int = 0, max_attempts: int = 3,
            ttl: float | None = None, missed: str = "once", zone: str | None = None,
            replace: bool = False) -> Periodic:
        """Enqueue one task of ``payload`` (``{}`` if ``None``) on ``queue`` per period of
        ``cron`` (5 fields, in ``zone``: an IANA name, ``None`` for UTC), for every host at
        once; the first period is the first fire time after now.

        Each task has ``priority`` and ``max_attempts`` and the deadline ``period start +
        ttl`` (``None``: the next period's start). ``missed`` (``once`` or ``skip``) says what
        happens after an outage or a pause that let a whole period pass (see
        ``postroom.schedules``). Adding a schedule again with the same definition changes
        nothing; with another one it is a ``Conflict`` unless ``replace`` (the periods it
        handled stay handled). ``InvalidInput`` names a field that cannot be.
        """
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        check_bool(replace, "replace")
        definition = schedules.check(
            self._settings, name=name, cron=cron, zone=zone, queue=queue,
            payload={} if payload is None else payload, priority=priority,
            max_attempts=max_attempts, ttl=ttl, missed=missed)
        return self._db.write(schedules.ADD, lambda tx: schedules.add(
            tx, definition, operator=operator, replace=replace))

    def schedule(self, name: str) -> Periodic:
        """The schedule ``name``; ``NotFound`` if there is none."""
        check_text(name, "name", max_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: schedules.get(tx, name))

    def schedules(self) -> list[Periodic]:
        """Every schedule, by name."""
        return self._db.read(schedules.listed)

    def pause_schedule(self, name: str, *, operator: str) -> bool:
        """Enqueue nothing for ``name`` until ``resume_schedule``; ``False`` if it was paused
        already, ``NotFound`` if there is no such schedule."""
        return self._pause_schedule(name, operator, paused=True)

    def resume_schedule(self, name: str, *, operator: str) -> bool:
        """Let ``name`` enqueue again; the periods its pause let pass are handled by its
        missed policy (never more than one task for them). ``False`` if it was not paused."""
        return self._pause_schedule(name, operator, paused=False)

    def _pause_schedule(self, name: str, operator: str, *, paused: bool) -> bool:
        check_text(name, "name", max_bytes=self._settings.limits.text_bytes)
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        return self._db.write(schedules.PAUSE if paused else schedules.RESUME,
                              lambda tx: schedules.set_paused(tx, name, paused=paused,
                                                              operator=operator))

    def remove_schedule(self, name: str) -> bool:
        """Forget the schedule ``name``; the tasks it enqueued stay. ``False`` if none."""
        check_text(name, "name", max_bytes=self._settings.limits.text_bytes)
        return self._db.write(schedules.REMOVE, lambda tx: schedules.remove(tx, name))

    def enqueue_due_schedules(self, *, limit: int = 100) -> list[Ack]:
        """One round of at most ``limit`` schedules whose next period has begun, each in this
        one transaction with the task of its period (at the store's trusted time). Returns
        each task's ACK (``duplicate``: another round had stored that period already). Any
        number of hosts may run rounds at once: a period is one task whoever enqueues it."""
        check_limit(limit)
        return self._db.write_if(schedules.ENQUEUE, schedules.due, lambda tx: (
            schedules.enqueue_due(tx, self._settings, limit=limit)), otherwise=[])

    def cancel(self, task_id: str, *, reason: str = "cancelled") -> bool:
        """Cancel a pending or running task, and when it is a chain's root, every live task
        of its chain (each fenced as a single cancel is; the chain's later work is born
        cancelled). ``False`` if nothing was left to cancel."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        check_text(reason, "reason", max_bytes=4096)
        return self._db.write(tasks.CANCEL, lambda tx: tasks.cancel(
            tx, self._settings, task_id, reason=reason))

    def sweep(self, *, leases: bool = True, deadlines: bool = True) -> Swept:
        """Recover expired leases (tasks and deliveries) and expire passed deadlines.

        Runs bounded sweeps (``sweep_limit`` records per transaction) until none is left;
        ``leases=False`` or ``deadlines=False`` leaves that half to another sweeper. With
        nothing to do it takes no write lock on SQLite (it looks first).
        """
        check_bool(leases, "leases")
        check_bool(deadlines, "deadlines")
        totals = Swept()

        def due(tx: Tx) -> bool:
            row = tx.one("sweep_due", now=tx.now, leases=int(leases), deadlines=int(deadlines))
            return bool(row is not None and row["due"])

        def once(tx: Tx) -> Swept:
            counts = tasks.SweepCounts()
            tasks.sweep(tx, self._settings, counts, leases=leases, deadlines=deadlines)
            recovered, dead = (outbox.sweep_replies(tx, self._settings) if leases
                               else (0, 0))
            return Swept(leases_recovered=counts.recovered,
                         attempts_exhausted=counts.exhausted,
                         deadlines_expired=counts.deadlines_expired,
                         deliveries_recovered=recovered, deliveries_dead=dead)

        while True:
            step = self._db.write_if(tasks.SWEEP, due, once, otherwise=Swept())
            totals = Swept(**{name: getattr(totals, name) + getattr(step, name)
                              for name in totals.__slots__})
            if step.total == 0:
                return totals

    def task(self, task_id: str) -> Task:
        """The task ``task_id`` as stored; ``NotFound`` if there is none."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: status.task(tx, task_id))

    def tasks_of(self, task_ids: Iterable[str]) -> list[Task | None]:
        """The tasks ``task_ids`` (at most ``MAX_BATCH``) as stored, read in one snapshot, in
        order: ``None`` where there is none."""
        wanted = check_batch(task_ids, "task_ids")
        for index, task_id in enumerate(wanted):
            check_text(task_id, f"task_ids[{index}]", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: status.tasks_of(tx, wanted))

    def story(self, task_id: str) -> TaskStory:
        """Everything durable about a task, read in one snapshot: the task, each attempt to
        run it (owner, fence, start, end, how it ended, its error), its reply and each
        delivery attempt, the requeues of that reply and the waits it opened. The attempts
        are kept in the task's own row, so they are pruned with it. ``NotFound`` if there is
        no such task."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: status.story(tx, self._settings, task_id))

    def chain(self, task_id: str) -> Chain:
        """The chain ``task_id`` belongs to (its root, budgets and what it spent);
        ``NotFound`` if there is no such task."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)

        def read(tx: Tx) -> Chain:
            task = status.task(tx, task_id)
            return chains.get(tx, self._settings, task.root_task_id or task.task_id)

        return self._db.read(read)

    def reply(self, task_id: str) -> Reply | None:
        """The reply of task ``task_id``, or ``None`` while the task is not terminal."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: status.reply(tx, task_id))

    def requeues(self, reply_id: str) -> list[Requeue]:
        """The recorded operator decisions to resend ``reply_id``, oldest first."""
        check_text(reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        return self._db.read(lambda tx: status.requeues(tx, reply_id))

    # -- delivery -------------------------------------------------------------------------------

    def claim_replies(self, owner: str, *, limit: int = 1, lease: float | None = None,
                      routed: bool = False) -> list[ReplyClaim]:
        """Claim up to ``limit`` replies due for delivery (``sending``, leased, fenced).

        ``routed=True`` claims for the requesters' endpoints: a reply whose requester has no
        enabled endpoint is parked instead, without spending an attempt, until one is added
        or enabled (so fewer than ``limit`` may come back while more are due: claim again);
        a reply's first attempt fixes its delivery budget to its endpoint's.
        """
        check_text(owner, "owner", max_bytes=self._settings.limits.text_bytes)
        check_limit(limit)
        check_bool(routed, "routed")
        seconds = self._lease(lease, self._settings.dispatch_lease)
        return self._db.write_if(outbox.DISPATCH_CLAIM, outbox.replies_due,
                                 lambda tx: outbox.claim_replies(
                                     tx, self._settings, owner=owner, limit=limit,
                                     lease=seconds, routed=routed), otherwise=[])

    def _retry_delay(self, claim: ReplyClaim, outcome: Outcome) -> float:
        """When a transient failure is tried again: as the outcome asks (an endpoint's
        schedule, a ``Retry-After``), else after the store's ``delivery_backoff``."""
        if outcome.delay is not None:
            return outcome.delay
        return self._settings.delivery_backoff.delay(claim.attempt, self._rng)

    def record_delivery(self, claim: ReplyClaim, outcome: Outcome) -> ReplyState:
        """Record one delivery outcome; ``Fenced`` if another publisher holds the reply.

        ``gone`` also disables the requester's endpoint, in the same transaction.
        """
        check_reply_claim(claim)
        check_outcome(outcome)
        delay = self._retry_delay(claim, outcome)
        return self._db.write(outbox.DISPATCH_RECORD, lambda tx: outbox.record(
            tx, claim, outcome, delay=delay))

    def release_replies(self, claims: Iterable[ReplyClaim], *, delay: float = 0.0) -> list[str]:
        """Hand claimed replies back unsent, in one transaction: claimable again after
        ``delay`` seconds, each with its attempt given back (the fence never goes back).

        For a dispatcher that stops before sending them, or finds their endpoint busy, gone
        or removed. Returns the ids of those no longer held by these claims (left as they
        are, as ``record_deliveries`` reports its fenced ones).
        """
        checked = [_indexed(index, check_reply_claim, claim, prefix="claims")
                   for index, claim in enumerate(check_batch(claims, "claims"))]
        seconds = check_number(delay, "delay")
        if not 0 <= seconds <= MAX_DELAY:
            raise InvalidInput("delay", f"must be in 0..{MAX_DELAY:g} seconds, got {delay!r}")
        if not checked:
            return []
        return self._db.write(outbox.RELEASE, lambda tx: outbox.release_all(
            tx, checked, delay=seconds))

    def record_deliveries(self, pairs: Iterable[tuple[ReplyClaim, Outcome]]) -> DispatchReport:
        """Record several outcomes in one transaction; fenced ones are reported, not raised."""
        return self._record(pairs, None)[0]

    def record_and_claim(self, pairs: Iterable[tuple[ReplyClaim, Outcome]], owner: str, *,
                         limit: int = 1, lease: float | None = None, routed: bool = False,
                         ) -> tuple[DispatchReport, list[ReplyClaim]]:
        """``record_deliveries(pairs)`` and ``claim_replies(owner, ...)`` in one transaction:
        a busy dispatcher records what it delivered and takes the next replies with one
        commit. Both halves are exactly what the two calls would do (each outcome fenced on
        its own claim, the claims swept and leased), returned once the transaction committed.
        """
        check_text(owner, "owner", max_bytes=self._settings.limits.text_bytes)
        check_limit(limit)
        check_bool(routed, "routed")
        seconds = self._lease(lease, self._settings.dispatch_lease)
        return self._record(pairs, lambda tx: outbox.claim_replies(
            tx, self._settings, owner=owner, limit=limit, lease=seconds, routed=routed))

    def _record(self, pairs: Iterable[tuple[ReplyClaim, Outcome]],
                then: Callable[[Tx], list[ReplyClaim]] | None,
                ) -> tuple[DispatchReport, list[ReplyClaim]]:
        checked = []
        for index, item in enumerate(check_batch(pairs, "pairs")):
            claim, outcome = check_pair(item, f"pairs[{index}]")
            checked.append((_indexed(index, check_reply_claim, claim, prefix="pairs"),
                            _indexed(index, check_outcome, outcome, prefix="pairs")))
        items = [(claim, outcome, self._retry_delay(claim, outcome))
                 for claim, outcome in checked]
        def bulk(tx: Tx) -> _Recorded:
            counts = dict.fromkeys(ReplyState, 0)
            for state in outbox.record_all(tx, items):
                counts[state] += 1
            return counts, [], then(tx) if then is not None else []

        def each(tx: Tx) -> _Recorded:
            counts = dict.fromkeys(ReplyState, 0)
            fenced: list[str] = []
            for claim, outcome, delay in items:
                try:
                    counts[outbox.record(tx, claim, outcome, delay=delay)] += 1
                except Fenced:
                    fenced.append(claim.reply_id)
            return counts, fenced, then(tx) if then is not None else []

        counts, fenced, claims = self._db.write_batch(outbox.DISPATCH_RECORD, bulk, each)
        return DispatchReport(claimed=len(items), sent=counts[ReplyState.SENT],
                              retrying=counts[ReplyState.PENDING],
                              dead=counts[ReplyState.DEAD], fenced=fenced), claims

    def dispatch(self, transport: Transport, *, owner: str = "dispatcher", limit: int = 1,
                 lease: float | None = None) -> DispatchReport:
        """One dispatch step: claim due replies, deliver them, record what happened."""
        claims = self.claim_replies(owner, limit=limit, lease=lease)
        if not claims:
            return DispatchReport()
        outcomes = transports.deliver(transport, claims)
        return self.record_deliveries(zip(claims, outcomes, strict=True))

    def requeue_reply(self, reply_id: str, *, operator: str, reason: str) -> None:
        """Send a dead reply again: a recorded operator decision (who, when, why).

        Reconcile with the receiver by ``reply_id`` first: it may hold the reply already,
        in which case the redelivery is acknowledged as a duplicate with no second effect.
        """
        check_text(reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        check_text(operator, "operator", max_bytes=self._settings.limits.text_bytes)
        check_text(reason, "reason", max_bytes=4096)
        self._db.write(outbox.REQUEUE, lambda tx: outbox.requeue(
            tx, reply_id, operator=operator, reason=reason))

    # -- endpoints ------------------------------------------------------------------------------

    def add_endpoint(self, principal: str, url: str, *, allow_private: bool = False,
                     schedule: str | Sequence[float] = "default", budget: int | None = None,
                     concurrency: int = DEFAULT_CONCURRENCY) -> Endpoint:
        """Deliver ``principal``'s replies to ``url`` from now on; returns the endpoint with
        its first signing secret (newly made: show it to its owner once).

        ``schedule`` is a preset's name (``endpoints.SCHEDULES``) or delays in seconds;
        ``budget`` the attempts per reply (the store's ``delivery_budget`` if ``None``);
        ``concurrency`` the deliveries in flight to it at once. ``allow_private`` lets the
        sender connect to loopback, private and link-local addresses. Replies parked for
        ``principal`` are due at once. ``Conflict`` if it already has an endpoint.
        """
        request = endpoints.check_request(
            self._settings, principal=principal, url=url, allow_private=allow_private,
            schedule=schedule, budget=budget, concurrency=concurrency)
        secret = signing.new_secret()
        return self._db.write(endpoints.ADD, lambda tx: endpoints.add(tx, request, secret))

    def endpoint(self, principal: str) -> Endpoint:
        """``principal``'s endpoint; ``NotFound`` if it has none."""
        self._principal(principal)
        return self._db.read(lambda tx: endpoints.get(tx, principal))

    def endpoints(self, principals: Iterable[str] | None = None) -> dict[str, Endpoint]:
        """Every endpoint by principal (or those of ``principals`` that have one), read in one
        snapshot."""
        if principals is None:
            return self._db.read(lambda tx: {found.principal: found
                                             for found in endpoints.listed(tx)})
        names = list(dict.fromkeys(self._principal(name)
                                   for name in check_batch(principals, "principals")))

        def read(tx: Tx) -> dict[str, Endpoint]:
            return {name: found for name in names
                    if (found := endpoints.find(tx, name)) is not None}

        return self._db.read(read)

    def remove_endpoint(self, principal: str) -> bool:
        """Forget ``principal``'s endpoint and its secrets; ``False`` if it had none. Its
        replies wait (parked, budget kept) until another is added."""
        self._principal(principal)
        return self._db.write(endpoints.REMOVE, lambda tx: endpoints.remove(tx, principal))

    def rotate_endpoint_secret(self, principal: str, *,
                               expire_old_after: float | None = None) -> Endpoint:
        """Add a new signing secret (it comes first in ``Endpoint.secrets``: show it once).

        Deliveries are signed with every active secret, so receivers can move to the new one
        at their pace; with ``expire_old_after`` the older ones stop signing that many
        seconds from now (0: at once). ``NotFound`` if ``principal`` has no endpoint.
        """
        self._principal(principal)
        grace = None
        if expire_old_after is not None:
            grace = check_number(expire_old_after, "expire_old_after")
            if not 0 <= grace <= MAX_DELAY:
                raise InvalidInput("expire_old_after", f"must be in 0..{MAX_DELAY:g} seconds")
        secret = signing.new_secret()
        return self._db.write(endpoints.CHANGE, lambda tx: endpoints.rotate(
            tx, principal, secret, expire_old_after=grace))

    def disable_endpoint(self, principal: str, *,
                         reason: str = "disabled by an operator") -> Endpoint:
        """Stop delivering to ``principal``'s endpoint (its replies wait, budget kept)."""
        self._principal(principal)
        check_text(reason, "reason", max_bytes=4096)
        return self._db.write(endpoints.CHANGE, lambda tx: endpoints.disable(
            tx, principal, reason))

    def enable_endpoint(self, principal: str) -> Endpoint:
        """Deliver to ``principal``'s endpoint again; the replies that waited are due now."""
        self._principal(principal)
        return self._db.write(endpoints.CHANGE, lambda tx: endpoints.enable(tx, principal))

    def awaiting_endpoints(self) -> dict[str, int]:
        """How many replies wait for an endpoint (parked, their budget kept), by requester."""
        return self._db.read(endpoints.awaiting)

    def _principal(self, principal: str) -> str:
        return check_text(principal, "principal", max_bytes=self._settings.limits.text_bytes)

    # -- principals of the HTTP service ----------------------------------------------------

    def add_principal(self, name: str, role: principals.Role | str, *,
                      queues: Sequence[str] = ()) -> principals.Issued:
        """Add a principal with ``role`` (a worker with the ``queues`` it is granted) and
        make its first token: ``Issued.token`` is shown once, only its hash is kept.
        ``Conflict`` if the name was ever taken."""
        new = principals.check_new(self._settings, name, role, queues)
        return self._db.write(principals.ADD, lambda tx: principals.add(tx, new))

    def principal(self, name: str) -> principals.Principal:
        """The principal ``name`` (revoked ones too); ``NotFound`` if there is none."""
        self._principal(name)
        return self._db.read(lambda tx: principals.get(tx, name))

    def list_principals(self) -> list[principals.Principal]:
        """Every principal, by name, revoked ones included."""
        return self._db.read(principals.listed)

    def revoke_principal(self, name: str) -> bool:
        """Revoke ``name``: its tokens stop working at once, its name stays taken.
        ``False`` if it was revoked already; ``NotFound`` if there is no such principal."""
        self._principal(name)
        return self._db.write(principals.CHANGE, lambda tx: principals.revoke(tx, name))

    def rotate_token(self, name: str, *, overlap: float = 0.0) -> principals.Issued:
        """Make a new token for ``name`` (shown once); its older ones stop working
        ``overlap`` seconds from now (0: at once). ``NotFound`` for a missing or revoked
        principal."""
        self._principal(name)
        seconds = principals.check_overlap(overlap)
        return self._db.write(principals.CHANGE, lambda tx: principals.rotate(
            tx, name, overlap=seconds))

    def authenticate(self, token: str) -> principals.Principal:
        """The active principal whose bearer token ``token`` is; ``Unauthorized`` otherwise
        (the same message whatever failed). One indexed read, no write."""
        def read(tx: Tx) -> principals.Principal:
            return principals.authenticate(tx, token)

        return self._db.read(read)

    @contextmanager
    def confirming(self, token: str, principal: principals.Principal) -> Iterator[Confirmed]:
        """Within the block, every transaction this thread runs on the store first confirms
        that ``token`` still authenticates as ``principal`` (one indexed read in the same
        transaction): once the token is revoked, rotated out or expired, a call writes and
        reads nothing and raises ``Unconfirmed``.

        A service that keeps the principals of tokens it has seen can skip ``authenticate``'s
        transaction and stay exactly as strict. The ``Confirmed`` it yields counts the
        transactions that confirmed the token: a block that ran none confirmed nothing.
        """
        confirmed = Confirmed()
        lookup = principals.token_lookup(token)
        if lookup is None:
            raise Unconfirmed("the token no longer authenticates its principal")

        def confirm(tx: Tx, row: Row | None) -> None:
            # A transaction that decides nothing by time has no time of its own (0).
            now = tx.now or finite_time(self._db.clock.now())
            try:
                current = principals.judge_token(token, row, now)
            except Unauthorized:
                raise Unconfirmed("the token no longer authenticates its principal") from None
            if current != principal:
                raise Unconfirmed("the token authenticates another principal")
            confirmed.transactions += 1

        with self._db.checking(Check("principal_token_get", lookup, confirm)):
            yield confirmed

    # -- waiting for work -----------------------------------------------------------------------

    def waiter(self, queues: Sequence[str] | str = ("default",), *,
               replies: bool = False) -> Waiter:
        """A ``Waiter`` whose ``wait(timeout)`` returns as soon as work may be available.

        It wakes when a task of ``queues`` becomes claimable (received, or a follow-up
        committed) and, with ``replies=True``, when a reply becomes due for delivery. On
        PostgreSQL it hears commits made by any process on any host (LISTEN/NOTIFY on a
        connection of the store's own, reconnected if lost, with a wake-up after every
        reconnect); on SQLite it hears this store's commits at once, and other processes'
        within a millisecond or two (a watcher thread of the store's, see
        ``postroom.db.sqlite_watcher``), which wake every waiter: SQLite does not say what
        another connection's commit was for. The ``timeout`` of ``wait`` is the polling
        interval for everything else: work that becomes claimable by the passage of time (a
        retry's backoff, a recovered lease) is found by that poll.
        """
        names = check_queues(queues, self._settings.limits, required=False)
        if not names and not replies:
            raise InvalidInput("queues", "name at least one queue, or ask for replies")
        self._db.dialect.listen()
        return Waiter(self._db.dialect.wakeups,
                      [*names, REPLIES_CHANNEL] if replies else names)

    # -- waits, signals, timeouts, continuations -------------------------------------------

    def open_wait(self, flow: str, step: str, expected_generation: int, deadline: float, *,
                  request_id: str | None = None, task_id: str | None = None,
                  responder: str | None = None) -> WaitOpening:
        """Open generation ``expected_generation + 1`` of the wait ``(flow, step)``.

        A compare-and-set on the slot's current generation (0 before the first wait):
        ``opened``, or ``stale`` (someone else moved the slot), ``busy`` (the current
        generation is still waiting), ``pending_continuation`` (it ended but its continuation
        is not consumed yet). With ``request_id``, a retry of a registration that committed
        replays its ``opened`` answer (``replay=True``) instead of ``stale``; the same id with
        other arguments is a ``PayloadCollision``. ``task_id`` names the parent of the
        follow-up task that ``resume`` enqueues; it must exist. With ``responder``, the wait
        adopts only that principal's answer: another's signal is ``Unauthorized`` and leaves
        no receipt.
        """
        request = waits.check_open(self._settings, flow=flow, step=step,
                                   expected_generation=expected_generation, deadline=deadline,
                                   request_id=request_id, task_id=task_id, responder=responder)
        return self._db.write(waits.OPEN_WAIT, lambda tx: waits.open_wait(tx, request))

    def signal(  # noqa: PLR0917 - SPEC §5's signature: the event, then the wait's address
            self, auth: AuthContext, event_id: str, flow: str, step: str, generation: int,
            value: Any) -> SignalReceipt:
        """Deliver an answer to one wait generation; the receipt is durable before it returns.

        ``accepted`` (the wait was waiting and ``now < deadline``: it is signaled and a
        ``signal`` continuation carries ``value``), ``too_late`` (its deadline had passed: the
        signal times it out), ``stale_generation``, ``closed`` or ``unknown_wait``. The same
        ``event_id`` from the same principal again is a ``replay`` of the original receipt
        whatever the state or time now, or a ``conflict`` if its body differs; neither writes.
        """
        request = waits.check_signal(self._settings, auth, event_id=event_id, flow=flow,
                                     step=step, generation=generation, value=value)
        return self._db.write(waits.SIGNAL, lambda tx: waits.signal(tx, request))

    def expire(self, flow: str, step: str, generation: int) -> ExpireResult:
        """Time out one wait generation if it is still waiting and its deadline has come."""
        address = waits.check_address(self._settings, flow, step, generation)
        return self._db.write(waits.EXPIRE, lambda tx: waits.expire(tx, address))

    def expire_due(self) -> int:
        """Time out every due wait, ``sweep_limit`` per transaction; returns how many."""
        total = 0
        while True:
            timed_out, seen = self._db.write_if(
                waits.EXPIRE_DUE, lambda tx: tx.one("waits_due_any", now=tx.now) is not None,
                lambda tx: waits.expire_due(tx, self._settings), otherwise=(0, 0))
            total += timed_out
            if seen < self._settings.sweep_limit:
                return total

    def resume(self, flow: str, step: str, generation: int,
               effect: FollowUp | None) -> Resumption:
        """Consume a generation's continuation and apply its local effect in one transaction.

        The standard effect is a ``FollowUp``: a task with the wait's ``task_id`` as parent
        and the parent's hops + 1; its queue and deadline default to the parent's (give
        ``deadline=`` when the answer may come after the parent's own deadline). ``None``
        consumes the continuation with no follow-up. ``resumed`` the
        first time; ``replay`` afterwards (with the first effect's task), never a second
        effect. ``NotFound`` if the generation has no continuation (yet).
        """
        address = waits.check_address(self._settings, flow, step, generation)
        checked = waits.check_effect(self._settings, effect)
        return self._db.write(waits.RESUME, lambda tx: waits.resume(
            tx, self._settings, address, checked))

    def continuations(self, *, limit: int = 100, step: str | None = None) -> list[Continuation]:
        """Unconsumed continuations, oldest first: after a restart, what is left to resume
        (only those of waits at ``step``, if given)."""
        check_limit(limit)
        if step is not None:
            check_text(step, "step", max_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: waits.continuations(tx, limit, step))

    def wait(self, flow: str, step: str, generation: int | None = None) -> Wait:
        """One wait generation as stored (the current one by default); ``NotFound`` if none."""
        limit = self._settings.limits.text_bytes
        check_text(flow, "flow", max_bytes=limit)
        check_text(step, "step", max_bytes=limit)
        if generation is not None:
            waits.check_address(self._settings, flow, step, generation)
        return self._db.read(lambda tx: waits.get_wait(tx, flow, step, generation))

    # -- human approvals of side effects ----------------------------------------------------

    def grant_approval(self, auth: AuthContext, approval_id: str, *, action: str,
                       resource: str, data: Any, expires_at: float, requested_by: str,
                       max_uses: int = 1) -> Approval:
        """Record a human's approval: ``action`` on ``resource`` carrying exactly ``data``,
        at most ``max_uses`` times, until ``expires_at``, asked for by ``requested_by``.

        Only a principal whose trusted adapter gave it the ``human`` role grants
        (``Unauthorized`` otherwise, nothing written). The grant is a durable event; a retry
        of the same grant returns the stored approval, the same ``approval_id`` with other
        terms is a ``PayloadCollision``.
        """
        request = approvals.check_grant(
            self._settings, auth, approval_id=approval_id, action=action, resource=resource,
            data=data, expires_at=expires_at, requested_by=requested_by, max_uses=max_uses)
        return self._db.write(approvals.GRANT, lambda tx: approvals.grant(tx, request))

    def revoke_approval(self, auth: AuthContext, approval_id: str, *, reason: str) -> bool:
        """Revoke an approval (its granter, or an operator): no use commits after this does.
        ``False`` if it was revoked already; ``NotFound`` if there is none."""
        principal = inbox.principal_of(self._settings, auth)
        check_text(approval_id, "approval_id", max_bytes=self._settings.limits.text_bytes)
        check_text(reason, "reason", max_bytes=4096)
        return self._db.write(approvals.REVOKE, lambda tx: approvals.revoke(
            tx, auth, principal, approval_id, reason))

    def answer_approval(
            self, auth: AuthContext, event_id: str, flow: str, step: str, generation: int,
            *, approve: bool) -> SignalReceipt:
        """The addressed human answers the approval a wait generation asks for: in one
        transaction the wait is signaled (``{"approved": ..., "approval_id": ...}``, so the
        flow resumes exactly once) and, when ``approve`` and the signal is ``accepted``, the
        approval is granted (``approvals.request_approval_id``), requested by the asking
        task. Only the wait's responder, with the human role, answers (``Unauthorized``,
        nothing written); a replay, a late or a stale answer grants nothing. ``NotFound`` if
        the generation asks for no approval."""
        human = approvals.check_human(self._settings, auth)
        check_bool(approve, "approve")
        address = waits.check_address(self._settings, flow, step, generation)
        value = {"approved": approve,
                 "approval_id": (approvals.request_approval_id(
                     address.flow, address.step, address.generation) if approve else None)}
        request = waits.check_signal(self._settings, auth, event_id=event_id, flow=flow,
                                     step=step, generation=generation, value=value)
        return self._db.write(approvals.ANSWER, lambda tx: approvals.answer(
            tx, human, request, approve=approve))

    def approval(self, approval_id: str) -> Approval:
        """The approval ``approval_id`` as stored; ``NotFound`` if there is none."""
        check_text(approval_id, "approval_id", max_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: approvals.get(tx, approval_id))

    def list_approvals(self, *, granted_by: str | None = None,
                       limit: int = 100) -> list[Approval]:
        """The newest approvals first (those ``granted_by`` granted, if given), at most
        ``limit`` (1..1000)."""
        self._optional_name(granted_by, "granted_by")
        count = check_int(limit, "limit", low=1, high=1000)
        return self._db.read(lambda tx: approvals.listed(tx, granted_by, count))

    def approval_requests(self, *, responder: str | None = None,
                          limit: int = 100) -> list[AskedApproval]:
        """The approval requests awaiting an answer (their wait still waits), addressed to
        ``responder`` if given, earliest deadline first, at most ``limit`` (1..1000)."""
        self._optional_name(responder, "responder")
        count = check_int(limit, "limit", low=1, high=1000)
        return self._db.read(lambda tx: approvals.asked(tx, responder, count))

    def _optional_name(self, name: str | None, field: str) -> None:
        if name is not None:
            check_text(name, field, max_bytes=self._settings.limits.text_bytes)

    def side_effects(self, task_id: str) -> list[CommittedEffect]:
        """The side effects ``task_id`` committed with its finish, each with the approval use
        it consumed: what the external effect is performed from."""
        check_text(task_id, "task_id", max_bytes=TASK_ID_BYTES)
        return self._db.read(lambda tx: approvals.side_effects(tx, task_id))

    # -- reading: the store's status and its listings -------------------------------------------

    def status(self) -> StoreStatus:
        """Every queue's work stage by stage, read in one snapshot: tasks received (pending)
        and processing (running), their outcomes, their replies' delivery; plus the open
        waits, the dead replies and the continuations left to resume.

        Outcomes and sent replies are cumulative since the store began (pruning keeps
        them); the rest is counted as it is now. The cost follows the live work and the
        number of queues, never the history.
        """
        return self._db.read(status.store_status)

    def observe(self, *, window: float = 900.0, limit: int = 10_000) -> Observation:
        """The status and the recent history in one snapshot, for metrics and charts: the
        tasks created in the last ``window`` seconds (at most ``limit``, newest first) with
        their run and delivery attempts, the backlog older than the window, the age of each
        queue's oldest undelivered reply and the waits by state (see ``Observation``)."""
        seconds = check_number(window, "window")
        if seconds <= 0:
            raise InvalidInput("window", f"must be positive, got {seconds}")
        check_int(limit, "limit", low=1, high=100_000)
        return self._db.read(lambda tx: status.observe(tx, tx.now - seconds, limit))

    def list_tasks(self, *, state: TaskState | str | None = None, queue: str | None = None,
                   principal: str | None = None, created_after: float | None = None,
                   created_before: float | None = None, limit: int = 100,
                   cursor: str | None = None) -> Page[Task]:
        """A page of tasks, newest first (by ``created_at``, then ``task_id``).

        Filters combine: a ``state`` (a ``TaskState``, its value or its name), a ``queue``,
        the ``principal`` that sent them, and ``created_after`` / ``created_before``
        (exclusive). ``limit`` is 1..1000. Pass a page's ``next_cursor`` as ``cursor`` with
        the same filters for the next page; another listing's cursor, or other filters, is
        ``InvalidInput`` naming ``cursor``.
        """
        request = status.check_task_listing(
            self._settings, state=state, queue=queue, principal=principal,
            created_after=created_after, created_before=created_before, limit=limit,
            cursor=cursor)
        return self._db.read(lambda tx: status.list_tasks(tx, request))

    def list_waits(self, *, state: WaitState | str = WaitState.WAITING,
                   due_before: float | None = None, responder: str | None = None,
                   limit: int = 100, cursor: str | None = None) -> Page[Wait]:
        """A page of open (waiting) wait generations, earliest deadline first, those due
        before ``due_before`` (exclusive) and addressed to ``responder`` if given. Ended
        generations are not listed: read one with ``wait``. Cursors as for ``list_tasks``."""
        request = status.check_wait_listing(state=state, due_before=due_before, limit=limit,
                                            cursor=cursor, responder=responder,
                                            text_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: status.list_waits(tx, request))

    def list_dead_replies(self, *, limit: int = 100,
                          cursor: str | None = None) -> Page[Reply]:
        """A page of dead replies, the longest dead first: what waits for an operator's
        ``requeue_reply``. Cursors as for ``list_tasks``."""
        request = status.check_dead_reply_listing(limit=limit, cursor=cursor)
        return self._db.read(lambda tx: status.list_dead_replies(tx, request))

    def receipt(self, principal: AuthContext | str, event_id: str) -> SignalReceipt | None:
        """The stored receipt of ``principal``'s signal ``event_id`` (an ``AuthContext``, or
        a principal's name for an operator's look), or ``None`` if there is none. Its
        ``result`` and ``recorded`` are both the outcome stored."""
        name = status.check_principal(self._settings, principal)
        checked = check_text(event_id, "event_id", max_bytes=self._settings.limits.text_bytes)
        return self._db.read(lambda tx: status.receipt(tx, name, checked))

    def audit(self) -> list[Violation]:
        """Check the invariants of SPEC §8 on this store's database, read-only (what
        ``postroom audit`` reports): every violation found, none when all hold."""
        return audit.audit_database(self._db)

    # -- housekeeping ---------------------------------------------------------------------------

    def prune(self, *, progress: Callable[[int], None] | None = None) -> int:
        """Forget messages past retention whose task is terminal and reply sent.

        Returns how many were pruned; ``progress``, if given, is called with the total so far
        after each transaction that pruned some (``sweep_limit`` at most each). A pruned
        identity sent again is a new request, so a message stored at a stream position above
        the stream's watermark is kept: its source will send it again from the watermark,
        and that must be a duplicate. A chain's root is pruned after every other task of
        its chain, and its chain with it.
        """
        pruned = 0
        limit = self._settings.sweep_limit
        while True:
            count, chosen = self._db.write(retention.PRUNE, lambda tx: retention.prune_once(
                tx, limit=limit))
            pruned += count
            if count and progress is not None:
                progress(pruned)
            # A pass that pruned the last other tasks of a chain frees its root: one more.
            if chosen < limit and not count:
                return pruned

    def info(self) -> dict[str, Any]:
        """Settings, schema version, counts, and the database settings that durability
        depends on with a warning for each weak one, for ``postroom info``."""
        return _info(self._db, self._settings, settings_from="this Store's Settings")

    def publish_retention(self, seconds: float) -> float | None:
        """Publish ``seconds`` as the store's retention period; return the one it replaces.

        The period is the store's promise to every sender, so this is an operator's decision
        (``postroom init URL --retention SECONDS``): pruning in every process follows it from
        its next transaction. A promise already made holds: after a shortening, pruning keeps
        the longer period until what was received before has had it (see
        ``transitions.change_retention``).
        """
        value = check_retention(seconds)
        previous = self._db.write(retention.RETENTION, lambda tx: retention.change(tx, value))
        self._settings = replace(self._settings, retention=value)
        return previous

    @property
    def retention(self) -> float:
        """The store's published retention period in seconds, as this Store last saw it
        (when it opened, or published one); ``prune`` reads the current one."""
        assert self._settings.retention is not None  # resolved in __init__
        return self._settings.retention

    @property
    def settings(self) -> Settings:
        """This store's settings; ``retention`` is the store's published period."""
        return self._settings

    @property
    def clock(self) -> Clock:
        """This store's time source (decisions never go below the high-water mark)."""
        return self._db.clock

    def close(self) -> None:
        """Close the store's connections."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _lease(lease: float | None, default: float) -> float:
        return default if lease is None else check_lease(lease)


def check_settlement(outcome: Settlement, settings: Settings | None = None) -> None:
    """Refuse, as ``Store.settle`` would before its transaction, an outcome whose content no
    store can take: ``InvalidInput`` naming the field (a result or a follow-up's payload that
    is not JSON, a follow-up's ``max_attempts`` out of range, two waits on one step, ...).

    With the default ``settings`` the limits are SPEC's defaults, which a store may lower
    but never raise: an outcome refused here is refused by every store. A worker that is
    not beside the store (``postroom.client.RemoteWorker``) checks its outcomes with it, so
    that one it cannot send fails its own attempt instead of the request carrying it.
    """
    _settling(settings or _DEFAULT_SETTINGS, _UNUSED_RNG, outcome)


_DEFAULT_SETTINGS = Settings()
_UNUSED_RNG = random.Random(0)  # a failure's backoff is drawn, and dropped, by the check


def _settling(settings: Settings, rng: random.Random, outcome: object) -> tasks.Settling:
    if isinstance(outcome, Finished):
        claim = check_claim(outcome.claim)
        result_json = check_json(outcome.result, "result", limits=settings.limits,
                                 require_object=False)
        settling = tasks.Settling(
            claim=claim, message="task finished", charge=_charge(outcome.charge),
            decide=lambda now: transitions.finish(result_json=result_json, now=now))
        if _none(outcome.follow_ups) and _none(outcome.waits) \
                and _none(outcome.side_effects):
            return settling  # what nearly every handler ends with: only its result
        follow_ups = _follow_ups(settings, claim,
                                 check_batch(outcome.follow_ups, "follow_ups"))
        waits = check_batch(outcome.waits, "waits")
        return replace(
            settling, follow_ups=follow_ups, opens=_waits(settings, claim, waits),
            asks=_asks(settings, waits),
            effects=_effects(settings, check_batch(outcome.side_effects, "side_effects")))
    if isinstance(outcome, Failed):
        claim = check_claim(outcome.claim)
        reason = check_text(outcome.reason, "reason", max_bytes=4096)
        retryable = check_bool(outcome.retryable, "retryable")
        delay = settings.backoff.delay(claim.attempt, rng)
        return tasks.Settling(claim=claim, message="task failed", decide=lambda now: (
            transitions.fail(attempt=claim.attempt, max_attempts=claim.max_attempts,
                             retryable=retryable, reason=reason, now=now, delay=delay)))
    if isinstance(outcome, Released):
        claim = check_claim(outcome.claim)
        seconds = _delay(outcome.delay)
        return tasks.Settling(claim=claim, message="task released", decide=lambda now: (
            transitions.release(now=now, delay=seconds)))
    raise InvalidInput("outcome", f"must be Finished, Failed or Released, got "
                                  f"{type(outcome).__name__}")


def _waits(settings: Settings, claim: Claim, opens: Sequence[OpenWait]) -> list[waits.OpenRequest]:
    checked = []
    for index, item in enumerate(opens):
        if not isinstance(item, OpenWait):
            raise InvalidInput(f"waits[{index}]", "must be an OpenWait")
        request = _indexed(
            index, waits.check_open, settings, flow=item.flow, step=item.step,
            expected_generation=item.expected_generation, deadline=item.deadline,
            request_id=item.request_id, task_id=claim.task_id, responder=item.responder,
            prefix="waits")
        if check_bool(item.children, f"waits[{index}].children"):
            if item.responder is not None or item.approval is not None:
                raise InvalidInput(f"waits[{index}].children", "a fan-in is answered by "
                                   "postroom alone: it names no responder or approval")
            # The task's own reserved principal: no caller can signal it (tasks reads
            # it as the mark of a fan-in).
            request = replace(request, responder=follow_up_principal(claim.task_id))
        checked.append(request)
    if len({(request.flow, request.step) for request in checked}) < len(checked):
        raise InvalidInput("waits", "two waits name the same flow and step")
    return checked


def _asks(settings: Settings, opens: Sequence[OpenWait]) -> dict[int, approvals.CheckedAsk]:
    """The approval requests of ``opens`` (already checked by ``_waits``), by index."""
    return {index: _indexed(index, approvals.check_ask, settings, item.approval,
                            item.responder, prefix="waits")
            for index, item in enumerate(opens) if item.approval is not None}


def _effects(settings: Settings, effects: Sequence[SideEffect]) -> list[approvals.CheckedEffect]:
    return [approvals.check_effect(settings, effect, f"side_effects[{index}]")
            for index, effect in enumerate(effects)]


def _follow_ups(settings: Settings, claim: Claim,
                follow_ups: Sequence[FollowUp]) -> list[CheckedEnvelope]:
    seen: set[str] = set()
    checked = []
    parent = inbox.Parent(task_id=claim.task_id, principal=claim.principal,
                          deadline=claim.deadline, hops=claim.hops, queue=claim.queue,
                          requester=claim.requester)
    namespace = follow_up_principal(claim.task_id)
    for index, follow_up in enumerate(follow_ups):
        if not isinstance(follow_up, FollowUp):
            raise InvalidInput(f"follow_ups[{index}]", "must be a FollowUp")
        if follow_up.message_id in seen:
            raise InvalidInput(f"follow_ups[{index}].message_id",
                               f"{follow_up.message_id!r} appears twice")
        seen.add(follow_up.message_id)
        checked.append(_indexed(index, inbox.check_follow_up, settings, follow_up,
                                parent, namespace=namespace, prefix="follow_ups"))
    return checked


def _info(database: Database, settings: Settings, *, settings_from: str) -> dict[str, Any]:
    schema_version = database.schema_version("store")

    def read(tx: Tx) -> dict[str, Any]:
        found = status.info(tx, settings, schema_version=schema_version,
                            settings_from=settings_from)
        found["replies_awaiting_endpoint"] = sum(endpoints.awaiting(tx).values())
        return found

    return database.read(read)


def inspect_store(url: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """``Store.info`` of the store at ``url`` without creating, migrating or writing anything.

    Raises ``SchemaError`` if ``url`` holds no postroom store, or one whose schema is older
    (``postroom init`` upgrades it) or newer than this postroom's.
    """
    database = _existing(url)
    try:
        if settings is None:
            return _info(database, Settings(), settings_from=(
                "postroom's defaults (an application's own Settings are not in the "
                "database), except retention_seconds: the store's published period"))
        return _info(database, settings, settings_from="the Settings given")
    finally:
        database.close()


def _existing(url: str) -> Database:
    """The store at ``url``, read-only; ``SchemaError`` (nothing created or written) if
    there is none or its schema is another version than this postroom's."""
    from postroom.db import dialect_for_url, redacted_url, sqlite_path

    try:
        dialect = dialect_for_url(url, read_only=True)
    except StoreError:
        path = sqlite_path(url)
        if path is not None and not Path(path).exists():
            raise SchemaError(f"no postroom store at {url}: there is no such file "
                              "(postroom init creates one)") from None
        raise
    database = Database(dialect, track_time=False)
    try:
        if database.schema_version("store") == 0:
            raise SchemaError(f"no postroom store at {redacted_url(url)} "
                              "(postroom init creates one)")
        problem = database.schema_problem("store")
        if problem is not None:
            raise SchemaError(f"the store's schema is {problem}")
    except BaseException:
        database.close()
        raise
    return database


def open_store(url: str, *, clock: Clock | None = None, settings: Settings | None = None,
               seed: int | None = None, create: bool = True) -> Store:
    """Open the store at ``url`` (``sqlite:///path.db`` or ``postgresql://...``).

    With ``create=False``, a URL without a store, or with a store of another schema
    version, is a ``SchemaError`` and nothing is created or upgraded (an operator's
    command on a mistyped URL).
    """
    if not create:
        _existing(url).close()
    return Store.open(url, clock=clock, settings=settings, seed=seed)


def _batch(envelopes: Iterable[Envelope], positions: Iterable[Position | None] | None
           ) -> tuple[list[Envelope], list[Position | None]]:
    """A batch's envelopes and their positions, each read once (see ``check_batch``)."""
    items = check_batch(envelopes, "envelopes")
    if positions is None:
        return items, [None] * len(items)
    places = check_batch(positions, "positions")
    if len(places) != len(items):
        raise InvalidInput("positions", f"{len(places)} positions for {len(items)} envelopes")
    return items, places


def _per_queue(per_queue: object, names: Sequence[str]) -> dict[str, int]:
    """A claimer's caps by queue: each one of the claimed ``names``, at most ``MAX_BATCH``."""
    if per_queue is None:
        return {}
    if not isinstance(per_queue, Mapping):
        raise InvalidInput("per_queue", f"must be a mapping of queue names to counts, got "
                                        f"{type(per_queue).__name__}")
    caps = {}
    for queue, cap in per_queue.items():
        if queue not in names:
            raise InvalidInput("per_queue", f"{queue!r} is not one of the queues claimed")
        caps[queue] = check_int(cap, f"per_queue[{queue!r}]", low=0, high=MAX_BATCH)
    return caps


def _none(items: object) -> bool:
    """Whether ``items`` is the empty tuple an outcome's field defaults to."""
    return type(items) is tuple and not items


def _charge(units: object) -> int:
    return check_int(units, "charge", low=0, high=MAX_CHAIN_BUDGET)


def _delay(delay: object) -> float:
    seconds = check_number(delay, "delay")
    if not 0 <= seconds <= MAX_DELAY:
        raise InvalidInput("delay", f"must be in 0..{MAX_DELAY:g} seconds, got {delay!r}")
    return seconds


def _indexed(index: int, check: Any, *args: Any, prefix: str = "envelopes",
             **kwargs: Any) -> Any:
    """Run a check on item ``index`` of a batch, naming the item in any refusal."""
    try:
        return check(*args, **kwargs)
    except InvalidInput as exc:
        raise type(exc)(f"{prefix}[{index}].{exc.field}", exc.problem) from None
    except Unauthorized as exc:  # e.g. one item's sender is not the principal
        raise Unauthorized(f"{prefix}[{index}]: {exc}") from None

