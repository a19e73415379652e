"""Writes that join the caller's transaction: publish (one INSERT), the inbox (one INSERT),
and completing a job in its task's own transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .. import store, telemetry
from ..errors import JoblaneError
from ..rules import check_text, to_json

if TYPE_CHECKING:  # pragma: no cover
    from ..app import App

TOPIC_LIMIT = 255
KEY_LIMIT = 1000


def channel(app: App) -> str:
    """The LISTEN/NOTIFY channel relays wait on."""
    return f"{app.schema}_outbox"


def _publish_statement(app: App, topic: str, payload: Any, key: str | None, idempotency_key: str | None,
                       headers: Mapping[str, str] | None) -> store.Statement:
    check_text("topic", topic, TOPIC_LIMIT)
    if key is not None:
        check_text("key", key, KEY_LIMIT)
    if idempotency_key is not None:
        check_text("idempotency_key", idempotency_key, KEY_LIMIT)
    if headers is None:
        headers_json = "{}"
    else:
        if not isinstance(headers, Mapping):
            raise JoblaneError(f"headers must be a mapping of strings to strings, got {type(headers).__name__}")
        for name, value in headers.items():
            check_text("header name", name, 200)
            if not isinstance(value, str):
                raise JoblaneError(f"header {name!r} must be a string, got {type(value).__name__}")
        headers_json = to_json("headers", dict(headers), 64_000)
    body = to_json("payload", payload, app.max_payload_bytes)
    return app.store.publish(topic, key, idempotency_key, body, headers_json, app.notify, channel(app))


def publish(app: App, conn: Any, topic: str, payload: Any = None, *, key: str | None = None,
            idempotency_key: str | None = None, headers: Mapping[str, str] | None = None) -> int:
    with telemetry.publish_span(topic, headers) as headers:  # adds traceparent while a span is active
        return store.fetch(conn, _publish_statement(app, topic, payload, key, idempotency_key, headers),
                           prepare=app.prepare)[0][0]


async def publish_async(app: App, conn: Any, topic: str, payload: Any = None, *, key: str | None = None,
                        idempotency_key: str | None = None, headers: Mapping[str, str] | None = None) -> int:
    with telemetry.publish_span(topic, headers) as headers:  # adds traceparent while a span is active
        stmt = _publish_statement(app, topic, payload, key, idempotency_key, headers)
        return (await store.fetch_async(conn, stmt, prepare=app.prepare))[0][0]


def inbox(app: App, conn: Any, key: str) -> bool:
    check_text("inbox key", key, KEY_LIMIT)
    return bool(store.fetch(conn, app.store.inbox_record(key)))


async def inbox_async(app: App, conn: Any, key: str) -> bool:
    check_text("inbox key", key, KEY_LIMIT)
    return bool(await store.fetch_async(conn, app.store.inbox_record(key)))


def _complete_statement(app: App, job: Any, result: Any) -> store.Statement:
    if not hasattr(job, "id") or not hasattr(job, "attempt"):
        raise JoblaneError(f"complete_job takes the task's joblane.Job, got {type(job).__name__}")
    body = None if result is None else to_json("result", result)
    meta = to_json("attempt meta", job.meta) if getattr(job, "meta", None) else None
    return app.store.complete_job_in_transaction(job.id, job.attempt, body, meta)


def _not_running(job: Any) -> JoblaneError:
    return JoblaneError(f"job {job.id} is no longer running attempt {job.attempt} (rescued or cancelled): "
                        "roll back this transaction")


def complete_job(app: App, conn: Any, job: Any, result: Any = None) -> None:
    if not store.fetch(conn, _complete_statement(app, job, result)):
        raise _not_running(job)


async def complete_job_async(app: App, conn: Any, job: Any, result: Any = None) -> None:
    if not await store.fetch_async(conn, _complete_statement(app, job, result)):
        raise _not_running(job)
