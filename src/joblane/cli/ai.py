"""`joblane budgets|cache|dataset|compare`: spend caps, the step cache, the dataset export, replay comparisons."""

from __future__ import annotations

import click
from rich.markup import escape

from .. import admin, budgets as budget_rules
from .common import Duration, Fail, Table, app_from_context, console, emit_json, print_table, run_or_fail, show_time

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
    for col in ("budget", "queue", "key", "spent", "in flight", "cap", "window ends", "waiting"):
        table.add_column(col, overflow="fold")
    for r in rows:
        per = budget_rules.describe_window(r["window_seconds"])
        key = "-" if r["key"] is None else (f"{r['key_field']}={r['key']}" if r["key_field"] else "(queue)")
        spent = f"{r['spent']:g}" + (" [bold red]at cap[/bold red]" if r["at_cap"] else "")
        table.add_row(escape(r["budget"]), escape(r["queue"]), escape(key), spent, f"{r['in_flight']:g}",
                      f"{r['cap']:g} per {per}", show_time(r["window_end"]), str(r["waiting"]))
    print_table(table)


@budgets.command("set")
@click.argument("name")
@click.option("--queue", help="The queue whose jobs it caps (needed for a new budget).")
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

    A worker whose app declares NAME (app.budget) writes its declaration at start.
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


@budgets.command("clear")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def budgets_clear(ctx: click.Context, name, as_json: bool) -> None:
    """Remove budget NAME with its spend records."""
    app = app_from_context(ctx)
    if not run_or_fail(lambda: admin.remove_budget(app, name)):
        raise Fail(f"no budget {name!r} (see `joblane budgets`)")
    if as_json:
        emit_json({"budget": name, "cleared": True})
    else:
        console.print(f"budget {escape(name)} removed")


# -- the step cache ----------------------------------------------------------------


@click.group()
def cache() -> None:
    """The shared cache of step results (job.step(..., cache=True))."""


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


COMMANDS = (budgets, cache)
