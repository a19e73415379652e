"""``manage.py joblane_migrate``: create or upgrade joblane's tables (safe to run twice)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from .....errors import JoblaneError
from .....migrations import latest_version
from ... import get_app


class Command(BaseCommand):
    help = "Create or upgrade joblane's tables in JOBLANE_SCHEMA (safe to run twice)."

    def handle(self, *args, **options):
        app = get_app()
        try:
            applied = app.migrate()
        except JoblaneError as exc:
            raise CommandError(str(exc)) from None
        if applied:
            self.stdout.write(f"schema {app.schema}: applied {', '.join(map(str, applied))}; "
                              f"now at version {latest_version()}")
        else:
            self.stdout.write(f"schema {app.schema} is up to date (version {latest_version()})")
