"""The subprocess harness itself (``tests.processes``): what the crash and race tests rely on."""

from __future__ import annotations

from postroom import TaskState
from tests.processes import Child, Context, spawn, step
from tests.support import envelope


@step("echo")
def _echo(ctx: Context, text: str) -> str:
    return f"{ctx.name}: {text}"


def test_a_child_keeps_its_claim_between_steps(store, db_url, auth):
    task_id = store.receive(auth, envelope()).task_id
    with spawn(1, name="worker", store=db_url) as (worker,):
        assert worker.call("claim")["owner"] == "worker-0"
        worker.call("finish", result={"ok": True})
    assert store.task(task_id).state == TaskState.DONE


def test_a_step_that_raises_is_answered_with_its_error_and_the_child_goes_on(db_url, store):
    with spawn(1, store=db_url) as (child,):
        child.go("finish")
        answer = child.answer()
        assert (answer.error, answer.message) == ("LookupError", "child-0 holds no claim")
        assert child.call("claim") is None


def test_an_armed_crash_ends_the_child_with_its_code_and_no_answer(db_url, store, auth):
    child = Child(store=db_url)
    try:
        child.ready()
        child.call("arm", point="receive.before_commit", code=42)
        child.go("receive", message_id="m-1")
        assert child.exit_code() == 42
        assert child.unanswered() == []
    finally:
        child.stop()
    assert store.info()["tasks"] == {}


def test_a_child_runs_steps_registered_in_a_module_it_imports():
    with spawn(1, modules=[__name__]) as (child,):
        assert child.call("echo", text="hello") == "child-0: hello"
