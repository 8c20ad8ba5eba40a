"""The status and the listings read live rows through their partial indexes, whatever the
history: no scan of a whole table, no sort of the backlog.

The plans are read from the database itself (``EXPLAIN``) on a store that has worked for a
while: most tasks done and their replies sent, some dead, a backlog, a few running, waits
open and ended.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg.sql import Literal

import postroom
from postroom import Outcome, waits
from postroom.db import Tx
from tests import pg
from tests.conformance.test_plans import PG_SORT, explain
from tests.conformance.test_wait_plans import WAITS, in_batches
from tests.conformance.test_wait_plans import plan_problems as wait_plan_problems
from tests.conftest import UrlFactory, backends, require_postgres
from tests.support import SETTINGS, START, analyze, database_of, envelope

#: Tasks, and how many of them are pending, per backend. PostgreSQL costs plans from
#: statistics: on tables of a few pages a sequential scan is honestly its cheapest plan, and
#: sorting a backlog of a few hundred rows is cheaper than walking an index for a page of
#: them. It is shown the shape where the choice matters: a history far larger than the
#: backlog, and a backlog far larger than a page (SQLite's planner prefers the index
#: whatever the size).
TASKS = {"sqlite": 3000, "postgres": 20_000}
PENDING = {"sqlite": 250, "postgres": 2000}
#: The rest of the live part (the other tasks are done, and their replies sent).
RUNNING = 40
PENDING_REPLIES, SENDING_REPLIES, DEAD_REPLIES = 50, 10, 40

#: The tables whose size follows the history; every read of them must go through an index.
HISTORY_TABLES = ("tasks", "replies", "waits", "wait_continuations")
LIVE_TASKS = {"tasks_claimable", "tasks_running_leases", "tasks_live_deadlines",
              "tasks_pending_by_created"}
LIVE_REPLIES = {"replies_live", "replies_parked", "replies_dead"}


@dataclass(frozen=True)
class Read:
    """A read, the index it must walk, the only indexes it may touch, and whether it may
    sort (what it reads: only ever live rows, which the allowed indexes prove)."""

    query: str
    params: dict[str, object] | Callable[[postroom.Store], dict[str, object]]
    walks: str | dict[str, str]  # the index, or the index per dialect
    allowed: frozenset[str] = field(default=frozenset())
    sorts: bool = False


#: What walks the tasks in the order of their creation: the table by id where ids follow
#: creation (one row by its key is read as the key's index), else its index.
CREATION = {"sqlite": "tasks_pkey", "postgres": "tasks_by_created"}


def page(**params: object) -> dict[str, object]:
    """Parameters of a task page: the first page, no filters, unless told."""
    return {"upper_created": math.inf, "upper_id": 0, "lower_created": -math.inf,
            "walk_below": (1 << 63) - 1, "walk_above": -(1 << 63),
            "queue": None, "principal": None, "limit": 101, **params}


# A later page's bound.
NEXT = {"upper_created": START + 3, "upper_id": 1500, "walk_below": 1500}


def recent(store: postroom.Store) -> dict[str, object]:
    """Parameters of the last second's tasks, as ``observe`` reads them."""
    since = store.clock.now() - 1
    with database_of(store).reading() as tx:
        return {"since": since, "limit": 10_001,
                **tx.tasks_walk(after=math.nextafter(since, -math.inf))}


def second_page(**filters: object) -> Callable[[postroom.Store], dict[str, object]]:
    """Parameters of the second page of the tasks ``filters`` select, as the store has them."""

    def params(store: postroom.Store) -> dict[str, object]:
        last = store.list_tasks(limit=100, **filters).items[-1]  # type: ignore[arg-type]
        dialect = database_of(store).dialect
        with dialect.connection() as conn:
            row = dialect.execute(conn, dialect.convert(
                "SELECT id FROM tasks WHERE task_id = :task_id"), {"task_id": last.task_id}
            ).fetchone()
            dialect.rollback(conn)
        return page(upper_created=last.created_at, upper_id=int(row["id"]),
                    walk_below=int(row["id"]), queue=filters.get("queue"))

    return params


READS = {
    # Grouping live rows by queue may sort them: they are the live rows only.
    "status_live_counts": Read("status_live_counts", {}, "tasks_running_leases",
                               frozenset(LIVE_TASKS | LIVE_REPLIES), sorts=True),
    "status_cumulative_counts": Read("status_cumulative_counts", {}, "postroom_counts"),
    "status_wait_counts": Read("status_wait_counts", {}, "wait_continuations_unconsumed",
                               frozenset({"waits_due", "waits_one_waiting",
                                          "waits_by_responder",
                                          "wait_continuations_unconsumed"})),
    "tasks_page": Read("tasks_page", page(state=None), CREATION),
    "tasks_page next": Read("tasks_page", page(state=None, **NEXT), CREATION),
    "tasks_page done": Read("tasks_page", page(state="done"), CREATION),
    "tasks_page queue": Read("tasks_page", page(state=None, queue="other", **NEXT), CREATION),
    "tasks_page_pending": Read("tasks_page_pending", page(), "tasks_pending_by_created"),
    "tasks_page_pending queue": Read("tasks_page_pending",
                                     second_page(state="pending", queue="other"),
                                     "tasks_pending_by_created"),
    # The running tasks are one per claim held: ordering them is not ordering the backlog.
    "tasks_page_running": Read("tasks_page_running", page(**NEXT), "tasks_running_leases",
                               sorts=True),
    "waits_page": Read("waits_page", {"due_before": math.inf, "after_deadline": -math.inf,
                                      "after_flow": "", "after_step": "",
                                      "after_generation": 0, "limit": 101}, "waits_due"),
    "waits_page due": Read("waits_page", {"due_before": START + 103,
                                          "after_deadline": START + 101, "after_flow": "f",
                                          "after_step": "s-7", "after_generation": 1,
                                          "limit": 101}, "waits_due"),
    # The last second's tasks (500 of them), newest first, each with its reply.
    "observe_recent_tasks": Read("observe_recent_tasks", recent, CREATION),
    "observe_pending_before": Read("observe_pending_before", {"since": START + 3},
                                   "tasks_pending_by_created"),
    # Grouping the undelivered replies by queue may sort them: they are live rows only.
    "observe_oldest_undelivered": Read("observe_oldest_undelivered", {}, "replies_live",
                                       frozenset(LIVE_REPLIES), sorts=True),
    "replies_dead_page": Read("replies_dead_page", {"after_updated": -math.inf,
                                                    "after_id": 0, "limit": 101},
                              "replies_dead"),
}

_SQLITE_READ = re.compile(r"^(?:SCAN|SEARCH) (\w+)(?: AS \w+)?"
                          r"(?: USING (?:(?:COVERING )?INDEX (\w+)|(INTEGER PRIMARY KEY)))?")
_PG_INDEX = re.compile(r"\b(?:Index Only Scan|Index Scan)(?: Backward)? using (\w+) on (\w+)"
                       r"|\bBitmap Index Scan on (\w+)")
_PG_TABLE_SCAN = re.compile(r"\bSeq Scan on (\w+)")


def indexes_walked(dialect: str, lines: list[str]) -> tuple[set[str], list[str]]:
    """The indexes (and the small tables) a plan reads, and its lines that read a whole
    history table."""
    walked: set[str] = set()
    whole: list[str] = []
    for line in lines:
        table = index = None
        if dialect == "sqlite":
            if (read := _SQLITE_READ.match(line.strip())) is not None:
                table, index, by_key = read.groups()
                if by_key is not None:  # one row by its key, named as PostgreSQL names it
                    index = f"{table}_pkey"
        elif (scan := _PG_TABLE_SCAN.search(line)) is not None:
            table = scan.group(1)
        elif (found := _PG_INDEX.search(line)) is not None:
            index, table = found.group(1) or found.group(3), found.group(2)
        if index is not None:
            walked.add(index)
        if table in HISTORY_TABLES and index is None:
            whole.append(line)
        elif table is not None and table not in HISTORY_TABLES:
            walked.add(table)  # a small table of its own (postroom_counts), or a CTE
    return walked, whole


def sorts(dialect: str, lines: list[str]) -> list[str]:
    """The lines of a plan that sort rows."""
    if dialect == "sqlite":
        return [line for line in lines if "TEMP B-TREE" in line]
    return [line for line in lines if PG_SORT.search(line)]


@pytest.fixture(scope="module", params=backends())
def populated(request, tmp_path_factory):
    """One worked store per backend, shared by the module's read-only plan tests."""
    if request.param == "postgres":
        require_postgres()
        # A database of its own: VACUUM marks a page all-visible only below the snapshots
        # open in the same database, and the transactions of tests running beside these in
        # the shared one would hold that back now and then, making index-only scans look
        # dear and a plan's choice a matter of timing.
        url = pg.create_database("read-plans")
        cleanup: Callable[[], None] = functools.partial(pg.drop_database, url)
    else:
        urls = UrlFactory(request.param, tmp_path_factory.mktemp("read-plans"))
        url, cleanup = urls("store"), urls.cleanup
    try:
        with postroom.open_store(url, clock=postroom.ManualClock(START), settings=SETTINGS,
                                 seed=0) as store:
            _populate(store, (lambda: vacuum(url)) if request.param == "postgres" else
                      lambda: None)
            analyze(store)  # plan with real statistics, as production would
            yield store
    finally:
        cleanup()


def vacuum(url: str) -> None:
    """What autovacuum does on a server at work: index entries of rows that moved on are
    reclaimed (their pages reused), pages whose rows are all visible are marked so."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        conn.execute("VACUUM " + ", ".join(f'"{name}"' for name in tables))


def _populate(store: postroom.Store, settle: Callable[[], None]) -> None:
    """A second at a time, as a store at work: 500 tasks arrive (each with an hour to run),
    the oldest are done and their replies delivered (the very first refused for good), and
    ``settle`` runs; at the end a backlog is pending, a few tasks running, a few replies
    waiting or sending."""
    auth = postroom.AuthContext(principal="planner")
    dialect = database_of(store).dialect.name
    count, pending = TASKS[dialect], PENDING[dialect]
    queues = ("default", "other")
    done = count - pending - RUNNING
    rounds = count // 500
    finished = 0
    for second in range(rounds):
        now = store.clock.now()
        store.receive_atomic(auth, [envelope(f"m-{i}", queue=queues[i % 2], deadline=now + 3600)
                                    for i in range(second * 500, second * 500 + 500)])
        target = done * (second + 1) // rounds
        store.finish_batch([(claim, None) for claim in store.claim_batch(
            "w", target - finished, queues=queues)])
        held = PENDING_REPLIES + SENDING_REPLIES if second == rounds - 1 else 0
        claims = store.claim_replies("d", limit=target - finished - held)
        store.record_deliveries(
            (claim, Outcome.permanent("HTTP 400") if second == 0 and index < DEAD_REPLIES
             else Outcome.delivered()) for index, claim in enumerate(claims))
        finished = target
        store.clock.advance(1)
        settle()
    store.claim_batch("w", RUNNING, queues=queues)
    store.claim_replies("d", limit=SENDING_REPLIES)
    _populate_waits(store, settle)


def _populate_waits(store: postroom.Store, settle: Callable[[], None]) -> None:
    """Waits that mostly ended and were resumed soon after, as a flow does: one in six still
    waiting, one in thirty continuations left to resume."""
    settings = store.settings
    alice = postroom.AuthContext(principal="alice")

    def life(tx: Tx, index: int) -> None:
        address = waits.check_address(settings, "f", f"s-{index}", 1)
        waits.open_wait(tx, waits.check_open(
            settings, flow="f", step=address.step, expected_generation=0,
            deadline=START + 100 + index % 7, request_id=None, task_id=None))
        if index % 6:
            waits.signal(tx, waits.check_signal(settings, alice, event_id=f"e-{index}",
                                                flow="f", step=address.step, generation=1,
                                                value=index))
            if index % 30 != 1:
                waits.resume(tx, settings, address, None)

    count = WAITS[database_of(store).dialect.name]
    for start in range(0, count, 500):
        in_batches(store, waits.SIGNAL, [lambda tx, index=index: life(tx, index)
                                         for index in range(start, min(start + 500, count))])
        store.clock.advance(1)
        settle()


def test_the_populated_store_has_history_and_live_work(populated):
    status = populated.status()
    dialect = database_of(populated).dialect.name
    total, pending = TASKS[dialect], PENDING[dialect]
    assert sum(q.received for q in status.queues.values()) == pending
    assert sum(q.processing for q in status.queues.values()) == RUNNING
    assert sum(sum(q.outcomes.values()) for q in status.queues.values()) == (
        total - pending - RUNNING)
    assert status.dead_replies == DEAD_REPLIES
    assert (status.open_waits, status.continuations_unconsumed) == (
        WAITS[dialect] // 6, WAITS[dialect] // 30)


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_walks_the_index_of_its_rows_and_no_whole_table(populated, name):
    read = READS[name]
    dialect = database_of(populated).dialect.name
    params = read.params(populated) if callable(read.params) else read.params
    lines = explain(populated, read.query, params)
    walked, whole = indexes_walked(dialect, lines)
    shown = "\n".join(lines)
    assert whole == [], shown
    assert walks(read, dialect) in walked, shown
    if read.allowed:
        assert walked <= read.allowed, shown
    if not read.sorts:
        assert sorts(dialect, lines) == [], shown


def walks(read: Read, dialect: str) -> str:
    return read.walks if isinstance(read.walks, str) else read.walks[dialect]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: The types psycopg gives these Python values when it binds them (``None``: unknown, text).
_TYPES = {float: "double precision", int: "bigint", str: "text", type(None): "text"}


def prepared_plan(store: postroom.Store, query: str, params: dict[str, object]) -> list[str]:
    """The plan PostgreSQL gives ``query`` prepared with ``$n`` parameters, after it ran ten
    times (past the five custom plans it makes before it may switch to a generic one)."""
    dialect = database_of(store).dialect
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    sql = _PLACEHOLDER.sub(number, dialect.queries[query].sql).replace("%%", "%")
    types = ", ".join(_TYPES[type(params[key])] for key in order)
    values = ", ".join("NULL" if params[key] is None else
                       f"'{params[key]}'::float8" if params[key] in (math.inf, -math.inf)
                       else Literal(params[key]).as_string() for key in order)
    with dialect.connection() as conn:
        dialect.begin(conn, write=False)
        dialect.execute(conn, f"PREPARE read_plan ({types}) AS {sql}", None)
        for _ in range(10):
            dialect.execute(conn, f"EXECUTE read_plan({values})", None).fetchall()
        rows = dialect.execute(conn, f"EXPLAIN EXECUTE read_plan({values})", None).fetchall()
        dialect.rollback(conn)  # a PREPARE inside a rolled-back transaction goes with it
    return [str(row["QUERY PLAN"]) for row in rows]


# Only PostgreSQL switches a prepared statement to a plan made for any parameter values.
@pytest.mark.parametrize("populated", [name for name in backends() if name == "postgres"],
                         indirect=True)
@pytest.mark.parametrize("name", sorted(name for name, read in READS.items() if read.params))
def test_a_prepared_read_keeps_walking_its_index(populated, name):
    read = READS[name]
    lines = prepared_plan(populated, read.query,
                          read.params(populated) if callable(read.params) else read.params)
    walked, whole = indexes_walked("postgres", lines)
    assert whole == [] and walks(read, "postgres") in walked, "\n".join(lines)
    if not read.sorts:
        assert sorts("postgres", lines) == [], "\n".join(lines)


def test_status_reads_only_live_rows_of_tasks_and_replies(populated):
    lines = explain(populated, "status_live_counts", {})
    walked, _ = indexes_walked(database_of(populated).dialect.name, lines)
    assert {"replies_live", "replies_dead"} <= walked, "\n".join(lines)
    assert walked & {"tasks_claimable", "tasks_live_deadlines", "tasks_pending_by_created"}, (
        "\n".join(lines))


def test_the_wait_counts_pass_the_wait_plan_rules(populated):
    lines = explain(populated, "status_wait_counts", {})
    dialect = database_of(populated).dialect.name
    assert wait_plan_problems(dialect, lines) == [], "\n".join(lines)


def test_the_plan_reader_sees_a_whole_table_and_the_indexes_walked():
    sqlite = ["SCAN tasks", "SEARCH tasks USING INDEX tasks_by_created (created_at<?)",
              "SCAN replies USING COVERING INDEX replies_dead", "SCAN postroom_counts",
              "SEARCH replies USING INTEGER PRIMARY KEY (rowid=?) LEFT-JOIN"]
    assert indexes_walked("sqlite", sqlite) == (
        {"tasks_by_created", "replies_dead", "postroom_counts", "replies_pkey"},
        ["SCAN tasks"])
    postgres = ["Append", "  ->  Seq Scan on replies  (cost=0..9)",
                "  ->  Index Scan Backward using tasks_by_created on tasks  (cost=1..2)",
                "        ->  Bitmap Index Scan on replies_dead  (cost=1..2)",
                "  ->  Seq Scan on postroom_counts  (cost=0..1)"]
    assert indexes_walked("postgres", postgres) == (
        {"tasks_by_created", "replies_dead", "postroom_counts"}, [postgres[1]])
