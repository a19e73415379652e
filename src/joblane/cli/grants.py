"""`joblane grants`: print the GRANT statements of a least-privilege role (the roles are in joblane.grants)."""

from __future__ import annotations

import click

from ..grants import ROLES, database_of, statements
from .common import app_from_context, emit_json, run_or_fail


@click.command()
@click.option("--role", "role", required=True, type=click.Choice(ROLES), help="Which kind of process the user runs.")
@click.option("--user", "user", help="The database user to grant to (default: joblane_<role>).")
@click.option("--database", "database", help="Database name for the admin grants (default: from DATABASE_URL).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def grants(ctx: click.Context, role: str, user: str | None, database: str | None, as_json: bool) -> None:
    """Print the GRANT statements of a least-privilege role (pipe them to psql).

    Run them after `joblane migrate`, and again after an upgrade that adds tables.
    """
    app = app_from_context(ctx)
    user = f"joblane_{role}" if user is None else user
    if role == "admin" and not database:
        database = run_or_fail(lambda: database_of(ctx.obj["dsn"]))
    sql = run_or_fail(lambda: statements(role, user, app.schema, database))
    if as_json:
        emit_json({"role": role, "user": user, "schema": app.schema,
                   "statements": [line for line in sql if not line.startswith("--")]})
        return
    # plain SQL, not a table: the output is meant for `| psql`
    click.echo("\n".join(sql))


COMMANDS = (grants,)
