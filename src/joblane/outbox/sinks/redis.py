"""Redis Streams (redis-py asyncio): one XADD per message, a batch in one pipeline round trip.

Each entry carries the idempotency key in its ``idempotency_key`` field;
Redis does not deduplicate, so receivers do (``App.inbox``, or their own set
of seen keys).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Sequence

import redis.asyncio as aioredis

from ..message import Delivery, Message, describe
from .base import Sink, target


class RedisStreamSink(Sink):
    """XADD each message to ``stream`` (default: the topic), optionally capped at ``maxlen`` entries."""

    name = "redis"

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        stream: str | Callable[[Message], str] | None = None,
        maxlen: int | None = None,
        approximate: bool = True,
        find: Callable[[Message], Awaitable[bool]] | None = None,
        **client_options: Any,
    ):
        super().__init__(find=find)
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.approximate = approximate
        self._client_options = client_options
        self._client = None

    async def open(self) -> None:
        if self._client is None:
            options = {"socket_timeout": 10, "socket_connect_timeout": 5, **self._client_options}
            self._client = aioredis.from_url(self.url, **options)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @staticmethod
    def fields(message: Message) -> dict[str, Any]:
        return {
            "idempotency_key": message.idempotency_key,
            "topic": message.topic,
            "key": message.key or "",
            "payload": message.body,
            "headers": json.dumps(message.headers, separators=(",", ":")),
            "outbox_id": message.id,
        }

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        await self.open()
        pipe = self._client.pipeline(transaction=False)
        for m in messages:
            pipe.xadd(target(self.stream, m), self.fields(m), maxlen=self.maxlen, approximate=self.approximate)
        replies = await pipe.execute(raise_on_error=False)
        return [Delivery.retry(describe(r)) if isinstance(r, Exception) else Delivery.sent() for r in replies]
