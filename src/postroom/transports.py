"""Transports carry replies from the outbox to a receiver.

A transport is one method: ``deliver(batch) -> outcomes``, one ``Outcome`` per reply in
order. Raising instead counts as a transient failure of the whole batch (the dispatcher
cannot know what the far side committed), so a transport only has to be honest about what
it knows. Raising ``PayloadCollision`` or ``PermanentDeliveryError`` is a refusal: for a
batch of one it is that reply's outcome; for a longer batch the dispatcher cannot tell which
reply was refused, so it delivers the batch again one reply at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from postroom import faults
from postroom.errors import PayloadCollision, PermanentDeliveryError
from postroom.models import Outcome, OutcomeKind, Outgoing, ReplyClaim
from postroom.outbox import AFTER_REMOTE_COMMIT, BEFORE_REMOTE_COMMIT
from postroom.receiver import Receiver

__all__ = ["InProcessTransport", "Transport", "deliver"]


@runtime_checkable
class Transport(Protocol):
    """Delivers replies to a receiver."""

    def deliver(self, batch: Sequence[Outgoing]) -> Sequence[Outcome]:
        """Deliver ``batch``; return one outcome per reply, in order."""
        ...


class InProcessTransport:
    """Hands replies straight to a ``Receiver`` object (its own database, same process)."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def deliver(self, batch: Sequence[Outgoing]) -> Sequence[Outcome]:
        """Deliver ``batch`` in one receiver transaction."""
        faults.hit(BEFORE_REMOTE_COMMIT)
        outcomes = self.receiver.accept_batch(batch)
        faults.hit(AFTER_REMOTE_COMMIT)
        return outcomes


def deliver(transport: Transport, claims: Sequence[ReplyClaim]) -> list[Outcome]:
    """Hand ``claims`` to ``transport`` and return one honest outcome per claim, in order.

    What the transport raised or answered is read as the module docstring says: a refusal
    raised for a batch is asked again reply by reply; anything else raised, or an answer
    that is not one ``Outcome`` per reply, is a transient failure.
    """
    batch = [claim.outgoing() for claim in claims]
    try:
        answered = transport.deliver(batch)
    except (PayloadCollision, PermanentDeliveryError) as exc:
        if len(claims) > 1:
            # A refusal raised for a whole batch belongs to one reply we cannot name, and the
            # others may be committed far away: ask again one reply at a time (the receiver
            # dedupes), so that only the refused one is dead.
            return [outcome for claim in claims for outcome in deliver(transport, [claim])]
        if isinstance(exc, PayloadCollision):
            return [Outcome.collision(str(exc))]
        return [Outcome.permanent(str(exc))]
    except Exception as exc:
        # Whatever the transport raised, the far side may or may not have committed: the
        # only honest record is "unknown, try again", which the receiver's dedupe makes safe.
        return [Outcome.transient(f"{type(exc).__name__}: {exc}")] * len(claims)
    outcomes = _paired(claims, answered)
    return [o if isinstance(o, Outcome) and isinstance(o.kind, OutcomeKind)
            else Outcome.transient(f"transport answered {o!r}") for o in outcomes]


def _paired(claims: Sequence[ReplyClaim], outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Pair a transport's answer with what was sent; a short answer is a transient failure."""
    if len(outcomes) == len(claims):
        return list(outcomes)
    lost = Outcome.transient(f"transport answered {len(outcomes)} outcomes for "
                             f"{len(claims)} replies")
    return [lost] * len(claims)
