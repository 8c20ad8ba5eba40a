"""Handlers: what runs a queue's tasks, what it is told, and how it ends.

A handler is a plain function or an ``async def`` coroutine function taking the task's
payload and a ``Context``. Its outcome is a value, never a side channel:

- it returns: the task is done, with the returned value as its result (JSON), and what it
  added to the context (follow-up tasks, a wait to open) commits in the same transaction;
- it raises any exception: a retryable failure (retried after the backoff while attempts
  remain);
- it raises ``PermanentFailure``: the task fails for good;
- it raises ``postroom.Fenced`` (or its claim is found fenced or cancelled while it runs):
  the work is abandoned silently; whatever it would have committed is refused anyway;
- it runs past its execution timeout (``timeout=`` here, or the worker's default for the
  queue): it is abandoned (told through ``ctx.cancelled``; a coroutine is cancelled) and the
  attempt fails as retryable, with a reason naming the timeout. The timeout bounds one
  attempt; the task's absolute deadline still bounds them all.

Resumers continue a flow after a wait ended: for a ``(flow, step)`` (or a step of any flow)
the continuation runner calls the resumer with the ``Continuation`` and commits the
``FollowUp`` it returns (or nothing, for ``None``) exactly once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from postroom import log
from postroom.errors import Fenced, InvalidInput
from postroom.models import (
    ApprovalRequest,
    Claim,
    Continuation,
    Failed,
    Finished,
    FollowUp,
    OpenWait,
    SideEffect,
)
from postroom.runtime.duty import check_interval
from postroom.validation import DEFAULT_LIMITS, check_int, check_text

__all__ = ["App", "Context", "EventLoopThread", "Handler", "HandlerSpec", "PermanentFailure",
           "Resumer", "check_by_queue", "execution_timeouts", "failure_reason",
           "handled_queues", "outcome_of", "refused_finish", "timed_out"]

_log = log.get("handlers")

#: How much of a failure's text is kept as the task's error (the store takes up to 4 KiB).
_REASON_CHARS = 1000

#: A queue's handler: ``handler(payload, ctx) -> result``, plain or ``async def``.
Handler = Callable[[dict[str, Any], "Context"], Any]
#: What continues a flow after one of its waits ended.
Resumer = Callable[[Continuation], FollowUp | None]

F = TypeVar("F", bound=Callable[..., Any])


class PermanentFailure(Exception):
    """Raised by a handler: the task fails for good, whatever attempts remain."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler: the queue it serves, whether it is a coroutine function, and
    its execution timeout in seconds (``None``: the worker's default for the queue, if any)."""

    queue: str
    function: Handler
    is_async: bool
    timeout: float | None = None



class App:
    """Handlers by queue, and resumers by wait step: what a worker runs.

    ``postroom worker URL --import module`` imports ``module`` and runs its ``app`` (an
    ``App`` named ``app``; ``--import module:name`` names another).
    """

    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec] = {}
        self._resumers: dict[tuple[str | None, str], Resumer] = {}

    def handler(self, queue: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Register the decorated function as ``queue``'s handler; one attempt of it may run
        ``timeout`` seconds at most (``None``: the worker's default for the queue, if any)."""

        def register(function: F) -> F:
            self.add_handler(queue, function, timeout=timeout)
            return function

        return register

    def add_handler(self, queue: str, function: Handler, *,
                    timeout: float | None = None) -> None:
        """Register ``function`` as ``queue``'s handler (one handler per queue), with its
        execution timeout in seconds (see ``handler``)."""
        name = check_text(queue, "queue", max_bytes=DEFAULT_LIMITS.text_bytes)
        if not callable(function):
            raise InvalidInput("handler", f"must be callable, got {type(function).__name__}")
        seconds = None if timeout is None else check_interval(timeout, "timeout")
        if name in self._handlers:
            raise InvalidInput("queue", f"{name!r} already has a handler")
        self._handlers[name] = HandlerSpec(name, function,
                                           inspect.iscoroutinefunction(function), seconds)

    def resumer(self, step: str, *, flow: str | None = None) -> Callable[[F], F]:
        """Register the decorated function to resume waits at ``step`` (of ``flow``, or of
        any flow): it gets the ``Continuation`` and returns the ``FollowUp`` to enqueue, or
        ``None`` to consume it with no follow-up."""

        def register(function: F) -> F:
            self.add_resumer(step, function, flow=flow)
            return function

        return register

    def add_resumer(self, step: str, function: Resumer, *, flow: str | None = None) -> None:
        """Register ``function`` to resume waits at ``step`` (of ``flow``, or of any)."""
        limit = DEFAULT_LIMITS.text_bytes
        key = (None if flow is None else check_text(flow, "flow", max_bytes=limit),
               check_text(step, "step", max_bytes=limit))
        if not callable(function):
            raise InvalidInput("resumer", f"must be callable, got {type(function).__name__}")
        if key in self._resumers:
            raise InvalidInput("step", f"{step!r} already has a resumer"
                                       + ("" if flow is None else f" for flow {flow!r}"))
        self._resumers[key] = function

    def include(self, other: App) -> None:
        """Add every handler and resumer of ``other`` (none may be registered twice)."""
        for spec in other._handlers.values():
            self.add_handler(spec.queue, spec.function, timeout=spec.timeout)
        for (flow, step), function in other._resumers.items():
            self.add_resumer(step, function, flow=flow)

    @classmethod
    def load(cls, *specs: str) -> App:
        """The app of the modules ``specs`` name: ``module`` (its ``app``) or
        ``module:name``, imported with the current directory on the import path (as
        ``python -m`` would have it), merged into one."""
        if not specs:
            raise InvalidInput("import", "name at least one module to import")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        merged = cls()
        for spec in specs:
            module_name, _, attribute = spec.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise InvalidInput("import", f"cannot import {module_name!r}: {exc}") from exc
            found = getattr(module, attribute or "app", None)
            if not isinstance(found, App):
                raise InvalidInput("import", f"{module_name!r} has no App named "
                                             f"{attribute or 'app'!r}")
            merged.include(found)
        return merged

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues that have a handler, in registration order."""
        return tuple(self._handlers)

    def handler_for(self, queue: str) -> HandlerSpec | None:
        """``queue``'s handler, if it has one."""
        return self._handlers.get(queue)

    def resumer_for(self, flow: str, step: str) -> Resumer | None:
        """The resumer of a wait at ``(flow, step)``: one registered for that flow, else one
        registered for the step of any flow."""
        return self._resumers.get((flow, step)) or self._resumers.get((None, step))

    @property
    def steps(self) -> tuple[str, ...]:
        """The wait steps that have a resumer (for some flow or for any)."""
        return tuple(dict.fromkeys(step for _, step in self._resumers))


class Context:
    """What a handler is told about its task, and what it adds to its finish.

    The task's identity and the claim's terms are read-only. ``spawn`` and ``open_wait``
    collect follow-up tasks and a wait that commit in the same transaction as the task's
    finish, and only if the handler returns. ``cancelled`` turns true when the worker learns
    that the claim is no longer current (the task was cancelled, its lease taken over, its
    deadline passed) or the worker is stopping past its grace period: a long handler should
    look at it and stop; whatever it would commit is refused anyway.
    """

    def __init__(self, claim: Claim, cancellation: threading.Event | None = None) -> None:
        self._claim = claim
        self._cancellation = cancellation if cancellation is not None else threading.Event()
        self._follow_ups: list[FollowUp] = []
        self._waits: list[OpenWait] = []
        self._charged = 0
        self._side_effects: list[SideEffect] = []

    @property
    def claim(self) -> Claim:
        """The claim the handler runs under (as first issued)."""
        return self._claim

    @property
    def task_id(self) -> str:
        """The task's stable identity."""
        return self._claim.task_id

    @property
    def message_id(self) -> str:
        """The sender's id of the message that made the task."""
        return self._claim.message_id

    @property
    def queue(self) -> str:
        """The task's queue."""
        return self._claim.queue

    @property
    def attempt(self) -> int:
        """Which attempt this is, from 1 (released attempts are given back)."""
        return self._claim.attempt

    @property
    def max_attempts(self) -> int:
        """How many attempts the task has in all."""
        return self._claim.max_attempts

    @property
    def fence(self) -> int:
        """The claim's fence: strictly increasing per task."""
        return self._claim.fence

    @property
    def deadline(self) -> float:
        """The task's absolute deadline (seconds since the epoch, the store's clock)."""
        return self._claim.deadline

    @property
    def principal(self) -> str:
        """The authenticated principal that sent the task (for a follow-up, its namespace)."""
        return self._claim.principal

    @property
    def requester(self) -> str | None:
        """Who the task's reply goes to: the principal that sent its chain's root."""
        return self._claim.requester

    @property
    def correlation_id(self) -> str | None:
        """The sender's correlation id, if it gave one."""
        return self._claim.correlation_id

    @property
    def cancelled(self) -> bool:
        """Whether the handler should stop: its claim is no longer current (or the worker is
        past its grace period)."""
        return self._cancellation.is_set()

    @property
    def cancellation(self) -> threading.Event:
        """The event behind ``cancelled``, to wait on (``ctx.cancellation.wait(timeout)``)."""
        return self._cancellation

    def spawn(self, message_id: str, payload: dict[str, Any], *, queue: str | None = None,
              deadline: float | None = None, max_attempts: int = 3,
              correlation_id: str | None = None) -> None:
        """Create a follow-up task when this one finishes, in the same transaction.

        Its identity comes from this task and ``message_id`` (a retry of this task makes the
        same follow-up, never a second one); hops and parent are postroom's. Queue and
        deadline default to this task's. Checked when the finish commits: a bad field
        fails this attempt.
        """
        self._follow_ups.append(FollowUp(message_id=message_id, payload=payload, queue=queue,
                                         deadline=deadline, max_attempts=max_attempts,
                                         correlation_id=correlation_id))

    def open_wait(self, flow: str, step: str, deadline: float, *,
                  expected_generation: int = 0, request_id: str | None = None,
                  responder: str | None = None) -> None:
        """Open a wait when this task finishes, in the same transaction: the flow asks the
        outside world and waits for the answer (a signal) until ``deadline``.

        The wait's task is this one, so its resumer's follow-up is this task's child. If the
        wait cannot open (its slot is not at ``expected_generation``, or still busy), the
        finish commits nothing and the attempt fails, to be retried.
        """
        self._waits.append(OpenWait(flow=flow, step=step, deadline=deadline,
                                    expected_generation=expected_generation,
                                    request_id=request_id, responder=responder))

    def charge(self, units: int) -> None:
        """Charge ``units`` of cost to the task's chain when this task finishes, in the same
        transaction (charges add up). Its follow-ups, and the chain's later work, are
        refused as ``budget_exhausted`` once the chain's cost budget is spent."""
        if type(units) is not int or units < 0:
            raise InvalidInput("units", f"must be an int >= 0, got {units!r}")
        self._charged += units

    def side_effect(self, action: str, resource: str, data: Any, *,
                    approval_id: str | None = None) -> None:
        """Declare a side effect to commit with this task's finish: ``action`` on
        ``resource`` carrying ``data``. The finish commits only if a human's approval of
        exactly that (``approval_id``, or any matching one) is usable then, consuming a use
        in the same transaction; perform the effect from the committed record
        (``Store.side_effects``), never from the handler before the finish."""
        self._side_effects.append(SideEffect(action=action, resource=resource, data=data,
                                             approval_id=approval_id))

    @property
    def side_effects(self) -> tuple[SideEffect, ...]:
        """The side effects declared so far."""
        return tuple(self._side_effects)

    @property
    def charged(self) -> int:
        """The cost units charged so far."""
        return self._charged

    def wait_for_children(self, flow: str, step: str, deadline: float, *,
                          expected_generation: int = 0) -> None:
        """Fan-in: when this task finishes, wait (``flow``, ``step``) for every child it
        spawns; postroom answers the wait when the last one ends, with all their outcomes,
        and the wait's resumer continues the flow once (a timeout at ``deadline``)."""
        self._waits.append(OpenWait(flow=flow, step=step, deadline=deadline,
                                    expected_generation=expected_generation, children=True))

    def request_approval(self, flow: str, step: str, deadline: float, *, responder: str,
                         action: str, resource: str, data: Any, expires_at: float,
                         max_uses: int = 1, expected_generation: int = 0) -> None:
        """Ask ``responder`` (a human) to approve ``action`` on ``resource`` carrying
        ``data``: a wait addressed to them opens with this task's finish. Their answer
        (``Store.answer_approval``) grants or denies the approval and signals the wait in
        one transaction; the resumed flow declares the side effect with the approval id the
        signal carries."""
        self._waits.append(OpenWait(
            flow=flow, step=step, deadline=deadline, expected_generation=expected_generation,
            responder=responder, approval=ApprovalRequest(action=action, resource=resource,
                                                          data=data, expires_at=expires_at,
                                                          max_uses=max_uses)))

    @property
    def follow_ups(self) -> tuple[FollowUp, ...]:
        """The follow-ups spawned so far."""
        return tuple(self._follow_ups)

    @property
    def waits(self) -> tuple[OpenWait, ...]:
        """The waits asked for so far."""
        return tuple(self._waits)


def handled_queues(app: App, queues: Sequence[str] | None) -> tuple[str, ...]:
    """The queues a worker of ``app`` claims from: ``queues``, or every queue ``app`` has a
    handler for; ``InvalidInput`` if there are none, or if one has no handler."""
    chosen = tuple(queues) if queues is not None else tuple(app.queues)
    if not chosen:
        raise InvalidInput("queues", "the app has no handler, and no queue was named")
    missing = [name for name in chosen if app.handler_for(name) is None]
    if missing:
        raise InvalidInput("queues", f"no handler for {', '.join(map(repr, missing))}")
    return chosen


def check_by_queue(queue_concurrency: object, timeouts: object,
                   queues: Sequence[str] | None = None) -> None:
    """Refuse a worker's per-queue settings unless each maps queue names (of ``queues``,
    when given) to a concurrency (1..1024) or an execution timeout in seconds:
    ``InvalidInput`` naming the setting and, for a value, its queue."""
    for name, given, check in (("queue_concurrency", queue_concurrency, _check_concurrency),
                               ("timeouts", timeouts, check_interval)):
        if not isinstance(given, Mapping) or not all(isinstance(key, str) for key in given):
            raise InvalidInput(name, "must be a mapping of queue names")
        for queue_name, value in given.items():
            check(value, f"{name}[{queue_name!r}]")
        strangers = [] if queues is None else [key for key in given if key not in queues]
        if strangers:
            raise InvalidInput(name, f"not a queue this worker claims: "
                                     f"{', '.join(map(repr, strangers))}")


def _check_concurrency(value: object, field: str) -> None:
    check_int(value, field, low=1, high=1024)


def execution_timeouts(app: App, queues: Sequence[str],
                       timeouts: Mapping[str, float]) -> dict[str, float]:
    """Each of ``queues``' execution timeout, where it has one: its handler's own
    (``timeout=``), else the worker's ``timeouts[queue]``."""
    chosen: dict[str, float] = {}
    for name in queues:
        spec = app.handler_for(name)
        seconds = spec.timeout if spec and spec.timeout else timeouts.get(name)
        if seconds is not None:
            chosen[name] = seconds
    return chosen


def failure_reason(text: str) -> str:
    """``text`` as a failed attempt's reason: cut to ``_REASON_CHARS`` characters."""
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 1] + "…"


def refused_finish(finished: Finished, error: BaseException) -> Failed:
    """What a worker commits instead of a finish the store refused as a whole (a result
    that is not JSON, a follow-up or a wait that cannot be): the attempt fails, for good
    when retrying cannot change it (an input refused)."""
    return Failed(claim=finished.claim, retryable=not isinstance(error, InvalidInput),
                  reason=failure_reason(f"finish refused: {type(error).__name__}: {error}"))


def timed_out(claim: Claim, seconds: float) -> Failed:
    """What a worker commits for a handler that ran past its execution timeout: the attempt
    fails as retryable, naming the timeout."""
    return Failed(claim=claim, retryable=True,
                  reason=f"timed out: ran past its execution timeout of {seconds:g}s")


def outcome_of(claim: Claim, ctx: Context, run: Callable[[], Any]) -> Finished | Failed | None:
    """What a handler's end means, ``run`` being its call (or what returns or raises its
    coroutine's end): a finish with what it added to ``ctx``, a failure (permanent or
    retryable), or nothing (``Fenced``: abandoned)."""
    try:
        result = run()
    except PermanentFailure as exc:
        return Failed(claim=claim, reason=failure_reason(_described(exc)), retryable=False)
    except Fenced:
        return None
    except Exception as exc:
        reason = failure_reason(_described(exc))
        # The one place a handler's error is seen whole: its traceback, for whoever reads
        # the logs (the task keeps only ``last_error``).
        log.raised(_log, "handler raised", exc, task_id=claim.task_id, attempt=claim.attempt,
                   last_error=reason)
        return Failed(claim=claim, reason=reason, retryable=True)
    return Finished(claim=claim, result=result, follow_ups=ctx.follow_ups, waits=ctx.waits,
                    charge=ctx.charged, side_effects=ctx.side_effects)


def _described(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Exited(BaseException):
    """A coroutine on an ``EventLoopThread`` ended with ``SystemExit`` or
    ``KeyboardInterrupt`` (its ``__cause__``): a ``BaseException`` still, as what a handler
    ends with that is no failure, but one that leaves the loop running."""


async def _contained(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Exited(type(exc).__name__) from exc


class EventLoopThread:
    """One event loop on a thread of its own, where a worker runs every ``async def``
    handler: what one coroutine leaves on the loop (an async HTTP client, a connection
    pool, a lock) serves the next ones too, as it would in an asyncio program."""

    def __init__(self, name: str = "postroom-event-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=name)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coroutine`` on the loop; cancelling the future cancels it. A ``SystemExit``
        or ``KeyboardInterrupt`` it ends with becomes the future's exception (asyncio would
        raise it out of the loop, ending every coroutine on it)."""
        return asyncio.run_coroutine_threadsafe(_contained(coroutine), self.loop)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop's thread (cancelling a task there, say)."""
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        """Cancel the coroutines still running, let them unwind (up to 5 s), then stop and
        close the loop."""
        async def cancel_the_rest() -> None:
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        loop = self.loop
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), loop).result(5.0)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            loop.close()
