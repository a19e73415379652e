"""App.publish and App.inbox on the caller's connection: psycopg sync and async, asyncpg."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

import joblane

from .conftest import outbox_rows


class Boom(Exception):
    pass


def test_commit_keeps_the_row_and_rollback_leaves_nothing(app, conn, joblane_dsn):
    with psycopg.connect(joblane_dsn) as tx_conn:
        with pytest.raises(Boom):
            with tx_conn.transaction():
                app.publish(tx_conn, "crm.lead_created", {"lead": 1})
                raise Boom
        with tx_conn.transaction():
            first = app.publish(tx_conn, "crm.lead_created", {"lead": 2}, key="lead-2",
                                headers={"content-language": "en"})
            second = app.publish(tx_conn, "crm.lead_created", {"lead": 3}, idempotency_key="lead-3-created")
            assert outbox_rows(conn, app) == [], "nothing is visible before commit"
    rows = conn.execute(
        f'SELECT id, topic, key, idempotency_key, payload, headers, state, attempts FROM "{app.schema}".outbox'
        " ORDER BY id").fetchall()
    assert rows == [
        (first, "crm.lead_created", "lead-2", f"outbox:{first}", {"lead": 2}, {"content-language": "en"},
         "pending", 0),
        (second, "crm.lead_created", None, "lead-3-created", {"lead": 3}, {}, "pending", 0),
    ]


async def test_publish_async_on_asyncpg_and_psycopg_async(app, conn, joblane_dsn):
    apg = await asyncpg.connect(joblane_dsn)
    try:
        with pytest.raises(Boom):
            async with apg.transaction():
                await app.publish_async(apg, "t.rolled_back", {"n": 1})
                raise Boom
        async with apg.transaction():
            a = await app.publish_async(apg, "t.kept", {"n": 2})
    finally:
        await apg.close()
    async with await psycopg.AsyncConnection.connect(joblane_dsn) as pconn:
        with pytest.raises(Boom):
            async with pconn.transaction():
                await app.publish_async(pconn, "t.rolled_back", {"n": 3})
                raise Boom
        async with pconn.transaction():
            b = await app.publish_async(pconn, "t.kept", {"n": 4}, key="k")
    rows = conn.execute(f'SELECT id, topic, payload FROM "{app.schema}".outbox ORDER BY id').fetchall()
    assert rows == [(a, "t.kept", {"n": 2}), (b, "t.kept", {"n": 4})]


def test_one_notification_per_transaction_and_none_on_rollback(app, joblane_dsn):
    with psycopg.connect(joblane_dsn, autocommit=True) as listener, psycopg.connect(joblane_dsn) as writer:
        listener.execute(f'LISTEN "{app.schema}_outbox"')
        with writer.transaction():
            for i in range(3):
                app.publish(writer, "t.x", {"i": i})
        got = list(listener.notifies(timeout=1.0, stop_after=5))
        assert [n.channel for n in got] == [f"{app.schema}_outbox"]
        with pytest.raises(Boom):
            with writer.transaction():
                app.publish(writer, "t.x", {})
                raise Boom
        assert list(listener.notifies(timeout=0.3)) == []


@pytest.mark.parametrize("call, message", [
    (lambda app, c: app.publish(c, "", {}), "topic must be a non-empty string"),
    (lambda app, c: app.publish(c, None, {}), "topic must be a non-empty string"),
    (lambda app, c: app.publish(c, "t", {"s": {1, 2}}), "payload is not JSON-serialisable"),
    (lambda app, c: app.publish(c, "t", {"x": float("nan")}), "payload is not JSON-serialisable"),
    (lambda app, c: app.publish(c, "t", {"x": "a\x00b"}), "NUL"),
    (lambda app, c: app.publish(c, "t", {}, key="k\x00"), "key contains a NUL"),
    (lambda app, c: app.publish(c, "t", {}, idempotency_key=""), "idempotency_key must be a non-empty string"),
    (lambda app, c: app.publish(c, "t", {}, headers={"n": 1}), "header 'n' must be a string"),
    (lambda app, c: app.publish(c, "t", {}, headers=["x"]), "headers must be a mapping"),
    (lambda app, c: app.publish(c, "t", "x" * 2_000_000), "the limit is"),
    (lambda app, c: app.inbox(c, ""), "inbox key must be a non-empty string"),
])
def test_bad_input_is_refused_and_the_transaction_stays_usable(app, conn, joblane_dsn, call, message):
    with psycopg.connect(joblane_dsn) as tx_conn:
        with tx_conn.transaction():
            with pytest.raises(joblane.JoblaneError, match=message):
                call(app, tx_conn)
            ok = app.publish(tx_conn, "t.after", {"fine": True})
    assert [r[0] for r in outbox_rows(conn, app)] == [ok]


def test_publish_refuses_an_async_connection_with_a_clear_error(app):
    with pytest.raises(joblane.JoblaneError, match="psycopg 3 Connection"):
        app.publish(object(), "t", {})


def test_inbox_is_true_once_and_a_repeat_keeps_the_transaction_usable(app, conn, joblane_dsn):
    table = f'"{app.schema}".inbox'
    with psycopg.connect(joblane_dsn) as rx:
        with rx.transaction():
            assert app.inbox(rx, "outbox:1") is True
            assert app.inbox(rx, "outbox:1") is False
            rx.execute("SELECT 1")  # not aborted
        with pytest.raises(Boom):
            with rx.transaction():
                assert app.inbox(rx, "outbox:2") is True
                raise Boom
        with rx.transaction():
            assert app.inbox(rx, "outbox:1") is False, "seen in a committed transaction"
            assert app.inbox(rx, "outbox:2") is True, "the rolled-back record does not count"
    assert {r[0] for r in conn.execute(f"SELECT key FROM {table}").fetchall()} == {"outbox:1", "outbox:2"}


async def test_inbox_async_and_a_concurrent_repeat_waits_for_the_first(app, joblane_dsn):
    first = await asyncpg.connect(joblane_dsn)
    second = await asyncpg.connect(joblane_dsn)
    try:
        tx1 = first.transaction()
        await tx1.start()
        assert await app.inbox_async(first, "k") is True
        tx2 = second.transaction()
        await tx2.start()
        import asyncio

        pending = asyncio.create_task(app.inbox_async(second, "k"))
        await asyncio.sleep(0.2)
        assert not pending.done(), "the second receiver waits for the first transaction"
        await tx1.commit()
        assert await pending is False
        await tx2.commit()
    finally:
        await first.close()
        await second.close()
