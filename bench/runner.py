"""Run the scenarios against one baseline and judge the bars of the foundation issue."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine
from bench.context import Context, Measurement, Sizes, SQLiteTarget
from bench.scenarios import claim_backlog, end_to_end
from bench.scenarios.raw_sqlite import RawCommitLoop

__all__ = ["SCENARIOS", "Bar", "bars_for", "default_folder", "run_bench"]

Scenario = Callable[[Context], list[Measurement]]

#: Scenario names (``postroom bench --only NAME``), in the order they run.
SCENARIOS: dict[str, Scenario] = {
    "claim": claim_backlog.run,
    "single": end_to_end.run_single,
    "batched": end_to_end.run_batched,
}


@dataclass(frozen=True, kw_only=True)
class Bar:
    """A required ratio: ``numerator / denominator >= required``.

    Both sides are taken as ratios to the raw loop (the median of each round's rate over the
    baseline around it), so a burst of a neighbour's I/O during one scenario does not count
    against another.
    """

    id: str
    text: str
    numerator: str  # a measurement id
    denominator: str  # a measurement id; "raw_sqlite" is the baseline
    required: float


def bars_for(rows: Sequence[Measurement]) -> list[Bar]:
    """The bars of the foundation issue, for the measurements this run produced."""
    bars = []
    claims = sorted((row for row in rows if row.id.startswith("claim_finish.")),
                    key=lambda row: row.details["backlog"])
    if len(claims) >= 2:
        small, large = claims[0], claims[-1]
        bars.append(Bar(
            id="claim_flat_under_backlog", numerator=large.id, denominator=small.id,
            required=0.7,
            text=f"claim+finish at {large.details['backlog']:,} pending >= 0.7x its rate at "
                 f"{small.details['backlog']:,}"))
    ids = {row.id for row in rows}
    if "e2e.single" in ids:
        bars.append(Bar(id="single_vs_raw", numerator="e2e.single", denominator="raw_sqlite",
                        required=0.12,
                        text="one-at-a-time end-to-end tasks/s >= 0.12x raw commits/s"))
    if "e2e.batched" in ids:
        bars.append(Bar(id="batched_vs_raw", numerator="e2e.batched", denominator="raw_sqlite",
                        required=1.5,
                        text="batched end-to-end tasks/s >= 1.5x raw commits/s"))
    return bars


def default_folder() -> Path:
    """``/var/tmp`` (on disk by convention), else the system's temporary directory."""
    var_tmp = Path("/var/tmp")
    if var_tmp.is_dir() and machine.filesystem(var_tmp) not in machine.MEMORY_FILESYSTEMS:
        return var_tmp
    return Path(tempfile.gettempdir())


def run_bench(*, sizes: Sizes, mode: str, folder: Path, only: Sequence[str] = (),
              progress: Callable[[str], None] = lambda _line: None,
              command: str = "postroom bench") -> dict[str, Any]:
    """Run the chosen scenarios (all by default) and return the report as JSON values.

    Raises ``ValueError`` if ``folder`` is on a memory file system.
    """
    kind = machine.filesystem(folder)
    if kind in machine.MEMORY_FILESYSTEMS:
        raise ValueError(f"{folder} is on {kind}: commits there skip the disk, so the ratios "
                         "would mean nothing; choose a folder on disk with --dir")
    chosen = [name for name in SCENARIOS if not only or name in only]
    started = datetime.now(UTC)
    load_before = machine.load_average()
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="postroom-bench-", dir=folder) as scratch:
        where = Path(scratch)
        raw = RawCommitLoop(where / "raw.db", commits=sizes.raw_commits)
        try:
            raw.round()  # warm-up, not kept: the first round creates the file's pages
            raw.rates.clear()
            ctx = Context(sizes=sizes, target=SQLiteTarget(where), baseline=raw,
                          progress=progress)
            rows: list[Measurement] = []
            for name in chosen:
                rows.extend(SCENARIOS[name](ctx))
            raw.round()
            baseline = raw.measurement()
        finally:
            raw.close()
    elapsed = time.perf_counter() - clock
    return _report(command=command, mode=mode, started=started, elapsed=elapsed,
                   machine_info=machine.summary(folder), sizes=sizes,
                   load=(load_before, machine.load_average()), rows=[baseline, *rows])


def _report(*, command: str, mode: str, started: datetime, elapsed: float,
            machine_info: dict[str, Any], sizes: Sizes, load: tuple[list[float], list[float]],
            rows: list[Measurement]) -> dict[str, Any]:
    ratios = {row.id: row.ratio for row in rows if row.ratio is not None}
    judged = []
    for bar in bars_for(rows):
        measured = ratios[bar.numerator] / ratios[bar.denominator]
        judged.append({"id": bar.id, "text": bar.text, "numerator": bar.numerator,
                       "denominator": bar.denominator, "measured": round(measured, 3),
                       "required": bar.required, "passed": measured >= bar.required})
    return {
        "command": command,
        "mode": mode,
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed, 1),
        "machine": machine_info,
        "load_average": {"before": load[0], "after": load[1]},
        "sizes": {name: getattr(sizes, name) for name in sizes.__dataclass_fields__},
        "raw_commits_per_s": round(rows[0].value, 1),
        "measurements": [row.to_dict() for row in rows],
        "bars": judged,
        "all_bars_passed": all(bar["passed"] for bar in judged),
    }
