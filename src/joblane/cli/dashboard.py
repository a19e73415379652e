"""`joblane dashboard`: serve the web dashboard. Imports the web stack only when the command runs."""

from __future__ import annotations

import os
import socket

import click

from ..web.security import TOKEN_ENV, bind_problem, is_loopback
from .common import Fail, app_from_context, console, needs_extra, run_or_fail


@click.command()
@click.argument("app_spec", metavar="[APP]", required=False)
@click.option("--host", default="127.0.0.1", show_default=True,
              help=f"Address to bind; anything but loopback needs ${TOKEN_ENV}.")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="Show everything, change nothing (actions hidden and refused).")
@click.option("--refresh", default=5, show_default=True, type=click.IntRange(0, 3600),
              help="Seconds between overview refreshes (0: off).")
@click.option("--allow-host", "allow_hosts", multiple=True,
              help="Extra Host header accepted on a loopback bind (e.g. behind a local proxy).")
@click.pass_context
def dashboard(ctx: click.Context, app_spec: str | None, host: str, port: int, read_only: bool, refresh: int,
              allow_hosts: tuple[str, ...]) -> None:
    """Serve the web dashboard: queues, jobs, the review queue, replays and the outbox.

    APP (module:attribute) is optional; without it the dashboard reads the
    schema given by --schema / JOBLANE_SCHEMA.
    """
    with needs_extra("joblane dashboard", "web"):
        import uvicorn

        from ..web.server import create_app
    token = os.environ.get(TOKEN_ENV) or None
    problem = bind_problem(host, token)
    if problem:
        raise Fail(problem)
    app = app_from_context(ctx, app_spec)

    def check() -> None:
        from ..migrations import check as check_schema

        with app.connect() as conn:
            check_schema(conn, app.schema)

    run_or_fail(check)
    web = create_app(app, read_only=read_only, token=token, loopback_only=is_loopback(host) and token is None,
                     allowed_hosts=allow_hosts, refresh_seconds=refresh)
    _port_free(host, port)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"joblane dashboard for schema [bold]{app.schema}[/bold] on http://{shown}:{port}/"
                  + (" (read-only)" if read_only else "") + (" (token required)" if token else ""), soft_wrap=True)
    try:
        uvicorn.run(web, host=host, port=port, log_level="warning", access_log=False, server_header=False)
    except OSError as exc:
        raise Fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _port_free(host: str, port: int) -> None:
    """Fail with one line now rather than a server log later when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise Fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (pick another --port)") from None


COMMANDS = (dashboard,)
