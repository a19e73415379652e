import psycopg
import pytest

from joblane.testing import assert_enqueued, drain, run_jobs


def test_signup_sends_the_welcome_email(app, joblane_dsn):
    with psycopg.connect(joblane_dsn) as conn, conn.transaction():
        app.enqueue(conn, "signup", {"email": "a@acme.test"})
    assert_enqueued(app, kind="signup", payload={"email": "a@acme.test"})

    stats = run_jobs(app)  # runs every ready job inline, including the ones jobs enqueue

    assert stats["done"] == 2
    welcome = assert_enqueued(app, kind="send_welcome", payload={"email": "a@acme.test"}, state="done")
    assert app.get_job(welcome)["result"] == {"sent_to": "a@acme.test"}


def test_each_test_starts_from_an_empty_schema(app):
    assert app.list_jobs() == []
    with pytest.raises(AssertionError, match="no pending job of kind 'signup'"):
        assert_enqueued(app, kind="signup")


@pytest.mark.asyncio
async def test_drain_in_an_async_test(app, joblane_dsn):
    async with await psycopg.AsyncConnection.connect(joblane_dsn) as conn:
        await app.enqueue_async(conn, "send_welcome", {"email": "b@acme.test"})
        await conn.commit()
    assert (await drain(app))["done"] == 1
