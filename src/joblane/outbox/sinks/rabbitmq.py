"""RabbitMQ (aio-pika): the idempotency key is the AMQP ``message_id``; publisher confirms are on.

A message counts as delivered when the broker confirms it. Publishes are
mandatory: a message no queue would take comes back and is retried rather
than dropped.

The exchange must exist: the sink looks it up (a passive declare) and, until
it appears, every try is retried with the broker's answer in ``last_error``
(``NOT_FOUND - no exchange ...``); the first batch after it appears goes
out, without a relay restart. ``declare=True`` declares it instead (durable,
of ``exchange_type``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

import aio_pika

from ..message import Delivery, Message, describe
from .base import Sink, standard_headers, target


class RabbitMQSink(Sink):
    """Publish each message to ``exchange`` (default: the default exchange)
    with ``routing_key`` (default: the topic).

    ``declare=True`` declares the exchange (durable, of ``exchange_type``)
    when the sink opens; otherwise it must exist already.
    """

    name = "rabbitmq"

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        *,
        exchange: str = "",
        exchange_type: str = "topic",
        declare: bool = False,
        routing_key: str | Callable[[Message], str] | None = None,
        mandatory: bool = True,
        persistent: bool = True,
        timeout: float = 10.0,
        find: Callable[[Message], Awaitable[bool]] | None = None,
        **connect_options: Any,
    ):
        super().__init__(find=find)
        if declare and not exchange:
            raise ValueError("RabbitMQSink: declare=True needs exchange= (the default exchange always exists)")
        self.url = url
        self.exchange_name = exchange
        self.exchange_type = exchange_type
        self.declare = bool(declare)
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.persistent = persistent
        self.timeout = timeout
        self._connect_options = connect_options
        self._connection = None
        self._channel = None
        self._exchange = None

    async def open(self) -> None:
        """Connect, open the publishing channel and find (or declare) the exchange; each step only when missing.

        Called before every batch: a step that failed before (the broker was
        down, the exchange did not exist) is tried again, so the sink recovers
        on its own once the destination is there.
        """
        if self._connection is None or self._connection.is_closed:
            self._connection = self._channel = self._exchange = None
            self._connection = await aio_pika.connect_robust(self.url, timeout=self.timeout, **self._connect_options)
        if self._channel is None or self._channel.is_closed:
            self._exchange = None
            self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=self.mandatory)
        if self._exchange is None:
            if not self.exchange_name:
                self._exchange = self._channel.default_exchange
                return
            # The lookup (or declaration) runs on a channel of its own: the broker closes the channel
            # of a failed one (NOT_FOUND, PRECONDITION_FAILED), and the publishing channel stays usable.
            async with self._connection.channel(publisher_confirms=False) as probe:
                if self.declare:
                    await probe.declare_exchange(self.exchange_name, self.exchange_type, durable=True,
                                                 timeout=self.timeout)
                else:
                    await probe.get_exchange(self.exchange_name, ensure=True)
            self._exchange = await self._channel.get_exchange(self.exchange_name, ensure=False)

    async def close(self) -> None:
        if self._connection is not None and not self._connection.is_closed:
            await self._connection.close()
        self._connection = self._channel = self._exchange = None

    def build(self, message: Message) -> aio_pika.Message:
        return aio_pika.Message(
            message.body,
            message_id=message.idempotency_key,
            content_type="application/json",
            headers=standard_headers(message, "Idempotency-Key"),
            type=message.topic,
            timestamp=message.created_at,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT if self.persistent else aio_pika.DeliveryMode.NOT_PERSISTENT,
        )

    async def _one(self, message: Message) -> Delivery:
        try:
            await self._exchange.publish(self.build(message), target(self.routing_key, message),
                                         mandatory=self.mandatory, timeout=self.timeout)
        except aio_pika.exceptions.DeliveryError as exc:
            returned = getattr(exc, "message", None)
            if returned is not None and getattr(returned, "reply_text", None):
                return Delivery.retry(f"returned by the broker: {returned.reply_text}")
            return Delivery.retry(f"not confirmed: {describe(exc)}")
        except asyncio.TimeoutError:
            return Delivery.retry(f"no publisher confirm within {self.timeout:g}s")
        except Exception as exc:
            return Delivery.retry(describe(exc))
        return Delivery.sent()

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        await self.open()
        return list(await asyncio.gather(*(self._one(m) for m in messages)))
