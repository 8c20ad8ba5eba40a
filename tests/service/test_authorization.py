"""The authorization matrix: every route of the table, called by every principal (one of
each role, a second of each, and nobody) on its own records, on another principal's, and
on records that do not exist.

What may succeed is stated here, independently of the service (``ALLOWED``): agents submit
and read their own tasks and replies; workers work the claims they hold in the queues they
are granted; humans read and answer the waits addressed to them, answer the approval
requests addressed to them, grant approvals and read and revoke those they granted;
operators do everything else but grant or answer approvals (and may answer a wait not
opened yet: an early signal, SPEC §5). The matrix counts and asserts:

- unauthorized successes: a 2xx where the rule says no (must be 0);
- existence leaks: a refused call on an existing record whose answer differs in any byte
  (status or body; request ids are headers) from the same call on a missing one (must be 0);
- refused allowances: an allowed call that did not succeed (must be 0, or the matrix proves
  nothing).

A settlement answers each of its outcomes on its own: its call names one, and that item's
answer (its problem, if refused) is what counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

import postroom
from postroom.http.app import ROUTES
from tests.service.conftest import PRINCIPALS
from tests.support import START

DEADLINE = START + 3600
MISSING_TASK = "0" * 64
CALLERS = [*PRINCIPALS, None]  # None: no token at all


@dataclass
class World:
    """Records of several principals: alice's and bob's ended tasks (with dead replies),
    wendy's and walt's claims, waits addressed to hana, to hugo and to nobody, approval
    requests addressed to hana and to hugo, and an approval granted by each."""

    tasks: dict[str, str]  # owner -> its ended task
    claims: dict[str, postroom.Claim]  # worker -> its claim
    waits: dict[str | None, tuple[str, str, int]]  # responder -> its wait's address
    asks: dict[str, tuple[str, str, int]]  # responder -> its approval request's address
    approvals: dict[str, str]  # granter -> its approval's id


def build(store: postroom.Store, prefix: str) -> World:
    """A world of its own (every name starts with ``prefix``), so earlier calls changed
    none of its records."""
    store.resume_queue("default")  # the matrix pauses it
    tasks = {}
    for owner in ("alice", "bob"):
        ack = store.receive(postroom.AuthContext(principal=owner), postroom.Envelope(
            message_id=f"{prefix}-{owner}-task", sender=owner, payload={"n": 1},
            deadline=DEADLINE))
        store.cancel(ack.task_id)
        tasks[owner] = ack.task_id
    while replies := store.claim_replies("d", limit=10):
        for reply in replies:
            store.record_delivery(reply, postroom.Outcome.permanent("refused"))
    claims = {}
    for worker, queue in (("wendy", "default"), ("walt", "other")):
        message_id = f"{prefix}-for-{worker}"
        store.receive(postroom.AuthContext(principal="alice"), postroom.Envelope(
            message_id=message_id, sender="alice", payload={"n": 2}, deadline=DEADLINE,
            queue=queue))
        claimed = store.claim_batch(f"http:{worker}", 100, queues=[queue])
        claims[worker] = next(item for item in claimed if item.message_id == message_id)
    waits: dict[str | None, tuple[str, str, int]] = {}
    for responder in ("hana", "hugo", None):
        flow = f"{prefix}-flow-{responder}"
        opened = store.open_wait(flow, "ask", 0, START + 600, responder=responder)
        waits[responder] = (flow, "ask", opened.generation)
    humans = ("hana", "hugo")
    store.receive(postroom.AuthContext(principal="alice"), postroom.Envelope(
        message_id=f"{prefix}-asking", sender="alice", payload={"n": 3}, deadline=DEADLINE,
        queue=f"{prefix}-asking"))
    [asking] = store.claim_batch("builder", 1, queues=[f"{prefix}-asking"])
    store.finish(asking, "asked", waits=[postroom.OpenWait(
        flow=f"{prefix}-approve-{human}", step="ask", deadline=START + 600, responder=human,
        approval=postroom.ApprovalRequest(action="refund", resource="c:1", data={"n": 1},
                                          expires_at=DEADLINE)) for human in humans])
    approvals = {}
    for human in humans:
        approvals[human] = store.grant_approval(
            postroom.AuthContext(principal=human, role="human"), f"{prefix}-by-{human}",
            action="refund", resource="c:2", data={}, expires_at=DEADLINE,
            requested_by="alice").approval_id
    return World(tasks=tasks, claims=claims, waits=waits,
                 asks={human: (f"{prefix}-approve-{human}", "ask", 1) for human in humans},
                 approvals=approvals)


def role(name: str | None) -> str | None:
    return None if name is None else PRINCIPALS[name][0]


# A target is the record a call names: an owner's ("alice", "wendy", "hana", None for the
# unaddressed wait), or "missing". Each route says which records it is called on.
TASK_OWNERS = ["alice", "bob", "missing"]
CLAIM_HOLDERS = ["wendy", "walt", "missing"]
RESPONDERS: list[str | None] = ["hana", "hugo", None, "missing"]
HUMANS = ["hana", "hugo", "missing"]


def allowed(route: str, caller: str | None, target: Any) -> bool:
    """Whether ``caller`` may call ``route`` on ``target``: the rules, stated once here."""
    kind = role(caller)
    if route in ("healthz", "readyz"):
        return True
    if kind is None:
        return False
    if route == "whoami":
        return True
    if route == "signal" and kind == "operator" and target == "missing":
        return True  # an operator sees every wait: its answer to none yet is an early signal
    if target == "missing":
        return False
    if route in ("submit", "submit_batch", "submit_atomic"):
        return kind == "agent"
    if route == "list_tasks":
        return kind in ("agent", "operator")
    if route in ("get_task", "get_story", "get_reply"):
        return kind == "operator" or (kind == "agent" and target == caller)
    if route in {"claim", "open_wait"}:
        return kind == "worker" or (route == "open_wait" and kind == "operator")
    if route in ("renew", "renew_many", "finish", "fail", "release", "settle"):
        return kind == "worker" and target == caller
    if route in ("list_waits", "get_wait"):
        return kind == "operator" or (kind == "human" and target in (caller, "-"))
    if route in ("grant_approval", "answer_approval"):
        return kind == "human" and target in (caller, "-")
    if route in ("list_approvals", "approval_requests"):
        return kind in ("human", "operator")
    if route in ("get_approval", "revoke_approval"):
        return kind == "operator" or (kind == "human" and target == caller)
    if route == "signal":
        return (kind == "human" and target == caller) or (kind == "operator" and target is None)
    return kind == "operator"  # cancel, retry, retry_many, status, replies, queues, audit


@dataclass
class Call:
    path: str
    body: Any = None
    params: dict[str, Any] | None = None


def calls(route: str, world: World, caller: str | None) -> dict[Any, Call]:
    """The calls of ``route`` to make as ``caller``, by target."""
    unique = f"{caller}-{route}"
    envelope = {"message_id": unique, "payload": {"n": 1}, "deadline": DEADLINE}

    def on_tasks(tail: str, body: Any = None) -> dict[Any, Call]:
        ids = {**world.tasks, "missing": MISSING_TASK}
        return {owner: Call(f"/v1/tasks/{ids[owner]}{tail}", body) for owner in TASK_OWNERS}

    def held() -> list[tuple[str, str, int]]:
        """Each holder's claimed task and fence ("missing": no such task)."""
        found = []
        for holder in CLAIM_HOLDERS:
            claim = world.claims.get(holder, world.claims["wendy"])
            found.append((holder, MISSING_TASK if holder == "missing" else claim.task_id,
                          claim.fence))
        return found

    def on_claims(verb: str, body: dict[str, Any]) -> dict[Any, Call]:
        return {holder: Call(f"/v1/tasks/{task_id}/{verb}", {"fence": fence, **body})
                for holder, task_id, fence in held()}

    def on_waits(tail: str, body: Any = None, *, generation: bool = False) -> dict[Any, Call]:
        found: dict[Any, Call] = {}
        for responder in RESPONDERS:
            flow, step, number = (("nope", "ask", 1) if responder == "missing"
                                  else world.waits[responder])
            suffix = f"/{number}{tail}" if generation else tail
            found[responder] = Call(f"/v1/waits/{flow}/{step}{suffix}", body)
        return found

    def on_approvals(tail: str, body: Any = None) -> dict[Any, Call]:
        ids = {**world.approvals, "missing": "no-such-approval"}
        return {human: Call(f"/v1/approvals/{ids[human]}{tail}", body) for human in HUMANS}

    single: dict[str, Call] = {
        "healthz": Call("/healthz"), "readyz": Call("/readyz"), "whoami": Call("/v1/me"),
        "submit": Call("/v1/tasks", envelope),
        "submit_batch": Call("/v1/batches", {"envelopes": [envelope]}),
        "submit_atomic": Call("/v1/batches/atomic", {"envelopes": [
            {**envelope, "message_id": f"{unique}-atomic"}]}),
        "list_tasks": Call("/v1/tasks"), "claim": Call("/v1/claims", {}),
        "open_wait": Call("/v1/waits", {"flow": unique, "step": "s", "deadline": START + 60}),
        "list_waits": Call("/v1/waits"), "status": Call("/v1/status"),
        "retry_many": Call("/v1/retries", {"reason": "r", "dry_run": True}),
        "dead_replies": Call("/v1/replies/dead"), "paused_queues": Call("/v1/queues"),
        "pause": Call("/v1/queues/default/pause", {"reason": "r"}),
        "resume": Call("/v1/queues/default/resume"), "audit": Call("/v1/audit"),
        "grant_approval": Call("/v1/approvals", {
            "approval_id": unique, "action": "a", "resource": "r", "data": None,
            "expires_at": DEADLINE, "requested_by": "alice"}),
        "list_approvals": Call("/v1/approvals"),
        "approval_requests": Call("/v1/approval-requests"),
    }
    assert single.keys() == WORLDLESS
    if route in single:
        return {"-": single[route]}
    reply_ids = {**world.tasks, "missing": MISSING_TASK}
    by_route: dict[str, Callable[[], dict[Any, Call]]] = {
        "get_task": lambda: on_tasks(""), "get_story": lambda: on_tasks("/story"),
        "get_reply": lambda: on_tasks("/reply"), "cancel": lambda: on_tasks("/cancel", {}),
        "retry": lambda: on_tasks("/retry", {"reason": "again"}),
        "requeue": lambda: {owner: Call(f"/v1/replies/reply:{reply_ids[owner]}/requeue",
                                        {"reason": "fixed"}) for owner in TASK_OWNERS},
        "renew": lambda: on_claims("renew", {}),
        "finish": lambda: on_claims("finish", {"result": {"ok": True}}),
        "fail": lambda: on_claims("fail", {"reason": "no"}),
        "release": lambda: on_claims("release", {}),
        "renew_many": lambda: {holder: Call("/v1/renewals", {"claims": [
            {"task_id": task_id, "fence": fence}]}) for holder, task_id, fence in held()},
        "settle": lambda: {holder: Call("/v1/settlements", {"outcomes": [
            {"outcome": "finish", "task_id": task_id, "fence": fence, "result": None}]})
            for holder, task_id, fence in held()},
        "get_wait": lambda: on_waits(""),
        "signal": lambda: on_waits("/signal", {"event_id": unique, "value": 1},
                                   generation=True),
        "answer_approval": lambda: {human: Call(
            "/v1/waits/{}/{}/{}/approval".format(*world.asks.get(human, ("nope", "ask", 1))),
            {"event_id": unique, "approve": True}) for human in HUMANS},
        "get_approval": lambda: on_approvals(""),
        "revoke_approval": lambda: on_approvals("/revoke", {"reason": "no"}),
    }
    return by_route[route]()


def verdict(route: str, answer: httpx.Response) -> tuple[int, bytes]:
    """The status and body a call was answered with; for a settlement or a renewal (whose
    items are answered one by one), those of its one item's problem, if it has one."""
    items = {"settle": "settled", "renew_many": "renewed"}.get(route)
    if items is not None and answer.status_code == 200:
        [item] = answer.json()[items]
        if "problem" in item:
            return int(item["problem"]["status"]), json.dumps(item["problem"]).encode()
    return answer.status_code, answer.content


#: The routes whose one call names no record of a world (``calls``' single ones).
WORLDLESS = {"healthz", "readyz", "whoami", "submit", "submit_batch", "submit_atomic",
             "list_tasks", "claim", "open_wait", "list_waits", "status", "retry_many",
             "dead_replies", "paused_queues", "pause", "resume", "audit", "grant_approval",
             "list_approvals", "approval_requests"}
NO_WORLD = World(tasks={}, claims={}, waits={}, asks={}, approvals={})

#: The listings, and the field naming whose each listed record is.
LISTED = {"list_tasks": "principal", "list_waits": "responder",
          "approval_requests": "responder", "list_approvals": "granted_by"}


def test_no_role_does_more_than_its_rules_and_no_refusal_tells_what_exists(service):
    counts = {"requests": 0, "unauthorized_successes": 0, "existence_leaks": 0,
              "refused_allowances": 0}
    findings: list[str] = []
    for route in ROUTES:
        shared: World | None = None
        for caller in CALLERS:
            # A call that writes gets a world of its own; the reads of one route share one,
            # and a route that names no record needs none.
            if route.name in WORLDLESS:
                world = NO_WORLD
            elif route.method == "GET":
                shared = shared or build(service.store, route.name)
                world = shared
            else:
                world = build(service.store, f"{route.name}-{caller}")
            http = service.http(caller)
            answers: dict[Any, tuple[int, bytes]] = {}
            for target, call in calls(route.name, world, caller).items():
                answer = http.request(route.method, call.path, json=call.body)
                status, content = answers[target] = verdict(route.name, answer)
                counts["requests"] += 1
                ok = status < 400
                if ok and not allowed(route.name, caller, target):
                    counts["unauthorized_successes"] += 1
                    findings.append(f"{caller} {route.name} {target}: {status}")
                elif not ok and allowed(route.name, caller, target):
                    counts["refused_allowances"] += 1
                    findings.append(f"{caller} {route.name} {target} refused: "
                                    f"{status} {content[:120]!r}")
                whose = LISTED.get(route.name)
                if ok and whose is not None and role(caller) != "operator":
                    foreign = [item for item in answer.json()["items"] if item[whose] != caller]
                    if foreign:
                        counts["unauthorized_successes"] += 1
                        findings.append(f"{caller} {route.name} lists {len(foreign)} others'")
            missing = answers.get("missing")
            for target, (status, content) in answers.items():
                if (missing is not None and target != "missing" and status == 404
                        and (status, content) != missing):
                    counts["existence_leaks"] += 1
                    findings.append(f"{caller} {route.name} {target}: 404 differs")
    print("authorization matrix:", counts)
    assert counts["requests"] >= len(ROUTES) * len(CALLERS)
    assert findings == []
    assert counts["unauthorized_successes"] == counts["existence_leaks"] == 0
