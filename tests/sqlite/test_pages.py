"""Each commit of a one-at-a-time task writes pages of the b-trees its rules need, no others.

A commit appends one WAL frame per page it changed, and every b-tree it touches costs it at
least one, so the layout keeps one b-tree per question a rule asks (schema 12: a task is one
row with one unique index for its identity, a reply is keyed by its task's integer, a root
alone has no chain row, a claim leaves the index of live deadlines alone, a receive keeps its
time in its task's created_at rather than a clock row; schema 14: the clock rows sit beside
the counts, so a commit that counts an outcome records its time in the same page; schema 15:
one index of the ready and the sending replies, so a dispatch claim moves an entry within it;
schema 16: the table walked by id is the order of creation, with no index of it; receiver
schema 3: a receipt and its effect are one row).
These tests read the frames each step appends and name the b-tree each page belongs to
(SQLite's ``dbstat``): an index added to the hot path, or a rule that starts writing another
table, shows up here as a change of the layout, not later as a slower benchmark.
"""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

import postroom
from postroom import Outcome
from tests.support import database_of, envelope

_WAL_HEADER, _FRAME_HEADER = 32, 24

#: The b-trees each step writes. (Page 1, the file's header, is written too whenever the file
#: grows; it is left out.)
LAYOUT = {
    "receive": {"tasks", "tasks_task_id", "tasks_claimable", "tasks_live_deadlines",
                "tasks_pending_by_created"},
    "claim": {"tasks", "tasks_claimable", "tasks_running_leases", "tasks_pending_by_created",
              "postroom_counts"},
    "finish": {"tasks", "tasks_running_leases", "tasks_live_deadlines", "replies",
               "replies_live", "postroom_counts"},
    "dispatch claim": {"replies", "replies_live", "postroom_counts"},
    "receiver": {"receiver_receipts", "receiver_receipts_reply_id"},
    "dispatch record": {"replies", "replies_live", "postroom_counts"},
}

#: SQLite names a UNIQUE column's index after its table; these name it after its column.
_AUTOINDEX = {"sqlite_autoindex_tasks_1": "tasks_task_id",
              "sqlite_autoindex_receiver_receipts_1": "receiver_receipts_reply_id"}


def written_by(path: Path, step: Callable[[], object]) -> set[str]:
    """The b-trees whose pages ``step``'s commits append to the WAL of ``path``."""
    return set(pages_written_by(path, step))


def pages_written_by(path: Path, step: Callable[[], object]) -> Counter[str]:
    """How many distinct pages of each b-tree ``step``'s commits append to the WAL of
    ``path``."""
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    step()
    wal = Path(f"{path}-wal").read_bytes()
    page_size = struct.unpack(">I", wal[8:12])[0]
    pages = {struct.unpack(">I", wal[offset:offset + 4])[0]
             for offset in range(_WAL_HEADER, len(wal), _FRAME_HEADER + page_size)}
    with closing(sqlite3.connect(path)) as conn:
        owners = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    return Counter(_AUTOINDEX.get(owners[page], owners[page]) for page in pages if page != 1)


@pytest.fixture
def worked(store, receiver, transport, auth):
    """A store that has worked a while (so its b-trees have many leaves), and its receiver."""
    for start in range(0, 600, 200):
        store.receive_atomic(auth, [envelope(f"old-{i}") for i in range(start, start + 200)])
        store.finish_batch([(claim, None) for claim in store.claim_batch("w", 200)])
        store.dispatch(transport, limit=200)
    return store


def test_each_step_of_a_task_writes_the_b_trees_of_its_rules_and_no_others(
        worked, receiver, auth, clock):
    store_path = Path(database_of(worked).dialect.path)
    receiver_path = Path(database_of(receiver).dialect.path)

    def written(path: Path, step: Callable[[], object]) -> set[str]:
        clock.advance(0.001)  # as time goes by between steps: each moves the high-water
        return written_by(path, step)

    found = {"receive": written(store_path, lambda: worked.receive(auth, envelope("new")))}
    held: list[postroom.Claim] = []
    found["claim"] = written(store_path, lambda: held.append(worked.claim("w")))
    found["finish"] = written(store_path, lambda: worked.finish(held[0], {"ok": 1}))
    replies: list[postroom.ReplyClaim] = []
    found["dispatch claim"] = written(
        store_path, lambda: replies.extend(worked.claim_replies("d")))
    (reply,) = replies
    found["receiver"] = written(receiver_path, lambda: receiver.accept(reply.reply_id,
                                                                       reply.body))
    found["dispatch record"] = written(
        store_path, lambda: worked.record_deliveries([(reply, Outcome.delivered())]))
    assert found == LAYOUT


def test_a_finish_counts_its_outcome_and_records_its_time_in_one_page(worked, auth, clock):
    path = Path(database_of(worked).dialect.path)
    worked.receive(auth, envelope("new"))
    claim = worked.claim("w")
    assert claim is not None
    clock.advance(0.001)  # the finish moves the high-water

    def high_water() -> float:
        with closing(sqlite3.connect(path)) as conn:
            return float(conn.execute("SELECT high_water FROM postroom_counts "
                                      "WHERE kind = 'clock'").fetchone()[0])

    before = high_water()
    pages = pages_written_by(path, lambda: worked.finish(claim, {"ok": 1}))
    assert high_water() > before
    assert pages["postroom_counts"] == 1


def test_a_dispatch_claim_moves_its_reply_within_one_page_of_the_live_replies(worked, auth):
    path = Path(database_of(worked).dialect.path)
    worked.receive(auth, envelope("new"))
    claim = worked.claim("w")
    assert claim is not None
    worked.finish(claim, {"ok": 1})
    pages = pages_written_by(path, lambda: worked.claim_replies("d"))
    assert pages["replies_live"] == 1
