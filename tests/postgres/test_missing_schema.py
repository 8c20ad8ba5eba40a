"""A URL whose ``search_path`` names no schema that exists is refused before anything runs,
in one line that says how to create it (rather than a migration failing half-way with
"no schema has been selected to create in")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

import postroom
from postroom.db.postgres import missing_schema
from tests import pg
from tests.conftest import require_postgres


@pytest.fixture
def nowhere() -> Iterator[tuple[str, str]]:
    """A URL whose search_path names a schema that does not exist, and that schema."""
    require_postgres()
    url = pg.create_schema("missing")
    pg.drop_schema(url)
    yield url, url.rpartition("%3D")[2]
    pg.drop_schema(url)  # if a test created it


def test_opening_a_store_whose_search_path_schema_does_not_exist_says_how_to_create_it(
        nowhere):
    url, schema = nowhere
    with pytest.raises(postroom.StoreError) as refused:
        postroom.open_store(url)
    assert str(refused.value) == (f'schema "{schema}" in search_path does not exist: '
                                  f'create it with CREATE SCHEMA "{schema}"')


def test_postroom_init_refuses_a_missing_schema_in_one_line(nowhere):
    url, schema = nowhere
    result = subprocess.run([sys.executable, "-m", "postroom", "init", url],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f'Error: StoreError: schema "{schema}" in search_path does not '
                             f'exist: create it with CREATE SCHEMA "{schema}"\n')


def test_the_store_opens_once_the_schema_is_created_as_the_refusal_says(nowhere):
    url, _ = nowhere
    with pytest.raises(postroom.StoreError) as refused:
        postroom.open_store(url)
    remedy = str(refused.value).rpartition(": create it with ")[2]
    with psycopg.connect(url.partition("?")[0], autocommit=True) as admin:
        admin.execute(remedy)
    postroom.open_store(url).close()


@pytest.mark.parametrize(("search_path", "message"), [
    ('"$user", public', 'no schema in search_path exists ("alice", "public"): create the '
                        'first with CREATE SCHEMA "alice"'),
    ("Tenant_A", 'schema "tenant_a" in search_path does not exist: create it with '
                 'CREATE SCHEMA "tenant_a"'),
    ('"Tenant A"', 'schema "Tenant A" in search_path does not exist: create it with '
                   'CREATE SCHEMA "Tenant A"'),
    ('"odd""name"', 'schema "odd""name" in search_path does not exist: create it with '
                    'CREATE SCHEMA "odd""name"'),
    ("", "search_path is empty, so there is no schema for the store's tables: name one "
         "with ?options=-csearch_path%3Dname"),
])
def test_the_refusal_names_the_schemas_as_postgresql_reads_the_search_path(search_path,
                                                                          message):
    assert missing_schema(search_path, role="alice") == message
