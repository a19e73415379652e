"""The joblane dashboard (``joblane dashboard``): install with ``pip install 'joblane[web]'``.

``create_app(app, ...)`` returns the dashboard as an ASGI application, to
mount in a server of your own. This package imports the web stack only when
``create_app`` is called, so the command line works without the extra.
"""

from __future__ import annotations

from typing import Any


def create_app(app: Any, **options: Any) -> Any:
    """The dashboard of ``app`` (a joblane.App) as a Starlette application; see ``server.create_app``."""
    from .server import create_app as build

    return build(app, **options)


__all__ = ["create_app"]
