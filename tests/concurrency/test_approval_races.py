"""SPEC §6, §9: a single-use approval raced by separate processes is used exactly once, and a
revocation racing a use either follows the committed use or refuses it."""

from __future__ import annotations

from collections import Counter

from postroom.audit import audit_url
from postroom.validation import task_id_for
from tests.harness.children import release, release_each, spawn
from tests.harness.steps import HUMAN, REFUND
from tests.support import START, envelope

ROUNDS = 40
RACERS = 8


def _grant(store, approval_id: str) -> None:
    store.grant_approval(HUMAN, approval_id, action=REFUND.action, resource=REFUND.resource,
                         data=REFUND.data, expires_at=START + 3600, requested_by="planner")


def test_eight_processes_using_one_single_use_approval_exactly_one_succeeds(store, db_url,
                                                                            auth):
    winners: Counter[str] = Counter()
    with spawn(RACERS, name="worker", store=db_url) as workers:
        for round_ in range(ROUNDS):
            for index in range(RACERS):
                store.receive(auth, envelope(f"refund-{round_}-{index}"))
            claims = release_each([(worker, "claim", {}) for worker in workers])
            assert all(answer.value is not None for answer in claims), f"round {round_}"
            _grant(store, f"approval-{round_}")
            answers = release(workers, "finish_refund")
            assert [a.error for a in answers] == [None] * RACERS, f"round {round_}"
            outcomes = Counter(answer.value for answer in answers)
            assert outcomes == {None: 1, "NotApproved": RACERS - 1}, f"round {round_}"
            assert store.approval(f"approval-{round_}").uses == 1, f"round {round_}"
            won = next(w.name for w, a in zip(workers, answers, strict=True) if a.value is None)
            winners[won] += 1
            refused = [w for w, a in zip(workers, answers, strict=True) if a.value is not None]
            # The refused ones wrote nothing: they finish without the side effect.
            assert [a.error for a in release(refused, "finish")] == [None] * (RACERS - 1)
    print(f"\nsingle-use approval: {ROUNDS} rounds x {RACERS} processes, exactly one use "
          f"every round, wins {dict(winners)}")
    assert sum(winners.values()) == ROUNDS
    assert audit_url(db_url) == []


def test_a_revocation_racing_a_use_either_follows_it_or_refuses_it(store, db_url, auth):
    seen: Counter[str] = Counter()
    with spawn(2, name="racer", store=db_url) as (worker, human):
        for round_ in range(ROUNDS):
            task_id = task_id_for("planner", f"refund-{round_}")
            store.receive(auth, envelope(f"refund-{round_}"))
            assert release([worker], "claim")[0].value is not None, f"round {round_}"
            approval_id = f"approval-{round_}"
            _grant(store, approval_id)
            use = (worker, "finish_refund", {})
            revocation = (human, "revoke", {"approval_id": approval_id})
            # Who hears GO first alternates.
            if round_ % 2:
                used, revoked = release_each([use, revocation])
            else:
                revoked, used = release_each([revocation, use])
            assert (used.error, revoked.error, revoked.value) == (None, None, True), (
                f"round {round_}")
            approval = store.approval(approval_id)
            assert approval.revoked_at is not None, f"round {round_}"
            if used.value is None:  # the use committed first: it stands, before the revocation
                (effect,) = store.side_effects(task_id)
                assert effect.created_at <= approval.revoked_at, f"round {round_}"
                assert approval.uses == 1, f"round {round_}"
                seen["used, then revoked"] += 1
            else:
                assert used.value == "NotApproved", f"round {round_}"
                assert approval.uses == 0 and store.side_effects(task_id) == [], f"round {round_}"
                worker.go("finish")
                assert worker.answer().error is None
                seen["revoked, use refused"] += 1
    print(f"\nrevocation racing a use: {ROUNDS} rounds, {dict(seen)}")
    assert sum(seen.values()) == ROUNDS
    assert audit_url(db_url) == []
