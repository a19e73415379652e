"""The classify step's model call: one chat-completions request over HTTP (httpx), parsed into an Answer.

Works against any OpenAI-compatible API (``settings.model_url``). A 429 is
raised as ``RateLimited`` with the provider's ``Retry-After``; other
failures of the call (5xx, network) as ``ModelUnavailable``, worth a retry;
an answer that is not the JSON asked for as ``BadAnswer``, not worth one.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .settings import Settings

SYSTEM_PROMPT = """\
You qualify inbound leads for a company selling developer infrastructure.
The user message is one lead as JSON: the form fields and what we know about the company.
Answer with one JSON object and nothing else:
{"intent": "buying" | "support" | "job" | "spam" | "partnership" | "unclear",
 "fit": "high" | "medium" | "low",
 "confidence": a number from 0 to 1,
 "reason": "one short sentence"}
fit is high for companies of 200 or more employees in software, fintech, logistics, healthcare,
insurance, telecom or manufacturing; medium for other companies of 20 or more employees;
low for smaller or unknown companies and personal email addresses."""

INTENTS = ("buying", "support", "job", "spam", "partnership", "unclear")
FITS = ("high", "medium", "low")


class RateLimited(Exception):
    def __init__(self, retry_after: float, message: str):
        super().__init__(message)
        self.retry_after = retry_after


class ModelUnavailable(Exception):
    """The call failed in a way a later try may not (5xx, timeout, connection)."""


class BadAnswer(Exception):
    """The model answered, but not with the JSON object the prompt asks for."""


@dataclass
class Answer:
    intent: str
    fit: str
    confidence: float
    reason: str
    model: str
    tokens_in: int
    tokens_out: int
    latency_ms: int


def user_message(lead: dict[str, Any], enrichment: dict[str, Any]) -> str:
    return json.dumps({
        "name": lead["name"], "company": lead["company"], "message": lead["message"],
        "email_domain": enrichment["domain"], "personal_email": enrichment["personal_email"],
        "industry": enrichment["industry"], "employees": enrichment["employees"],
        "size_band": enrichment["size_band"], "country": enrichment["country"],
    }, ensure_ascii=False)


def _retry_after(response: httpx.Response, default: float = 1.0) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", default)))
    except ValueError:
        return default


def parse(content: str) -> dict[str, Any]:
    """The answer's JSON object, checked; BadAnswer when it is anything else."""
    try:
        data = json.loads(content)
    except ValueError:
        raise BadAnswer(f"model answer is not JSON: {content[:80]!r}") from None
    if not isinstance(data, dict):
        raise BadAnswer(f"model answer is not a JSON object: {content[:80]!r}")
    intent, fit, confidence = data.get("intent"), data.get("fit"), data.get("confidence")
    if intent not in INTENTS or fit not in FITS or not isinstance(confidence, (int, float)) \
            or not 0 <= confidence <= 1:
        raise BadAnswer(f"model answer lacks intent/fit/confidence: {content[:80]!r}")
    return data


async def classify(client: httpx.AsyncClient, settings: Settings, lead: dict, enrichment: dict) -> Answer:
    body = {
        "model": settings.model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_message(lead, enrichment)},
        ],
    }
    started = time.monotonic()
    try:
        response = await client.post(f"{settings.model_url}/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {settings.api_key}"})
    except httpx.HTTPError as exc:
        raise ModelUnavailable(f"model call failed: {type(exc).__name__}: {exc}") from None
    latency_ms = round((time.monotonic() - started) * 1000)
    if response.status_code == 429:
        raise RateLimited(_retry_after(response), f"model rate limit (429): {_error_text(response)}")
    if response.status_code >= 500 or response.status_code in (408, 409):
        raise ModelUnavailable(f"model answered HTTP {response.status_code}: {_error_text(response)}")
    if response.status_code >= 400:
        # a bad key or a bad request: retrying will not help, but a person can fix the settings
        raise BadAnswer(f"model refused the request, HTTP {response.status_code}: {_error_text(response)}")
    reply = response.json()
    content = reply["choices"][0]["message"]["content"] or ""
    usage = reply.get("usage") or {}
    data = parse(content)
    return Answer(intent=data["intent"], fit=data["fit"], confidence=float(data["confidence"]),
                  reason=str(data.get("reason", ""))[:200], model=reply.get("model", settings.model),
                  tokens_in=int(usage.get("prompt_tokens", 0)), tokens_out=int(usage.get("completion_tokens", 0)),
                  latency_ms=latency_ms)


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])[:200]
    except Exception:
        return " ".join(response.text[:200].split())


_clients: dict[int, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    """One HTTP client per event loop, kept for the life of the worker."""
    loop = id(asyncio.get_running_loop())
    found = _clients.get(loop)
    if found is None:
        found = _clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
    return found
