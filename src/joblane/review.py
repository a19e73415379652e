"""The review queue (held jobs: release, reject), replays, and the attempt audit trail.

Every write here is one guarded statement on the caller's connection: a
release or reject applies only while the job is still ``held``, a replay
only inserts. The App methods of the same names are the public surface.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any, Iterator, Sequence

import psycopg

from . import store
from .errors import JoblaneError
from .types import JOB_STATES

OUTCOMES = ("done", "retry", "snoozed", "failed", "held", "lost", "released", "rejected", "cancelled")
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.I)
_SPAN_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_seconds(text: str) -> float | None:
    """``"90s"``, ``"30m"``, ``"24h"``, ``"7d"``, ``"2w"`` -> seconds; None when it is not such a span."""
    m = _SPAN.match(text)
    return float(m.group(1)) * _SPAN_SECONDS[m.group(2).lower()] if m else None


def parse_when(value: Any, what: str = "since") -> dt.datetime | None:
    """A point in time from a datetime, a timedelta or seconds ago, or text: ``24h``, ``30m``, ``7d``, ISO 8601."""
    if value is None or isinstance(value, dt.datetime):
        if value is not None and value.tzinfo is None:
            raise JoblaneError(f"{what} must be a timezone-aware datetime")
        return value
    now = dt.datetime.now(dt.timezone.utc)
    if isinstance(value, dt.timedelta):
        return now - value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return now - dt.timedelta(seconds=value)
    if isinstance(value, str):
        seconds = parse_seconds(value)
        if seconds is not None:
            return now - dt.timedelta(seconds=seconds)
        try:
            parsed = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.astimezone()  # naive text means local time
    raise JoblaneError(f"{what} must be a duration ago (90s, 30m, 24h, 7d, 2w) or an ISO time, got {value!r}")


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """``["prompt_version=v2", "retries=3"]`` -> a payload patch; values are JSON when they parse, else text."""
    patch: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise JoblaneError(f"--set takes key=value, got {pair!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        patch[key.strip()] = value
    return patch


def _patch_json(app: Any, patch: Any) -> str:
    from .app import to_json

    if patch is not None and not isinstance(patch, dict):
        raise JoblaneError(f"payload_patch must be a dict of fields to set, got {type(patch).__name__}")
    return to_json("payload_patch", patch or {}, app.max_payload_bytes)


def _not_applied(app: Any, conn: Any, job_id: int, action: str) -> JoblaneError:
    states = dict(app._admin(conn, "job_states", [[job_id]]))
    if job_id not in states:
        return JoblaneError(f"no job {job_id} in schema {app.schema}")
    if states[job_id] == "held":  # held, yet the guarded statement refused it: a patch on a non-object payload
        return JoblaneError(f"job {job_id}'s payload is not a JSON object, so it cannot be patched: "
                            f"release it without a patch (--set)")
    return JoblaneError(f"job {job_id} is {states[job_id]}, not held: only held jobs can be {action}")


# -- the review queue ----------------------------------------------------------


def hold_reason(last_error: str | None) -> str | None:
    """The reason given to ``Hold`` (last_error reads "Hold: <reason>")."""
    if last_error and last_error.startswith("Hold: "):
        return last_error[len("Hold: "):]
    return last_error


def held_jobs(app: Any, conn: Any = None, *, queue: str | None = None, kind: str | None = None,
              limit: int = 50) -> list[dict[str, Any]]:
    rows = app._admin(conn, "held_jobs", [queue, kind, limit])
    return [
        {"id": i, "queue": q, "kind": k, "attempts": n, "held_since": since, "reason": hold_reason(err),
         "data": json.loads(data) if data is not None else None, "payload": json.loads(payload)}
        for i, q, k, n, since, err, data, payload in rows
    ]


def release(app: Any, conn: Any, job_id: int, payload_patch: dict | None = None, *, actor: str | None = None,
            note: str | None = None) -> int:
    from .app import _actor

    patch = _patch_json(app, payload_patch)
    rows = app._admin(conn, "release_job", [job_id, patch, actor or _actor(), note, app.notify, app.channel])
    if rows:
        return rows[0][0]
    raise _not_applied(app, conn, job_id, "released")


def reject(app: Any, conn: Any, job_id: int, reason: str, *, actor: str | None = None) -> int:
    from .app import _actor, _check_text

    _check_text("reject reason", reason, 4000)
    rows = app._admin(conn, "reject_job", [job_id, reason, actor or _actor()])
    if rows:
        return rows[0][0]
    raise _not_applied(app, conn, job_id, "rejected")


# -- replays -------------------------------------------------------------------


def replay(app: Any, conn: Any, *, ids: Sequence[int] | None = None, kind: str | None = None,
           queue: str | None = None, state: str | Sequence[str] | None = None, since: Any = None,
           until: Any = None, payload_patch: dict | None = None, skip_replayed: bool = False,
           limit: int | None = None, dry_run: bool = False) -> list[dict[str, Any]]:
    if ids is None and kind is None and queue is None and state is None and since is None:
        raise JoblaneError("replay needs a filter: job ids, kind, queue, state or since")
    states = [state] if isinstance(state, str) else (list(state) if state is not None else None)
    for s in states or ():
        if s not in JOB_STATES:
            raise JoblaneError(f"unknown state {s!r}: use one of {', '.join(JOB_STATES)}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise JoblaneError(f"limit must be a positive integer, got {limit!r}")
    patch = _patch_json(app, payload_patch)
    args = [list(ids) if ids is not None else None, kind, queue, states, parse_when(since, "since"),
            parse_when(until, "until"), skip_replayed, limit, patch, dry_run, app.notify, app.channel]
    rows = app._admin(conn, "replay_jobs", args)
    if not dry_run and patch != "{}":
        not_object = [r for r in rows if r[6] != "object"]
        if not_object:
            r = not_object[0]
            raise JoblaneError(
                f"job {r[0]}'s payload is a JSON {r[6]}, not an object, so it cannot be patched;"
                f" nothing was inserted: leave it out (--limit, ids) or replay without --set")
    return [
        {"replay_of": old, "id": new, "kind": k, "queue": q, "state": s, "payload": json.loads(payload)}
        for old, new, k, q, s, payload, _, _ in rows
    ]


# -- the attempt audit trail ---------------------------------------------------


_ATTEMPT_KEYS = ("id", "job_id", "kind", "queue", "attempt", "outcome", "worker", "started_at", "finished_at",
                 "error", "meta", "job_state")
EXPORT_KEYS = ("id", "job_id", "kind", "queue", "attempt", "outcome", "worker", "started_at", "finished_at",
               "latency_ms", "error", "meta", "job_state", "replay_of")


def _filters(kind, queue, outcome, model, since, until) -> list[Any]:
    if outcome is not None and outcome not in OUTCOMES:
        raise JoblaneError(f"unknown outcome {outcome!r}: use one of {', '.join(OUTCOMES)}")
    return [kind, queue, outcome, model, parse_when(since, "since"), parse_when(until, "until")]


def list_attempts(app: Any, conn: Any = None, *, kind: str | None = None, queue: str | None = None,
                  outcome: str | None = None, model: str | None = None, since: Any = None, until: Any = None,
                  job_id: int | None = None, before_id: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    args = _filters(kind, queue, outcome, model, since, until) + [job_id, before_id, limit]
    out = []
    for row in app._admin(conn, "list_attempts", args):
        item = dict(zip(_ATTEMPT_KEYS, row))
        item["meta"] = json.loads(item["meta"]) if item["meta"] else None
        out.append(item)
    return out


def export_attempts(app: Any, conn: Any = None, *, kind: str | None = None, queue: str | None = None,
                    outcome: str | None = None, model: str | None = None, since: Any = None, until: Any = None,
                    page_size: int = 2000) -> Iterator[dict[str, Any]]:
    """Every matching attempt, oldest first, read in pages through a server-side cursor (filters checked now)."""
    args = _filters(kind, queue, outcome, model, since, until)
    if conn is not None and not isinstance(store._unwrap(conn), psycopg.Connection):
        raise JoblaneError(f"export_attempts needs a psycopg 3 Connection, got {type(conn).__name__}")
    return _stream_attempts(app, conn, args, page_size)


def _stream_attempts(app: Any, conn: Any, args: list[Any], page_size: int) -> Iterator[dict[str, Any]]:
    own = conn is None
    raw = app.connect() if own else store._unwrap(conn)
    try:
        # a server-side cursor lives in a transaction (a savepoint when the caller has one open)
        with raw.transaction():
            with psycopg.RawServerCursor(raw, "joblane_export_attempts") as cur:
                cur.itersize = page_size
                cur.execute(app.queries.export_attempts, args)
                for row in cur:
                    item = dict(zip(EXPORT_KEYS, row))
                    item["meta"] = json.loads(item["meta"]) if item["meta"] else {}
                    yield item
    finally:
        if own:
            raw.close()
