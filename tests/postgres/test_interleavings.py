"""Interleavings only PostgreSQL allows (SQLite runs one writer at a time), forced with a
pause inside one transaction while another store commits."""

from __future__ import annotations

import threading
from typing import Any

import postroom
from postroom.db.database import Tx
from tests.support import START, envelope

DAY = 86_400.0


def test_a_resume_that_lost_the_race_replays_though_the_parent_was_pruned_since(
        pg_url, pg_urls, clock, auth, monkeypatch):
    settings = postroom.Settings(retention=60.0)
    with postroom.open_store(pg_url, clock=clock, settings=settings) as store, \
            postroom.open_store(pg_url, clock=clock) as other, \
            postroom.Receiver.open(pg_urls("receiver")) as receiver:
        # The parent is not its chain's root (a root is pruned only after its chain).
        root = store.receive(auth, envelope("root", deadline=START + DAY)).task_id
        store.finish(store.claim("w"), None)
        parent = store.receive(auth, envelope("parent", deadline=START + DAY,
                                              parent_task_id=root)).task_id
        store.finish(store.claim("w"), None)
        while store.dispatch(postroom.InProcessTransport(receiver)).claimed:
            pass
        store.open_wait("flow", "answer", 0, START + DAY, task_id=parent)
        store.signal(auth, "e-1", "flow", "answer", 1, {"ok": True})
        clock.advance(61)

        # A reads the unconsumed continuation, then stops before its next statement.
        read, go_on = threading.Event(), threading.Event()
        catch_up = Tx.catch_up_time

        def paused(tx: Tx) -> None:
            catch_up(tx)
            if threading.current_thread().name == "A":
                read.set()
                go_on.wait(30)

        monkeypatch.setattr(Tx, "catch_up_time", paused)
        answer: dict[str, Any] = {}

        def resume_a() -> None:
            try:
                answer["A"] = store.resume("flow", "answer", 1,
                                           postroom.FollowUp(message_id="next", payload={}))
            except postroom.PostroomError as exc:
                answer["A"] = exc

        a = threading.Thread(target=resume_a, name="A")
        a.start()
        assert read.wait(30)
        won = other.resume("flow", "answer", 1, postroom.FollowUp(message_id="next", payload={}))
        assert won.result is postroom.ResumeResult.RESUMED
        assert other.prune() == 1  # the parent: its continuation is consumed now
        go_on.set()
        a.join(30)
        assert isinstance(answer["A"], postroom.Resumption), answer["A"]
        assert answer["A"].result is postroom.ResumeResult.REPLAY
        assert won.task_id is not None and answer["A"].task_id == won.task_id
