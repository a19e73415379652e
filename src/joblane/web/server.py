"""The dashboard as a Starlette application: server-rendered pages, plain forms, no asset from elsewhere."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shlex
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote, unquote, urlencode

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import App
from ..errors import JoblaneError
from ..rules import first_line, format_age, hold_reason, parse_when
from ..types import JOB_STATES
from . import actions
from .charts import history_chart, latency_chart, throughput_chart
from .data import BATCH_PAGE, HISTORY_WINDOWS, PAGE_SIZE, Data
from .metrics import registry_for, render
from .security import AUTH_COOKIE, CSRF_COOKIE, CSRF_FIELD, Guard, safe_next

HERE = Path(__file__).resolve().parent
FLASH_COOKIE = "joblane_flash"
REFRESH_SECONDS = 5
MAX_IDS_PER_ACTION = 1000
MAX_BULK = 100_000  # jobs one bulk action may touch; more asks for a narrower search
SEARCH_FIELDS = ("state", "kind", "queue", "since", "until", "payload", "error")
# The states each bulk action takes jobs from (the guarded statements check them again).
BULK_STATES = {"retry": ("failed", "cancelled"), "cancel": ("pending", "held", "running"), "release": ("held",),
               "reject": ("held",), "replay": ("done", "failed", "cancelled")}

CSP = ("default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


# -- formatting helpers for the templates -----------------------------------

age = format_age


def since(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return age((dt.datetime.now(dt.timezone.utc) - value).total_seconds()) + " ago"


def when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(start: dt.datetime | None, end: dt.datetime | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = (end - start).total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def seconds(value: float | None) -> str:
    """A latency: ms under a second, else seconds, minutes, hours."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    return age(value)


def count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def parse_time(text: str | None, what: str) -> dt.datetime | None:
    """A filter's time: ``30m``, ``24h``, ``7d`` (that long ago) or an ISO time (rules.parse_when: UTC without an offset)."""
    try:
        return parse_when(text, what)
    except JoblaneError:
        raise JoblaneError(f"{what}: use a duration like 30m, 24h, 7d or a time like 2025-01-31T09:00"
                           " (UTC unless it has an offset)") from None


def parse_ids(values: list[str]) -> list[int]:
    ids = []
    for v in values:
        for part in str(v).replace(",", " ").split():
            try:
                ids.append(int(part))
            except ValueError:
                raise JoblaneError(f"job ids are integers, got {part!r}") from None
    if len(ids) > MAX_IDS_PER_ACTION:
        raise JoblaneError(f"{len(ids)} ids in one action; the limit is {MAX_IDS_PER_ACTION}")
    return sorted(set(ids))


def parse_payload_filter(text: str | None) -> dict[str, Any] | None:
    """A payload search: a JSON object (containment, jsonb @>) or ``key=value`` pairs (dotted keys nest; values
    are JSON when they parse, else text), e.g. ``tenant=acme usage.model="small-1" retries=3``."""
    if not text or not text.strip():
        return None
    text = text.strip()
    if text.startswith("{"):
        return actions.parse_json_object(text, "payload")
    try:
        pairs = shlex.split(text)
    except ValueError as exc:
        raise JoblaneError(f"payload: {exc}") from None
    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise JoblaneError(f"payload: use key=value (or a JSON object like {{\"tenant\": \"acme\"}}), got {pair!r}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        node = found
        *path, last = key.split(".")
        for part in path:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise JoblaneError(f"payload: {key!r} conflicts with another key")
            node = nxt
        node[last] = parsed
    return found


def bulk_search(search: dict[str, Any], verb: str) -> dict[str, Any]:
    """The search narrowed to the states ``verb`` acts on (the chosen state, if the action takes it)."""
    allowed = BULK_STATES[verb]
    chosen_states = search.get("states")
    if chosen_states:
        wrong = [s for s in chosen_states if s not in allowed]
        if wrong:
            raise HTTPException(400, f"{verb} acts on {' or '.join(allowed)} jobs, not {wrong[0]} ones")
        return search
    return {**search, "states": list(allowed)}


def pause_seconds(text: str) -> float:
    """How long a pause lasts: ``90s``, ``5m``, ``1h``, ``2d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise JoblaneError(f"pause for how long? use 90s, 5m, 1h or 2d, got {text!r}") from None
    if not 0 < seconds <= 30 * 86400:
        raise JoblaneError("a pause lasts from 1 second to 30 days")
    return seconds


def limit_options(form: Any) -> dict[str, Any]:
    """The limits form: rate (starts per interval), concurrency, weighted cost with its estimate field."""
    options: dict[str, Any] = {}
    rate = str(form.get("rate") or "").strip()
    if rate:
        options["rate"] = rate
    concurrency = str(form.get("concurrency") or "").strip()
    if concurrency:
        try:
            options["concurrency"] = int(concurrency)
        except ValueError:
            raise JoblaneError(f"concurrency must be a whole number, got {concurrency!r}") from None
    cost = str(form.get("cost") or "").strip()
    if cost:
        options["cost"] = cost
        estimate = str(form.get("estimate") or "").strip()
        if estimate:
            options["estimate"] = estimate
    if not options:
        raise JoblaneError("give a limit: starts per interval (10/s), concurrency, or a weighted cost (90000/min)")
    return options


def _int_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise HTTPException(400, f"{name} must be an integer, got {value!r}") from None


def _page_mark(value: str | None) -> tuple[dt.datetime, int] | None:
    """The review queue's keyset mark: "<held since, ISO>,<id>" of the last row shown."""
    if not value:
        return None
    when_text, _, id_text = value.rpartition(",")
    try:
        mark = dt.datetime.fromisoformat(when_text)
        return (mark if mark.tzinfo else mark.replace(tzinfo=dt.timezone.utc)), int(id_text)
    except ValueError:
        raise HTTPException(400, f"after must look like <ISO time>,<job id>, got {value!r}") from None


# -- the security layer -----------------------------------------------------

class SecurityMiddleware:
    """Host check, sign-in, the CSRF cookie and the response headers that keep the page to itself."""

    def __init__(self, app: ASGIApp, guard: Guard):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = scope["path"]
        if not self.guard.host_allowed(request):
            response: Response = PlainTextResponse(
                "this dashboard answers on localhost only (bind another --host with JOBLANE_DASHBOARD_TOKEN set)", 421)
            await response(scope, receive, send)
            return
        public = path == "/login" or path.startswith("/static/")
        if not public and not self.guard.authenticated(request):
            if request.method == "GET" and path != "/metrics":
                response = RedirectResponse("/login?" + urlencode({"next": safe_next(str(request.url.path))}), 303)
            else:
                response = PlainTextResponse("sign in first: send Authorization: Bearer <JOBLANE_DASHBOARD_TOKEN>",
                                             401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = not nonce
        if fresh:
            nonce = self.guard.new_nonce()
        scope.setdefault("state", {})["csrf"] = self.guard.csrf_token(nonce)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("content-security-policy", CSP)
                headers.setdefault("x-content-type-options", "nosniff")
                headers.setdefault("x-frame-options", "DENY")
                headers.setdefault("referrer-policy", "same-origin")
                if not path.startswith("/static/"):
                    headers.setdefault("cache-control", "no-store")
                if fresh:
                    headers.append("set-cookie", f"{CSRF_COOKIE}={nonce}; Path=/; HttpOnly; SameSite=Strict")
            await send(message)

        await self.app(scope, receive, send_with_headers)


# -- the application ----------------------------------------------------------

class Dashboard:
    """Routes and handlers; ``create_app`` builds one and returns its Starlette application."""

    def __init__(self, app: App, *, read_only: bool, guard: Guard, refresh_seconds: int = REFRESH_SECONDS):
        self.app = app
        self.read_only = read_only
        self.guard = guard
        self.refresh_seconds = refresh_seconds
        self.data = Data(app)
        self.registry = registry_for(self.data)
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(HERE / "templates")),
            autoescape=True,  # everything from the database is text, never markup
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(age=age, since=since, when=when, pretty_json=pretty_json, count=count, duration=duration,
                           hold_reason=hold_reason, compact_json=compact_json, seconds=seconds)
        self.templates = Jinja2Templates(env=env)
        self.capabilities = dict.fromkeys(actions.ACTIONS, True)

    # -- plumbing ---------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, *, fragment: bool = False,
               **context: Any) -> Response:
        """A page (or, with ``fragment``, a piece of one that leaves the flash message for the page)."""
        flash = None if fragment else request.cookies.get(FLASH_COOKIE)
        message = None
        if flash:
            kind, _, text = unquote(flash).partition(":")
            message = {"kind": kind if kind in ("ok", "error") else "ok", "text": text}
        base = {
            "schema": self.app.schema,
            "read_only": self.read_only,
            "can": {k: v and not self.read_only for k, v in self.capabilities.items()},
            "csrf": request.state.csrf,
            "csrf_field": CSRF_FIELD,
            "flash": message,
            "signed_in": self.guard.token is not None and self.guard.authenticated(request),
            # the navigation is for those who may see the pages: everyone on loopback, else the signed-in
            "show_nav": self.guard.token is None or self.guard.authenticated(request),
            "path": request.url.path,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        response = self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
        if flash:
            response.delete_cookie(FLASH_COOKIE, path="/")
        return response

    def back(self, target: str, message: str, *, error: bool = False) -> Response:
        response = RedirectResponse(safe_next(target), 303)
        response.set_cookie(FLASH_COOKIE, quote(("error:" if error else "ok:") + message[:500]),
                            path="/", httponly=True, samesite="strict")
        return response

    async def action_form(self, request: Request) -> FormData:
        """The form of a state-changing request, after the read-only and CSRF checks."""
        if self.read_only:
            raise HTTPException(403, "this dashboard runs with --read-only: actions are turned off")
        form = await request.form()
        if not self.guard.csrf_ok(request, form.get(CSRF_FIELD)):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and submit again")
        return form

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(fn, *args)

    def with_conn(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with self.data.connection() as conn:
                return fn(conn, *args)
        return run

    def actor(self, request: Request) -> str:
        client = request.client.host if request.client else "unknown"
        return f"dashboard@{client}"

    # -- pages --------------------------------------------------------------

    async def overview_data(self) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            return {"counts": self.data.queue_counts(), "minutes": self.data.throughput(),
                    "workers": self.data.workers(), "outbox": self.data.outbox_topics(),
                    "paused": self.data.paused_queues(),
                    "capped": [b for b in self.data.budgets() if b["at_cap"]],
                    "health": self.data.health()["warnings"]}

        loaded = await self.db(load)
        return {**loaded, "chart": throughput_chart(loaded["minutes"]), "states": JOB_STATES}

    async def overview(self, request: Request) -> Response:
        refresh = _int_param(request, "refresh")
        refresh_seconds = self.refresh_seconds if refresh is None else max(0, min(3600, refresh))
        return self.render(request, "overview.html", **await self.overview_data(), refresh_seconds=refresh_seconds)

    async def overview_live(self, request: Request) -> Response:
        """The overview's live block alone: what the page's script swaps in at each refresh."""
        return self.render(request, "overview_live.html", fragment=True, **await self.overview_data())

    async def jobs(self, request: Request) -> Response:
        raw, search, error = self.search_of(request.query_params)
        before = _int_param(request, "before")
        rows: list[dict[str, Any]] = []
        stopped = None
        if error is None:
            try:
                rows, stopped = await self.db(
                    lambda: self.data.search_jobs(search, before_id=before, limit=PAGE_SIZE + 1))
            except psycopg.errors.QueryCanceled:
                error = "the search took too long: narrow it (a queue, a kind, a state or a time range)"
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        keep = {k: v for k, v in raw.items() if v}
        next_url = ("/jobs?" + urlencode({**keep, "before": rows[-1]["id"]})) if more else None
        if stopped is not None:  # this page's slices ran out: older jobs are not searched yet
            next_url = "/jobs?" + urlencode({**keep, "before": stopped})
        first_url = ("/jobs?" + urlencode(keep)) if before is not None else None
        return self.render(request, "jobs.html", jobs=rows, filters=raw, states=JOB_STATES, error=error,
                           next_url=next_url, first_url=first_url, query=urlencode(keep), stopped=stopped,
                           bulk_actions=BULK_STATES)

    def search_of(self, params: Any) -> tuple[dict[str, str], dict[str, Any], str | None]:
        """A jobs search from query or form fields: (the fields as typed, the parsed search, an error or None)."""
        raw = {key: str(params.get(key) or "").strip() for key in SEARCH_FIELDS}
        state = raw["state"] or None
        if state is not None and state not in JOB_STATES:
            raise HTTPException(400, f"unknown state {state!r}: use one of {', '.join(JOB_STATES)}")
        search: dict[str, Any] = {"states": [state] if state else None, "kind": raw["kind"] or None,
                                  "queue": raw["queue"] or None, "error": raw["error"] or None}
        try:
            search["since"] = parse_time(raw["since"], "since")
            search["until"] = parse_time(raw["until"], "until")
            search["payload"] = parse_payload_filter(raw["payload"])
        except JoblaneError as exc:
            return raw, search, str(exc)
        return raw, search, None

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = await self.db(self.data.job, job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id} in schema {self.app.schema}")
        return self.render(request, "job.html", job=job)

    async def review(self, request: Request) -> Response:
        after = _page_mark(request.query_params.get("after"))
        queue = request.query_params.get("queue") or None
        rows = await self.db(lambda: self.data.held(after=after, queue=queue, limit=PAGE_SIZE + 1))
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        keep = {"queue": queue} if queue else {}
        next_url = None
        if more:
            last = rows[-1]
            next_url = "/review?" + urlencode({**keep, "after": f"{last['held_since'].isoformat()},{last['id']}"})
        return self.render(request, "review.html", held=rows, queue=queue, next_url=next_url,
                           first_url=("/review?" + urlencode(keep)) if after is not None else None)

    async def compare(self, request: Request) -> Response:
        """Replays tagged TAG against their originals (joblane compare TAG); without a tag, the tags in use."""
        tag = request.path_params.get("tag")
        tags = await self.db(self.data.replay_tags)
        report = None
        if tag is not None:
            try:
                report = await self.db(self.data.compare_replay, tag)
            except JoblaneError as exc:
                raise HTTPException(400, str(exc)) from None
            if not report["pairs"]:
                raise HTTPException(404, f"no replays tagged {tag!r}")
        job_id = _int_param(request, "job")
        pair = None
        if report is not None and job_id is not None:
            pair = next((p for p in report["pairs"] if job_id in (p["original_id"], p["replay_id"])), None)
        return self.render(request, "compare.html", tags=tags, tag=tag, report=report, pair=pair)

    async def batches(self, request: Request) -> Response:
        before = _int_param(request, "before")
        rows = await self.db(lambda: self.data.batches(before_id=before, limit=PAGE_SIZE + 1))
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        next_url = ("/batches?" + urlencode({"before": rows[-1]["id"]})) if more else None
        return self.render(request, "batches.html", batches=rows, next_url=next_url)

    async def batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        state = request.query_params.get("state") or None
        if state is not None and state not in JOB_STATES:
            raise HTTPException(400, f"unknown state {state!r}: use one of {', '.join(JOB_STATES)}")
        after = _int_param(request, "after")
        found = await self.db(lambda: self.data.batch(batch_id, state=state, limit=BATCH_PAGE, after_id=after))
        if found is None:
            raise HTTPException(404, f"no batch {batch_id} in schema {self.app.schema}")
        keep = {"state": state} if state else {}
        next_url = (f"/batches/{batch_id}?" + urlencode({**keep, "after": found["jobs"][-1]["id"]})
                    if found["more"] else None)
        first_url = f"/batches/{batch_id}" + ("?" + urlencode(keep) if keep else "") if after else None
        # how many jobs the filter matches, from the batch's own counts
        matching = found[state] if state else found["total"]
        return self.render(request, "batch.html", batch=found, state_filter=state, states=JOB_STATES,
                           next_url=next_url, first_url=first_url, matching=matching, batch_page=BATCH_PAGE)

    async def outbox(self, request: Request) -> Response:
        before = _int_param(request, "before")
        topic = request.query_params.get("topic") or None

        def load() -> dict[str, Any]:
            return {"topics": self.data.outbox_topics(), "unrouted": self.data.outbox_unrouted(),
                    "retrying": self.data.outbox_retrying(topic=topic),
                    "failed": self.data.outbox_failed(before_id=before, topic=topic, limit=PAGE_SIZE + 1)}

        loaded = await self.db(load)
        failed = loaded["failed"]
        more = len(failed) > PAGE_SIZE
        failed = failed[:PAGE_SIZE]
        keep = {"topic": topic} if topic else {}
        next_url = ("/outbox?" + urlencode({**keep, "before": failed[-1]["id"]})) if more else None
        return self.render(request, "outbox.html", topics=loaded["topics"], failed=failed, topic=topic,
                           retrying=loaded["retrying"], unrouted=loaded["unrouted"],
                           next_url=next_url)

    async def workers_page(self, request: Request) -> Response:
        workers = await self.db(lambda: self.data.workers(job_sample=8))
        return self.render(request, "workers.html", workers=workers)

    async def queues_page(self, request: Request) -> Response:
        queues = await self.db(self.data.queues)
        return self.render(request, "queues.html", queues=queues)

    async def history_page(self, request: Request) -> Response:
        window = request.query_params.get("window") or "24h"
        if window not in HISTORY_WINDOWS:
            raise HTTPException(400, f"unknown window {window!r}: use one of {', '.join(HISTORY_WINDOWS)}")
        history = await self.db(self.data.history, window)
        step = history["step"]
        charts = {
            "all": history_chart(history["series"], step),
            # the small ones sit two abreast: half the width, so their labels keep a readable size
            "queues": {q: history_chart(s, step, width=600, height=130)
                       for q, s in history["series_by_queue"].items()},
            "kinds": {k: history_chart(s, step, width=600, height=130)
                      for k, s in history["series_by_kind"].items()},
            "waits": {q: latency_chart(s, step) for q, s in history["waits_by_queue"].items()},
        }
        return self.render(request, "history.html", h=history, windows=list(HISTORY_WINDOWS), charts=charts)

    async def outbox_message(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]
        message = await self.db(self.data.outbox_message, message_id)
        if message is None:
            raise HTTPException(404, f"no outbox message {message_id} in schema {self.app.schema}")
        from ..outbox.routes import DEFAULT_MAX_ATTEMPTS, route_for

        # a row's own budget is set by `outbox retry`; until then its route's applies, as the relay logs it
        route = route_for(list(self.app.routes), message["topic"])
        return self.render(request, "outbox_message.html", m=message,
                           route_max_attempts=route.max_attempts if route else DEFAULT_MAX_ATTEMPTS)

    async def bulk_page(self, request: Request) -> Response:
        """What a bulk action would do to every job a search matches: the count, before confirming."""
        verb = request.query_params.get("action") or ""
        if verb not in BULK_STATES:
            raise HTTPException(400, f"unknown action {verb!r}: use one of {', '.join(BULK_STATES)}")
        raw, search, error = self.search_of(request.query_params)
        total, sample = 0, []
        if error is None:
            search = bulk_search(search, verb)
            total, sample = await self.db(lambda: self.data.search_ids(search, 20))
        keep = {k: v for k, v in raw.items() if v}
        return self.render(request, "bulk.html", verb=verb, filters=raw, error=error, total=total, sample=sample,
                           states=search.get("states") or BULK_STATES[verb], back="/jobs?" + urlencode(keep),
                           limit=MAX_BULK)

    async def replay_page(self, request: Request) -> Response:
        """The replay form; ``?ids=...&preview=1`` (from a job's page) opens it with a dry run shown."""
        q = request.query_params
        form = {key: q.get(key, "") for key in ("kind", "queue", "since", "ids", "patch")}
        form["state"] = q.get("state", "failed")
        return await self.replay_form(request, form, preview=bool(q.get("preview")))

    async def replay_preview(self, request: Request) -> Response:
        posted = await request.form()
        if not self.guard.csrf_ok(request, posted.get(CSRF_FIELD)):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and submit again")
        form = {key: str(posted.get(key) or "") for key in ("kind", "queue", "state", "since", "ids", "patch")}
        return await self.replay_form(request, form, preview=True)

    async def replay_form(self, request: Request, form: dict[str, str], *, preview: bool) -> Response:
        rows = None
        error = None
        if preview and self.capabilities["replay"]:
            try:
                filters, patch = self.replay_filters(form)
                rows = await self.db(self.with_conn(
                    lambda conn: actions.replay(self.app, conn, filters, patch, dry_run=True)))
            except JoblaneError as exc:
                error = str(exc)
        return self.render(request, "replay.html", form=form, preview=rows, error=error, states=JOB_STATES)

    def replay_filters(self, form: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
        filters: dict[str, Any] = {}
        for key in ("kind", "queue", "state"):
            value = (form.get(key) or "").strip()
            if value:
                filters[key] = value
        if filters.get("state") and filters["state"] not in JOB_STATES:
            raise JoblaneError(f"unknown state {filters['state']!r}: use one of {', '.join(JOB_STATES)}")
        start = parse_time(form.get("since"), "since")
        if start is not None:
            filters["since"] = start
        ids = parse_ids([form.get("ids") or ""])
        if ids:
            filters["ids"] = ids
        if not filters:
            raise JoblaneError("a replay needs a filter: ids, kind, queue, state or since")
        patch = actions.parse_json_object(form.get("patch"), "payload patch")
        return filters, patch

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        body = await self.db(render, self.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # -- actions ------------------------------------------------------------

    async def act_jobs(self, request: Request) -> Response:
        """Retry or cancel the jobs ticked (or the one named) on any page."""
        verb = request.path_params["verb"]
        if verb not in ("retry", "cancel"):
            raise HTTPException(404, f"no job action {verb!r}: use retry or cancel")
        form = await self.action_form(request)
        target = str(form.get("next") or "/jobs")
        try:
            ids = chosen(form)
            if not ids:
                return self.back(target, f"tick at least one job to {verb}", error=True)
            if verb == "retry":
                done = await self.db(self.with_conn(lambda conn: actions.retry(self.app, conn, ids)))
            else:
                actor = self.actor(request)
                done = await self.db(self.with_conn(lambda conn: actions.cancel(self.app, conn, ids, actor)))
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)
        past = "retried" if verb == "retry" else "cancelled"
        return self.back(target, summary(past, ids, done))

    async def act_review(self, request: Request) -> Response:
        """Release (approve) or reject held jobs, one or many, optionally with an edited payload for one."""
        verb = request.path_params["verb"]
        if verb not in ("release", "reject"):
            raise HTTPException(404, f"no review action {verb!r}: use release or reject")
        form = await self.action_form(request)
        target = str(form.get("next") or "/review")
        actor = self.actor(request)
        try:
            ids = chosen(form)
            if not ids:
                return self.back(target, f"tick at least one held job to {verb}", error=True)
            patch = actions.parse_json_object(form.get("payload_patch"), "payload patch")
            if patch and len(ids) > 1:
                raise JoblaneError("edit the payload of one job at a time")
            reason = str(form.get("reason") or "").strip() or "rejected from the dashboard"
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)

        def run(conn: Any) -> tuple[list[int], list[str]]:
            done, problems = [], []
            for i in ids:  # one guarded statement each: a job decided meanwhile is reported, not redone
                try:
                    if verb == "release":
                        actions.release(self.app, conn, i, patch, actor)
                    else:
                        actions.reject(self.app, conn, i, reason, actor)
                    done.append(i)
                except JoblaneError as exc:
                    problems.append(str(exc))
            return done, problems

        done, problems = await self.db(self.with_conn(run))
        past = "approved" if verb == "release" else "rejected"
        if problems and not done:
            return self.back(target, "; ".join(problems[:5]), error=True)
        text = f"{past} {len(done)} job{'s' if len(done) != 1 else ''}: " + ", ".join(f"#{i}" for i in done[:20])
        if problems:
            text += "; " + "; ".join(problems[:5])
        return self.back(target, text, error=bool(problems))

    async def act_replay(self, request: Request) -> Response:
        form = await self.action_form(request)
        try:
            filters, patch = self.replay_filters(form)
            result = await self.db(self.with_conn(
                lambda conn: actions.replay(self.app, conn, filters, patch, dry_run=False)))
        except JoblaneError as exc:
            query = urlencode({k: form.get(k) or "" for k in ("kind", "queue", "state", "since", "ids", "patch")})
            return self.back("/replay?" + query, str(exc), error=True)
        ids = replay_ids(result)
        shown = ", ".join(f"#{i}" for i in ids[:20]) + ("..." if len(ids) > 20 else "")
        return self.back("/jobs",
                         f"replayed {len(ids)} job{'s' if len(ids) != 1 else ''}" + (f": {shown}" if ids else ""))

    async def act_outbox(self, request: Request) -> Response:
        form = await self.action_form(request)
        target = str(form.get("next") or "/outbox")
        try:
            ids = chosen(form)
            if not ids:
                return self.back(target, "tick at least one failed message to retry", error=True)
            done = await self.db(self.with_conn(lambda conn: actions.outbox_retry(self.app, conn, ids)))
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)
        done_ids = list(done) if isinstance(done, (list, tuple)) else ids
        return self.back(target, summary("re-queued", ids, done_ids, noun="message"))

    async def act_bulk(self, request: Request) -> Response:
        """Apply an action to every job a search matches (in the states the action takes), not just one page."""
        form = await self.action_form(request)
        verb = str(form.get("action") or "")
        if verb not in BULK_STATES:
            raise HTTPException(400, f"unknown action {verb!r}: use one of {', '.join(BULK_STATES)}")
        raw, search, error = self.search_of(form)
        keep = {k: v for k, v in raw.items() if v}
        target = "/jobs?" + urlencode(keep)
        if error is not None:
            return self.back(target, error, error=True)
        search = bulk_search(search, verb)
        if not any(search.get(k) for k in ("kind", "queue", "since", "until", "payload", "error")) and not raw["state"]:
            return self.back(target, f"{verb} on every job needs a search: a state, queue, kind, time, payload"
                                     " or error", error=True)
        total, ids = await self.db(lambda: self.data.search_ids(search, MAX_BULK + 1))
        if total > MAX_BULK:
            return self.back(target, f"{total:,} jobs match; act on at most {MAX_BULK:,} at once: narrow the search",
                             error=True)
        actor = self.actor(request)
        reason = str(form.get("reason") or "").strip() or f"{verb} from the dashboard"

        def run(conn: Any) -> list[int]:
            done: list[int] = []
            for start in range(0, len(ids), MAX_IDS_PER_ACTION):
                chunk = ids[start:start + MAX_IDS_PER_ACTION]
                if verb == "retry":
                    done += actions.retry(self.app, conn, chunk)
                elif verb == "cancel":
                    done += actions.cancel(self.app, conn, chunk, actor)
                elif verb == "release":
                    done += actions.release_many(self.app, conn, chunk, actor)
                elif verb == "reject":
                    done += actions.reject_many(self.app, conn, chunk, reason, actor)
                else:
                    done += replay_ids(actions.replay(self.app, conn, {"ids": chunk}, None, dry_run=False))
            return done

        try:
            done = await self.db(self.with_conn(run))
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)
        past = {"retry": "retried", "cancel": "cancelled", "release": "released", "reject": "rejected",
                "replay": "replayed"}[verb]
        text = f"{past} {len(done):,} of {total:,} matching job{'s' if total != 1 else ''}"
        if verb == "replay" and done:
            text += " as new jobs"
        if len(done) < total:
            text += f"; {total - len(done):,} changed state meanwhile and were left alone"
        return self.back(target, text)

    async def act_queue(self, request: Request) -> Response:
        """Pause, resume, or set or clear the limits of a queue, for every worker at once."""
        verb = request.path_params["verb"]
        if verb not in ("pause", "resume", "limits", "unlimit"):
            raise HTTPException(404, f"no queue action {verb!r}: use pause, resume, limits or unlimit")
        form = await self.action_form(request)
        queue = str(form.get("queue") or "").strip()
        target = "/queues"
        if not queue:
            return self.back(target, "name the queue", error=True)
        try:
            if verb == "pause":
                seconds = pause_seconds(str(form.get("for") or ""))
                reason = str(form.get("reason") or "").strip() or "paused from the dashboard"
                await self.db(self.with_conn(lambda conn: actions.pause(self.app, conn, queue, seconds, reason)))
                return self.back(target, f"paused {queue} for {age(seconds)}")
            if verb == "resume":
                was = await self.db(self.with_conn(lambda conn: actions.resume(self.app, conn, queue)))
                return self.back(target, f"resumed {queue}" if was else f"{queue} was not paused", error=not was)
            if verb == "unlimit":
                had = await self.db(self.with_conn(lambda conn: actions.remove_limit(self.app, conn, queue)))
                return self.back(target, f"removed the limits of {queue}" if had else f"{queue} has no limits",
                                 error=not had)
            options = limit_options(form)
            limit = await self.db(self.with_conn(lambda conn: actions.save_limit(self.app, conn, queue, options)))
            return self.back(target, f"{queue}: {limit.describe()}")
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)

    async def act_outbox_discard(self, request: Request) -> Response:
        form = await self.action_form(request)
        target = str(form.get("next") or "/outbox")
        try:
            ids = chosen(form)
            if not ids:
                return self.back(target, "tick at least one message to discard", error=True)
            done = await self.db(self.with_conn(lambda conn: actions.outbox_discard(self.app, conn, ids)))
        except JoblaneError as exc:
            return self.back(target, str(exc), error=True)
        if target.startswith("/outbox/") and done:
            target = "/outbox"  # the message's own page is gone
        return self.back(target, summary("discarded", ids, done, noun="message"))

    # -- sign-in ------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        if self.guard.token is None:
            return RedirectResponse(target, 303)
        error = None
        if request.method == "POST":
            form = await request.form()
            if not self.guard.csrf_ok(request, form.get(CSRF_FIELD)):
                error = "the form expired: try again"
            elif self.guard.token_matches(str(form.get("token") or "")):
                response = RedirectResponse(safe_next(str(form.get("next") or "/")), 303)
                response.set_cookie(AUTH_COOKIE, self.guard.auth_cookie_value(), path="/", httponly=True,
                                    samesite="strict")
                return response
            else:
                error = "that is not the dashboard's token"
        return self.render(request, "login.html", status=401 if error else 200, target=target, error=error)

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not self.guard.csrf_ok(request, form.get(CSRF_FIELD)):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and submit again")
        response = RedirectResponse("/login", 303)
        response.delete_cookie(AUTH_COOKIE, path="/")
        return response

    # -- errors -------------------------------------------------------------

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if "csrf" not in request.scope.get("state", {}):
            return PlainTextResponse(str(exc.detail), exc.status_code)
        return self.render(request, "error.html", status=exc.status_code, status_code=exc.status_code,
                           message=str(exc.detail))

    async def database_error(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", status=503, status_code=503,
                           message=f"database error: {first_line(exc)}")

    # -- assembly -----------------------------------------------------------

    def routes(self) -> list[Any]:
        return [
            Route("/", self.overview, methods=["GET"]),
            Route("/live/overview", self.overview_live, methods=["GET"]),
            Route("/workers", self.workers_page, methods=["GET"]),
            Route("/queues", self.queues_page, methods=["GET"]),
            Route("/history", self.history_page, methods=["GET"]),
            Route("/queues/{verb:str}", self.act_queue, methods=["POST"]),
            Route("/jobs", self.jobs, methods=["GET"]),
            Route("/jobs/bulk", self.bulk_page, methods=["GET"]),
            Route("/jobs/bulk", self.act_bulk, methods=["POST"]),
            Route("/jobs/{job_id:int}", self.job, methods=["GET"]),
            Route("/jobs/{verb:str}", self.act_jobs, methods=["POST"]),
            Route("/review", self.review, methods=["GET"]),
            Route("/review/{verb:str}", self.act_review, methods=["POST"]),
            Route("/replay", self.replay_page, methods=["GET"]),
            Route("/replay", self.act_replay, methods=["POST"]),
            Route("/replay/preview", self.replay_preview, methods=["POST"]),
            Route("/compare", self.compare, methods=["GET"]),
            Route("/compare/{tag:str}", self.compare, methods=["GET"]),
            Route("/batches", self.batches, methods=["GET"]),
            Route("/batches/{batch_id:int}", self.batch, methods=["GET"]),
            Route("/outbox", self.outbox, methods=["GET"]),
            Route("/outbox/retry", self.act_outbox, methods=["POST"]),
            Route("/outbox/discard", self.act_outbox_discard, methods=["POST"]),
            Route("/outbox/{message_id:int}", self.outbox_message, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]


def chosen(form: FormData) -> list[int]:
    """The ids an action applies to: the row whose own button was pressed, else every ticked box."""
    one = form.get("one")
    return parse_ids([str(one)]) if one else parse_ids([str(v) for v in form.getlist("ids")])


def summary(past: str, asked: list[int], done: list[int], noun: str = "job") -> str:
    done = sorted(done)
    text = f"{past} {len(done)} {noun}{'s' if len(done) != 1 else ''}"
    if done:
        text += ": " + ", ".join(f"#{i}" for i in done[:20]) + ("..." if len(done) > 20 else "")
    skipped = [i for i in asked if i not in set(done)]
    if skipped:
        text += f"; skipped {', '.join(f'#{i}' for i in skipped[:20])} (not in a state that allows it)"
    return text


def replay_ids(result: list[dict[str, Any]]) -> list[int]:
    """The ids of the copies App.replay inserted."""
    return [r["id"] for r in result if r.get("id") is not None]


def create_app(
    app: App,
    *,
    read_only: bool = False,
    token: str | None = None,
    loopback_only: bool = True,
    allowed_hosts: tuple[str, ...] = (),
    refresh_seconds: int = REFRESH_SECONDS,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application.

    ``loopback_only`` (the default, for a dashboard bound to 127.0.0.1)
    answers only requests addressed to a loopback name; ``token`` (from
    ``JOBLANE_DASHBOARD_TOKEN``) makes every page ask for it.
    """
    guard = Guard(token=token, loopback_only=loopback_only, extra_hosts=allowed_hosts)
    dashboard = Dashboard(app, read_only=read_only, guard=guard, refresh_seconds=refresh_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette):
        await run_in_threadpool(dashboard.data.open)
        try:
            yield
        finally:
            await run_in_threadpool(dashboard.data.close)

    web = Starlette(
        routes=dashboard.routes(),
        exception_handlers={HTTPException: dashboard.http_error, psycopg.OperationalError: dashboard.database_error},
        lifespan=lifespan,
    )
    web.add_middleware(SecurityMiddleware, guard=guard)
    web.state.dashboard = dashboard
    return web
