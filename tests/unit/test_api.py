"""The public surface is short, sorted and pinned: changing it is a deliberate act."""

import postroom

PUBLIC = [
    "__version__", "Ack", "Attempt", "AttemptOutcome", "AuthContext", "BatchFailed", "Budget",
    "Chain", "Claim",
    "Clock", "Conflict", "Continuation", "ContinuationKind", "DeliveryError", "DispatchReport",
    "Envelope", "ExpireResult", "ExponentialBackoff", "Failed", "Fenced", "Finished",
    "FixedBackoff", "FollowUp", "InProcessTransport", "InvalidEnvelope", "InvalidInput", "Limits",
    "ManualClock", "NotFound", "Observation", "open_store", "OpenResult", "OpenWait", "Outcome",
    "OutcomeKind",
    "OutcomeUnknown", "Outgoing", "Page", "PayloadCollision", "PermanentDeliveryError", "Position",
    "PostroomError", "QueueStatus", "Receiver", "ReceiverAck", "Released", "Reply", "ReplyClaim",
    "ReplyState", "Requeue", "ResumeResult", "Resumption", "SchemaError", "Settings", "Settled",
    "Settlement", "SignalReceipt", "SignalResult", "Store", "StoreError", "StoreStatus",
    "StoreUnavailable", "Swept", "SystemClock", "Task", "TaskState", "TaskStory", "Timeline",
    "TransientDeliveryError", "Transport", "Unauthorized", "Unconfirmed", "Wait", "Waiter",
    "WaitNotOpened", "WaitOpening", "WaitState",
    # chains and approvals
    "Approval", "ApprovalRequest", "AskedApproval", "CommittedEffect", "NotApproved",
    "SideEffect",
    # endpoints and webhooks
    "AddressRefused", "BadSignature", "Endpoint", "EndpointSecret", "Schedule",
    # periodic schedules
    "Missed", "Periodic",
    # principals of the HTTP service
    "Issued", "Principal", "Role",
]


def test_the_public_api_is_exactly_the_pinned_list():
    assert sorted(postroom.__all__, key=str.lower) == sorted(PUBLIC, key=str.lower)


def test_every_public_name_exists_and_is_documented():
    for name in postroom.__all__:
        value = getattr(postroom, name)
        if name != "__version__":
            assert value.__doc__, f"{name} has no docstring"


def test_domain_errors_subclass_the_matching_builtin():
    assert issubclass(postroom.InvalidEnvelope, ValueError)
    assert issubclass(postroom.Unauthorized, PermissionError)
    assert issubclass(postroom.NotFound, LookupError)
    assert issubclass(postroom.PayloadCollision, postroom.Conflict)
    for name in postroom.__all__:
        value = getattr(postroom, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, postroom.PostroomError)
