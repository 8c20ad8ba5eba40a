"""postroom: durable coordination for multi-agent systems.

Agents hand tasks to each other through a store (SQLite or PostgreSQL). Work survives
crashes, reconnects and duplicate delivery; each result reaches its requester exactly once in
effect; every state is explained by durable records.

    store = postroom.open_store("sqlite:///work.db")
    ack = store.receive(postroom.AuthContext(principal="planner"), envelope)
    claim = store.claim("worker-1")
    store.finish(claim, {"answer": 42})
    store.dispatch(postroom.InProcessTransport(receiver))

    opened = store.open_wait("refund-17", "approval", 0, deadline)      # ask, with a deadline
    store.signal(postroom.AuthContext(principal="alice"), "mail-1", "refund-17", "approval",
                 opened.generation, {"approve": True})                   # the answer arrives
    for c in store.continuations():                                      # after any restart
        store.resume(c.flow, c.step, c.generation, None)                 # exactly once
"""

from postroom.clock import Clock, ManualClock, SystemClock
from postroom.db.wakeups import Waiter
from postroom.errors import (
    AddressRefused,
    BadSignature,
    BatchFailed,
    Conflict,
    DeliveryError,
    Fenced,
    InvalidEnvelope,
    InvalidInput,
    NotFound,
    OutcomeUnknown,
    PayloadCollision,
    PermanentDeliveryError,
    PostroomError,
    SchemaError,
    StoreError,
    StoreUnavailable,
    TransientDeliveryError,
    Unauthorized,
    WaitNotOpened,
)
from postroom.models import (
    Ack,
    Attempt,
    AttemptOutcome,
    AuthContext,
    Claim,
    Continuation,
    ContinuationKind,
    DispatchReport,
    Endpoint,
    EndpointSecret,
    Envelope,
    ExpireResult,
    Failed,
    Finished,
    FollowUp,
    OpenResult,
    OpenWait,
    Outcome,
    OutcomeKind,
    Outgoing,
    Page,
    Position,
    QueueStatus,
    ReceiverAck,
    Released,
    Reply,
    ReplyClaim,
    ReplyState,
    Requeue,
    ResumeResult,
    Resumption,
    Schedule,
    Settled,
    Settlement,
    SignalReceipt,
    SignalResult,
    StoreStatus,
    Swept,
    Task,
    TaskState,
    TaskStory,
    Wait,
    WaitOpening,
    WaitState,
)
from postroom.principals import Issued, Principal, Role
from postroom.receiver import Receiver
from postroom.settings import ExponentialBackoff, FixedBackoff, Settings
from postroom.store import Store, open_store
from postroom.transports import InProcessTransport, Transport
from postroom.validation import Limits

__version__ = "0.1.0"

__all__ = [
    "Ack",
    "AddressRefused",
    "Attempt",
    "AttemptOutcome",
    "AuthContext",
    "BadSignature",
    "BatchFailed",
    "Claim",
    "Clock",
    "Conflict",
    "Continuation",
    "ContinuationKind",
    "DeliveryError",
    "DispatchReport",
    "Endpoint",
    "EndpointSecret",
    "Envelope",
    "ExpireResult",
    "ExponentialBackoff",
    "Failed",
    "Fenced",
    "Finished",
    "FixedBackoff",
    "FollowUp",
    "InProcessTransport",
    "InvalidEnvelope",
    "InvalidInput",
    "Issued",
    "Limits",
    "ManualClock",
    "NotFound",
    "OpenResult",
    "OpenWait",
    "Outcome",
    "OutcomeKind",
    "OutcomeUnknown",
    "Outgoing",
    "Page",
    "PayloadCollision",
    "PermanentDeliveryError",
    "Position",
    "PostroomError",
    "Principal",
    "QueueStatus",
    "Receiver",
    "ReceiverAck",
    "Released",
    "Reply",
    "ReplyClaim",
    "ReplyState",
    "Requeue",
    "ResumeResult",
    "Resumption",
    "Role",
    "Schedule",
    "SchemaError",
    "Settings",
    "Settled",
    "Settlement",
    "SignalReceipt",
    "SignalResult",
    "Store",
    "StoreError",
    "StoreStatus",
    "StoreUnavailable",
    "Swept",
    "SystemClock",
    "Task",
    "TaskState",
    "TaskStory",
    "TransientDeliveryError",
    "Transport",
    "Unauthorized",
    "Wait",
    "WaitNotOpened",
    "WaitOpening",
    "WaitState",
    "Waiter",
    "__version__",
    "open_store",
]
