"""The dashboard's writes. Each goes through an App method, never through SQL of its own."""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..app import App
from ..errors import JoblaneError


# Every action the dashboard offers; read-only mode turns them all off.
ACTIONS = ("retry", "cancel", "release", "reject", "replay", "outbox_retry", "outbox_discard", "pause", "limits",
           "bulk")


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


def release(app: App, conn: Any, job_id: int, payload_patch: dict[str, Any] | None, actor: str) -> int:
    return app.release(conn, job_id, payload_patch or None, actor=actor)


def reject(app: App, conn: Any, job_id: int, reason: str, actor: str) -> int:
    return app.reject(conn, job_id, reason, actor=actor)


def replay(app: App, conn: Any, filters: dict[str, Any], payload_patch: dict[str, Any] | None,
           dry_run: bool) -> list[dict[str, Any]]:
    """Insert copies of the jobs ``filters`` match (ids, kind, queue, state, since); only report them on a dry run."""
    return app.replay(conn, **filters, payload_patch=payload_patch, dry_run=dry_run)


def outbox_retry(app: App, conn: Any, ids: Sequence[int]) -> list[int]:
    return app.retry_outbox(conn, ids=list(ids))


def release_many(app: App, conn: Any, ids: Sequence[int], actor: str) -> list[int]:
    """Release the held jobs of ``ids`` (one guarded statement); returns those released."""
    return app.release_held(conn, ids=list(ids), actor=actor)


def reject_many(app: App, conn: Any, ids: Sequence[int], reason: str, actor: str) -> list[int]:
    return app.reject_held(conn, reason, ids=list(ids), actor=actor)


def outbox_discard(app: App, conn: Any, ids: Sequence[int]) -> list[int]:
    return app.discard_outbox(conn, ids=list(ids))


def pause(app: App, conn: Any, queue: str, seconds: float, reason: str) -> Any:
    return app.pause_queue(conn, queue, seconds, reason)


def resume(app: App, conn: Any, queue: str) -> bool:
    return app.resume_queue(conn, queue)


def save_limit(app: App, conn: Any, queue: str, options: dict[str, Any]) -> Any:
    return app.save_limit(conn, queue, **options)


def remove_limit(app: App, conn: Any, queue: str) -> bool:
    return app.remove_limit(conn, queue)
