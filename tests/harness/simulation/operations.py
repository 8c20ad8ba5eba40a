"""The operations of the randomized audit, as a weighted table.

An ``Operation`` has a name, a weight and a ``plan``: given the world, it picks its random
arguments (or returns ``None`` when it cannot run now, e.g. no claim to finish) and returns
an ``Action``. The runner calls the action with a ``Step``: the snapshot before it and the
time the store will decide with. An action performs the call and holds the outcome to what
the snapshot before it implies (a stale claim must be fenced, a current one must not; a
duplicate ACK must name a stored task; ...), raising ``Broken`` when it does not. Because an
action reads its expectations from ``step.before``, the runner can run it again after a crash
and restart, as a client retrying the original operation would.

``OPERATIONS`` is the table; a component (waits) appends its own operations to it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from postroom import faults
from postroom.errors import (
    BatchFailed,
    Fenced,
    NotFound,
    PayloadCollision,
    PermanentDeliveryError,
    TransientDeliveryError,
)
from postroom.models import (
    Ack,
    AuthContext,
    Claim,
    Envelope,
    FollowUp,
    Outcome,
    Outgoing,
    Position,
    TaskState,
)
from postroom.outbox import AFTER_REMOTE_COMMIT, BEFORE_REMOTE_COMMIT
from postroom.transitions import reply_id_for
from postroom.validation import canonical_json, follow_up_principal, task_id_for
from tests.harness.simulation.checks import prunable
from tests.harness.simulation.world import (
    OWNERS,
    PRINCIPALS,
    QUEUES,
    TERMINAL,
    Row,
    Snapshot,
    StreamModel,
    World,
    content_fingerprint,
    read_snapshot,
)
from tests.support import database_of

__all__ = ["OPERATIONS", "Action", "Broken", "Operation", "Step", "born_state", "is_current",
           "pick_claim", "pick_task", "receive_one"]


class Broken(Exception):
    """An operation's outcome contradicts what the databases held before it."""


class Step:
    """One attempt at an operation: the world, the snapshot before it, its decision time."""

    __slots__ = ("_after", "before", "now", "world")

    def __init__(self, world: World, before: Snapshot) -> None:
        self.world = world
        self.before = before
        # The store decides with max(clock, persisted high-water); so must the expectations.
        self.now = max(world.clock.now(), before.high_water)
        self._after: Snapshot | None = None

    def after(self) -> Snapshot:
        """The databases after the operation (read once, shared with the runner's checks)."""
        if self._after is None:
            self._after = read_snapshot(database_of(self.world.store),
                                        database_of(self.world.receiver))
        return self._after

    def expect(self, condition: bool, what: str) -> None:
        """Raise ``Broken(what)`` unless ``condition`` holds."""
        if not condition:
            raise Broken(what)


#: Performs the operation; returns a short label of its outcome (counted in the summary).
Action = Callable[[Step], str]


@dataclass(frozen=True, kw_only=True, slots=True)
class Operation:
    """A named, weighted kind of step."""

    name: str
    weight: float
    plan: Callable[[World], Action | None]
    forgets: bool = False  # it may prune records (the checks allow disappearances)


# -- shared expectations ----------------------------------------------------------------------


def born_state(deadline: float, hops: int, now: float, max_hops: int) -> str:
    """The state a newly stored message (a received one, or a follow-up) must start in."""
    if deadline <= now:
        return TaskState.EXPIRED.value
    if hops >= max_hops:
        return TaskState.HOP_LIMIT.value
    return TaskState.PENDING.value


def is_current(claim: Claim, snapshot: Snapshot, now: float) -> bool:
    """Whether ``claim`` may still renew, finish or fail at ``now``."""
    row = snapshot.tasks.get(claim.task_id)
    return (row is not None and row["state"] == TaskState.RUNNING and row["owner"] == claim.owner
            and row["fence"] == claim.fence and row["lease_until"] > now
            and row["deadline"] > now)


def _decision_time(world: World) -> float:
    return max(world.clock.now(), world.last.high_water)


def _check_ack(step: Step, ack: Ack, auth: AuthContext, envelope: Envelope, *,
               duplicate: bool) -> None:
    """An ACK names the right task, tells the truth about duplication, and is durable."""
    world = step.world
    task_id = task_id_for(auth.principal, envelope.message_id)
    label = f"ACK of {auth.principal}/{envelope.message_id}"
    step.expect(ack.task_id == task_id, f"{label} names task {ack.task_id}, not {task_id}")
    step.expect(ack.duplicate == duplicate,
                f"{label} says duplicate={ack.duplicate}; expected {duplicate}")
    row = step.after().tasks.get(task_id)
    step.expect(row is not None, f"{label} was returned but the task is not stored")
    assert row is not None
    held = step.before.tasks.get(task_id)
    if duplicate and held is not None:
        step.expect(row == held, f"{label}: a duplicate changed the stored task")
    elif not duplicate:
        state = born_state(envelope.deadline, envelope.hops, step.now,
                           world.settings.max_hops)
        step.expect(row["state"] == state, f"{label}: stored as {row['state']}, "
                                           f"expected {state}")
        world.sent[(auth.principal, envelope.message_id)] = envelope
    world.acked.add(task_id)


def _stored_fingerprint(step: Step, task_id: str) -> str | None:
    row = step.before.tasks.get(task_id)
    return None if row is None else str(row["fingerprint"])


def receive_one(step: Step, auth: AuthContext, envelope: Envelope,
                 position: Position | None = None) -> str:
    task_id = task_id_for(auth.principal, envelope.message_id)
    stored = _stored_fingerprint(step, task_id)
    collides = stored is not None and stored != content_fingerprint(auth.principal, envelope)
    try:
        ack = step.world.store.receive(auth, envelope, position=position)
    except PayloadCollision:
        step.expect(collides, f"receive {envelope.message_id}: PayloadCollision, but "
                              f"{'the content is the same' if stored else 'nothing was stored'}")
        step.expect(step.after().tasks.get(task_id) == step.before.tasks.get(task_id),
                    f"receive {envelope.message_id}: a collision changed the stored task")
        return "collision"
    step.expect(not collides, f"receive {envelope.message_id}: other content was accepted "
                              f"under a stored identity")
    _check_ack(step, ack, auth, envelope, duplicate=stored is not None)
    return "duplicate" if ack.duplicate else "stored"


def _pick_sent(world: World, principal: str | None = None
               ) -> tuple[AuthContext, Envelope] | None:
    keys = [key for key in world.sent if principal is None or key[0] == principal]
    if not keys:
        return None
    key = world.rng.choice(keys)
    return world.auth(key[0]), world.sent[key]


def _variant(world: World, envelope: Envelope) -> Envelope:
    """The same identity with other content."""
    return replace(envelope, payload={**envelope.payload, "variant": world.rng.random()})


# -- receiving --------------------------------------------------------------------------------


def plan_receive(world: World) -> Action:
    """A new message."""
    auth, envelope = world.new_envelope()
    return lambda step: receive_one(step, auth, envelope)


def plan_receive_duplicate(world: World) -> Action | None:
    """A message sent before, resent unchanged (a new request if it was pruned)."""
    picked = _pick_sent(world)
    if picked is None:
        return None
    auth, envelope = picked
    return lambda step: receive_one(step, auth, envelope)


def plan_receive_collision(world: World) -> Action | None:
    """A stored identity with different content."""
    picked = _pick_sent(world)
    if picked is None:
        return None
    auth, envelope = picked
    changed = _variant(world, envelope)
    return lambda step: receive_one(step, auth, changed)


def plan_receive_expired(world: World) -> Action:
    """A message whose deadline passed before it arrived."""
    auth, envelope = world.new_envelope(
        deadline=world.clock.now() - world.rng.uniform(0.0, 100.0))
    return lambda step: receive_one(step, auth, envelope)


def plan_receive_hop_limited(world: World) -> Action:
    """A message that arrives with hops at or over the store's limit."""
    hops = world.settings.max_hops + world.rng.randint(0, 3)
    auth, envelope = world.new_envelope(hops=hops)
    return lambda step: receive_one(step, auth, envelope)


def _batch_items(world: World) -> tuple[AuthContext, list[Envelope]]:
    principal = world.rng.choice(PRINCIPALS)
    items: list[Envelope] = []
    for _ in range(world.rng.randint(2, 5)):
        roll = world.rng.random()
        picked = _pick_sent(world, principal) if roll < 0.25 else None
        if picked is not None:
            items.append(picked[1] if roll < 0.15 else _variant(world, picked[1]))
        else:
            items.append(world.new_envelope(principal=principal)[1])
    return world.auth(principal), items


def _expected_batch(step: Step, auth: AuthContext, items: Sequence[Envelope]
                    ) -> tuple[int | None, list[bool]]:
    """The first colliding index (or ``None``) and each earlier item's duplicate flag."""
    seen: dict[str, str] = {}
    duplicates: list[bool] = []
    for index, envelope in enumerate(items):
        task_id = task_id_for(auth.principal, envelope.message_id)
        content = content_fingerprint(auth.principal, envelope)
        stored = seen.get(task_id) or _stored_fingerprint(step, task_id)
        if stored is None:
            seen[task_id] = content
            duplicates.append(False)
        elif stored == content:
            duplicates.append(True)
        else:
            return index, duplicates
    return None, duplicates


def plan_receive_batch(world: World) -> Action:
    """An item-by-item batch, sometimes with a duplicate or a collision inside."""
    auth, items = _batch_items(world)

    def act(step: Step) -> str:
        failing, duplicates = _expected_batch(step, auth, items)
        try:
            acks = step.world.store.receive_batch(auth, items)
            outcome = "stored"
        except BatchFailed as exc:
            step.expect(exc.index == failing and isinstance(exc.error, PayloadCollision),
                        f"receive_batch stopped at {exc.index} ({exc.error!r}); "
                        f"expected {failing}")
            step.expect(len(exc.acks) == exc.index,
                        f"receive_batch stopped at {exc.index} with {len(exc.acks)} ACKs")
            acks, outcome = exc.acks, "stopped"
            committed = {task_id_for(auth.principal, e.message_id) for e in items[:exc.index]}
            untried = {task_id_for(auth.principal, e.message_id) for e in items[exc.index:]}
            stored = step.after().tasks.keys() - step.before.tasks.keys()
            step.expect(not (stored & (untried - committed)),
                        "receive_batch stored an item at or after the one that failed")
        else:
            step.expect(failing is None, f"receive_batch accepted item {failing}, a collision")
        for ack, envelope, duplicate in zip(acks, items, duplicates, strict=False):
            _check_ack(step, ack, auth, envelope, duplicate=duplicate)
        return outcome

    return act


def plan_receive_atomic(world: World) -> Action:
    """An all-or-nothing batch, sometimes with a collision that must roll it all back."""
    auth, items = _batch_items(world)

    def act(step: Step) -> str:
        failing, duplicates = _expected_batch(step, auth, items)
        try:
            acks = step.world.store.receive_atomic(auth, items)
        except PayloadCollision:
            step.expect(failing is not None, "receive_atomic refused a batch with no collision")
            step.expect(step.after().tasks == step.before.tasks,
                        "receive_atomic refused the batch but changed tasks")
            return "rolled_back"
        step.expect(failing is None, f"receive_atomic accepted item {failing}, a collision")
        step.expect(len(acks) == len(items), "receive_atomic returned too few ACKs")
        for ack, envelope, duplicate in zip(acks, items, duplicates, strict=True):
            _check_ack(step, ack, auth, envelope, duplicate=duplicate)
        return "stored"

    return act


def plan_receive_positioned(world: World) -> Action:
    """A numbered message of an upstream stream: next, out of order, a gap filled, a resend."""
    rng = world.rng
    principal = rng.choice(PRINCIPALS)
    stream = rng.choice(("feed-a", "feed-b"))
    model = world.streams.setdefault((principal, stream), StreamModel())
    roll = rng.random()
    if roll < 0.2 and model.envelopes:
        seq = rng.choice(sorted(model.envelopes))
    elif roll < 0.45 and model.skipped:
        seq = model.skipped.pop(rng.randrange(len(model.skipped)))
    else:
        seq = model.next_seq
        if rng.random() < 0.25:  # leave a gap that a later step fills
            model.skipped.append(seq)
            seq += 1
        model.next_seq = seq + 1
    if seq not in model.envelopes:
        model.envelopes[seq] = world.new_envelope(principal=principal)[1]
    auth, envelope = world.auth(principal), model.envelopes[seq]

    def act(step: Step) -> str:
        outcome = receive_one(step, auth, envelope, Position(stream=stream, seq=seq))
        if outcome != "collision":
            model.stored.add(seq)
            model.task_ids.add(task_id_for(principal, envelope.message_id))
        mark = step.world.store.watermark(auth, stream)
        step.expect(all(s in model.stored for s in range(1, mark + 1)),
                    f"watermark {mark} of {stream} passes a position never stored")
        if not model.pruned:
            step.expect(mark >= model.watermark,
                        f"watermark of {stream} went back from {model.watermark} to {mark}")
            contiguous = 0
            while contiguous + 1 in model.stored:
                contiguous += 1
            step.expect(mark == contiguous,
                        f"watermark of {stream} is {mark}; every position to {contiguous} "
                        f"is stored")
        model.watermark = mark
        return outcome

    return act


# -- tasks ------------------------------------------------------------------------------------


def _claimable(row: Row, now: float) -> bool:
    """Claimable now, directly or once the claim's own sweep recovers its lease."""
    if row["deadline"] <= now:
        return False
    if row["state"] == TaskState.PENDING:
        return bool(row["available_at"] <= now)
    return bool(row["state"] == TaskState.RUNNING and row["lease_until"] <= now
                and row["attempts"] < row["max_attempts"])


def _claim_bounds(snapshot: Snapshot, queues: Sequence[str], caps: dict[str, int],
                  limit: int, now: float) -> dict[str, tuple[int, int]]:
    """Per queue, how many a claim may take, and how many it surely can if tasks wait: none
    of a paused queue, at most its cap, at most the free slots of a limited one. A slot's
    holder whose lease or deadline passed may or may not be swept by the claim first (the
    sweep is bounded), so it counts as held only for the second number."""
    paused = snapshot.tables.get("paused_queues", {})
    limits = snapshot.tables.get("queue_limits", {})
    slots = snapshot.tables.get("queue_slots", {}).values()
    bounds = {}
    for queue in queues:
        most = 0 if queue in paused else min(limit, caps.get(queue, limit))
        surely = most
        if queue in limits:
            holders = [task for slot in slots if slot["queue"] == queue
                       and (task := snapshot.tasks.get(slot["task_id"])) is not None
                       and task["state"] == TaskState.RUNNING
                       and task["fence"] == slot["fence"]]
            live = [task for task in holders
                    if task["lease_until"] > now and task["deadline"] > now]
            running = int(limits[queue]["running"])
            most = min(most, max(0, running - len(live)))
            surely = min(surely, max(0, running - len(holders)))
        bounds[queue] = (most, surely)
    return bounds


def _plan_claim(world: World, limit: int) -> Action:
    rng = world.rng
    owner = rng.choice(OWNERS)
    queues = rng.sample(QUEUES, rng.randint(1, len(QUEUES)))
    lease = rng.choice((None, None, 5.0, 120.0))
    # Sometimes the claimer caps some of its queues (a worker's --concurrency QUEUE=N).
    caps = ({queue: rng.randint(0, 2) for queue in rng.sample(queues, rng.randint(1, len(queues)))}
            if rng.random() < 0.4 else {})

    def act(step: Step) -> str:
        world = step.world
        seconds = world.settings.lease if lease is None else lease
        claims = world.store.claim_batch(owner, limit, queues=queues, lease=lease,
                                         per_queue=caps or None)
        before, after, now = step.before, step.after(), step.now
        step.expect(len(claims) <= limit, f"claimed {len(claims)} with a limit of {limit}")
        bounds = _claim_bounds(before, queues, caps, limit, now)
        taken = Counter(claim.queue for claim in claims)
        for queue, count in taken.items():
            step.expect(count <= bounds[queue][0],
                        f"claimed {count} of {queue}, which allowed {bounds[queue][0]} "
                        f"(paused, capped or limited)")
        open_queues = {queue for queue in queues if taken[queue] < bounds[queue][1]}
        seats = {(slot["task_id"], slot["fence"])
                 for slot in after.tables.get("queue_slots", {}).values()}
        for claim in claims:  # a claim of a limited queue takes one of its slots
            step.expect(claim.queue not in before.tables.get("queue_limits", {})
                        or (claim.task_id, claim.fence) in seats,
                        f"claimed {claim.task_id} of limited {claim.queue} holds no slot")
        for claim in claims:
            was, row = before.tasks.get(claim.task_id), after.tasks.get(claim.task_id)
            step.expect(was is not None and row is not None, f"claimed unknown {claim.task_id}")
            assert was is not None and row is not None
            step.expect(was["queue"] in queues and _claimable(was, now),
                        f"claimed {claim.task_id}, which was {was['state']} in "
                        f"{was['queue']} and not claimable")
            step.expect((claim.fence, claim.attempt) == (was["fence"] + 1, was["attempts"] + 1)
                        == (row["fence"], row["attempts"]),
                        f"claim of {claim.task_id} has fence {claim.fence}, attempt "
                        f"{claim.attempt}; the task went from fence {was['fence']} to "
                        f"{row['fence']}")
            step.expect((row["state"], row["owner"], row["lease_until"])
                        == ("running", owner, now + seconds),
                        f"claimed task {claim.task_id} is {row['state']} for {row['owner']} "
                        f"until {row['lease_until']}")
        claimed = {claim.task_id for claim in claims}
        waiting = [row for task_id, row in before.tasks.items()
                   if task_id not in claimed and row["queue"] in open_queues
                   and row["state"] == TaskState.PENDING and _claimable(row, now)]
        if len(claims) < limit:
            step.expect(not waiting, f"claimed {len(claims)} of {limit} while "
                                     f"{len(waiting)} claimable tasks waited")
        if limit == 1 and claims:
            # Each task's turn is its availability moved earlier by its priority (claim_at).
            was = before.tasks[claims[0].task_id]
            since = (was["claim_at"] if was["state"] == TaskState.PENDING
                     else now - was["priority"] * world.settings.priority_weight)
            older = [row["task_id"] for row in waiting if row["claim_at"] < since]
            step.expect(not older, f"claimed {claims[0].task_id} before earlier {older[:3]}")
        world.remember_claims(claims)
        return "claimed" if claims else "empty"

    return act


def plan_claim(world: World) -> Action:
    """Claim one task from one or more queues."""
    return _plan_claim(world, 1)


def plan_claim_batch(world: World) -> Action:
    """Claim several tasks in one transaction."""
    return _plan_claim(world, world.rng.randint(2, 4))


def pick_claim(world: World, *, current: bool | None) -> Claim | None:
    now = _decision_time(world)
    pool = [claim for claim in world.claims
            if current is None or is_current(claim, world.last, now) == current]
    return world.rng.choice(pool) if pool else None


def _owner_call(step: Step, claim: Claim, call: Callable[[], Any], what: str
                ) -> tuple[bool, Any]:
    """Run an owner's call; it must succeed exactly when the claim is current."""
    current = is_current(claim, step.before, step.now)
    try:
        value = call()
    except Fenced as exc:
        step.expect(not current, f"{what} with a current claim was fenced: {exc}")
        after = step.after()
        step.expect(after.tasks.get(claim.task_id) == step.before.tasks.get(claim.task_id),
                    f"a fenced {what} changed task {claim.task_id}")
        return False, None
    step.expect(current, f"{what} with a stale claim (fence {claim.fence}, owner "
                         f"{claim.owner}) committed on task {claim.task_id}")
    return True, value


def _follow_ups(world: World, claim: Claim) -> list[FollowUp]:
    # Derived from the parent alone, so a parent run again after pruning asks for the same
    # children (a duplicate), never for a collision.
    return [FollowUp(message_id=f"child-{index}",
                     payload={"parent": claim.message_id, "index": index},
                     queue=QUEUES[index % len(QUEUES)])
            for index in range(world.rng.choice((0, 0, 1, 2)))]


def plan_finish(world: World) -> Action | None:
    """Finish a claim (usually a current one), sometimes with follow-up tasks."""
    claim = pick_claim(world, current=True if world.rng.random() < 0.85 else None)
    if claim is None:
        return None
    result = world.rng.choice((None, {"verdict": "ok"}, [1, 2, 3], world.payload()))
    children = _follow_ups(world, claim)

    def act(step: Step) -> str:
        done, _ = _owner_call(step, claim, lambda: step.world.store.finish(
            claim, result, follow_ups=children), "finish")
        if not done:
            return "fenced"
        after = step.after()
        row = after.tasks[claim.task_id]
        reply = after.replies.get(reply_id_for(claim.task_id))
        step.expect(row["state"] == "done" and reply is not None and reply["status"] == "done",
                    f"finished task {claim.task_id} is {row['state']} with reply {reply}")
        for child in children:
            task_id = task_id_for(follow_up_principal(claim.task_id), child.message_id)
            stored = after.tasks.get(task_id)
            step.expect(stored is not None and stored["parent_task_id"] == claim.task_id
                        and stored["hops"] == claim.hops + 1,
                        f"follow-up {child.message_id} of {claim.task_id} is {stored}")
            step.world.acked.add(task_id)
        return "done"

    return act


def plan_fail(world: World) -> Action | None:
    """Fail a claim, retryable or not."""
    claim = pick_claim(world, current=True if world.rng.random() < 0.85 else None)
    if claim is None:
        return None
    retryable = world.rng.random() < 0.7

    def act(step: Step) -> str:
        done, state = _owner_call(step, claim, lambda: step.world.store.fail(
            claim, "simulated failure", retryable=retryable), "fail")
        if not done:
            return "fenced"
        final = not retryable or claim.attempt >= claim.max_attempts
        expected = "failed" if final else "pending"
        row = step.after().tasks[claim.task_id]
        step.expect(state == expected == row["state"],
                    f"fail(retryable={retryable}) on attempt {claim.attempt} of "
                    f"{claim.max_attempts} returned {state}, task is {row['state']}")
        step.expect(final or row["available_at"] >= step.now,
                    f"a retry of {claim.task_id} is available before now")
        if final:  # failed for good: its reply commits with it, as a finish's does
            reply = step.after().replies.get(reply_id_for(claim.task_id))
            step.expect(reply is not None and reply["status"] == "failed",
                        f"failed task {claim.task_id} is {row['state']} with reply {reply}")
        return expected

    return act


def plan_renew(world: World) -> Action | None:
    """Renew a claim's lease."""
    claim = pick_claim(world, current=True if world.rng.random() < 0.85 else None)
    if claim is None:
        return None
    lease = world.rng.choice((None, 10.0, 90.0))

    def act(step: Step) -> str:
        world = step.world
        done, renewed = _owner_call(step, claim, lambda: world.store.renew(claim, lease=lease),
                                    "renew")
        if not done:
            return "fenced"
        until = step.now + (world.settings.lease if lease is None else lease)
        row = step.after().tasks[claim.task_id]
        step.expect(renewed.lease_until == until == row["lease_until"],
                    f"renewed lease of {claim.task_id} ends at {row['lease_until']}, "
                    f"expected {until}")
        world.remember_claims([renewed])
        return "renewed"

    return act


def plan_stale_worker(world: World) -> Action | None:
    """A worker comes back with a claim that is no longer current: it must be fenced.

    Mostly one whose task is running again under a newer claim, often for the same owner
    name (a restarted worker): there only the fence tells the two claims apart.
    """
    now = _decision_time(world)
    retaken = [claim for claim in world.claims if not is_current(claim, world.last, now)
               and world.last.tasks.get(claim.task_id, {}).get("state") == TaskState.RUNNING]
    same_owner = [claim for claim in retaken
                  if world.last.tasks[claim.task_id]["owner"] == claim.owner]
    roll = world.rng.random()
    if same_owner and roll < 0.5:
        claim: Claim | None = world.rng.choice(same_owner)
    elif retaken and roll < 0.8:
        claim = world.rng.choice(retaken)
    else:
        claim = pick_claim(world, current=False)
    if claim is None:
        return None
    call = world.rng.choice(("finish", "fail", "renew"))

    def act(step: Step) -> str:
        calls: dict[str, Callable[[], Any]] = {
            "finish": lambda: step.world.store.finish(claim, {"stale": True}),
            "fail": lambda: step.world.store.fail(claim, "stale failure"),
            "renew": lambda: step.world.store.renew(claim),
        }
        done, _ = _owner_call(step, claim, calls[call], f"stale {call}")
        return "committed" if done else "fenced"

    return act


def pick_task(world: World, wanted: Callable[[Row], bool], share: float) -> str | None:
    """A stored task: with chance ``share`` one that is ``wanted`` (if any), otherwise any."""
    tasks = world.last.tasks
    chosen = [task_id for task_id, row in tasks.items() if wanted(row)]
    pool = chosen if chosen and world.rng.random() < share else list(tasks)
    return world.rng.choice(pool) if pool else None


def plan_cancel(world: World) -> Action | None:
    """Cancel a task: live ones are cancelled, terminal ones refuse."""
    task_id = pick_task(world, lambda row: row["state"] not in TERMINAL, 0.75)
    if task_id is None:
        return None

    def act(step: Step) -> str:
        was = step.before.tasks.get(task_id)
        try:
            cancelled = step.world.store.cancel(task_id, reason="simulated cancel")
        except NotFound:
            step.expect(was is None, f"cancel of stored task {task_id}: NotFound")
            return "not_found"
        # Cancelling a chain's root cancels every live task of its chain, itself included.
        chain_live = was is not None and (was["state"] not in TERMINAL or any(
            row["root_task_id"] == task_id and row["state"] not in TERMINAL
            for row in step.before.tasks.values()))
        step.expect(was is not None and cancelled == chain_live,
                    f"cancel of {task_id} ({was and was['state']}) returned {cancelled}")
        if cancelled:
            for other, before in step.before.tasks.items():
                if (other != task_id and before["root_task_id"] != task_id) \
                        or before["state"] in TERMINAL:
                    continue
                row = step.after().tasks[other]
                reply = step.after().replies.get(reply_id_for(other))
                step.expect(row["state"] == "cancelled" and reply is not None
                            and reply["status"] == "cancelled",
                            f"cancelled task {other} is {row['state']} with reply {reply}")
        return "cancelled" if cancelled else "refused"

    return act


def plan_sweep(world: World) -> Action:
    """Recover expired leases and deliveries and expire passed deadlines, to the end."""

    def act(step: Step) -> str:
        report = step.world.store.sweep()
        now, after = step.now, step.after()
        for task_id, row in after.tasks.items():
            step.expect(not (row["state"] == "running" and row["lease_until"] <= now),
                        f"the sweep left {task_id} running with an expired lease")
            step.expect(not (row["state"] in ("pending", "running") and row["deadline"] <= now),
                        f"the sweep left {task_id} {row['state']} past its deadline")
        for reply_id, row in after.replies.items():
            step.expect(not (row["state"] == "sending" and row["lease_until"] <= now),
                        f"the sweep left reply {reply_id} sending with an expired lease")
        return "changed" if report.total else "idle"

    return act


# -- delivery ---------------------------------------------------------------------------------


class _Refusing:
    """A transport whose far side refuses everything for good (a 4xx)."""

    def deliver(self, batch: Sequence[Outgoing]) -> Sequence[Outcome]:
        raise PermanentDeliveryError("simulated: 422 unprocessable")


def _due(row: Row, now: float) -> bool:
    if row["state"] == "pending":
        return bool(row["available_at"] <= now)
    return bool(row["state"] == "sending" and row["lease_until"] <= now
                and row["attempts"] < row["budget"])


def _injected(mode: str) -> contextlib.AbstractContextManager[None]:
    def lost(detail: str) -> faults.Action:
        return faults.raising(lambda _: TransientDeliveryError(f"simulated: {detail}"))

    if mode == "transient":
        return faults.armed(BEFORE_REMOTE_COMMIT, lost("connection reset"))
    if mode == "ack_lost":
        return faults.armed(AFTER_REMOTE_COMMIT, lost("ACK lost"))
    return contextlib.nullcontext()


def _plan_dispatch(mode: str) -> Callable[[World], Action]:
    """Dispatch due replies; ``mode`` injects a failure (none, transient, ack_lost, permanent)."""

    def plan(world: World) -> Action:
        limit = world.rng.randint(1, 3)
        owner = world.rng.choice(("d1", "d2"))

        def act(step: Step) -> str:
            world = step.world
            transport = _Refusing() if mode == "permanent" else world.transport
            with _injected(mode):
                report = world.store.dispatch(transport, owner=owner, limit=limit)
            before, after = step.before, step.after()
            claimed = [reply_id for reply_id, row in after.replies.items()
                       if reply_id in before.replies
                       and row["fence"] > before.replies[reply_id]["fence"]]
            step.expect(len(claimed) == report.claimed,
                        f"dispatch reports {report.claimed} claimed; {len(claimed)} fences moved")
            for reply_id in claimed:
                _check_delivery(step, mode, reply_id)
            if mode in ("transient", "permanent"):
                step.expect(after.receipts.keys() == before.receipts.keys(),
                            f"a {mode} failure before the receiver still left a receipt")
            return "delivered" if claimed else "idle"

        return act

    return plan


def _check_delivery(step: Step, mode: str, reply_id: str) -> None:
    was, row = step.before.replies[reply_id], step.after().replies[reply_id]
    step.expect(_due(was, step.now), f"dispatch claimed reply {reply_id}, which was "
                                     f"{was['state']} and not due")
    if mode == "normal":
        # The receiver refuses a reply id it holds with other content: one planted by
        # ``plant_collision``, or the reply of an earlier task under a pruned identity.
        held = step.before.receipts.get(reply_id)
        expected = {"sent" if held is None or held["fingerprint"] == was["fingerprint"]
                    else "dead"}
    elif mode == "permanent":
        expected = {"dead"}
    else:
        expected = {"dead" if row["attempts"] >= row["budget"] else "pending"}
    step.expect(row["state"] in expected, f"{mode} delivery left reply {reply_id} "
                                          f"{row['state']}; expected {sorted(expected)}")
    if mode == "ack_lost":
        step.expect(reply_id in step.after().receipts,
                    f"the ACK of {reply_id} was lost but the receiver has no receipt")


def plan_plant_collision(world: World) -> Action | None:
    """The receiver already holds a reply id with other content (e.g. a forged reply)."""
    candidates = [reply_id for reply_id, row in world.last.replies.items()
                  if row["state"] in ("pending", "dead") and reply_id not in world.last.receipts]
    if not candidates:
        return None
    reply_id = world.rng.choice(candidates)
    row = world.last.replies[reply_id]
    body = canonical_json({"kind": "result", "result": {"forged": world.rng.random()},
                           "status": row["status"], "task_id": row["task_id"]})

    def act(step: Step) -> str:
        ack = step.world.receiver.accept(reply_id, body)
        step.expect(ack.duplicate == (reply_id in step.before.receipts),
                    f"receiver said duplicate={ack.duplicate} for {reply_id}")
        return "planted"

    return act


def plan_requeue(world: World) -> Action | None:
    """An operator sends a dead reply again (any other reply must refuse)."""
    replies = world.last.replies
    dead = [reply_id for reply_id, row in replies.items() if row["state"] == "dead"]
    pool = dead if dead and world.rng.random() < 0.9 else list(replies)
    if not pool:
        return None
    reply_id = world.rng.choice(pool)

    def act(step: Step) -> str:
        was = step.before.replies.get(reply_id)
        try:
            step.world.store.requeue_reply(reply_id, operator="simulation",
                                           reason="reconciled with the receiver")
        except NotFound:
            step.expect(was is None, f"requeue of stored reply {reply_id}: NotFound")
            return "not_found"
        except Fenced:
            step.expect(was is not None and was["state"] != "dead",
                        f"requeue of dead reply {reply_id} was refused")
            return "refused"
        step.expect(was is not None and was["state"] == "dead",
                    f"requeue of reply {reply_id} ({was and was['state']}) was accepted")
        assert was is not None
        row = step.after().replies[reply_id]
        step.expect((row["state"], row["attempts"], row["requeues"])
                    == ("pending", 0, was["requeues"] + 1),
                    f"requeued reply {reply_id} is {row['state']} with {row['attempts']} "
                    f"attempts and {row['requeues']} recorded requeues")
        return "requeued"

    return act


# -- housekeeping and the environment ---------------------------------------------------------


def plan_prune(world: World) -> Action:
    """Forget sent, terminal messages past retention (and only those)."""

    def act(step: Step) -> str:
        world = step.world
        pruned = world.store.prune()
        before, after = step.before, step.after()
        gone = before.tasks.keys() - after.tasks.keys()
        cutoff = step.now - world.store.retention
        eligible = {task_id for task_id in before.tasks if prunable(before, task_id, cutoff)}
        step.expect(pruned == len(gone), f"prune reported {pruned}, {len(gone)} disappeared")
        step.expect(gone == eligible, f"prune forgot {len(gone - eligible)} it should have "
                                      f"kept and kept {len(eligible - gone)} it should have "
                                      f"forgotten")
        for model in world.streams.values():
            if model.task_ids & gone:
                model.pruned = True
        return "pruned" if pruned else "idle"

    return act


def plan_clock_forward(world: World) -> Action:
    """Time passes: a moment, a lease, or past the retention period."""
    low, high = world.rng.choice(((0.1, 5.0), (0.1, 5.0), (5.0, 60.0), (60.0, 1000.0)))
    seconds = world.rng.uniform(low, high)

    def act(step: Step) -> str:
        step.world.clock.advance(seconds)
        return "forward"

    return act


def plan_clock_back(world: World) -> Action:
    """The clock steps backwards (NTP, a VM restore): decisions must not follow it."""
    seconds = world.rng.uniform(1.0, 600.0)

    def act(step: Step) -> str:
        step.world.clock.advance(-seconds)
        return "back"

    return act


def plan_restart(world: World) -> Action:
    """A clean restart: close both databases and open them again."""

    def act(step: Step) -> str:
        step.world.restart()
        return "restarted"

    return act


OPERATIONS: list[Operation] = [
    Operation(name="receive", weight=14, plan=plan_receive),
    Operation(name="receive_duplicate", weight=4, plan=plan_receive_duplicate),
    Operation(name="receive_collision", weight=3, plan=plan_receive_collision),
    Operation(name="receive_expired", weight=2, plan=plan_receive_expired),
    Operation(name="receive_hop_limited", weight=2, plan=plan_receive_hop_limited),
    Operation(name="receive_batch", weight=3, plan=plan_receive_batch),
    Operation(name="receive_atomic", weight=3, plan=plan_receive_atomic),
    Operation(name="receive_positioned", weight=4, plan=plan_receive_positioned),
    Operation(name="claim", weight=12, plan=plan_claim),
    Operation(name="claim_batch", weight=4, plan=plan_claim_batch),
    Operation(name="renew", weight=4, plan=plan_renew),
    Operation(name="finish", weight=12, plan=plan_finish),
    Operation(name="fail", weight=6, plan=plan_fail),
    Operation(name="stale_worker", weight=4, plan=plan_stale_worker),
    Operation(name="cancel", weight=3, plan=plan_cancel),
    Operation(name="sweep", weight=4, plan=plan_sweep),
    Operation(name="dispatch", weight=10, plan=_plan_dispatch("normal")),
    Operation(name="dispatch_transient", weight=3, plan=_plan_dispatch("transient")),
    Operation(name="dispatch_ack_lost", weight=3, plan=_plan_dispatch("ack_lost")),
    Operation(name="dispatch_permanent", weight=1, plan=_plan_dispatch("permanent")),
    Operation(name="plant_collision", weight=1, plan=plan_plant_collision),
    Operation(name="requeue", weight=2, plan=plan_requeue),
    Operation(name="prune", weight=2, plan=plan_prune, forgets=True),
    Operation(name="clock_forward", weight=8, plan=plan_clock_forward),
    Operation(name="clock_back", weight=2, plan=plan_clock_back),
    Operation(name="restart", weight=1, plan=plan_restart),
]
