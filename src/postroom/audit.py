"""``postroom audit``: check the invariants of SPEC §8 on a database, read-only.

Relational invariants are SQL queries (``sql/audit.sql``) that return the violating rows;
identities and fingerprints are re-derived here in Python. A database may hold a store, a
receiver, or both; each component present is checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from postroom.db import Database, dialect_for_url, redacted_url
from postroom.db.dialect import Row
from postroom.errors import PostroomError
from postroom.models import TaskState
from postroom.settings import DELIVERY_BUDGETS
from postroom.transitions import Route, legacy_reply_body, reply_content, reply_id_for
from postroom.validation import canonical_json, fingerprint, task_id_for

__all__ = ["CHECKS", "Violation", "audit_database", "audit_url"]

#: The relational checks of each component, in the order they run: each is the query
#: ``audit_<component>_<check>`` in ``sql/audit.sql``, returning the rows that violate it. The
#: list is explicit so that a check whose query is misnamed fails loudly instead of being
#: skipped (a test holds this list and the queries to each other).
CHECKS: dict[str, tuple[str, ...]] = {
    "store": (
        "terminal_task_without_reply", "reply_for_live_task", "reply_status_mismatch",
        "running_without_owner_or_lease", "idle_task_with_owner_or_lease",
        "attempts_out_of_range", "fence_below_attempts", "reply_attempts_over_budget",
        "budget_out_of_range", "parked_not_pending", "sending_without_owner_or_lease",
        "reply_fence_below_attempts", "dead_reply_without_error", "sent_reply_without_time",
        "task_end_mismatch", "decided_after_high_water", "requeue_without_reply",
        "slot_generation_mismatch", "waiting_not_current", "wait_end_fields",
        "signaled_without_its_receipt", "accepted_receipt_not_adopted",
        "receipt_inconsistent_with_wait", "timed_out_before_deadline",
        "ended_wait_without_continuation", "continuation_value_mismatch",
        "continuation_effect_mismatch", "effect_task_mismatch", "wait_decided_after_high_water",
        "limit_slots_mismatch", "slot_held_twice", "slot_of_another_queue",
        "available_before_not_before",
        "schedule_next_not_after_last", "schedule_task_ahead", "schedule_last_task_mismatch",
        "schedule_task_identity", "retry_of_unrerunnable_task", "retry_link_mismatch",
        "retry_numbers_gap", "pending_without_claim_at",
        "chain_over_budget", "task_without_chain", "approval_uses_mismatch",
        "side_effect_unapproved",
    ),
    "receiver": (
        "effect_without_receipt", "receipt_without_effect",
    ),
}

#: What the audit's queries are told of the rules they check.
_AUDIT_PARAMETERS = {"min_budget": DELIVERY_BUDGETS[0], "max_budget": DELIVERY_BUDGETS[-1]}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which check, which record, what was found."""

    check: str
    identity: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.identity}: {self.detail}"


def audit_url(url: str) -> list[Violation]:
    """Open ``url`` read-only, without creating or migrating anything, and audit it.

    A database that cannot be opened or read is itself the finding, so that a caller
    auditing several URLs still checks the others.
    """
    try:
        database = Database(dialect_for_url(url, read_only=True), track_time=False)
    except PostroomError as exc:
        return [Violation("database", redacted_url(url), str(exc))]
    try:
        return audit_database(database)
    except PostroomError as exc:
        return [Violation("database", redacted_url(url), str(exc))]
    finally:
        database.close()


def audit_database(database: Database) -> list[Violation]:
    """Every violation found in ``database``, in check order.

    A component whose schema is not this postroom's version is reported, not checked: its
    tables are not the ones the checks read.
    """
    violations: list[Violation] = []
    components = []
    for component in ("store", "receiver"):
        if database.schema_version(component) == 0:
            continue
        problem = database.schema_problem(component)
        if problem is None:
            components.append(component)
        else:
            violations.append(Violation("schema", component, f"{problem} (not checked)"))
    if not components:
        return violations or [Violation("schema", "database", "no postroom schema found")]
    with database.reading() as tx:
        for component in components:
            for check in CHECKS[component]:
                violations.extend(Violation(check, str(row["identity"]), str(row["detail"]))
                                  for row in tx.all(f"audit_{component}_{check}",
                                                    **_AUDIT_PARAMETERS))
        if "store" in components:
            violations.extend(_store_contents(tx.all("audit_store_contents")))
        if "receiver" in components:
            violations.extend(_receiver_contents(tx.all("audit_receiver_contents")))
    return violations


def _receiver_contents(rows: Sequence[Row]) -> list[Violation]:
    found: list[Violation] = []
    for row in rows:
        reply_id = row["reply_id"]
        if fingerprint(row["body"]) != row["fingerprint"]:
            found.append(Violation("receipt_fingerprint", reply_id,
                                   "stored fingerprint does not match the body"))
        try:
            document = json.loads(row["body"])
            task_id, status = document["task_id"], document["status"]
            result = document.get("result")
        except (ValueError, TypeError, KeyError):
            found.append(Violation("receipt_identity", reply_id, "body is not a result"))
            continue
        if not isinstance(task_id, str) or reply_id_for(task_id) != reply_id:
            found.append(Violation("receipt_identity", reply_id,
                                   f"body names task {task_id!r}"))
        effect = (row["effect_task_id"], row["effect_status"], row["effect_result"])
        expected = (task_id, status, None if result is None else canonical_json(result))
        if row["effect_task_id"] is not None and effect != expected:
            found.append(Violation("effect_content", reply_id,
                                   "the effect does not record what its receipt received"))
    return found


def _store_contents(rows: Sequence[Row]) -> list[Violation]:
    found: list[Violation] = []
    for row in rows:
        r = dict(row)
        task_id = r["task_id"]
        if task_id_for(r["principal"], r["message_id"]) != task_id:
            found.append(Violation("task_identity", task_id,
                                   "task_id is not SHA-256 of [principal, message_id]"))
        if fingerprint(r["envelope"]) != r["fingerprint"]:
            found.append(Violation("task_fingerprint", task_id,
                                   "stored fingerprint does not match the envelope"))
        if r["reply_id"] is None:
            continue
        if fingerprint(r["body"]) != r["reply_fingerprint"]:
            found.append(Violation("reply_fingerprint", r["reply_id"],
                                   "stored fingerprint does not match the body"))
        if r["body"] not in _expected_bodies(r):
            found.append(Violation("reply_content", r["reply_id"],
                                   "body is not the canonical result of its task"))
        if r["reply_requester"] != r["requester"]:
            found.append(Violation("reply_route", r["reply_id"],
                                   f"goes to {r['reply_requester']!r}; its task's requester is "
                                   f"{r['requester']!r}"))
        if r["reply_id"] != reply_id_for(task_id):
            found.append(Violation("reply_identity", r["reply_id"],
                                   f"expected {reply_id_for(task_id)}"))
    return found


def _expected_bodies(row: dict[str, object]) -> tuple[str, ...]:
    """The bodies a reply may have: the canonical result of its task with the task's route,
    or the same without the route, as replies written before routing was stored have it."""
    try:
        state = TaskState(str(row["status"]))
    except ValueError:
        return ()
    task_id, result, error = str(row["task_id"]), row["result"], row["last_error"]
    # A done task's reply carries the stored result; any other carries its error document,
    # made from the error the task keeps.
    result_json = (str(result) if state is TaskState.DONE and result is not None
                   else canonical_json({"error": error}))
    route = Route(_text(row["requester"]), _text(row["correlation_id"]),
                  _text(row["parent_task_id"]))
    return (reply_content(task_id, state, result_json, route).body,
            legacy_reply_body(task_id, state, result_json))


def _text(value: object) -> str | None:
    return None if value is None else str(value)
