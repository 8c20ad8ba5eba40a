"""The scaling curves of a report, drawn as SVG line charts (no plotting library).

``plots(report)`` gives each chart the report has the measurements for, by file name:

- ``claim_backlog.svg``: claim+finish tasks/s of one worker against the pending backlog
  (a logarithmic axis), one line per backend: SPEC §3's "claim cost must not grow with the
  backlog", seen;
- ``pg_workers.svg``: tasks/s of ``postroom worker`` processes on PostgreSQL against how many
  run, beside the raw PostgreSQL commit loop of the same rounds.

Each point is a measurement's median round, with a whisker from its slowest to its fastest
round. ``report.write`` puts the charts beside the Markdown it writes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from postroom._bench.scenarios.claim_backlog import ROWS

__all__ = ["Series", "line_chart", "plots"]

_WIDTH, _HEIGHT = 640, 400
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 48, 48, 56
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass(frozen=True)
class Series:
    """One line: its name and its points ``(x, median, least, most)``."""

    name: str
    points: Sequence[tuple[float, float, float, float]]


def plots(report: dict[str, Any]) -> dict[str, str]:
    """The charts ``report``'s measurements make, as SVG text by file name."""
    rows = report["measurements"]
    charts: dict[str, str] = {}
    backlog = [_series(name, [row for row in rows if row["id"].startswith(ROWS[backend])],
                       "backlog")
               for name, backend in (("SQLite", "sqlite"), ("PostgreSQL", "postgres"))]
    backlog = [series for series in backlog if series.points]
    if backlog:
        charts["claim_backlog.svg"] = line_chart(
            backlog, title="claim+finish, one worker, against the pending backlog",
            x_label="tasks pending (log scale)", y_label="tasks/s", log_x=True)
    workers = [row for row in rows if row["id"].startswith("runtime.pg.workers_")]
    if workers:
        raw = [_point(row["details"]["workers"], row["details"]["raw_pg_rates"])
               for row in workers if row["details"].get("raw_pg_rates")]
        series = [_series("postroom worker processes", workers, "workers")]
        if raw:
            series.append(Series("raw PostgreSQL commit loop (1 connection)",
                                 sorted(raw)))
        charts["pg_workers.svg"] = line_chart(
            series, title="PostgreSQL: tasks/s against postroom worker processes",
            x_label="worker processes", y_label="tasks/s (commits/s for the raw loop)",
            log_x=True)
    return charts


def _series(name: str, rows: list[dict[str, Any]], key: str) -> Series:
    return Series(name, sorted(_point(row["details"][key], row["rounds"]) for row in rows))


def _point(x: float, rounds: Sequence[float]) -> tuple[float, float, float, float]:
    return float(x), statistics.median(rounds), min(rounds), max(rounds)


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
               log_x: bool = False) -> str:
    """An SVG line chart of ``series``; the y axis starts at 0, so flat means flat."""
    xs = [point[0] for line in series for point in line.points]
    top = max(point[3] for line in series for point in line.points) * 1.1 or 1.0
    low, high = (math.log10(min(xs)), math.log10(max(xs))) if log_x else (min(xs), max(xs))
    span = (high - low) or 1.0
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def at_x(x: float) -> float:
        return _LEFT + ((math.log10(x) if log_x else x) - low) / span * plot_w

    def at_y(y: float) -> float:
        return _TOP + plot_h - y / top * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
           f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
           f'<text x="{_WIDTH / 2}" y="24" text-anchor="middle" font-size="14">'
           f'{escape(title)}</text>']
    step = _nice_step(top / 5)
    tick = 0.0
    while tick <= top:
        y = at_y(tick)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_WIDTH - _RIGHT}" y2="{y:.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{tick:,.0f}</text>')
        tick += step
    for x in sorted(set(xs)):
        out.append(f'<text x="{at_x(x):.1f}" y="{_TOP + plot_h + 18}" text-anchor="middle">'
                   f'{x:,.0f}</text>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_WIDTH - _RIGHT}" '
               f'y2="{_TOP + plot_h}" stroke="black"/>')
    out.append(f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" '
               'stroke="black"/>')
    out.append(f'<text x="{_LEFT + plot_w / 2}" y="{_HEIGHT - 14}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text x="16" y="{_TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {_TOP + plot_h / 2})">{escape(y_label)}</text>')
    for index, line in enumerate(series):
        colour = _COLOURS[index % len(_COLOURS)]
        path = " ".join(f"{at_x(x):.1f},{at_y(median):.1f}" for x, median, _, _ in line.points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                   'stroke-width="2"/>')
        for x, median, least, most in line.points:
            out.append(f'<line x1="{at_x(x):.1f}" y1="{at_y(least):.1f}" x2="{at_x(x):.1f}" '
                       f'y2="{at_y(most):.1f}" stroke="{colour}"/>')
            out.append(f'<circle cx="{at_x(x):.1f}" cy="{at_y(median):.1f}" r="3.5" '
                       f'fill="{colour}"><title>{escape(line.name)}: {x:,.0f} → '
                       f'{median:,.0f}</title></circle>')
        legend_y = _TOP + 8 + index * 18
        out.append(f'<rect x="{_LEFT + 12}" y="{legend_y - 9}" width="14" height="3" '
                   f'fill="{colour}"/>')
        out.append(f'<text x="{_LEFT + 32}" y="{legend_y - 4}">{escape(line.name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_step(rough: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``rough``."""
    if rough <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(rough))
    return next(power * factor for factor in (1.0, 2.0, 5.0, 10.0) if power * factor >= rough)
