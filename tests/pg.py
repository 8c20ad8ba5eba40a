"""PostgreSQL for the tests: the shared server, a fresh schema per test, private clusters.

The suite runs against the local server named by ``POSTROOM_PG_URL`` (default: the machine's
cluster on 127.0.0.1:5432, trust authentication). Every store or receiver a test opens gets
an empty schema of its own in the ``postroom_tests`` database (the URL sets its
``search_path``), dropped afterwards; postroom names its NOTIFY channel and migration lock
after the schema, so tests running in parallel never see each other's rows or wake-ups.
(A schema costs a millisecond; a database costs a checkpoint to drop. The catalog rows a
dropped schema leaves dead are vacuumed now and then: see ``CATALOGS``.) A test that opens
the ``store`` fixture gets a schema already migrated, emptied after an earlier test rather
than made again (``StoreSchemas``). A test that ends
server sessions gets a database of its own (``create_database``), and a test that must
restart PostgreSQL gets a ``Cluster`` of its own: a throwaway data directory on another port,
so nothing else running is disturbed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.errors

__all__ = ["ADMIN_URL", "Cluster", "StoreSchemas", "create_database", "create_schema",
           "drop_database", "drop_schema", "problem", "terminate_sessions", "vacuum_catalogs",
           "with_database"]

ADMIN_URL = os.environ.get("POSTROOM_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
#: The database that holds the tests' schemas (created on first use, never dropped).
TESTS_DATABASE = "postroom_tests"


@functools.cache
def problem() -> str | None:
    """Why PostgreSQL cannot be used for tests here, or ``None`` if it can."""
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL at {ADMIN_URL} is unreachable: {str(exc).strip()}"
    return None


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _name(label: str) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in label.lower())[:24]
    return f"postroom_t_{safe}_{uuid.uuid4().hex[:12]}"


def create_schema(label: str, admin_url: str = ADMIN_URL) -> str:
    """Create an empty schema in the tests' database; the URL of a store living in it."""
    tests_url = with_database(admin_url, TESTS_DATABASE)
    name = _name(label)
    try:
        conn = psycopg.connect(tests_url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        # Another test process may have created it first, or be creating it right now: then
        # CREATE DATABASE fails on the catalog's unique index rather than as a duplicate.
        with (psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin,
              contextlib.suppress(psycopg.errors.DuplicateDatabase,
                                  psycopg.errors.UniqueViolation)):
            admin.execute(f'CREATE DATABASE "{TESTS_DATABASE}"')
        conn = psycopg.connect(tests_url, autocommit=True, connect_timeout=10)
    with conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return f"{tests_url}?options=-csearch_path%3D{name}"


#: The catalogs every schema's tables, indexes and constraints add rows to. A dropped schema
#: leaves them dead; this server may run without autovacuum (this machine's does), and then
#: they pile up, run after run, until creating one store's tables takes 0.45 s instead of
#: 0.09 s (measured here at 2.3 million dead rows of pg_attribute).
CATALOGS = ("pg_attribute", "pg_class", "pg_depend", "pg_constraint", "pg_index", "pg_type",
            "pg_attrdef", "pg_trigger", "pg_proc", "pg_sequence", "pg_namespace",
            "pg_description", "pg_statistic")
#: Schemas one process drops between two vacuums of the catalogs.
VACUUM_EVERY = 100
_drops = itertools.count(1)


def drop_schema(url: str) -> None:
    """Drop the schema a ``create_schema`` URL points at, with everything in it (and now and
    then vacuum the catalogs it leaves dead rows in)."""
    with psycopg.connect(_base(url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{_schema(url)}" CASCADE')
        if next(_drops) % VACUUM_EVERY == 0:
            vacuum_catalogs(conn)


def vacuum_catalogs(conn: psycopg.Connection[Any] | None = None) -> None:
    """VACUUM the catalogs of the tests' database (``CATALOGS``), on ``conn`` if given (an
    autocommit connection to it). Does nothing if the database does not exist yet."""
    if conn is None:
        try:
            with psycopg.connect(with_database(ADMIN_URL, TESTS_DATABASE), autocommit=True,
                                 connect_timeout=10) as own:
                vacuum_catalogs(own)
        except psycopg.OperationalError:  # not created yet: nothing to vacuum
            pass
        return
    conn.execute("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in CATALOGS))


def create_database(label: str, admin_url: str = ADMIN_URL) -> str:
    """Create an empty database and return its URL."""
    name = _name(label)
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(admin_url, name)


def drop_database(url: str, admin_url: str = ADMIN_URL) -> None:
    """Drop the database of ``url``, ending any session still connected to it."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def terminate_sessions(url: str, admin_url: str = ADMIN_URL, *, wait: bool = True) -> int:
    """End every server session connected to the database of ``url``; how many were ended.

    With ``wait``, returns only once each session is really gone.
    """
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [10_000 if wait else 0, name]).fetchall()
    return sum(1 for (ended,) in rows if ended)


def settled_sessions(url: str, admin_url: str = ADMIN_URL, *, within: float = 5.0) -> int:
    """How many server sessions are connected to the database of ``url``, waiting up to
    ``within`` seconds for sessions whose client has closed them to end (a server process
    leaves ``pg_stat_activity`` shortly after its client hangs up)."""
    name = urlsplit(url).path.lstrip("/")
    deadline = time.monotonic() + within
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                               [name]).fetchone()
            count = int(row[0]) if row is not None else 0
            if count == 0 or time.monotonic() > deadline:
                return count
            time.sleep(0.05)


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not versions:
        raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
    return versions[-1].parent


class Cluster:
    """A private PostgreSQL server in a temporary directory, for tests that restart it.

    Keyword arguments are server settings (``wal_writer_delay="10s"``).
    """

    def __init__(self, **settings: str) -> None:
        self._bin = _bindir()
        self._settings = "".join(f" -c {name}={value}" for name, value in settings.items())
        self._root = Path(tempfile.mkdtemp(prefix="postroom-pg-"))
        self.data = self._root / "data"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # The server refuses to run as root: hand the directory to the postgres user.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self._root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as, str(self._bin / tool), *args], check=True,
                       capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self._root} -c max_connections=60 "
                   f"-c shared_buffers=32MB{self._settings}")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self._root / "log"),
                  "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: recovery runs at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again (same data, same port)."""
        self.stop(mode)
        self.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the server accepts connections."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        """Stop the server and delete its files."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self._root, ignore_errors=True)


# -- stores' schemas, emptied and used again ---------------------------------------------------

#: What a schema's catalog holds, to tell a store's schema as migrated from one a test changed:
#: its relations, live columns and their types, constraints, functions, triggers and
#: statistics (an ANALYZE would steer the next test's plans).
_CATALOG_PRINT = """
SELECT md5(coalesce((SELECT string_agg(c.relname || '.' || a.attname || ':' || a.atttypid::text
                                       || c.relkind::text, ',' ORDER BY c.relname, a.attnum)
                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                     WHERE c.relnamespace = n.oid AND a.attnum > 0 AND NOT a.attisdropped),
                    '')),
       (SELECT count(*) FROM pg_constraint WHERE connamespace = n.oid),
       (SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid),
       (SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = n.oid),
       (SELECT count(*) FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid
        WHERE c.relnamespace = n.oid)
FROM pg_namespace n WHERE n.nspname = %s
"""


class StoreSchemas:
    """Schemas holding an empty store, migrated to the latest version, for the tests that open
    one: a schema a test is done with is emptied and handed to the next, instead of being
    dropped and migrated again (the migrations' DDL costs ~0.12 s and a drop ~0.05 s; emptying
    ~0.01 s, over ~1,200 tests a run).

    The first one is kept as the template: what migrating leaves in its tables (the schema's
    version, the clock's rows, the fence floors) is copied back from it. A schema is taken back
    only if its catalog still matches the template's, it was used fewer than ``MAX_USES``
    times (emptied tables keep their dead rows, and autovacuum may be off), and it empties
    within the lock timeout; any other is dropped.
    """

    MAX_USES = 25

    def __init__(self, admin_url: str = ADMIN_URL) -> None:
        self._admin_url = admin_url
        self._free: list[str] = []
        self._uses: dict[str, int] = {}
        self._template: str | None = None
        self._print: tuple[Any, ...] = ()
        self._reset = ""

    def take(self, label: str) -> str:
        """The URL of a schema holding an empty, migrated store."""
        if self._template is None:
            self._template = self._migrated("template")
            self._learn(self._template)
        if self._free:
            return self._free.pop()
        url = self._migrated(label)
        self._uses[url] = 0
        return url

    def give_back(self, url: str) -> None:
        """Empty the schema for the next test, or drop it if it cannot be trusted to be as
        migrated."""
        self._uses[url] += 1
        if self._uses[url] < self.MAX_USES and self._emptied(url):
            self._free.append(url)
            return
        del self._uses[url]
        drop_schema(url)

    def close(self) -> None:
        """Drop every schema, the template's too."""
        for url in [*self._free, *([self._template] if self._template else [])]:
            drop_schema(url)
        self._free.clear()
        self._template = None

    def _migrated(self, label: str) -> str:
        from tests.support import migrate_store  # it imports postroom; this module does not

        url = create_schema(label, self._admin_url)
        migrate_store(url)
        return url

    def _learn(self, template: str) -> None:
        schema = _schema(template)
        with psycopg.connect(_base(template), autocommit=True) as conn:
            self._print = _catalog_print(conn, schema)
            tables = [name for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename",
                (schema,))]
            seeded = [name for name in tables if conn.execute(
                f'SELECT EXISTS (SELECT FROM "{schema}"."{name}")').fetchone() == (True,)]
            sequences = [name for (name,) in conn.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (schema,))]
        # {0} is the schema to empty; the template's rows are put back into the seeded tables.
        self._reset = "".join(
            [f'DELETE FROM "{{0}}"."{name}";' for name in tables]
            + [f'INSERT INTO "{{0}}"."{name}" SELECT * FROM "{schema}"."{name}";'
               for name in seeded]
            + [f"SELECT setval('\"{{0}}\".\"{name}\"', 1, false);" for name in sequences])

    def _emptied(self, url: str) -> bool:
        schema = _schema(url)
        try:
            with psycopg.connect(_base(url), connect_timeout=10) as conn:
                if _catalog_print(conn, schema) != self._print:
                    return False
                conn.execute("SET LOCAL lock_timeout = '2s'")
                conn.execute(self._reset.format(schema))
            return True
        except psycopg.Error:
            return False


def _base(url: str) -> str:
    return url.partition("?options=-csearch_path%3D")[0]


def _schema(url: str) -> str:
    return url.partition("?options=-csearch_path%3D")[2]


def _catalog_print(conn: psycopg.Connection[Any], schema: str) -> tuple[Any, ...]:
    row = conn.execute(_CATALOG_PRINT, (schema,)).fetchone()
    assert row is not None, schema
    return tuple(row)
