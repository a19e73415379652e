"""SQLAlchemy 2.x sessions carry an enqueue: it commits and rolls back with the session's own transaction."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import String, create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from joblane import JoblaneError
from joblane.testing import app_on_schema, assert_enqueued, drain

from ..conftest import count
from .examples import load_example


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


def url(dsn: str, driver: str) -> str:
    return make_url(dsn).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


@pytest.fixture
def engine(app):
    # schema_translate_map puts the model's table in the test's own schema
    eng = create_engine(url(app.dsn, "psycopg")).execution_options(schema_translate_map={None: app.schema})
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def outbox(conn, app) -> int:
    return conn.execute(f'SELECT count(*) FROM "{app.schema}".outbox').fetchone()[0]


def signups(conn, app) -> int:
    return conn.execute(f'SELECT count(*) FROM "{app.schema}".signups').fetchone()[0]


def test_session_commit_writes_row_and_job_together(app, conn, engine):
    with Session(engine) as session, session.begin():
        session.add(Signup(id=1, email="a@acme.test"))
        session.flush()
        job_id = app.enqueue(session, "welcome", {"signup_id": 1})
        app.publish(session, "crm.signup", {"signup_id": 1}, key="signup-1")
        # inside the transaction: nobody else sees the job yet
        assert count(conn, app) == 0
    assert signups(conn, app) == 1
    assert outbox(conn, app) == 1
    assert assert_enqueued(app, kind="welcome", payload={"signup_id": 1}) == job_id


def test_session_rollback_drops_row_and_job(app, conn, engine):
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        session.add(Signup(id=2, email="b@acme.test"))
        session.flush()
        app.enqueue(session, "welcome", {"signup_id": 2})
        app.publish(session, "crm.signup", {"signup_id": 2})
        raise RuntimeError("the request failed after the enqueue")
    assert signups(conn, app) == 0
    assert count(conn, app) == 0
    assert outbox(conn, app) == 0


def test_enqueue_as_first_statement_joins_the_session_transaction(app, conn, engine):
    with Session(engine) as session:
        app.enqueue(session, "first", {})
        session.rollback()
    assert count(conn, app) == 0
    with engine.begin() as connection:  # a Connection works too
        ids = app.enqueue_many(connection, [("bulk", {"i": i}) for i in range(3)])
    assert len(ids) == 3 and count(conn, app, "kind = 'bulk'") == 3


async def test_enqueued_job_runs_and_reads_the_committed_row(app, engine):
    seen = []

    @app.task("welcome")
    def welcome(job):
        with Session(engine) as session:
            seen.append(session.scalars(select(Signup.email).where(Signup.id == job.payload["signup_id"])).one())

    with Session(engine) as session, session.begin():
        session.add(Signup(id=3, email="c@acme.test"))
        app.enqueue(session, "welcome", {"signup_id": 3})
    assert (await drain(app))["done"] == 1
    assert seen == ["c@acme.test"]


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_async_session_commit_and_rollback(app, conn, engine, driver):
    aengine = create_async_engine(url(app.dsn, driver)).execution_options(schema_translate_map={None: app.schema})
    try:
        async with AsyncSession(aengine) as session, session.begin():
            session.add(Signup(id=10, email="async@acme.test"))
            await session.flush()
            committed = await app.enqueue_async(session, "welcome", {"signup_id": 10})
            await app.publish_async(session, "crm.signup", {"signup_id": 10})
            assert count(conn, app) == 0
        assert signups(conn, app) == 1
        assert assert_enqueued(app, kind="welcome", payload={"signup_id": 10}) == committed

        with pytest.raises(RuntimeError):
            async with AsyncSession(aengine) as session, session.begin():
                session.add(Signup(id=11, email="gone@acme.test"))
                await session.flush()
                await app.enqueue_async(session, "welcome", {"signup_id": 11})
                await app.publish_async(session, "crm.signup", {"signup_id": 11})
                raise RuntimeError("rolled back")
        assert signups(conn, app) == 1 and count(conn, app) == 1 and outbox(conn, app) == 1

        # the enqueue is the session's first statement: it must still be inside its transaction
        async with AsyncSession(aengine) as session:
            await app.enqueue_async(session, "first", {})
            await session.rollback()
        async with aengine.begin() as connection:  # an AsyncConnection works too
            await app.enqueue_many_async(connection, [("bulk", {"i": i}) for i in range(2)])
        assert count(conn, app, "kind = 'first'") == 0
        assert count(conn, app, "kind = 'bulk'") == 2
    finally:
        await aengine.dispose()


async def test_sync_and_async_mixups_say_what_to_call(app, engine):
    aengine = create_async_engine(url(app.dsn, "asyncpg"))
    try:
        async with AsyncSession(aengine) as session:
            with pytest.raises(JoblaneError, match="enqueue_async"):
                app.enqueue(session, "x", {})
    finally:
        await aengine.dispose()
    with Session(engine) as session:
        with pytest.raises(JoblaneError, match="sync psycopg Connection"):
            await app.enqueue_async(session, "x", {})


async def test_the_docs_example_commits_and_rolls_back_with_the_session(app, conn):
    example = load_example("sqlalchemy_leads.py")
    with app_on_schema(example.jobs, app.schema):
        sync_engine = create_engine(url(app.dsn, "psycopg")).execution_options(schema_translate_map={None: app.schema})
        async_engine = create_async_engine(url(app.dsn, "asyncpg")).execution_options(
            schema_translate_map={None: app.schema})
        try:
            example.Base.metadata.create_all(sync_engine)
            with Session(sync_engine) as session, session.begin():
                kept = example.create_lead(session, "a@acme.test")
            with pytest.raises(RuntimeError), Session(sync_engine) as session, session.begin():
                example.create_lead(session, "b@acme.test")
                raise RuntimeError("the handler failed")
            async with AsyncSession(async_engine) as session, session.begin():
                kept_async = await example.create_lead_async(session, "c@acme.test")
            with pytest.raises(RuntimeError):
                async with AsyncSession(async_engine) as session, session.begin():
                    await example.create_lead_async(session, "d@acme.test")
                    raise RuntimeError("the handler failed")
        finally:
            sync_engine.dispose()
            await async_engine.dispose()
    assert conn.execute(f'SELECT email FROM "{app.schema}".leads ORDER BY id').fetchall() == [
        ("a@acme.test",), ("c@acme.test",)]
    assert conn.execute(f"SELECT payload->>'lead_id' FROM \"{app.schema}\".jobs ORDER BY id").fetchall() == [
        (str(kept),), (str(kept_async),)]
