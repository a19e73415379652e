"""A local stand-in for a CRM whose API cannot deduplicate, like many real ones.

``POST /contacts`` creates a contact every time it is called, so a request
sent twice makes two contacts; ``GET /contacts?email=`` searches. Requests
take tens of milliseconds and a few fail with 503 and ``Retry-After``
(nothing is created then).

``stall_after(n)`` makes the n-th create hang after the contact is stored,
as if the answer were lost on the way back: the demo kills the relay while
it waits, so the message is in the CRM but not marked sent.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

FIELDS = ("external_id", "email", "name", "company", "domain", "industry", "size_band", "intent", "fit",
          "confidence", "source")


class LocalCrm:
    def __init__(self, *, latency_ms: tuple[int, int] = (15, 60), error_rate: float = 0.03, seed: int = 11):
        self.contacts: list[dict[str, Any]] = []
        self.in_progress = 0  # creates being handled right now
        self.stats: Counter[str] = Counter()
        self.latency_ms = latency_ms
        self.error_rate = error_rate
        self._rng = random.Random(seed)
        self._stall_at: int | None = None
        self.stalled = asyncio.Event()  # set while a create hangs after storing its contact
        self._release = asyncio.Event()
        self.app = Starlette(routes=[
            Route("/contacts", self.create, methods=["POST"]),
            Route("/contacts", self.search, methods=["GET"]),
        ])

    def stall_after(self, creates: int | None) -> None:
        """Hang the answer to the ``creates``-th successful create (counting from now) until ``release()``;
        None: no stall."""
        self._stall_at = None if creates is None else self.stats["created"] + creates

    def release(self) -> None:
        self._release.set()

    async def _pause(self) -> None:
        low, high = self.latency_ms
        await asyncio.sleep(self._rng.uniform(low, high) / 1000)

    async def create(self, request: Request) -> JSONResponse:
        self.stats["posts"] += 1
        self.in_progress += 1
        try:
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse({"error": "body must be JSON"}, status_code=400)
            except ClientDisconnect:  # the caller went away before its request arrived whole
                return JSONResponse({"error": "incomplete request"}, status_code=400)
            # From here the request is processed whether or not the caller is still there to hear back.
            await self._pause()
            if self._rng.random() < self.error_rate:
                self.stats["errors_503"] += 1
                return JSONResponse({"error": "temporarily unavailable"}, status_code=503, headers={"Retry-After": "1"})
            if not isinstance(body, dict) or not body.get("email"):
                return JSONResponse({"error": "email is required"}, status_code=422)
            contact = {"id": len(self.contacts) + 1, **{k: body.get(k) for k in FIELDS}}
            self.contacts.append(contact)  # no idempotency: every call creates a contact
            self.stats["created"] += 1
            if self._stall_at is not None and self.stats["created"] == self._stall_at:
                self._stall_at = None
                self.stalled.set()
                try:
                    await asyncio.wait_for(self._release.wait(), 8.0)
                except asyncio.TimeoutError:
                    pass
            return JSONResponse(contact, status_code=201)
        finally:
            self.in_progress -= 1

    async def search(self, request: Request) -> JSONResponse:
        self.stats["searches"] += 1
        await self._pause()
        email = request.query_params.get("email")
        found = [c for c in self.contacts if email is None or c["email"] == email.lower()]
        return JSONResponse({"contacts": found})
