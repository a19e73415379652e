"""The overview's throughput chart, drawn on the server as SVG geometry (no script, nothing fetched)."""

from __future__ import annotations

from dataclasses import dataclass


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
