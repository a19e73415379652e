#!/usr/bin/env python3
"""Turn benchmarks/results.json into docs/benchmarks.md (tables) and docs/benchmarks.png (a plot).

    python benchmarks/report.py [--results benchmarks/results.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs"

NAMES = {
    "a": "a: enqueue, one transaction each (jobs/s)",
    "b": "b: bulk enqueue, 1,000 per call (jobs/s)",
    "c": "c: process pre-filled no-op jobs, one worker (jobs/s, done in the DB)",
    "d": "d: enqueue-to-start latency, idle worker (ms)",
}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{r['workload']} {r['profile'] if r['profile'] != '-' else ''}".strip(), r["system"], r["median"])
            for r in results if r["workload"] in ("a", "b", "c")]
    groups = sorted({b[0] for b in bars})
    systems = sorted({b[1] for b in bars}, key=lambda s: (s != "joblane", s))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        values = [next((v for g, s, v in bars if g == group and s == system), 0) for group in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=system)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylabel("jobs/s (median)")
    ax.set_yscale("log")
    ax.set_title("joblane and peers, same machine, same run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default=str(HERE / "results.json"))
    parser.add_argument("--extra", default=str(HERE / "extra.jsonl"),
                        help="joblane bench --json lines of workloads e, f, g (joblane alone)")
    args = parser.parse_args()
    data = json.loads(Path(args.results).read_text())
    DOCS.mkdir(exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "joblane, PgQueuer and Procrastinate measured in one run on the same machine and the same",
        "PostgreSQL, taking turns, each measurement in a fresh process and a fresh database or schema.",
        "Compare the ratios; absolute numbers depend on the machine (and this one is shared and noisy).",
        "",
        f"- when: {data['when']}",
        f"- machine: {data['machine']['cpus']} cores, {data['machine']['platform']}, Python {data['machine']['python']}",
        f"- command: `{data['command']}` then `python benchmarks/report.py`",
        f"- repetitions: {data['reps']} (medians below), sizes x{data['scale']}",
        "- workloads as in peers.md: c is timed from worker start until a separate connection sees no unfinished job;",
        "  `defaults` is concurrency 10 with each library's other defaults, `best` each library's fastest settings",
        "  (joblane: 400 in flight, claims of 200; PgQueuer: batch 200, 400 tasks; Procrastinate: concurrency 20).",
        "- the attempts audit stays on for joblane (one `attempts` row per try).",
        "",
    ]
    for workload in ("a", "b", "c", "d"):
        rows = [r for r in data["results"] if r["workload"] == workload]
        if not rows:
            continue
        lines += [f"## {NAMES[workload]}", "", "| system | settings | median | runs |", "|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (r["profile"], r["system"] != "joblane", r["system"])):
            shown = (f"p50 {r['median']:.2f} ms, p99 {r['p99_median']:.2f} ms" if workload == "d"
                     else f"{r['median']:,.0f}")
            lines.append(f"| {r['system']} | {r['profile']} | {shown} | {r['runs']} |")
        ratios = [x for x in data["ratios"] if x["workload"] == workload]
        if ratios:
            lines += ["", "joblane / peer (higher is better for joblane; for d, the peer's latency over joblane's):", ""]
            lines += [f"- {x['profile'] + ': ' if x['profile'] != '-' else ''}{x['ratio']:.2f}x {x['peer']}"
                      for x in ratios]
        lines.append("")
    extra_path = Path(args.extra)
    if extra_path.exists():
        extra = [json.loads(line) for line in extra_path.read_text().splitlines() if line.strip()]
        lines += ["## Extra workloads (joblane alone)", "",
                  "e: outbox rows delivered by one relay; f: workload c with jobs waiting in the same queue",
                  "(scheduled later, so the claim walks the partial index past nothing); g: 8 threads enqueueing",
                  "one job per transaction, with and without the wake-up notification.", "",
                  "`python -m joblane bench -w f -w g --json > benchmarks/extra.jsonl` and "
                  "`python -m joblane bench -w e --jobs 5000 --json >> benchmarks/extra.jsonl`", "",
                  "| workload | settings | result |", "|---|---|---|"]
        for r in extra:
            lines.append(f"| {r['workload']} | {r['settings']} | {r['value']:,.0f} {r['unit']} |")
        lines.append("")
    plot(data["results"], DOCS / "benchmarks.png")
    lines += ["![jobs/s per system](benchmarks.png)", ""]
    notes = HERE / "notes.md"
    if notes.exists():  # where the time goes, measured by hand on the same machine
        lines += [notes.read_text().rstrip(), ""]
    (DOCS / "benchmarks.md").write_text("\n".join(lines))
    print(f"wrote {DOCS / 'benchmarks.md'} and {DOCS / 'benchmarks.png'}")


if __name__ == "__main__":
    main()
