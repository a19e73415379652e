#!/usr/bin/env python3
"""Turn benchmarks/results*.json (and held*.json) into docs/benchmarks.md (tables) and docs/benchmarks.png (a plot).

    python benchmarks/report.py                                  # every benchmarks/results*.json
    python benchmarks/report.py --results benchmarks/results-b.json

Several results files (short runs of a few workloads each: run.py --out)
make one page: each workload is shown from the latest run that has it, with
that run's command, time and commit cost.
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
    "c": "c: process pre-filled no-op jobs, one worker (PGMQ: its consumers) (jobs/s, done in the DB)",
    "d": "d: enqueue-to-start latency, idle worker (ms)",
}


SYSTEM_NAMES = {"joblane": "joblane", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate", "pgmq": "PGMQ"}


def commit_lines(machine: dict) -> list[str]:
    """What a commit cost on the machine, before and after the runs (run.py measures it)."""
    got = [(label, machine.get(key)) for label, key in (("before", "commit_before"), ("after", "commit_after"))]
    shown = [f"{c['commit_ms']:.2f} ms {label} ("
             + (f"{c['commits_per_s']:,} commits/s, " if c.get("commits_per_s") else "")
             + f"round trip {c['round_trip_ms']:.2f} ms)" for label, c in got if c]
    if not shown:
        return []
    return [f"- a commit (a one-row INSERT in autocommit, its WAL flushed) cost {' and '.join(shown)} the runs"]


def commit_text(cost: dict) -> str:
    per_s = f", {cost['commits_per_s']:,} commits/s" if cost.get("commits_per_s") else ""
    return f"a commit cost {cost['commit_ms']:.2f} ms{per_s} (round trip {cost['round_trip_ms']:.2f} ms)"


def h_section(results: dict) -> list[str]:
    """Workload h (benchmarks/workload_h.py): writers and workers at once, joblane beside PgQueuer."""
    rows = sorted(results.values(), key=lambda r: r["system"] != "joblane")
    if not rows:
        return []
    first = rows[0]
    lines = [
        "## h: 8 writers and 2 workers at once, tasks of 5-50 ms failing 2 % of the time",
        "",
        f"{first['writers']} writer threads (an asyncpg connection each) enqueue one job per transaction as fast as "
        f"they can for {first['seconds']:g} s while {first['workers']} worker processes run up to "
        f"{first['concurrency']} tasks each; a task sleeps 5-50 ms and fails 2 % of the time (final, no retry). "
        "Finished: jobs whose task ended within the run, after a warm-up of a tenth of it (at most 5 s); "
        "latency: from just before the enqueue call to the end of the task.",
        "",
        "| system | enqueued | finished (sustained) | enqueue-to-finish p50 | p99 | unfinished when the writers "
        "stopped |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {SYSTEM_NAMES.get(r['system'], r['system'])} | {r['enqueued_per_s']:,.0f} jobs/s | "
                     f"{r['finished_per_s']:,.0f} jobs/s | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | "
                     f"{r['unfinished_at_end']:,} |")
    lines.append("")
    for r in rows:
        cost = f"; {commit_text(r['commit'])}" if r.get("commit") else ""
        lines.append(f"- {SYSTEM_NAMES.get(r['system'], r['system'])}: {r['when']}, `{r['command']}`{cost}")
        if len(r.get("reps", [])) > 1:
            lines.append("  (the median of " + ", ".join(
                f"{x['finished_per_s']:,.0f} jobs/s, p99 {x['p99_ms']:.0f} ms"
                + (f" at a {x['commit']['commit_ms']:.2f} ms commit" if x.get("commit") else "")
                for x in r["reps"]) + ")")
    if len(rows) == 2:
        j, p = rows
        lines += ["", f"joblane / {SYSTEM_NAMES.get(p['system'], p['system'])}: finished "
                      f"{j['finished_per_s'] / p['finished_per_s']:.2f}x, p99 latency "
                      f"{p['p99_ms'] / j['p99_ms']:.2f}x (the peer's over joblane's; higher is better for joblane)"]
    lines.append("")
    return lines


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:  # the `bench` extra: without it the page is written and the plot left as it was
        print(f"matplotlib is not installed: {path} left as it was")
        return

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
    ax.set_title("joblane and peers, same machine (each workload from one run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def held_section(runs: list[dict]) -> list[str]:
    """benchmarks/held_snapshot.py's runs: the last minute of each phase per system, oldest run first."""
    if not runs:
        return []
    lines = [
        "## Held snapshot",
        "",
        "One worker at each library's defaults, a producer committing R jobs/s one per transaction (two "
        "connections at R/2), for joblane the relay at M messages/s to a sink that drops them; after the "
        "warm-up a session idles in a REPEATABLE READ transaction that has taken its snapshot, then commits. "
        "Each system in turn in a fresh database of a cluster with PostgreSQL's defaults (autovacuum on) plus "
        "pg_stat_statements. A cell is the last minute of the phase (the whole phase when shorter). Pick-up: "
        "from just before the job's INSERT to its handler's start; claim: the claim statement's mean time; "
        "entries/claim: index entries read per claim (`jobs_ready` up to schema version 12; from version 13, in runs whose file is named held-v13* or later (held-v17*), the entries and cursor rows of the claim's lanes); WAL: the cluster's WAL per job enqueued; tables: "
        "heap + indexes of the system's tables. Offered is what the producer committed: on a busy 2-core "
        "machine it can fall short of R.",
        "",
    ]

    def ms(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v / 1000:,.1f} s" if v >= 1000 else f"{v:,.1f} ms"

    for run in sorted(runs, key=lambda r: r["when"]):
        st = run["settings"]
        m = run["machine"]
        costs = [c for c in (m.get("commit_before"), m.get("commit_after")) if c]
        shown = ", then ".join(f"{c['commit_ms']:.2f} ms" for c in costs)
        cost = f"; a commit cost {shown} (before, after)" if costs else ""
        lines += [f"R = {st['rate']:,.0f} jobs/s, relay {st['relay_rate']:,.0f} messages/s, "
                  f"warm-up {st['warmup']:g} s, hold {st['hold']:g} s, after {st['after']:g} s: {run['when']}, "
                  f"`{run['command']}`{cost}", "",
                  "| system | phase | offered/s | finished/s | pick-up p50 / p99 | claim | entries/claim | WAL/job | "
                  "backlog | dead tuples | tables |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        notes = []
        for r in run["results"]:
            name = SYSTEM_NAMES.get(r["system"], r["system"])
            if "error" in r:
                lines.append(f"| {name} | {r['error']} |||||||||")
                continue
            s = r["summary"]
            for phase, label in (("before", "before"), ("hold", "end of the hold"), ("after", "after")):
                if phase not in s:
                    continue
                p = s[phase]
                claim = "-" if p["claim_ms"] is None else f"{p['claim_ms']:.2f} ms"
                entries = "" if p.get("index_entries_per_claim") is None else f"{p['index_entries_per_claim']:,}"
                wal = "" if p.get("wal_bytes_per_job") is None else f"{p['wal_bytes_per_job']:,} B"
                lines.append(f"| {name} | {label} | {p['offered_per_s']:,.0f} | {p['finished_per_s']:,.0f} | "
                             f"{ms(p['p50_ms'])} / {ms(p['p99_ms'])} | {claim} | {entries} | {wal} | "
                             f"{p['backlog']:,} | {p['dead_tuples']:,} | "
                             f"{p['heap_mb']:,.0f} + {p['index_mb']:,.0f} MB |")
            if "hold_peak_backlog" in s:
                rec = s.get("recovered_after_s")
                notes.append(f"- {name}: " + (f"backlog under one second of work {rec:g} s after the release"
                                              if rec is not None else "backlog still over one second of work at "
                                              "the end") + (f"; relay in the hold {s['hold']['relay_per_s']:,.0f} "
                                                            f"messages/s, p99 {ms(s['hold']['relay_p99_ms'])}"
                                                            if "relay_per_s" in s.get("hold", {}) else ""))
        lines += ["", *notes, ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", action="append",
                        help="results of run.py (repeatable: a later file's workloads replace an earlier one's; "
                             "default every benchmarks/results*.json, oldest run first)")
    parser.add_argument("--extra", default=str(HERE / "extra.jsonl"),
                        help="joblane bench --json lines of workloads e, f, g (joblane alone)")
    parser.add_argument("--h", default=str(HERE / "h.json"), help="workload_h.py's results (joblane and PgQueuer)")
    parser.add_argument("--held", action="append",
                        help="held_snapshot.py's results (repeatable; default every benchmarks/held*.json)")
    args = parser.parse_args()
    paths = args.results or [str(p) for p in sorted(HERE.glob("results*.json"))]
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    # run.py's files only (results-cursor-probe.json is cursor_probe.py's, reported in docs/architecture.md)
    runs = sorted((run for run in loaded if "when" in run and "ratios" in run), key=lambda run: run["when"])
    source: dict[str, int] = {}  # workload -> the run it is shown from
    for i, run in enumerate(runs):
        for r in run["results"]:
            source[r["workload"]] = i
    results = [r for i, run in enumerate(runs) for r in run["results"] if source[r["workload"]] == i]
    ratios = [x for i, run in enumerate(runs) for x in run["ratios"] if source[x["workload"]] == i]
    DOCS.mkdir(exist_ok=True)
    systems = {r["system"] for r in results}
    names = [SYSTEM_NAMES.get(s, s) for s in sorted(systems, key=lambda s: (s != "joblane", s))]
    if len(names) < 2:
        names = names * 2
    lines = [
        "# Benchmarks",
        "",
        f"{', '.join(names[:-1])} and {names[-1]} measured on the same machine and the same PostgreSQL,",
        "taking turns within each run, each measurement in a fresh process and a fresh database or schema.",
        "Compare the ratios within a run; absolute numbers depend on the machine (and this one is shared",
        "and noisy: other engineers' test suites run on its 2 cores).",
        "",
    ]
    used = sorted(set(source.values()))
    for i in used:
        run = runs[i]
        shown = ", ".join(w for w in sorted(source) if source[w] == i)
        lines += [
            f"- {'run' if len(used) == 1 else f'workloads {shown}'}: {run['when']}, "
            f"`{run['command']}`, {run['reps']} repetitions (medians below), sizes x{run['scale']}",
            *["  " + line[2:] for line in commit_lines(run["machine"])],
        ]
    machine = runs[used[-1]]["machine"]
    lines += [
        f"- machine: {machine['cpus']} cores, {machine['platform']}, Python {machine['python']}; "
        "then `python benchmarks/report.py` (every `benchmarks/results*.json`, a workload from the latest run that has it)",
        "- workloads as in peers.md: c is timed from worker start until a separate connection sees no unfinished job;",
        "  `defaults` is concurrency 10 with each library's other defaults, `best` each library's fastest settings",
        "  (joblane: 400 in flight, claims of 200; PgQueuer: batch 200, 400 tasks; Procrastinate: concurrency 20;",
        "  PGMQ: 4 consumers reading 200 and deleting each batch with one call, `defaults` one consumer reading 10",
        "  and deleting each message; d: PGMQ's `read_with_poll` every 10 ms).",
        "- b: joblane's `-` row is `App.enqueue_many` of `JobSpec`s, `typed` the task's bulk form",
        "  (`task.enqueue_many(conn, payloads)`, a list of payloads as PGMQ's `send_batch` takes a list of",
        "  messages), `notify off` the first with `App(notify=False)`; each call is its own transaction.",
        "- PGMQ is installed from the SQL-only install file its Python client ships (no extension); every call",
        "  goes through its async client (asyncpg) on held connections.",
        "- the attempts audit stays on for joblane (one `attempts` row per try).",
        "",
    ]
    for workload in ("a", "b", "c", "d"):
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        lines += [f"## {NAMES[workload]}", "", "| system | settings | median | runs |", "|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (r["profile"], r["system"] != "joblane", r["system"])):
            shown = (f"p50 {r['median']:.2f} ms, p99 {r['p99_median']:.2f} ms" if workload == "d"
                     else f"{r['median']:,.0f}")
            lines.append(f"| {r['system']} | {r['profile']} | {shown} | {r['runs']} |")
        got = [x for x in ratios if x["workload"] == workload]
        if got:
            lines += ["", "joblane / peer (higher is better for joblane; for d, the peer's latency over joblane's):", ""]
            lines += [f"- {x['profile'] + ': ' if x['profile'] != '-' else ''}{x['ratio']:.2f}x {x['peer']}"
                      for x in got]
        lines.append("")
    h_path = Path(args.h)
    if h_path.exists():
        lines += h_section(json.loads(h_path.read_text())["results"])
    extra_path = Path(args.extra)
    if extra_path.exists():
        extra = [json.loads(line) for line in extra_path.read_text().splitlines() if line.strip()]
        lines += ["## Extra workloads (joblane alone)", "",
                  "e: outbox rows delivered by one relay (to a local HTTP receiver that answers at once, one",
                  "request per message and, opted in, 100 messages per request; to NATS JetStream beside the bare",
                  "nats-py client publishing as many messages of the same size, pipelined, in the same run);",
                  "f: workload c with jobs waiting in the same queue (scheduled later, so the claim walks the",
                  "partial index past nothing), and with 10,000,000 finished jobs in history beside none; "
                  "g: 8 threads enqueueing one job per transaction, with and without",
                  "the wake-up notification.", "",
                  "`python -m joblane bench -w f -w g --json > benchmarks/extra.jsonl` and "
                  "`python -m joblane bench -w e --json >> benchmarks/extra.jsonl` (three runs, 20,000 rows each)", "",
                  "| workload | settings | result |", "|---|---|---|"]
        for r in extra:
            shown = f"{r['value']:,.0f} {r['unit']}"
            if "bare_rate" in r:
                shown += f" ({r['ratio']:.2f}x the bare client's {r['bare_rate']:,.0f}/s)"
            lines.append(f"| {r['workload']} | {r['settings']} | {shown} |")
        costs = {json.dumps(r["machine"], sort_keys=True): r["machine"] for r in extra if r.get("machine")}
        lines += ["", *[f"- {commit_text(c)} (measured by `joblane bench` at the start of a run)"
                        for c in costs.values()]]
        lines.append("")
    held = args.held or [str(p) for p in sorted(HERE.glob("held*.json"))]
    lines += held_section([json.loads(Path(p).read_text()) for p in held])
    plot(results, DOCS / "benchmarks.png")
    lines += ["![jobs/s per system](benchmarks.png)", ""]
    notes = HERE / "notes.md"
    if notes.exists():  # where the time goes, measured by hand on the same machine
        lines += [notes.read_text().rstrip(), ""]
    (DOCS / "benchmarks.md").write_text("\n".join(lines))
    print(f"wrote {DOCS / 'benchmarks.md'} and {DOCS / 'benchmarks.png'}")


if __name__ == "__main__":
    main()
