"""The dashboard's writes. Each goes through an App method (or the outbox's own call), never through SQL of its own."""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Sequence

from ..app import App
from ..errors import JoblaneError


def _method(app: App, name: str) -> Callable[..., Any] | None:
    fn = getattr(app, name, None)
    return fn if callable(fn) else None


def capabilities(app: App) -> dict[str, bool]:
    """Which actions this joblane offers (review and replay come with the AI-workflow features)."""
    return {
        "retry": True,
        "cancel": True,
        "release": _method(app, "release") is not None,
        "reject": _method(app, "reject") is not None,
        "replay": _method(app, "replay") is not None,
        "outbox_retry": outbox_retry_call(app) is not None,
    }


def parse_json_object(text: str | None, what: str) -> dict[str, Any] | None:
    """A form field holding a JSON object, or None when blank; one-line errors otherwise."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JoblaneError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(value, dict):
        raise JoblaneError(f"{what} must be a JSON object like {{\"prompt_version\": \"v2\"}}")
    return value


def retry(app: App, conn: Any, ids: Sequence[int]) -> list[int]:
    return app.retry(conn, ids=list(ids))


def cancel(app: App, conn: Any, ids: Sequence[int], actor: str) -> list[int]:
    return app.cancel(conn, ids=list(ids), reason="cancelled from the dashboard", actor=actor)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def release(app: App, conn: Any, job_id: int, payload_patch: dict[str, Any] | None, actor: str) -> Any:
    fn = _method(app, "release")
    if fn is None:
        raise JoblaneError("this joblane has no App.release: upgrade joblane")
    kwargs: dict[str, Any] = {}
    if payload_patch:
        kwargs["payload_patch"] = payload_patch
    if _accepts(fn, "actor"):
        kwargs["actor"] = actor
    return fn(conn, job_id, **kwargs)


def reject(app: App, conn: Any, job_id: int, reason: str, actor: str) -> Any:
    fn = _method(app, "reject")
    if fn is None:
        raise JoblaneError("this joblane has no App.reject: upgrade joblane")
    kwargs: dict[str, Any] = {}
    if _accepts(fn, "actor"):
        kwargs["actor"] = actor
    return fn(conn, job_id, reason, **kwargs)


def replay(app: App, conn: Any, filters: dict[str, Any], payload_patch: dict[str, Any] | None,
           dry_run: bool) -> list[dict[str, Any]]:
    """Insert copies of the jobs ``filters`` match (ids, kind, queue, state, since); only report them on a dry run."""
    fn = _method(app, "replay")
    if fn is None:
        raise JoblaneError("this joblane has no App.replay: upgrade joblane")
    return fn(conn, **filters, payload_patch=payload_patch, dry_run=dry_run)


def outbox_retry_call(app: App) -> Callable[..., Any] | None:
    """App's outbox retry when it has one, else the outbox's own admin call."""
    fn = _method(app, "outbox_retry") or _method(app, "retry_outbox")
    if fn is not None:
        return fn
    try:
        from ..outbox import admin
    except ImportError:
        return None
    retry_fn = getattr(admin, "retry", None)
    if not callable(retry_fn):
        return None
    return lambda conn, **kwargs: retry_fn(app, conn, **kwargs)


def outbox_retry(app: App, conn: Any, ids: Sequence[int]) -> list[int]:
    fn = outbox_retry_call(app)
    if fn is None:
        raise JoblaneError("this joblane has no outbox retry call: upgrade joblane")
    return fn(conn, ids=list(ids))
