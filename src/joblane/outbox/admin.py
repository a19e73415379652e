"""Reading and re-queueing outbox rows (the CLI and anyone else): named queries on the app's connection."""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..app import App
from ..errors import JoblaneError

OUTBOX_STATES = ("pending", "sent", "failed")
_LIST_KEYS = ("id", "topic", "key", "idempotency_key", "state", "attempts", "max_attempts", "run_after",
              "last_error", "created_at", "sent_at", "relay", "lease_until")


def list_messages(app: App, conn: Any = None, *, state: str | None = None, topic: str | None = None,
                  before_id: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Outbox rows newest first, by state and topic prefix; page with ``before_id``."""
    if state is not None and state not in OUTBOX_STATES:
        raise JoblaneError(f"unknown outbox state {state!r}: use one of {', '.join(OUTBOX_STATES)}")
    rows = app._admin(conn, "list_outbox", [state, topic, before_id, limit])
    return [dict(zip(_LIST_KEYS, r)) for r in rows]


def get_message(app: App, message_id: int, conn: Any = None) -> dict[str, Any] | None:
    rows = app._admin(conn, "get_outbox", [message_id])
    if not rows:
        return None
    row = dict(zip((*_LIST_KEYS, "payload", "headers"), rows[0]))
    row["payload"] = json.loads(row["payload"])
    row["headers"] = json.loads(row["headers"])
    return row


def counts(app: App, conn: Any = None) -> list[dict[str, Any]]:
    """Rows per topic and state, with the age of the oldest pending row."""
    return [{"topic": t, "state": s, "messages": n, "oldest_pending_seconds": age}
            for t, s, n, age in app._admin(conn, "outbox_counts", [])]


def retry(app: App, conn: Any = None, *, ids: Sequence[int] | None = None, topic: str | None = None,
          all_failed: bool = False, attempts: int = 10) -> list[int]:
    """Failed rows back to pending, each with ``attempts`` more tries; by id, by topic prefix, or all."""
    if ids is None and topic is None and not all_failed:
        raise JoblaneError("outbox retry needs message ids, a topic prefix or all_failed=True")
    if not isinstance(attempts, int) or not 1 <= attempts <= 100_000:
        raise JoblaneError("attempts must be an integer from 1 to 100000")
    rows = app._admin(conn, "retry_outbox", [list(ids) if ids is not None else None, topic,
                                             ids is None, attempts])
    return sorted(r[0] for r in rows)
