"""HTTP webhooks (httpx): the idempotency key travels in the ``Idempotency-Key`` header.

2xx is delivered; 408, 429 and 5xx are retried, honouring ``Retry-After``;
any other status fails the row at once, with the response in ``last_error``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import socket
from typing import Any, Awaitable, Callable, Mapping, Sequence

import httpx

from ..message import Delivery, Message, describe
from .base import Sink, standard_headers

RETRYABLE = {408, 425, 429}
ERROR_BODY = 500


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - dt.datetime.now(dt.timezone.utc)).total_seconds())


def classify(response: httpx.Response) -> Delivery:
    code = response.status_code
    if 200 <= code < 300:
        return Delivery.sent()
    text = " ".join(response.text[:ERROR_BODY].split())
    error = f"HTTP {code} {response.reason_phrase}" + (f": {text}" if text else "")
    if code in RETRYABLE or code >= 500:
        return Delivery.retry(error, after=retry_after_seconds(response.headers.get("Retry-After")))
    return Delivery.failed(error)


def explain(exc: BaseException) -> str:
    """``describe(exc)``, with the root cause when the client's own text hides it.

    httpx says ``ConnectError: All connection attempts failed`` for a refused
    connection; the ``ConnectionRefusedError`` underneath is what to fix.
    """
    text = describe(exc)
    root, seen = exc, {id(exc)}
    while True:
        below = root.__cause__ or root.__context__
        if below is None or id(below) in seen:
            break
        seen.add(id(below))
        root = below
    if root is not exc and str(root) and str(root) not in text:
        text += f" ({describe(root)})"
    return text


class HttpSink(Sink):
    """POST each message's JSON payload to ``url`` (a string with optional
    ``{topic}``/``{key}`` placeholders, or a function of the message).

    ``find_url`` enables read-back: before a re-send, a GET on
    ``find_url(message)`` answering 2xx means the destination already has the
    record (404 means it does not).
    """

    name = "http"

    def __init__(
        self,
        url: str | Callable[[Message], str],
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        concurrency: int = 32,
        find_url: Callable[[Message], str] | None = None,
        find: Callable[[Message], Awaitable[bool]] | None = None,
        client: httpx.AsyncClient | None = None,
        **client_options: Any,
    ):
        super().__init__(find=find)
        if concurrency < 1:
            raise ValueError("HttpSink: concurrency must be at least 1")
        self.url = url
        self.method = method.upper()
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.concurrency = concurrency
        self.find_url = find_url
        self._client = client
        self._own_client = client is None
        self._client_options = client_options
        self._limit = asyncio.Semaphore(concurrency)

    @property
    def reads_back(self) -> bool:
        return self.find_url is not None or self._find is not None

    async def open(self) -> None:
        if self._client is None:
            options = dict(self._client_options)
            if "transport" not in options:
                # A request's headers and body leave in separate writes; without
                # TCP_NODELAY the body can wait for the server's delayed ACK.
                options["transport"] = httpx.AsyncHTTPTransport(
                    limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
                    socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
                )
            self._client = httpx.AsyncClient(timeout=self.timeout, **options)

    async def close(self) -> None:
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None

    def request_for(self, message: Message) -> tuple[str, str, dict[str, str]]:
        """(method, url, headers) of the request that delivers ``message``."""
        url = self.url(message) if callable(self.url) else self.url.format(topic=message.topic, key=message.key or "")
        headers = {"Content-Type": "application/json", **self.headers, **standard_headers(message, "Idempotency-Key")}
        return self.method, url, headers

    async def _one(self, message: Message) -> Delivery:
        try:
            method, url, headers = self.request_for(message)
        except (KeyError, ValueError, IndexError) as exc:
            return Delivery.failed(f"cannot build the request: {describe(exc)}")
        async with self._limit:
            try:
                response = await self._client.request(method, url, content=message.body, headers=headers)
            except UnicodeEncodeError as exc:
                return Delivery.failed(f"a header is not ASCII: {describe(exc)}")
            except httpx.HTTPError as exc:
                return Delivery.retry(f"{method} {url}: {explain(exc)}")
        return classify(response)

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        if self._client is None:
            await self.open()
        return list(await asyncio.gather(*(self._one(m) for m in messages)))

    async def find(self, message: Message) -> bool:
        if self.find_url is None:
            return await super().find(message)
        if self._client is None:
            await self.open()
        response = await self._client.get(self.find_url(message), headers={"Idempotency-Key": message.idempotency_key})
        if response.status_code == 404:
            return False
        if 200 <= response.status_code < 300:
            return True
        raise RuntimeError(f"read-back answered HTTP {response.status_code}")
