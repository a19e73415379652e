"""The web form (Starlette): the lead and its first job commit in one transaction; the page answers at once.

    GET  /            the form, and the latest leads with where each one is
    POST /leads       insert the lead + enqueue ``enrich``; 303 to the lead's page
                      (400 on bad input, and nothing is written)
    GET  /leads/{id}  one lead: status, enrichment, classification, current job
                      (JSON with Accept: application/json)
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import joblane
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from . import db

EMAIL = re.compile(r"^[^@\s]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,24}$")
LIMITS = {"name": 200, "email": 254, "company": 200, "message": 4000}

_pages = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")),
                     autoescape=select_autoescape(default=True))


def clean(form: Any) -> tuple[dict[str, str], str | None]:
    """The submitted fields, trimmed, and the first problem with them (None when there is none)."""
    values = {k: str(form.get(k) or "").strip() for k in LIMITS}
    values["email"] = values["email"].lower()
    for field, limit in LIMITS.items():
        if len(values[field]) > limit:
            return values, f"{field} is longer than {limit} characters"
        if "\x00" in values[field]:
            return values, f"{field} contains a NUL character"
    if not values["name"]:
        return values, "please give your name"
    if not EMAIL.match(values["email"]):
        return values, "please give a valid email address"
    if not values["message"]:
        return values, "please tell us how we can help"
    return values, None


def create_form(app: joblane.App, dsn: str | None = None, *, pool_size: int = 8) -> Starlette:
    """The form as an ASGI app writing leads to ``app``'s schema on ``dsn`` (default: the app's)."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_web: Starlette):
        from psycopg_pool import AsyncConnectionPool

        state["pool"] = AsyncConnectionPool(dsn or app.dsn, min_size=1, max_size=pool_size, open=False)
        await state["pool"].open(wait=True, timeout=30)
        try:
            yield
        finally:
            await state["pool"].close()

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(_pages.get_template(name).render(**context), status_code=status)

    async def index(request: Request) -> Response:
        async with state["pool"].connection() as conn:
            recent = await db.rows(conn, "recent", app.schema, 15)
        return page("form.html", form={}, recent=recent, error=None)

    async def submit(request: Request) -> Response:
        async with request.form(max_files=0, max_fields=10) as form:
            values, problem = clean(form)
        if problem:
            return page("form.html", 400, form=values, recent=[], error=problem)
        # The rule: the lead and the job that finishes it commit together, or neither does.
        async with state["pool"].connection() as conn, conn.transaction():
            lead = await db.one(conn, "insert", app.schema, values["name"], values["email"], values["company"],
                                values["message"])
            job_id = await app.enqueue_async(conn, "enrich", {"lead_id": lead["id"]})
            await db.one(conn, "set_job", app.schema, job_id, lead["id"])
        return RedirectResponse(f"/leads/{lead['id']}", status_code=303)

    async def show(request: Request) -> Response:
        try:
            lead_id = int(request.path_params["lead_id"])
        except ValueError:
            return JSONResponse({"error": "lead ids are integers"}, status_code=404)
        async with state["pool"].connection() as conn:
            lead = await db.one(conn, "with_job", app.schema, lead_id)
        if lead is None:
            return JSONResponse({"error": f"no lead {lead_id}"}, status_code=404)
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in lead.items()})
        return page("lead.html", lead=lead)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(lifespan=lifespan, routes=[
        Route("/", index, methods=["GET"]),
        Route("/leads", submit, methods=["POST"]),
        Route("/leads/{lead_id}", show, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])
