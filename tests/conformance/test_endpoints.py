"""Endpoints (SPEC §4, §10): one per principal; replies without one wait without spending
their budget; a routed claim fixes a reply's budget to its endpoint's; 410 disables; a
reply handed back keeps its attempt. Every case on both backends."""

from __future__ import annotations

import pytest

import postroom
from postroom import Outcome, OutcomeKind, ReplyState, outbox, signing
from postroom.audit import audit_database
from tests.support import database_of, envelope


def replies_for(store, auth, count: int, *, sender: str = "planner") -> list[str]:
    """``count`` finished tasks of ``sender``; their reply ids."""
    who = postroom.AuthContext(principal=sender)
    acks = store.receive_atomic(who, [envelope(f"{sender}-{i}", sender=sender)
                                      for i in range(count)])
    store.finish_batch([(claim, {"i": 1}) for claim in store.claim_batch("w", count)])
    return ["reply:" + ack.task_id for ack in acks]


def state_of(store, reply_id: str) -> postroom.Reply:
    reply = store.reply(reply_id.removeprefix("reply:"))
    assert reply is not None
    return reply


def clean(store) -> None:
    assert audit_database(database_of(store)) == []


# -- the records --------------------------------------------------------------------------


def test_an_endpoint_is_added_with_a_fresh_secret_and_read_back(store):
    added = store.add_endpoint("planner", "https://hooks.example.com/in",
                               schedule="standard-webhooks", budget=8, concurrency=2)
    assert added.enabled and added.url == "https://hooks.example.com/in"
    assert (added.budget, added.concurrency, added.allow_private) == (8, 2, False)
    assert added.schedule.name == "standard-webhooks" and added.schedule.delays[0] == 5.0
    (secret,) = added.secrets
    assert secret.secret.startswith("whsec_") and len(signing.secret_key(secret.secret)) >= 24
    assert secret.secret not in repr(added)  # never in a log line by accident
    assert store.endpoint("planner") == added
    assert store.endpoints() == {"planner": added}
    assert store.endpoints(["planner", "nobody"]) == {"planner": added}


def test_one_endpoint_per_principal(store):
    store.add_endpoint("planner", "https://a.example.com/")
    with pytest.raises(postroom.Conflict, match="already has an endpoint"):
        store.add_endpoint("planner", "https://b.example.com/")
    assert store.endpoint("planner").url == "https://a.example.com/"


def test_defaults_come_from_the_store_and_an_explicit_schedule_is_custom(store):
    added = store.add_endpoint("planner", "http://h.example.com", schedule=[1, 2.5, 60])
    assert added.budget == store.settings.delivery_budget
    assert (added.schedule.name, added.schedule.delays) == ("custom", (1.0, 2.5, 60.0))


@pytest.mark.parametrize(("field", "kwargs"), [
    ("url", {"url": "ftp://h.example.com/"}),
    ("url", {"url": "https://user:pw@h.example.com/"}),
    ("url", {"url": "https:///path"}),
    ("url", {"url": "https://h.example.com/#frag"}),
    ("url", {"url": "https://h.example.com/a b"}),
    ("url", {"url": "https://h.example.com:99999/"}),
    ("url", {"url": "https://h.example.com/" + "x" * 3000}),
    ("schedule", {"schedule": "weekly"}),
    ("schedule[0]", {"schedule": [-1]}),
    ("budget", {"budget": 0}),
    ("budget", {"budget": 101}),
    ("concurrency", {"concurrency": 0}),
    ("allow_private", {"allow_private": "yes"}),
    ("principal", {"principal": ""}),
])
def test_a_bad_endpoint_is_refused_naming_the_field_and_nothing_is_written(store, field,
                                                                           kwargs):
    arguments = {"principal": "planner", "url": "https://h.example.com/"} | kwargs
    with pytest.raises(postroom.InvalidInput) as refused:
        store.add_endpoint(arguments.pop("principal"), arguments.pop("url"), **arguments)
    assert refused.value.field == field
    assert store.endpoints() == {}


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/in", "http://10.1.2.3/in",
                                 "https://[::1]:8443/in", "http://169.254.169.254/",
                                 "http://[::ffff:192.168.0.1]/"])
def test_an_address_deliveries_never_reach_is_refused_when_added_unless_allowed(store, url):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.add_endpoint("planner", url)
    assert refused.value.field == "url" and "allow_private" in str(refused.value)
    assert store.endpoints() == {}
    assert store.add_endpoint("planner", url, allow_private=True).allow_private


def test_a_name_is_judged_by_its_addresses_when_delivering_not_when_added(store):
    assert store.add_endpoint("planner", "http://localhost:9/in").url == "http://localhost:9/in"


def test_rotation_adds_a_secret_and_can_expire_the_old_ones_after_a_grace(store, clock):
    first = store.add_endpoint("planner", "https://h.example.com/").secrets[0]
    both = store.rotate_endpoint_secret("planner")
    assert [item.secret for item in both.secrets][1] == first.secret
    assert len(both.signing_secrets(clock.now())) == 2
    third = store.rotate_endpoint_secret("planner", expire_old_after=60)
    newest = third.secrets[0].secret
    assert len(third.signing_secrets(clock.now())) == 3
    assert third.signing_secrets(clock.now() + 61) == [newest]
    clock.advance(61)
    # Expired secrets are forgotten at the next rotation; the newest is never expired.
    fourth = store.rotate_endpoint_secret("planner", expire_old_after=0)
    assert [item.secret for item in fourth.secrets][1] == newest
    assert len(fourth.secrets) == 2
    assert fourth.signing_secrets(clock.now()) == [fourth.secrets[0].secret]


def test_disable_enable_and_remove(store):
    store.add_endpoint("planner", "https://h.example.com/")
    disabled = store.disable_endpoint("planner", reason="maintenance")
    assert (disabled.enabled, disabled.disabled_reason) == (False, "maintenance")
    # Disabled again: the first reason is kept.
    assert store.disable_endpoint("planner", reason="other").disabled_reason == "maintenance"
    assert store.enable_endpoint("planner").enabled
    assert store.remove_endpoint("planner") is True
    assert store.remove_endpoint("planner") is False
    with pytest.raises(postroom.NotFound):
        store.endpoint("planner")
    for call in (store.disable_endpoint, store.enable_endpoint, store.rotate_endpoint_secret):
        with pytest.raises(postroom.NotFound):
            call("planner")


# -- replies and their endpoints ------------------------------------------------------------


def test_a_reply_without_an_endpoint_waits_without_spending_its_budget(store, auth):
    (reply_id,) = replies_for(store, auth, 1)
    for _ in range(5):
        assert store.claim_replies("d", routed=True) == []
    reply = state_of(store, reply_id)
    assert (reply.state, reply.attempts, reply.fence) == (ReplyState.PENDING, 0, 0)
    assert store.awaiting_endpoints() == {"planner": 1}
    assert store.info()["replies_awaiting_endpoint"] == 1
    clean(store)


def test_it_goes_out_once_an_endpoint_is_added_and_the_dispatcher_is_woken(store, auth):
    (reply_id,) = replies_for(store, auth, 1)
    assert store.claim_replies("d", routed=True) == []
    waiter = store.waiter((), replies=True)
    store.add_endpoint("planner", "https://h.example.com/", budget=7)
    assert waiter.wait(0) is True
    (claim,) = store.claim_replies("d", routed=True)
    assert (claim.reply_id, claim.attempt, claim.budget) == (reply_id, 1, 7)
    assert store.awaiting_endpoints() == {}


def test_a_disabled_endpoints_replies_wait_and_go_out_when_it_is_enabled(store, auth):
    store.add_endpoint("planner", "https://h.example.com/")
    store.disable_endpoint("planner")
    replies_for(store, auth, 2)
    assert store.claim_replies("d", limit=10, routed=True) == []
    assert store.awaiting_endpoints() == {"planner": 2}
    store.enable_endpoint("planner")
    assert len(store.claim_replies("d", limit=10, routed=True)) == 2


def test_parked_replies_cost_a_claim_nothing_and_never_hold_up_others(store, auth):
    replies_for(store, auth, 30, sender="nobody")  # no endpoint, ahead in the outbox
    routed = replies_for(store, auth, 2)
    store.add_endpoint("planner", "https://h.example.com/")
    claimed: list[str] = []
    for _ in range(5):  # each claim parks the head it meets, then takes what is routed
        claimed += [claim.reply_id for claim in store.claim_replies("d", limit=10,
                                                                    routed=True)]
    assert sorted(claimed) == sorted(routed)
    assert store.awaiting_endpoints() == {"nobody": 30}
    # Once parked, they are out of the claimable head: a claim reads none of them again.
    assert database_of(store).read(outbox.replies_due) is False
    clean(store)


def test_an_unrouted_claim_delivers_to_one_receiver_whatever_the_endpoints(store, auth):
    replies_for(store, auth, 2, sender="nobody")
    assert len(store.claim_replies("d", limit=5)) == 2  # --receiver: no endpoint needed


def test_the_budget_is_fixed_at_the_first_attempt_and_attempts_never_exceed_it(store, auth,
                                                                             clock):
    (reply_id,) = replies_for(store, auth, 1)
    store.add_endpoint("planner", "https://h.example.com/", budget=2)
    (claim,) = store.claim_replies("d", routed=True)
    assert claim.budget == 2
    store.record_delivery(claim, Outcome.transient("HTTP 503"))
    # The endpoint now allows more; the reply keeps the budget its attempts count against.
    store.remove_endpoint("planner")
    store.add_endpoint("planner", "https://h.example.com/", budget=50)
    clock.advance(60)
    (claim,) = store.claim_replies("d", routed=True)
    assert (claim.attempt, claim.budget) == (2, 2)
    assert store.record_delivery(claim, Outcome.transient("HTTP 503")) is ReplyState.DEAD
    assert "budget spent (2 of 2)" in state_of(store, reply_id).last_error
    clean(store)


def test_a_410_kills_the_reply_and_disables_the_endpoint_in_one_transaction(store, auth):
    first, second = replies_for(store, auth, 2)
    store.add_endpoint("planner", "https://h.example.com/")
    claims = store.claim_replies("d", limit=2, routed=True)
    report = store.record_deliveries([(claims[0], Outcome.gone("HTTP 410 Gone"))])
    assert report.dead == 1
    reply = state_of(store, claims[0].reply_id)
    assert reply.state is ReplyState.DEAD and reply.last_error.startswith("gone")
    endpoint = store.endpoint("planner")
    assert not endpoint.enabled and endpoint.disabled_reason.startswith("410 Gone at ")
    # The other claim, handed back, now waits for the endpoint to be enabled.
    assert store.release_replies([claims[1]]) == []
    assert store.claim_replies("d", limit=5, routed=True) == []
    assert store.awaiting_endpoints() == {"planner": 1}
    assert store.story(claims[0].task_id).deliveries[-1].outcome is \
        postroom.AttemptOutcome.GONE
    assert {first, second} == {claim.reply_id for claim in claims}
    clean(store)


def test_a_released_reply_keeps_its_attempt_and_its_error_and_its_fence_moves_on(store, auth,
                                                                                clock):
    (reply_id,) = replies_for(store, auth, 1)
    store.add_endpoint("planner", "https://h.example.com/", budget=2)
    (claim,) = store.claim_replies("d", routed=True)
    store.record_delivery(claim, Outcome.transient("HTTP 503"))
    clock.advance(60)
    for _ in range(5):  # however often it is handed back, its last attempt stays its own
        (claim,) = store.claim_replies("d", routed=True)
        assert claim.attempt == 2
        assert store.release_replies([claim], delay=10) == []
        assert state_of(store, reply_id).last_error == "transient: HTTP 503"
        assert store.claim_replies("d", routed=True) == []  # not before the delay
        clock.advance(10)
    (claim,) = store.claim_replies("d", routed=True)
    assert claim.fence == 7
    assert store.record_delivery(claim, Outcome.delivered()) is ReplyState.SENT
    story = store.story(claim.task_id)
    assert [item.outcome for item in story.deliveries] == [
        postroom.AttemptOutcome.TRANSIENT, *[postroom.AttemptOutcome.RELEASED] * 5,
        postroom.AttemptOutcome.DELIVERED]
    clean(store)


def test_releasing_a_stale_claim_changes_nothing(store, auth, clock):
    replies_for(store, auth, 1)
    (stale,) = store.claim_replies("d")
    clock.advance(store.settings.dispatch_lease)
    (current,) = store.claim_replies("d2")
    assert store.release_replies([stale]) == [stale.reply_id]
    assert store.record_delivery(current, Outcome.delivered()) is ReplyState.SENT


def test_an_outcomes_own_delay_decides_when_it_is_tried_again(store, auth, clock):
    (reply_id,) = replies_for(store, auth, 1)
    (claim,) = store.claim_replies("d")
    store.record_deliveries([(claim, Outcome.transient("HTTP 429", delay=120.0))])
    assert state_of(store, reply_id).available_at == clock.now() + 120.0
    with pytest.raises(postroom.InvalidInput, match="delay"):
        store.record_delivery(claim, Outcome(kind=OutcomeKind.TRANSIENT, delay=float("nan")))
