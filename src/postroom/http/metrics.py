"""``/metrics``: the store in Prometheus' text format, every name prefixed ``postroom_``.

Each scrape reads the store once (``Store.observe``, one snapshot), so every process that
serves the same store reports the same figures whatever it did itself: the numbers come from
durable rows, not from counters kept in memory. Where each one comes from:

=========================================== =====================================================
``tasks{queue,state}``                      pending and running tasks now (live rows)
``tasks_finished_total{queue,state}``       tasks that reached each terminal state, ever
                                            (``postroom_counts``: pruning keeps them)
``queue_paused{queue}``                     1 while an operator has paused the queue
``oldest_pending_task_age_seconds{queue}``  how long the next claimable task has waited
``queue_wait_seconds{queue}``               gauge histogram: created (or ``not_before``) to
                                            first claim, for tasks created in the window
``run_seconds{queue}``                      gauge histogram: start to end of each ended
                                            attempt of tasks created in the window
``attempts{queue,outcome}``                 attempts of tasks created in the window, by how
                                            each ended (``running`` while it has not)
``fenced_commits{queue}``                   of those, the ones their owner committed (done,
                                            retry, failed, released): each passed its fence
``lease_expiries{queue}``                   of those, the ones whose owner stopped renewing
``replies{queue,state}``                    replies pending, sending and dead now
``replies_sent_total{queue}``               replies the receiver acknowledged, ever
``replies_awaiting_endpoint{queue}``        pending replies whose requester has no endpoint
``outbox_oldest_pending_age_seconds{queue}`` how long the oldest undelivered reply has waited
``delivery_attempts{queue,result}``         delivery attempts of the window's tasks' replies,
                                            by result (``sending`` while one has none yet)
``dead_replies``                            dead replies now, every queue
``open_waits``                              wait generations still waiting
``waits{state}``                            wait generations the store holds, by outcome
                                            (pruning forgets ended ones)
``continuations_unconsumed``                ended waits whose continuation is still to resume
``observation_window_seconds``              the window the gauges above were drawn from
``observation_truncated``                   1 when the window held more tasks than one
                                            scrape reads (the oldest were left out)
``store_up``                                0 when the store could not be read (then only
                                            this is reported)
=========================================== =====================================================

The window's families are gauges (their values go down as tasks age out of it), so rate()
does not apply: read them as "over the last window". What is not durable is not derived: a
duplicate or conflicting submission writes nothing, by design, so those are counted by the
process that answered them (``SubmissionCounters``, names ``postroom_http_...``); sum them
over every serving process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.routing import Route

from postroom import AttemptOutcome, Observation, ReplyState, Store, TaskState
from postroom.errors import BatchFailed, PayloadCollision, PostroomError
from postroom.http.asgi import Receive, Scope, Send, send_body
from postroom.http.routing import Answer
from postroom.http.routing import Route as ApiRoute

__all__ = ["BUCKETS", "CONTENT_TYPE", "MetricsApp", "StoreCollector", "SubmissionCounters",
           "registry_for", "route"]

_log = logging.getLogger("postroom.http.metrics")

#: Upper bounds (seconds) of the queue wait and run time histograms.
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Prometheus' text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Attempt outcomes that are their owner's own commit, each checked against its fence.
_COMMITS = frozenset({AttemptOutcome.DONE, AttemptOutcome.RETRY, AttemptOutcome.FAILED,
                      AttemptOutcome.RELEASED})


class StoreCollector(Collector):
    """A Prometheus collector that reads ``store`` at every scrape.

    ``window`` (seconds) and ``limit`` (tasks) bound the recent history the histograms and
    attempt counts are drawn from; see the module docstring for each metric's source.
    """

    def __init__(self, store: Store, *, window: float = 900.0, limit: int = 10_000) -> None:
        self._store = store
        self._window = window
        self._limit = limit

    def collect(self) -> Iterator[Metric]:
        """The store's metrics, or only ``postroom_store_up 0`` when it cannot be read."""
        up = GaugeMetricFamily("postroom_store_up", "1 when the store could be read")
        try:
            seen = self._store.observe(window=self._window, limit=self._limit)
        except Exception:  # whatever broke, a scrape answers "down" rather than a 500
            _log.exception("the store could not be read for /metrics")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _status_families(seen)
        yield from _window_families(seen, self._window)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"postroom_{name}", doc, labels=list(labels))


def _status_families(seen: Observation) -> Iterator[Metric]:
    status = seen.status
    tasks = _gauge("tasks", "Live tasks by queue and state", ("queue", "state"))
    finished = CounterMetricFamily("postroom_tasks_finished", "Tasks that reached each "
                                   "terminal state, since the store began", labels=["queue",
                                                                                    "state"])
    paused = _gauge("queue_paused", "1 while an operator has paused the queue", ("queue",))
    oldest = _gauge("oldest_pending_task_age_seconds", "How long the next claimable task has "
                    "waited", ("queue",))
    replies = _gauge("replies", "Replies not yet sent, by state", ("queue", "state"))
    sent = CounterMetricFamily("postroom_replies_sent", "Replies the receiver acknowledged, "
                               "since the store began", labels=["queue"])
    parked = _gauge("replies_awaiting_endpoint", "Pending replies whose requester has no "
                    "endpoint", ("queue",))
    outbox_age = _gauge("outbox_oldest_pending_age_seconds", "How long the oldest undelivered "
                        "reply has waited", ("queue",))
    for name, queue in status.queues.items():
        tasks.add_metric([name, TaskState.PENDING.value], queue.received)
        tasks.add_metric([name, TaskState.RUNNING.value], queue.processing)
        for state, n in queue.outcomes.items():
            finished.add_metric([name, state.value], n)
        paused.add_metric([name], int(queue.paused))
        oldest.add_metric([name], queue.oldest_pending_age or 0.0)
        for reply_state in (ReplyState.PENDING, ReplyState.SENDING, ReplyState.DEAD):
            replies.add_metric([name, reply_state.value], queue.deliveries[reply_state])
        sent.add_metric([name], queue.deliveries[ReplyState.SENT])
        parked.add_metric([name], queue.awaiting_endpoint)
        outbox_age.add_metric([name], seen.oldest_pending_reply_age.get(name, 0.0))
    yield from (tasks, finished, paused, oldest, replies, sent, parked, outbox_age)
    for name, doc, value in (
            ("dead_replies", "Dead replies, every queue", status.dead_replies),
            ("open_waits", "Wait generations still waiting", status.open_waits),
            ("continuations_unconsumed", "Ended waits whose continuation is still to resume",
             status.continuations_unconsumed)):
        family = _gauge(name, doc)
        family.add_metric([], value)
        yield family
    waits = _gauge("waits", "Wait generations the store holds, by state", ("state",))
    for wait_state, n in sorted(seen.waits.items()):
        waits.add_metric([wait_state.value], n)
    yield waits


def _window_families(seen: Observation, window: float) -> Iterator[Metric]:
    waited: dict[str, list[float]] = {}
    ran: dict[str, list[float]] = {}
    attempts: Counter[tuple[str, str]] = Counter()
    deliveries: Counter[tuple[str, str]] = Counter()
    for timeline in seen.recent:
        task = timeline.task
        queue = task.queue
        waited.setdefault(queue, [])
        ran.setdefault(queue, [])
        if timeline.attempts:
            ready = max(task.created_at, task.not_before or task.created_at)
            waited[queue].append(max(0.0, timeline.attempts[0].started_at - ready))
        for attempt in timeline.attempts:
            attempts[queue, "running" if attempt.outcome is None else attempt.outcome.value] += 1
            if attempt.ended_at is not None:
                ran[queue].append(attempt.ended_at - attempt.started_at)
        for delivery in timeline.deliveries:
            deliveries[queue, "sending" if delivery.outcome is None
                       else delivery.outcome.value] += 1
    yield _histogram("queue_wait_seconds", "Created (or not_before) to first claim, tasks "
                     "created in the window", waited)
    yield _histogram("run_seconds", "Start to end of each ended attempt, tasks created in the "
                     "window", ran)
    by_outcome = _gauge("attempts", "Attempts of tasks created in the window, by outcome",
                        ("queue", "outcome"))
    commits = _gauge("fenced_commits", "Attempts of the window's tasks their owner committed "
                     "through its fence", ("queue",))
    expiries = _gauge("lease_expiries", "Attempts of the window's tasks whose lease expired",
                      ("queue",))
    for queue in sorted(waited):
        mine = {outcome: n for (q, outcome), n in attempts.items() if q == queue}
        for outcome, n in sorted(mine.items()):
            by_outcome.add_metric([queue, outcome], n)
        commits.add_metric([queue], sum(mine.get(kind.value, 0) for kind in _COMMITS))
        expiries.add_metric([queue], mine.get(AttemptOutcome.LEASE_EXPIRED.value, 0))
    delivered = _gauge("delivery_attempts", "Delivery attempts of the window's tasks' replies, "
                       "by result", ("queue", "result"))
    for (queue, result), n in sorted(deliveries.items()):
        delivered.add_metric([queue, result], n)
    yield from (by_outcome, commits, expiries, delivered)
    for name, doc, value in (
            ("observation_window_seconds", "The window the recent figures are drawn from",
             window),
            ("observation_truncated", "1 when the window held more tasks than a scrape reads",
             int(seen.truncated))):
        family = _gauge(name, doc)
        family.add_metric([], value)
        yield family


def _histogram(name: str, doc: str, samples: dict[str, list[float]]) -> Metric:
    family = GaugeHistogramMetricFamily(f"postroom_{name}", doc, labels=["queue"])
    for queue, values in sorted(samples.items()):
        buckets = [(str(bound), sum(1 for value in values if value <= bound))
                   for bound in BUCKETS]
        buckets.append(("+Inf", len(values)))
        family.add_metric([queue], buckets, gsum_value=sum(values))
    return family


class SubmissionCounters:
    """What this process answered that the store keeps no record of: a duplicate submission
    (the same identity and content again: answered from the stored task, nothing written)
    and a conflicting one (the same identity, other content: refused). Per process: sum
    them over every serving process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duplicates = PromCounter(
            "postroom_http_idempotency_duplicates", "Submissions answered as duplicates by "
            "this process", registry=registry)
        self.conflicts = PromCounter(
            "postroom_http_idempotency_conflicts", "Submissions refused as conflicting by this "
            "process", registry=registry)

    def observe(self, route: ApiRoute, outcome: Answer | PostroomError) -> None:
        """Count what a submission route answered (``create_app``'s ``observe``): each ACK
        that is a duplicate (a failed batch's committed prefix included), and each refusal
        for a collision."""
        if route.name not in _SUBMISSIONS:
            return
        if isinstance(outcome, Answer):
            body = outcome.body if isinstance(outcome.body, dict) else {}
            acks = body.get("acks", [body])
            duplicates = sum(1 for ack in acks if isinstance(ack, dict) and ack.get("duplicate"))
        elif isinstance(outcome, BatchFailed):
            duplicates = sum(1 for ack in outcome.acks if ack.duplicate)
            outcome = outcome.error if isinstance(outcome.error, PostroomError) else outcome
        else:
            duplicates = 0
        if duplicates:
            self.duplicates.inc(duplicates)
        if isinstance(outcome, PayloadCollision):
            self.conflicts.inc()


#: The routes whose answers ``SubmissionCounters`` counts.
_SUBMISSIONS = frozenset({"submit", "submit_batch", "submit_atomic"})


def registry_for(store: Store, *, window: float = 900.0,
                 limit: int = 10_000) -> CollectorRegistry:
    """A registry holding ``store``'s collector (add ``SubmissionCounters(registry)`` where
    a process answers submissions)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, window=window, limit=limit))
    return registry


class MetricsApp:
    """An ASGI app answering GET with ``registry``'s metrics (read in a worker thread: the
    store is synchronous)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            status, body, kind = 405, b"only GET reads the metrics\n", "text/plain"
        else:
            status, kind = 200, CONTENT_TYPE
            body = await asyncio.to_thread(generate_latest, self.registry)
        await send_body(send, status, body, kind, head=scope["method"] == "HEAD")


def route(store: Store, *, registry: CollectorRegistry | None = None) -> Route:
    """``/metrics`` as a Starlette route, to pass in ``create_app(..., extra_routes=...)``:
    ``registry``'s metrics, by default a new one with ``store``'s collector."""
    registry = registry if registry is not None else registry_for(store)
    return Route("/metrics", MetricsApp(registry), methods=["GET", "HEAD"], name="metrics")
