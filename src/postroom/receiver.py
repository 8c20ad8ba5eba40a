"""The receiving side of replies, on its own database.

A receiver dedupes by ``reply_id`` plus the content fingerprint it computes itself. The
receipt and the business effect commit in one transaction, so a redelivered reply (its ACK
was lost) is acknowledged again without a second effect, and a reply id arriving with
different content is refused as a collision.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from postroom.clock import Clock
from postroom.db import Database, Tx, Write, dialect_for_url
from postroom.errors import InvalidInput, PayloadCollision
from postroom.models import Outcome, Outgoing, ReceiverAck
from postroom.transitions import reply_id_for
from postroom.validation import (
    REPLY_BODY_BYTES,
    REPLY_ID_BYTES,
    canonical_json,
    check_text,
    fingerprint,
)

__all__ = ["ACCEPT", "Effect", "Receiver"]

ACCEPT = Write("receiver.accept")

#: A business effect: called inside the receipt's transaction with the transaction (for
#: ``tx.execute``) and the parsed reply body. Raising rolls back the receipt too.
Effect = Callable[[Tx, dict[str, Any]], None]


class Receiver:
    """Accepts replies exactly once in effect. Open with ``Receiver.open(url)``."""

    def __init__(self, database: Database, *, effect: Effect | None = None) -> None:
        self._db = database
        self._effect = effect

    @classmethod
    def open(cls, url: str, *, effect: Effect | None = None,
             clock: Clock | None = None) -> Receiver:
        """Open (creating if needed) a receiver database at ``url``."""
        database = Database(dialect_for_url(url), clock=clock, track_time=False)
        try:
            database.migrate("receiver")
        except BaseException:
            database.close()
            raise
        return cls(database, effect=effect)

    def accept(self, reply_id: str, body: str) -> ReceiverAck:
        """Take one reply; raises ``PayloadCollision`` for the same id with other content,
        ``InvalidInput`` naming ``reply_id`` or ``body`` for a reply that is not one."""
        check_text(reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        if type(body) is not str:
            raise InvalidInput("body", f"must be a string, got {type(body).__name__}")
        outcome = self.accept_batch([Outgoing(reply_id=reply_id, body=body,
                                              fingerprint=fingerprint(body))])[0]
        if outcome.kind == "collision":
            raise PayloadCollision(f"reply {reply_id}", outcome.detail)
        if outcome.kind != "delivered":
            raise InvalidInput("body", outcome.detail.removeprefix("body "))
        return ReceiverAck(reply_id=reply_id, duplicate=outcome.duplicate)

    def accept_batch(self, replies: Sequence[Outgoing]) -> list[Outcome]:
        """Take several replies in one transaction; one outcome per reply, in order.

        Effects apply in the batch's order. A reply that is not a result document (not even
        text, say) gets a ``permanent`` outcome; the others are taken all the same.
        """
        return self._db.write(ACCEPT, lambda tx: self._accept_all(tx, replies))

    def _accept_all(self, tx: Tx, replies: Sequence[Outgoing]) -> list[Outcome]:
        outcomes: dict[int, Outcome] = {}
        documents: dict[int, dict[str, Any]] = {}
        parsed: dict[int, dict[str, Any]] = {}
        for index, reply in enumerate(replies):
            document = _parse(reply)
            if isinstance(document, Outcome):
                outcomes[index] = document
            else:
                parsed[index] = document
        # Receipts are inserted in reply_id order, so two dispatchers' overlapping batches
        # take the receipts' key locks in one order (on PostgreSQL the second waits for the
        # first instead of deadlocking). The sort is stable: of one id given twice, the
        # first in the batch is the new one.
        for index in sorted(parsed, key=lambda i: replies[i].reply_id):
            recorded = self._record(tx, replies[index], parsed[index])
            if recorded is None:
                documents[index] = parsed[index]
            else:
                outcomes[index] = recorded
        for index, document in sorted(documents.items()):
            if self._effect is not None:
                self._effect(tx, document)
            outcomes[index] = Outcome.delivered()
        return [outcomes[index] for index in range(len(replies))]

    def _record(self, tx: Tx, reply: Outgoing, document: dict[str, Any]) -> Outcome | None:
        """Insert the receipt with its effect: ``None`` if it is new, else the duplicate or
        the collision."""
        receipt = _receipt(reply, document, tx.now)
        if tx.one("receipt_insert", **receipt) is not None:
            return None
        stored = tx.one("receipt_get", reply_id=reply.reply_id)
        if stored is not None and stored["fingerprint"] == receipt["fingerprint"]:
            return Outcome.delivered(duplicate=True)
        return Outcome.collision(f"stored fingerprint "
                                 f"{stored['fingerprint'] if stored else '?'}, "
                                 f"received {receipt['fingerprint']}")

    def receipt(self, reply_id: str) -> dict[str, Any] | None:
        """The stored receipt of ``reply_id``, or ``None``."""
        check_text(reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        row = self._db.read(lambda tx: tx.one("receipt_get", reply_id=reply_id))
        return dict(row) if row is not None else None

    def effect_count(self, reply_id: str) -> int:
        """How many business effects ``reply_id`` has had (never more than one)."""
        check_text(reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        row = self._db.read(lambda tx: tx.one("effect_count", reply_id=reply_id))
        return int(row["n"]) if row is not None else 0

    def effects_total(self) -> int:
        """How many business effects there are in all."""
        row = self._db.read(lambda tx: tx.one("effects_total"))
        return int(row["n"]) if row is not None else 0

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _receipt(reply: Outgoing, document: dict[str, Any], now: float) -> dict[str, Any]:
    """A receipt's row: the body with the fingerprint computed here (the sender's word is not
    evidence), and the effect it records, what the body says of its task."""
    result = document.get("result")
    return {"reply_id": reply.reply_id, "fingerprint": fingerprint(reply.body),
            "body": reply.body, "now": now, "task_id": document["task_id"],
            "status": document["status"],
            "result": None if result is None else canonical_json(result)}


def _parse(reply: Outgoing) -> dict[str, Any] | Outcome:
    """The reply's body as a result document, or the permanent outcome of one that is not."""
    try:
        check_text(reply.reply_id, "reply_id", max_bytes=REPLY_ID_BYTES)
        check_text(reply.body, "body", max_bytes=REPLY_BODY_BYTES)
    except InvalidInput as exc:
        return Outcome.permanent(str(exc))
    try:
        document = json.loads(reply.body, parse_constant=_no_constant, parse_float=_finite)
        # What it holds is stored as text: a lone surrogate (escaped in the body) cannot be.
        canonical_json(document).encode("utf-8")
    except RecursionError:
        return Outcome.permanent("body is not JSON: it nests too deeply")
    except ValueError as exc:
        return Outcome.permanent(f"body is not JSON: {exc}")
    if not isinstance(document, dict) or document.get("kind") != "result":
        return Outcome.permanent("body is not a result document")
    task_id = document.get("task_id")
    if not isinstance(task_id, str) or reply_id_for(task_id) != reply.reply_id:
        return Outcome.permanent("reply_id does not match the body's task_id")
    if not isinstance(document.get("status"), str):
        return Outcome.permanent("body has no status")
    return document


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is not a finite number")
    return number
