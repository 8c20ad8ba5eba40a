"""Driver errors are translated once, above the dialect seam: the same failure is the same
postroom error on both backends."""

from __future__ import annotations

import pytest

from postroom.db import Write
from postroom.errors import Conflict, StoreError
from tests.support import database_of


def _probe() -> Write:
    # Made inside the test: a Write made at import would register its fault points while
    # the crash suite collects every registered point.
    return Write("test.errors")


def _insert_twice(store) -> None:
    database = database_of(store)
    with database.transaction(_probe()) as tx:
        tx.execute("CREATE TABLE probe (id INTEGER PRIMARY KEY)")
    for _ in range(2):
        with database.transaction(_probe()) as tx:
            tx.execute("INSERT INTO probe (id) VALUES (:id)", {"id": 1})


def test_a_unique_violation_is_a_conflict_on_every_backend(store):
    with pytest.raises(Conflict):
        _insert_twice(store)


def test_any_other_statement_error_is_a_store_error_naming_the_backend(store):
    database = database_of(store)
    with pytest.raises(StoreError) as refused, database.transaction(_probe()) as tx:
        tx.execute("SELECT * FROM no_such_table")
    assert not isinstance(refused.value, Conflict)
    assert str(refused.value).startswith(database.dialect.name)


def test_caller_statements_take_named_parameters_on_every_backend(store):
    database = database_of(store)
    with database.reading() as tx:
        row = tx.execute("SELECT :a + :b AS total", {"a": 2, "b": 3}).fetchone()
    assert int(row["total"]) == 5
