"""Real `joblane relay` processes: SIGKILL after sending and before marking, SIGTERM with a batch in flight."""

from __future__ import annotations

import asyncio
import signal
import time

import psycopg
import pytest

from joblane.queries import quote_ident

from .conftest import eventually, outbox_rows

APP = "tests.outbox.apps:app"


async def test_sigkill_after_sending_redelivers_with_the_same_key_and_receivers_apply_once(
        app, conn, joblane_dsn, receiver, jetstream, spawn_relay):
    js, stream, prefix = jetstream
    effects = f"{quote_ident(app.schema)}.effects"
    conn.execute(f"CREATE TABLE {effects} (key text NOT NULL, body jsonb NOT NULL)")

    def apply_once(req):
        # a Python receiver: the effect and the inbox record commit together
        with psycopg.connect(joblane_dsn) as rx, rx.transaction():
            if app.inbox(rx, req.key):
                rx.execute(f"INSERT INTO {effects} (key, body) VALUES (%s, %s)", (req.key, req.body.decode()))
        return 200, {}, b"ok"

    receiver.respond = apply_once
    with psycopg.connect(joblane_dsn) as c, c.transaction():
        to_nats = [app.publish(c, f"{prefix}.lead_created", {"i": i}, key=f"lead-{i % 3}") for i in range(20)]
        to_http = [app.publish(c, "hook.lead_created", {"i": i}, key=f"lead-{i % 3}") for i in range(20)]
    env = {"TEST_NATS_PREFIX": prefix, "TEST_NATS_STREAM": stream, "TEST_HTTP_URL": receiver.url}
    victim = spawn_relay(APP, app.schema, "--lease", "1.5", "--batch-size", "100", "--concurrency", "1",
                         env={**env, "TEST_STALL_AFTER_SEND": "1"})

    async def stream_count():
        return (await js.stream_info(stream)).state.messages

    await eventually(lambda: stream_count(), message="the first relay published to JetStream")
    await eventually(lambda: len(receiver.posts()) >= 1, message="the first relay posted")
    # The ordered HTTP route sends each key's rows one after another; the
    # stalled relay sends the heads and stops there, holding all rows.
    await asyncio.sleep(0.3)
    assert await stream_count() == 20
    posted_before = receiver.keys()
    victim.kill()  # SIGKILL: delivered, never marked
    assert {s for _, s, *_ in outbox_rows(conn, app)} == {"pending"}, "nothing was marked sent"

    spawn_relay(APP, app.schema, "--lease", "1.5", "--poll-interval", "0.2", env=env)
    await eventually(lambda: not outbox_rows(conn, app, "state <> 'sent'"), message="every row sent")

    # at least once: every row reached both destinations, some twice, always with the same key
    assert await stream_count() == 20, "JetStream dropped the re-sent duplicates by Nats-Msg-Id"
    ids = [(await js.get_msg(stream, seq)).headers["Nats-Msg-Id"] for seq in range(1, 21)]
    assert sorted(ids) == sorted(f"outbox:{i}" for i in to_nats)
    http_keys = receiver.keys()
    assert set(http_keys) == {f"outbox:{i}" for i in to_http}
    assert set(posted_before) <= set(http_keys[len(posted_before):]), "the killed relay's posts were repeated"
    # exactly one effect per key at the Python receiver
    applied = conn.execute(f"SELECT key, count(*) FROM {effects} GROUP BY key").fetchall()
    assert sorted(k for k, _ in applied) == sorted(f"outbox:{i}" for i in to_http)
    assert {n for _, n in applied} == {1}
    attempts = dict(conn.execute(f'SELECT id, attempts FROM "{app.schema}".outbox').fetchall())
    assert all(attempts[i] == 2 for i in to_nats), "each row was claimed again once, after the lease ended"


async def test_sigterm_lets_the_batch_in_flight_finish(app, conn, joblane_dsn, receiver, spawn_relay):
    def slow(req):
        time.sleep(1.0)
        return 200, {}, b"ok"

    receiver.respond = slow
    with psycopg.connect(joblane_dsn) as c, c.transaction():
        ids = [app.publish(c, "hook.slow", {"i": i}, key=f"k{i}") for i in range(6)]
    relay = spawn_relay(APP, app.schema, "--batch-size", "100", "--grace", "20", env={"TEST_HTTP_URL": receiver.url})
    await eventually(lambda: len(receiver.posts()) == 6, message="the batch is in flight")
    relay.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(relay.proc.wait, 30)
    assert code == 0, relay.output()
    assert [(i, s) for i, s, *_ in outbox_rows(conn, app)] == [(i, "sent") for i in ids]
    assert receiver.keys().count(f"outbox:{ids[0]}") == 1


@pytest.mark.parametrize("flag", ["--pgbouncer", None])
async def test_a_relay_behind_pgbouncer_in_transaction_pooling_delivers_every_message_once(
        app, conn, joblane_dsn, receiver, spawn_relay, flag):
    """With --pgbouncer, or without it: the relay then finds the pooler at start and says so once."""
    from ..deploy.pgbouncer import pgbouncer

    with pgbouncer(joblane_dsn, pool_mode="transaction", pool_size=3) as pooled:
        with psycopg.connect(pooled) as c:  # psycopg's default prepare threshold: publish must not prepare
            for i in range(300):
                with c.transaction():
                    app.publish(c, "hook.pooled", {"i": i}, key=f"k{i % 7}")
        relay = spawn_relay(APP, app.schema, *([flag] if flag else []), "--poll-interval", "0.2", "--batch-size",
                            "50", env={"TEST_HTTP_URL": receiver.url, "DATABASE_URL": pooled})
        await eventually(lambda: len(receiver.posts()) >= 300, timeout=60, message="every message delivered")
        [registered] = conn.execute(f'SELECT role, pid, queues FROM "{app.schema}".processes').fetchall()
        assert registered == ("relay", relay.proc.pid, ["hook."]), "the relay registered (joblane workers lists it)"
        await eventually(lambda: all(s == "sent" for _, s, *_ in outbox_rows(conn, app)), timeout=30,
                         message="every row marked sent")
        relay.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(relay.proc.wait, 30) == 0, relay.output()
        assert conn.execute(f'SELECT count(*) FROM "{app.schema}".processes').fetchone()[0] == 0, "deregistered"
    keys = receiver.keys()
    assert len(keys) == 300 == len(set(keys)), "each message once"
    assert warnings_and_errors(relay.output()) == [], relay.output()[-3000:]
    said = relay.output().count("reached through a pooler")
    assert said == (0 if flag else 1), relay.output()[-3000:]


async def test_a_relay_behind_pgbouncer_in_session_pooling_needs_no_flag(app, conn, joblane_dsn, receiver, spawn_relay):
    """Session pooling keeps a client's server connection: the relay finds the pooler, runs as with
    --pgbouncer (nothing prepared, polling) and delivers every message once."""
    from ..deploy.pgbouncer import pgbouncer

    with pgbouncer(joblane_dsn, pool_mode="session", pool_size=10) as pooled:
        with psycopg.connect(pooled) as c:
            for i in range(120):
                with c.transaction():
                    app.publish(c, "hook.session", {"i": i})
        relay = spawn_relay(APP, app.schema, "--poll-interval", "0.2", "--batch-size", "20",
                            env={"TEST_HTTP_URL": receiver.url, "DATABASE_URL": pooled})
        await eventually(lambda: all(s == "sent" for _, s, *_ in outbox_rows(conn, app)), timeout=60,
                         message="every row marked sent")
        relay.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(relay.proc.wait, 30) == 0, relay.output()
    keys = receiver.keys()
    assert len(keys) == 120 == len(set(keys)), "each message once"
    assert warnings_and_errors(relay.output()) == [], relay.output()[-3000:]


def warnings_and_errors(output: str) -> list[str]:
    """The lines of a process's log at level warning or error, and any traceback."""
    return [line for line in output.splitlines()
            if '"level": "warning"' in line.lower() or '"level": "error"' in line.lower() or "Traceback" in line]
