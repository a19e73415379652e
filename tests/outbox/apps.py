"""The app `joblane relay` runs in the process tests: routes from the environment, and a sink that can stall."""

from __future__ import annotations

import asyncio
import os

import joblane
from joblane.outbox.sinks import HttpSink, NatsSink, RabbitMQSink

app = joblane.App()


class Stalling:
    """Deliver, then (with TEST_STALL_AFTER_SEND) never return: the process is killed after
    the destination has the messages and before the relay marks them sent."""

    async def send(self, messages):
        results = await super().send(messages)
        if os.environ.get("TEST_STALL_AFTER_SEND"):
            await asyncio.sleep(3600)
        return results


class StallingNatsSink(Stalling, NatsSink):
    pass


class StallingHttpSink(Stalling, HttpSink):
    pass


if os.environ.get("TEST_NATS_PREFIX"):
    app.route(os.environ["TEST_NATS_PREFIX"] + ".", StallingNatsSink(stream=os.environ.get("TEST_NATS_STREAM")))
if os.environ.get("TEST_HTTP_URL"):
    app.route("hook.", StallingHttpSink(os.environ["TEST_HTTP_URL"]), ordered=True)
if os.environ.get("TEST_RABBITMQ_EXCHANGE"):
    app.route("amqp.", RabbitMQSink(os.environ["TEST_RABBITMQ_URL"], exchange=os.environ["TEST_RABBITMQ_EXCHANGE"]),
              backoff=lambda attempt: 0.3, max_attempts=100)
