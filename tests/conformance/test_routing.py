"""SPEC §4: a reply names its requester and carries what the requester needs to match it."""

from __future__ import annotations

import json

import postroom
from postroom import FollowUp
from tests.support import START, envelope


def test_a_reply_goes_to_the_principal_that_sent_the_task_with_its_correlation(store, auth):
    task_id = store.receive(auth, envelope(correlation_id="order-7")).task_id
    store.finish(store.claim("w"), {"total": 3})
    reply = store.reply(task_id)
    assert reply.requester == "planner"
    assert reply.document == {"kind": "result", "task_id": task_id, "status": "done",
                              "result": {"total": 3}, "requester": "planner",
                              "correlation_id": "order-7", "parent_task_id": None}


def test_a_follow_ups_reply_goes_to_the_principal_that_sent_the_chains_root(store, auth):
    root = store.receive(auth, envelope()).task_id
    store.finish(store.claim("w"), "split",
                 follow_ups=[FollowUp(message_id="part", payload={}, correlation_id="p-1")])
    child = store.claim("w")
    assert child.principal.startswith("task:") and child.requester == "planner"
    store.finish(child, "part done")
    reply = store.reply(child.task_id)
    assert reply.requester == "planner"
    assert (reply.document["parent_task_id"], reply.document["correlation_id"]) == (root, "p-1")


def test_a_waits_follow_up_answers_the_requester_of_the_task_that_asked(store, auth):
    store.receive(auth, envelope())
    asking = store.claim("w")
    store.finish(asking, "asked", waits=[postroom.OpenWait(flow="f", step="s",
                                                           deadline=START + 60)])
    store.signal(postroom.AuthContext(principal="alice"), "e-1", "f", "s", 1, {"ok": True})
    resumed = store.resume("f", "s", 1, FollowUp(message_id="next", payload={}))
    store.finish(store.claim("w"), "resumed")
    reply = store.reply(resumed.task_id)
    assert reply.requester == "planner"
    assert reply.document["parent_task_id"] == asking.task_id


def test_a_task_born_terminal_answers_its_sender_too(store, auth):
    task_id = store.receive(auth, envelope(hops=4, correlation_id="c")).task_id
    reply = store.reply(task_id)
    assert (reply.requester, reply.queue, reply.document["correlation_id"]) == (
        "planner", "default", "c")


def test_a_reply_claim_carries_its_requester(store, auth):
    store.receive(auth, envelope())
    store.finish(store.claim("w"), "ok")
    (claim,) = store.claim_replies("d")
    assert claim.requester == "planner"


def test_the_receiver_accepts_a_reply_body_without_the_route(receiver):
    legacy = json.dumps({"kind": "result", "task_id": "t", "status": "done", "result": 1},
                        separators=(",", ":"), sort_keys=True)
    ack = receiver.accept("reply:t", legacy)
    assert not ack.duplicate and receiver.effect_count("reply:t") == 1
