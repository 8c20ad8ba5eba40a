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
from postroom.models import Outcome, Outgoing
from postroom.outbox import AFTER_REMOTE_COMMIT, BEFORE_REMOTE_COMMIT
from postroom.receiver import Receiver

__all__ = ["InProcessTransport", "Transport"]


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
