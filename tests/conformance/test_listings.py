"""Reading a store page by page: tasks, open waits, dead replies, and a signal's receipt.

Pages follow a key, not an offset: what is written between two pages never makes the next
page repeat or skip what was there. A cursor continues only the listing and filters that made
it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import postroom
from postroom import Outcome, Page, TaskState
from tests.support import START, envelope

REFUSED = Outcome.permanent("HTTP 400")


class Refusing:
    """A transport whose receiver refuses every reply for good."""

    def deliver(self, batch: Sequence[postroom.Outgoing]) -> Sequence[Outcome]:
        return [REFUSED] * len(batch)


def every_page(listing: Callable[..., Page[Any]], *, between: Callable[[], None] = lambda: None,
               **filters: Any) -> list[list[Any]]:
    """Every page of ``listing`` with ``filters``, calling ``between`` after each page."""
    pages = []
    cursor = None
    while True:
        page = listing(cursor=cursor, **filters)
        pages.append(page.items)
        between()
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def ids(tasks: Sequence[postroom.Task]) -> list[str]:
    return [task.message_id for task in tasks]


def flat(pages: list[list[Any]]) -> list[Any]:
    return [item for page in pages for item in page]


@pytest.fixture
def spread(store, auth, clock):
    """Seven tasks received a second apart (t-0 oldest): t-0..t-2 done, t-3 running, the rest
    pending."""
    for i in range(7):
        store.receive(auth, envelope(f"t-{i}"))
        clock.advance(1)
    store.finish_batch([(claim, "ok") for claim in store.claim_batch("w", 3)])
    store.claim("w")
    return store


# -- tasks --------------------------------------------------------------------------------------


def test_pages_of_tasks_hold_every_task_once_newest_first(spread):
    pages = every_page(spread.list_tasks, limit=3)
    assert [ids(page) for page in pages] == [["t-6", "t-5", "t-4"], ["t-3", "t-2", "t-1"],
                                             ["t-0"]]


def test_a_last_page_that_is_full_has_no_cursor_and_no_empty_page_follows(spread):
    pages = every_page(spread.list_tasks, limit=7)
    assert [len(page) for page in pages] == [7]


def test_tasks_created_in_one_instant_page_by_arrival_newest_first(store, auth):
    store.receive_atomic(auth, [envelope(f"m-{i}") for i in range(25)])
    tasks = flat(every_page(store.list_tasks, limit=10))
    assert [task.message_id for task in tasks] == [f"m-{i}" for i in reversed(range(25))]


def test_tasks_received_between_pages_never_make_a_page_repeat_or_skip_one(store, auth, clock):
    store.receive_atomic(auth, [envelope(f"old-{i}") for i in range(25)])
    arrivals = iter(range(100))

    def arrive() -> None:  # newer tasks, and more of the same instant as the old ones
        clock.advance(1)
        store.receive(auth, envelope(f"new-{next(arrivals)}"))
        store.receive_atomic(auth, [envelope(f"new-{next(arrivals)}", queue="other")])

    seen = ids(flat(every_page(store.list_tasks, limit=4, between=arrive)))
    assert len(seen) == len(set(seen))
    assert sorted(name for name in seen if name.startswith("old-")) == sorted(
        f"old-{i}" for i in range(25))


def test_pending_tasks_received_between_pages_never_make_a_page_repeat_or_skip_one(
        store, auth, clock):
    store.receive_atomic(auth, [envelope(f"old-{i}") for i in range(12)])
    arrivals = iter(range(100))

    def arrive() -> None:
        store.receive(auth, envelope(f"new-{next(arrivals)}"))

    seen = ids(flat(every_page(store.list_tasks, state="pending", limit=5, between=arrive)))
    assert len(seen) == len(set(seen))
    assert {f"old-{i}" for i in range(12)} <= set(seen)


def test_a_state_lists_only_the_tasks_in_that_state(spread):
    assert [ids(spread.list_tasks(state=state).items)
            for state in ("pending", "running", "done", "failed")] == [
        ["t-6", "t-5", "t-4"], ["t-3"], ["t-2", "t-1", "t-0"], []]


def test_running_tasks_page_newest_first(store, auth, clock):
    for i in range(5):
        store.receive(auth, envelope(f"r-{i}"))
        clock.advance(1)
    store.claim_batch("w", 5)
    pages = every_page(store.list_tasks, state="running", limit=2)
    assert [ids(page) for page in pages] == [["r-4", "r-3"], ["r-2", "r-1"], ["r-0"]]


def test_a_state_is_named_by_its_enum_its_value_or_its_name(spread):
    named = [ids(spread.list_tasks(state=state).items)
             for state in (TaskState.DONE, "done", "DONE")]
    assert named == [["t-2", "t-1", "t-0"]] * 3


def test_filters_combine(store, auth, clock):
    other = postroom.AuthContext(principal="other")
    for i in range(4):
        store.receive(auth, envelope(f"p-{i}", queue="q" if i % 2 else "default"))
        store.receive(other, envelope(f"o-{i}", sender="other", queue="q"))
        clock.advance(1)
    store.cancel(store.receive(auth, envelope("p-1", queue="q")).task_id)
    assert ids(store.list_tasks(state="pending", queue="q", principal="planner").items) == [
        "p-3"]
    assert ids(store.list_tasks(state="cancelled", queue="q").items) == ["p-1"]
    window = store.list_tasks(queue="q", created_after=START, created_before=START + 3)
    assert sorted(ids(window.items)) == ["o-1", "o-2", "p-1"]
    assert ids(store.list_tasks(principal="other", created_before=START + 1).items) == ["o-0"]


def test_created_bounds_are_exclusive(spread):
    listed = spread.list_tasks(created_after=START + 1, created_before=START + 4)
    assert ids(listed.items) == ["t-3", "t-2"]


def test_a_created_bound_between_equal_times_and_past_either_end_holds(store, auth, clock):
    # Tasks received together share their created_at: the bound falls between whole groups.
    created: dict[str, float] = {}
    for group, size in enumerate([2, 3, 1, 2]):
        names = [f"g{group}-{i}" for i in range(size)]
        store.receive_atomic(auth, [envelope(name) for name in names])
        created.update(dict.fromkeys(names, clock.now()))
        clock.advance(1 + group)
    newest_first = list(reversed(created))
    for bound in sorted({START - 1, *created.values(), *(t + 0.5 for t in created.values())}):
        after = flat(every_page(store.list_tasks, created_after=bound, limit=3))
        before = flat(every_page(store.list_tasks, created_before=bound, limit=3))
        assert ids(after) == [n for n in newest_first if created[n] > bound], bound
        assert ids(before) == [n for n in newest_first if created[n] < bound], bound


def test_a_created_window_pages_within_itself(spread):
    pages = every_page(spread.list_tasks, created_after=START, created_before=START + 5,
                       limit=2)
    assert [ids(page) for page in pages] == [["t-4", "t-3"], ["t-2", "t-1"]]


def test_a_cursor_with_other_filters_is_refused(spread):
    cursor = spread.list_tasks(state="done", limit=1).next_cursor
    with pytest.raises(postroom.InvalidInput, match=r"^cursor: was made with other filters "
                                                    r"\(state='done'\) than this call's "
                                                    r"\(state='pending'\)"):
        spread.list_tasks(state="pending", cursor=cursor)
    with pytest.raises(postroom.InvalidInput, match=r"^cursor: .*other filters"):
        spread.list_tasks(cursor=cursor)


def test_a_cursor_may_ask_for_another_page_size(spread):
    first = spread.list_tasks(limit=2)
    assert ids(spread.list_tasks(limit=4, cursor=first.next_cursor).items) == [
        "t-4", "t-3", "t-2", "t-1"]


def test_a_cursor_from_another_listing_is_refused(store, auth):
    for step in ("a", "b"):
        store.open_wait("flow", step, 0, START + 60)
    cursor = store.list_waits(limit=1).next_cursor
    with pytest.raises(postroom.InvalidInput,
                       match=r"^cursor: continues list_waits, not list_tasks"):
        store.list_tasks(cursor=cursor)


def tampered(cursor: str) -> list[object]:
    body = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    edited = body.replace(b'"list_tasks"', b'"list_taskz"')
    return [
        cursor[:-4],  # truncated
        cursor[:20] + ("A" if cursor[20] != "A" else "B") + cursor[21:],  # one character
        base64.urlsafe_b64encode(edited).decode().rstrip("="),  # content, checksum kept
        cursor + "!",  # not base64
        "",
        "x" * 5000,
        "ünïcode",
    ]


def test_a_damaged_or_edited_cursor_is_refused(spread):
    cursor = spread.list_tasks(limit=1).next_cursor
    for bad in tampered(cursor):
        with pytest.raises(postroom.InvalidInput, match=r"^cursor: is not a cursor postroom made"):
            spread.list_tasks(cursor=bad)


def test_a_cursor_must_be_a_string(spread):
    with pytest.raises(postroom.InvalidInput, match=r"^cursor: must be a page's next_cursor"):
        spread.list_tasks(cursor=b"abc")


@pytest.mark.parametrize("limit", [0, 1001, True, 2.0, "10"])
def test_a_page_holds_1_to_1000_items(store, limit):
    with pytest.raises(postroom.InvalidInput, match=r"^limit: "):
        store.list_tasks(limit=limit)


@pytest.mark.parametrize(("arguments", "field"), [
    ({"state": "finished"}, "state"),
    ({"state": 3}, "state"),
    ({"queue": ""}, "queue"),
    ({"queue": "q" * 129}, "queue"),
    ({"principal": 7}, "principal"),
    ({"created_after": "yesterday"}, "created_after"),
    ({"created_before": float("nan")}, "created_before"),
])
def test_each_task_filter_is_checked_and_named(store, arguments, field):
    with pytest.raises(postroom.InvalidInput, match=f"^{field}: "):
        store.list_tasks(**arguments)


def test_an_unknown_state_is_refused_with_the_states_there_are(store):
    with pytest.raises(postroom.InvalidInput, match=r"^state: must be one of pending, running, "
                                                    r"done, .*got 'finished'"):
        store.list_tasks(state="finished")


# -- waits ----------------------------------------------------------------------------------------


@pytest.fixture
def waiting(store, auth):
    """Five waits, due in the order e, d, c, b, a; c is signaled (so no longer waiting)."""
    for offset, step in enumerate("edcba"):
        store.open_wait("flow", step, 0, START + 10 + offset)
    store.signal(auth, "e-1", "flow", "c", 1, "yes")
    return store


def steps(waits: Sequence[postroom.Wait]) -> list[str]:
    return [wait.step for wait in waits]


def test_open_waits_are_listed_earliest_deadline_first_across_pages(waiting):
    pages = every_page(waiting.list_waits, limit=2)
    assert [steps(page) for page in pages] == [["e", "d"], ["b", "a"]]


def test_waits_sharing_a_deadline_page_by_their_address(store):
    for step in ("s-3", "s-1", "s-2"):
        store.open_wait("flow", step, 0, START + 10)
    store.open_wait("early", "s-9", 0, START + 10)
    assert steps(flat(every_page(store.list_waits, limit=1))) == ["s-9", "s-1", "s-2", "s-3"]


def test_due_before_lists_the_waits_due_earlier_only(waiting):
    assert steps(waiting.list_waits(due_before=START + 13).items) == ["e", "d"]


def test_waits_opened_between_pages_never_make_a_page_repeat_or_skip_one(waiting):
    opened = iter(range(100))

    def open_more() -> None:
        waiting.open_wait("later", f"w-{next(opened)}", 0, START + 12)

    seen = [(w.flow, w.step) for w in flat(every_page(waiting.list_waits, limit=2,
                                                      between=open_more))]
    assert len(seen) == len(set(seen))
    assert {("flow", step) for step in "edba"} <= set(seen)


def test_only_waiting_generations_are_listed(store):
    with pytest.raises(postroom.InvalidInput, match=r"^state: only waiting generations are "
                                                    r"listed, got 'signaled'"):
        store.list_waits(state="signaled")


def test_the_waiting_state_is_named_by_its_enum_its_value_or_its_name(waiting):
    assert [len(waiting.list_waits(state=state).items)
            for state in (postroom.WaitState.WAITING, "waiting", "WAITING")] == [4, 4, 4]


@pytest.mark.parametrize(("arguments", "field"), [
    ({"state": "open"}, "state"), ({"due_before": "soon"}, "due_before"),
    ({"limit": 0}, "limit"), ({"cursor": 5}, "cursor")])
def test_each_wait_listing_argument_is_checked_and_named(store, arguments, field):
    with pytest.raises(postroom.InvalidInput, match=f"^{field}: "):
        store.list_waits(**arguments)


def test_a_wait_cursor_with_another_due_before_is_refused(waiting):
    cursor = waiting.list_waits(limit=1).next_cursor
    with pytest.raises(postroom.InvalidInput, match=r"^cursor: was made with other filters"):
        waiting.list_waits(due_before=START + 100, cursor=cursor)


# -- dead replies ---------------------------------------------------------------------------------


@pytest.fixture
def dead(store, auth, clock):
    """Three replies that died a second apart: d-0's first, then d-1's, then d-2's."""
    for i in range(3):
        store.receive(auth, envelope(f"d-{i}"))
        clock.advance(1)
    for _ in range(3):
        store.finish(store.claim("w"), "ok")  # the task that has waited longest
        clock.advance(1)
    for _ in range(3):
        store.dispatch(Refusing())  # the reply that has waited longest
        clock.advance(1)
    return store


def reply_messages(store: postroom.Store, replies: Sequence[postroom.Reply]) -> list[str]:
    return [store.task(reply.task_id).message_id for reply in replies]


def test_dead_replies_are_listed_the_longest_dead_first_across_pages(dead):
    pages = every_page(dead.list_dead_replies, limit=2)
    assert [reply_messages(dead, page) for page in pages] == [["d-0", "d-1"], ["d-2"]]


def test_a_requeued_reply_leaves_the_dead_listing(dead):
    first, *rest = dead.list_dead_replies().items
    dead.requeue_reply(first.reply_id, operator="ops", reason="receiver fixed")
    assert dead.list_dead_replies().items == rest


def test_a_reply_that_dies_between_pages_is_listed_once_after_the_others(dead, auth, clock):
    dead.receive(auth, envelope("late"))
    dead.finish(dead.claim("w"), "ok")

    def die_once() -> None:
        dead.dispatch(Refusing())

    seen = reply_messages(dead, flat(every_page(dead.list_dead_replies, limit=1,
                                                between=die_once)))
    assert sorted(seen) == ["d-0", "d-1", "d-2", "late"] and seen[-1] == "late"


@pytest.mark.parametrize(("arguments", "field"), [({"limit": 1001}, "limit"),
                                                  ({"cursor": "nope"}, "cursor")])
def test_each_dead_reply_listing_argument_is_checked_and_named(store, arguments, field):
    with pytest.raises(postroom.InvalidInput, match=f"^{field}: "):
        store.list_dead_replies(**arguments)


# -- receipts -------------------------------------------------------------------------------------


def test_a_signals_receipt_is_read_back_as_the_signal_returned_it(store, auth):
    store.open_wait("flow", "step", 0, START + 60)
    given = store.signal(auth, "e-1", "flow", "step", 1, {"approve": True})
    assert store.receipt(auth, "e-1") == given


def test_a_receipt_is_read_with_the_outcome_it_stores(store, auth):
    store.signal(auth, "early", "flow", "step", 1, "too soon")
    store.open_wait("flow", "step", 0, START + 60)
    read = store.receipt(auth, "early")
    assert (read.result, read.recorded) == (postroom.SignalResult.UNKNOWN_WAIT,) * 2


def test_an_operator_reads_a_receipt_by_the_principals_name(store, auth):
    store.signal(auth, "e-1", "flow", "step", 1, None)
    assert store.receipt("planner", "e-1") == store.receipt(auth, "e-1")


def test_an_event_id_is_a_receipt_of_its_own_principal_only(store, auth):
    store.signal(auth, "e-1", "flow", "step", 1, None)
    assert store.receipt(postroom.AuthContext(principal="other"), "e-1") is None
    assert store.receipt(auth, "e-2") is None


@pytest.mark.parametrize(("principal", "event_id", "error", "match"), [
    ("planner", "", postroom.InvalidInput, "^event_id: "),
    ("planner", "e" * 129, postroom.InvalidInput, "^event_id: "),
    ("", "e-1", postroom.InvalidInput, "^principal: "),
    (42, "e-1", postroom.InvalidInput, "^principal: "),
    (postroom.AuthContext(principal=""), "e-1", postroom.Unauthorized, "not a usable"),
])
def test_each_receipt_argument_is_checked(store, principal, event_id, error, match):
    with pytest.raises(error, match=match):
        store.receipt(principal, event_id)
