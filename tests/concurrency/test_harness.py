"""The child-process harness itself (``tests.harness.children``): what every test with real
processes relies on."""

from __future__ import annotations

import os
import signal
import time

import pytest

from postroom import TaskState
from tests.harness.children import (
    ENDED,
    Child,
    ChildError,
    Context,
    Process,
    python,
    release,
    spawn,
    step,
)
from tests.support import envelope


@step("echo")
def _echo(ctx: Context, text: str) -> str:
    return f"{ctx.name}: {text}"


@step("count")
def _count(ctx: Context, up_to: int, pause: float = 0.0) -> int:
    for n in range(1, up_to + 1):
        ctx.note({"n": n})
        time.sleep(pause)
    return up_to


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``seconds``."""
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


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
    with Child(store=db_url) as child:
        child.ready()
        child.call("arm", point="receive.before_commit", code=42)
        child.go("receive", message_id="m-1")
        assert child.exit_code() == 42
        assert child.unanswered() == []
    assert store.info()["tasks"] == {}


def test_a_child_runs_steps_registered_in_a_module_it_imports():
    with spawn(1, modules=[__name__]) as (child,):
        assert child.call("echo", text="hello") == "child-0: hello"


def test_notes_arrive_before_the_answer_and_a_kill_after_them_ends_the_child_mid_step():
    with spawn(2, modules=[__name__]) as (whole, killed):
        killed.kill_after(notes=2)
        answers = release([whole, killed], "count", up_to=50, pause=0.02)
        assert answers[0].value == 50 and whole.notes == [{"n": n} for n in range(1, 51)]
        assert answers[1].error == ENDED and killed.killed
        assert 2 <= len(killed.notes) < 50
        with pytest.raises(ChildError, match="ended"):
            answers[1].unwrap()


def test_any_command_runs_with_its_output_stderr_and_exit_code():
    with Process(["sh", "-c", "read line; echo \"got $line\"; echo oops >&2; exit 3"],
                 name="shell") as shell:
        shell.write("hello")
        assert shell.readline() == "got hello"
        assert shell.wait() == 3
        assert shell.readline() is None
        assert shell.stderr() == "oops\n"


def test_a_paused_process_does_nothing_until_it_is_resumed():
    with Process(python("-c", "import sys\nfor line in sys.stdin: print(line, end='', "
                                    "flush=True)"), name="echo") as echo:
        echo.pause()
        echo.write("while paused")
        with pytest.raises(ChildError, match="said nothing"):
            echo.readline(timeout=0.5)
        echo.resume()
        assert echo.readline() == "while paused"
        echo.terminate()
        assert echo.wait() == -signal.SIGTERM


def test_leaving_the_block_by_an_error_kills_every_child():
    with pytest.raises(RuntimeError), spawn(2) as children:
        pids = [child.pid for child in children]
        raise RuntimeError("the test failed")
    assert all(gone(pid) for pid in pids)


# A parent that starts a child with the harness and is then killed, by a signal it does not
# handle: nothing of it runs any more, yet the child must not outlive it.
_PARENT = """
import time
from tests.harness.children import Process, python
child = Process(python("-c", "import time; time.sleep(600)"), name="orphan?")
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the lifeline is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_child_dies_with_its_parent_even_when_the_parent_cannot_clean_up(signum):
    with Process(python("-c", _PARENT), name="parent") as parent:
        line = parent.readline()
        assert line is not None, parent.stderr()
        grandchild = int(line)
        assert alive(grandchild)
        parent.signal(signum)
        assert parent.wait() == -signum
    assert gone(grandchild)


def test_a_command_that_does_not_exist_is_refused_at_once():
    with pytest.raises(FileNotFoundError, match="no-such-command"):
        Process(["no-such-command"])
