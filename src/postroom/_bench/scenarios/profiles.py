"""Where the time of each kernel call goes, function by function: ``receive``, ``claim``,
``finish``, ``dispatch`` and ``signal``, one call (and one commit) at a time, sampled from
outside the process by py-spy, 1,000 times a second, without pausing it.

A process of its own (``postroom._bench.profiled``) makes the envelopes and opens the waits
beforehand, unsampled (each other step takes what the one before made: the tasks received are
claimed, the claims finished, their replies dispatched); then, step by step, py-spy attaches and
the process makes ``sizes.profile_calls`` calls of the step, one at a time. Every sample of its
main thread counts, waiting included: a sample's time goes to the function running when it was
taken (self time), grouped as the COMMIT (and the fsync it waits for), the other calls into the
database driver (BEGIN and every statement, through the dialect into sqlite3 or psycopg), JSON
(the standard library's encoder and decoder), the rest of postroom's own code, and everything
else (the standard library). The table gives the time per call of the sampled loop and the share
of each group; below it, for each step, postroom's functions with the most self time. The
process ends with a clean audit of both databases and one receiver effect per task.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from postroom._bench.context import BenchError, Context, Measurement, Rounds

__all__ = ["STEPS", "markdown", "run"]

_RATE = 1000
#: The kernel calls profiled, in the order they run.
STEPS = ("receive", "claim", "finish", "dispatch", "signal")
#: How many of postroom's functions each step lists.
_TOP = 6
_GROUPS = ("commit", "statements", "json", "postroom", "other")
_DIALECTS = ("/postroom/db/sqlite.py", "/postroom/db/postgres.py")


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise BenchError("the profiles scenarios need py-spy: pip install 'postroom[bench]'")
    return found


def run(ctx: Context) -> list[Measurement]:
    """Per kernel call: time per call of the sampled loop and where its samples fell."""
    spy = _py_spy()
    calls = ctx.sizes.profile_calls
    backend = ctx.target.backend
    ctx.progress(f"profiles: {calls} calls of each kernel call, one at a time ({backend})")
    child = subprocess.Popen(
        [sys.executable, "-m", "postroom._bench.profiled", ctx.target.url("profiles-store"),
         ctx.target.url("profiles-receiver"), str(calls)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="postroom-profiles-") as folder:
            for step in STEPS:
                _expect(child, f"ready {step}")
                samples = Path(folder) / f"{step}.txt"
                seconds = _sampled(spy, child, child.stdin, samples, step)
                rows.append(_row(backend, step, calls, seconds / calls, _self_times(samples)))
            _expect(child, "checked")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    return rows


def _expect(child: subprocess.Popen[str], line: str) -> str:
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    if not said.startswith(line):
        child.kill()
        raise BenchError(f"the profiled process said {said!r} where {line!r} was due "
                         f"(exit code {child.wait()})")
    return said


def _sampled(spy: str, child: subprocess.Popen[str], go: IO[str], samples: Path,
             step: str) -> float:
    """Attach py-spy, let ``step`` run, stop py-spy; the step's seconds, as it clocked them."""
    sampler = subprocess.Popen(
        [spy, "record", "--pid", str(child.pid), "--rate", str(_RATE), "--format", "raw",
         "--threads", "--idle", "--nonblocking", "--full-filenames", "--output", str(samples)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert sampler.stdout is not None
    said = sampler.stdout.readline()  # "py-spy> Sampling process ..." once attached
    if "Sampling" not in said:
        sampler.kill()
        out, err = sampler.communicate()
        raise BenchError(f"py-spy could not attach to the profiled process: "
                         f"{said.strip()} {out.strip()} {err.strip()}")
    go.write("go\n")
    go.flush()
    done = _expect(child, f"done {step}")
    sampler.send_signal(signal.SIGINT)
    out, err = sampler.communicate(timeout=60)
    if sampler.returncode != 0 or not samples.exists():
        raise BenchError(f"py-spy failed ({sampler.returncode}): {out.strip()} {err.strip()}")
    return float(done.split()[2])


def _self_times(samples: Path) -> Counter[tuple[str, str, str]]:
    """Samples per (group, function, file) of the leaf frames of the main thread's stacks:
    a sample taken inside a dialect's ``commit`` (in the driver, or waiting for the fsync)
    is the COMMIT's, whatever the leaf."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or not frames[0].endswith(": MainThread"):
            continue
        located = [(function, where.rpartition(":")[0]) for function, _, where
                   in (frame.rpartition(" (") for frame in frames[1:])]
        function, path = located[-1]
        committing = any(name.endswith(".commit") and where.endswith(_DIALECTS)
                         for name, where in located)
        group = "commit" if committing else _group(path)
        counts[(group, function, path)] += int(count)
    return counts


def _group(path: str) -> str:
    """Which group a function's self time belongs to."""
    if "/psycopg" in path or "/sqlite3/" in path or path.endswith(_DIALECTS):
        return "statements"
    if "/json/" in path:
        return "json"
    if "/postroom/" in path and "/_bench/" not in path:
        return "postroom"
    return "other"


def _row(backend: str, step: str, calls: int, seconds_per_call: float,
         times: Counter[tuple[str, str, str]]) -> Measurement:
    """The row of ``step``: its time per call, and its samples' shares by group and by
    postroom's functions."""
    total = float(sum(times.values()))
    if not total:
        raise BenchError(f"py-spy took no sample of the main thread during {step}")
    shares: Counter[str] = Counter()
    for (group, _, _), samples in times.items():
        shares[group] += samples
    ours = [(function, path, samples) for (group, function, path), samples in times.items()
            if group == "postroom"]
    ours.sort(key=lambda item: -item[2])
    return Measurement(
        id=f"profiles.{backend}.{step}", backend=backend, unit="us/call",
        label=f"`{step}`, one at a time, sampled ({backend})",
        rounds=Rounds(rates=(seconds_per_call * 1e6,)),
        details={"step": step, "calls": calls, "samples": round(total),
                 "shares": {group: round(shares[group] / total, 3) for group in _GROUPS},
                 "top": [{"function": function, "module": _module(path),
                          "share": round(samples / total, 3)}
                         for function, path, samples in ours[:_TOP]]})


def _module(path: str) -> str:
    """``postroom/inbox.py`` for a path inside the package."""
    return "postroom/" + path.rpartition("/postroom/")[2]


def markdown(report: dict[str, Any]) -> list[str]:
    """The profiles as a Markdown section (empty without profile rows)."""
    rows = [row for row in report["measurements"] if row["id"].startswith("profiles.")]
    if not rows:
        return []
    summary, how = __doc__.split("\n\n", 1)
    lines = ["", "## Profiles of the kernel calls", "", summary.replace("\n", " "), "", how, "",
             "| backend | call | us per call | COMMIT | other statements | JSON "
             "| postroom's Python | other |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        shares = row["details"]["shares"]
        lines.append(f"| {row['backend']} | {row['details']['step']} | {row['value']:,.0f} | "
                     + " | ".join(f"{shares[group]:.0%}" for group in _GROUPS) + " |")
    lines.append("")
    for row in rows:
        lines.append(f"- {row['backend']}, `{row['details']['step']}`: "
                     + _top(row["details"]["top"]))
    return lines


def _top(top: Iterable[dict[str, Any]]) -> str:
    return ", ".join(f"`{item['function']}` ({item['module']}) {item['share']:.1%}"
                     for item in top) or "none sampled"
