"""Canonical JSON, fingerprints, identities and the input limits of SPEC §1.

Everything here is pure: no I/O, no clock. Validation runs before any write and raises an
``InvalidInput`` subclass whose message names the offending field.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from postroom.errors import InvalidEnvelope, InvalidInput
from postroom.models import Claim, Outcome, OutcomeKind, ReplyClaim

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "canonical_json",
    "fingerprint",
    "task_id_for",
]

_MAX_HOPS_VALUE = 2**31 - 1
_INT64 = 2**63


# The defaults of SPEC §1 are also the ceilings: a store may lower a limit, never raise it.
_CEILINGS = {
    "text_bytes": 128,
    "payload_depth": 16,
    "payload_nodes": 10_000,
    "payload_bytes": 64 * 1024,
    "max_attempts": 10,
    "hops": _MAX_HOPS_VALUE,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """The input limits of SPEC §1. Each may be lowered, never raised, from its default."""

    text_bytes: int = _CEILINGS["text_bytes"]  # message_id, queue, correlation_id, flow ...
    payload_depth: int = _CEILINGS["payload_depth"]
    payload_nodes: int = _CEILINGS["payload_nodes"]
    payload_bytes: int = _CEILINGS["payload_bytes"]
    max_attempts: int = _CEILINGS["max_attempts"]
    hops: int = _CEILINGS["hops"]

    def __post_init__(self) -> None:
        for name, ceiling in _CEILINGS.items():
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= ceiling:
                raise InvalidInput(f"limits.{name}",
                                   f"must be an int in 1..{ceiling}, got {value!r}")


DEFAULT_LIMITS = Limits()


# One encoder for every call: ``json.dumps`` with these options would build a new one each
# time, which costs as much as encoding a small document.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)
#: What ``_ENCODER`` encodes a ``str`` with (UTF-8 kept, not escaped to ASCII).
_encode_text = json.encoder.encode_basestring


def canonical_text(value: str | None) -> str:
    """``canonical_json`` of a text (or ``None``), without walking a document: the string
    encoder the JSON encoder itself calls for a ``str``."""
    return "null" if value is None else _encode_text(value)


def canonical_json(value: Any) -> str:
    """Sorted keys, ``(",", ":")`` separators, UTF-8 text (not ASCII-escaped), no NaN/inf."""
    return _ENCODER.encode(value)


def fingerprint(canonical: str) -> str:
    """SHA-256 hex digest of an already canonical JSON text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def task_id_for(principal: str, message_id: str) -> str:
    """The stable task identity: SHA-256 of canonical JSON ``[principal, message_id]``."""
    return fingerprint(canonical_json([principal, message_id]))


#: Principals beginning with these name the follow-ups of a task or of a wait; no caller may
#: take one, or it could store a message under a follow-up's identity before postroom does
#: and make every resume or finish that enqueues that follow-up a collision.
TASK_FOLLOW_UPS = "task:"
WAIT_FOLLOW_UPS = "wait:"
#: The namespace of an operator's re-runs of a task (``retry:`` + its task_id).
RETRIES = "retry:"
#: The namespace of a periodic schedule's tasks (``schedule:`` + its name).
SCHEDULED = "schedule:"
#: Principals no sender may be: they identify the tasks postroom makes itself.
FOLLOW_UP_NAMESPACES = (TASK_FOLLOW_UPS, WAIT_FOLLOW_UPS, RETRIES, SCHEDULED)
#: Priorities run from -PRIORITY_LIMIT to PRIORITY_LIMIT (higher first).
PRIORITY_LIMIT = 10

#: The largest task or cost budget a chain can have.
MAX_CHAIN_BUDGET = 2**31 - 1
#: The budgets a chain's root may lower, by name.
CHAIN_BUDGETS = ("cost", "hops", "tasks")

#: The most UTF-8 bytes a ``task_id`` argument may have (ids are 64 hex characters).
TASK_ID_BYTES = 128


def follow_up_principal(parent_task_id: str) -> str:
    """The namespace in which a task's follow-ups are identified.

    Follow-ups are keyed by their parent, so a parent re-run after a crash produces the same
    ids, and a follow-up can never collide with a message its requester sent directly.
    """
    return TASK_FOLLOW_UPS + parent_task_id


# -- scalar checks ----------------------------------------------------------------------------


def check_text(value: object, field: str, *, max_bytes: int,
               error: type[InvalidInput] = InvalidInput) -> str:
    """A non-empty ``str`` of at most ``max_bytes`` UTF-8 bytes, without U+0000."""
    if type(value) is not str:
        raise error(field, f"must be a string, got {type(value).__name__}")
    # A character is at least one byte of UTF-8: a longer text is refused before it is
    # scanned or encoded, so refusing it costs the same whatever its length.
    if len(value) > max_bytes:
        raise error(field, f"is {len(value)} characters, so at least {len(value)} bytes of "
                           f"UTF-8; the limit is {max_bytes}")
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise error(field, "is not valid UTF-8 text (lone surrogate)") from None
    if "\x00" in value:
        # PostgreSQL cannot store NUL in text; refusing it here keeps the backends alike.
        raise error(field, "contains U+0000 (NUL), which cannot be stored as text")
    if size == 0:
        raise error(field, "must not be empty")
    if size > max_bytes:
        raise error(field, f"is {size} bytes of UTF-8; the limit is {max_bytes}")
    return value


#: The longest delay a call may ask for before a task is claimable again: a year.
MAX_DELAY = 365 * 86_400.0

#: The most items one batch call takes (claims, envelopes of an atomic batch, ...).
MAX_BATCH = 10_000


def check_limit(limit: object, field: str = "limit") -> int:
    """How many items a batch call may handle: an int in ``1..MAX_BATCH``."""
    return check_int(limit, field, low=1, high=MAX_BATCH)


def check_queues(queues: object, limits: Limits, *, required: bool = True) -> tuple[str, ...]:
    """Queue names: one name, or a sequence of them (at least one when ``required``)."""
    names = (queues,) if isinstance(queues, str) else queues
    if not isinstance(names, (list, tuple, set, frozenset)):
        raise InvalidInput("queues", f"must be a queue name or a sequence of them, got "
                                     f"{type(queues).__name__}")
    if required and not names:
        raise InvalidInput("queues", "name at least one queue")
    return tuple(check_text(name, "queues", max_bytes=limits.text_bytes) for name in names)


def check_int(value: object, field: str, *, low: int, high: int,
              error: type[InvalidInput] = InvalidInput) -> int:
    """An ``int`` (not ``bool``) in ``low..high``."""
    if type(value) is not int:
        raise error(field, f"must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise error(field, f"must be in {low}..{high}, got {value}")
    return value


def check_number(value: object, field: str,
                 error: type[InvalidInput] = InvalidInput) -> float:
    """A finite int or float (not ``bool``, not ``str``), returned as ``float``."""
    if type(value) not in (int, float):
        raise error(field, f"must be a finite number, got {type(value).__name__}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise error(field, "is too large to be a finite number") from None
    if not math.isfinite(number):
        raise error(field, f"must be a finite number, got {value!r}")
    return number


def is_decimal(text: str) -> bool:
    """Whether ``text`` is a decimal number in ASCII digits (``str.isdigit`` also takes
    ``"¹"``, which ``int`` refuses, and ``"٣"``, which it reads as 3)."""
    return text.isascii() and text.isdigit()


def check_bool(value: object, field: str) -> bool:
    """A ``bool``: nothing else is taken for true or false."""
    if type(value) is not bool:
        raise InvalidInput(field, f"must be a bool, got {type(value).__name__}")
    return value


def check_batch(items: object, field: str) -> list[Any]:
    """The items of a batch argument, read once: any iterable (a list, a generator ...) of at
    most ``MAX_BATCH`` items. Refusing a longer one reads no more than ``MAX_BATCH + 1``."""
    if isinstance(items, (str, bytes, bytearray, Mapping)) or not isinstance(items, Iterable):
        raise InvalidInput(field, f"must be an iterable of items (a list, say), got "
                                  f"{type(items).__name__}")
    taken = list(itertools.islice(items, MAX_BATCH + 1))
    if len(taken) > MAX_BATCH:
        raise InvalidInput(field, f"has more than {MAX_BATCH} items; the limit per batch is "
                                  f"{MAX_BATCH}")
    return taken


# -- claims -----------------------------------------------------------------------------------

#: The most UTF-8 bytes a stored principal may have. A sender's is within the text limit; a
#: follow-up's names its parent: "task:" and a task id, or "wait:" and the canonical JSON of
#: the wait's address (two texts of up to 128 bytes, each byte escaped in at most 6, and a
#: generation of up to 10 digits).
PRINCIPAL_BYTES = len(WAIT_FOLLOW_UPS) + len('["","",]') + 2 * 6 * _CEILINGS["text_bytes"] + 10
#: The most UTF-8 bytes of a ``reply_id``: ``"reply:"`` and a task id.
REPLY_ID_BYTES = len("reply:") + TASK_ID_BYTES
#: The most UTF-8 bytes of a reply's body: a result within the payload limit, or an error of
#: a few KiB, and the reply's identity and routing. Twice the payload ceiling leaves room.
REPLY_BODY_BYTES = 2 * _CEILINGS["payload_bytes"]

FieldCheck = Callable[[object, str], object]


def _text_within(max_bytes: int) -> FieldCheck:
    return lambda value, field: check_text(value, field, max_bytes=max_bytes)


def _int64(value: object, field: str) -> int:
    # Any value a database column can hold: a well-typed value that is not the record's own
    # is a stale or forged claim, and the guarded statement answers it with ``Fenced``.
    return check_int(value, field, low=-_INT64, high=_INT64 - 1)


def _time(value: object, field: str) -> float:
    if type(value) is not float or not math.isfinite(value):
        shown = repr(value) if type(value) is float else type(value).__name__
        raise InvalidInput(field, f"must be a finite float, got {shown}")
    return value


def _document(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(field, f"must be a dict, got {type(value).__name__}")
    return value


_TEXT = _text_within(_CEILINGS["text_bytes"])


def _optional(check: FieldCheck) -> FieldCheck:
    return lambda value, field: None if value is None else check(value, field)

#: How each field of a ``Claim`` is checked. Values are those postroom issued, so texts are
#: held to the ceilings of the limits, not to a store's lowered ones (a task may have been
#: stored before they were lowered).
CLAIM_FIELDS: Mapping[str, FieldCheck] = {
    "task_id": _text_within(TASK_ID_BYTES), "owner": _TEXT, "fence": _int64,
    "attempt": _int64, "max_attempts": _int64, "payload": _document, "queue": _TEXT,
    "hops": _int64, "deadline": _time, "lease_until": _time,
    "principal": _text_within(PRINCIPAL_BYTES), "message_id": _TEXT,
    "correlation_id": _optional(_TEXT), "requester": _optional(_text_within(PRINCIPAL_BYTES)),
}
#: How each field of a ``ReplyClaim`` is checked.
REPLY_CLAIM_FIELDS: Mapping[str, FieldCheck] = {
    "reply_id": _text_within(REPLY_ID_BYTES), "task_id": _text_within(TASK_ID_BYTES),
    "owner": _TEXT, "fence": _int64, "attempt": _int64, "budget": _int64,
    "lease_until": _time, "body": _text_within(REPLY_BODY_BYTES),
    "fingerprint": _text_within(TASK_ID_BYTES),
    "requester": _optional(_text_within(PRINCIPAL_BYTES)),
}


@dataclass(frozen=True)
class _Issued:
    """The kinds of a record's fields, for ``_as_issued``: texts with their most bytes (and
    those that may be ``None``), integers, times, and a field that holds a dict."""

    texts: tuple[tuple[str, int], ...]
    optional_texts: tuple[tuple[str, int], ...] = ()
    ints: tuple[str, ...] = ()
    times: tuple[str, ...] = ()
    document: str | None = None


_CLAIM_ISSUED = _Issued(
    texts=(("task_id", TASK_ID_BYTES), ("owner", _CEILINGS["text_bytes"]),
           ("queue", _CEILINGS["text_bytes"]), ("principal", PRINCIPAL_BYTES),
           ("message_id", _CEILINGS["text_bytes"])),
    optional_texts=(("correlation_id", _CEILINGS["text_bytes"]),
                    ("requester", PRINCIPAL_BYTES)),
    ints=("fence", "attempt", "max_attempts", "hops"), times=("deadline", "lease_until"),
    document="payload")
_REPLY_CLAIM_ISSUED = _Issued(
    texts=(("reply_id", REPLY_ID_BYTES), ("task_id", TASK_ID_BYTES),
           ("owner", _CEILINGS["text_bytes"]), ("body", REPLY_BODY_BYTES),
           ("fingerprint", TASK_ID_BYTES)),
    optional_texts=(("requester", PRINCIPAL_BYTES),), ints=("fence", "attempt", "budget"),
    times=("lease_until",))


def _plain_text(value: object, most: int) -> bool:
    return (type(value) is str and 0 < len(value) <= most and value.isascii()
            and "\x00" not in value)


def _as_issued(record: object, kinds: _Issued) -> bool:
    """Whether every field of ``record`` is plainly of the kind postroom issues (ASCII texts
    within their limits, integers in range, finite float times, a dict): what the field
    checks (``CLAIM_FIELDS``, ``REPLY_CLAIM_FIELDS``) accept, decided without naming a
    field. A record it does not vouch for goes through those checks, which name what is
    wrong (or accept it: a text that is not ASCII, say)."""
    for name, most in kinds.texts:
        if not _plain_text(getattr(record, name), most):
            return False
    for name, most in kinds.optional_texts:
        value = getattr(record, name)
        if value is not None and not _plain_text(value, most):
            return False
    for name in kinds.ints:
        value = getattr(record, name)
        if not (type(value) is int and -_INT64 <= value < _INT64):
            return False
    for name in kinds.times:
        value = getattr(record, name)
        if not (type(value) is float and math.isfinite(value)):
            return False
    return kinds.document is None or isinstance(getattr(record, kinds.document), dict)


def check_claim(claim: object, field: str = "claim") -> Claim:
    """A ``Claim`` whose every field has the type postroom issues it with.

    A wrong type (``fence="1"``, ``fence=True``, a NaN deadline) is a programming error,
    refused here before any SQL; whether a well-typed claim is still the task's current one
    is the guarded statement's question (``Fenced``).
    """
    if not isinstance(claim, Claim):
        raise InvalidInput(field, f"must be a Claim, got {type(claim).__name__}")
    if _as_issued(claim, _CLAIM_ISSUED):  # a worker's every outcome, without naming fields
        return claim
    for name, check in CLAIM_FIELDS.items():
        check(getattr(claim, name), f"{field}.{name}")
    return claim


def check_reply_claim(claim: object, field: str = "claim") -> ReplyClaim:
    """A ``ReplyClaim`` whose every field has the type postroom issues it with."""
    if not isinstance(claim, ReplyClaim):
        raise InvalidInput(field, f"must be a ReplyClaim, got {type(claim).__name__}")
    if _as_issued(claim, _REPLY_CLAIM_ISSUED):
        return claim
    for name, check in REPLY_CLAIM_FIELDS.items():
        check(getattr(claim, name), f"{field}.{name}")
    return claim


def check_outcome(outcome: object, field: str = "outcome") -> Outcome:
    """An ``Outcome`` whose kind is an ``OutcomeKind`` (a plain string is not taken for one:
    an unknown kind would be recorded as a transient failure)."""
    if not isinstance(outcome, Outcome):
        raise InvalidInput(field, f"must be an Outcome, got {type(outcome).__name__}")
    if type(outcome.kind) is not OutcomeKind:
        raise InvalidInput(f"{field}.kind", f"must be an OutcomeKind, got "
                                            f"{type(outcome.kind).__name__}")
    if type(outcome.detail) is not str:
        raise InvalidInput(f"{field}.detail", f"must be a string, got "
                                              f"{type(outcome.detail).__name__}")
    check_bool(outcome.duplicate, f"{field}.duplicate")
    if outcome.delay is not None:
        delay = check_number(outcome.delay, f"{field}.delay")
        if not 0 <= delay <= MAX_DELAY:
            raise InvalidInput(f"{field}.delay", f"must be in 0..{MAX_DELAY:g} seconds, got "
                                                 f"{outcome.delay!r}")
    return outcome


def check_pair(item: object, field: str) -> tuple[Any, Any]:
    """One item of a batch of pairs (``(claim, result)``, ``(claim, outcome)``)."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        shown = (f"{len(item)} items" if isinstance(item, (tuple, list))
                 else type(item).__name__)
        raise InvalidInput(field, f"must be a pair, got {shown}")
    return item[0], item[1]


# -- JSON documents ---------------------------------------------------------------------------


def check_json(value: object, field: str, *, limits: Limits, require_object: bool,
               error: type[InvalidInput] = InvalidInput) -> str:
    """Validate a JSON document and return its canonical text.

    Refuses non-str keys, non-finite numbers, unknown types, self-references, nesting deeper
    than ``limits.payload_depth``, more than ``limits.payload_nodes`` values, and a canonical
    size above ``limits.payload_bytes``.

    Refusing costs time bounded by the limits, not by the value (SPEC §1): a container is
    counted before its items are looked at, a running lower bound of the canonical size
    (a text of n characters takes at least n + 2 bytes) refuses a document as soon as it
    passes the limit, and nothing is encoded until the whole document is within both.
    """
    if require_object and not isinstance(value, dict):
        raise error(field, f"must be a JSON object, got {type(value).__name__}")
    max_nodes, max_bytes, max_depth = (limits.payload_nodes, limits.payload_bytes,
                                       limits.payload_depth)
    # A document that is a scalar is checked as the only item of a list around it.
    nodes = 0  # the values counted so far: every item of every container looked at
    size = -2  # a lower bound of the canonical size (less that list's brackets)
    # Containers still to look at: (container, where, depth, ancestors). ``where`` is the
    # field name of the document, or (the container's where, key or index): the dotted path
    # is only spelled out for an error. The ancestors (ids of the containers on the path)
    # name a self-reference precisely instead of reporting it as "too deep".
    stack: list[tuple[Any, Any, int, tuple[int, ...]]] = [([value], _ROOT, -1, ())]
    while stack:
        item, where, depth, ancestors = stack.pop()
        if id(item) in ancestors:
            raise error(_path(where, field), "refers to itself (self-referencing structure)")
        if depth + 1 > max_depth:
            raise error(_path(where, field), f"nesting deeper than {max_depth} levels")
        count = len(item)
        nodes += count
        if nodes > max_nodes:
            raise error(field, f"has more than {max_nodes} values")
        size += count + 1  # brackets and commas
        is_dict = type(item) is dict
        if is_dict:
            size += _keys(item, max_bytes - size, where, field, error)
        if size > max_bytes:
            raise _too_big(error, field, size, max_bytes)
        inner = (*ancestors, id(item))
        for key, child in (item.items() if is_dict else enumerate(item)):
            kind = type(child)
            if kind is str:
                size += len(child) + 2
                if size > max_bytes:
                    raise _too_big(error, field, size, max_bytes)
                if not (child.isascii() or _is_utf8(child)):
                    raise error(_path((where, key), field),
                                "is not valid UTF-8 text (lone surrogate)")
            elif kind is dict or kind is list or kind is tuple:
                stack.append((child, (where, key), depth + 1, inner))
            elif child is None or kind is bool:
                pass
            elif kind is int:
                if not -_INT64 <= child < _INT64:
                    raise error(_path((where, key), field),
                                "integer outside the signed 64-bit range")
            elif kind is float:
                if not math.isfinite(child):
                    raise error(_path((where, key), field),
                                f"must be a finite number, got {child!r}")
            else:
                raise error(_path((where, key), field), f"{kind.__name__} is not a JSON value")
    text = canonical_json(value)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise error(field, f"is {size} bytes as canonical JSON; the limit is {max_bytes}")
    return text


def _keys(item: dict[Any, Any], budget: int, where: Any, field: str,
          error: type[InvalidInput]) -> int:
    """The least canonical size of ``item``'s keys (with quotes and colons), checking each
    key; stops counting once over ``budget``, before checking a key it cannot afford."""
    used = 0
    for key in item:
        if type(key) is not str:
            raise error(_path(where, field), f"has a key of type {type(key).__name__}; "
                                            "keys must be str")
        used += len(key) + 3
        if used > budget:
            break
        if not (key.isascii() or _is_utf8(key)):
            raise error(_path(where, field), "has a key that is not valid UTF-8 text "
                                            "(lone surrogate)")
    return used


def _too_big(error: type[InvalidInput], field: str, size: int, limit: int) -> InvalidInput:
    return error(field, f"is at least {size} bytes as canonical JSON; the limit is {limit}")


#: ``where`` of the list a document is checked in; its one item is the document itself.
_ROOT: Any = object()


def _path(where: Any, field: str) -> str:
    """The dotted path of ``where`` (see ``check_json``) in the document named ``field``."""
    parts: list[str] = []
    while where is not _ROOT:
        where, key = where
        if where is _ROOT:
            break  # the document itself
        parts.append(f".{key}" if type(key) is str else f"[{key}]")
    return field + "".join(reversed(parts))


def _is_utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (it does unless it holds a lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- envelopes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckedEnvelope:
    """An envelope that passed validation, with its derived identity and canonical texts."""

    task_id: str
    principal: str
    message_id: str
    sender: str
    payload: str  # canonical JSON
    deadline: float
    max_attempts: int
    hops: int
    queue: str
    correlation_id: str | None
    parent_task_id: str | None
    envelope: str  # canonical JSON of the whole envelope
    fingerprint: str
    #: Who its reply goes to: the principal that sent the chain's root (itself, unless a
    #: follow-up). Derived, never part of the envelope or its fingerprint.
    requester: str | None = None
    not_before: float | None = None
    priority: int = 0
    #: The task this one runs again (an operator's re-run), never from an envelope.
    retry_of: str | None = None
    #: The chain budgets a root's envelope asks for (``CHAIN_BUDGETS`` names), if any.
    budget: Mapping[str, int] | None = None


def check_envelope(principal: str, envelope: Mapping[str, object], *,
                   limits: Limits) -> CheckedEnvelope:
    """Validate every field of an envelope (given as a mapping of its fields).

    ``sender`` is only checked for form here; whether it equals the principal is an
    authorization question answered by the inbox.
    """
    e = InvalidEnvelope
    message_id = check_text(envelope.get("message_id"), "message_id",
                            max_bytes=limits.text_bytes, error=e)
    sender = check_text(envelope.get("sender"), "sender", max_bytes=limits.text_bytes, error=e)
    kind = envelope.get("kind", "task")
    if type(kind) is not str or kind != "task":  # the type first: == may run foreign code
        raise e("kind", f"only 'task' enters the work queue, got {kind!r}")
    payload = check_json(envelope.get("payload"), "payload", limits=limits,
                         require_object=True, error=e)
    deadline = check_number(envelope.get("deadline"), "deadline", error=e)
    max_attempts = check_int(envelope.get("max_attempts", 3), "max_attempts",
                             low=1, high=limits.max_attempts, error=e)
    hops = check_int(envelope.get("hops", 0), "hops", low=0, high=limits.hops, error=e)
    queue = check_text(envelope.get("queue", "default"), "queue",
                       max_bytes=limits.text_bytes, error=e)
    correlation_id = _optional_text(envelope.get("correlation_id"), "correlation_id", limits)
    parent_task_id = _optional_text(envelope.get("parent_task_id"), "parent_task_id", limits)
    raw_not_before = envelope.get("not_before")
    not_before = (None if raw_not_before is None
                  else check_number(raw_not_before, "not_before", error=e))
    if not_before is not None and not_before >= deadline:
        raise e("not_before", f"is {not_before}, not before the deadline {deadline}: the task "
                              f"could never run")
    priority = check_int(envelope.get("priority", 0), "priority", low=-PRIORITY_LIMIT,
                         high=PRIORITY_LIMIT, error=e)
    budget = _budget(envelope.get("budget"))
    if budget is not None and parent_task_id is not None:
        raise e("budget", "only a chain's root sets its budget: this envelope names a "
                          "parent_task_id, so it joins the parent's chain and its budget")
    document: dict[str, object] = {
        "message_id": message_id,
        "sender": sender,
        "deadline": deadline,
        "max_attempts": max_attempts,
        "hops": hops,
        "kind": kind,
        "queue": queue,
        "correlation_id": correlation_id,
        "parent_task_id": parent_task_id,
    }
    # Scheduling fields are in the fingerprint only when given: an envelope that does not
    # use them keeps the fingerprint it always had (a resend stays a duplicate).
    if not_before is not None:
        document["not_before"] = not_before
    if priority:
        document["priority"] = priority
    if budget is not None:
        document["budget"] = budget
    # The payload is already canonical text: splice it in where its key sorts (just before
    # "priority" when there is one, else before "queue", which every envelope has) instead of
    # encoding it a second time. A quote in any value is escaped, so the key can only be the
    # key itself; a unit test pins that the result equals ``canonical_json`` of the whole
    # envelope.
    following = ',"priority":' if priority else ',"queue":'
    head, tail = _ENCODER.encode(document).split(following, 1)
    text = head + ',"payload":' + payload + following + tail
    return CheckedEnvelope(
        task_id=task_id_for(principal, message_id),
        principal=principal,
        message_id=message_id,
        sender=sender,
        payload=payload,
        deadline=deadline,
        max_attempts=max_attempts,
        hops=hops,
        queue=queue,
        correlation_id=correlation_id,
        parent_task_id=parent_task_id,
        envelope=text,
        fingerprint=fingerprint(text),
        requester=principal,
        not_before=not_before,
        priority=priority,
        budget=budget,
    )


def _budget(value: object) -> dict[str, int] | None:
    """A root's chain budgets: an object naming some of ``CHAIN_BUDGETS`` (hops from 1, tasks
    from 1, cost from 0), or ``None``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidEnvelope("budget", f"must be an object or None, got {type(value).__name__}")
    budget: dict[str, int] = {}
    for name, amount in value.items():
        if name not in CHAIN_BUDGETS:
            raise InvalidEnvelope("budget", f"names {name!r}; a chain's budgets are "
                                            f"{', '.join(CHAIN_BUDGETS)}")
        budget[name] = check_int(amount, f"budget.{name}", low=0 if name == "cost" else 1,
                                 high=MAX_CHAIN_BUDGET, error=InvalidEnvelope)
    return budget or None


def _optional_text(value: object, field: str, limits: Limits) -> str | None:
    if value is None:
        return None
    return check_text(value, field, max_bytes=limits.text_bytes, error=InvalidEnvelope)
