"""The dashboard, through a real server on 127.0.0.1: login by token, the four stages side
by side, the task story, answering a wait as a human, an operator's decisions, and who may
see and do what (the API's rules)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

import postroom
from postroom.http.dashboard import COOKIE, Chart, chart
from tests.http.site import Site, ask_alice, site
from tests.support import START, approved_child, envelope, orphan_from_its_chain


@pytest.fixture
def served(store, transport) -> Iterator[Site]:
    with site(store, transport) as running:
        yield running


@pytest.fixture(autouse=True)
def _clients() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


_open: list[httpx.Client] = []


def logged_in(served: Site, name: str) -> httpx.Client:
    """A client holding ``name``'s session (closed after the test)."""
    client = httpx.Client(follow_redirects=True)
    _open.append(client)
    answer = client.post(served.page("/login"), data={"token": served.tokens[name]})
    assert answer.status_code == 200, answer.text
    return client


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "the page has no form"
    return found.group(1)


def when(seconds: float) -> str:
    """A time as the pages show it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def cell(html: str, queue: str, stage: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row is not None, f"no row for {queue}"
    found = re.search(rf'data-stage="{stage}">([^<]*)<', row.group(1))
    assert found is not None, f"no {stage} cell for {queue}"
    return found.group(1).strip()


def test_the_login_page_is_a_plain_form(served):
    answer = httpx.get(served.page("/login"))
    assert answer.status_code == 200
    assert '<form method="post" action="/dashboard/login">' in answer.text
    assert "<script" not in answer.text


def test_a_page_without_a_session_sends_to_the_login(served):
    answer = httpx.get(served.page("/tasks"))
    assert answer.status_code == 303
    assert answer.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Ftasks"


def test_a_wrong_token_is_refused_and_sets_no_cookie(served):
    answer = httpx.post(served.page("/login"), data={"token": served.tokens["ops"] + "x"})
    assert answer.status_code == 401
    assert COOKIE not in answer.cookies


def test_logging_in_sets_an_httponly_strict_cookie_for_the_dashboard_only(served):
    answer = httpx.post(served.page("/login"), data={"token": served.tokens["ops"]})
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"].lower()
    assert all(part in cookie for part in ("httponly", "samesite=strict", "path=/dashboard",
                                           "max-age="))


def test_login_never_sends_to_another_site(served):
    answer = httpx.post(served.page("/login"), data={"token": served.tokens["ops"],
                                                    "next": "https://elsewhere.example/"})
    assert answer.headers["location"] == "/dashboard/"


def test_the_overview_shows_the_four_stages_side_by_side_per_queue(served):
    html = logged_in(served, "ops").get(served.page("/")).text
    assert [cell(html, "mail", stage) for stage in (
        "received", "processing", "outcome-done", "outcome-failed", "delivery-sent")] == [
        "1 (0 s)", "0", "1", "1", "2"]
    assert [cell(html, "billing", stage) for stage in (
        "outcome-done", "delivery-pending", "delivery-dead")] == ["2", "1 (0)", "1"]
    assert all(f"{n}. " in html for n in (1, 2, 3, 4))


def test_the_overview_draws_a_chart_without_javascript(served):
    html = logged_in(served, "ops").get(served.page("/")).text
    assert "<svg" in html and "<polyline" in html and "<script" not in html


def test_the_overview_keeps_store_wide_counts_for_operators(served):
    html = logged_in(served, "planner").get(served.page("/")).text
    assert 'id="stages"' not in html and "read-only" in html


def test_a_task_page_tells_the_whole_durable_story(served):
    html = logged_in(served, "ops").get(served.page(f"/tasks/{served.dead}")).text
    assert "worker-2" in html  # the owner of its attempt
    assert re.search(r'<table id="attempts">.*?<td>done</td>', html, re.S)
    assert re.search(r'<table id="deliveries">.*?<td>permanent</td><td>permanent: HTTP 400',
                     html, re.S)
    assert "dead" in html and "HTTP 400" in html


def test_a_task_page_shows_its_waits(served):
    html = logged_in(served, "ops").get(served.page(f"/tasks/{served.waiting}")).text
    assert re.search(r'<table id="waits">.*?refund-17 / approval.*?alice', html, re.S)


def test_a_task_page_shows_its_chain_with_links_to_its_root_and_parent(served, store):
    made = approved_child(store, START)
    html = logged_in(served, "ops").get(served.page(f"/tasks/{made.child}")).text
    chain = re.search(r'<table id="chain">(.*?)</table>', html, re.S)
    assert chain is not None, "no chain section"
    link = f'<a href="/dashboard/tasks/{made.root}">{made.root}</a>'
    assert f"<tr><th>root</th><td>{link}</td></tr>" in chain.group(1)
    assert f"<tr><th>parent</th><td>{link}</td></tr>" in chain.group(1)
    assert re.findall(r"<tr><th>(hops|tasks|cost)</th><td>([^<]*)</td>", chain.group(1)) == [
        ("hops", "1 of 3"), ("tasks", "2 of 5"), ("cost", "2 of 10")]


def test_a_task_page_shows_the_approval_its_side_effect_used(served, store):
    made = approved_child(store, START)
    html = logged_in(served, "ops").get(served.page(f"/tasks/{made.child}")).text
    effects = re.search(r'<table id="side-effects">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert effects is not None, "no side effects section"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", effects.group(1), re.S)
    digest = made.approval.data_digest
    assert cells == ["1", "refund", "customer:17",
                     f'<code title="{digest}">{digest[:12]}…</code>', "refund-17 (1)",
                     f"alice at {when(made.approval.granted_at)}", when(START)]


def test_a_task_page_escapes_what_its_side_effect_names(served, store):
    store.receive(postroom.AuthContext(principal="planner"), envelope("x", queue="xss"))
    store.grant_approval(postroom.AuthContext(principal="alice", role="human"), "<b>a</b>",
                         action="<i>send</i>", resource="<script>", data=1,
                         expires_at=START + 60, requested_by="planner")
    claim = store.claim("w", queues="xss")
    store.finish(claim, None, side_effects=[postroom.SideEffect(
        action="<i>send</i>", resource="<script>", data=1)])
    html = logged_in(served, "ops").get(served.page(f"/tasks/{claim.task_id}")).text
    assert "&lt;i&gt;send&lt;/i&gt;" in html and "&lt;b&gt;a&lt;/b&gt; (1)" in html
    assert "<script>" not in html and "<i>send" not in html


def test_a_task_page_of_a_task_without_a_chain_has_no_chain_section(served, store):
    orphan_from_its_chain(store, served.done)
    html = logged_in(served, "ops").get(served.page(f"/tasks/{served.done}")).text
    assert 'id="chain"' not in html and 'id="task"' in html


def test_a_task_page_of_a_root_names_itself_its_chains_root(served):
    html = logged_in(served, "ops").get(served.page(f"/tasks/{served.done}")).text
    assert "<tr><th>root</th><td>this task</td></tr>" in html
    assert "<tr><th>parent</th><td>none</td></tr>" in html
    assert re.search(r'<table id="side-effects">.*?<td colspan="7">none</td>', html, re.S)


def test_an_agent_reads_its_own_task_and_another_s_is_a_plain_404(served, store):
    client = logged_in(served, "other")
    mine = client.get(served.page("/tasks")).text
    assert "planner" not in mine.split('id="tasks"')[1]
    theirs = client.get(served.page(f"/tasks/{served.done}"))
    missing = client.get(served.page("/tasks/no-such-task"))
    assert (theirs.status_code, missing.status_code) == (404, 404)
    assert theirs.text == missing.text


def test_the_task_list_filters_by_state_queue_and_principal(served):
    client = logged_in(served, "ops")
    html = client.get(served.page("/tasks"), params={"state": "done", "queue": "billing"}).text
    listed = re.findall(r'<a href="/dashboard/tasks/([^"]+)">', html)
    assert sorted(listed) == sorted([served.dead, served.waiting])
    by_other = client.get(served.page("/tasks"), params={"principal": "other"}).text
    assert len(re.findall(r'<a href="/dashboard/tasks/', by_other)) == 1


def test_a_human_answers_a_wait_addressed_to_it(served, store):
    client = logged_in(served, "alice")
    page = client.get(served.page("/waits")).text
    assert "refund-17" in page and "refund-18" not in page  # bob's wait is not alice's
    answer = client.post(served.page("/waits/refund-17/approval/1/signal"), data={
        "csrf": csrf(page), "event_id": "e-1", "value": '{"approve": true}'})
    assert answer.status_code == 200 and "accepted" in answer.text
    wait = store.wait("refund-17", "approval")
    assert (wait.state, wait.event_principal) == (postroom.WaitState.SIGNALED, "alice")


def test_a_human_cannot_answer_a_wait_addressed_to_another(served, store):
    client = logged_in(served, "alice")
    page = client.get(served.page("/waits")).text
    answer = client.post(served.page("/waits/refund-18/approval/1/signal"), data={
        "csrf": csrf(page), "event_id": "e-1", "value": "true"})
    assert answer.status_code == 404
    assert store.wait("refund-18", "approval").state is postroom.WaitState.WAITING


def test_an_approval_request_shows_approve_and_deny_to_the_addressed_human(served, store):
    ask_alice(store)
    page = logged_in(served, "alice").get(served.page("/waits")).text
    row = re.search(r'<tr data-wait="refund-19/approval">(.*?)</tr>', page, re.S)
    plain = re.search(r'<tr data-wait="refund-17/approval">(.*?)</tr>', page, re.S)
    assert row is not None and plain is not None
    assert "customer:19" in row.group(1)
    assert re.findall(r'name="approve" value="(\w+)">(\w+)<', row.group(1)) == [
        ("true", "Approve"), ("false", "Deny")]
    assert 'name="approve"' not in plain.group(1)


def test_a_human_approves_from_the_waits_page_and_the_approval_is_granted(served, store):
    ask_alice(store)
    client = logged_in(served, "alice")
    page = client.get(served.page("/waits")).text
    answer = client.post(served.page("/waits/refund-19/approval/1/approval"), data={
        "csrf": csrf(page), "event_id": "e-1", "approve": "true"})
    [approval] = store.list_approvals()
    assert answer.status_code == 200 and "approved: accepted" in answer.text
    assert (approval.granted_by, approval.resource) == ("alice", "customer:19")
    assert store.wait("refund-19", "approval").state is postroom.WaitState.SIGNALED


def test_an_operator_sees_an_approval_request_but_cannot_answer_it(served, store):
    ask_alice(store)
    client = logged_in(served, "ops")
    page = client.get(served.page("/waits")).text
    row = re.search(r'<tr data-wait="refund-19/approval">(.*?)</tr>', page, re.S)
    assert row is not None and "customer:19" in row.group(1) and "Approve" not in row.group(1)
    token = csrf(client.get(served.page("/queues")).text)  # the waits page has no form
    answer = client.post(served.page("/waits/refund-19/approval/1/approval"), data={
        "csrf": token, "event_id": "e-1", "approve": "true"})
    assert answer.status_code == 403 and store.list_approvals() == []


def test_an_approval_answer_without_the_csrf_token_grants_nothing(served, store):
    ask_alice(store)
    client = logged_in(served, "alice")
    answer = client.post(served.page("/waits/refund-19/approval/1/approval"), data={
        "csrf": "0" * 64, "event_id": "e-1", "approve": "true"})
    assert answer.status_code == 403 and store.list_approvals() == []


def test_a_write_without_the_session_s_csrf_token_changes_nothing(served, store):
    client = logged_in(served, "ops")
    answer = client.post(served.page(f"/replies/{store.reply(served.dead).reply_id}/requeue"),
                         data={"csrf": "0" * 64, "reason": "try again"})
    assert answer.status_code == 403
    assert store.reply(served.dead).state is postroom.ReplyState.DEAD


def test_a_form_posted_from_another_site_is_refused_even_with_the_token(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page("/queues")).text
    answer = client.post(served.page("/queues/pause"), headers={
        "origin": "https://elsewhere.example"}, data={"csrf": csrf(page), "queue": "mail",
                                                    "reason": "forged"})
    assert answer.status_code == 403 and store.paused_queues() == []


def test_another_site_cannot_log_a_browser_in(served):
    answer = httpx.post(served.page("/login"), headers={"origin": "https://elsewhere.example"},
                        data={"token": served.tokens["ops"]})
    assert answer.status_code == 403 and COOKIE not in answer.cookies


def test_an_operator_requeues_a_dead_reply_with_a_reason(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page("/replies/dead")).text
    reply_id = store.reply(served.dead).reply_id
    assert f'data-reply="{reply_id}"' in page
    answer = client.post(served.page(f"/replies/{reply_id}/requeue"),
                         data={"csrf": csrf(page), "reason": "the endpoint is fixed"})
    assert answer.status_code == 200 and "requeued" in answer.text
    assert store.reply(served.dead).state is postroom.ReplyState.PENDING
    (requeue,) = store.requeues(reply_id)
    assert (requeue.operator, requeue.reason) == ("ops", "the endpoint is fixed")


def test_a_requeue_without_a_reason_is_refused(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page("/replies/dead")).text
    answer = client.post(served.page(f"/replies/{store.reply(served.dead).reply_id}/requeue"),
                         data={"csrf": csrf(page), "reason": " "})
    assert answer.status_code == 400 and "reason" in answer.text
    assert store.reply(served.dead).state is postroom.ReplyState.DEAD


@pytest.mark.parametrize("name", ["planner", "alice"])
def test_operators_pages_are_closed_to_others(served, name):
    client = logged_in(served, name)
    assert all(client.get(served.page(path)).status_code == 403
               for path in ("/replies/dead", "/queues", "/audit"))


def test_a_human_cannot_requeue_even_with_its_own_csrf_token(served, store):
    client = logged_in(served, "alice")
    page = client.get(served.page("/waits")).text
    answer = client.post(served.page(f"/replies/{store.reply(served.dead).reply_id}/requeue"),
                         data={"csrf": csrf(page), "reason": "mine now"})
    assert answer.status_code == 403
    assert store.reply(served.dead).state is postroom.ReplyState.DEAD


def test_an_operator_runs_a_failed_task_again(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page(f"/tasks/{served.failed}")).text
    answer = client.post(served.page(f"/tasks/{served.failed}/retry"),
                         data={"csrf": csrf(page), "reason": "the model is back"})
    assert answer.status_code == 200
    (retry,) = store.retries(served.failed)
    assert store.task(retry.new_task_id).retry_of == served.failed
    assert retry.new_task_id in str(answer.url)


def test_re_running_by_filter_lists_first_and_runs_only_when_confirmed(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page("/tasks"), params={"state": "failed"}).text
    form = {"csrf": csrf(page), "state": "failed", "queue": "", "reason": "batch"}
    dry = client.post(served.page("/retries"), data=form)
    assert served.failed in dry.text and store.retries(served.failed) == []
    client.post(served.page("/retries"), data={**form, "confirm": "yes"})
    assert len(store.retries(served.failed)) == 1


def test_an_operator_pauses_and_resumes_a_queue(served, store):
    client = logged_in(served, "ops")
    page = client.get(served.page("/queues")).text
    client.post(served.page("/queues/pause"),
                data={"csrf": csrf(page), "queue": "mail", "reason": "maintenance"})
    assert [p.queue for p in store.paused_queues()] == ["mail"]
    client.post(served.page("/queues/resume"), data={"csrf": csrf(page), "queue": "mail"})
    assert store.paused_queues() == []


def test_the_audit_page_shows_the_audit_result(served):
    html = logged_in(served, "ops").get(served.page("/audit")).text
    assert "Every invariant holds" in html


def test_a_revoked_token_ends_its_sessions_at_once(served, store):
    client = logged_in(served, "ops")
    store.revoke_principal("ops")
    answer = client.get(served.page("/tasks"), follow_redirects=False)
    assert answer.status_code == 303 and "/login" in answer.headers["location"]


def test_text_a_principal_wrote_is_escaped(store, transport, auth):
    task_id = store.receive(auth, envelope("<script>alert(1)</script>",
                                           payload={"x": "<img src=x onerror=alert(1)>"})
                            ).task_id
    with site(store, transport) as running:
        client = logged_in(running, "ops")
        html = client.get(running.page("/tasks")).text
        assert task_id in re.findall(r'<a href="/dashboard/tasks/([^"]+)">', html)
        page = client.get(running.page(f"/tasks/{task_id}")).text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;" in page


def test_metrics_are_served_by_the_same_app(served):
    answer = httpx.get(f"{served.url}/metrics")
    assert answer.status_code == 200 and "postroom_tasks{" in answer.text


def test_the_chart_counts_finished_tasks_per_minute_and_queued_ones_at_each_end(
        store, auth, clock):
    store.receive_atomic(auth, [envelope("a"), envelope("b")])
    clock.advance(90)
    store.finish(store.claim("w"), None)  # a: queued 90 s, finished in minute 1
    clock.advance(60)
    drawn: Chart = chart(store.observe(window=180), minutes=3)
    assert drawn.start == START + 150 - 180
    assert drawn.finished == [0, 0, 1]
    assert drawn.depth == [2, 1, 1]
