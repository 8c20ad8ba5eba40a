"""The records postroom takes and returns: frozen, typed, keyword-only."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

__all__ = [
    "Ack",
    "Approval",
    "ApprovalRequest",
    "AskedApproval",
    "Attempt",
    "AttemptOutcome",
    "AuthContext",
    "Budget",
    "Chain",
    "Claim",
    "CommittedEffect",
    "Continuation",
    "ContinuationKind",
    "DispatchReport",
    "Endpoint",
    "EndpointSecret",
    "Envelope",
    "ExpireResult",
    "Failed",
    "Finished",
    "FollowUp",
    "Missed",
    "Observation",
    "OpenResult",
    "OpenWait",
    "Outcome",
    "OutcomeKind",
    "Outgoing",
    "Page",
    "Periodic",
    "Position",
    "QueueStatus",
    "ReceiverAck",
    "Released",
    "Reply",
    "ReplyClaim",
    "ReplyState",
    "Requeue",
    "ResumeResult",
    "Resumption",
    "Retry",
    "Schedule",
    "Settled",
    "Settlement",
    "SideEffect",
    "SignalReceipt",
    "SignalResult",
    "StoreStatus",
    "Swept",
    "Task",
    "TaskState",
    "TaskStory",
    "Timeline",
    "Wait",
    "WaitOpening",
    "WaitState",
]


class TaskState(StrEnum):
    """Where a task is in its lifecycle. Terminal states are final."""

    PENDING = "pending"  # stored, waiting to be claimed (now or after a retry backoff)
    RUNNING = "running"  # claimed: has an owner, a lease and a fence
    DONE = "done"  # finished by its current owner; the result is in the reply
    FAILED = "failed"  # attempts exhausted or a non-retryable failure
    CANCELLED = "cancelled"  # cancelled while pending or running
    EXPIRED = "expired"  # the absolute deadline passed before it finished
    HOP_LIMIT = "hop_limit"  # arrived with hops >= its chain's max_hops
    BUDGET_EXHAUSTED = "budget_exhausted"  # its chain had spent its task or cost budget

    @property
    def terminal(self) -> bool:
        """Whether the state is final."""
        return self not in (TaskState.PENDING, TaskState.RUNNING)


class ReplyState(StrEnum):
    """Where a reply is in its delivery."""

    PENDING = "pending"  # waiting to be (re)sent, possibly after a backoff
    SENDING = "sending"  # claimed by a publisher: has an owner, a lease and a fence
    SENT = "sent"  # the receiver acknowledged it (possibly as a duplicate)
    DEAD = "dead"  # budget spent or permanently refused; needs an operator decision


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthContext:
    """An authenticated principal, handed in by a trusted adapter.

    Building one is not authentication: an HTTP server builds it only after checking a bearer
    token; an in-process caller builds it for itself. Never deserialize one from a request.
    ``role`` is the principal's role as the adapter knows it (``"agent"``, ``"worker"``,
    ``"human"``, ``"operator"``; ``None``: not said): only a ``"human"`` grants approvals.
    """

    principal: str
    role: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SideEffect:
    """A side effect a task declares with its finish: ``action`` on ``resource`` carrying
    ``data`` (JSON). The finish commits only if a human's approval of exactly that action,
    resource and data is usable then (``approval_id``, or any matching one), consuming one
    of its uses in the same transaction; the effect is then performed from the committed
    record, never by the handler before it."""

    action: str
    resource: str
    data: Any
    approval_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Approval:
    """A human's approval as stored: what it allows, how often, until when, and its uses."""

    approval_id: str
    action: str
    resource: str
    data: Any
    data_digest: str  # SHA-256 of the canonical JSON of ``data``
    max_uses: int
    uses: int
    expires_at: float
    granted_by: str  # the human principal that granted it
    requested_by: str  # who asked for it
    granted_at: float
    revoked_at: float | None = None
    revoked_by: str | None = None
    revoke_reason: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Approval:
        """Build from an ``approvals`` row."""
        return cls(approval_id=row["approval_id"], action=row["action"],
                   resource=row["resource"], data=json.loads(row["data"]),
                   data_digest=row["data_digest"], max_uses=int(row["max_uses"]),
                   uses=int(row["uses"]), expires_at=float(row["expires_at"]),
                   granted_by=row["granted_by"], requested_by=row["requested_by"],
                   granted_at=float(row["granted_at"]),
                   revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
                   revoked_by=row["revoked_by"], revoke_reason=row["revoke_reason"])


@dataclass(frozen=True, kw_only=True, slots=True)
class AskedApproval:
    """A task's request for a human's approval, asked by the wait generation it opened and
    addressed to ``responder``: what the approval would allow, and the answer once given."""

    flow: str
    step: str
    generation: int
    approval_id: str  # the approval an accepted "approve" answer grants
    action: str
    resource: str
    data: Any
    max_uses: int
    expires_at: float
    requested_by: str  # the task that asked
    responder: str  # the only human whose answer counts
    answer: str | None = None  # "granted" or "denied" once answered
    answered_at: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AskedApproval:
        """Build from an ``approval_requests`` row."""
        return cls(flow=row["flow"], step=row["step"], generation=int(row["generation"]),
                   approval_id=row["approval_id"], action=row["action"],
                   resource=row["resource"], data=json.loads(row["data"]),
                   max_uses=int(row["max_uses"]), expires_at=float(row["expires_at"]),
                   requested_by=row["requested_by"], responder=row["responder"],
                   answer=row["answer"],
                   answered_at=None if row["answered_at"] is None else float(
                       row["answered_at"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class CommittedEffect:
    """A side effect as committed with its task's finish: the record the external effect is
    performed from, with the approval use it consumed and who granted that approval.

    ``granted_by`` and ``granted_at`` are ``None`` only if the approval's record is missing
    (approvals are never pruned; ``postroom audit`` reports such an effect).
    """

    task_id: str
    number: int  # its place among the task's side effects, from 1
    action: str
    resource: str
    data: Any
    data_digest: str  # SHA-256 of the canonical JSON of ``data``
    approval_id: str
    use_number: int  # which use of the approval it was, from 1
    created_at: float  # when it committed, consuming the use
    granted_by: str | None = None  # the human principal that granted the approval
    granted_at: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CommittedEffect:
        """Build from a ``side_effects`` row joined with its approval's ``granted_by`` and
        ``granted_at``."""
        return cls(task_id=row["task_id"], number=int(row["number"]), action=row["action"],
                   resource=row["resource"], data=json.loads(row["data"]),
                   data_digest=row["data_digest"], approval_id=row["approval_id"],
                   use_number=int(row["use_number"]), created_at=float(row["created_at"]),
                   granted_by=row["granted_by"],
                   granted_at=None if row["granted_at"] is None else float(row["granted_at"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """What a chain's root asks its chain to stay within: at most ``hops`` hops from the
    root, ``tasks`` tasks admitted to run, ``cost`` units charged by its handlers.

    Each may only lower the store's setting (``max_hops``, ``max_chain_tasks``,
    ``max_chain_cost``); a larger one leaves the store's, and ``None`` takes it.
    """

    hops: int | None = None
    tasks: int | None = None
    cost: int | None = None

    def to_dict(self) -> dict[str, int]:
        """The budgets given, by name (those left ``None`` are not in it)."""
        return {name: value for name, value in (("cost", self.cost), ("hops", self.hops),
                                                ("tasks", self.tasks)) if value is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """A message asking for work. Validated by the store before anything is written."""

    message_id: str
    sender: str
    payload: Mapping[str, Any]
    deadline: float
    max_attempts: int = 3
    hops: int = 0
    kind: str = "task"
    queue: str = "default"
    correlation_id: str | None = None
    parent_task_id: str | None = None
    #: Not claimable before this time (seconds since the epoch, the store's clock); the task
    #: is stored at once, and the ACK still means "durably stored".
    not_before: float | None = None
    #: -10..10, higher first: a level is worth ``Settings.priority_weight`` seconds of
    #: waiting, so a lower priority is never starved (see ``Settings.priority_weight``).
    priority: int = 0
    #: The chain's budgets, lowered for the chain this envelope starts (a root only: one
    #: naming ``parent_task_id`` is in its parent's chain and refused with a budget).
    budget: Budget | None = None

    def to_dict(self) -> dict[str, Any]:
        """The envelope's fields as a plain dict."""
        return {
            "budget": None if self.budget is None else (
                self.budget.to_dict() if isinstance(self.budget, Budget) else self.budget),
            "message_id": self.message_id,
            "sender": self.sender,
            "payload": self.payload,
            "deadline": self.deadline,
            "max_attempts": self.max_attempts,
            "hops": self.hops,
            "kind": self.kind,
            "queue": self.queue,
            "correlation_id": self.correlation_id,
            "parent_task_id": self.parent_task_id,
            "not_before": self.not_before,
            "priority": self.priority,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Position:
    """Where a message sits in a numbered upstream stream (``seq`` counts from 1)."""

    stream: str
    seq: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Ack:
    """The receipt for a stored message. It means "durably stored", never "done"."""

    task_id: str
    duplicate: bool
    ack: str = "stored"

    def to_dict(self) -> dict[str, Any]:
        """``{"ack": "stored", "task_id": ..., "duplicate": ...}``."""
        return {"ack": self.ack, "task_id": self.task_id, "duplicate": self.duplicate}


@dataclass(frozen=True, kw_only=True, slots=True)
class FollowUp:
    """A task created atomically with its parent's ``finish``, or with a wait's ``resume``.

    Its identity is derived from where it comes from (the parent task, or the wait generation)
    and ``message_id``; hops and parent are computed by postroom. ``queue`` and ``deadline``
    default to the parent's.
    """

    message_id: str
    payload: Mapping[str, Any]
    queue: str | None = None
    deadline: float | None = None
    max_attempts: int = 3
    correlation_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRequest:
    """What a task asks a human to approve, with the wait it opens: ``action`` on
    ``resource`` carrying ``data``, ``max_uses`` times, until ``expires_at``."""

    action: str
    resource: str
    data: Any
    expires_at: float
    max_uses: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class OpenWait:
    """A wait to open with a task's ``finish``, in the same transaction: the task is done,
    and the flow waits for the outside world's answer (SPEC §10).

    The wait's ``task_id`` is the finishing task, so its follow-up (``resume``) is the
    task's child. Fields as ``Store.open_wait``'s.
    """

    flow: str
    step: str
    deadline: float
    expected_generation: int = 0
    request_id: str | None = None
    responder: str | None = None
    #: Ask the responder (a human) for this approval: their answer (``Store.answer_approval``)
    #: grants or denies it and signals the wait, in one transaction.
    approval: ApprovalRequest | None = None
    #: Fan-in: postroom answers this wait itself when the last child of the finishing task
    #: ends, with every child's outcome (``{"children": [{"task_id", "message_id", "status",
    #: "result", "error"}, ...]}``); no principal can signal it (no ``responder``).
    children: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """A worker's current hold on a task. Pass it back to renew, finish, fail or release.

    Every field is the task's as it was claimed; a claim whose fields differ from its task's
    (other than ``lease_until``, which ``renew`` moves) is not that task's claim, and is
    ``Fenced``. ``requester`` is who the reply goes to: the principal that sent the task's
    chain's root.
    """

    task_id: str
    owner: str
    fence: int
    attempt: int
    max_attempts: int
    payload: dict[str, Any]
    queue: str
    hops: int
    deadline: float
    lease_until: float
    principal: str
    message_id: str
    correlation_id: str | None = None
    requester: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Finished:
    """A handler's outcome: the task is done with ``result``; its follow-ups and waits commit
    with it (see ``Store.finish``)."""

    claim: Claim
    result: Any = None
    follow_ups: Sequence[FollowUp] = ()
    waits: Sequence[OpenWait] = ()
    #: Cost units charged to the task's chain, committed with the finish.
    charge: int = 0
    #: Side effects committed with the finish, each consuming a human's approval.
    side_effects: Sequence[SideEffect] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Failed:
    """A handler's outcome: the attempt failed (see ``Store.fail``)."""

    claim: Claim
    reason: str
    retryable: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Released:
    """A handler's outcome: the task is handed back unfinished (see ``Store.release``)."""

    claim: Claim
    delay: float = 0.0


#: What ``Store.settle`` takes: one handler's outcome per claim.
Settlement = Finished | Failed | Released


@dataclass(frozen=True, kw_only=True, slots=True)
class Settled:
    """What ``Store.settle`` did with one outcome: committed (``state`` is the task's new
    state, ``openings`` the waits a finish opened), or refused with ``error`` (``Fenced``,
    ``WaitNotOpened``, ``InvalidInput``, a follow-up's ``PayloadCollision``, ...), in which
    case nothing of it was written."""

    task_id: str
    state: TaskState | None = None
    error: Exception | None = None
    openings: tuple[WaitOpening, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the outcome committed."""
        return self.error is None


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """A task as stored."""

    task_id: str
    principal: str
    message_id: str
    queue: str
    state: TaskState
    payload: dict[str, Any]
    deadline: float
    max_attempts: int
    hops: int
    parent_task_id: str | None
    correlation_id: str | None
    requester: str | None  # who the reply goes to: the principal that sent the chain's root
    attempts: int
    fence: int
    owner: str | None
    lease_until: float | None
    available_at: float
    result: Any
    last_error: str | None
    created_at: float
    updated_at: float
    not_before: float | None = None  # not claimable before this time (``None``: at once)
    priority: int = 0  # -10..10, higher first (see ``Settings.priority_weight``)
    retry_of: str | None = None  # the task an operator's re-run repeats
    root_task_id: str | None = None  # the root of its chain (itself for a root)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        """Build from a ``tasks`` row."""
        return cls(
            task_id=row["task_id"],
            principal=row["principal"],
            message_id=row["message_id"],
            queue=row["queue"],
            state=TaskState(row["state"]),
            payload=json.loads(row["payload"]),
            deadline=float(row["deadline"]),
            max_attempts=int(row["max_attempts"]),
            hops=int(row["hops"]),
            parent_task_id=row["parent_task_id"],
            correlation_id=row["correlation_id"],
            requester=row["requester"],
            attempts=int(row["attempts"]),
            fence=int(row["fence"]),
            owner=row["owner"],
            lease_until=None if row["lease_until"] is None else float(row["lease_until"]),
            available_at=float(row["available_at"]),
            result=None if row["result"] is None else json.loads(row["result"]),
            last_error=row["last_error"],
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
            not_before=None if row["not_before"] is None else float(row["not_before"]),
            priority=int(row["priority"]),
            retry_of=row["retry_of"],
            root_task_id=row["root_task_id"] or row["task_id"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Chain:
    """A task chain as stored: its root, budgets and what it has spent."""

    root_task_id: str
    principal: str  # the principal that sent the root
    max_hops: int
    max_tasks: int
    max_cost: int | None  # ``None``: no cost budget
    tasks: int  # tasks admitted to run, the root included
    cost: int  # units its handlers charged
    created_at: float
    cancelled_at: float | None = None  # when its root was cancelled, with its live tasks
    cancel_reason: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Chain:
        """Build from a ``chains`` row."""
        return cls(root_task_id=row["root_task_id"], principal=row["principal"],
                   max_hops=int(row["max_hops"]), max_tasks=int(row["max_tasks"]),
                   max_cost=None if row["max_cost"] is None else int(row["max_cost"]),
                   tasks=int(row["tasks"]), cost=int(row["cost"]),
                   created_at=float(row["created_at"]),
                   cancelled_at=(None if row["cancelled_at"] is None
                                 else float(row["cancelled_at"])),
                   cancel_reason=row["cancel_reason"])


@dataclass(frozen=True, kw_only=True, slots=True)
class Reply:
    """A terminal task's reply in the outbox, as stored."""

    reply_id: str
    task_id: str
    status: TaskState
    body: str  # canonical JSON; never changes
    fingerprint: str
    requester: str | None  # who it goes to (see Task.requester)
    queue: str | None  # its task's queue
    state: ReplyState
    attempts: int
    budget: int
    fence: int
    owner: str | None
    lease_until: float | None
    available_at: float  # when it is due; a sending one, when its lease runs out
    last_error: str | None
    created_at: float
    sent_at: float | None

    @property
    def document(self) -> dict[str, Any]:
        """The body parsed: ``{"kind": "result", "task_id", "status", "result",
        "requester", "correlation_id", "parent_task_id"}`` (replies written before routing
        was stored carry only the first four)."""
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Reply:
        """Build from a ``replies`` row."""
        return cls(
            reply_id=row["reply_id"],
            task_id=row["task_id"],
            status=TaskState(row["status"]),
            body=row["body"],
            fingerprint=row["fingerprint"],
            requester=row["requester"],
            queue=row["queue"],
            state=ReplyState(row["state"]),
            attempts=int(row["attempts"]),
            budget=int(row["budget"]),
            fence=int(row["fence"]),
            owner=row["owner"],
            lease_until=None if row["lease_until"] is None else float(row["lease_until"]),
            available_at=float(row["available_at"]),
            last_error=row["last_error"],
            created_at=float(row["created_at"]),
            sent_at=None if row["sent_at"] is None else float(row["sent_at"]),
        )


class AttemptOutcome(StrEnum):
    """How one attempt (of a task's run, or of a reply's delivery) ended."""

    DONE = "done"  # finished: the task is done
    RETRY = "retry"  # a retryable failure: the task runs again after a backoff
    FAILED = "failed"  # a failure that ends the task (not retryable, or its last attempt)
    RELEASED = "released"  # handed back unfinished (a shutdown): the attempt is given back
    LEASE_EXPIRED = "lease_expired"  # its owner stopped renewing
    EXPIRED = "expired"  # the task's deadline passed while it ran
    CANCELLED = "cancelled"  # the task was cancelled while it ran
    DELIVERED = "delivered"  # a delivery the receiver acknowledged
    TRANSIENT = "transient"  # a delivery that may succeed later
    PERMANENT = "permanent"  # a delivery refused for good
    COLLISION = "collision"  # the receiver holds the reply_id with other content
    GONE = "gone"  # the endpoint answered 410 Gone: the reply is dead, the endpoint disabled


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """One attempt of a task's run (or of a reply's delivery), as its row keeps it.

    ``ended_at``, ``outcome`` and ``error`` are ``None`` while it runs.
    """

    attempt: int
    fence: int
    owner: str
    started_at: float
    ended_at: float | None = None
    outcome: AttemptOutcome | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> Attempt:
        """Build from one element of a stored ``history`` array."""
        outcome = item.get("outcome")
        ended = item.get("ended_at")
        return cls(attempt=int(item["attempt"]), fence=int(item["fence"]),
                   owner=str(item["owner"]), started_at=float(item["started_at"]),
                   ended_at=None if ended is None else float(ended),
                   outcome=None if outcome is None else AttemptOutcome(outcome),
                   error=item.get("error"))

    @classmethod
    def list_from(cls, history: str | None) -> list[Attempt]:
        """The attempts a ``history`` column holds, oldest first."""
        return [] if history is None else [cls.from_json(item) for item in json.loads(history)]


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskStory:
    """A task's whole durable story, read in one snapshot: the task; each attempt to run it
    (owner, fence, start, end, how it ended); its reply and each attempt to deliver it; the
    operators' requeues of that reply; the waits it opened; its chain (root, budgets, what
    it spent; its own parent and hops are the task's); and the side effects it committed,
    each with the approval use it consumed."""

    task: Task
    attempts: list[Attempt]
    reply: Reply | None
    deliveries: list[Attempt]
    requeues: list[Requeue]
    waits: list[Wait]
    chain: Chain | None = None
    side_effects: list[CommittedEffect] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """A recorded operator decision to run a failed, expired or cancelled task again: the
    ``number``-th re-run of ``task_id``, which made ``new_task_id``."""

    task_id: str
    number: int
    new_task_id: str
    operator: str
    reason: str
    retried_at: float
    #: The id of the request that made it, if it named one (the same request again gets
    #: this decision back).
    request_id: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Retry:
        """Build from a ``task_retries`` row."""
        return cls(task_id=row["task_id"], number=int(row["number"]),
                   new_task_id=row["new_task_id"], operator=row["operator"],
                   reason=row["reason"], retried_at=float(row["retried_at"]),
                   request_id=row["request_id"])


class Missed(StrEnum):
    """What a periodic schedule does after an outage (every host down, or it was paused)
    that let at least one whole period pass without its task."""

    ONCE = "once"  # enqueue the latest period that began, once; the earlier ones are dropped
    SKIP = "skip"  # enqueue none of them; the next task is the next period's


@dataclass(frozen=True, kw_only=True, slots=True)
class Periodic:
    """A periodic schedule: one task of ``payload`` on ``queue`` per period of ``cron`` (in
    ``zone``, ``None`` for UTC), identified by the schedule and the period's start.

    A period's task has the deadline ``period start + ttl`` (``ttl`` ``None``: the next
    period's start). ``last_period`` is the latest period handled (enqueued, or dropped by
    the ``missed`` policy), ``last_task_id`` the latest task enqueued, and ``next_at`` when
    the next period begins.
    """

    name: str
    cron: str
    zone: str | None
    queue: str
    payload: Any
    priority: int
    max_attempts: int
    ttl: float | None
    missed: Missed
    paused: bool
    last_period: float | None
    last_task_id: str | None
    next_at: float
    created_by: str
    created_at: float
    updated_by: str
    updated_at: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Periodic:
        """Build from a ``schedules`` row."""
        return cls(name=row["name"], cron=row["cron"], zone=row["zone"], queue=row["queue"],
                   payload=json.loads(row["payload"]), priority=int(row["priority"]),
                   max_attempts=int(row["max_attempts"]),
                   ttl=None if row["ttl"] is None else float(row["ttl"]),
                   missed=Missed(row["missed"]), paused=bool(row["paused"]),
                   last_period=(None if row["last_period"] is None
                                else float(row["last_period"])), last_task_id=row["last_task_id"],
                   next_at=float(row["next_at"]), created_by=row["created_by"],
                   created_at=float(row["created_at"]), updated_by=row["updated_by"],
                   updated_at=float(row["updated_at"]))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping of every field."""
        return asdict(self) | {"missed": self.missed.value}


@dataclass(frozen=True, kw_only=True, slots=True)
class Requeue:
    """A recorded operator decision to send a dead reply again."""

    reply_id: str
    operator: str
    reason: str
    requeued_at: float
    previous_attempts: int
    previous_error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Requeue:
        """Build from a ``reply_requeues`` row."""
        return cls(reply_id=row["reply_id"], operator=row["operator"], reason=row["reason"],
                   requeued_at=float(row["requeued_at"]),
                   previous_attempts=int(row["previous_attempts"]),
                   previous_error=row["previous_error"])


@dataclass(frozen=True, kw_only=True, slots=True)
class Outgoing:
    """A reply handed to a transport: its stable id and its fixed canonical body."""

    reply_id: str
    body: str
    fingerprint: str


class OutcomeKind(StrEnum):
    """What a transport learned about one delivery."""

    DELIVERED = "delivered"  # the receiver acknowledged (new or duplicate)
    TRANSIENT = "transient"  # ACK lost, timeout, connection error, 5xx: try again later
    PERMANENT = "permanent"  # refused for good (4xx other than 408/409/429)
    COLLISION = "collision"  # the receiver holds this reply_id with different content
    GONE = "gone"  # the endpoint answered 410 Gone: dead, and the endpoint is disabled


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """The result of delivering one ``Outgoing``.

    ``delay`` is the earliest retry a transient failure asks for, in seconds from when it is
    recorded (an endpoint's schedule, a ``Retry-After``); ``None`` takes the store's
    ``delivery_backoff``. Other kinds never retry, so it means nothing for them.
    """

    kind: OutcomeKind
    detail: str = ""
    duplicate: bool = False
    delay: float | None = None

    @classmethod
    def delivered(cls, *, duplicate: bool = False) -> Outcome:
        """The receiver has it."""
        return cls(kind=OutcomeKind.DELIVERED, duplicate=duplicate)

    @classmethod
    def transient(cls, detail: str, *, delay: float | None = None) -> Outcome:
        """Try again later: after ``delay`` seconds, or the store's backoff if ``None``."""
        return cls(kind=OutcomeKind.TRANSIENT, detail=detail, delay=delay)

    @classmethod
    def permanent(cls, detail: str) -> Outcome:
        """Never going to work as sent."""
        return cls(kind=OutcomeKind.PERMANENT, detail=detail)

    @classmethod
    def collision(cls, detail: str) -> Outcome:
        """The receiver has different content under this reply_id."""
        return cls(kind=OutcomeKind.COLLISION, detail=detail)

    @classmethod
    def gone(cls, detail: str) -> Outcome:
        """The endpoint is gone (HTTP 410): nothing more is sent to it until re-enabled."""
        return cls(kind=OutcomeKind.GONE, detail=detail)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplyClaim:
    """A publisher's current hold on a reply."""

    reply_id: str
    task_id: str
    owner: str
    fence: int
    attempt: int
    budget: int
    lease_until: float
    body: str
    fingerprint: str
    requester: str | None = None  # whose endpoint it goes to

    def outgoing(self) -> Outgoing:
        """What the transport sends."""
        return Outgoing(reply_id=self.reply_id, body=self.body, fingerprint=self.fingerprint)


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """When a transient delivery failure is tried again: ``delays[n-1]`` seconds after the
    ``n``-th attempt failed, the last delay repeating (so it is also the cap), each scaled by a
    random factor in ``[1 - jitter, 1]`` so that replies failing together spread out.

    No ``delays`` means the store's own ``delivery_backoff`` (capped exponential with jitter
    by default). ``name`` is a preset's (``postroom.endpoints.SCHEDULES``) or ``"custom"``.
    """

    name: str
    delays: tuple[float, ...] = ()
    jitter: float = 0.1

    def delay(self, attempt: int, rng: random.Random) -> float | None:
        """Seconds to wait after ``attempt`` (1-based) failed; ``None``: the store's backoff."""
        if not self.delays:
            return None
        base = self.delays[min(max(attempt, 1), len(self.delays)) - 1]
        return float(base) * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointSecret:
    """One signing secret of an endpoint: ``whsec_`` and the base64 of its key bytes.

    It is stored as it is, because the sender must compute an HMAC with it: whoever reads the
    store's database can sign as postroom. Active until ``expires_at`` (``None``: no expiry).
    """

    secret: str = field(repr=False)
    created_at: float
    expires_at: float | None = None

    def active(self, now: float) -> bool:
        """Whether postroom still signs with it at ``now``."""
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True, kw_only=True, slots=True)
class Endpoint:
    """Where one principal's replies are delivered, and how (one endpoint per principal).

    ``secrets`` are newest first; every active one signs each delivery, so a receiver that
    knows any of them accepts it during a rotation. ``allow_private`` lets the sender connect
    to loopback, private and link-local addresses, which it otherwise refuses. ``budget`` is
    fixed on a reply when it is first claimed for this endpoint; ``concurrency`` bounds the
    deliveries in flight to it. A disabled endpoint (``disabled_reason``, e.g. "410 Gone at
    ...") gets nothing until it is enabled again; its replies wait.
    """

    principal: str
    url: str
    secrets: tuple[EndpointSecret, ...] = field(repr=False)
    allow_private: bool
    schedule: Schedule
    budget: int
    concurrency: int
    created_at: float
    updated_at: float
    disabled_at: float | None = None
    disabled_reason: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether replies are delivered to it."""
        return self.disabled_at is None

    def signing_secrets(self, now: float) -> list[str]:
        """The secrets to sign with at ``now``, newest first."""
        return [item.secret for item in self.secrets if item.active(now)]

    def to_dict(self, *, now: float) -> dict[str, Any]:
        """A plain description for listings: everything but the secrets themselves (their
        creation and expiry times, and which are active at ``now``, are shown)."""
        return {"principal": self.principal, "url": self.url,
                "enabled": self.enabled, "disabled_at": self.disabled_at,
                "disabled_reason": self.disabled_reason, "allow_private": self.allow_private,
                "schedule": self.schedule.name, "delays": list(self.schedule.delays),
                "budget": self.budget, "concurrency": self.concurrency,
                "secrets": [{"created_at": item.created_at, "expires_at": item.expires_at,
                             "active": item.active(now)} for item in self.secrets],
                "created_at": self.created_at, "updated_at": self.updated_at}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReceiverAck:
    """The receiver's answer: it holds the reply (``duplicate`` if it already did)."""

    reply_id: str
    duplicate: bool
    ack: str = "received"


@dataclass(frozen=True, kw_only=True, slots=True)
class Swept:
    """What one bounded sweep changed."""

    leases_recovered: int = 0  # running -> pending
    attempts_exhausted: int = 0  # running -> failed (lease expired on the last attempt)
    deadlines_expired: int = 0  # pending/running -> expired
    deliveries_recovered: int = 0  # sending -> pending
    deliveries_dead: int = 0  # sending -> dead (outcome unknown, budget spent)

    @property
    def total(self) -> int:
        """How many records changed."""
        return sum(asdict(self).values())


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchReport:
    """What one dispatch step did."""

    claimed: int = 0
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    fenced: list[str] = field(default_factory=list)


# -- waits, signals, timeouts, continuations (SPEC §5) ----------------------------------------


class WaitState(StrEnum):
    """Where one generation of a wait is. ``signaled`` and ``timed_out`` are final."""

    WAITING = "waiting"  # open: a signal before the deadline can still be accepted
    SIGNALED = "signaled"  # a signal was accepted before the deadline
    TIMED_OUT = "timed_out"  # the deadline passed first (decided by expire, a sweep or a signal)


class ContinuationKind(StrEnum):
    """Why a wait may continue: which outcome its continuation carries."""

    SIGNAL = "signal"  # the accepted signal's value
    TIMEOUT = "timeout"  # nobody answered in time


class OpenResult(StrEnum):
    """What ``open_wait`` decided."""

    OPENED = "opened"  # a new generation (expected + 1) is waiting
    STALE = "stale"  # the slot is not at the expected generation: someone else opened it
    BUSY = "busy"  # the current generation is still waiting
    PENDING_CONTINUATION = "pending_continuation"  # it ended; its continuation is unconsumed


class SignalResult(StrEnum):
    """What ``signal`` decided. Every result but ``replay`` and ``conflict`` is a receipt."""

    ACCEPTED = "accepted"  # the wait was waiting and now < deadline: it is signaled
    TOO_LATE = "too_late"  # the wait was waiting but its deadline passed: now it is timed out
    STALE_GENERATION = "stale_generation"  # an older generation than the slot's current one
    CLOSED = "closed"  # this generation had already ended
    UNKNOWN_WAIT = "unknown_wait"  # no such wait (yet): e.g. the signal arrived early
    REPLAY = "replay"  # this event was seen with the same body: its receipt, unchanged
    CONFLICT = "conflict"  # this event was seen with a different body: nothing written


class ExpireResult(StrEnum):
    """What ``expire`` decided about one wait generation."""

    TIMED_OUT = "timed_out"  # it was waiting past its deadline: timed out by this call
    CLOSED = "closed"  # it had already ended (signaled or timed out)
    NOT_DUE = "not_due"  # still waiting and its deadline has not come
    UNKNOWN_WAIT = "unknown_wait"  # no such wait


class ResumeResult(StrEnum):
    """What ``resume`` did with a continuation."""

    RESUMED = "resumed"  # consumed now, its local effect applied in the same transaction
    REPLAY = "replay"  # already consumed earlier: nothing done again


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitOpening:
    """The answer to ``open_wait``.

    ``generation`` is the slot's current generation after the call: the new one when
    ``opened``, otherwise the one that stopped this call. ``replay`` is true when a retried
    ``request_id`` returned the answer its first, committed call got.
    """

    result: OpenResult
    flow: str
    step: str
    generation: int
    replay: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class SignalReceipt:
    """The answer to ``signal``.

    ``result`` is what this call did; ``recorded`` is the outcome stored for the event (equal
    to ``result`` for a new receipt; the original outcome for a ``replay``; the stored
    outcome of the other body for a ``conflict``).
    """

    result: SignalResult
    recorded: SignalResult
    principal: str
    event_id: str
    flow: str
    step: str
    generation: int
    received_at: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, result: SignalResult | None = None
                 ) -> SignalReceipt:
        """Build from a ``wait_receipts`` row: the outcome it stores is ``recorded``, and
        ``result`` too unless the call that read it decided another (a replay, a conflict)."""
        recorded = SignalResult(row["result"])
        return cls(result=recorded if result is None else result, recorded=recorded,
                   principal=row["principal"], event_id=row["event_id"], flow=row["flow"],
                   step=row["step"], generation=int(row["generation"]),
                   received_at=float(row["received_at"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Resumption:
    """The answer to ``resume``: the continuation consumed and its local effect.

    ``task_id`` is the follow-up task its effect enqueued (``None`` if the effect was to
    enqueue nothing). A ``replay`` reports the effect applied the first time.
    """

    result: ResumeResult
    flow: str
    step: str
    generation: int
    kind: ContinuationKind
    task_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Wait:
    """One generation of a wait, as stored."""

    flow: str
    step: str
    generation: int
    state: WaitState
    deadline: float
    task_id: str | None  # the parent of the follow-up its resume enqueues
    request_id: str | None
    opened_at: float
    ended_at: float | None
    event_principal: str | None  # who sent the accepted signal (when signaled)
    event_id: str | None
    responder: str | None = None  # the only principal whose signal it adopts (None: any)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Wait:
        """Build from a ``waits`` row."""
        return cls(
            flow=row["flow"],
            step=row["step"],
            generation=int(row["generation"]),
            state=WaitState(row["state"]),
            deadline=float(row["deadline"]),
            task_id=row["task_id"],
            request_id=row["request_id"],
            opened_at=float(row["opened_at"]),
            ended_at=None if row["ended_at"] is None else float(row["ended_at"]),
            event_principal=row["event_principal"],
            event_id=row["event_id"],
            responder=row["responder"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Continuation:
    """A durable "may continue" record, written with its wait's terminal state.

    ``value`` is the accepted signal's value (``None`` for a timeout). Pass ``flow``,
    ``step`` and ``generation`` to ``resume`` to consume it.
    """

    flow: str
    step: str
    generation: int
    kind: ContinuationKind
    value: Any
    task_id: str | None  # the wait's parent task, if it has one
    created_at: float
    consumed_at: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Continuation:
        """Build from a ``wait_continuations`` row joined with its wait's ``task_id``."""
        return cls(
            flow=row["flow"],
            step=row["step"],
            generation=int(row["generation"]),
            kind=ContinuationKind(row["kind"]),
            value=None if row["value"] is None else json.loads(row["value"]),
            task_id=row["task_id"],
            created_at=float(row["created_at"]),
            consumed_at=None if row["consumed_at"] is None else float(row["consumed_at"]),
        )


# -- reading: the store's status and its listings -----------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, in the listing's order.

    ``next_cursor`` continues the listing after the last item (pass it back as ``cursor=``
    with the same filters), or is ``None`` when this page is the last. Pages follow a key,
    not an offset: a record written between two pages never shifts the next one, so none is
    seen twice. A cursor is opaque and carries the listing and filters that made it.
    """

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueStatus:
    """One queue's work, stage by stage; the stages are never folded into one "ok".

    ``received`` tasks are pending (waiting to be claimed, now or after a backoff) and
    ``processing`` ones running. ``outcomes`` counts, for every terminal task state, the tasks
    that ever reached it (cumulative since the store began: pruning does not take them back).
    ``paused`` says an operator paused it (``Store.pause_queue``): its tasks wait, unclaimed.
    ``deliveries`` counts replies by delivery state: ``pending``, ``sending`` and ``dead`` as
    they are now, ``sent`` cumulative like the outcomes; ``awaiting_endpoint`` is how many of
    the pending ones wait for their requester to have an endpoint (they spend no delivery
    attempt meanwhile). ``oldest_pending_age`` is how long the next claimable task has been
    claimable (seconds; ``None`` when none is).
    """

    queue: str
    received: int
    processing: int
    outcomes: dict[TaskState, int]
    deliveries: dict[ReplyState, int]
    awaiting_endpoint: int
    oldest_pending_age: float | None
    paused: bool = False  # an operator paused it: none of its tasks is claimed


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreStatus:
    """What a store holds, read in one snapshot at ``at``: every queue that has live work or
    any history (by name), the open waits, the dead replies (all queues) and the
    continuations still to resume."""

    at: float
    queues: dict[str, QueueStatus]
    open_waits: int
    dead_replies: int
    continuations_unconsumed: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    """One task's times as its row keeps them: when it was created (and first claimable),
    each run attempt, and each delivery attempt of its reply (empty while it has none)."""

    task: Task
    attempts: list[Attempt]
    deliveries: list[Attempt]


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What metrics and charts are drawn from, read in one snapshot at ``status.at``.

    ``status`` is ``Store.status()``. ``recent`` are the tasks created in the window
    ``[since, status.at]``, newest first, at most the limit asked for (``truncated`` says the
    limit cut the window short: the oldest were left out). ``pending_before`` counts the
    tasks created before ``since`` that are still pending (they were queued through the
    whole window). ``oldest_pending_reply_age`` is, per queue, how long its oldest
    undelivered (pending or sending) reply has waited, in seconds. ``waits`` counts wait
    generations by state as the store still holds them (pruning forgets ended ones).
    """

    status: StoreStatus
    since: float
    recent: list[Timeline]
    truncated: bool
    pending_before: int
    oldest_pending_reply_age: dict[str, float]
    waits: dict[WaitState, int]
