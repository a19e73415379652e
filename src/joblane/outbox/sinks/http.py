"""HTTP webhooks (aiohttp): the idempotency key travels in the ``Idempotency-Key`` header.

2xx is delivered; 408, 429 and 5xx are retried, honouring ``Retry-After``;
any other status fails the row at once, with the response in ``last_error``.

One ``aiohttp.ClientSession`` per sink keeps its connections alive between
batches; a batch's requests go out together, up to ``concurrency`` at once.
(aiohttp rather than httpx: against a local receiver that answers at once,
httpx's AsyncClient made 640 requests/s one at a time and fewer as more
were in flight; aiohttp made 6,300/s with 8 in flight, docs/benchmarks.md.)
A receiver that takes many messages in one request can opt in with
``batch=N``: up to N messages to the same URL travel as one JSON array, each
element carrying its own ``idempotency_key`` (see ``HttpSink``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import json
from typing import Any, Awaitable, Callable, Mapping, NamedTuple, Sequence

import aiohttp

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


class Answer(NamedTuple):
    """What the receiver answered: status, reason phrase, headers and body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


async def read_answer(response: aiohttp.ClientResponse) -> Answer:
    return Answer(response.status, response.reason or "", response.headers, await response.read())


def classify(response: Answer) -> Delivery:
    code = response.status
    if 200 <= code < 300:
        return Delivery.sent()
    text = " ".join(response.text[:ERROR_BODY].split())
    error = f"HTTP {code} {response.reason}" + (f": {text}" if text else "")
    if code in RETRYABLE or code >= 500:
        return Delivery.retry(error, after=retry_after_seconds(response.headers.get("Retry-After")))
    return Delivery.failed(error)


def _judge_status(code: int, error: str | None, retry_after: float | None) -> Delivery:
    """One element of a batch answer: its status, with the receiver's reason."""
    if 200 <= code < 300:
        return Delivery.sent()
    text = f"HTTP {code}" + (f": {error}" if error else "") + " (in a batch answer)"
    if code in RETRYABLE or code >= 500:
        return Delivery.retry(text, after=retry_after)
    return Delivery.failed(text)


def classify_batch(response: Answer, count: int) -> list[Delivery]:
    """The answer to a batch POST of ``count`` messages, one ``Delivery`` each, in order.

    A non-2xx status applies to every message of the request. A 2xx answer
    whose body is a JSON array of ``count`` elements speaks for each message:
    an element is a status code, or an object with ``status`` and optionally
    ``error`` and ``retry_after`` (seconds). Any other 2xx body means all
    were taken.
    """
    if not 200 <= response.status < 300:
        return [classify(response)] * count
    answers = None
    if response.body.lstrip()[:1] == b"[":
        try:
            answers = json.loads(response.body)
        except ValueError:
            answers = None
    if not isinstance(answers, list):
        return [Delivery.sent()] * count
    if len(answers) != count:
        return [Delivery.retry(f"the batch answer has {len(answers)} results for {count} messages")] * count
    results = []
    for item in answers:
        if isinstance(item, bool) or not isinstance(item, (int, dict)):
            results.append(Delivery.retry(f"unreadable result in the batch answer: {str(item)[:100]}"))
            continue
        if isinstance(item, int):
            results.append(_judge_status(item, None, None))
            continue
        status, error, after = item.get("status"), item.get("error"), item.get("retry_after")
        if isinstance(status, bool) or not isinstance(status, int):
            results.append(Delivery.retry(f"unreadable status in the batch answer: {str(status)[:100]}"))
            continue
        error = " ".join(str(error)[:ERROR_BODY].split()) if error is not None else None
        after = float(after) if isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0 \
            else None
        results.append(_judge_status(status, error, after))
    return results


def explain(exc: BaseException) -> str:
    """``describe(exc)``, with the root cause when the client's own text hides it.

    A refused connection's ``ConnectionRefusedError`` (what to fix) sits
    under the client's own ``ClientConnectorError``.
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

    ``batch=N`` (for receivers that accept it) sends up to N messages bound
    for the same URL in one request: a JSON array of objects
    ``{"idempotency_key", "topic", "key", "headers", "payload"}``, with the
    header ``Joblane-Batch: <count>``. The receiver answers for all of them
    with its status, or (2xx) with a JSON array holding one status code or
    ``{"status", "error", "retry_after"}`` per message, in order: then only
    the messages it refused are retried or failed. ``concurrency`` requests
    are in flight at once either way.

    ``session`` is an ``aiohttp.ClientSession`` of your own (proxies, TLS,
    auth); the sink then neither makes nor closes one. ``timeout`` bounds
    each request, connecting included, in seconds.
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
        session: aiohttp.ClientSession | None = None,
        batch: int | None = None,
    ):
        super().__init__(find=find)
        if concurrency < 1:
            raise ValueError("HttpSink: concurrency must be at least 1")
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise ValueError("HttpSink: batch must be a positive integer (messages per request) or None")
        if not timeout > 0:
            raise ValueError("HttpSink: timeout must be a positive number of seconds")
        self.batch = batch
        self.url = url
        self.method = method.upper()
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.concurrency = concurrency
        self.find_url = find_url
        self._session = session
        self._own_session = session is None
        self._limit = asyncio.Semaphore(concurrency)

    @property
    def reads_back(self) -> bool:
        return self.find_url is not None or self._find is not None

    async def open(self) -> None:
        if self._session is None:
            # keep-alive connections, at most ``concurrency`` of them (TCP_NODELAY is aiohttp's default)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                # a header the caller gave is sent as given; no cookies kept between messages
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def session(self) -> aiohttp.ClientSession:
        """The sink's session, opened on first use (for read-back hooks that make requests of their own)."""
        if self._session is None:
            await self.open()
        return self._session  # type: ignore[return-value]

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
            self._session = None

    def request_for(self, message: Message) -> tuple[str, str, dict[str, str]]:
        """(method, url, headers) of the request that delivers ``message``."""
        url = self.url(message) if callable(self.url) else self.url.format(topic=message.topic, key=message.key or "")
        headers = {"Content-Type": "application/json", **self.headers, **standard_headers(message, "Idempotency-Key")}
        return self.method, url, headers

    async def _request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        session = await self.session()
        # a redirect is the receiver's answer, not followed: a 3xx fails the row with its Location in view
        async with session.request(method, url, data=body, headers=headers, allow_redirects=False) as response:
            return await read_answer(response)

    async def _one(self, message: Message) -> Delivery:
        try:
            method, url, headers = self.request_for(message)
        except (KeyError, ValueError, IndexError) as exc:
            return Delivery.failed(f"cannot build the request: {describe(exc)}")
        async with self._limit:
            try:
                answer = await self._request(method, url, message.body, headers)
            except (UnicodeEncodeError, aiohttp.InvalidURL, ValueError) as exc:
                return Delivery.failed(_unsendable(exc))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return Delivery.retry(f"{method} {url}: {explain(exc)}")
        return classify(answer)

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        if self.batch is None:
            return list(await asyncio.gather(*(self._one(m) for m in messages)))
        results: list[Delivery | None] = [None] * len(messages)
        groups: dict[tuple[str, str], list[int]] = {}  # (method, url) -> indexes, in order
        for i, m in enumerate(messages):
            try:
                method, url, _ = self.request_for(m)
            except (KeyError, ValueError, IndexError) as exc:
                results[i] = Delivery.failed(f"cannot build the request: {describe(exc)}")
                continue
            groups.setdefault((method, url), []).append(i)
        requests = []
        for (method, url), indexes in groups.items():
            for start in range(0, len(indexes), self.batch):
                requests.append((method, url, indexes[start:start + self.batch]))
        answers = await asyncio.gather(*(self._many(method, url, [messages[i] for i in chunk])
                                         for method, url, chunk in requests))
        for (_, _, chunk), deliveries in zip(requests, answers):
            for i, d in zip(chunk, deliveries):
                results[i] = d
        return results  # type: ignore[return-value]

    @staticmethod
    def batch_body(messages: Sequence[Message]) -> bytes:
        """The JSON array a batch request carries; each payload goes in as stored, not decoded and encoded again."""
        parts = []
        for m in messages:
            head = json.dumps({"idempotency_key": m.idempotency_key, "topic": m.topic, "key": m.key,
                               "headers": m.headers}, separators=(",", ":"))
            parts.append(head[:-1].encode() + b',"payload":' + m.body + b"}")
        return b"[" + b",".join(parts) + b"]"

    async def _many(self, method: str, url: str, messages: list[Message]) -> list[Delivery]:
        headers = {"Content-Type": "application/json", **self.headers, "Joblane-Batch": str(len(messages))}
        async with self._limit:
            try:
                answer = await self._request(method, url, self.batch_body(messages), headers)
            except (UnicodeEncodeError, aiohttp.InvalidURL, ValueError) as exc:
                return [Delivery.failed(_unsendable(exc))] * len(messages)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return [Delivery.retry(f"{method} {url}: {explain(exc)}")] * len(messages)
        return classify_batch(answer, len(messages))

    async def find(self, message: Message) -> bool:
        if self.find_url is None:
            return await super().find(message)
        session = await self.session()
        async with session.get(self.find_url(message), headers={"Idempotency-Key": message.idempotency_key}) as r:
            status = r.status
        if status == 404:
            return False
        if 200 <= status < 300:
            return True
        raise RuntimeError(f"read-back answered HTTP {status}")


def _unsendable(exc: BaseException) -> str:
    """Why a request could not be sent at all (retrying would not help)."""
    if isinstance(exc, UnicodeEncodeError):
        return f"a header is not ASCII: {describe(exc)}"
    return f"cannot send the request: {describe(exc)}"
