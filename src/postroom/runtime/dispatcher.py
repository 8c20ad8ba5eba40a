"""The dispatcher: the process that delivers the outbox's replies (``postroom dispatch``).

It claims due replies in batches, delivers them, and records the outcomes in batches (group
commit; every outcome is fenced on its own claim, so a batch never weakens a guarantee).
Two ways to deliver:

- **to endpoints** (the default): each reply goes to its requester's endpoint by HTTP
  (``transports.webhook``), signed with the endpoint's active secrets. Deliveries run
  concurrently, at most ``concurrency`` in all and at most the endpoint's own
  ``concurrency`` per endpoint, and a claim never waits behind another endpoint's: a slow or
  dead endpoint holds only its own slots. A reply claimed for an endpoint that already has
  as many waiting as it may have in flight is handed back (attempt given back) to come due
  again when the endpoint may have room, spread at the pace its timeouts allow; one whose
  endpoint is gone, disabled or removed meanwhile is handed back and, at the next claim,
  parked until it has one again. A transient failure is tried again after the endpoint's
  schedule says, and never before a ``Retry-After``.
- **to one receiver** (``receiver=``): each batch goes into a ``Receiver`` database in one
  of its transactions, in this process (simple setups and the benchmark).

It wakes when a reply comes due (``Store.waiter(replies=True)``) and polls every ``poll``
seconds only for what no wake-up announces (a backoff ending, a lease recovered).

**Stopping.** ``stop()`` (SIGTERM or SIGINT under ``postroom dispatch``) stops claiming, lets
the deliveries already on the wire finish (each is bounded by its timeouts), hands back the
claimed replies not yet sent (their attempts given back), records everything, and returns.
A reply is then ``pending`` (to be tried again, by this or another dispatcher), ``sent`` or
``dead``; a dispatcher killed outright leaves its in-flight replies ``sending`` until their
lease ends, when they are ``pending`` again with the attempt counted and "outcome unknown"
(the receiver's dedupe makes the redelivery safe).

**Failures.** A step that raises (the database unreachable, say) is logged and retried
after a capped backoff; it never ends the process. What was delivered but not yet recorded
is kept and recorded by a later step (or, if its lease ran out meanwhile, redelivered and
acknowledged as a duplicate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from postroom import (
    DispatchReport,
    Endpoint,
    InProcessTransport,
    InvalidInput,
    Outcome,
    OutcomeKind,
    Receiver,
    ReplyClaim,
    Store,
    Waiter,
)
from postroom import log as postroom_log
from postroom.transports import deliver as deliver_batch

from .transports.webhook import Timeouts, Webhooks

__all__ = ["Dispatcher", "DispatcherSettings"]

_log = postroom_log.get("dispatcher")

#: The longest pause after a failing step, in seconds.
_MAX_BACKOFF = 30.0
#: Seconds of lease a claim must still have, beyond its delivery's timeouts, to be sent.
_LEASE_MARGIN = 2.0


def _default_owner() -> str:
    return f"dispatcher@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatcherSettings:
    """How a dispatcher works, checked when it is built."""

    #: Who it claims as (in every claim's ``owner``, and in the logs).
    owner: str = field(default_factory=_default_owner)
    #: Replies claimed per transaction.
    batch: int = 32
    #: Deliveries in flight at once, all endpoints together.
    concurrency: int = 16
    #: Seconds between looks for work when no wake-up comes.
    poll: float = 1.0
    #: Bounds of one HTTP delivery.
    timeouts: Timeouts = field(default_factory=Timeouts)
    #: Seconds a claim holds a reply; ``None``: the store's ``dispatch_lease``, raised if
    #: need be to cover a wait for the endpoint's turn and the delivery itself. (A claim
    #: whose lease could lapse before its delivery ends is handed back, not sent.)
    lease: float | None = None

    def __post_init__(self) -> None:
        for name, value, high in (("batch", self.batch, 10_000),
                                  ("concurrency", self.concurrency, 4096)):
            if type(value) is not int or not 1 <= value <= high:
                raise InvalidInput(name, f"must be an int in 1..{high}, got {value!r}")
        if type(self.poll) not in (int, float) or not 0.001 <= self.poll <= 3600:
            raise InvalidInput("poll", f"must be 0.001..3600 seconds, got {self.poll!r}")
        if not isinstance(self.timeouts, Timeouts):
            raise InvalidInput("timeouts", "must be a Timeouts")
        shortest = self.timeouts.total + 2 * _LEASE_MARGIN
        if self.lease is not None and not shortest <= self.lease <= 86_400:
            raise InvalidInput("lease", f"must cover a whole delivery and a margin: "
                                        f"{shortest:g}..86400 seconds, got {self.lease!r}")

    def lease_for(self, store: Store) -> float:
        """The lease to claim with: enough to wait for one delivery ahead and make its own."""
        wanted = 2 * self.timeouts.total + 2 * _LEASE_MARGIN
        if self.lease is not None:
            return self.lease
        return min(max(store.settings.dispatch_lease, wanted), 86_400.0)


@dataclass(slots=True)
class _Lane:
    """One endpoint as the dispatcher sees it: its record, its turns, what it holds for it.

    A lane holds at most twice its endpoint's ``concurrency`` claims (those on the wire and
    as many waiting for their turn); more are handed back, to come due again about when the
    lane will have worked through what it holds, judged by how long its deliveries have
    been taking (``pace``).
    """

    endpoint: Endpoint
    turns: asyncio.Semaphore
    held: int = 0
    gone: bool = False  # it answered 410: nothing more is sent to it
    gone_recorded: float = math.inf  # monotonic time its 410 was recorded (it is disabled)
    pace: float = 0.1  # seconds a delivery to it has been taking (a moving average)
    next_slot: float = 0.0  # monotonic time the last reply handed back is due back

    @property
    def full(self) -> bool:
        """Whether it holds all the claims it may."""
        return self.held >= 2 * self.endpoint.concurrency

    def took(self, seconds: float) -> None:
        """Note that a delivery took ``seconds``."""
        self.pace = 0.8 * self.pace + 0.2 * seconds

    def defer(self, now: float) -> float:
        """Seconds until a reply handed back for want of room may find some: after what the
        lane holds, spaced at the pace its turns free up."""
        spacing = self.pace / self.endpoint.concurrency
        self.next_slot = max(self.next_slot, now + self.pace) + spacing
        return self.next_slot - now


@dataclass(frozen=True, slots=True)
class _Held:
    claim: ReplyClaim
    send_by: float  # monotonic time after which it is not sent (its lease could lapse)


class Dispatcher:
    """Delivers a store's replies until stopped; see the module docstring.

    ``run()`` blocks (in the calling thread, on an event loop of its own) until ``stop()``
    is called from anywhere, or, with ``handle_signals``, SIGTERM or SIGINT arrives (then
    ``exit_code`` is 143 or 130; a second signal ends the process at once).
    """

    def __init__(self, store: Store, *, receiver: Receiver | None = None,
                 settings: DispatcherSettings | None = None,
                 webhooks: Webhooks | None = None, seed: int | None = None) -> None:
        self.store = store
        self.settings = settings if settings is not None else DispatcherSettings()
        self.exit_code = 0
        self.report = DispatchReport()
        self.released = 0
        self._receiver = receiver
        self._webhooks = webhooks
        self._rng = random.Random(seed)
        self._lease = self.settings.lease_for(store)
        self._lanes: dict[str, _Lane] = {}
        self._done: list[tuple[ReplyClaim, Outcome]] = []
        self._handed_back: dict[float, list[ReplyClaim]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._held = 0
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stirred: asyncio.Event | None = None
        self._signals = 0
        self._stopped_by: str | None = None

    # -- the one start/stop protocol ---------------------------------------------------------

    def run(self, *, handle_signals: bool = False) -> None:
        """Deliver until stopped, then finish as the module docstring says and return.

        ``handle_signals`` (from the main thread only) takes SIGTERM and SIGINT for the
        duration of the run and gives the previous handlers back afterwards, so a signal that
        comes while it returns is still answered by someone.
        """
        previous = {}
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._signalled)
        try:
            asyncio.run(self._main())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """Ask ``run`` to stop (from any thread); returns at once."""
        self._stop_requested.set()
        self._stir()

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked for."""
        return self._stop_requested.is_set()

    # -- the loop ----------------------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stirred = asyncio.Event()
        if self._receiver is None and self._webhooks is None:
            self._webhooks = Webhooks(timeouts=self.settings.timeouts,
                                      max_connections=self.settings.concurrency)
        # Listening starts before the first look for work: a reply that comes due after that
        # look wakes the loop, however late the thread gets to run.
        waiter = self.store.waiter((), replies=True)
        waker = threading.Thread(target=self._listen, args=(waiter,),
                                 name="dispatcher wake-ups", daemon=True)
        waker.start()
        pause = 0.0
        try:
            while not self.stopping:
                try:
                    busy = await self._step()
                    pause = 0.0
                except Exception as exc:  # the loop never dies of one step
                    pause = min(max(pause * 2, 0.1), _MAX_BACKOFF)
                    postroom_log.event(_log, logging.WARNING, "dispatcher step failed",
                                       owner=self.settings.owner,
                                       last_error=f"{type(exc).__name__}: {exc}")
                    await self._pause(pause)
                    continue
                if not busy:
                    await self._pause(self.settings.poll)
        finally:
            await self._finish()
            if self._webhooks is not None:
                await self._webhooks.aclose()

    async def _step(self) -> bool:
        """Record what finished and claim what there is room for, in one transaction when
        there is both (each outcome still fenced on its own claim); whether it claimed any."""
        done, self._done = self._done, []
        room = 2 * self.settings.concurrency - self._held + len(done)
        if room <= 0 or self.stopping:
            self._done[:0] = done
            await self._flush()
            return False
        limit, routed = min(self.settings.batch, room), self._receiver is None
        if done:
            try:
                report, claims = await asyncio.to_thread(
                    self.store.record_and_claim, done, self.settings.owner, limit=limit,
                    lease=self._lease, routed=routed)
            except BaseException:
                self._done[:0] = done  # recorded by a later step
                raise
            self._recorded(done, report)
        else:
            claims = await asyncio.to_thread(self.store.claim_replies, self.settings.owner,
                                             limit=limit, lease=self._lease, routed=routed)
        await self._release()  # what was set aside meanwhile
        if not claims:
            return False
        self._held += len(claims)
        send_by = time.monotonic() + self._lease - self.settings.timeouts.total - _LEASE_MARGIN
        held = [_Held(claim, send_by) for claim in claims]
        if self._receiver is not None:
            self._spawn(self._into_receiver(self._receiver, held))
            return True
        try:
            await self._to_endpoints(held)
        except BaseException:
            # The endpoints could not be read: hand the claims back rather than let them sit
            # until their lease ends, which would count an attempt that never happened.
            for item in held:
                self._hand_back(item.claim, 0.0)
            raise
        return True

    async def _to_endpoints(self, held: list[_Held]) -> None:
        read_at = time.monotonic()
        found = await asyncio.to_thread(self.store.endpoints,
                                        [item.claim.requester for item in held
                                         if item.claim.requester is not None])
        now = time.monotonic()
        for item in held:
            requester = item.claim.requester
            endpoint = found.get(requester) if requester is not None else None
            if endpoint is None or not endpoint.enabled:
                self._hand_back(item.claim, 0.0)  # the next claim parks it
                continue
            lane = self._lane(endpoint, read_at)
            if lane.gone:
                self._hand_back(item.claim, 0.0)
            elif lane.full:
                self._hand_back(item.claim, lane.defer(now))
            else:
                lane.held += 1
                self._spawn(self._to_endpoint(lane, item))

    def _lane(self, endpoint: Endpoint, read_at: float) -> _Lane:
        """The lane of ``endpoint``, as read (enabled) at ``read_at``."""
        lane = self._lanes.get(endpoint.principal)
        if lane is not None and lane.gone and read_at > lane.gone_recorded:
            # Read enabled after its 410 was recorded (so after it was disabled): an
            # operator enabled it again.
            lane.gone, lane.gone_recorded = False, math.inf
        if lane is None or (lane.held == 0 and not lane.gone
                            and lane.endpoint.concurrency != endpoint.concurrency):
            lane = _Lane(endpoint, asyncio.Semaphore(endpoint.concurrency))
            self._lanes[endpoint.principal] = lane
        else:
            lane.endpoint = endpoint  # its secrets may have been rotated
        return lane

    async def _to_endpoint(self, lane: _Lane, item: _Held) -> None:
        claim = item.claim
        try:
            async with lane.turns:
                if self.stopping or lane.gone or time.monotonic() > item.send_by:
                    self._hand_back(claim, 0.0)
                    return
                assert self._webhooks is not None
                started = time.monotonic()
                outcome = await self._webhooks.deliver(lane.endpoint, claim.outgoing())
                lane.took(time.monotonic() - started)
        except Exception as exc:  # a bug here must still end in a recorded outcome
            outcome = Outcome.transient(f"dispatcher error: {type(exc).__name__}: {exc}")
        finally:
            lane.held -= 1
        if outcome.kind is OutcomeKind.GONE:
            lane.gone = True
        postroom_log.event(_log, logging.DEBUG, "delivery attempted", reply_id=claim.reply_id,
                           owner=claim.owner, fence=claim.fence, attempt=claim.attempt,
                           state=outcome.kind.value, last_error=outcome.detail or None)
        self._finished(claim, self._scheduled(lane.endpoint, claim, outcome))

    def _scheduled(self, endpoint: Endpoint, claim: ReplyClaim, outcome: Outcome) -> Outcome:
        """A transient outcome with its retry delay: the endpoint's schedule, and never
        earlier than a ``Retry-After`` asked (``outcome.delay``)."""
        if outcome.kind is not OutcomeKind.TRANSIENT:
            return outcome
        planned = endpoint.schedule.delay(claim.attempt, self._rng)
        if planned is None and outcome.delay is None:
            return outcome  # the store's own backoff
        if planned is None:
            planned = self.store.settings.delivery_backoff.delay(claim.attempt, self._rng)
        delay = max(planned, outcome.delay or 0.0)
        return Outcome.transient(outcome.detail, delay=delay)

    async def _into_receiver(self, receiver: Receiver, held: list[_Held]) -> None:
        claims = [item.claim for item in held]
        try:
            outcomes = await asyncio.to_thread(deliver_batch, InProcessTransport(receiver),
                                               claims)
        except Exception as exc:  # ``deliver`` turns a transport's errors into outcomes
            outcomes = [Outcome.transient(f"dispatcher error: {type(exc).__name__}: {exc}")
                        ] * len(claims)
        for claim, outcome in zip(claims, outcomes, strict=True):
            self._finished(claim, outcome)

    # -- bookkeeping -------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finished(self, claim: ReplyClaim, outcome: Outcome) -> None:
        self._done.append((claim, outcome))
        self._stir()

    def _hand_back(self, claim: ReplyClaim, delay: float) -> None:
        self._handed_back.setdefault(round(delay, 3), []).append(claim)
        self._stir()

    async def _flush(self) -> None:
        """Record the outcomes and hand back the claims gathered since the last flush."""
        if self._done:
            done, self._done = self._done, []
            try:
                report = await asyncio.to_thread(self.store.record_deliveries, done)
            except BaseException:
                self._done[:0] = done  # recorded by a later flush
                raise
            self._recorded(done, report)
        await self._release()

    async def _release(self) -> None:
        """Hand back the claims set aside to be handed back."""
        while self._handed_back:
            delay, claims = next(iter(self._handed_back.items()))
            await asyncio.to_thread(self.store.release_replies, claims, delay=delay)
            del self._handed_back[delay]
            self._held -= len(claims)
            self.released += len(claims)

    def _recorded(self, done: list[tuple[ReplyClaim, Outcome]], report: DispatchReport) -> None:
        """Account for ``done``, recorded with ``report``: their claims are no longer held."""
        self._held -= len(done)
        recorded = time.monotonic()
        for claim, outcome in done:
            lane = self._lanes.get(claim.requester or "")
            if outcome.kind is OutcomeKind.GONE and lane is not None:
                lane.gone_recorded = min(lane.gone_recorded, recorded)
        self.report = DispatchReport(
            claimed=self.report.claimed + report.claimed,
            sent=self.report.sent + report.sent, retrying=self.report.retrying
            + report.retrying, dead=self.report.dead + report.dead,
            fenced=[*self.report.fenced, *report.fenced][-100:])
        for reply_id in report.fenced:
            postroom_log.event(_log, logging.INFO, "delivery outcome fenced",
                               reply_id=reply_id, owner=self.settings.owner)

    async def _finish(self) -> None:
        """Stop: let what is on the wire finish, hand back the rest, record it all."""
        self._stop_requested.set()
        postroom_log.event(_log, logging.INFO, "dispatcher stopping", owner=self.settings.owner,
                           state=self._stopped_by)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for attempt in range(5):
            try:
                await self._flush()
                return
            except Exception as exc:
                postroom_log.event(_log, logging.WARNING, "dispatcher could not record on "
                                   "stopping", owner=self.settings.owner,
                                   last_error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        # What is left is recovered when its lease ends.

    # -- waking up ---------------------------------------------------------------------------

    def _listen(self, waiter: Waiter) -> None:
        """The wake-up thread: stir the loop whenever the store says a reply may be due."""
        while not self.stopping:
            try:
                if waiter.wait(self.settings.poll):
                    self._stir()
            except Exception:  # only polling is left: the loop still looks every poll
                time.sleep(self.settings.poll)

    def _stir(self) -> None:
        loop, stirred = self._loop, self._stirred
        if loop is not None and stirred is not None and not loop.is_closed():
            # The loop may close meanwhile: then nobody waits any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stirred.set)

    async def _pause(self, seconds: float) -> None:
        """Wait until stirred (a wake-up, a delivery done, a stop) or ``seconds`` pass."""
        assert self._stirred is not None
        if math.isfinite(seconds) and seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stirred.wait(), seconds)
        self._stirred.clear()

    def _signalled(self, signum: int, frame: object = None) -> None:
        # A Python signal handler: it runs in the main thread, between two steps of the
        # event loop's (the select it waits in is interrupted), and only asks for a stop.
        self._signals += 1
        if self._signals > 1:
            os._exit(128 + signum)  # asked twice: go now, leases recover the rest
        self.exit_code = 128 + signum
        self._stopped_by = signal.Signals(signum).name  # logged by the loop, not in here
        self.stop()
