"""`joblane ...`: the command line. A leaf: it reads through App and named queries, no queue logic here.

``main`` is the group; each module of this package holds a family of
commands (its ``COMMANDS``) and imports what they share from ``common``.
A command imports its optional dependencies (the web stack, broker clients,
the showcase) only when it runs, so a bare ``pip install joblane`` has a
working ``joblane``.
"""

from __future__ import annotations

import click

from . import ai, core, dashboard, flows, grants, outbox, processes, review, showcase
from .common import Fail, UsageFail


class Commands(click.Group):
    """The ``joblane`` group: refuses, in one line, an argument that is not valid UTF-8; usage errors in one line.

    click's own usage errors (a missing argument, an unknown option, a bad
    value) read ``error: ...`` on one line like every other error, and keep
    exit code 2.
    """

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:  # type: ignore[no-untyped-def]
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise UsageFail.of(exc) from None

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # parsing a subcommand, or a value its option refused
            raise UsageFail.of(exc) from None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
                raw = arg.encode("utf-8", "surrogateescape")
                raise Fail(f"argument {raw!r} is not valid UTF-8: joblane stores text as UTF-8") from None
        return super().parse_args(ctx, args)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", envvar="DATABASE_URL", help="PostgreSQL URL (default: $DATABASE_URL).")
@click.option("--schema", envvar="JOBLANE_SCHEMA", default=None, help="Schema name (default: joblane).")
@click.version_option(package_name="joblane")
@click.pass_context
def main(ctx: click.Context, database_url: str | None, schema: str | None) -> None:
    """joblane: PostgreSQL as your job queue and transactional outbox."""
    ctx.obj = {"dsn": database_url, "schema": schema}


for _module in (core, processes, review, outbox, flows, grants, dashboard, showcase, ai):
    for _command in _module.COMMANDS:
        main.add_command(_command)

__all__ = ["main"]
