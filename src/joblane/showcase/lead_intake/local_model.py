"""A local stand-in for an OpenAI-compatible model provider: ``POST /v1/chat/completions``.

It behaves like a busy provider: answers take a few hundred milliseconds,
more than ``rate_per_second`` requests in a second are refused with 429 and
``Retry-After``, every ``burst_every`` seconds it refuses everything for
``burst_seconds`` (a capacity incident), and a few requests fail with 500.
The answers themselves are deterministic: the same lead always gets the same
intent, fit and confidence, read from the lead's words and company data.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter, deque
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

KEYWORDS = {
    "buying": ("pricing", "price", "quote", "demo", "trial", "seats", "licen", "purchase", "evaluat", "migrat",
               "rollout", "procurement", "budget", "contract", "pilot"),
    "support": ("error", "log in", "login", "password", "invoice", "refund", "broken", "outage", "bug", "ticket"),
    "job": ("resume", " cv", "internship", "interns", "apply", "hiring", "career", "job posting"),
    "spam": ("seo", "backlink", "crypto", "casino", "guest post", "rank your", "returns"),
    "partnership": ("partner", "reseller", "affiliate", "agency"),
}
TARGET_INDUSTRIES = {"software", "fintech", "logistics", "healthcare", "insurance", "telecom", "manufacturing"}


@dataclass
class Behaviour:
    rate_per_second: int = 20
    retry_after: float = 1.0
    burst_every: float = 12.0
    burst_seconds: float = 1.5
    burst_retry_after: float = 2.0
    error_rate: float = 0.03
    latency_ms: tuple[int, int] = (250, 900)
    seed: int = 7


def _jitter(text: str, spread: float) -> float:
    """A deterministic number in [-spread, spread] for ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    return (int.from_bytes(digest[:4], "big") / 0xFFFFFFFF * 2 - 1) * spread


def judge(lead: dict) -> dict:
    """The answer a careful reader of this lead would give, as the prompt asks for it."""
    message = " " + str(lead.get("message", "")).lower()
    hits = {intent: sum(word in message for word in words) for intent, words in KEYWORDS.items()}
    ranked = sorted(hits.items(), key=lambda kv: -kv[1])
    (intent, best), (_, second) = ranked[0], ranked[1]
    if best == 0:
        intent, confidence, reason = "unclear", 0.35, "the message says too little to tell what they want"
    elif best == second:
        confidence, reason = 0.5, "the message asks for several different things"
    else:
        confidence = 0.7 if best == 1 else 0.9
        reason = f"the message reads as {intent}"
    employees = lead.get("employees")
    if lead.get("personal_email") or employees is None or employees < 20:
        fit = "low"
    elif employees >= 200 and lead.get("industry") in TARGET_INDUSTRIES:
        fit = "high"
    else:
        fit = "medium"
    if employees is None and intent == "buying":
        confidence -= 0.1  # an unknown company: less sure the interest is real
    confidence = round(min(0.99, max(0.05, confidence + _jitter(json.dumps(lead, sort_keys=True), 0.06))), 2)
    return {"intent": intent, "fit": fit, "confidence": confidence, "reason": reason}


def answer(messages: list[dict]) -> str:
    """The assistant's reply to a conversation whose last user message is a lead as JSON."""
    user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    try:
        lead = json.loads(user)
    except ValueError:
        return "Please send the lead as a JSON object."
    if not isinstance(lead, dict):
        return "Please send the lead as a JSON object."
    if "ignore" in str(lead.get("message", "")).lower() and "instructions" in str(lead.get("message", "")).lower():
        # like a real model, it can be talked out of its format
        return "Roses are red, queues are deep; your leads are safe while workers sleep."
    return json.dumps(judge(lead))


class LocalModel:
    """The server's state: the behaviour, a window of recent requests, and counters for the demo."""

    def __init__(self, behaviour: Behaviour | None = None):
        self.behaviour = behaviour or Behaviour()
        self.stats: Counter[str] = Counter()
        self._admitted: deque[float] = deque()
        self._rng = random.Random(self.behaviour.seed)
        self._started = time.monotonic()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ])

    def _refusal(self) -> float | None:
        """Seconds to ask the caller to wait, or None to serve the request."""
        b, now = self.behaviour, time.monotonic()
        if b.burst_every > 0 and (now - self._started) % b.burst_every >= b.burst_every - b.burst_seconds:
            self.stats["burst_429"] += 1
            return b.burst_retry_after
        while self._admitted and self._admitted[0] <= now - 1.0:
            self._admitted.popleft()
        if len(self._admitted) >= b.rate_per_second:
            self.stats["rate_429"] += 1
            return b.retry_after
        self._admitted.append(now)
        return None

    async def chat_completions(self, request: Request) -> JSONResponse:
        self.stats["requests"] += 1
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return _error(401, "Missing bearer token.", "invalid_request_error")
        try:
            body = await request.json()
            messages = body["messages"]
            model = str(body.get("model") or "lead-classifier-small")
        except (ValueError, KeyError, TypeError):
            return _error(400, "Body must be JSON with a messages array.", "invalid_request_error")
        wait = self._refusal()
        if wait is not None:
            return _error(429, f"Rate limit reached for {model}. Please try again in {wait:g}s.", "requests",
                          headers={"Retry-After": f"{wait:g}"})
        low, high = self.behaviour.latency_ms
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 4 * len(messages)
        await asyncio.sleep(min(high, low + prompt_tokens // 2 + self._rng.uniform(0, (high - low) / 2)) / 1000)
        if self._rng.random() < self.behaviour.error_rate:
            self.stats["errors_500"] += 1
            return _error(500, "The server had an error while processing your request.", "server_error")
        content = answer(messages)
        completion_tokens = max(1, len(content) // 4)
        self.stats["answered"] += 1
        self.stats["prompt_tokens"] += prompt_tokens
        self.stats["completion_tokens"] += completion_tokens
        return JSONResponse({
            "id": f"chatcmpl-{self.stats['requests']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "lead-classifier-small", "object": "model"}]})


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status_code=status,
                        headers=headers)
