"""Principals, roles and tokens (the kernel under the HTTP service), on both backends."""

from __future__ import annotations

import pytest

import postroom
from tests.support import database_of, envelope


def test_a_new_principal_gets_a_token_that_authenticates_it(store):
    issued = store.add_principal("alice", "agent")
    found = store.authenticate(issued.token)
    assert (found.name, found.role, found.queues) == ("alice", postroom.Role.AGENT, ())


def test_only_the_tokens_hash_is_stored(store):
    issued = store.add_principal("alice", "agent")
    with database_of(store).reading() as tx:
        rows = tx.execute("SELECT * FROM principal_tokens").fetchall()
    stored = " ".join(str(row[key]) for row in rows for key in row.keys())  # noqa: SIM118
    secret = issued.token.removeprefix(f"pr_{issued.token_id}_")
    assert issued.token_id in stored and secret not in stored


def test_a_worker_is_granted_queues_and_others_are_not(store):
    worker = store.add_principal("w", "worker", queues=["a", "b", "a"]).principal
    assert worker.queues == ("a", "b")
    with pytest.raises(postroom.InvalidInput) as none:
        store.add_principal("w2", "worker")
    with pytest.raises(postroom.InvalidInput) as other:
        store.add_principal("h", "human", queues=["a"])
    assert none.value.field == other.value.field == "queues"


def test_an_unknown_role_is_refused_naming_the_field(store):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.add_principal("x", "admin")
    assert refused.value.field == "role"


@pytest.mark.parametrize("name", ["schedule:nightly", "task:x", "wait:y", "retry:z"])
def test_a_name_of_the_tasks_postroom_makes_itself_is_never_a_principal(store, name):
    with pytest.raises(postroom.InvalidInput) as refused:
        store.add_principal(name, "agent")
    assert refused.value.field == "name" and "reserved" in str(refused.value)
    assert store.list_principals() == []


@pytest.mark.parametrize("change", ["secret", "token_id", "garbage", "empty"])
def test_a_wrong_token_is_refused_with_one_message(store, change):
    issued = store.add_principal("alice", "agent")
    token = {"secret": issued.token[:-4] + "AAAA",
             "token_id": issued.token.replace(issued.token_id, "0" * 12),
             "garbage": "Bearer nonsense", "empty": ""}[change]
    with pytest.raises(postroom.Unauthorized) as refused:
        store.authenticate(token)
    assert str(refused.value) == "the token is not valid"


def test_a_names_principal_is_never_added_twice(store):
    store.add_principal("alice", "agent")
    store.revoke_principal("alice")
    with pytest.raises(postroom.Conflict):
        store.add_principal("alice", "operator")


def test_a_revoked_principal_cannot_authenticate_and_stays_listed(store):
    issued = store.add_principal("alice", "agent")
    assert store.revoke_principal("alice") is True
    assert store.revoke_principal("alice") is False
    with pytest.raises(postroom.Unauthorized):
        store.authenticate(issued.token)
    assert [item.active for item in store.list_principals()] == [False]
    with pytest.raises(postroom.NotFound):
        store.rotate_token("alice")


def test_rotation_stops_the_old_token_at_once_by_default(store):
    old = store.add_principal("alice", "agent")
    new = store.rotate_token("alice")
    with pytest.raises(postroom.Unauthorized):
        store.authenticate(old.token)
    assert store.authenticate(new.token).name == "alice"


def test_rotation_with_an_overlap_keeps_the_old_token_until_it_ends(store, clock):
    old = store.add_principal("alice", "agent")
    store.rotate_token("alice", overlap=60)
    clock.advance(59)
    assert store.authenticate(old.token).name == "alice"
    clock.advance(1)
    with pytest.raises(postroom.Unauthorized):
        store.authenticate(old.token)


def test_a_later_rotation_never_extends_an_ending_token(store, clock):
    old = store.add_principal("alice", "agent")
    store.rotate_token("alice", overlap=10)
    store.rotate_token("alice", overlap=1000)
    clock.advance(10)
    with pytest.raises(postroom.Unauthorized):
        store.authenticate(old.token)


def test_waits_are_listed_by_their_responder(store, clock):
    store.open_wait("f1", "ask", 0, clock.now() + 60, responder="hana")
    store.open_wait("f2", "ask", 0, clock.now() + 30, responder="ivan")
    store.open_wait("f3", "ask", 0, clock.now() + 90, responder="hana")
    page = store.list_waits(responder="hana", limit=1)
    rest = store.list_waits(responder="hana", limit=1, cursor=page.next_cursor)
    assert [wait.flow for wait in page.items + rest.items] == ["f1", "f3"]
    assert rest.next_cursor is None


def test_confirming_counts_each_transaction_that_confirmed_the_token(store, auth):
    issued = store.add_principal("alice", "agent")
    principal = store.authenticate(issued.token)
    with store.confirming(issued.token, principal) as confirmed:
        assert confirmed.transactions == 0
        store.paused_queues()
        store.authenticate(issued.token)
    assert confirmed.transactions == 2


def test_under_confirming_a_revoked_tokens_write_is_unconfirmed_and_writes_nothing(store, auth):
    issued = store.add_principal("alice", "agent")
    principal = store.authenticate(issued.token)
    store.revoke_principal("alice")
    with store.confirming(issued.token, principal), pytest.raises(postroom.Unconfirmed):
        store.receive(auth, envelope("m-1"))
    assert sum(store.info()["tasks"].values()) == 0


def test_a_confirmed_write_reads_its_token_with_its_first_statement_where_each_is_a_round_trip(
        store, auth, monkeypatch):
    issued = store.add_principal("alice", "agent")
    principal = store.authenticate(issued.token)
    dialect = database_of(store).dialect
    statements = 0
    execute = dialect.execute

    def counting(*args, **kwargs):
        nonlocal statements
        statements += 1
        return execute(*args, **kwargs)

    monkeypatch.setattr(dialect, "execute", counting)
    store.receive(auth, envelope("m-1"))
    plain, statements = statements, 0
    with store.confirming(issued.token, principal) as confirmed:
        store.receive(auth, envelope("m-2"))
    assert confirmed.transactions == 1
    # On SQLite a statement is a call in process: the check is a statement of its own.
    assert statements - plain == (0 if dialect.name == "postgres" else 1)


def test_a_write_under_a_token_that_ended_by_the_stores_clock_is_unconfirmed(store, auth,
                                                                           clock):
    old = store.add_principal("alice", "agent")
    principal = store.authenticate(old.token)
    store.rotate_token("alice", overlap=10)
    with store.confirming(old.token, principal):
        store.receive(auth, envelope("m-1"))
        clock.advance(11)
        with pytest.raises(postroom.Unconfirmed):
            store.receive(auth, envelope("m-2"))
    assert sum(store.info()["tasks"].values()) == 1


def test_confirming_refuses_a_token_that_ended_by_the_stores_clock(store, clock):
    old = store.add_principal("alice", "agent")
    principal = store.authenticate(old.token)
    store.rotate_token("alice", overlap=10)
    with store.confirming(old.token, principal):
        store.paused_queues()
        clock.advance(11)
        with pytest.raises(postroom.Unconfirmed):
            store.paused_queues()
