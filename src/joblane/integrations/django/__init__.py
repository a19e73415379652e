"""joblane for Django (4.2+ with psycopg 3): enqueue and publish on Django's own connection.

Add ``"joblane.integrations.django"`` to ``INSTALLED_APPS``; then, in a view::

    from django.db import transaction
    from joblane.integrations.django import enqueue

    with transaction.atomic():
        lead = Lead.objects.create(email=email)
        enqueue("enrich_lead", {"lead_id": lead.id})   # commits or rolls back with the lead

Settings (all optional):

``JOBLANE_APP``
    ``"module:attribute"`` naming your ``joblane.App``. Without it the
    integration makes one, ``joblane.integrations.django.app``, and tasks are
    registered on it (``from joblane.integrations.django import app``).
``JOBLANE_SCHEMA``
    the schema of joblane's tables (default ``"joblane"``).
``JOBLANE_DATABASE``
    the alias in ``DATABASES`` to enqueue on and to derive the worker's URL
    from (default ``"default"``).
``JOBLANE_DATABASE_URL``
    the URL the worker, ``joblane_migrate`` and admin calls connect with,
    when deriving it from ``DATABASES`` is not what you want (e.g. the web
    goes through PgBouncer and the worker does not).
``JOBLANE_AUTODISCOVER``
    the module imported from every installed app at start-up so its tasks
    register (default ``"tasks"``; ``None`` turns it off).

They are read once, when the App is first needed.

Commands: ``manage.py joblane_migrate``, ``manage.py joblane_worker``.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Iterable
from urllib.parse import quote, urlencode

from ...app import App

__all__ = ["database_url", "enqueue", "enqueue_many", "get_app", "publish"]

_lock = threading.Lock()
_app: App | None = None

# OPTIONS of Django's PostgreSQL backend that are connection parameters both
# libpq (psycopg) and asyncpg read from a URL; the rest are Django's own.
_URL_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "passfile",
                "target_session_attrs")


def _setting(name: str, default: Any = None) -> Any:
    from django.conf import settings

    return getattr(settings, name, default)


def _alias(using: str | None) -> str:
    return using or _setting("JOBLANE_DATABASE", "default")


def database_url(using: str | None = None) -> str:
    """``JOBLANE_DATABASE_URL``, or a URL made from the ``DATABASES`` entry joblane uses."""
    explicit = _setting("JOBLANE_DATABASE_URL")
    if explicit:
        return explicit
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    alias = _alias(using)
    entry = connections[alias].settings_dict
    if "postgresql" not in entry.get("ENGINE", ""):
        raise ImproperlyConfigured(
            f"joblane needs PostgreSQL, but DATABASES[{alias!r}] uses {entry.get('ENGINE')!r}: "
            "set JOBLANE_DATABASE to a PostgreSQL alias")
    user = quote(entry.get("USER") or "", safe="")
    password = quote(str(entry.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = entry.get("HOST") or ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = f":{entry['PORT']}" if entry.get("PORT") else ""
    query = {k: v for k, v in (entry.get("OPTIONS") or {}).items() if k in _URL_OPTIONS and v is not None}
    if host.startswith("/"):  # a Unix socket directory
        query["host"], host = host, ""
    url = f"postgresql://{auth}{host}{port}/{quote(entry.get('NAME') or '', safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


def _load(spec: str) -> App:
    from django.core.exceptions import ImproperlyConfigured

    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ImproperlyConfigured(f"JOBLANE_APP must look like 'module:attribute', got {spec!r}")
    app = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(app, App):
        raise ImproperlyConfigured(f"JOBLANE_APP {spec!r} is not a joblane.App (found {type(app).__name__})")
    return app


def get_app() -> App:
    """The project's joblane App (``JOBLANE_APP``, else one made from the settings), with its database set."""
    global _app
    if _app is not None:
        return _app
    with _lock:
        if _app is None:
            from django.core.exceptions import ImproperlyConfigured

            spec = _setting("JOBLANE_APP")
            schema = _setting("JOBLANE_SCHEMA")
            if spec:
                app = _load(spec)
                if schema and app.schema != schema:
                    raise ImproperlyConfigured(
                        f"JOBLANE_SCHEMA is {schema!r} but the App named by JOBLANE_APP uses {app.schema!r}: "
                        "make them agree (App(schema=...)) or drop the setting")
                if app._dsn is None:
                    app._dsn = database_url()
            else:
                app = App(database_url(), schema=schema)
            _app = app
    return _app


def __getattr__(name: str) -> Any:
    # ``from joblane.integrations.django import app``: the App, made on first use
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _connection(using: str | None):
    from django.db import connections

    conn = connections[_alias(using)]
    conn.ensure_connection()
    if not type(conn.connection).__module__.startswith("psycopg"):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("joblane needs Django's PostgreSQL backend on psycopg 3 (pip install 'psycopg[binary]'), "
                                   f"not {type(conn.connection).__module__}")
    return conn


def enqueue(kind: str, payload: Any = None, *, using: str | None = None, **options: Any) -> int:
    """``App.enqueue`` on Django's connection: inside ``transaction.atomic()`` it joins that transaction.

    Outside one, Django is in autocommit and the job is committed at once,
    like any ORM write. ``options`` are ``App.enqueue``'s (queue, delay,
    unique_key, ...). Returns the job's id.
    """
    return get_app().enqueue(_connection(using), kind, payload, **options)


def enqueue_many(jobs: Iterable[Any], *, using: str | None = None) -> list[int]:
    """``App.enqueue_many`` on Django's connection."""
    return get_app().enqueue_many(_connection(using), jobs)


def publish(topic: str, payload: Any = None, *, using: str | None = None, **options: Any) -> int:
    """``App.publish`` on Django's connection: the outbox row commits or rolls back with the transaction."""
    return get_app().publish(_connection(using), topic, payload, **options)
