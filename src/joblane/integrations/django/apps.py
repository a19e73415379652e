"""The Django app: imports every installed app's ``tasks`` module, readies sync tasks for threads."""

from __future__ import annotations

import functools

from django.apps import AppConfig


def django_task(fn):
    """Wrap a plain-function task so its thread's Django connections are checked like a request's.

    Django closes connections past CONN_MAX_AGE or broken at the start and
    end of each request; a worker thread has no request, so each task gets
    the same treatment.
    """
    if getattr(fn, "_joblane_django", False):
        return fn
    from django.db import close_old_connections

    @functools.wraps(fn)
    def run(job):
        close_old_connections()
        try:
            return fn(job)
        finally:
            close_old_connections()

    run._joblane_django = True
    return run


def prepare_tasks(app) -> None:
    for task in app.tasks.values():
        if not task.is_async and task.executor != "process":  # a child finds its function by name
            task.fn = django_task(task.fn)


class JoblaneConfig(AppConfig):
    name = "joblane.integrations.django"
    label = "joblane"
    verbose_name = "joblane"

    def ready(self) -> None:
        from django.conf import settings
        from django.utils.module_loading import autodiscover_modules

        from . import get_app

        module = getattr(settings, "JOBLANE_AUTODISCOVER", "tasks")
        if module:
            autodiscover_modules(module)
        prepare_tasks(get_app())
