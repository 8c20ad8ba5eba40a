"""The report as ``RESULTS.md``: the command, the machine, the figures, the bars."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from postroom._bench import plots
from postroom._bench.scenarios import peers, profiles, steps

__all__ = ["checkout_results", "render", "write"]

#: Where a full run writes its results by default.


def checkout_results(folder: Path | None = None) -> Path | None:
    """``bench/RESULTS.md`` of the postroom checkout at ``folder`` (the current directory by
    default), or ``None`` when ``folder`` is not one: an installed postroom has no file of
    record to rewrite."""
    root = folder if folder is not None else Path.cwd()
    results = root / "bench" / "RESULTS.md"
    return results if results.is_file() and (root / "src" / "postroom").is_dir() else None


def render(report: dict[str, Any]) -> str:
    """Markdown for one run's report."""
    info = report["machine"]
    load = report["load_average"]
    lines = [
        "# postroom benchmark results",
        "",
        f"Written by `{report['command']}` ({report['mode']} run) on {report['started']}, "
        f"in {report['elapsed_s']:.0f} s. Run the same command to reproduce it.",
        "",
        "Every ratio divides a figure by the raw SQLite commit loop measured in the same run "
        "(WAL, `synchronous=FULL`, one row per `BEGIN IMMEDIATE` transaction, on the same "
        "file system). Baseline rounds sandwich every timed round; a round's ratio is its rate "
        "over the mean of the two baseline rounds around it, and each figure shows the median "
        "rate and the median ratio of its rounds (every round is in the JSON that "
        "`postroom bench` prints). A bar between two figures divides their ratios, unless its "
        "text says it divides their rates; a bar on one figure (a latency) compares its "
        "median.",
        "",
        "## Machine",
        "",
        f"- CPUs (`nproc`): {info['nproc']} ({info['cpu']})",
        f"- {info['platform']}",
        f"- Python {info['python']}, SQLite {info['sqlite']}, postroom {info['postroom']}"
        + (f" at commit `{info['commit']}`" if info.get("commit") else ""),
        f"- databases in `{info['folder']}` ({info['filesystem']})",
        "- glibc malloc settings from the environment: "
        + (", ".join(f"`{name}={value}`" for name, value in info["malloc_env"].items())
           or "none (defaults)"),
        f"- load average (1, 5, 15 min): {_load(load['before'])} before, "
        f"{_load(load['after'])} after",
    ]
    server = report.get("postgres")
    if server:
        lines.append(f"- PostgreSQL {server['server_version']} at `{server['url']}` "
                     f"(`fsync={server['fsync']}`, "
                     f"`synchronous_commit={server['synchronous_commit']}`)")
    rows = report["measurements"]
    lines += _section("Figures", "", ["measurement", "rate (median)",
                                      "ratio to raw commits/s (median)", "rounds"],
                      [_figure(row) for row in rows if row["backend"] != "postgres"])
    postgres_rows = [row for row in rows if row["backend"] == "postgres"]
    if postgres_rows:
        lines += _section(
            "PostgreSQL",
            "Worker processes, each with its own connections as on separate hosts, share one "
            "PostgreSQL database; a round releases them together and ends when the last is "
            "done. The server has its own disk, fsync settings and processes, so a ratio "
            "to the raw SQLite loop (measured around each round, as above) is context, not a "
            "like-for-like comparison. The latency runs from the `receive` call to the moment "
            "an idle worker, woken by LISTEN/NOTIFY, has claimed the task: a round's p50 and "
            "p99 are over its tasks, the figure is the median over rounds, and a latency has "
            "no ratio.",
            ["measurement", "median", "ratio to raw SQLite commits/s (median)", "rounds"],
            [_figure(row) for row in postgres_rows])
    if any(row["id"].startswith("runtime.") for row in rows):
        lines += ["", "## Through the runtime", "", _RUNTIME]
    charts = plots.plots(report)
    if charts:
        lines += ["", "## Charts", "", "Written beside this file; each point is a median "
                  "round, its whisker the slowest to the fastest round.", ""]
        for name in charts:
            lines += [f"![{name.removesuffix('.svg')}]({name})", ""]
    if report["bars"]:
        lines += _section("Bars", "", ["bar", "measured", "required", "result"],
                          [_bar(bar) for bar in report["bars"]])
    else:
        lines += ["", "## Bars", "", "No bar judges the scenarios of this run."]
    cycles = [row for row in report["measurements"] if "us_per_task_in_commits" in row["details"]]
    if cycles:
        lines += _section(
            "Where a claim+finish cycle's time goes",
            "One extra round per backlog size, after the timed ones, clocks the time spent in "
            "commits (and the fsyncs they wait for) and in the other statements; the rest is "
            "postroom's Python. The statements' own cost is what a growing backlog could make "
            "grow; the commits' cost is the disk's (and the write-back of checkpoints into a "
            "larger file).",
            ["backlog", "us in commits", "us in statements", "us in Python"],
            [[f"{row['details']['backlog']:,}",
              f"{row['details']['us_per_task_in_commits']:.0f}",
              f"{row['details']['us_per_task_in_statements']:.0f}",
              f"{row['details']['us_per_task_elsewhere']:.0f}"] for row in cycles])
    split = [row for row in report["measurements"] if "database_share" in row["details"]]
    if split:
        lines += _section(
            "Where the time of a receive and of an end-to-end task goes",
            "One extra round per scenario, after the timed ones, clocks the time spent inside "
            "the database driver (statements, commits and the fsyncs they wait for). The rest "
            "is postroom's Python. The ratio if Python took no time divides the ratio by the "
            "database's share: the most that optimizing Python can give with these "
            "statements, transactions and schema. The ratio if only the commits took time "
            "divides it by the commits' share: the most that any change short of fewer or "
            "smaller commits can give. Each scenario starts from empty databases, "
            "which grow by every round's tasks; the rounds above are in order, so a trend in "
            "them is the cost of a growing store.",
            ["measurement", "commits per task", "share of time in the database",
             "share of time in commits", "ratio if Python took no time",
             "ratio if only the commits took time", "tasks in the store at the end"],
            [[row["label"], f"{row['details']['commits_per_task']:g}",
              f"{row['details']['database_share']:.0%}",
              f"{row['details']['commit_share']:.0%}",
              f"{row['details']['ratio_if_python_were_free']:.3f}",
              f"{row['details']['ratio_if_only_commits_took_time']:.3f}",
              f"{row['details']['tasks_in_store_at_end']:,}"] for row in split])
    costs = [row for row in report["measurements"] if row["id"].startswith("commit_cost.")]
    if costs:
        lines += _section(
            "What a commit costs by the pages it writes",
            "The raw loop's commit appends about one page to the WAL. These loops make the "
            "same durable commit but rewrite several one-page rows in it (the next ones of "
            "256, so that checkpoints copy back many distinct pages, as a store's do), so "
            "each commit writes that many WAL frames; their ratio to the raw loop is what a "
            "commit of that size costs on this disk.",
            ["pages (WAL frames) per commit", "commits/s (median)", "ratio to raw (median)"],
            [[str(row["details"]["pages_per_commit"]),
              f"{_number(row['value'], row['unit'])}",
              "" if row["ratio_to_raw"] is None else f"{row['ratio_to_raw']:.3f}"]
             for row in costs])
    framed = [row for row in report["measurements"] if "wal_frames_per_commit" in row["details"]]
    if framed:
        ceiling = "ratio_if_commits_cost_bare_commits_of_as_many_pages"
        lines += _section(
            "How many pages an end-to-end task's commits write",
            "One more extra round per scenario counts the WAL frames its commits append (in "
            "the store and the receiver). Priced like the commit-cost loops, the commits alone "
            "allow the ratio in the last column, before any statement or Python runs: a "
            "commit's time relative to the raw loop's, fitted over those loops as a fixed "
            "cost plus a cost per page and taken at these frames per commit, turned back "
            "into a ratio and divided by the commits per task. Empty when the commit-cost "
            "scenario did not run or the frames per commit lie outside the pages it "
            "measured.",
            ["measurement", "commits per task", "WAL frames per task",
             "WAL frames per commit", "ratio the commits alone allow"],
            [[row["label"], f"{row['details']['commits_per_task']:g}",
              f"{row['details']['wal_frames_per_task']:.1f}",
              f"{row['details']['wal_frames_per_commit']:.1f}",
              f"{row['details'][ceiling]:.3f}" if ceiling in row["details"] else ""]
             for row in framed])
    plans = [row for row in report["measurements"] if "claim_plans" in row["details"]]
    if plans:
        largest = max(plans, key=lambda row: row["details"]["backlog"])
        lines += [
            "",
            f"## The claim's query plans at {largest['details']['backlog']:,} pending",
            "",
            "`EXPLAIN QUERY PLAN` of the statements of a claim transaction, read from the store "
            "at that size (no `ANALYZE`, as a store runs): each walks the head of a partial "
            "index, so a claim's cost does not depend on the backlog.",
            "",
            "```",
        ]
        for name, plan in largest["details"]["claim_plans"].items():
            lines += [f"{name}:", *(f"  {line}" for line in plan)]
        lines.append("```")
    lines += steps.markdown(report) + profiles.markdown(report) + peers.markdown(report)
    lines += ["", "## Sizes", "", "```", *_sizes(report["sizes"]), "```", ""]
    return "\n".join(lines)


_RUNTIME = (
    "The `runtime.*` figures are made by real `postroom worker` (and `postroom dispatch "
    "--receiver`) processes with their default settings (`WorkerSettings()`: concurrency 16, "
    "prefetch automatic, settle_batch 500, linger 2 ms, poll 1 s, duties on), running "
    "`postroom._bench.handlers`. A round receives its tasks one at a time into a paused queue "
    "(not timed), resumes it with every process ready and idle, and lasts from the first "
    "claim to the last task done (or reply delivered), read from the tasks' attempt history "
    "and the replies' `sent_at`. A latency runs from `receive` returning to the handler "
    "starting (the handler returns `time.monotonic()`). An RSS figure is `VmRSS` at the end "
    "of the long run over `VmRSS` after the warm-up.")


def write(report: dict[str, Any], path: Path) -> list[Path]:
    """Write ``render(report)`` to ``path``, and beside it each chart of
    ``plots.plots(report)``; return the charts' paths."""
    path.write_text(render(report), "utf-8")
    written = []
    for name, svg in plots.plots(report).items():
        chart = path.with_name(name)
        chart.write_text(svg, "utf-8")
        written.append(chart)
    return written


def _section(title: str, text: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A titled Markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["", f"## {title}", ""]
    if text:
        lines += [text, ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---|" + "---:|" * (len(header) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _figure(row: dict[str, Any]) -> list[str]:
    """A row of a figures table: label, median, ratio to raw (if any), every round."""
    unit = row["unit"]
    return [row["label"], f"{_number(row['value'], unit)} {unit}",
            "" if row["ratio_to_raw"] is None else f"{row['ratio_to_raw']:.3f}",
            _rounds(row["rounds"], unit)]


def _rounds(values: list[float], unit: str) -> str:
    """Every round, or for the baseline's many rounds their spread (all are in the JSON)."""
    if len(values) <= _LISTED_ROUNDS:
        return ", ".join(_number(value, unit) for value in values)
    low, middle, high = statistics.quantiles(values, n=4)
    return (f"{len(values)} rounds: min {_number(min(values), unit)}, quartiles "
            f"{_number(low, unit)} / {_number(middle, unit)} / {_number(high, unit)}, "
            f"max {_number(max(values), unit)}")


_LISTED_ROUNDS = 12


def _bar(bar: dict[str, Any]) -> list[str]:
    """A row of the bars table: a ratio bar in ``x``, a value bar in its unit."""
    unit = bar["unit"]
    if unit == "x":
        measured, required = f"{bar['measured']:.3f}x", f"{bar['required']}x"
    else:
        measured = f"{_number(bar['measured'], unit)} {unit}"
        required = f"{bar['required']:g} {unit}"
    sign = ">=" if bar["kind"] == "minimum" else "<="
    return [bar["text"], measured, f"{sign} {required}", "pass" if bar["passed"] else "FAIL"]


def _number(value: float, unit: str) -> str:
    """Rates as whole numbers, latencies to a tenth of a millisecond, quotients to 3 places."""
    if unit == "x":
        return f"{value:.3f}"
    return f"{value:,.1f}" if unit == "ms" else f"{value:,.0f}"


def _load(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _sizes(sizes: dict[str, Any]) -> list[str]:
    return [f"{name} = {json.dumps(value)}" for name, value in sizes.items()]
