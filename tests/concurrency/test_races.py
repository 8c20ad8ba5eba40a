"""SPEC §9: races between separate processes with separate connections, released together.

Each test starts its children once (each opens its own store, prints READY) and then runs many
rounds: per round the parent prepares the database, releases every child with one GO, and
checks every answer. Failures name the round. Each test prints its counts
(``pytest -n 0 -s tests/concurrency``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import postroom
from postroom import ReplyState, TaskState
from postroom.audit import audit_url
from postroom.transitions import reply_id_for
from postroom.validation import task_id_for
from tests.harness.children import Answer, Child, release, release_each, spawn
from tests.support import SETTINGS, START, envelope, latest_schema

CLAIM_ROUNDS = 100
RECEIVE_ROUNDS = 10
RECEIVERS = 8
STALE_ROUNDS = 10
DISPATCH_ROUNDS = 3
DISPATCHERS = 8
REPLIES_PER_ROUND = 16
RECOVER_ROUNDS = 20
CANCEL_ROUNDS = 20
OPENERS = 8
POSITION_ROUNDS = 10
PRUNE_ROUNDS = 5
PRUNED_PER_ROUND = 100


def no_errors(answers: list[Answer], round_: int) -> None:
    failed = [(a.error, a.message) for a in answers if a.error is not None]
    assert failed == [], f"round {round_}: {failed}"


def one_winner(children: list[Child], answers: list[Answer],
               round_: int) -> tuple[Child, dict[str, Any]]:
    """The one child whose claim succeeded; every other one got ``None``, none an error."""
    no_errors(answers, round_)
    won = [(child, answer.value) for child, answer in zip(children, answers, strict=True)
           if answer.value is not None]
    assert len(won) == 1, f"round {round_}: {len(won)} winners {won}"
    return won[0]


def test_two_workers_racing_for_one_task_exactly_one_wins_every_round(store, db_url, auth):
    wins: Counter[str] = Counter()
    with spawn(2, name="worker", store=db_url) as workers:
        for round_ in range(CLAIM_ROUNDS):
            task_id = store.receive(auth, envelope(f"race-{round_}")).task_id
            order = workers if round_ % 2 == 0 else workers[::-1]  # who hears GO first
            winner, claim = one_winner(order, release(order, "claim"), round_)
            assert (claim["task_id"], claim["owner"], claim["fence"]) == (
                task_id, winner.name, 1), f"round {round_}"
            wins[winner.name] += 1
    print(f"\nclaim race: {CLAIM_ROUNDS} rounds, wins {dict(wins)}, "
          f"{CLAIM_ROUNDS} losers got None, 0 errors")
    assert sum(wins.values()) == CLAIM_ROUNDS
    assert store.info()["tasks"] == {"running": CLAIM_ROUNDS}
    assert audit_url(db_url) == []


def test_eight_processes_receiving_one_message_store_it_once(store, db_url):
    with spawn(RECEIVERS, name="sender", store=db_url) as senders:
        for round_ in range(RECEIVE_ROUNDS):
            message_id = f"same-{round_}"
            answers = release(senders, "receive", message_id=message_id)
            no_errors(answers, round_)
            acks = [a.value for a in answers]
            assert sorted(ack["duplicate"] for ack in acks) == [False] + [True] * (
                RECEIVERS - 1), f"round {round_}: {acks}"
            assert {ack["task_id"] for ack in acks} == {task_id_for("planner", message_id)}, (
                f"round {round_}")
            assert store.info()["tasks"] == {"pending": round_ + 1}, f"round {round_}"
    print(f"\nreceive race: {RECEIVE_ROUNDS} rounds x {RECEIVERS} processes, each round "
          f"1 stored + {RECEIVERS - 1} duplicates, one task row")
    assert audit_url(db_url) == []


def test_consecutive_positions_received_at_once_advance_the_stored_watermark(
        db_url, clock, transport, auth):
    # The watermark a store keeps, not only the one it computes on demand: pruning keeps
    # every message above the kept watermark, so a watermark left behind would keep them all.
    settings = postroom.Settings(retention=60.0)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store, \
            spawn(RECEIVERS, name="source", store=db_url) as sources:
        for round_ in range(POSITION_ROUNDS):
            first = round_ * RECEIVERS + 1
            answers = release_each([
                (source, "receive_at", {"message_id": f"pos-{first + i}", "stream": "feed",
                                        "seq": first + i})
                for i, source in enumerate(sources)])
            no_errors(answers, round_)
        total = POSITION_ROUNDS * RECEIVERS
        assert store.watermark(auth, "feed") == total
        while claims := store.claim_batch("w", 100):
            store.finish_batch([(claim, None) for claim in claims])
        while store.dispatch(transport, limit=100).sent:
            pass
        clock.advance(61)
        assert store.prune() == total
        assert store.watermark(auth, "feed") == total
    print(f"\nposition race: {POSITION_ROUNDS} rounds x {RECEIVERS} consecutive positions, "
          f"watermark {total}, all {total} pruned")
    assert audit_url(db_url) == []


def test_a_stale_worker_finishing_with_its_replacement_is_fenced(store, db_url, make_url,
                                                                 clock, auth):
    receiver_url = make_url("receiver")
    with spawn(2, name="worker", store=db_url) as (stale, fresh):
        for round_ in range(STALE_ROUNDS):
            began = START + round_ * 100
            clock.set(began)
            task_id = store.receive(auth, envelope(f"stale-{round_}")).task_id
            assert stale.call("claim", now=began)["fence"] == 1, f"round {round_}"
            expired = began + SETTINGS.lease
            assert fresh.call("claim", now=expired)["fence"] == 2, f"round {round_}"
            # Both finish at the same moment, each by its own clock: the stale worker's still
            # says its lease holds. Who hears GO first alternates.
            pair = [stale, fresh] if round_ % 2 == 0 else [fresh, stale]
            answers = dict(zip(pair, release_each(
                [(child, "finish", {"result": {"by": child.name}}) for child in pair]),
                strict=True))
            assert answers[stale].error == "Fenced", f"round {round_}: {answers[stale]}"
            assert answers[fresh].error is None, f"round {round_}: {answers[fresh]}"
            task = store.task(task_id)
            assert (task.state, task.fence, task.result) == (
                TaskState.DONE, 2, {"by": fresh.name}), f"round {round_}"
            reply = store.reply(task_id)
            assert reply is not None and fresh.name in reply.body, f"round {round_}"
    with postroom.Receiver.open(receiver_url) as receiver:
        transport = postroom.InProcessTransport(receiver)
        while store.dispatch(transport).claimed:
            pass
        assert receiver.effects_total() == STALE_ROUNDS
    print(f"\nstale worker: {STALE_ROUNDS} rounds, stale fenced {STALE_ROUNDS} times, "
          f"replacement's result stood {STALE_ROUNDS} times")
    assert store.info()["replies"] == {"sent": STALE_ROUNDS}
    assert audit_url(db_url) == [] and audit_url(receiver_url) == []


def test_eight_dispatchers_deliver_each_reply_exactly_once(store, db_url, make_url, auth):
    receiver_url = make_url("receiver")
    per_dispatcher: Counter[str] = Counter()
    with postroom.Receiver.open(receiver_url) as receiver, spawn(
            DISPATCHERS, name="dispatcher", store=db_url, receiver=receiver_url) as dispatchers:
        for round_ in range(DISPATCH_ROUNDS):
            task_ids = [store.receive(auth, envelope(f"reply-{round_}-{i}")).task_id
                        for i in range(REPLIES_PER_ROUND)]
            for _ in task_ids:
                claim = store.claim("w")
                assert claim is not None
                store.finish(claim, {"n": claim.message_id})
            answers = release(dispatchers, "dispatch_all")
            no_errors(answers, round_)
            sent = [a.value for a in answers]
            assert sum(sent) == REPLIES_PER_ROUND, f"round {round_}: sent {sent}"
            per_dispatcher.update({d.name: n for d, n in zip(dispatchers, sent, strict=True)})
            for task_id in task_ids:
                reply = store.reply(task_id)
                assert reply is not None and (reply.state, reply.attempts) == (
                    ReplyState.SENT, 1), f"round {round_}: {reply}"
                assert receiver.effect_count(reply_id_for(task_id)) == 1, f"round {round_}"
        assert receiver.effects_total() == DISPATCH_ROUNDS * REPLIES_PER_ROUND
    print(f"\ndispatch race: {DISPATCH_ROUNDS} rounds x {REPLIES_PER_ROUND} replies, "
          f"{DISPATCHERS} dispatchers sent {dict(per_dispatcher)}, each reply once")
    assert audit_url(db_url) == [] and audit_url(receiver_url) == []


def test_two_workers_racing_for_an_expired_lease_exactly_one_recovers_it(store, db_url, auth,
                                                                          clock):
    wins: Counter[str] = Counter()
    with spawn(2, name="worker", store=db_url) as workers:
        for round_ in range(RECOVER_ROUNDS):
            began = START + round_ * 100
            clock.set(began)
            task_id = store.receive(auth, envelope(f"expired-{round_}")).task_id
            assert store.claim("w-dead") is not None, f"round {round_}"
            order = workers if round_ % 2 == 0 else workers[::-1]
            answers = release(order, "claim", now=began + SETTINGS.lease)
            winner, claim = one_winner(order, answers, round_)
            assert (claim["task_id"], claim["fence"], claim["attempt"]) == (task_id, 2, 2), (
                f"round {round_}")
            winner.call("finish")  # so the next round's sweep finds only its own task
            wins[winner.name] += 1
    print(f"\nrecovery race: {RECOVER_ROUNDS} rounds, wins {dict(wins)}, 0 errors")
    assert store.info()["tasks"] == {"done": RECOVER_ROUNDS}
    assert audit_url(db_url) == []


def test_cancel_racing_with_finish_leaves_exactly_one_outcome(store, db_url, auth):
    outcomes: Counter[str] = Counter()
    with spawn(1, name="worker", store=db_url) as (worker,), spawn(
            1, name="operator", store=db_url) as (operator,):
        for round_ in range(CANCEL_ROUNDS):
            task_id = store.receive(auth, envelope(f"cancel-{round_}")).task_id
            assert worker.call("claim")["task_id"] == task_id, f"round {round_}"
            pair = [worker, operator] if round_ % 2 == 0 else [operator, worker]
            orders = {worker: (worker, "finish", {"result": {"ok": True}}),
                      operator: (operator, "cancel", {"task_id": task_id})}
            answers = dict(zip(pair, release_each([orders[child] for child in pair]),
                               strict=True))
            task = store.task(task_id)
            if task.state == TaskState.DONE:
                assert answers[worker].error is None and answers[operator].value is False, (
                    f"round {round_}: {answers}")
            else:
                assert task.state == TaskState.CANCELLED, f"round {round_}: {task.state}"
                assert answers[worker].error == "Fenced" and answers[operator].value is True, (
                    f"round {round_}: {answers}")
            reply = store.reply(task_id)
            assert reply is not None and reply.status == task.state, f"round {round_}"
            outcomes[str(task.state)] += 1
    print(f"\ncancel vs finish: {CANCEL_ROUNDS} rounds, {dict(outcomes)}")
    assert audit_url(db_url) == []


def test_eight_processes_opening_a_new_database_create_one_schema(make_url):
    url = make_url("fresh")
    with spawn(OPENERS, name="opener") as openers:
        no_errors(release(openers, "open", store=url), 0)
        answers = release(openers, "receive", message_id="first")
        no_errors(answers, 0)
        assert sorted(a.value["duplicate"] for a in answers) == [False] + [True] * (
            OPENERS - 1)
    assert audit_url(url) == []
    with postroom.open_store(url) as store:
        assert store.info()["schema_version"] == latest_schema(store)


def state_of(store: postroom.Store, auth: postroom.AuthContext,
             message_id: str) -> TaskState | None:
    """The state of the task of ``message_id`` (``None`` once it is pruned)."""
    return state_of_task(store, task_id_for(auth.principal, message_id))


def state_of_task(store: postroom.Store, task_id: str) -> TaskState | None:
    """The state of task ``task_id`` (``None`` once it is pruned)."""
    try:
        return store.task(task_id).state
    except postroom.NotFound:
        return None


def test_pruners_racing_resends_of_what_they_prune_lose_no_acked_message(db_url, clock,
                                                                          transport, auth):
    # Two pruners and two senders of the very messages being pruned, released together. A
    # resend is a duplicate (the prune had not taken the message yet) or a new request (it
    # had): never an error, and a new request's task must survive the other pruner.
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(retention=60.0)) as store, \
            spawn(2, name="pruner", store=db_url) as pruners, \
            spawn(2, name="sender", store=db_url) as senders:
        renewed = 0
        unpruned: list[str] = []  # finished and sent, past retention, not pruned yet
        for round_ in range(PRUNE_ROUNDS):
            queue = f"round-{round_}"  # new requests of earlier rounds stay out of the way
            ids = [f"{queue}/m-{n}" for n in range(PRUNED_PER_ROUND)]
            clock.set(START + round_ * 100)
            store.receive_atomic(auth, [envelope(m, queue=queue) for m in ids])
            store.finish_batch([(claim, None) for claim in
                                store.claim_batch("w", PRUNED_PER_ROUND, queues=queue)])
            assert store.dispatch(transport, limit=PRUNED_PER_ROUND).sent == PRUNED_PER_ROUND
            answers = release_each([
                (pruners[0], "prune", {}), (pruners[1], "prune", {}),
                (senders[0], "receive_each", {"message_ids": ids, "queue": queue}),
                (senders[1], "receive_each", {"message_ids": ids[::-1], "queue": queue})],
                now=START + round_ * 100 + 61)
            no_errors(answers, round_)
            acks = [ack for answer in answers[2:] for ack in answer.value]
            assert [ack for ack in acks if "error" in ack] == [], f"round {round_}"
            new = {ack["message_id"] for ack in acks if not ack["duplicate"]}
            states = {m: state_of(store, auth, m) for m in [*unpruned, *ids]}
            assert {states[m] for m in new} <= {TaskState.PENDING}, f"round {round_}: {states}"
            # What a pruner skipped (a resend held it) is pruned in a later round.
            pruned = answers[0].value + answers[1].value
            unpruned = [m for m, state in states.items() if state == TaskState.DONE]
            assert pruned == len(states) - len(unpruned), f"round {round_}: {pruned} reported"
            renewed += len(new)
    print(f"\nprune race: {PRUNE_ROUNDS} rounds x {PRUNED_PER_ROUND} messages, 2 pruners and "
          f"2 senders, {renewed} resends became new requests")
    assert audit_url(db_url) == []


def test_a_wait_opened_on_a_task_being_pruned_never_loses_its_parent(db_url, clock,
                                                                     transport, auth):
    # A wait names its task as the parent of the follow-up its resume may enqueue: a pruner
    # racing the wait's opening forgets the task first (the opening finds no task) or keeps
    # it for the wait, never both.
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(retention=60.0)) as store, \
            spawn(1, name="pruner", store=db_url) as (pruner,), \
            spawn(1, name="opener", store=db_url) as (opener,):
        kept = 0
        for round_ in range(PRUNE_ROUNDS):
            queue = f"round-{round_}"
            ids = [f"{queue}/m-{n}" for n in range(PRUNED_PER_ROUND)]
            clock.set(START + round_ * 100)
            acks = store.receive_atomic(auth, [envelope(m, queue=queue) for m in ids])
            store.finish_batch([(claim, None) for claim in
                                store.claim_batch("w", PRUNED_PER_ROUND, queues=queue)])
            assert store.dispatch(transport, limit=PRUNED_PER_ROUND).sent == PRUNED_PER_ROUND
            task_ids = [ack.task_id for ack in acks]
            answers = release_each([
                (pruner, "prune", {}),
                (opener, "open_waits_on", {"task_ids": task_ids[::-1], "flow": queue,
                                           "deadline": START + 86_400})],
                now=START + round_ * 100 + 61)
            no_errors(answers, round_)
            opened = [a["task_id"] for a in answers[1].value if a["result"] == "opened"]
            lost = [task_id for task_id in opened if state_of_task(store, task_id) is None]
            assert lost == [], f"round {round_}: {len(lost)} waits whose task was pruned"
            kept += len(opened)
    print(f"\nprune vs open_wait: {PRUNE_ROUNDS} rounds x {PRUNED_PER_ROUND} tasks, {kept} "
          "waits opened on tasks the pruner then kept")
    assert audit_url(db_url) == []
