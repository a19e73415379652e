"""``manage.py joblane_worker``: run the project's tasks (the options of ``joblane worker``)."""

from __future__ import annotations

import asyncio

from django.core.management.base import BaseCommand, CommandError

from .....errors import JoblaneError
from ... import get_app
from ...apps import prepare_tasks


class Command(BaseCommand):
    help = "Run the joblane worker for this project's tasks; SIGTERM finishes running jobs, then exits."

    def add_arguments(self, parser):
        parser.add_argument("-q", "--queue", dest="queues", action="append",
                            help="queue to serve (repeatable; default: the queues of the registered tasks)")
        parser.add_argument("-c", "--concurrency", type=int, default=10)
        parser.add_argument("--poll-interval", type=float, default=1.0)
        parser.add_argument("--lease", dest="lease_seconds", type=float, help="lease length in seconds (default 30)")
        parser.add_argument("--grace", dest="grace_seconds", type=float, default=30.0,
                            help="seconds running tasks get to finish after SIGTERM")
        parser.add_argument("--no-listen", action="store_true", help="poll only (PgBouncer in transaction pooling)")
        parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
        parser.add_argument("--log-format", choices=["text", "json"], default="text")

    def handle(self, *args, **options):
        from .....cli.common import setup_logging
        from .....worker import Worker

        app = get_app()
        prepare_tasks(app)
        setup_logging(options["log_format"], options["verbosity"] > 1)
        try:
            worker = Worker(app, queues=options["queues"], concurrency=options["concurrency"],
                            poll_interval=options["poll_interval"], lease_seconds=options["lease_seconds"],
                            grace_seconds=options["grace_seconds"], listen=not options["no_listen"],
                            exit_when_stuck=True)  # this process is the worker's: it may exit without a stuck thread
            if options["metrics_port"] is not None:
                from .....telemetry import serve_metrics

                serve_metrics(worker, options["metrics_port"])
            asyncio.run(worker.run())
        except JoblaneError as exc:
            raise CommandError(str(exc)) from None
