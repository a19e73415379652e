"""Kafka (confluent-kafka, idempotent producer): the idempotency key is a record header, and the record key.

The record key is the message's ordering key when it has one (so a key's
records share a partition and keep their order), else the idempotency key.
The ``Idempotency-Key`` header always carries the idempotency key. The
idempotent producer stops duplicates from its own retries; a re-send after a
relay crash is a new record, which consumers recognise by the header.

While no broker answers, every try is retried with the broker's last error
in ``last_error`` (``Local: Message timed out (last broker error: ...
Connection refused)``); the producer reconnects on its own.

Tested against Tansu, a Kafka-protocol broker, when its binary is available
(see tests/outbox); not against Apache Kafka itself.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

from ..message import Delivery, Message, describe
from .base import Sink, standard_headers, target


class KafkaSink(Sink):
    """Produce each message to ``topic`` (default: the outbox topic) and wait for every delivery report."""

    name = "kafka"

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        *,
        topic: str | Callable[[Message], str] | None = None,
        timeout: float = 30.0,
        config: dict[str, Any] | None = None,
        find: Callable[[Message], Awaitable[bool]] | None = None,
    ):
        super().__init__(find=find)
        self.topic = topic
        self.timeout = timeout
        self.config = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": int(timeout * 1000),
            **(config or {}),
        }
        self._producer = None
        self._broker_error: str | None = None  # the last error the client reported (error_cb), this batch

    def record(self, message: Message) -> dict[str, Any]:
        """The arguments of ``Producer.produce`` for ``message``: topic, key, value and headers."""
        key = message.key if message.key is not None else message.idempotency_key
        return {
            "topic": target(self.topic, message),
            "key": key.encode(),
            "value": message.body,
            "headers": [(k, v.encode()) for k, v in standard_headers(message, "Idempotency-Key").items()],
        }

    async def open(self) -> None:
        if self._producer is None:
            from confluent_kafka import Producer

            user_error_cb = self.config.get("error_cb")

            def on_error(err) -> None:  # runs in the flushing thread
                self._broker_error = err.str() if hasattr(err, "str") else str(err)
                if user_error_cb is not None:
                    user_error_cb(err)

            self._producer = Producer({**self.config, "error_cb": on_error})

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, producer.flush, 5.0)

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        from confluent_kafka import KafkaError

        await self.open()
        producer = self._producer
        self._broker_error = None
        results: list[Delivery | None] = [None] * len(messages)
        fatal = False

        def report(index: int) -> Callable[[Any, Any], None]:
            def on_delivery(err, _msg) -> None:  # runs in the flushing thread
                nonlocal fatal
                if err is None:
                    results[index] = Delivery.sent()
                else:
                    fatal = fatal or bool(getattr(err, "fatal", lambda: False)())
                    error = f"Kafka: {err.str() if hasattr(err, 'str') else err}"
                    if getattr(err, "code", lambda: None)() == KafkaError._MSG_TIMED_OUT and self._broker_error:
                        error += f" (last broker error: {self._broker_error})"  # e.g. Connection refused
                    results[index] = Delivery.retry(error)
            return on_delivery

        for i, m in enumerate(messages):
            try:
                while True:
                    try:
                        producer.produce(**self.record(m), on_delivery=report(i))
                        break
                    except BufferError:  # the local queue is full: let reports drain
                        producer.poll(0.05)
            except Exception as exc:
                results[i] = Delivery.retry(f"produce: {describe(exc)}")
        await asyncio.get_running_loop().run_in_executor(None, producer.flush, self.timeout)
        if fatal:  # the idempotent producer cannot go on; the next batch gets a new one
            self._producer = None
        missing = f"no Kafka delivery report within {self.timeout:g}s"
        if self._broker_error:
            missing += f" (last broker error: {self._broker_error})"
        return [r if r is not None else Delivery.retry(missing) for r in results]
