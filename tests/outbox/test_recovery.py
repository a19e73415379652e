"""A destination that appears after the relay started: every row arrives without a restart, and meanwhile
``last_error`` names the real cause (not an AttributeError of a half-opened sink).

Each test starts a relay (in-process, or a real `joblane relay` process), publishes rows to a destination
that does not exist yet, checks the interim error, creates the destination about 3 s later, and waits for
every row to arrive there.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from typing import Awaitable, Callable

import psycopg
import pytest

from joblane.outbox import Relay
from joblane.outbox.sinks import HttpSink, KafkaSink, NatsSink, RabbitMQSink, RedisStreamSink

from ..helpers import free_port
from .conftest import Receiver, eventually, outbox_rows, start_tansu, stop_process, wait_for_port

APP = "tests.outbox.apps:app"
ROWS = 6
LATE = 3.0  # seconds after the relay starts that the destination appears


def fast(_attempt: int) -> float:
    return 0.3


def publish(app, dsn: str, topic: str, n: int = ROWS) -> list[int]:
    with psycopg.connect(dsn) as c, c.transaction():
        return [app.publish(c, topic, {"i": i}, key=f"k{i % 2}") for i in range(n)]


async def interim_errors(conn, app, tries: int = 2) -> set[str]:
    """The rows' last_error once every row has been tried ``tries`` times or more (and none was sent)."""
    def tried():
        rows = outbox_rows(conn, app)
        return rows if all(r[2] >= tries for r in rows) else None

    rows = await eventually(tried, timeout=20, message=f"every row tried {tries} times")
    assert {r[1] for r in rows} == {"pending"}, rows
    return {r[5] for r in rows}


def assert_names_the_cause(errors: set[str], *causes: str) -> None:
    for error in errors:
        assert error, "a failed try records its reason"
        assert "AttributeError" not in error and "NoneType" not in error, error
        assert any(c in error for c in causes), f"{error!r} names none of {causes}"


async def scenario(app, conn, dsn, topic: str, causes: tuple[str, ...],
                   create: Callable[[], Awaitable[None]], arrived: Callable[[list[int]], Awaitable[bool]]) -> None:
    ids = publish(app, dsn, topic)
    relay = Relay(app, listen=False, poll_interval=0.1, grace_seconds=5)
    started = time.monotonic()
    running = asyncio.create_task(relay.run(install_signals=False))
    try:
        errors = await interim_errors(conn, app)
        assert_names_the_cause(errors, *causes)
        await asyncio.sleep(max(0.0, LATE - (time.monotonic() - started)))
        assert not running.done(), "the relay keeps running while the destination is missing"
        await create()
        await eventually(lambda: {r[1] for r in outbox_rows(conn, app)} == {"sent"}, timeout=30,
                         message="every row sent once the destination exists")
        await eventually(lambda: arrived(ids), timeout=30, message="every row at the destination")
    finally:
        relay.request_stop()
        await asyncio.wait_for(running, 30)


async def test_rabbitmq_exchange_declared_after_the_relay_started(app, conn, joblane_dsn, rabbitmq_url):
    import aio_pika

    exchange = f"jltest.late.{uuid.uuid4().hex[:8]}"
    app.route("crm.", RabbitMQSink(rabbitmq_url, exchange=exchange, timeout=5.0), backoff=fast, max_attempts=100)
    connection = await aio_pika.connect(rabbitmq_url)
    channel = await connection.channel()
    queue = None

    async def create():
        nonlocal queue
        ex = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, auto_delete=False)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(ex, "crm.#")

    got: list[str] = []

    async def arrived(ids):
        while (message := await queue.get(fail=False)) is not None:
            await message.ack()
            got.append(message.message_id)
        return sorted(got) == sorted(f"outbox:{i}" for i in ids)

    try:
        await scenario(app, conn, joblane_dsn, "crm.lead_created", (f"NOT_FOUND - no exchange '{exchange}'",),
                       create, arrived)
        assert len(got) == ROWS, "each row once"
    finally:
        await channel.exchange_delete(exchange)
        await connection.close()


async def test_rabbitmq_exchange_declared_after_a_relay_process_started(
        app, conn, joblane_dsn, rabbitmq_url, spawn_relay):
    """The reported case, as a real process: `cannot open ... yet`, then every row once the exchange exists."""
    import aio_pika

    exchange = f"jltest.late.{uuid.uuid4().hex[:8]}"
    ids = publish(app, joblane_dsn, "amqp.lead_created")
    relay = spawn_relay(APP, app.schema, "--poll-interval", "0.1", "--no-listen",
                        env={"TEST_RABBITMQ_EXCHANGE": exchange, "TEST_RABBITMQ_URL": rabbitmq_url})
    started = time.monotonic()
    app.route("amqp.", RabbitMQSink(rabbitmq_url, exchange=exchange))  # only to read the rows with outbox_rows
    errors = await interim_errors(conn, app)
    assert_names_the_cause(errors, f"NOT_FOUND - no exchange '{exchange}'")
    await asyncio.sleep(max(0.0, LATE - (time.monotonic() - started)))
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        ex = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, auto_delete=False)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(ex, "amqp.#")
        await eventually(lambda: {r[1] for r in outbox_rows(conn, app)} == {"sent"}, timeout=30,
                         message="every row sent once the exchange exists")
        got = []
        while (message := await queue.get(fail=False)) is not None:
            got.append(message.message_id)
        assert sorted(got) == sorted(f"outbox:{i}" for i in ids)
        await channel.exchange_delete(exchange)
    finally:
        await connection.close()
    relay.stop()
    log = relay.output()
    assert "cannot open" in log and "NOT_FOUND" in log
    assert "AttributeError" not in log


async def test_nats_stream_created_after_the_relay_started(app, conn, joblane_dsn, nats_url):
    import nats

    token = uuid.uuid4().hex[:10]
    prefix, stream = f"jllate{token}", f"JLLATE_{token}"
    app.route(prefix + ".", NatsSink(nats_url, timeout=2.0), backoff=fast, max_attempts=100)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def create():
        await js.add_stream(name=stream, subjects=[f"{prefix}.>"])

    async def arrived(ids):
        return (await js.stream_info(stream)).state.messages == len(ids)

    try:
        await scenario(app, conn, joblane_dsn, f"{prefix}.lead_created",
                       (f"no JetStream stream captures subject '{prefix}.lead_created'",), create, arrived)
        got = [(await js.get_msg(stream, seq)).headers["Nats-Msg-Id"] for seq in range(1, ROWS + 1)]
        assert len(set(got)) == ROWS
    finally:
        try:
            await js.delete_stream(stream)
        except Exception:
            pass
        await nc.close()


async def test_http_receiver_listening_after_the_relay_started(app, conn, joblane_dsn):
    port = free_port()
    app.route("hook.", HttpSink(f"http://127.0.0.1:{port}/hook", timeout=2.0), backoff=fast, max_attempts=100)
    receivers: list[Receiver] = []

    async def create():
        receivers.append(Receiver(port))

    async def arrived(ids):
        return sorted(receivers[0].keys()) == sorted(f"outbox:{i}" for i in ids)

    try:
        await scenario(app, conn, joblane_dsn, "hook.lead_created", ("Connection refused", "Connect call failed"),
                       create, arrived)
    finally:
        for r in receivers:
            r.close()


async def test_redis_server_reachable_after_the_relay_started(app, conn, joblane_dsn):
    """Redis creates a stream on the first XADD: what can be missing is the server itself."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary to start late")
    import redis.asyncio as aioredis

    port = free_port()
    stream = f"jltest:late:{uuid.uuid4().hex[:8]}"
    app.route("orders.", RedisStreamSink(f"redis://127.0.0.1:{port}/0", stream=stream), backoff=fast,
              max_attempts=100)
    servers: list[subprocess.Popen] = []

    async def create():
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(proc)
        await asyncio.to_thread(wait_for_port, port, proc, "redis-server")

    async def arrived(ids):
        client = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        try:
            entries = await client.xrange(stream)
        finally:
            await client.aclose()
        return sorted(e[1][b"idempotency_key"].decode() for e in entries) == sorted(f"outbox:{i}" for i in ids)

    try:
        await scenario(app, conn, joblane_dsn, "orders.placed", (f"connecting to 127.0.0.1:{port}",), create, arrived)
    finally:
        for proc in servers:
            stop_process(proc)


async def test_kafka_broker_reachable_after_the_relay_started(app, conn, joblane_dsn, tansu):
    """Tansu creates a topic on first use: what can be missing is the broker. Tansu, not Apache Kafka."""
    from confluent_kafka import Consumer, TopicPartition

    port = free_port()
    topic = f"jltest.late.{uuid.uuid4().hex[:8]}"
    app.route("", KafkaSink(f"127.0.0.1:{port}", timeout=1.5), backoff=fast, max_attempts=100)
    brokers: list[subprocess.Popen] = []

    async def create():
        brokers.append(await asyncio.to_thread(start_tansu, tansu, port))

    async def arrived(ids):
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "jltest",
                             "enable.auto.commit": False})
        got = []
        try:
            partitions = (await asyncio.to_thread(consumer.list_topics, topic, 10)).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            for _ in range(100):
                m = await asyncio.to_thread(consumer.poll, 0.2)
                if m is not None and not m.error():
                    got.append(dict(m.headers())["Idempotency-Key"].decode())
                if len(got) >= len(ids):
                    break
        finally:
            consumer.close()
        return sorted(got) == sorted(f"outbox:{i}" for i in ids)

    try:
        await scenario(app, conn, joblane_dsn, topic, ("Connection refused",), create, arrived)
    finally:
        for proc in brokers:
            stop_process(proc)

