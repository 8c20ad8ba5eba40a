"""Human approvals of side effects (SPEC §6), checked where the side effect commits.

An approval is its own durable record: granted only by an authenticated principal whose
trusted adapter gave it the ``human`` role (``AuthContext.role``), naming the action, the
resource or recipient, the data it allows (the SHA-256 of its canonical JSON), how many uses
(``max_uses``), an expiry and who asked. It can be revoked. Granting, each use and revoking
are durable events.

A task declares the side effect it is about to commit (``SideEffect``) with its finish; the
finish's transaction consumes one use of a matching, usable approval (one guarded UPDATE of
its row) and records the side effect with the approval use, or refuses with ``NotApproved``
and writes nothing. The external effect is performed from that committed record, after the
commit. Nothing else counts: a payload saying ``"human_approved": true``, a signed body, a
signal relaying "they said yes" are data, and no data is an approval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from postroom import waits
from postroom.db.database import Tx, Write
from postroom.errors import (
    InvalidInput,
    NotApproved,
    NotFound,
    PayloadCollision,
    Unauthorized,
)
from postroom.inbox import principal_of
from postroom.models import (
    Approval,
    ApprovalRequest,
    AskedApproval,
    AuthContext,
    CommittedEffect,
    SideEffect,
    SignalReceipt,
    SignalResult,
    WaitOpening,
)
from postroom.settings import Settings
from postroom.validation import canonical_json, check_int, check_json, check_number, check_text
from postroom.validation import fingerprint as digest
from postroom.waits import SignalRequest

__all__ = ["ANSWER", "GRANT", "HUMAN", "REVOKE", "CheckedAsk", "CheckedEffect", "Grant", "Terms",
           "answer", "ask", "asked", "check_ask", "check_effect", "check_grant", "check_human",
           "consume", "get", "grant", "listed", "request_approval_id", "revoke",
           "side_effects"]

GRANT = Write("grant_approval")
REVOKE = Write("revoke_approval")
#: A human's answer to an approval request: the grant (or denial) and the wait's signal.
ANSWER = Write("answer_approval")

#: The role a trusted adapter gives a principal that may grant approvals.
HUMAN = "human"
#: The role that may revoke any approval (a human revokes their own).
_OPERATOR = "operator"
#: At most this many uses per approval.
MAX_USES = 10_000


@dataclass(frozen=True, slots=True)
class Terms:
    """What an approval allows, or a side effect does: an action on a resource carrying data
    (canonical JSON, and its SHA-256)."""

    action: str
    resource: str
    data: str
    data_digest: str


@dataclass(frozen=True, slots=True)
class CheckedEffect(Terms):
    """A validated side effect, naming the approval it uses (``None``: any that matches)."""

    approval_id: str | None


@dataclass(frozen=True, slots=True)
class CheckedAsk(Terms):
    """A validated ``ApprovalRequest``."""

    max_uses: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Grant(CheckedAsk):
    """A validated grant: the approval's id, terms, granter and who asked."""

    approval_id: str
    granted_by: str
    requested_by: str

    @property
    def fingerprint(self) -> str:
        """What the grant says, so that a retried grant is known from a different one."""
        return digest(canonical_json([self.action, self.resource, self.data_digest,
                                      self.max_uses, self.expires_at, self.granted_by,
                                      self.requested_by]))


def _terms(settings: Settings, action: object, resource: object, data: object,
           prefix: str = "") -> dict[str, str]:
    """The checked ``Terms`` fields, each refusal naming ``prefix`` + the field."""
    limit = settings.limits.text_bytes
    data_json = check_json(data, f"{prefix}data", limits=settings.limits, require_object=False)
    return {"action": check_text(action, f"{prefix}action", max_bytes=limit),
            "resource": check_text(resource, f"{prefix}resource", max_bytes=limit),
            "data": data_json, "data_digest": digest(data_json)}


def check_ask(settings: Settings, ask: object, responder: str | None,
              field: str = "approval") -> CheckedAsk:
    """An approval request made with a wait; the wait must name its responder (the human
    who answers)."""
    if not isinstance(ask, ApprovalRequest):
        raise InvalidInput(field, f"must be an ApprovalRequest, got {type(ask).__name__}")
    if responder is None:
        raise InvalidInput("responder", "a wait asking for an approval names the human who "
                                        "answers it")
    return CheckedAsk(**_terms(settings, ask.action, ask.resource, ask.data, f"{field}."),
                      max_uses=check_int(ask.max_uses, f"{field}.max_uses", low=1,
                                         high=MAX_USES),
                      expires_at=check_number(ask.expires_at, f"{field}.expires_at"))


def request_approval_id(flow: str, step: str, generation: int) -> str:
    """The id of the approval that a grant answering the wait generation makes."""
    return "request:" + digest(canonical_json([flow, step, generation]))[:40]


def ask(tx: Tx, opening: WaitOpening, request: CheckedAsk, *, task_id: str,
        responder: str) -> None:
    """Record the approval request of a wait generation that just opened."""
    tx.change("approval_request_insert", flow=opening.flow, step=opening.step,
              generation=opening.generation,
              approval_id=request_approval_id(opening.flow, opening.step, opening.generation),
              action=request.action, resource=request.resource, data=request.data,
              data_digest=request.data_digest, max_uses=request.max_uses,
              expires_at=request.expires_at, requested_by=task_id, responder=responder)


def answer(tx: Tx, human: str, signal: SignalRequest, *, approve: bool) -> SignalReceipt:
    """The addressed human's answer to an approval request: the wait's signal, and with an
    accepted approval the grant, in the caller's one transaction (a replay grants nothing
    again; a late or stale answer grants nothing). ``NotFound`` if the generation asked for
    no approval, ``Unauthorized`` if another principal answers."""
    address = signal.address
    row = tx.one("approval_request_get", flow=address.flow, step=address.step,
                 generation=address.generation)
    if row is None:
        raise NotFound(f"{address} asks for no approval")
    if row["responder"] != human:
        raise Unauthorized(f"{address} asks {row['responder']!r} for the approval, not "
                           f"{human!r}")
    receipt = waits.signal(tx, signal, approval_answer=True)
    if receipt.result is not SignalResult.ACCEPTED:
        return receipt
    if approve:
        grant(tx, Grant(approval_id=str(row["approval_id"]), action=row["action"],
                        resource=row["resource"], data=row["data"],
                        data_digest=row["data_digest"], max_uses=int(row["max_uses"]),
                        expires_at=float(row["expires_at"]), granted_by=human,
                        requested_by=row["requested_by"]))
    tx.change("approval_request_answer", flow=address.flow, step=address.step,
              generation=address.generation, answer="granted" if approve else "denied",
              now=tx.now)
    return receipt


def check_human(settings: Settings, auth: AuthContext, field: str = "auth") -> str:
    """The principal of ``auth`` if its adapter gave it the human role; ``Unauthorized``
    otherwise (an agent, a worker, an operator or a principal whose role was not said)."""
    principal = principal_of(settings, auth)
    if auth.role != HUMAN:
        raise Unauthorized(f"{field}: principal {principal!r} has role {auth.role!r}; only a "
                           f"principal with the {HUMAN!r} role grants approvals")
    return principal


def check_grant(settings: Settings, auth: AuthContext, *, approval_id: object, action: object,
                resource: object, data: object, expires_at: object, requested_by: object,
                max_uses: object) -> Grant:
    """Authorize the human and validate a grant; nothing is written either way."""
    human = check_human(settings, auth)
    limit = settings.limits.text_bytes
    return Grant(**_terms(settings, action, resource, data),
                 approval_id=check_text(approval_id, "approval_id", max_bytes=limit),
                 max_uses=check_int(max_uses, "max_uses", low=1, high=MAX_USES),
                 expires_at=check_number(expires_at, "expires_at"), granted_by=human,
                 requested_by=check_text(requested_by, "requested_by", max_bytes=limit))


def check_effect(settings: Settings, effect: object, field: str = "side_effect") -> CheckedEffect:
    """A declared side effect, validated."""
    if not isinstance(effect, SideEffect):
        raise InvalidInput(field, f"must be a SideEffect, got {type(effect).__name__}")
    approval_id = (None if effect.approval_id is None else
                   check_text(effect.approval_id, f"{field}.approval_id",
                              max_bytes=settings.limits.text_bytes))
    return CheckedEffect(**_terms(settings, effect.action, effect.resource, effect.data,
                                  f"{field}."), approval_id=approval_id)


def grant(tx: Tx, request: Grant) -> Approval:
    """Record the grant (a retry of the same grant returns the stored approval; the same id
    with a different grant is a ``PayloadCollision``)."""
    inserted = tx.one("approval_insert", approval_id=request.approval_id,
                      action=request.action, resource=request.resource, data=request.data,
                      data_digest=request.data_digest, max_uses=request.max_uses,
                      expires_at=request.expires_at, granted_by=request.granted_by,
                      requested_by=request.requested_by, fingerprint=request.fingerprint,
                      now=tx.now)
    if inserted is None:
        row = tx.one("approval_get", approval_id=request.approval_id)
        if row is None or row["fingerprint"] != request.fingerprint:
            raise PayloadCollision(f"approval {request.approval_id!r}",
                                   "it was granted with other terms")
        return Approval.from_row(row)
    tx.change("approval_event_insert", approval_id=request.approval_id, kind="granted",
              number=0, principal=request.granted_by, task_id=None, now=tx.now)
    return get(tx, request.approval_id)


def revoke(tx: Tx, auth: AuthContext, principal: str, approval_id: str, reason: str) -> bool:
    """Revoke an approval (its granter, or an operator); ``False`` if it was revoked already.
    A use that committed first stands; none commits after."""
    approval = get(tx, approval_id)
    if principal != approval.granted_by and auth.role != _OPERATOR:
        raise Unauthorized(f"approval {approval_id!r} was granted by {approval.granted_by!r}: "
                           f"only they or an operator revoke it, not {principal!r}")
    if tx.one("approval_revoke", approval_id=approval_id, principal=principal, reason=reason,
              now=tx.now) is None:
        return False
    tx.change("approval_event_insert", approval_id=approval_id, kind="revoked", number=0,
              principal=principal, task_id=None, now=tx.now)
    return True


def consume(tx: Tx, task_id: str, effects: Sequence[CheckedEffect]) -> None:
    """Consume one approval use per side effect and record each effect with its use, for the
    task finishing in this transaction; ``NotApproved`` (the caller's transaction then
    writes nothing) for the first that has no usable approval."""
    if not effects:
        return
    before = tx.one("side_effects_numbered", task_id=task_id)
    first = (int(before["n"]) if before is not None else 0) + 1
    for number, effect in enumerate(effects, start=first):
        approval_id, used = _use(tx, effect)
        tx.change("side_effect_insert", task_id=task_id, number=number, action=effect.action,
                  resource=effect.resource, data=effect.data, data_digest=effect.data_digest,
                  approval_id=approval_id, use_number=used, now=tx.now)
        tx.change("approval_event_insert", approval_id=approval_id, kind="used", number=used,
                  principal=task_id, task_id=task_id, now=tx.now)


def _use(tx: Tx, effect: CheckedEffect) -> tuple[str, int]:
    terms = {"action": effect.action, "resource": effect.resource,
             "data_digest": effect.data_digest, "now": tx.now}
    # Where writers run concurrently, the approval picked may be used up before this use
    # reaches it: pick again, a few times, before saying so.
    for _ in range(3):
        approval_id = effect.approval_id
        if approval_id is None:
            found = tx.one("approval_usable", **terms)
            if found is None:
                break
            approval_id = str(found["approval_id"])
        row = tx.one("approval_use", approval_id=approval_id, **terms)
        if row is not None:
            return approval_id, int(row["uses"])
        if effect.approval_id is not None:
            break
    raise NotApproved(effect.action, effect.resource, _why(tx, effect))


def _why(tx: Tx, effect: CheckedEffect) -> str:
    """Why no approval allowed ``effect`` now."""
    if effect.approval_id is None:
        return ("no usable approval of this action, resource and data (a payload, a signed "
                "body or a signal is not one: only a human's approval record is)")
    row = tx.one("approval_get", approval_id=effect.approval_id)
    if row is None:
        return f"there is no approval {effect.approval_id!r}"
    approval = Approval.from_row(row)
    if approval.action != effect.action:
        return f"approval {approval.approval_id!r} is for action {approval.action!r}"
    if approval.resource != effect.resource:
        return f"approval {approval.approval_id!r} is for resource {approval.resource!r}"
    if approval.data_digest != effect.data_digest:
        return (f"approval {approval.approval_id!r} allows other data (digest "
                f"{approval.data_digest}, this is {effect.data_digest})")
    if approval.revoked_at is not None:
        return f"approval {approval.approval_id!r} was revoked at {approval.revoked_at}"
    if approval.expires_at <= tx.now:
        return f"approval {approval.approval_id!r} expired at {approval.expires_at}"
    return f"approval {approval.approval_id!r} is used up ({approval.uses} of {approval.max_uses})"


def get(tx: Tx, approval_id: str) -> Approval:
    """The approval ``approval_id``; ``NotFound`` if there is none."""
    row = tx.one("approval_get", approval_id=approval_id)
    if row is None:
        raise NotFound(f"no approval {approval_id!r}")
    return Approval.from_row(row)


def side_effects(tx: Tx, task_id: str) -> list[CommittedEffect]:
    """The side effects ``task_id`` committed, each with the approval use it consumed."""
    return [CommittedEffect.from_row(row) for row in tx.all("side_effects_of", task_id=task_id)]


def listed(tx: Tx, granted_by: str | None, limit: int) -> list[Approval]:
    """The newest approvals (those ``granted_by`` granted, if given), at most ``limit``."""
    rows = (tx.all("approvals_listed", limit=limit) if granted_by is None
            else tx.all("approvals_listed_by", granted_by=granted_by, limit=limit))
    return [Approval.from_row(row) for row in rows]


def asked(tx: Tx, responder: str | None, limit: int) -> list[AskedApproval]:
    """The approval requests that await an answer (addressed to ``responder``, if given),
    earliest deadline first, at most ``limit``."""
    rows = (tx.all("approval_requests_open", limit=limit) if responder is None
            else tx.all("approval_requests_open_for", responder=responder, limit=limit))
    return [AskedApproval.from_row(row) for row in rows]
