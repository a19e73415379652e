"""Sinks: where the relay delivers outbox messages.

Each sink imports its client library only when it is used, so
``joblane.outbox.sinks`` needs none of them installed:
``HttpSink`` (aiohttp), ``NatsSink`` (nats-py), ``RabbitMQSink`` (aio-pika),
``RedisStreamSink`` (redis), ``KafkaSink`` (confluent-kafka).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Sink

_WHERE = {
    "HttpSink": ".http",
    "NatsSink": ".nats",
    "RabbitMQSink": ".rabbitmq",
    "RedisStreamSink": ".redis",
    "KafkaSink": ".kafka",
}

__all__ = ["Sink", *_WHERE]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
