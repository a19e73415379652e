"""`joblane budgets|cache|dataset|compare`: spend caps, the step cache, the dataset export, replay comparisons."""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from typing import Any, Iterator

import click
from rich.markup import escape

from .. import admin, budgets as budget_rules, rules
from .common import (Duration, Fail, Once, Table, app_from_context, console, emit_json, jsonable, needs_extra,
                     print_table, run_or_fail, show_time)

# -- budgets (spend caps) --------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def budgets(ctx: click.Context, as_json: bool) -> None:
    """Spend caps: each key's spend in the current window against its cap, and the jobs held back."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: admin.budget_status(app))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no budgets (app.budget or `joblane budgets set`)")
        return
    table = Table(title=f"budgets (schema {app.schema})")
    for col in ("budget", "queue", "key", "spent", "in flight", "cap", "cap from", "window ends", "waiting"):
        table.add_column(col, overflow="fold")
    for r in rows:
        per = budget_rules.describe_window(r["window_seconds"])
        key = "-" if r["key"] is None else (f"{r['key_field']}={r['key']}" if r["key_field"] else "(queue)")
        spent = f"{r['spent']:g}" + (" [bold red]at cap[/bold red]" if r["at_cap"] else "")
        table.add_row(escape(r["budget"]), escape(r["queue"]), escape(key), spent, f"{r['in_flight']:g}",
                      f"{r['cap']:g} per {per}", escape(admin.describe_cap_source(r)), show_time(r["window_end"]),
                      str(r["waiting"]))
    print_table(table)


@budgets.command("set")
@click.argument("name")
@click.option("--queue", cls=Once, help="The queue whose jobs it caps (needed for a new budget).")
@click.option("--cap", type=float, required=True, help="The most a key may spend per window.")
@click.option("--per", "per", help="The window: hour, day, month, or a duration such as 10m (needed for a new budget).")
@click.option("--key", help="Payload field of the key (dotted path), e.g. tenant; none: one cap for the queue.")
@click.option("--estimate", default="estimated_cost", show_default=True,
              help="Payload field holding a job's estimated cost.")
@click.option("--default-estimate", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Estimate of a job whose payload has none.")
@click.option("--cost-field", default="cost", show_default=True,
              help="Field of attempts.meta holding what a try cost (job.record(cost=...)).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def budgets_set(ctx: click.Context, name, queue, cap, per, key, estimate, default_estimate, cost_field,
                as_json) -> None:
    """Create or replace budget NAME, or with --cap alone change its cap (raising it lets held-back jobs start).

    A cap set here stands over the one an app declares (app.budget), across worker restarts, until
    `joblane budgets reset NAME`.
    """
    app = app_from_context(ctx)
    if queue is None and per is None:
        if not run_or_fail(lambda: admin.set_budget_cap(app, name, cap)):
            raise Fail(f"no budget {name!r}: give --queue and --per to create it")
        described = f"cap {cap:g}"
    else:
        if queue is None or per is None:
            raise Fail("a new budget needs --queue and --per (hour, day, month or a duration)")
        window = {"hour": {"per_hour": cap}, "day": {"per_day": cap}, "month": {"per_month": cap}}.get(
            per, {"cap": cap, "window": per})
        budget = run_or_fail(lambda: budget_rules.make_budget(
            name, queue=queue, key=key, estimate=estimate, default_estimate=default_estimate,
            cost_field=cost_field, **window))
        run_or_fail(lambda: admin.save_budget(app, budget))
        described = budget.describe()
    if as_json:
        emit_json({"budget": name, "set": described})
    else:
        console.print(f"budget {escape(name)}: {escape(described)}")


@budgets.command("reset")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def budgets_reset(ctx: click.Context, name, as_json: bool) -> None:
    """Drop the cap an operator set on budget NAME: the cap its app declares is in force again."""
    app = app_from_context(ctx)
    cap = run_or_fail(lambda: admin.reset_budget_cap(app, name))
    if cap is None:
        raise Fail(f"budget {name!r} has no cap declared in code (or does not exist): set one with "
                   f"`joblane budgets set {name} --cap N` or remove it with `joblane budgets clear {name}`")
    if as_json:
        emit_json({"budget": name, "cap": cap, "cap_source": "code"})
    else:
        console.print(f"budget {escape(name)}: cap {cap:g}, as declared in code")


@budgets.command("clear")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def budgets_clear(ctx: click.Context, name, as_json: bool) -> None:
    """Remove budget NAME with its spend records.

    A budget an app declares comes back at the next worker start, at its declared cap; to drop only the
    cap an operator set and keep the spend, use `joblane budgets reset NAME`.
    """
    app = app_from_context(ctx)
    if not run_or_fail(lambda: admin.remove_budget(app, name)):
        raise Fail(f"no budget {name!r} (see `joblane budgets`)")
    if as_json:
        emit_json({"budget": name, "cleared": True})
    else:
        console.print(f"budget {escape(name)} removed")


# -- the step cache ----------------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cache(ctx: click.Context, as_json: bool) -> None:
    """The shared cache of step results (job.step(..., cache=True)); alone, its stats."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(cache_stats, as_json=as_json)


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cache_stats(ctx: click.Context, as_json: bool) -> None:
    """Per cached step: stored results, hits, and the tokens and cost the hits saved."""
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: admin.cache_stats(app))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("the step cache is empty")
        return
    table = Table(title=f"step cache (schema {app.schema})")
    for col in ("step", "results", "expired", "in progress", "hits", "tokens saved", "cost saved", "last hit"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(escape(r["step"]), str(r["entries"]), str(r["expired"]), str(r["calls_in_progress"]),
                      str(r["hits"]), f"{r['tokens_saved']:g}", f"{r['cost_saved']:g}", show_time(r["last_hit"]))
    print_table(table)


@cache.command("clear")
@click.option("--older-than", "older_than", type=Duration(),
              help="Only results stored longer ago than this (7d, 12h); expired ones always go.")
@click.option("--step", help="Only this step's results.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cache_clear(ctx: click.Context, older_than, step, as_json: bool) -> None:
    """Delete cached step results (calls in progress stay)."""
    app = app_from_context(ctx)
    n = run_or_fail(lambda: admin.clear_cache(app, older_than=older_than, step=step))
    if as_json:
        emit_json({"cleared": n})
    else:
        console.print(f"cleared {n} cached result{'' if n == 1 else 's'}")


# -- the dataset export --------------------------------------------------------------

PARQUET_BATCH = 5000


@click.group()
def dataset() -> None:
    """Evaluation data: every finished try with its input, output, usage, outcome and review label."""


@dataset.command("export")
@click.option("--kind", cls=Once)
@click.option("--queue", cls=Once)
@click.option("--since", help="Finished at most this long ago (24h, 7d) or since an ISO time (UTC unless it has an offset).")
@click.option("--until", help="Finished before this (same forms).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet"]), default="jsonl", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
              help="File to write (default: stdout; parquet needs a file).")
@click.pass_context
def dataset_export(ctx: click.Context, kind, queue, since, until, fmt, output) -> None:
    """Write one record per finished try, oldest first: input payload, output (result, hold data), steps, model,
    prompt version, tokens, cost, latency, outcome, and the review label (approve, approve_edited, reject).

    Rows stream from the database through a server-side cursor, so the
    size of the export does not matter. A file is written under a temporary
    name and renamed when complete. Parquet needs the parquet extra.
    """
    app = app_from_context(ctx)
    if fmt == "parquet":
        if output is None:
            raise Fail("--format parquet writes a file: give --output")
        with needs_extra("joblane dataset export --format parquet", "parquet"):
            import pyarrow  # noqa: F401
    rows = run_or_fail(lambda: admin.dataset(app, kind=kind, queue=queue, since=since, until=until))
    first = run_or_fail(lambda: next(rows, None))  # a bad filter or schema fails before a byte is written
    rows = itertools.chain([first], rows) if first is not None else iter(())
    partial = f"{output}.partial" if output else None
    try:
        if fmt == "parquet":
            n = run_or_fail(lambda: _write_parquet(rows, partial))
        else:
            out = open(partial, "w", newline="", encoding="utf-8") if partial else sys.stdout
            try:
                n = run_or_fail(lambda: _write_text(rows, out, fmt))
            finally:
                if partial:
                    out.close()
    except BrokenPipeError:  # the reader (| head) stopped early: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except BaseException:
        if partial and os.path.exists(partial):
            os.unlink(partial)
        raise
    if partial:
        os.replace(partial, output)
        console.print(f"wrote {rules.plural(n, 'record')} to {escape(output)}", highlight=False)


def _flat(r: dict[str, Any]) -> dict[str, Any]:
    """A record with JSON fields as JSON text and times as ISO text (csv and parquet cells)."""
    out = {}
    for k, v in r.items():
        if isinstance(v, (dict, list)):
            v = json.dumps(v)
        out[k] = jsonable(v) if k in ("started_at", "finished_at", "reviewed_at") else v
    return out


def _write_text(rows: Iterator[dict[str, Any]], out: Any, fmt: str) -> int:
    n = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(admin.DATASET_KEYS)
        for r in rows:
            flat = _flat(r)
            writer.writerow([flat[k] for k in admin.DATASET_KEYS])
            n += 1
    else:
        for r in rows:
            out.write(json.dumps(jsonable(r), default=str) + "\n")
            n += 1
    return n


def _write_parquet(rows: Iterator[dict[str, Any]], path: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    numbers = {"attempt_id", "job_id", "attempt", "replay_of"}
    floats = {"latency_ms", "tokens", "cost"}
    schema = pa.schema([(k, pa.int64() if k in numbers else pa.float64() if k in floats else pa.string())
                        for k in admin.DATASET_KEYS])
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        while True:
            batch = [_flat(r) for r in itertools.islice(rows, PARQUET_BATCH)]
            if not batch:
                break
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            n += len(batch)
    return n


# -- replay comparisons ---------------------------------------------------------------


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.4g}{unit}"


def _short(value: Any, width: int = 60) -> str:
    text = "-" if value is None else json.dumps(value)
    return escape(text if len(text) <= width else text[: width - 1] + "…")


@click.command()
@click.argument("tag")
@click.option("--job", "job_id", type=int, help="One pair in full: the original or the replay's id.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(0, 100_000),
              help="Pairs listed under the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the summary and every pair).")
@click.pass_context
def compare(ctx: click.Context, tag, job_id, limit, as_json) -> None:
    """The replays tagged TAG (joblane replay --tag TAG) against their originals, side by side.

    Success rate (done of the finished), hold rate (jobs with a try held
    for review), cost and time per job, how many outputs changed, and each pair.
    """
    app = app_from_context(ctx)
    report = run_or_fail(lambda: app.compare_replay(tag))
    if not report["pairs"]:
        raise Fail(f"no replays tagged {tag!r} (joblane replay ... --tag {tag})")
    if job_id is not None:
        pairs = [p for p in report["pairs"] if job_id in (p["original_id"], p["replay_id"])]
        if not pairs:
            raise Fail(f"job {job_id} is in no pair of replay {tag!r}")
        if as_json:
            emit_json(pairs)
            return
        for p in pairs:
            table = Table(title=f"job {p['original_id']} and its replay {p['replay_id']} ({escape(tag)})")
            for col in ("", "original", "replay"):
                table.add_column(col, overflow="fold")
            table.add_row("id", str(p["original_id"]), str(p["replay_id"]))
            for field in ("state", "tries", "held", "cost", "latency_ms"):
                table.add_row(field, str(p[f"original_{field}"]), str(p[f"replay_{field}"]))
            table.add_row("result", escape(json.dumps(p["original_result"], indent=2)),
                          escape(json.dumps(p["replay_result"], indent=2)))
            table.add_row("changed", "", "yes" if p["changed"] else "no")
            print_table(table)
        return
    if as_json:
        emit_json(report)
        return
    o, r = report["original"], report["replay"]
    table = Table(title=f"replay {escape(tag)}: {rules.plural(r['jobs'], 'job')} against their originals")
    for col in ("", "originals", "replays"):
        table.add_column(col)
    table.add_row("jobs", str(o["jobs"]), str(r["jobs"]))
    table.add_row("done / failed / cancelled", f"{o['done']} / {o['failed']} / {o['cancelled']}",
                  f"{r['done']} / {r['failed']} / {r['cancelled']}")
    table.add_row("held now / unfinished", f"{o['held']} / {o['unfinished']}", f"{r['held']} / {r['unfinished']}")
    table.add_row("success rate", _rate(o["success_rate"]), _rate(r["success_rate"]))
    table.add_row("hold rate", _rate(o["hold_rate"]), _rate(r["hold_rate"]))
    table.add_row("tries", str(o["tries"]), str(r["tries"]))
    table.add_row("cost (per job)", f"{_num(o['cost'])} ({_num(o['cost_per_job'])})",
                  f"{_num(r['cost'])} ({_num(r['cost_per_job'])})")
    table.add_row("time per job", _num(o["latency_ms_per_job"], " ms"), _num(r["latency_ms_per_job"], " ms"))
    print_table(table)
    console.print(f"outputs changed: {report['changed']} (both done, results differ); failures fixed:"
                  f" {report['fixed']}; successes lost: {report['regressed']}", highlight=False)
    if limit:
        pairs = Table(title="pairs (joblane compare TAG --job ID for one in full)")
        for col in ("original", "state", "result", "replay", "state ", "result ", "changed"):
            pairs.add_column(col, overflow="fold")
        for p in report["pairs"][:limit]:
            pairs.add_row(str(p["original_id"]), p["original_state"] or "-", _short(p["original_result"]),
                          str(p["replay_id"]), p["replay_state"], _short(p["replay_result"]),
                          "yes" if p["changed"] else "")
        print_table(pairs)
        if len(report["pairs"]) > limit:
            console.print(f"[dim]... and {len(report['pairs']) - limit} more (--limit, --json)[/dim]")


COMMANDS = (budgets, cache, dataset, compare)
