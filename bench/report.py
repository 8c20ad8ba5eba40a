"""The report as ``RESULTS.md``: the command, the machine, the figures, the bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "render", "write"]

#: Where a full run writes its results by default.
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def render(report: dict[str, Any]) -> str:
    """Markdown for one run's report."""
    info = report["machine"]
    load = report["load_average"]
    lines = [
        "# postroom benchmark results",
        "",
        f"Written by `{report['command']}` ({report['mode']} run) on {report['started']}, "
        f"in {report['elapsed_s']:.0f} s. Run the same command to reproduce and rewrite "
        "this file.",
        "",
        "Every ratio divides a figure by the raw SQLite commit loop measured in the same run "
        "(WAL, `synchronous=FULL`, one row per `BEGIN IMMEDIATE` transaction, on the same "
        "file system). Baseline rounds sandwich every timed round; a round's ratio is its rate "
        "over the mean of the two baseline rounds around it, and each figure shows the median "
        "rate and the median ratio of its rounds (every round is in the JSON that "
        "`postroom bench` prints). A bar between two figures divides their ratios.",
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
        "",
        "## Figures",
        "",
        "| measurement | rate (median) | ratio to raw commits/s (median) | rounds |",
        "|---|---:|---:|---|",
    ]
    for row in report["measurements"]:
        rounds = ", ".join(f"{value:,.0f}" for value in row["rounds"])
        ratio = "" if row["ratio_to_raw"] is None else f"{row['ratio_to_raw']:.3f}"
        lines.append(f"| {row['label']} | {row['value']:,.0f} {row['unit']} | {ratio} | "
                     f"{rounds} |")
    lines += [
        "",
        "## Bars",
        "",
        "| bar | measured | required | result |",
        "|---|---:|---:|---|",
    ]
    for bar in report["bars"]:
        lines.append(f"| {bar['text']} | {bar['measured']:.3f}x | >= {bar['required']}x | "
                     f"{'pass' if bar['passed'] else 'FAIL'} |")
    cycles = [row for row in report["measurements"] if "us_per_task_in_commits" in row["details"]]
    if cycles:
        lines += [
            "",
            "## Where a claim+finish cycle's time goes",
            "",
            "One extra round per backlog size, after the timed ones, split the same way: the "
            "statements' own cost is what a growing backlog could make grow; the commits' "
            "cost is the disk's (and the write-back of checkpoints into a larger file).",
            "",
            "| backlog | us in commits | us in statements | us in Python |",
            "|---:|---:|---:|---:|",
        ]
        for row in cycles:
            details = row["details"]
            lines.append(f"| {details['backlog']:,} | {details['us_per_task_in_commits']:.0f} | "
                         f"{details['us_per_task_in_statements']:.0f} | "
                         f"{details['us_per_task_elsewhere']:.0f} |")
    split = [row for row in report["measurements"] if "database_share" in row["details"]]
    if split:
        lines += [
            "",
            "## Where an end-to-end task's time goes",
            "",
            "One extra round per scenario, after the timed ones, clocks the time spent inside "
            "the database driver (statements, commits and the fsyncs they wait for). The rest "
            "is postroom's Python. The last column divides the ratio by the database's share: "
            "the ratio postroom would reach if its Python took no time, i.e. the most that "
            "optimizing Python can give with these statements, transactions and schema. Each "
            "scenario starts from empty databases, which grow by every round's tasks; the "
            "rounds above are in order, so a trend in them is the cost of a growing store.",
            "",
            "| measurement | commits per task | share of time in the database | "
            "ratio if Python took no time | tasks in the store at the end |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in split:
            details = row["details"]
            lines.append(f"| {row['label']} | {details['commits_per_task']:g} | "
                         f"{details['database_share']:.0%} | "
                         f"{details['ratio_if_python_were_free']:.3f} | "
                         f"{details['tasks_in_store_at_end']:,} |")
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
    lines += ["", "## Sizes", "", "```", *_sizes(report["sizes"]), "```", ""]
    return "\n".join(lines)


def write(report: dict[str, Any], path: Path) -> None:
    """Write ``render(report)`` to ``path``."""
    path.write_text(render(report), "utf-8")


def _load(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _sizes(sizes: dict[str, Any]) -> list[str]:
    return [f"{name} = {value!r}" for name, value in sizes.items()]
