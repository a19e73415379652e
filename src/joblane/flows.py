"""Workflows on the caller's connection: dependencies (after=), batches, signals for durable waits.

The database does the work (migration 0004's functions and the ``jobs_flow``
trigger): a child is released, cancelled or held in the transaction of its
last parent's completion; a batch's callback is inserted in the transaction
of its last job's completion. This module checks the arguments and runs the
statements of ``sql/flows.sql`` after the jobs themselves are inserted.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from . import store
from .enqueue import check_options
from .errors import JoblaneError
from .rules import check_text, to_json
from .types import PARENT_FAILURE_POLICIES, JobSpec

_BATCH_KEYS = ("id", "name", "on_complete", "created_at", "sealed_at", "finished_at", "callback_job_id", "counts")


def check_policy(policy: str | None) -> str:
    if policy is None:
        return "cancel"
    if policy not in PARENT_FAILURE_POLICIES:
        raise JoblaneError(f"on_parent_failure must be one of {', '.join(PARENT_FAILURE_POLICIES)}, got {policy!r}")
    return policy


def check_parents(after: Any) -> list[int]:
    """``after=``: job ids (ints), at least one."""
    if isinstance(after, int) and not isinstance(after, bool):
        after = [after]
    try:
        parents = list(after)
    except TypeError:
        raise JoblaneError(f"after= takes job ids, got {type(after).__name__}") from None
    for p in parents:
        if not isinstance(p, int) or isinstance(p, bool) or p < 1:
            raise JoblaneError(f"after= takes job ids (positive integers), got {p!r}")
    if not parents:
        raise JoblaneError("after= names no job: leave it out for a job with no parents")
    return parents


def check_enqueue(args: list[Any], after: Any, policy: str | None,
                  batch: Any) -> tuple[list[int] | None, str, bool]:
    """The checks of an enqueue with ``after=`` or ``batch=``, on enqueue.prepare's ``args``.

    Returns (parents, policy, notify): a job with parents is inserted
    ``waiting`` (args is changed in place) and notifies no one, since it
    cannot run until link_jobs has counted its parents.
    """
    parents = check_parents(after) if after is not None else None
    policy = check_policy(policy)
    if batch is not None:
        batch_id(batch)
    if parents is None:
        return None, policy, True
    if args[8] != "pending":
        raise JoblaneError("a job with after= cannot be enqueued held")
    args[8] = "waiting"
    return parents, policy, False


def batch_id(batch: Any) -> int:
    """A Batch or a batch id."""
    value = getattr(batch, "id", batch)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise JoblaneError(f"batch= takes a Batch (App.batch) or its id, got {batch!r}")
    return value


def edges(children: Sequence[int], parents: Sequence[Sequence[int]], policies: Sequence[str]) -> tuple:
    """The three parallel arrays of ``link_jobs``: one element per (child, parent)."""
    c, p, pol = [], [], []
    for child, its_parents, policy in zip(children, parents, policies):
        for parent in its_parents:
            if parent == child:
                raise JoblaneError(f"job {child} cannot run after itself")
            c.append(child)
            p.append(parent)
            pol.append(policy)
    return c, p, pol


def link_statement(app: Any, children: Sequence[int], parents: Sequence[Sequence[int]],
                   policies: Sequence[str]) -> store.Statement:
    return app.store.link_jobs(*edges(children, parents, policies))


def spec_flows(specs: list[Any], ids: list[int]) -> tuple[list[int], list[list[int]], list[str]]:
    """The dependencies of an enqueue_many call, once its ids are known.

    ``JobSpec.after`` holds job ids or JobSpec objects of the same call (a
    parent created in the same transaction).
    """
    where = {id(spec): i for i, spec in enumerate(specs)}
    children, parents, policies = [], [], []
    for i, spec in enumerate(specs):
        after = getattr(spec, "after", None) if type(spec) is JobSpec else None
        if after is None:
            continue
        named = []
        for p in (after if isinstance(after, (list, tuple)) else [after]):
            if type(p) is JobSpec:
                if id(p) not in where:
                    raise JoblaneError(f"jobs[{i}]: after= names a JobSpec that is not in this enqueue_many call")
                named.append(ids[where[id(p)]])
            else:
                named.extend(check_parents(p))
        children.append(ids[i])
        parents.append(named)
        policies.append(check_policy(spec.on_parent_failure))
    return children, parents, policies


def batch_members(specs: list[Any], ids: list[int], batch: Any) -> dict[int, list[int]]:
    """The jobs of an enqueue_many call by the batch they join: ``batch`` for all, or each JobSpec's own."""
    by_batch: dict[int, list[int]] = {}
    if batch is not None:
        by_batch[batch_id(batch)] = list(ids)
    for spec, job_id in zip(specs, ids):
        if type(spec) is JobSpec and spec.batch is not None:
            by_batch.setdefault(batch_id(spec.batch), []).append(job_id)
    return by_batch


class Batch:
    """A batch of jobs with a completion callback (``App.batch``).

    Add jobs with ``batch.enqueue`` / ``batch.enqueue_many`` (or ``batch=``
    on App.enqueue), in as many transactions as you like, then ``seal``:
    when the last job of a sealed batch finishes (done, failed or
    cancelled), the callback job is inserted in that same transaction, once.
    """

    def __init__(self, app: Any, batch_id: int, name: str | None = None):
        self.app = app
        self.id = batch_id
        self.name = name

    def __repr__(self) -> str:
        return f"Batch(id={self.id}, name={self.name!r})"

    def enqueue(self, conn: Any, kind: str, payload: Any = None, **options: Any) -> int:
        return self.app.enqueue(conn, kind, payload, batch=self.id, **options)

    def enqueue_many(self, conn: Any, jobs: Iterable[Any]) -> list[int]:
        return self.app.enqueue_many(conn, jobs, batch=self.id)

    async def enqueue_async(self, conn: Any, kind: str, payload: Any = None, **options: Any) -> int:
        return await self.app.enqueue_async(conn, kind, payload, batch=self.id, **options)

    async def enqueue_many_async(self, conn: Any, jobs: Iterable[Any]) -> list[int]:
        return await self.app.enqueue_many_async(conn, jobs, batch=self.id)

    def seal(self, conn: Any) -> bool:
        """No more jobs join; True when the batch finished now (nothing of it unfinished: the callback is in)."""
        return seal(self.app, conn, self.id)

    async def seal_async(self, conn: Any) -> bool:
        return await seal_async(self.app, conn, self.id)

    def progress(self, conn: Any = None) -> dict[str, Any]:
        found = progress(self.app, self.id, conn)
        if found is None:
            raise JoblaneError(f"batch {self.id} does not exist")
        return found


def create(app: Any, conn: Any, *, name: str | None, on_complete: Any) -> Batch:
    rows = store.fetch(conn, create_statement(app, name, on_complete))
    return Batch(app, rows[0][0], name)


async def create_async(app: Any, conn: Any, *, name: str | None, on_complete: Any) -> Batch:
    rows = await store.fetch_async(conn, create_statement(app, name, on_complete))
    return Batch(app, rows[0][0], name)


def create_statement(app: Any, name: str | None, on_complete: Any) -> store.Statement:
    if name is not None:
        check_text("batch name", name, 200)
    kind = queue = body = priority = max_attempts = None
    if on_complete is not None:
        if not isinstance(on_complete, (tuple, list)) or len(on_complete) not in (1, 2):
            raise JoblaneError("on_complete takes (kind, payload): the callback job's kind and a JSON object")
        kind = on_complete[0]
        payload = on_complete[1] if len(on_complete) == 2 else {}
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise JoblaneError("on_complete's payload must be a JSON object (the batch summary is added as 'batch')")
        queue, priority, max_attempts, _, _, _, _, _ = check_options(
            app, kind, queue=None, priority=None, run_after=None, delay=None, max_attempts=None, unique_key=None,
            held=False)
        body = to_json("on_complete payload", payload, app.max_payload_bytes)
    return app.store.create_batch(name, kind, queue, body, priority, max_attempts)


def add(app: Any, conn: Any, batch: Any, ids: list[int]) -> None:
    if ids:
        store.fetch(conn, app.store.add_to_batch(batch_id(batch), ids))


async def add_async(app: Any, conn: Any, batch: Any, ids: list[int]) -> None:
    if ids:
        await store.fetch_async(conn, app.store.add_to_batch(batch_id(batch), ids))


def seal(app: Any, conn: Any, batch: Any) -> bool:
    return bool(store.fetch(conn, app.store.seal_batch(batch_id(batch)))[0][0])


async def seal_async(app: Any, conn: Any, batch: Any) -> bool:
    return bool((await store.fetch_async(conn, app.store.seal_batch(batch_id(batch))))[0][0])


def _batch_row(row: tuple) -> dict[str, Any]:
    counts = json.loads(row[7]) if row[7] else {}
    out = dict(zip(_BATCH_KEYS, row))
    total = sum(counts.values())
    out["counts"] = counts
    out.update(total=total, **{s: counts.get(s, 0) for s in
                               ("done", "failed", "cancelled", "pending", "running", "held", "waiting")})
    out["state"] = "finished" if row[5] else "sealed" if row[4] else "open"
    return out


def _rows(app: Any, conn: Any, stmt: store.Statement) -> list[tuple]:
    if conn is not None:
        return store.fetch(conn, stmt)
    with app.connect() as own:
        return store.fetch(own, stmt)


def progress(app: Any, batch: Any, conn: Any = None) -> dict[str, Any] | None:
    """A batch and its jobs counted by state (total, done, failed, cancelled, pending, running, held, waiting)."""
    rows = _rows(app, conn, app.store.batch_progress(batch_id(batch)))
    return _batch_row(rows[0]) if rows else None


def list_batches(app: Any, conn: Any = None, *, before_id: int | None = None, limit: int = 50,
                 unfinished: bool = False) -> list[dict[str, Any]]:
    return [_batch_row(r) for r in _rows(app, conn, app.store.list_batches(before_id, limit, unfinished))]


_BATCH_JOB_KEYS = ("id", "kind", "queue", "state", "attempts", "max_attempts", "last_error", "wait_key",
                   "parents_left", "created_at", "finished_at")


def batch_jobs(app: Any, batch: Any, conn: Any = None, *, state: str | None = None,
               limit: int = 200, after_id: int | None = None) -> list[dict[str, Any]]:
    rows = _rows(app, conn, app.store.batch_jobs(batch_id(batch), state, limit, after_id))
    return [dict(zip(_BATCH_JOB_KEYS, r), waits_on=waits_on(r[3], r[7], r[8])) for r in rows]


def waits_on(state: str, wait_key: str | None, parents_left: int | None) -> str | None:
    """What a waiting job waits for, in words."""
    if state != "waiting":
        return None
    if wait_key is not None:
        return f"signal {wait_key}"
    if parents_left:
        return f"{parents_left} parent{'s' if parents_left != 1 else ''}"
    return None


def job_flow(app: Any, job_id: int, conn: Any = None) -> dict[str, Any] | None:
    rows = _rows(app, conn, app.store.job_flow(job_id))
    if not rows:
        return None
    key, deadline, on_timeout, left, policy, batch, parents, children = rows[0]
    return {"wait_key": key, "wait_deadline": deadline, "on_timeout": on_timeout, "parents_left": left,
            "on_parent_failure": policy, "batch_id": batch, "parents": list(parents), "children": list(children)}


_WAITING_KEYS = ("id", "queue", "kind", "wait_key", "parents_left", "deadline", "created_at", "last_error")


def waiting_jobs(app: Any, conn: Any = None, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    return [dict(zip(_WAITING_KEYS, r)) for r in _rows(app, conn, app.store.waiting_jobs(limit, queue))]


def signal_statement(app: Any, key: str, data: Any) -> store.Statement:
    check_text("signal key", key, 1000)
    return app.store.signal(key, None if data is None else to_json("signal data", data, app.max_payload_bytes))

