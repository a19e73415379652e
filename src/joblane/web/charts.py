"""The overview's throughput chart and the history page's charts, drawn on the server as SVG geometry (no
script, nothing fetched)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Bar:
    x: float
    width: float
    finished_y: float
    finished_h: float
    failed_y: float
    failed_h: float
    label: str


@dataclass
class Chart:
    width: int
    height: int
    top: int
    bottom: int
    left: int
    bars: list[Bar]
    peak: int
    total_finished: int
    total_failed: int
    ticks: list[tuple[float, str]]
    gridlines: list[tuple[float, str]]


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^n that is at least ``value``."""
    if value <= 1:
        return 1
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def throughput_chart(minutes: list[dict[str, int]], *, width: int = 1200, height: int = 200) -> Chart:
    """One bar per minute, oldest on the left: finished jobs, with the failed ones in red at the foot."""
    top, bottom, left, right = 12, 24, 44, 8
    plot_w = width - left - right
    plot_h = height - top - bottom
    n = max(1, len(minutes))
    slot = plot_w / n
    peak = nice_ceiling(max((m["finished"] for m in minutes), default=0))
    bars = []
    for i, m in enumerate(minutes):
        fin_h = plot_h * m["finished"] / peak
        fail_h = plot_h * min(m["failed"], m["finished"]) / peak
        ago = m["ago"]
        when = "this minute" if ago == 0 else f"{ago} min ago"
        bars.append(Bar(
            x=round(left + i * slot + slot * 0.1, 2), width=round(slot * 0.8, 2),
            finished_y=round(top + plot_h - fin_h, 2), finished_h=round(fin_h, 2),
            failed_y=round(top + plot_h - fail_h, 2), failed_h=round(fail_h, 2),
            label=f"{when}: {m['finished']} finished, {m['failed']} failed",
        ))
    ticks = []
    for i, m in enumerate(minutes):
        if m["ago"] % 15 == 0:
            ticks.append((round(left + (i + 0.5) * slot, 2), "now" if m["ago"] == 0 else f"-{m['ago']}m"))
    gridlines = [(round(top + plot_h - plot_h * f, 2), f"{peak * f:g}") for f in (0.0, 0.5, 1.0)]
    return Chart(width=width, height=height, top=top, bottom=bottom, left=left, bars=bars, peak=peak,
                 total_finished=sum(m["finished"] for m in minutes),
                 total_failed=sum(m["failed"] for m in minutes), ticks=ticks, gridlines=gridlines)


def _clock(at: dt.datetime, bucket_seconds: int) -> str:
    """A bucket's start as a tick reads: 14:05 within a day, Mon 14:00 across days (UTC)."""
    at = at.astimezone(dt.timezone.utc)
    return at.strftime("%H:%M") if bucket_seconds < 3600 else at.strftime("%a %H:%M")


def history_chart(buckets: list[dict[str, Any]], bucket_seconds: int, *, width: int = 1200,
                  height: int = 160) -> Chart:
    """One bar per bucket of the history page (five minutes or an hour), oldest on the left: the attempts that
    finished done or failed, the failed ones in red at the foot. ``buckets``: {"at", "done", "failed"}."""
    top, bottom, left, right = 12, 24, 44, 8
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(1, len(buckets))
    slot = plot_w / n
    peak = nice_ceiling(max((b["done"] + b["failed"] for b in buckets), default=0))
    span = "5 min" if bucket_seconds < 3600 else "hour"
    bars = []
    for i, b in enumerate(buckets):
        fin_h = plot_h * (b["done"] + b["failed"]) / peak
        fail_h = plot_h * b["failed"] / peak
        bars.append(Bar(
            x=round(left + i * slot + slot * 0.1, 2), width=round(max(slot * 0.8, 0.5), 2),
            finished_y=round(top + plot_h - fin_h, 2), finished_h=round(fin_h, 2),
            failed_y=round(top + plot_h - fail_h, 2), failed_h=round(fail_h, 2),
            label=f"the {span} from {_clock(b['at'], bucket_seconds)} UTC: {b['done']} done, {b['failed']} failed",
        ))
    every = max(1, round(n / (8 if width >= 1000 else 4)))  # a few labels, whatever the range
    ticks = [(round(left + (i + 0.5) * slot, 2), _clock(b["at"], bucket_seconds))
             for i, b in enumerate(buckets) if i % every == 0]
    gridlines = [(round(top + plot_h - plot_h * f, 2), f"{peak * f:g}") for f in (0.0, 0.5, 1.0)]
    return Chart(width=width, height=height, top=top, bottom=bottom, left=left, bars=bars, peak=peak,
                 total_finished=sum(b["done"] for b in buckets), total_failed=sum(b["failed"] for b in buckets),
                 ticks=ticks, gridlines=gridlines)


@dataclass
class Point:
    x: float
    y: float
    label: str


@dataclass
class LineChart:
    width: int
    height: int
    left: int
    lines: dict[str, list[Point]]  # by name (p50, p95): the points of the buckets that had jobs
    ticks: list[tuple[float, str]]
    gridlines: list[tuple[float, str]]

    def path(self, name: str) -> str:
        """The SVG points attribute of line ``name``."""
        return " ".join(f"{p.x},{p.y}" for p in self.lines.get(name, []))


def latency_chart(buckets: list[dict[str, Any]], bucket_seconds: int, *, width: int = 1200,
                  height: int = 140) -> LineChart:
    """Enqueue-to-start latency of first tries per bucket: p50 and p95 as lines on a log scale (1 ms to the
    peak), a point per bucket that started jobs. ``buckets``: {"at", "jobs", "p50", "p95"} (seconds or None)."""
    top, bottom, left, right = 12, 24, 56, 8
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(1, len(buckets))
    slot = plot_w / n
    values = [b[k] for b in buckets for k in ("p50", "p95") if b.get(k)]
    low = 0.001
    high = max([low * 10, *values])
    decades = math.log10(high / low)

    def y(seconds: float) -> float:
        return round(top + plot_h - plot_h * math.log10(max(seconds, low) / low) / decades, 2)

    lines: dict[str, list[Point]] = {"p50": [], "p95": []}
    for i, b in enumerate(buckets):
        if not b.get("jobs"):
            continue
        x = round(left + (i + 0.5) * slot, 2)
        for name in ("p50", "p95"):
            if b.get(name) is not None:
                lines[name].append(Point(x, y(b[name]), f"{_clock(b['at'], bucket_seconds)} UTC: {name} "
                                         f"{_seconds(b[name])} over {b['jobs']} first tries"))
    every = max(1, round(n / 8))
    ticks = [(round(left + (i + 0.5) * slot, 2), _clock(b["at"], bucket_seconds))
             for i, b in enumerate(buckets) if i % every == 0]
    marks = [s for s in (0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0) if s <= high]
    gridlines = [(y(s), _seconds(s)) for s in marks]
    if y(marks[-1]) - y(high) > 12:  # the top of the scale is the slowest bucket's figure: label it too
        gridlines.append((y(high), _seconds(high)))
    return LineChart(width=width, height=height, left=left, lines=lines, ticks=ticks, gridlines=gridlines)


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    return f"{value / 60:.0f} min"
