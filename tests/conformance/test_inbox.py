"""SPEC §1-2: identity, authorization, receiving, batches, cursors, retention."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest

import postroom
from postroom.transitions import FLOOR_MARGIN
from postroom.validation import canonical_json, task_id_for
from tests import pg
from tests.support import START, database_of, envelope


def open_connections(url: str) -> int:
    """Connections open to the database at ``url``: this process's open files of it on
    SQLite, the server's sessions on it (once the ones closing have ended) on PostgreSQL."""
    if url.startswith("sqlite:"):
        path = os.path.realpath(url.removeprefix("sqlite:///"))
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") == path
                   for fd in os.listdir("/proc/self/fd"))
    return pg.settled_sessions(url)


def count_tasks(store: postroom.Store) -> int:
    return sum(store.info()["tasks"].values())


def test_receive_stores_a_pending_task_and_acks_stored(store, auth):
    ack = store.receive(auth, envelope())
    assert ack.to_dict() == {"ack": "stored", "task_id": ack.task_id, "duplicate": False}
    task = store.task(ack.task_id)
    assert task.state == postroom.TaskState.PENDING
    assert (task.attempts, task.fence, task.owner, task.lease_until) == (0, 0, None, None)
    assert store.reply(ack.task_id) is None


def test_task_id_is_sha256_of_canonical_principal_and_message_id(store, auth):
    ack = store.receive(auth, envelope("αβ-1"))
    assert ack.task_id == task_id_for("planner", "αβ-1")
    assert canonical_json(["planner", "αβ-1"]) == '["planner","αβ-1"]'


def test_a_repeat_is_a_duplicate_with_the_same_task_id_and_writes_nothing(store, auth, clock):
    first = store.receive(auth, envelope())
    high_water = store.info()["time_high_water"]
    clock.advance(60)
    again = store.receive(auth, envelope())
    assert again.task_id == first.task_id and again.duplicate
    assert count_tasks(store) == 1
    assert store.info()["time_high_water"] == high_water


def test_two_principals_may_use_the_same_message_id(store):
    a = store.receive(postroom.AuthContext(principal="a"), envelope(sender="a"))
    b = store.receive(postroom.AuthContext(principal="b"), envelope(sender="b"))
    assert a.task_id != b.task_id and not a.duplicate and not b.duplicate


def test_same_identity_with_other_content_is_a_collision_and_leaves_the_task(store, auth):
    ack = store.receive(auth, envelope(payload={"n": 1}))
    with pytest.raises(postroom.PayloadCollision):
        store.receive(auth, envelope(payload={"n": 2}))
    assert store.task(ack.task_id).payload == {"n": 1}


def test_a_changed_deadline_is_other_content(store, auth):
    store.receive(auth, envelope())
    with pytest.raises(postroom.PayloadCollision):
        store.receive(auth, envelope(deadline=START + 7200))


def test_an_int_deadline_and_its_float_are_the_same_content(store, auth):
    store.receive(auth, envelope(deadline=2_000_000))
    assert store.receive(auth, envelope(deadline=2_000_000.0)).duplicate


def test_sender_must_equal_the_principal(store, auth):
    with pytest.raises(postroom.Unauthorized, match="sender"):
        store.receive(auth, envelope(sender="someone-else"))
    assert count_tasks(store) == 0


def test_principal_must_be_an_allowed_source(db_url, clock):
    settings = postroom.Settings(allowed_sources=frozenset({"planner"}))
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        with pytest.raises(postroom.Unauthorized, match="allowed source"):
            store.receive(postroom.AuthContext(principal="intruder"),
                          envelope(sender="intruder"))
        assert store.receive(postroom.AuthContext(principal="planner"), envelope())
        assert count_tasks(store) == 1


def test_a_result_message_is_refused_from_the_work_queue(store, auth):
    with pytest.raises(postroom.InvalidEnvelope, match="kind"):
        store.receive(auth, envelope(kind="result"))
    assert count_tasks(store) == 0


def test_an_expired_message_is_stored_expired_with_its_reply(store, auth, clock):
    ack = store.receive(auth, envelope(deadline=clock.now()))
    assert store.task(ack.task_id).state == postroom.TaskState.EXPIRED
    reply = store.reply(ack.task_id)
    assert reply is not None and reply.status == postroom.TaskState.EXPIRED
    assert store.claim("w") is None


def test_a_message_at_the_hop_limit_is_stored_hop_limit_with_its_reply(store, auth):
    ack = store.receive(auth, envelope(hops=store.settings.max_hops))
    assert store.task(ack.task_id).state == postroom.TaskState.HOP_LIMIT
    reply = store.reply(ack.task_id)
    assert reply is not None and reply.document["status"] == "hop_limit"


def test_a_message_below_the_hop_limit_is_pending(store, auth):
    ack = store.receive(auth, envelope(hops=store.settings.max_hops - 1))
    assert store.task(ack.task_id).state == postroom.TaskState.PENDING


def test_receive_batch_keeps_the_committed_prefix_and_names_the_failing_index(store, auth):
    store.receive(auth, envelope("m-102", payload={"v": "original"}))
    batch = [envelope("m-101"), envelope("m-102", payload={"v": "changed"}), envelope("m-103")]
    with pytest.raises(postroom.BatchFailed) as failed:
        store.receive_batch(auth, batch)
    assert failed.value.index == 1
    assert [a.task_id for a in failed.value.acks] == [task_id_for("planner", "m-101")]
    assert isinstance(failed.value.__cause__, postroom.PayloadCollision)
    assert count_tasks(store) == 2  # m-101 committed, m-103 never tried


def test_replaying_a_batch_prefix_yields_duplicates_not_new_tasks(store, auth):
    first = store.receive_batch(auth, [envelope("m-1"), envelope("m-2")])
    again = store.receive_batch(auth, [envelope("m-1"), envelope("m-2"), envelope("m-3")])
    assert [a.duplicate for a in again] == [True, True, False]
    assert [a.task_id for a in again[:2]] == [a.task_id for a in first]


def test_an_invalid_item_stops_the_batch_at_its_index(store, auth):
    with pytest.raises(postroom.BatchFailed) as failed:
        store.receive_batch(auth, [envelope("m-1"), envelope("m-2", max_attempts=0)])
    assert failed.value.index == 1 and len(failed.value.acks) == 1
    assert isinstance(failed.value.__cause__, postroom.InvalidEnvelope)


def test_a_batch_stopped_by_an_unexpected_error_still_reports_its_committed_prefix(
        store, auth, monkeypatch):
    real = store.receive

    def receive(auth, envelope, **kwargs):
        if envelope.message_id == "m-2":
            raise RuntimeError("the host ran out of something")
        return real(auth, envelope, **kwargs)

    monkeypatch.setattr(store, "receive", receive)
    with pytest.raises(postroom.BatchFailed) as failed:
        store.receive_batch(auth, [envelope("m-1"), envelope("m-2"), envelope("m-3")])
    assert failed.value.index == 1
    assert [a.task_id for a in failed.value.acks] == [task_id_for("planner", "m-1")]
    assert isinstance(failed.value.__cause__, RuntimeError)


def test_something_other_than_an_envelope_is_refused_naming_the_field(store, auth):
    with pytest.raises(postroom.InvalidEnvelope, match="envelope: must be an Envelope, got dict"):
        store.receive(auth, {"message_id": "m-1"})
    with pytest.raises(postroom.InvalidEnvelope, match=r"envelopes\[1\]\.envelope"):
        store.receive_atomic(auth, [envelope("m-1"), {"message_id": "m-2"}])
    assert count_tasks(store) == 0


def test_receive_atomic_names_the_item_whose_sender_is_not_the_principal(store, auth):
    with pytest.raises(postroom.Unauthorized, match=r"^envelopes\[1\]: sender 'someone'"):
        store.receive_atomic(auth, [envelope("m-1"), envelope("m-2", sender="someone")])
    assert count_tasks(store) == 0


def test_receive_atomic_stores_all_in_one_transaction(store, auth):
    acks = store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(5)])
    assert [a.duplicate for a in acks] == [False] * 5
    assert count_tasks(store) == 5


def test_receive_atomic_stores_nothing_when_one_item_collides(store, auth):
    store.receive(auth, envelope("m-2", payload={"v": 1}))
    with pytest.raises(postroom.PayloadCollision):
        store.receive_atomic(auth, [envelope("m-1"), envelope("m-2", payload={"v": 2})])
    assert count_tasks(store) == 1


def test_receive_atomic_validates_every_item_before_writing(store, auth):
    with pytest.raises(postroom.InvalidEnvelope) as refused:
        store.receive_atomic(auth, [envelope("m-1"), envelope("m-2", hops=-1)])
    assert refused.value.field == "envelopes[1].hops"
    assert count_tasks(store) == 0


def test_a_duplicate_inside_an_atomic_batch_is_acked_as_a_duplicate(store, auth):
    acks = store.receive_atomic(auth, [envelope("m-1"), envelope("m-1")])
    assert [a.duplicate for a in acks] == [False, True]


def test_an_atomic_batch_acks_a_stored_message_as_a_duplicate_and_stores_the_rest(store, auth):
    store.receive(auth, envelope("m-2"))
    acks = store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(1, 4)])
    assert [a.duplicate for a in acks] == [False, True, False]
    assert count_tasks(store) == 3


def test_an_atomic_batch_stores_born_terminal_messages_with_their_replies(store, auth, clock):
    acks = store.receive_atomic(auth, [envelope("late", deadline=clock.now()),
                                       envelope("far", hops=store.settings.max_hops),
                                       envelope("ok")])
    states = [store.task(ack.task_id).state for ack in acks]
    assert states == [postroom.TaskState.EXPIRED, postroom.TaskState.HOP_LIMIT,
                      postroom.TaskState.PENDING]
    assert [store.reply(ack.task_id) is not None for ack in acks] == [True, True, False]


def test_the_watermark_never_passes_a_missing_position(store, auth):
    def put(seq: int) -> None:
        store.receive(auth, envelope(f"s-{seq}"),
                      position=postroom.Position(stream="feed", seq=seq))

    assert store.watermark(auth, "feed") == 0
    put(1)
    put(2)
    put(10)
    assert store.watermark(auth, "feed") == 2
    for seq in range(4, 10):
        put(seq)
    assert store.watermark(auth, "feed") == 2
    put(3)
    assert store.watermark(auth, "feed") == 10


def test_watermarks_are_per_principal(store, auth):
    store.receive(auth, envelope("s-1"), position=postroom.Position(stream="feed", seq=1))
    other = postroom.AuthContext(principal="other")
    assert store.watermark(other, "feed") == 0


def test_a_position_taken_by_another_message_is_a_collision(store, auth):
    store.receive(auth, envelope("s-1"), position=postroom.Position(stream="feed", seq=1))
    with pytest.raises(postroom.PayloadCollision, match="position 1"):
        store.receive(auth, envelope("s-x"), position=postroom.Position(stream="feed", seq=1))
    assert count_tasks(store) == 1


def test_pruning_forgets_sent_terminal_messages_past_retention(db_url, clock, make_url):
    settings = postroom.Settings(retention=3600.0)
    auth = postroom.AuthContext(principal="planner")
    with postroom.open_store(db_url, clock=clock, settings=settings) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        first = store.receive(auth, envelope(deadline=START + 86_400))
        store.finish(store.claim("w"), {"ok": True})
        store.dispatch(postroom.InProcessTransport(receiver))
        clock.advance(3599)
        assert store.prune() == 0
        clock.advance(2)
        assert store.prune() == 1
        again = store.receive(auth, envelope(deadline=START + 86_400))
        assert again.task_id == first.task_id and not again.duplicate
        assert store.task(again.task_id).state == postroom.TaskState.PENDING


@pytest.fixture
def pruning(db_url, clock, make_url) -> Iterator[tuple[postroom.Store,
                                                       postroom.InProcessTransport]]:
    """A store that prunes what is a minute past, and a transport to a receiver."""
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(retention=60.0)) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        yield store, postroom.InProcessTransport(receiver)


def test_a_claim_on_a_pruned_task_never_matches_the_new_task_of_its_identity(pruning, auth,
                                                                           clock):
    store, transport = pruning
    task_id = store.receive(auth, envelope("job", deadline=START + 86_400)).task_id
    stale = store.claim("w1", lease=30)  # fence 1; this worker hangs
    clock.advance(31)
    store.finish(store.claim("w2", lease=30), {"by": "w2"})  # fence 2
    store.dispatch(transport)
    clock.advance(61)
    assert store.prune() == 1
    store.receive(auth, envelope("job", deadline=START + 86_400, payload={"x": "new"}))
    current = store.claim("w1", lease=30)  # the same owner name, on the new task
    assert current.task_id == task_id and current.fence == 3
    with pytest.raises(postroom.Fenced, match="fence 3"):
        store.finish(stale, {"answer_to": "the old question"})
    store.finish(current, {"answer_to": "the new question"})
    assert store.task(task_id).result == {"answer_to": "the new question"}


def test_a_delivery_claim_on_a_pruned_reply_never_matches_the_new_reply(pruning, auth, clock):
    store, transport = pruning
    task_id = store.receive(auth, envelope("job", deadline=START + 86_400)).task_id
    store.finish(store.claim("w"), {"v": 1})
    [stale] = store.claim_replies("dispatcher", lease=20)  # fence 1; this publisher hangs
    clock.advance(21)
    assert store.dispatch(transport).sent == 1  # recovered (fence 2) and delivered
    clock.advance(61)
    assert store.prune() == 1
    store.receive(auth, envelope("job", deadline=START + 86_400, payload={"x": 2}))
    store.finish(store.claim("w"), {"v": 2})
    [current] = store.claim_replies("dispatcher", lease=20)
    assert current.fence == 3
    with pytest.raises(postroom.Fenced):
        store.record_delivery(stale, postroom.Outcome.delivered())
    assert store.reply(task_id).state == postroom.ReplyState.SENDING


def test_pruning_keeps_a_message_stored_above_its_streams_watermark(pruning, auth, clock):
    store, transport = pruning
    feed = "feed"
    second = store.receive(auth, envelope("s-2", deadline=START + 86_400),
                           position=postroom.Position(stream=feed, seq=2))
    store.finish(store.claim("w"), None)  # #2 is done and answered while #1 is on its way
    store.dispatch(transport)
    clock.advance(61)
    assert store.prune() == 0
    store.receive(auth, envelope("s-1", deadline=START + 86_400),
                  position=postroom.Position(stream=feed, seq=1))
    assert store.watermark(auth, feed) == 2
    # A source resuming from an older watermark sends #2 again: it must stay a duplicate.
    again = store.receive(auth, envelope("s-2", deadline=START + 86_400),
                          position=postroom.Position(stream=feed, seq=2))
    assert again == postroom.Ack(task_id=second.task_id, duplicate=True)
    assert store.task(second.task_id).state == postroom.TaskState.DONE


def test_a_message_below_its_streams_watermark_is_pruned_as_any_other(pruning, auth, clock):
    store, transport = pruning
    for seq in (1, 2):
        store.receive(auth, envelope(f"s-{seq}", deadline=START + 86_400),
                      position=postroom.Position(stream="feed", seq=seq))
        store.finish(store.claim("w"), None)
    store.dispatch(transport, limit=2)
    clock.advance(61)
    assert store.prune() == 2
    assert store.watermark(auth, "feed") == 2


def test_pruning_reports_its_progress_after_each_transaction(db_url, clock, make_url, auth):
    settings = postroom.Settings(retention=60.0, sweep_limit=2)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        for index in range(5):
            store.receive(auth, envelope(f"m-{index}", deadline=START + 86_400))
            store.finish(store.claim("w"), None)
        store.dispatch(postroom.InProcessTransport(receiver), limit=5)
        clock.advance(61)
        totals: list[int] = []
        assert store.prune(progress=totals.append) == 5
        assert totals == [2, 4, 5]


def test_pruning_keeps_live_tasks_and_unsent_replies(db_url, clock):
    settings = postroom.Settings(retention=60.0)
    auth = postroom.AuthContext(principal="planner")
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        live = store.receive(auth, envelope("live"))
        clock.advance(1)
        unsent = store.receive(auth, envelope("unsent"))
        claim = store.claim("w")
        assert claim is not None and claim.task_id == live.task_id
        store.finish(claim, None)
        clock.advance(3600)
        assert store.prune() == 0
        assert store.task(unsent.task_id).state == postroom.TaskState.PENDING
        assert store.reply(live.task_id).state == postroom.ReplyState.PENDING


def test_info_publishes_the_retention_period(store):
    assert store.info()["retention_seconds"] == store.settings.retention == store.retention


def test_a_new_store_publishes_seven_days_unless_its_first_opener_says_otherwise(make_url):
    with postroom.open_store(make_url("default")) as store:
        assert store.retention == 7 * 86_400
    with postroom.open_store(make_url("chosen"),
                             settings=postroom.Settings(retention=60.0)) as store:
        assert store.info()["retention_seconds"] == 60.0


def test_later_openers_adopt_the_published_retention(db_url):
    postroom.open_store(db_url, settings=postroom.Settings(retention=60.0)).close()
    with postroom.open_store(db_url) as store:
        assert store.retention == store.settings.retention == 60.0


def test_an_opener_asking_for_another_retention_is_refused(db_url):
    postroom.open_store(db_url, settings=postroom.Settings(retention=60.0)).close()
    with pytest.raises(postroom.InvalidInput, match="publishes 60 seconds") as refused:
        postroom.open_store(db_url, settings=postroom.Settings(retention=3600.0))
    assert refused.value.field == "retention"
    with postroom.open_store(db_url) as store:
        assert store.retention == 60.0


def answered(store: postroom.Store, receiver: postroom.Receiver, message_id: str) -> str:
    """Receive ``message_id``, finish its task and deliver its reply; its task id."""
    task_id = store.receive(postroom.AuthContext(principal="planner"),
                            envelope(message_id, deadline=START + 30 * 86_400)).task_id
    store.finish(store.claim("w"), None)
    store.dispatch(postroom.InProcessTransport(receiver))
    return task_id


def test_pruning_follows_a_retention_another_process_published(db_url, clock, make_url):
    with postroom.open_store(db_url, clock=clock,
                             settings=postroom.Settings(retention=60.0)) as store, \
            postroom.open_store(db_url, clock=clock) as operator, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        answered(store, receiver, "m-1")
        assert operator.publish_retention(3600.0) == 60.0
        clock.advance(61)
        assert store.prune() == 0  # the store's period is an hour now
        clock.advance(3600)
        assert store.prune() == 1


def test_a_shorter_retention_keeps_what_was_received_under_the_longer_one(db_url, clock,
                                                                           make_url):
    week = 7 * 86_400
    with postroom.open_store(db_url, clock=clock) as store, \
            postroom.Receiver.open(make_url("receiver")) as receiver:
        promised = answered(store, receiver, "promised-a-week")
        clock.advance(10)
        assert store.publish_retention(60.0) == week
        until = START + 10 + week + FLOOR_MARGIN
        assert store.info()["earlier_retention_honoured"] == {"seconds": week, "until": until}
        clock.advance(120)
        assert store.prune() == 0
        resent = store.receive(postroom.AuthContext(principal="planner"),
                               envelope("promised-a-week", deadline=START + 30 * 86_400))
        assert resent == postroom.Ack(task_id=promised, duplicate=True)
        clock.set(until)
        assert store.prune() == 1
        assert store.info()["earlier_retention_honoured"] is None


def test_a_refused_open_releases_its_connections(backend, tmp_path):
    # On PostgreSQL a database of its own, so that its sessions are this test's alone.
    url = (f"sqlite:///{tmp_path / 'refused.db'}" if backend == "sqlite"
           else pg.create_database("refused"))
    try:
        postroom.open_store(url, settings=postroom.Settings(retention=60.0)).close()
        for _ in range(3):
            with pytest.raises(postroom.InvalidInput):
                postroom.open_store(url, settings=postroom.Settings(retention=3600.0))
        assert open_connections(url) == 0
    finally:
        if backend == "postgres":
            pg.drop_database(url)


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf, 3651 * 86_400.0, "60"])
def test_a_bad_retention_is_refused_before_it_is_published(store, seconds):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.publish_retention(seconds)
    assert refused.value.field == "retention"
    assert store.info()["retention_seconds"] == 7 * 86_400


def test_info_shows_the_durability_settings_a_store_runs_with(store):
    durability = store.info()["durability"]
    if database_of(store).dialect.name == "sqlite":
        assert durability == {"journal_mode": "wal", "synchronous": "full"}
    else:  # the server's own settings (tests/postgres checks the warnings they raise)
        assert set(durability) == {"fsync", "synchronous_commit", "full_page_writes",
                                   "autovacuum"}


def test_info_warns_when_sqlite_commits_are_not_synced_in_full(tmp_path):
    with postroom.open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        database_of(store).dialect._conn.execute("PRAGMA synchronous = NORMAL")
        info = store.info()
    assert info["durability"]["synchronous"] == "normal"
    assert info["warnings"] == ["synchronous is normal: a power failure can lose commits "
                                "that were already acknowledged"]


@pytest.mark.parametrize("field", ["message_id", "queue", "correlation_id"])
def test_a_text_field_with_nul_is_refused_on_every_backend(store, auth, field):
    with pytest.raises(postroom.InvalidEnvelope, match=field):
        store.receive(auth, envelope(**{"message_id": "m-1", field: "a\x00b"}))
    assert count_tasks(store) == 0


@pytest.mark.parametrize("allowed", [None, frozenset({"planner"})], ids=["any", "allowed"])
@pytest.mark.parametrize("principal", ["", "planner\ud800", "planner\x00", "p" * 129, 42, None,
                                       ["planner"]])
def test_a_principal_that_cannot_be_an_identity_is_unauthorized(db_url, clock, principal,
                                                                allowed):
    settings = postroom.Settings(allowed_sources=allowed)
    auth = postroom.AuthContext(principal=principal)
    with postroom.open_store(db_url, clock=clock, settings=settings) as store:
        with pytest.raises(postroom.Unauthorized, match="principal"):
            store.receive(auth, envelope())
        with pytest.raises(postroom.Unauthorized, match="principal"):
            store.watermark(auth, "feed")
        assert count_tasks(store) == 0


@pytest.mark.parametrize("principal", ["task:0123abcd", 'wait:["f","s",1]'])
def test_a_principal_in_a_follow_up_namespace_is_unauthorized(store, principal):
    # Else it could take a follow-up's identity first and make its finish or resume collide.
    auth = postroom.AuthContext(principal=principal)
    with pytest.raises(postroom.Unauthorized, match="reserved"):
        store.receive(auth, envelope("next"))
    with pytest.raises(postroom.Unauthorized, match="reserved"):
        store.signal(auth, "e-1", "f", "s", 1, "yes")
    assert count_tasks(store) == 0


def test_a_position_that_is_not_a_position_is_refused_naming_the_field(store, auth):
    with pytest.raises(postroom.InvalidInput, match="position"):
        store.receive(auth, envelope(), position=("feed", 1))  # type: ignore[arg-type]
    assert count_tasks(store) == 0


def test_a_batch_item_with_a_bad_position_fails_the_batch_after_the_committed_prefix(store,
                                                                                   auth):
    with pytest.raises(postroom.BatchFailed) as failed:
        store.receive_batch(auth, [envelope("a"), envelope("b")],
                            positions=[None, "feed#2"])  # type: ignore[list-item]
    assert failed.value.index == 1 and len(failed.value.acks) == 1
    assert count_tasks(store) == 1
