"""The dashboard in a real browser (headless Chromium, JavaScript off) against a real
uvicorn server on 127.0.0.1: log in, see the four stages, open a task page, answer a wait as
a human, approve an approval request, requeue a dead reply as an operator; a screenshot of
every page is kept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import postroom
from tests.http.site import Site, ask_alice, site

STAGES = ("1. received", "2. processing", "3. business outcome", "4. reply delivery")


@pytest.fixture
def served(store, transport) -> Iterator[Site]:
    with site(store, transport) as running:
        yield running


def shot(page, artifacts: Path, backend: str, name: str) -> None:
    page.screenshot(path=str(artifacts / f"{backend}-{name}.png"), full_page=True)


def log_in(page, served: Site, name: str, artifacts: Path, backend: str) -> None:
    page.goto(served.page("/"))
    assert page.url.startswith(served.page("/login"))  # no session yet: sent to log in
    page.fill("input[name=token]", served.tokens[name])
    shot(page, artifacts, backend, f"login-{name}")
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the overview's whole document, not only its first bytes
    assert page.url == served.page("/")


def test_an_operator_logs_in_and_sees_the_four_stages_side_by_side(
        page, served, artifacts, backend):
    log_in(page, served, "ops", artifacts, backend)
    headings = page.locator("#stages thead tr").first.locator("th").all_inner_texts()
    assert [text for text in headings if text[:1].isdigit()] == list(STAGES)
    mail = page.locator('#stages tr[data-queue="mail"]')
    assert mail.locator('[data-stage="outcome-failed"]').inner_text() == "1"
    assert mail.locator('[data-stage="delivery-sent"]').inner_text() == "2"
    assert page.locator("svg polyline").count() == 1  # the chart, drawn by the server
    shot(page, artifacts, backend, "overview")


def test_an_operator_opens_a_task_page(page, served, artifacts, backend):
    log_in(page, served, "ops", artifacts, backend)
    page.goto(served.page("/tasks?queue=billing&state=done"))
    shot(page, artifacts, backend, "tasks")
    page.click(f'a[href="/dashboard/tasks/{served.dead}"]')
    assert page.locator("h1").inner_text() == f"Task {served.dead}"
    assert page.locator("#attempts tbody td").nth(2).inner_text() == "worker-2"
    assert "permanent" in page.locator("#deliveries").inner_text()
    shot(page, artifacts, backend, "task")


def test_a_human_answers_a_wait_addressed_to_it(page, served, store, artifacts, backend):
    log_in(page, served, "alice", artifacts, backend)
    page.goto(served.page("/waits"))
    row = page.locator('#open-waits tr[data-wait="refund-17/approval"]')
    assert page.locator('tr[data-wait="refund-18/approval"]').count() == 0  # bob's
    row.locator("input[name=value]").fill('{"approve": true}')
    shot(page, artifacts, backend, "waits")
    row.locator("button[type=submit]").click()
    assert "refund-17/approval #1: accepted" in page.locator(".notice").inner_text()
    shot(page, artifacts, backend, "wait-answered")
    wait = store.wait("refund-17", "approval")
    assert (wait.state, wait.event_principal) == (postroom.WaitState.SIGNALED, "alice")


def test_a_human_approves_an_approval_request_from_the_waits_page(page, served, store,
                                                                 artifacts, backend):
    ask_alice(store)
    log_in(page, served, "alice", artifacts, backend)
    page.goto(served.page("/waits"))
    row = page.locator('#open-waits tr[data-wait="refund-19/approval"]')
    assert "customer:19" in row.inner_text()
    shot(page, artifacts, backend, "approval-request")
    row.locator("button[name=approve][value=true]").click()
    assert "refund-19/approval #1 approved: accepted" in page.locator(".notice").inner_text()
    shot(page, artifacts, backend, "approval-granted")
    [approval] = store.list_approvals()
    assert (approval.granted_by, approval.resource) == ("alice", "customer:19")


def test_an_operator_requeues_a_dead_reply_with_a_reason(page, served, store, artifacts,
                                                         backend):
    reply_id = store.reply(served.dead).reply_id
    log_in(page, served, "ops", artifacts, backend)
    page.goto(served.page("/replies/dead"))
    row = page.locator(f'#dead-replies tr[data-reply="{reply_id}"]')
    row.locator("input[name=reason]").fill("the endpoint is fixed")
    shot(page, artifacts, backend, "dead-replies")
    row.locator("button[type=submit]").click()
    assert f"{reply_id} requeued" in page.locator(".notice").inner_text()
    shot(page, artifacts, backend, "requeued")
    assert store.reply(served.dead).state is postroom.ReplyState.PENDING
    assert [r.operator for r in store.requeues(reply_id)] == ["ops"]


def test_a_human_sees_no_operator_pages(page, served, artifacts, backend):
    log_in(page, served, "alice", artifacts, backend)
    assert page.goto(served.page("/replies/dead")).status == 403
    shot(page, artifacts, backend, "refused")
