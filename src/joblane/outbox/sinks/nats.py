"""NATS JetStream (nats-py): the idempotency key is the ``Nats-Msg-Id`` header.

JetStream drops a message whose id it has seen within the stream's
duplicate window (two minutes unless the stream says otherwise), so a
re-send after a relay crash stores nothing twice. A batch is published
without waiting between messages and its acks are awaited together.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

import nats
from nats.js import api

from ..message import Delivery, Message, describe
from .base import Sink, standard_headers


class NatsSink(Sink):
    """Publish each message to JetStream on ``subject`` (default: the topic).

    ``stream`` makes the server refuse a subject captured by another stream.
    The stream itself is created by whoever owns it, not by the relay.
    """

    name = "nats"

    def __init__(
        self,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        subject: str | Callable[[Message], str] | None = None,
        stream: str | None = None,
        timeout: float = 10.0,
        max_pending: int = 4000,
        find: Callable[[Message], Awaitable[bool]] | None = None,
        **connect_options: Any,
    ):
        super().__init__(find=find)
        self.servers = servers
        self.subject = subject
        self.stream = stream
        self.timeout = timeout
        self.max_pending = max_pending
        self._connect_options = connect_options
        self._nc = None
        self._js = None

    async def open(self) -> None:
        if self._nc is None or self._nc.is_closed:
            options = {"connect_timeout": 5, "max_reconnect_attempts": -1, **self._connect_options}
            self._nc = await nats.connect(self.servers, **options)
            self._js = self._nc.jetstream(publish_async_max_pending=self.max_pending)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            try:
                await asyncio.wait_for(self._nc.drain(), 5.0)
            except Exception:
                await self._nc.close()
        self._nc = self._js = None

    def headers_for(self, message: Message) -> dict[str, str]:
        return standard_headers(message, api.Header.MSG_ID)

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        from .base import target

        await self.open()
        futures: list[asyncio.Future | Delivery] = []
        for m in messages:
            try:
                subject = target(self.subject, m)
                futures.append(await self._js.publish_async(
                    subject, m.body, wait_stall=self.timeout, stream=self.stream, headers=self.headers_for(m)))
            except Exception as exc:  # not published: the rest of the batch still goes
                futures.append(Delivery.retry(f"publish: {describe(exc)}"))
        pending = [f for f in futures if isinstance(f, asyncio.Future)]
        if pending:
            await asyncio.wait(pending, timeout=self.timeout)
        results: list[Delivery] = []
        for f in futures:
            if isinstance(f, Delivery):
                results.append(f)
            elif not f.done():
                f.cancel()
                results.append(Delivery.retry(f"no JetStream ack within {self.timeout:g}s"))
            elif f.exception() is not None:
                results.append(Delivery.retry(f"JetStream: {describe(f.exception())}"))
            else:
                results.append(Delivery.sent())  # a duplicate ack is a delivery too
        return results
