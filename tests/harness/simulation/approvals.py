"""Human approvals of side effects in the randomized audit (SPEC §6), registered on import:

- ``SNAPSHOT_TABLES``: approvals, their durable events, and the committed side effects;
- ``OPERATIONS``: ``grant_approval`` (new, single use or a count, expiring within the run; the
  same grant again; other terms under a granted id; a principal that is not a human),
  ``revoke_approval`` (by its granter, an operator, another human; one never granted),
  ``approval_expires`` (the manual clock moved to an expiry, or just past it), and
  ``use_approval``: a claim finished with declared side effects, matching an approval, or
  naming one for another action, resource or data, an expired, revoked or used-up one, or
  none at all;
- ``CHECKS``: approval records, events and side effects are never rewritten or lost; uses
  never exceed their count and each has exactly one side effect and one event; no use
  commits after an expiry or a revocation; a side effect's task finished.

Each use is held to a model of the kernel's rule, written from SPEC §6 and the store's
documentation: a finish with a stale claim is fenced; otherwise each side effect in order
takes one use of the approval it names (or of the usable matching one that expires first),
and the first that finds none makes ``NotApproved`` (with the kernel's reason) and the
finish writes nothing at all, not even the time high-water.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from postroom.errors import Fenced, NotApproved, NotFound, PayloadCollision, Unauthorized
from postroom.models import AuthContext, Claim, SideEffect, TaskState
from postroom.transitions import reply_id_for
from postroom.validation import canonical_json, fingerprint
from tests.harness.simulation.checks import CHECKS, Transition
from tests.harness.simulation.operations import (
    OPERATIONS,
    Action,
    Operation,
    Step,
    is_current,
    pick_claim,
)
from tests.harness.simulation.world import SNAPSHOT_TABLES, Row, Snapshot, Table, World

__all__ = ["APPROVAL_CHECKS", "APPROVAL_OPERATIONS", "APPROVAL_TABLES", "REFUSALS", "decide_use"]

APPROVAL_TABLES = [
    Table("approvals", "snapshot_approvals", "approval_id", "store"),
    Table("approval_events", "snapshot_approval_events", ("approval_id", "kind", "number"),
          "store"),
    Table("side_effects", "snapshot_side_effects", ("task_id", "number"), "store"),
]
_NAMES = tuple(table.name for table in APPROVAL_TABLES)

HUMANS = ("alice", "bob")
OPERATOR = AuthContext(principal="ops", role="operator")
#: Few terms, so that approvals and side effects meet (and miss) often.
ACTIONS = ("send_email", "pay")
RESOURCES = ("ann@example.com", "acct-7", "顧客-3")
DATA: tuple[Any, ...] = ({"amount": 10}, {"amount": 25, "currency": "EUR"}, "hello, ünï",
                         [1, 2], None)

#: Why the kernel refuses a side effect, by the model's name for it: what its reason says.
REFUSALS = {
    "missing": "no usable approval",
    "unknown": "there is no approval",
    "action": "is for action",
    "resource": "is for resource",
    "data": "allows other data",
    "revoked": "was revoked",
    "expired": "expired at",
    "exhausted": "is used up",
}

#: The kinds of side effect ``use_approval`` declares, and how often.
_KINDS = {"match_named": 4, "match_any": 3, "twice": 2, "action": 1, "resource": 1, "data": 2,
          "expired": 1, "revoked": 1, "exhausted": 1, "unknown": 1, "missing": 1}


def _approvals(snapshot: Snapshot) -> Mapping[str, Row]:
    return snapshot.tables["approvals"]


def digest(data: Any) -> str:
    """The SHA-256 of ``data``'s canonical JSON, as an approval and a side effect keep it."""
    return fingerprint(canonical_json(data))


def _usable(row: Row, now: float) -> bool:
    return bool(row["revoked_at"] is None and row["uses"] < row["max_uses"]
                and row["expires_at"] > now)


def _terms(row: Row) -> tuple[Any, ...]:
    return (row["action"], row["resource"], row["data_digest"], row["max_uses"],
            row["expires_at"], row["granted_by"], row["requested_by"])


def _decision_time(world: World) -> float:
    return max(world.clock.now(), world.last.high_water)


def _unchanged(step: Step, what: str) -> None:
    """A refused call wrote nothing: the approval tables are as they were."""
    after = step.after()
    step.expect(all(after.tables[name] == step.before.tables[name] for name in _NAMES),
                f"{what} changed the approval records")


# -- grant ------------------------------------------------------------------------------------


def plan_grant(world: World) -> Action:
    """A human grants an approval (sometimes again as it was, with other terms under its id,
    or by a principal that is no human)."""
    rng, now = world.rng, _decision_time(world)
    held = sorted(_approvals(world.last))
    roll = rng.random()
    role = "human" if rng.random() > 0.08 else rng.choice((None, "agent", "operator"))
    if held and roll < 0.25:
        approval_id = rng.choice(held)
        row = _approvals(world.last)[approval_id]
        action, resource = row["action"], row["resource"]
        data = json.loads(row["data"])
        max_uses, expires_at = row["max_uses"], row["expires_at"]
        granter, requested_by = row["granted_by"], row["requested_by"]
        if roll < 0.08:  # the same id, other terms
            max_uses += 1
    else:
        world.counter += 1
        approval_id = f"approval-{world.counter}"
        action, resource = rng.choice(ACTIONS), rng.choice(RESOURCES)
        data = rng.choice(DATA)
        max_uses = rng.choice((1, 1, 2, 3))
        expires_at = now + rng.choice((rng.uniform(5.0, 120.0), rng.uniform(120.0, 2000.0),
                                       rng.uniform(120.0, 2000.0), -rng.uniform(0.0, 10.0)))
        granter, requested_by = rng.choice(HUMANS), rng.choice(("planner", "scout"))
    auth = AuthContext(principal=granter, role=role)
    terms = (action, resource, digest(data), max_uses, expires_at, granter, requested_by)

    def act(step: Step) -> str:
        was = _approvals(step.before).get(approval_id)
        try:
            approval = step.world.store.grant_approval(
                auth, approval_id, action=action, resource=resource, data=data,
                expires_at=expires_at, requested_by=requested_by, max_uses=max_uses)
        except Unauthorized:
            step.expect(role != "human", f"grant by human {granter} was refused")
            _unchanged(step, "a refused grant")
            return "unauthorized"
        except PayloadCollision:
            step.expect(was is not None and _terms(was) != terms,
                        f"grant {approval_id} collided with {was and _terms(was)}")
            _unchanged(step, "a colliding grant")
            return "collision"
        step.expect(role == "human", f"principal {granter} of role {role} granted {approval_id}")
        row = _approvals(step.after()).get(approval_id)
        step.expect(row is not None and approval.uses == row["uses"]
                    and approval.revoked_at == row["revoked_at"],
                    f"grant {approval_id} returned {approval}, stored {row}")
        if was is not None:
            step.expect(_terms(was) == terms, f"grant {approval_id} with other terms than "
                                              f"{_terms(was)} was accepted")
            _unchanged(step, "a repeated grant")
            return "same"
        expected = {"approval_id": approval_id, "action": action, "resource": resource,
                    "data": canonical_json(data), "data_digest": digest(data),
                    "max_uses": max_uses, "uses": 0, "expires_at": expires_at,
                    "granted_by": granter, "requested_by": requested_by,
                    "granted_at": step.now, "revoked_at": None, "revoked_by": None,
                    "revoke_reason": None}
        assert row is not None
        found = {name: row[name] for name in expected}
        step.expect(found == expected, f"granted {approval_id} is stored as {found}, "
                                       f"expected {expected}")
        _expect_events(step, {(approval_id, "granted", 0): (granter, None)})
        return "granted"

    return act


def _expect_events(step: Step, new: Mapping[tuple[str, str, int], tuple[str, str | None]]
                   ) -> None:
    """The approval events are those before plus ``new`` (principal, task), at now."""
    before, after = step.before.tables["approval_events"], step.after().tables["approval_events"]
    expected = {**before, **{key: {"approval_id": key[0], "kind": key[1], "number": key[2],
                                   "principal": principal, "task_id": task_id, "at": step.now}
                             for key, (principal, task_id) in new.items()}}
    step.expect(dict(after) == expected,
                f"approval events: {sorted(set(after) ^ set(expected))} differ, expected "
                f"new {sorted(new)}")


# -- revoke and expire ------------------------------------------------------------------------


def plan_revoke(world: World) -> Action:
    """Revoke an approval: by its granter, an operator or another human (refused); or one
    never granted (not found)."""
    rng = world.rng
    rows = _approvals(world.last)
    live = sorted(key for key, row in rows.items() if row["revoked_at"] is None)
    if rows and rng.random() < 0.92:
        approval_id = rng.choice(live if live and rng.random() < 0.85 else sorted(rows))
        granter = rows[approval_id]["granted_by"]
    else:
        approval_id, granter = "approval-never-granted", rng.choice(HUMANS)
    roll = rng.random()
    if roll < 0.65:
        auth = AuthContext(principal=granter, role="human")
    elif roll < 0.8:
        auth = OPERATOR
    else:
        auth = AuthContext(principal=next(h for h in HUMANS if h != granter), role="human")

    def act(step: Step) -> str:
        was = _approvals(step.before).get(approval_id)
        try:
            revoked = step.world.store.revoke_approval(auth, approval_id, reason="simulated")
        except NotFound:
            step.expect(was is None, f"revoke of granted {approval_id}: NotFound")
            _unchanged(step, "a revoke not found")
            return "not_found"
        except Unauthorized:
            step.expect(was is not None and auth.principal != was["granted_by"]
                        and auth.role != "operator",
                        f"revoke of {approval_id} by {auth} was refused")
            _unchanged(step, "a refused revoke")
            return "unauthorized"
        step.expect(was is not None and (auth.principal == was["granted_by"]
                                         or auth.role == "operator"),
                    f"{auth} revoked {approval_id}, granted by {was and was['granted_by']}")
        assert was is not None
        step.expect(revoked == (was["revoked_at"] is None),
                    f"revoke of {approval_id} (revoked at {was['revoked_at']}) said {revoked}")
        if not revoked:
            _unchanged(step, "a second revoke")
            return "already"
        row = _approvals(step.after())[approval_id]
        expected = {**was, "revoked_at": step.now, "revoked_by": auth.principal,
                    "revoke_reason": "simulated"}
        step.expect(row == expected, f"revoked {approval_id} is stored as {row}")
        _expect_events(step, {(approval_id, "revoked", 0): (auth.principal, None)})
        return "revoked"

    return act


def plan_expire(world: World) -> Action | None:
    """Time reaches an approval's expiry: exactly, or a moment past it."""
    now = _decision_time(world)
    rows = _approvals(world.last)
    pending = sorted(key for key, row in rows.items() if row["expires_at"] > now)
    if not pending:
        return None
    expires_at = float(rows[world.rng.choice(pending)]["expires_at"])
    exactly = world.rng.random() < 0.5
    at = expires_at if exactly else expires_at + world.rng.uniform(0.001, 20.0)

    def act(step: Step) -> str:
        step.world.clock.set(max(step.world.clock.now(), at))
        return "at_expiry" if exactly else "past_expiry"

    return act


# -- use: a finish with side effects ------------------------------------------------------------


def decide_use(approvals: Mapping[str, Row], effects: Sequence[SideEffect], now: float
               ) -> tuple[list[tuple[str, int]], str | None]:
    """Each side effect's approval and use number, in order, or why the first unusable one
    is refused (a key of ``REFUSALS``): the model of one finish's uses."""
    uses = {key: int(row["uses"]) for key, row in approvals.items()}

    def usable(row: Row) -> bool:
        return _usable({**row, "uses": uses[row["approval_id"]]}, now)

    taken: list[tuple[str, int]] = []
    for effect in effects:
        terms = (effect.action, effect.resource, digest(effect.data))
        if effect.approval_id is None:
            found = sorted((row["expires_at"], key) for key, row in approvals.items()
                           if (row["action"], row["resource"], row["data_digest"]) == terms
                           and usable(row))
            if not found:
                return taken, "missing"
            approval_id = found[0][1]
        else:
            approval_id = effect.approval_id
            row = approvals.get(approval_id)
            why = ("unknown" if row is None
                   else "action" if row["action"] != effect.action
                   else "resource" if row["resource"] != effect.resource
                   else "data" if row["data_digest"] != terms[2]
                   else "revoked" if row["revoked_at"] is not None
                   else "expired" if row["expires_at"] <= now
                   else "exhausted" if uses[approval_id] >= row["max_uses"]
                   else None)
            if why is not None:
                return taken, why
        uses[approval_id] += 1
        taken.append((approval_id, uses[approval_id]))
    return taken, None


def _other(options: Sequence[Any], than: Any, world: World) -> Any:
    return world.rng.choice([option for option in options if option != than])


def _effects_for(world: World, kind: str) -> list[SideEffect]:
    """Side effects of ``kind`` built from the approvals known now (any random terms when no
    approval fits the kind)."""
    rng, now = world.rng, _decision_time(world)
    rows = _approvals(world.last)
    fits: dict[str, Callable[[Row], bool]] = {
        "match_named": lambda r: _usable(r, now), "match_any": lambda r: _usable(r, now),
        "twice": lambda r: _usable(r, now) and r["max_uses"] - r["uses"] >= 2,
        "expired": lambda r: bool(r["expires_at"] <= now),
        "revoked": lambda r: r["revoked_at"] is not None,
        "exhausted": lambda r: bool(r["uses"] >= r["max_uses"]),
    }
    chosen = sorted(key for key, row in rows.items() if fits.get(kind, bool)(row))
    if not chosen and kind not in ("unknown", "missing"):
        # None fits: use a usable one if there is one (the model decides either way).
        chosen = sorted(key for key, row in rows.items() if _usable(row, now)) or sorted(rows)
        kind = "match_named"
    if not chosen or kind in ("unknown", "missing"):
        named = "approval-never-granted" if kind == "unknown" else None
        return [SideEffect(action=rng.choice(ACTIONS), resource=rng.choice(RESOURCES),
                           data=rng.choice(DATA), approval_id=named)]
    row = rows[rng.choice(chosen)]
    action, resource, data = row["action"], row["resource"], json.loads(row["data"])
    if kind == "action":
        action = _other(ACTIONS, action, world)
    elif kind == "resource":
        resource = _other(RESOURCES, resource, world)
    elif kind == "data":
        data = _other(DATA, data, world)
    named = None if kind == "match_any" else row["approval_id"]
    effect = SideEffect(action=action, resource=resource, data=data, approval_id=named)
    return [effect, effect] if kind == "twice" else [effect]


def plan_use(world: World) -> Action | None:
    """Finish a claim (mostly a current one) declaring side effects, each needing a use of a
    human's approval."""
    rng = world.rng
    claim = pick_claim(world, current=True if rng.random() < 0.9 else None)
    if claim is None:
        return None
    kind = rng.choices(list(_KINDS), list(_KINDS.values()))[0]
    effects = _effects_for(world, kind)
    if rng.random() < 0.25:
        effects += _effects_for(world, rng.choice(("match_any", "match_named")))
    return lambda step: _use(step, claim, effects)


def _use(step: Step, claim: Claim, effects: list[SideEffect]) -> str:
    before, now = step.before, step.now
    current = is_current(claim, before, now)
    taken, refused = decide_use(_approvals(before), effects, now)
    try:
        step.world.store.finish(claim, {"effects": len(effects)}, side_effects=effects)
    except Fenced:
        step.expect(not current, f"a finish with side effects of current {claim.task_id} "
                                 f"was fenced")
        _nothing_written(step, "a fenced finish with side effects")
        return "fenced"
    except NotApproved as exc:
        step.expect(current and refused is not None,
                    f"the side effects of {claim.task_id} were refused ({exc.reason}); the "
                    f"model expected {'uses ' + str(taken) if current else 'Fenced'}")
        assert refused is not None
        step.expect(REFUSALS[refused] in exc.reason,
                    f"a side effect refused as {refused} says {exc.reason!r}")
        _nothing_written(step, f"a finish refused as {refused}")
        return f"refused:{refused}"
    step.expect(current, f"a finish with side effects committed with a stale claim of "
                         f"{claim.task_id}")
    step.expect(refused is None, f"the side effects of {claim.task_id} committed; the model "
                                 f"expected them refused as {refused}")
    _check_uses(step, claim.task_id, effects, taken)
    return "used" if len(effects) == 1 else "used_several"


def _nothing_written(step: Step, what: str) -> None:
    """A refused finish wrote nothing at all: every table, and the time high-water."""
    after = step.after()
    step.expect(after.high_water == step.before.high_water,
                f"{what} moved the time high-water to {after.high_water}")
    changed = sorted(name for name, rows in after.tables.items()
                     if rows != step.before.tables[name])
    step.expect(not changed, f"{what} wrote to {changed}")


def _check_uses(step: Step, task_id: str, effects: list[SideEffect],
                taken: list[tuple[str, int]]) -> None:
    """The task is done; each side effect is recorded with the use the model expected."""
    before, after, now = step.before, step.after(), step.now
    row = after.tasks[task_id]
    reply = after.replies.get(reply_id_for(task_id))
    step.expect(row["state"] == TaskState.DONE and reply is not None
                and reply["status"] == "done",
                f"task {task_id} finished with side effects is {row['state']} with reply {reply}")
    uses = {key: dict(row) for key, row in _approvals(before).items()}
    for approval_id, number in taken:
        uses[approval_id]["uses"] = number
    step.expect(dict(_approvals(after)) == uses,
                f"approvals after the uses {taken} are not the model's")
    recorded = {(task_id, number): {
        "task_id": task_id, "number": number, "action": effect.action,
        "resource": effect.resource, "data_digest": digest(effect.data),
        "approval_id": approval_id, "use_number": used, "created_at": now}
        for number, (effect, (approval_id, used)) in enumerate(zip(effects, taken,
                                                                   strict=True), start=1)}
    expected = {**before.tables["side_effects"], **recorded}
    step.expect(dict(after.tables["side_effects"]) == expected,
                f"side effects of {task_id} are not {sorted(recorded)}")
    _expect_events(step, {(approval_id, "used", used): (task_id, task_id)
                          for approval_id, used in taken})


# -- checks -----------------------------------------------------------------------------------

_TERMS = ("action", "resource", "data", "data_digest", "max_uses", "expires_at", "granted_by",
          "requested_by", "granted_at", "fingerprint")
_REVOCATION = ("revoked_at", "revoked_by", "revoke_reason")


def approval_records_never_change(before: Snapshot, after: Snapshot, _: Transition
                                  ) -> Iterator[str]:
    """An approval is never forgotten and its terms never change; its uses only grow; a
    revocation stays as recorded; its events and the side effects are never rewritten or
    lost (pruning forgets none of them)."""
    for approval_id, row in _approvals(before).items():
        now = _approvals(after).get(approval_id)
        if now is None:
            yield f"approval {approval_id} disappeared"
            continue
        if any(now[name] != row[name] for name in _TERMS):
            yield f"approval {approval_id} changed its terms"
        if now["uses"] < row["uses"]:
            yield f"approval {approval_id} went back from {row['uses']} to {now['uses']} uses"
        if row["revoked_at"] is not None and any(now[n] != row[n] for n in _REVOCATION):
            yield f"approval {approval_id} changed its revocation"
    for name in ("approval_events", "side_effects"):
        for key, row in before.tables[name].items():
            if after.tables[name].get(key) != row:
                yield f"{name} {key} changed or disappeared"


def uses_match_their_side_effects(_: Snapshot, after: Snapshot, __: Transition
                                  ) -> Iterator[str]:
    """An approval's uses never exceed its count, and its uses 1..n are exactly one side
    effect and one 'used' event each; a side effect's terms are its approval's."""
    numbers: dict[str, list[int]] = {}
    for key, effect in after.tables["side_effects"].items():
        numbers.setdefault(effect["approval_id"], []).append(effect["use_number"])
        approval = _approvals(after).get(effect["approval_id"])
        if approval is None or any(approval[n] != effect[n]
                                   for n in ("action", "resource", "data_digest")):
            yield f"side effect {key} used {effect['approval_id']}, which does not allow it"
    events: dict[str, list[int]] = {}
    for (approval_id, kind, number) in after.tables["approval_events"]:
        if kind == "used":
            events.setdefault(approval_id, []).append(number)
    for approval_id, row in _approvals(after).items():
        wanted = list(range(1, row["uses"] + 1))
        if row["uses"] > row["max_uses"]:
            yield f"approval {approval_id} used {row['uses']} of {row['max_uses']} times"
        if sorted(numbers.get(approval_id, [])) != wanted:
            yield f"approval {approval_id} has {row['uses']} uses and side effects of uses " \
                  f"{sorted(numbers.get(approval_id, []))}"
        if sorted(events.get(approval_id, [])) != wanted:
            yield f"approval {approval_id} has {row['uses']} uses and used events " \
                  f"{sorted(events.get(approval_id, []))}"


def no_use_after_expiry_or_revocation(before: Snapshot, after: Snapshot, _: Transition
                                      ) -> Iterator[str]:
    """Every side effect committed before its approval expired and no later than its
    revocation; none uses an approval already revoked or used up before the step."""
    for key, effect in after.tables["side_effects"].items():
        approval = _approvals(after).get(effect["approval_id"])
        if approval is None:
            continue  # uses_match_their_side_effects names it
        if effect["created_at"] >= approval["expires_at"]:
            yield f"side effect {key} committed at {effect['created_at']}, when approval " \
                  f"{effect['approval_id']} had expired ({approval['expires_at']})"
        if approval["revoked_at"] is not None and effect["created_at"] > approval["revoked_at"]:
            yield f"side effect {key} committed after approval {effect['approval_id']} " \
                  f"was revoked"
        was = _approvals(before).get(effect["approval_id"])
        if key not in before.tables["side_effects"] and was is not None and (
                was["revoked_at"] is not None or was["uses"] >= was["max_uses"]):
            yield f"side effect {key} used approval {effect['approval_id']}, revoked or " \
                  f"used up before"


def side_effects_come_with_their_finish(_: Snapshot, after: Snapshot, __: Transition
                                        ) -> Iterator[str]:
    """A side effect's task finished (done, unless pruned), and a task's side effects are
    numbered 1..n, all committed at once."""
    by_task: dict[str, list[Row]] = {}
    for (task_id, _number), effect in after.tables["side_effects"].items():
        by_task.setdefault(task_id, []).append(effect)
    for task_id, effects in by_task.items():
        task = after.tasks.get(task_id)
        if task is not None and task["received_at"] is not None \
                and task["received_at"] > effects[0]["created_at"]:
            task = None  # its identity was pruned and received again: another task
        if task is not None and task["state"] != TaskState.DONE:
            yield f"task {task_id} has side effects but is {task['state']}"
        if sorted(e["number"] for e in effects) != list(range(1, len(effects) + 1)) or len(
                {e["created_at"] for e in effects}) != 1:
            yield f"task {task_id}'s side effects are not one finish's 1..{len(effects)}"


APPROVAL_OPERATIONS = [
    Operation(name="grant_approval", weight=3, plan=plan_grant),
    Operation(name="revoke_approval", weight=1, plan=plan_revoke),
    Operation(name="approval_expires", weight=1, plan=plan_expire),
    Operation(name="use_approval", weight=6, plan=plan_use),
]
APPROVAL_CHECKS = [approval_records_never_change, uses_match_their_side_effects,
                   no_use_after_expiry_or_revocation, side_effects_come_with_their_finish]

SNAPSHOT_TABLES.extend(APPROVAL_TABLES)
OPERATIONS.extend(APPROVAL_OPERATIONS)
CHECKS.extend(APPROVAL_CHECKS)
