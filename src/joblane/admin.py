"""Every admin operation in one place: jobs, review, replays, attempts, queue limits and pauses, the outbox.

``App``'s admin methods are one-line doors to these functions, and the CLI
and the dashboard call ``App``. Each takes the app (its store, schema and
notification settings) and a connection: the caller's psycopg connection,
whose transaction it joins, or None to use a short autocommit connection of
its own. Every write is one guarded statement: it applies only to rows in
the state it expects and returns the rows it changed.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Sequence

from . import store
from .errors import JoblaneError
from .rules import (MAX_DELAY, actor as default_actor, check_queue, check_text, hold_reason, holder_text,
                    holds_horizon, horizon_holder, parse_when, to_json)
from .types import JOB_STATES

OUTCOMES = ("done", "retry", "snoozed", "failed", "held", "lost", "released", "rejected", "cancelled", "waiting",
            "timeout")
OUTBOX_STATES = ("pending", "sent", "failed")


def _rows(app: Any, conn: Any, stmt: store.Statement) -> list[tuple]:
    if conn is not None:
        return store.fetch(conn, stmt)
    with app.connect() as own:
        return store.fetch(own, stmt)


# -- jobs ------------------------------------------------------------------------

_LIST_KEYS = ("id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "run_after",
              "last_error", "created_at", "finished_at", "worker", "unique_key", "replay_of")
_JOB_KEYS = ("id", "queue", "kind", "payload", "state", "priority", "attempts", "max_attempts", "run_after",
             "last_error", "lease_until", "worker", "unique_key", "replay_of", "result", "created_at",
             "finished_at")


def status(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    return [
        {"queue": q, "state": s, "jobs": n, "oldest_ready_seconds": float(age) if age is not None else None}
        for q, s, n, age in _rows(app, conn, app.store.status_counts())
    ]


def list_jobs(app: Any, conn: Any = None, *, state: str | None = None, kind: str | None = None,
              queue: str | None = None, before_id: int | None = None, limit: int = 50, since: Any = None,
              until: Any = None) -> list[dict[str, Any]]:
    """Jobs newest first; ``since``/``until`` bound when they were created (the time rule: rules.parse_when)."""
    rows = _rows(app, conn, app.store.list_jobs(state, kind, queue, before_id, limit, parse_when(since, "since"),
                                                parse_when(until, "until")))
    return [dict(zip(_LIST_KEYS, r)) for r in rows]


def get_job(app: Any, job_id: int, conn: Any = None) -> dict[str, Any] | None:
    if conn is None:
        with app.connect() as own:
            return get_job(app, job_id, own)
    rows = store.fetch(conn, app.store.get_job(job_id))
    if not rows:
        return None
    job = dict(zip(_JOB_KEYS, rows[0]))
    job["payload"] = json.loads(job["payload"])
    job["result"] = json.loads(job["result"]) if job["result"] is not None else None
    job["attempt_rows"] = [
        {"attempt": a, "worker": w, "started_at": s, "finished_at": f, "outcome": o, "error": e,
         "meta": json.loads(m) if m else None}
        for a, w, s, f, o, e, m in store.fetch(conn, app.store.job_attempts(job_id))
    ]
    job["replays"] = [{"id": i, "state": s} for i, s in store.fetch(conn, app.store.job_replays(job_id))]
    job["waiting_on"] = []  # what holds this pending job back: its queue's pause, limits at their max, budgets at cap
    if job["state"] == "pending":
        job["waiting_on"] = _queue_holds(store.fetch(conn, app.store.job_queue_holds(job_id))) + [
            b for b in _budget_rows(store.fetch(conn, app.store.budget_spend(job_id)))
            if b["spent"] + b["in_flight"] >= b["cap"]]
        for hold in job["waiting_on"]:
            hold["text"] = describe_hold(hold)
    return job


_HOLD_KEYS = ("paused_until", "pause_reason", "max_starts", "starts_interval", "concurrency", "max_cost",
              "cost_interval", "per_key", "key_field", "key", "starts", "running", "key_running", "cost", "estimate")


def _queue_holds(rows: list[tuple]) -> list[dict[str, Any]]:
    """The pause and the limits at their max that hold a pending job back (job_queue_holds), one dict each."""
    if not rows:
        return []
    r = dict(zip(_HOLD_KEYS, rows[0]))
    holds: list[dict[str, Any]] = []
    if r["paused_until"] is not None:
        holds.append({"kind": "pause", "until": r["paused_until"], "reason": r["pause_reason"]})
    if r["max_starts"] is not None and r["starts"] >= r["max_starts"]:
        holds.append({"kind": "limit", "limit": "rate", "used": r["starts"], "max": r["max_starts"],
                      "window_seconds": r["starts_interval"]})
    if r["concurrency"] is not None and r["running"] >= r["concurrency"]:
        holds.append({"kind": "limit", "limit": "concurrency", "used": r["running"], "max": r["concurrency"]})
    if r["per_key"] is not None and r["key_running"] >= r["per_key"]:
        holds.append({"kind": "limit", "limit": "per_key", "key_field": r["key_field"], "key": r["key"],
                      "used": r["key_running"], "max": r["per_key"]})
    if r["max_cost"] is not None and r["cost"] > 0 and r["cost"] + r["estimate"] > r["max_cost"]:
        holds.append({"kind": "limit", "limit": "tokens", "used": r["cost"], "max": r["max_cost"],
                      "estimate": r["estimate"], "window_seconds": r["cost_interval"]})
    return holds


def describe_hold(hold: dict[str, Any]) -> str:
    """One line for what holds a pending job back (an entry of get_job's ``waiting_on``)."""
    from .rules import format_span

    if hold["kind"] == "pause":
        return f"queue paused until {hold['until']:%Y-%m-%d %H:%M:%S %Z}: {hold['reason'] or 'paused'}"
    if hold["kind"] == "budget":
        return (f"budget {hold['budget']}: {hold['key'] or 'the queue'} spent {hold['spent'] + hold['in_flight']:g}"
                f" of {hold['cap']:g} (in flight {hold['in_flight']:g}; cap {describe_cap_source(hold)})"
                f" until {hold['window_end']:%Y-%m-%d %H:%M:%S %Z}")
    limit = hold["limit"]
    if limit == "rate":
        return f"rate limit: {hold['used']} of {hold['max']} starts per {format_span(hold['window_seconds'])} used"
    if limit == "concurrency":
        return f"concurrency limit: {hold['used']} of {hold['max']} running"
    if limit == "per_key":
        return f"per-key limit: {hold['key_field']}={hold['key']} has {hold['used']} of {hold['max']} running"
    return (f"weighted limit: {hold['used']:g} of {hold['max']:g} per {format_span(hold['window_seconds'])} used,"
            f" this job needs {hold['estimate']:g}")


# The states each bulk action takes jobs from; the guarded statements check them again.
RETRYABLE = ("failed", "cancelled")
CANCELLABLE = ("pending", "held", "running", "waiting")
BULK_ACTIONS = ("retry", "cancel", "release", "reject")


def _states(action: str, ids: Sequence[int] | None, state: str | Sequence[str] | None) -> list[str]:
    """The states ``action`` touches: by id, every state it can act on; by filter, ``state`` or its default."""
    if action in ("release", "reject"):
        allowed: tuple[str, ...] = ("held",)
        default = allowed
    elif action == "retry":
        allowed, default = RETRYABLE, ("failed",)
    elif action == "cancel":
        allowed = default = CANCELLABLE
    else:
        raise JoblaneError(f"unknown bulk action {action!r}: use one of {', '.join(BULK_ACTIONS)}")
    if ids is not None:
        return list(allowed)
    states = [state] if isinstance(state, str) else list(state) if state else list(default)
    for s in states:
        if s not in allowed:
            raise JoblaneError(f"{action} acts on {' or '.join(allowed)} jobs, not {s!r} ones")
    return states


def _has_filter(*values: Any) -> bool:
    return any(v is not None and v != () and v != [] for v in values)


def count_matching(app: Any, conn: Any = None, *, action: str, ids: Sequence[int] | None = None,
                   kind: str | None = None, queue: str | None = None, state: str | Sequence[str] | None = None,
                   since: Any = None, until: Any = None, sample: int = 20) -> tuple[int, list[int]]:
    """How many jobs ``action`` (retry, cancel, release, reject) would touch with these arguments, and the
    first ``sample`` of their ids: what a command shows before it asks to go ahead."""
    states = _states(action, ids, state)
    rows = _rows(app, conn, app.store.count_jobs(list(ids) if ids is not None else None, states, kind, queue,
                                                 parse_when(since, "since"), parse_when(until, "until"), sample))
    n, first = rows[0]
    return n, list(first)


def retry(app: Any, conn: Any = None, *, ids: Sequence[int] | None = None, kind: str | None = None,
          queue: str | None = None, all_failed: bool = False, state: str | Sequence[str] | None = None,
          since: Any = None, until: Any = None, attempts: int = 1) -> list[int]:
    """Failed (or cancelled) jobs back to pending: by id, or every job matching the filters (created in
    [since, until); ``state`` failed by default, or cancelled). Each gets ``attempts`` more tries when its
    budget is spent: a job failed at 3/3 is pending at 3/4 (3/5 with attempts=2)."""
    if ids is None and not _has_filter(kind, queue, state, since, until) and not all_failed:
        raise JoblaneError("retry needs job ids, a filter (kind, queue, state, since, until) or all_failed=True")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100_000:
        raise JoblaneError(f"attempts must be an integer from 1 to 100000, got {attempts!r}")
    states = _states("retry", ids, state)
    rows = _rows(app, conn, app.store.retry_jobs(list(ids) if ids is not None else None, kind, queue, states,
                                                 parse_when(since, "since"), parse_when(until, "until"), attempts))
    return sorted(r[0] for r in rows)


def cancel(app: Any, conn: Any = None, *, ids: Sequence[int] | None = None, reason: str | None = None,
           actor: str | None = None, kind: str | None = None, queue: str | None = None,
           state: str | Sequence[str] | None = None, since: Any = None, until: Any = None) -> list[int]:
    """Cancel pending, held or running jobs: by id, or every job matching the filters (created in
    [since, until); ``state`` any of pending, held, running by default)."""
    if ids is None and not _has_filter(kind, queue, state, since, until):
        raise JoblaneError("cancel needs job ids or a filter (kind, queue, state, since, until)")
    states = _states("cancel", ids, state)
    rows = _rows(app, conn, app.store.cancel_jobs(list(ids) if ids is not None else None, reason,
                                                  actor or default_actor(), states, kind, queue,
                                                  parse_when(since, "since"), parse_when(until, "until")))
    return sorted(r[0] for r in rows)


def job_states(app: Any, ids: Sequence[int], conn: Any = None) -> dict[int, str]:
    return {i: s for i, s in _rows(app, conn, app.store.job_states(list(ids)))}


# -- health of the tables ------------------------------------------------------------

# dead row versions past this share of the live ones (and this many) mean vacuum is behind
DEAD_SHARE = 0.2
DEAD_MIN = 10_000
OLD_TRANSACTION_SECONDS = 300.0
# autovacuum looking less often than this lets a busy queue's dead rows pile up between passes
BUSY_QUEUE_NAPTIME = 15.0


AI_DUE_MIN = 10_000  # rows the pruner should have removed before status --health warns


def health(app: Any, conn: Any = None) -> dict[str, Any]:
    """Table sizes, dead row versions, last vacuum, the oldest open transaction, and warnings about them."""
    tables = [{"table": t, "bytes": size, "live": live, "dead": dead, "last_vacuum": vacuumed, "vacuums": runs}
              for t, size, live, dead, vacuumed, runs in _rows(app, conn, app.store.table_health(app.schema))]
    if not any(t["table"] == "jobs" for t in tables):
        raise JoblaneError(f"schema {app.schema!r} has no joblane tables: run `joblane migrate`")
    [(autovacuum, oldest, naptime)] = _rows(app, conn, app.store.database_health())
    warnings = []
    if not autovacuum:
        warnings.append("autovacuum is off: dead rows pile up and claims slow down at high rates; turn it on")
    for t in tables:
        if t["dead"] >= DEAD_MIN and t["dead"] > DEAD_SHARE * max(t["live"], 1):
            hint = (f" (autovacuum looks every {naptime:g}s: run the workers as the tables' owner, whose vacuumer"
                    " keeps up, or set autovacuum_naptime = 10s)"
                    if autovacuum and naptime > BUSY_QUEUE_NAPTIME else "")
            warnings.append(f"{t['table']}: {t['dead']:,} dead row versions for {t['live']:,} live: "
                            f"vacuum is falling behind{hint}")
    horizon = horizon_holder(_rows(app, conn, app.store.horizon_holder()))
    if holds_horizon(horizon, OLD_TRANSACTION_SECONDS):
        warnings.append(f"{holder_text(horizon)} holds back vacuum's horizon: no vacuum can remove the row "
                        "versions deleted since it began; end it (pg_terminate_backend for a session, "
                        "pg_drop_replication_slot for a slot nobody reads)")
    elif oldest is not None and oldest > OLD_TRANSACTION_SECONDS:
        warnings.append(f"a transaction has been open for {oldest:.0f}s: no vacuum can reclaim rows it may see")
    [ai_row] = _rows(app, conn, app.store.ai_table_health())
    ai = dict(zip(("cache_results", "cache_expired", "cache_lost_claims", "cache_oldest_expiry", "budget_windows",
                   "budget_windows_due"), ai_row))
    due = ai["cache_expired"] + ai["cache_lost_claims"] + ai["budget_windows_due"]
    if due >= AI_DUE_MIN:
        warnings.append(f"{due:,} expired cache rows and old budget windows wait for the pruner: is a worker "
                        f"running (its pruner removes them every few seconds)?")
    return {"tables": tables, "autovacuum": autovacuum, "autovacuum_naptime_seconds": naptime,
            "oldest_transaction_seconds": oldest, "horizon": horizon, "ai": ai, "warnings": warnings}


# -- workers and relays ----------------------------------------------------------------

_PROCESS_KEYS = ("name", "role", "host", "pid", "version", "queues", "kinds", "concurrency", "running",
                 "started_at", "last_seen", "lease_until", "stopping")


def processes(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """The live workers and relays (registered, their registration not expired), oldest first."""
    rows = [dict(zip(_PROCESS_KEYS, r)) for r in _rows(app, conn, app.store.list_processes())]
    for r in rows:
        r["stopping"] = json.loads(r["stopping"]) if r["stopping"] is not None else None
    return rows


# -- the review queue --------------------------------------------------------------


def held_jobs(app: Any, conn: Any = None, *, queue: str | None = None, kind: str | None = None,
              limit: int = 50) -> list[dict[str, Any]]:
    rows = _rows(app, conn, app.store.held_jobs(queue, kind, limit))
    return [
        {"id": i, "queue": q, "kind": k, "attempts": n, "held_since": since, "reason": hold_reason(err),
         "data": json.loads(data) if data is not None else None, "payload": json.loads(payload)}
        for i, q, k, n, since, err, data, payload in rows
    ]


def _patch_json(app: Any, patch: Any, what: str = "payload_patch") -> str:
    if patch is not None and not isinstance(patch, dict):
        raise JoblaneError(f"{what} must be a dict of fields to set, got {type(patch).__name__}")
    return to_json(what, patch or {}, app.max_payload_bytes)


def _not_applied(app: Any, conn: Any, job_id: int, action: str) -> JoblaneError:
    states = job_states(app, [job_id], conn)
    if job_id not in states:
        return JoblaneError(f"no job {job_id} in schema {app.schema}")
    if states[job_id] == "held":  # held, yet the guarded statement refused it: a patch on a non-object payload
        return JoblaneError(f"job {job_id}'s payload is not a JSON object, so it cannot be patched: "
                            f"release it without a patch (--set)")
    return JoblaneError(f"job {job_id} is {states[job_id]}, not held: only held jobs can be {action}")


def release(app: Any, conn: Any, job_id: int, payload_patch: dict | None = None, *, actor: str | None = None,
            note: str | None = None) -> int:
    patch = _patch_json(app, payload_patch)
    rows = _rows(app, conn, app.store.release_jobs([job_id], None, None, None, None, patch, actor or default_actor(),
                                                   note, app.notify, app.channel))
    if rows:
        return rows[0][0]
    raise _not_applied(app, conn, job_id, "released")


def reject(app: Any, conn: Any, job_id: int, reason: str, *, actor: str | None = None) -> int:
    check_text("reject reason", reason, 4000)
    rows = _rows(app, conn, app.store.reject_jobs([job_id], None, None, None, None, reason, actor or default_actor()))
    if rows:
        return rows[0][0]
    raise _not_applied(app, conn, job_id, "rejected")


def release_held(app: Any, conn: Any, *, kind: str | None = None, queue: str | None = None, since: Any = None,
                 until: Any = None, payload_patch: dict | None = None, actor: str | None = None,
                 note: str | None = None, ids: Sequence[int] | None = None) -> list[int]:
    """Every held job matching the filters (created in [since, until); or the held ones of ``ids``) back to
    pending, payload patched; with a patch, a job whose payload is not a JSON object stays held. Returns the
    ids released."""
    patch = _patch_json(app, payload_patch)
    stmt = app.store.release_jobs(list(ids) if ids is not None else None, kind, queue, parse_when(since, "since"), parse_when(until, "until"), patch,
                                  actor or default_actor(), note, app.notify, app.channel)
    rows = _rows(app, conn, stmt)
    return sorted(r[0] for r in rows)


def reject_held(app: Any, conn: Any, reason: str, *, kind: str | None = None, queue: str | None = None,
                since: Any = None, until: Any = None, actor: str | None = None,
                ids: Sequence[int] | None = None) -> list[int]:
    """Cancel every held job matching the filters (created in [since, until); or the held ones of ``ids``),
    recording ``reason``."""
    check_text("reject reason", reason, 4000)
    stmt = app.store.reject_jobs(list(ids) if ids is not None else None, kind, queue, parse_when(since, "since"), parse_when(until, "until"), reason,
                                 actor or default_actor())
    rows = _rows(app, conn, stmt)
    return sorted(r[0] for r in rows)


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
        # refused here, naming the option typed, rather than later as "payload_patch contains ..."
        to_json(f"--set {key.strip()}", value)
        patch[key.strip()] = value
    return patch


# -- replays -----------------------------------------------------------------------


def replay(app: Any, conn: Any, *, ids: Sequence[int] | None = None, kind: str | None = None,
           queue: str | None = None, state: str | Sequence[str] | None = None, since: Any = None,
           until: Any = None, payload_patch: dict | None = None, skip_replayed: bool = False,
           limit: int | None = None, dry_run: bool = False, tag: str | None = None) -> list[dict[str, Any]]:
    if tag is not None:
        check_tag(tag)
    if ids is None and kind is None and queue is None and state is None and since is None:
        raise JoblaneError("replay needs a filter: job ids, kind, queue, state or since")
    states = [state] if isinstance(state, str) else (list(state) if state is not None else None)
    for s in states or ():
        if s not in JOB_STATES:
            raise JoblaneError(f"unknown state {s!r}: use one of {', '.join(JOB_STATES)}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise JoblaneError(f"limit must be a positive integer, got {limit!r}")
    patch = _patch_json(app, payload_patch)
    stmt = app.store.replay_jobs(list(ids) if ids is not None else None, kind, queue, states,
                                 parse_when(since, "since"), parse_when(until, "until"), skip_replayed, limit, patch,
                                 dry_run, app.notify, app.channel, tag)
    rows = _rows(app, conn, stmt)
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


def check_tag(tag: Any) -> str:
    """A replay tag: 1-100 characters of letters, digits, '-', '_', '.', ':'."""
    if not isinstance(tag, str) or not 1 <= len(tag) <= 100 or not all(c.isalnum() or c in "-_.:" for c in tag):
        raise JoblaneError(f"a replay tag is 1-100 letters, digits, '-', '_', '.' or ':', got {tag!r}")
    return tag


# -- the attempt audit trail ---------------------------------------------------------

_ATTEMPT_KEYS = ("id", "job_id", "kind", "queue", "attempt", "outcome", "worker", "started_at", "finished_at",
                 "error", "meta", "job_state")
EXPORT_KEYS = ("id", "job_id", "kind", "queue", "attempt", "outcome", "worker", "started_at", "finished_at",
               "latency_ms", "error", "meta", "job_state", "replay_of")


def _filters(kind, queue, outcome, model, since, until) -> tuple:
    if outcome is not None and outcome not in OUTCOMES:
        raise JoblaneError(f"unknown outcome {outcome!r}: use one of {', '.join(OUTCOMES)}")
    return kind, queue, outcome, model, parse_when(since, "since"), parse_when(until, "until")


def list_attempts(app: Any, conn: Any = None, *, kind: str | None = None, queue: str | None = None,
                  outcome: str | None = None, model: str | None = None, since: Any = None, until: Any = None,
                  job_id: int | None = None, before_id: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    stmt = app.store.list_attempts(*_filters(kind, queue, outcome, model, since, until), job_id, before_id, limit)
    out = []
    for row in _rows(app, conn, stmt):
        item = dict(zip(_ATTEMPT_KEYS, row))
        item["meta"] = json.loads(item["meta"]) if item["meta"] else None
        out.append(item)
    return out


def export_attempts(app: Any, conn: Any = None, *, kind: str | None = None, queue: str | None = None,
                    outcome: str | None = None, model: str | None = None, since: Any = None, until: Any = None,
                    page_size: int = 2000) -> Iterator[dict[str, Any]]:
    """Every matching attempt, oldest first, read in pages through a server-side cursor (filters checked now)."""
    stmt = app.store.export_attempts(*_filters(kind, queue, outcome, model, since, until))
    if conn is not None:
        store.check_sync(conn, "export_attempts")
    return _stream(app, conn, stmt, page_size, EXPORT_KEYS, _export_item)


def _export_item(item: dict[str, Any]) -> dict[str, Any]:
    item["meta"] = json.loads(item["meta"]) if item["meta"] else {}
    return item


def _stream(app: Any, conn: Any, stmt: store.Statement, page_size: int, keys: tuple[str, ...],
            decode: Callable[[dict[str, Any]], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The rows of ``stmt`` as ``decode``d dicts of ``keys``, through a server-side cursor on ``conn``
    (or a connection of the app's own, closed at the end)."""
    own = app.connect() if conn is None else None
    try:
        for row in store.stream(own or conn, stmt, page=page_size):
            yield decode(dict(zip(keys, row)))
    finally:
        if own is not None:
            own.close()


# -- queue limits and pauses -----------------------------------------------------------

_LIMIT_KEYS = ("queue", "max_starts", "starts_interval", "concurrency", "max_cost", "cost_interval", "estimate",
               "default_estimate", "key", "per_key", "paused_until", "pause_reason", "running", "starts", "cost")


def limits(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """Every limited or paused queue with its limits, pause and current usage."""
    return [dict(zip(_LIMIT_KEYS, r)) for r in _rows(app, conn, app.store.queue_limits_status())]


def save_limit(app: Any, limit: Any, conn: Any = None) -> None:
    """Write ``limit`` (a ratelimit.Limit) for its queue, replacing what was there."""
    _rows(app, conn, app.store.upsert_queue_limit(*limit.args()))


def remove_limit(app: Any, queue: str, conn: Any = None) -> bool:
    return bool(_rows(app, conn, app.store.delete_queue_limit(queue)))


def pause_queue(app: Any, conn: Any, queue: str, seconds: float, reason: str | None = None) -> Any:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_DELAY:
        raise JoblaneError(f"pause seconds must be a positive number, got {seconds!r}")
    return _rows(app, conn, app.store.pause_queue(check_queue(queue), float(seconds), reason))[0][0]


def resume_queue(app: Any, conn: Any, queue: str) -> bool:
    return bool(_rows(app, conn, app.store.resume_queue(queue)))


# -- budgets (spend caps) ----------------------------------------------------------------

_BUDGET_KEYS = ("budget", "queue", "cap", "window_seconds", "key_field", "estimate_field", "default_estimate",
                "cost_field", "window_start", "window_end", "cap_source", "declared_cap", "cap_set_at", "key", "spent",
                "in_flight", "waiting")


def _budget_rows(rows: list[tuple]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        item = dict(zip(_BUDGET_KEYS, row))
        item["at_cap"] = item["key"] is not None and item["spent"] + item["in_flight"] >= item["cap"]
        item["kind"] = "budget"
        out.append(item)
    return out


def budget_status(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """Every budget with each key's spend in its current window (settled, in flight) and the jobs it holds back;
    a budget with no spend yet has one row with key None."""
    return _budget_rows(_rows(app, conn, app.store.budget_spend(None)))


def save_budget(app: Any, budget: Any, conn: Any = None) -> None:
    """Write ``budget`` (a budgets.Budget), replacing the one of that name."""
    _rows(app, conn, app.store.upsert_budget(*budget.args()))


def set_budget_cap(app: Any, name: str, cap: Any, conn: Any = None) -> bool:
    from .budgets import check_cap

    return bool(_rows(app, conn, app.store.set_budget_cap(name, check_cap(cap))))


def reset_budget_cap(app: Any, name: str, conn: Any = None) -> float | None:
    rows = _rows(app, conn, app.store.reset_budget_cap(name))
    return rows[0][1] if rows else None


def describe_cap_source(row: dict[str, Any]) -> str:
    """Where a budget's cap comes from, in words: declared in code, or set by an operator (and over what)."""
    if row["cap_source"] != "operator":
        return "declared in code"
    if row["declared_cap"] is None:
        return "set by an operator"
    return f"set by an operator (declared {row['declared_cap']:g})"


def remove_budget(app: Any, name: str, conn: Any = None) -> bool:
    return bool(_rows(app, conn, app.store.delete_budget(name)))


# -- the dataset export ------------------------------------------------------------------

DATASET_KEYS = ("attempt_id", "job_id", "kind", "queue", "attempt", "outcome", "started_at", "finished_at",
                "latency_ms", "model", "prompt_version", "tokens", "cost", "error", "input", "output", "steps",
                "label", "reviewer", "reviewed_at", "review_note", "review_edit", "replay_of", "replay_tag")
_DATASET_JSON = ("input", "output", "steps", "review_edit")
_DATASET_COLUMNS = DATASET_KEYS + ("edits",)


def dataset(app: Any, conn: Any = None, *, kind: str | None = None, queue: str | None = None, since: Any = None,
            until: Any = None, page_size: int = 2000) -> Iterator[dict[str, Any]]:
    """One record per finished try, oldest first, streamed through a server-side cursor (filters checked now):
    input payload, output (the result, or the hold data), the steps, model, prompt version, tokens, cost,
    latency, outcome, and the review label of a held try (approve, approve_edited with its edit, reject)."""
    stmt = app.store.dataset_rows(kind, queue, parse_when(since, "since"), parse_when(until, "until"))
    if conn is not None:
        store.check_sync(conn, "dataset")
    return _stream(app, conn, stmt, page_size, _DATASET_COLUMNS, _dataset_item)


def _dataset_item(item: dict[str, Any]) -> dict[str, Any]:
    edits = item.pop("edits")
    for key in _DATASET_JSON:
        if item[key] is not None:
            item[key] = json.loads(item[key])
    if edits is not None:
        item["input"] = input_before_edits(item["input"], json.loads(edits))
    return item


def input_before_edits(payload: Any, edits: list[dict[str, Any]]) -> Any:
    """``payload`` with reviewers' edits undone, newest first: each edit's keys dropped, then the values it
    replaced put back (an edit recorded without them is left as it is: what it replaced is unknown)."""
    if not isinstance(payload, dict):
        return payload
    for edit in edits:
        patch, before = edit.get("patch"), edit.get("before")
        if not isinstance(patch, dict) or not isinstance(before, dict):
            continue
        payload = {k: v for k, v in payload.items() if k not in patch} | before
    return payload


# -- replay comparisons ------------------------------------------------------------------

_PAIR_KEYS = ("original_id", "kind", "original_state", "original_result", "original_tries", "original_held",
              "original_cost", "original_latency_ms", "replay_id", "replay_state", "replay_result", "replay_tries",
              "replay_held", "replay_cost", "replay_latency_ms", "changed")


def _side(pairs: list[dict[str, Any]], side: str) -> dict[str, Any]:
    states = [p[f"{side}_state"] for p in pairs]
    n = len(pairs)
    done, failed, cancelled = states.count("done"), states.count("failed"), states.count("cancelled")
    finished = done + failed + cancelled
    held = sum(1 for p in pairs if p[f"{side}_held"])
    costs = [p[f"{side}_cost"] for p in pairs if p[f"{side}_cost"] is not None]
    latencies = [p[f"{side}_latency_ms"] for p in pairs if p[f"{side}_latency_ms"] is not None]
    return {
        "jobs": n, "done": done, "failed": failed, "cancelled": cancelled, "held": states.count("held"),
        "unfinished": n - finished - states.count("held"),
        "success_rate": done / finished if finished else None,
        "hold_rate": held / n if n else None,  # share of jobs with a try that was held for review
        "tries": sum(p[f"{side}_tries"] for p in pairs),
        "cost": sum(costs) if costs else None,
        "cost_per_job": sum(costs) / n if costs else None,
        "latency_ms_per_job": sum(latencies) / len(latencies) if latencies else None,
    }


def compare_replay(app: Any, tag: str, conn: Any = None) -> dict[str, Any]:
    """The replays tagged ``tag`` against their originals: per side the jobs, success rate (done of the finished),
    hold rate (jobs with a held try), tries, cost and time per job; how many outputs changed (both done, results
    differ), how many failures the replay fixed and how many successes it lost; and every pair."""
    check_tag(tag)
    pairs = [dict(zip(_PAIR_KEYS, r)) for r in _rows(app, conn, app.store.compare_replay(tag))]
    for p in pairs:
        for key in ("original_result", "replay_result"):
            p[key] = json.loads(p[key]) if p[key] is not None else None
    return {
        "tag": tag,
        "original": _side(pairs, "original"),
        "replay": _side(pairs, "replay"),
        "changed": sum(1 for p in pairs if p["changed"]),
        "fixed": sum(1 for p in pairs if p["replay_state"] == "done" and p["original_state"] != "done"),
        "regressed": sum(1 for p in pairs if p["original_state"] == "done" and p["replay_state"] == "failed"),
        "pairs": pairs,
    }


def replay_tags(app: Any, conn: Any = None, *, limit: int = 100) -> list[dict[str, Any]]:
    """The replay tags in use, newest first."""
    return [{"tag": t, "jobs": n, "first_at": first, "last_at": last}
            for t, n, first, last in _rows(app, conn, app.store.replay_tags(limit))]


# -- the step cache ----------------------------------------------------------------------

_CACHE_KEYS = ("step", "entries", "expired", "calls_in_progress", "hits", "tokens_saved", "cost_saved", "oldest",
               "last_hit")


def cache_stats(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """Per cached step: stored results, expired ones, calls in progress, hits, and what the hits saved."""
    return [dict(zip(_CACHE_KEYS, r)) for r in _rows(app, conn, app.store.cache_stats())]


def clear_cache(app: Any, conn: Any = None, *, older_than: Any = None, step: str | None = None) -> int:
    """Delete cached results stored more than ``older_than`` ago (a duration; None: all) and expired ones,
    of ``step`` or every step; returns how many."""
    before = None if older_than is None else parse_when(older_than, "older_than")
    return int(_rows(app, conn, app.store.cache_clear(before, step))[0][0])


# -- the outbox -----------------------------------------------------------------------

_OUTBOX_KEYS = ("id", "topic", "key", "idempotency_key", "state", "attempts", "max_attempts", "run_after",
                "last_error", "created_at", "sent_at", "relay", "lease_until")


def outbox_messages(app: Any, conn: Any = None, *, state: str | None = None, topic: str | None = None,
                    before_id: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Outbox rows newest first, by state and topic prefix; page with ``before_id``."""
    if state is not None and state not in OUTBOX_STATES:
        raise JoblaneError(f"unknown outbox state {state!r}: use one of {', '.join(OUTBOX_STATES)}")
    rows = _rows(app, conn, app.store.list_outbox(state, topic, before_id, limit))
    return [dict(zip(_OUTBOX_KEYS, r)) for r in rows]


def outbox_message(app: Any, message_id: int, conn: Any = None) -> dict[str, Any] | None:
    rows = _rows(app, conn, app.store.get_outbox(message_id))
    if not rows:
        return None
    row = dict(zip((*_OUTBOX_KEYS, "payload", "headers"), rows[0]))
    row["payload"] = json.loads(row["payload"])
    row["headers"] = json.loads(row["headers"])
    return row


def outbox_counts(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """Rows per topic and state, with the age of the oldest pending row."""
    return [{"topic": t, "state": s, "messages": n, "oldest_pending_seconds": age}
            for t, s, n, age in _rows(app, conn, app.store.outbox_counts())]


def unrouted_outbox(app: Any, conn: Any = None, *, prefixes: Sequence[str] | None = None,
                    limit: int = 100) -> dict[str, Any]:
    """Pending outbox rows whose topic no route matches, per topic (most first): they wait until one does.

    ``prefixes``: the routes to judge by; by default the app's own routes and
    every live relay's (a relay registers its prefixes, ``*`` for every
    topic). ``relays`` says how many relays are live: with none (and an app
    that routes nothing) every pending row waits, for a relay rather than a
    route.
    """
    live = [p for p in processes(app, conn) if p["role"] == "relay"]
    if prefixes is None:
        known = {r.prefix for r in getattr(app, "routes", ())}
        known.update("" if t == "*" else t for p in live for t in p["queues"])
        prefixes = sorted(known)
    rows = _rows(app, conn, app.store.unrouted_outbox(list(prefixes), limit))
    return {"relays": len(live), "prefixes": list(prefixes),
            "topics": [{"topic": t, "messages": n, "oldest_seconds": age} for t, n, age in rows]}


def retry_outbox(app: Any, conn: Any = None, *, ids: Sequence[int] | None = None, topic: str | None = None,
                 all_failed: bool = False, attempts: int = 10) -> list[int]:
    """Failed rows back to pending, each with ``attempts`` more tries; by id, by topic prefix, or all."""
    if ids is None and topic is None and not all_failed:
        raise JoblaneError("outbox retry needs message ids, a topic prefix or all_failed=True")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100_000:
        raise JoblaneError("attempts must be an integer from 1 to 100000")
    rows = _rows(app, conn, app.store.retry_outbox(list(ids) if ids is not None else None, topic, ids is None,
                                                   attempts))
    return sorted(r[0] for r in rows)


def discard_outbox(app: Any, conn: Any = None, *, ids: Sequence[int]) -> list[int]:
    """Delete unsent messages (pending or failed) so they are never delivered; returns the ids discarded."""
    rows = _rows(app, conn, app.store.discard_outbox(list(ids)))
    return sorted(r[0] for r in rows)
