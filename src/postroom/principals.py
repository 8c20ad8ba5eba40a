"""Principals: who may call postroom over the network, with which role, and how each proves it.

A principal has a name (the one its tasks, signals and replies are recorded under), a role,
and for a worker the queues it is granted. It proves who it is with a bearer token::

    pr_<token_id>_<secret>

``token_id`` is public (12 hex digits, the key of its row) and ``secret`` is 32 random bytes,
URL-safe base64. Only the SHA-256 of the whole token is stored, so verifying one is one
indexed read by ``token_id`` and a constant-time compare of digests; whoever reads the
database cannot act as anyone. A token is shown once, when it is made.

Roles (what the HTTP service lets each do; ``may_*`` below are the rules it applies):

- ``agent``: submits tasks, reads its own tasks and their replies;
- ``worker``: claims, renews, finishes, fails and releases tasks of the queues it is granted;
- ``human``: reads and answers (signals) the waits addressed to it (``Wait.responder``);
- ``operator``: sees everything; cancels, re-runs, requeues dead replies, pauses and resumes
  queues, runs the audit.

Nobody sees another principal's records unless an operator, and a refusal to show one is the
same answer as "there is none" (the service answers both with one 404).

Revoking a principal deletes its tokens and keeps its name taken: a name identifies tasks and
receipts, so a new principal under an old name would inherit them. Rotating gives a new token;
the old one stops working at once, or after an overlap the caller chooses.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from postroom.db import Tx, Write
from postroom.db.dialect import Row
from postroom.errors import Conflict, InvalidInput, NotFound, Unauthorized
from postroom.models import Approval, Task, Wait
from postroom.settings import Settings
from postroom.validation import FOLLOW_UP_NAMESPACES, MAX_DELAY, check_number, check_text

__all__ = [
    "ADD",
    "CHANGE",
    "MAX_QUEUES",
    "Issued",
    "NewPrincipal",
    "Principal",
    "Role",
    "add",
    "authenticate",
    "check_new",
    "check_overlap",
    "get",
    "judge_token",
    "listed",
    "may_answer",
    "may_read_approval",
    "may_read_task",
    "may_read_wait",
    "may_work",
    "revoke",
    "rotate",
    "token_lookup",
]

ADD = Write("principal.add")
CHANGE = Write("principal.change")

#: The most queues a worker may be granted.
MAX_QUEUES = 64

_PREFIX = "pr_"
_TOKEN = re.compile(r"^pr_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
#: Every failed authentication says this, whatever failed: a caller learns nothing about
#: which token ids, principals or revocations exist.
_REFUSED = "the token is not valid"


class Role(StrEnum):
    """What a principal may do."""

    AGENT = "agent"  # submits tasks; reads its own
    WORKER = "worker"  # works the tasks of the queues it is granted
    HUMAN = "human"  # answers the waits addressed to it
    OPERATOR = "operator"  # sees and decides everything


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """A principal as stored (never its tokens)."""

    name: str
    role: Role
    queues: tuple[str, ...] = ()  # a worker's granted queues
    created_at: float
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        """Whether it can still authenticate."""
        return self.revoked_at is None

    def to_dict(self) -> dict[str, object]:
        """Its fields as plain JSON values."""
        return {"name": self.name, "role": self.role.value, "queues": list(self.queues),
                "created_at": self.created_at, "revoked_at": self.revoked_at}

    @classmethod
    def from_row(cls, row: Row) -> Principal:
        """Build from a ``principals`` row."""
        return cls(name=row["name"], role=Role(row["role"]),
                   queues=tuple(json.loads(row["queues"])),
                   created_at=float(row["created_at"]),
                   revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Issued:
    """A principal and a token just made for it: show ``token`` once, it is not kept."""

    principal: Principal
    token: str
    token_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NewPrincipal:
    """A principal to add, every field checked."""

    name: str
    role: Role
    queues: tuple[str, ...]


def check_new(settings: Settings, name: object, role: object,
              queues: Iterable[str] = ()) -> NewPrincipal:
    """Validate a principal to add: a name, a role, and queues only for a worker (which
    needs at least one)."""
    limit = settings.limits.text_bytes
    checked = check_text(name, "name", max_bytes=limit)
    if checked.startswith(FOLLOW_UP_NAMESPACES):
        # Such a name is the sender of the tasks postroom makes itself (a schedule's, a
        # follow-up's): its holder would see them as its own.
        raise InvalidInput("name", f"{checked!r} is reserved: names beginning with "
                                   f"{' or '.join(map(repr, FOLLOW_UP_NAMESPACES))} identify "
                                   f"the tasks postroom makes itself")
    if role not in {member.value for member in Role}:
        raise InvalidInput("role", f"must be one of {', '.join(Role)}, got {role!r}")
    chosen = Role(str(role))
    if isinstance(queues, str):
        raise InvalidInput("queues", "must be a list of queue names, not one string")
    names = tuple(dict.fromkeys(check_text(queue, f"queues[{index}]", max_bytes=limit)
                                for index, queue in enumerate(queues)))
    if len(names) > MAX_QUEUES:
        raise InvalidInput("queues", f"at most {MAX_QUEUES} queues, got {len(names)}")
    if chosen is Role.WORKER and not names:
        raise InvalidInput("queues", "a worker must be granted at least one queue")
    if chosen is not Role.WORKER and names:
        raise InvalidInput("queues", f"only a worker is granted queues, not an {chosen.value}"
                           if chosen.value[0] in "aeiou" else
                           f"only a worker is granted queues, not a {chosen.value}")
    return NewPrincipal(name=checked, role=chosen, queues=names)


def check_overlap(overlap: object) -> float:
    """How long a rotated-out token keeps working: ``0..MAX_DELAY`` seconds."""
    seconds = check_number(overlap, "overlap")
    if not 0 <= seconds <= MAX_DELAY:
        raise InvalidInput("overlap", f"must be in 0..{MAX_DELAY:g} seconds, got {overlap!r}")
    return seconds


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _issue(tx: Tx, principal: Principal) -> Issued:
    token_id = secrets.token_hex(6)
    token = f"{_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    tx.change("principal_token_insert", token_id=token_id, principal=principal.name,
              digest=_digest(token), now=tx.now)
    return Issued(principal=principal, token=token, token_id=token_id)


def add(tx: Tx, new: NewPrincipal) -> Issued:
    """Store a new principal and its first token. ``Conflict`` if the name is taken (also by
    a revoked principal: see the module's docstring)."""
    inserted = tx.change("principal_insert", principal=new.name, role=new.role.value,
                         queues=json.dumps(list(new.queues)), now=tx.now)
    if not inserted:
        raise Conflict(f"principal {new.name!r} exists already (names are never reused)")
    return _issue(tx, Principal(name=new.name, role=new.role, queues=new.queues,
                                created_at=tx.now))


def get(tx: Tx, name: str) -> Principal:
    """The principal ``name``; ``NotFound`` if there is none."""
    row = tx.one("principal_get", principal=name)
    if row is None:
        raise NotFound(f"no principal {name!r}")
    return Principal.from_row(row)


def listed(tx: Tx) -> list[Principal]:
    """Every principal, by name."""
    return [Principal.from_row(row) for row in tx.all("principals_all")]


def revoke(tx: Tx, name: str) -> bool:
    """Revoke ``name``: its tokens stop working at once. ``False`` if it was revoked already;
    ``NotFound`` if there is no such principal."""
    get(tx, name)
    tx.change("principal_tokens_delete", principal=name)
    return tx.change("principal_revoke", principal=name, now=tx.now) > 0


def rotate(tx: Tx, name: str, *, overlap: float) -> Issued:
    """A new token for ``name``; its older tokens stop working ``overlap`` seconds from now
    (those ending sooner keep their end). ``NotFound`` if there is no such principal, or it
    is revoked."""
    principal = get(tx, name)
    if not principal.active:
        raise NotFound(f"principal {name!r} is revoked")
    tx.change("principal_tokens_expire", principal=name, until=tx.now + overlap)
    return _issue(tx, principal)


def authenticate(tx: Tx, token: object, *, now: float | None = None) -> Principal:
    """The active principal ``token`` belongs to at ``now`` (default: the transaction's
    time); ``Unauthorized`` (always the same message) if it belongs to none, ended, or its
    principal is revoked."""
    params = token_lookup(token)
    row = tx.one("principal_token_get", **params) if params is not None else None
    return judge_token(token, row, tx.now if now is None else now)


def token_lookup(token: object) -> dict[str, str] | None:
    """The parameters of query ``principal_token_get`` that find ``token``'s row; ``None``
    if ``token`` is not shaped like one of postroom's."""
    match = _TOKEN.match(token) if isinstance(token, str) else None
    return None if match is None else {"token_id": match.group(1)}


def judge_token(token: object, row: Row | None, now: float) -> Principal:
    """The active principal of ``token``, given the row ``principal_token_get`` found for it
    (``None``: no row, or no lookup); ``Unauthorized`` as ``authenticate``."""
    presented = _digest(token) if isinstance(token, str) else ""
    stored = row["digest"] if row is not None else "0" * 64
    # Compare even when no row was found, so a miss costs what a hit costs.
    same = hmac.compare_digest(presented, stored)
    if row is None or not same or row["revoked_at"] is not None:
        raise Unauthorized(_REFUSED)
    if row["expires_at"] is not None and float(row["expires_at"]) <= now:
        raise Unauthorized(_REFUSED)
    return Principal.from_row(row)


# -- the rules the service applies -----------------------------------------------------------


def may_read_task(principal: Principal, task: Task) -> bool:
    """An operator reads every task; an agent the tasks it sent."""
    if principal.role is Role.OPERATOR:
        return True
    return principal.role is Role.AGENT and task.principal == principal.name


def may_work(principal: Principal, queue: str) -> bool:
    """A worker works the queues it is granted; nobody else works any."""
    return principal.role is Role.WORKER and queue in principal.queues


def may_read_wait(principal: Principal, wait: Wait) -> bool:
    """An operator reads every wait; a human those addressed to it."""
    if principal.role is Role.OPERATOR:
        return True
    return principal.role is Role.HUMAN and wait.responder == principal.name


def may_answer(principal: Principal, wait: Wait) -> bool:
    """A human answers the waits addressed to it; an operator those addressed to nobody
    (the store itself adopts only the responder's signal)."""
    if principal.role is Role.OPERATOR:
        return wait.responder is None
    return principal.role is Role.HUMAN and wait.responder == principal.name


def may_read_approval(principal: Principal, approval: Approval) -> bool:
    """An operator reads every approval; a human those it granted."""
    if principal.role is Role.OPERATOR:
        return True
    return principal.role is Role.HUMAN and approval.granted_by == principal.name
