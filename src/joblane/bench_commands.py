"""`joblane bench`: joblane's side of the benchmarks, with a progress bar and a table."""

from __future__ import annotations

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import bench
from .cli import Fail, _run, console, emit_json

PROFILES = {
    "defaults": {"concurrency": 10},
    "best": {"concurrency": 400, "claim_batch": 200},
}


def plan(workloads: tuple[str, ...], profile: str, scale: float, jobs: int | None) -> list[tuple[str, str, callable]]:
    steps = []
    for w in workloads:
        if w == "a":
            steps.append(("a", "one transaction each", lambda dsn: bench.enqueue_single(dsn, jobs or int(5000 * scale))))
        elif w == "b":
            steps.append(("b", "1,000 per call", lambda dsn: bench.enqueue_bulk(dsn, jobs or int(50_000 * scale))))
        elif w == "c":
            for name in (["defaults", "best"] if profile == "all" else [profile]):
                opts = PROFILES[name]
                steps.append(("c", name, lambda dsn, o=opts, n=name: bench.process(
                    dsn, jobs or int(20_000 * scale), label=n, **o)))
        elif w == "d":
            steps.append(("d", "idle worker", lambda dsn: bench.latency(dsn, jobs or max(50, int(500 * scale)))))
        elif w == "e":
            for sink in ("http", "nats"):
                steps.append(("e", sink, lambda dsn, k=sink: bench.relay(dsn, jobs or int(20_000 * scale), sink=k)))
        elif w == "f":
            for waiting in (10_000, 1_000_000):
                steps.append(("f", f"{waiting:,} waiting", lambda dsn, k=waiting: bench.process(
                    dsn, jobs or int(20_000 * scale), waiting=int(k * scale), label="best", **PROFILES["best"])))
        elif w == "g":
            for notify in (True, False):
                steps.append(("g", f"notify {'on' if notify else 'off'}", lambda dsn, n=notify: bench.concurrent_enqueue(
                    dsn, 8, jobs or int(1000 * scale), notify=n)))
    return steps


@click.command("bench")
@click.option("-w", "--workload", "workloads", multiple=True, type=click.Choice(["a", "b", "c", "d", "e", "f", "g"]),
              help="Workloads to run (repeatable; default a, b, c, d).")
@click.option("--profile", type=click.Choice(["defaults", "best", "all"]), default="all", show_default=True,
              help="Worker settings for workload c.")
@click.option("--scale", type=click.FloatRange(0.001, 100), default=1.0, show_default=True,
              help="Multiply every workload's size.")
@click.option("--jobs", type=click.IntRange(1), help="Jobs per workload (overrides --scale).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per result.")
@click.pass_context
def bench_command(ctx: click.Context, workloads, profile, scale, jobs, as_json) -> None:
    """Measure joblane on this database (DATABASE_URL, else an embedded PostgreSQL); each run in a fresh schema.

    a: enqueue one job per transaction; b: enqueue_many, 1,000 per call;
    c: process pre-filled no-op jobs with one worker; d: enqueue-to-start
    latency; e: the outbox relay to HTTP and NATS; f: c with many jobs waiting;
    g: 8 concurrent enqueuers.
    """
    from .testing import database_url

    dsn = ctx.obj.get("dsn") or database_url()
    steps = plan(workloads or ("a", "b", "c", "d"), profile, scale, jobs)
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("benchmarks", total=len(steps))
        for workload, label, fn in steps:
            progress.update(task, description=f"{workload}: {label}")
            try:
                results.append(_run(lambda: fn(dsn)))
            except Fail:
                raise
            except Exception as exc:  # a broken run is reported, not hidden
                raise Fail(f"workload {workload} ({label}) failed: {exc}") from None
            progress.advance(task)
    if as_json:
        for r in results:
            emit_json(r.as_dict())
        return
    table = Table(title="joblane bench")
    for col in ("workload", "settings", "result"):
        table.add_column(col)
    for r in results:
        if r.workload == "d":
            shown = f"p50 {r.extra['p50_ms']:.2f} ms, p99 {r.extra['p99_ms']:.2f} ms"
        else:
            shown = f"{r.value:,.0f} {r.unit}"
        table.add_row(r.workload, r.settings, shown)
    console.print(table)
