"""Bad input gets a one-line error and writes nothing: the Python API, the command line and the worker.

tests/test_enqueue.py covers the common payload and option checks; this file
adds what PostgreSQL itself would refuse mid-transaction (lone surrogates,
NUL escapes), hostile names, limits, and the CLI and worker paths.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys

import psycopg
import pytest
from click.testing import CliRunner

import joblane
from joblane import JobSpec
from joblane.cli import main
from joblane.testing import drain

from ..conftest import ROOT, count, table

UTC = dt.timezone.utc


def outbox_count(conn, app) -> int:
    return conn.execute(f"SELECT count(*) FROM {table(app, 'outbox')}").fetchone()[0]


# -- the Python API -----------------------------------------------------------

HOSTILE_QUEUES = ["x'; DROP TABLE jobs; --", 'q"uote', "a;b", "ünïcode", "tab\tq", "new\nline", "q" * 64, " q",
                  "-leading", "\u202eevil", "q\x00"]


@pytest.mark.parametrize("queue", HOSTILE_QUEUES)
def test_hostile_queue_names_are_refused_and_the_transaction_goes_on(app, joblane_dsn, conn, queue):
    with psycopg.connect(joblane_dsn) as c:
        with c.transaction():
            kept = app.enqueue(c, "k", {"n": 1})
            with pytest.raises(joblane.JoblaneError, match="invalid queue name"):
                app.enqueue(c, "k", {}, queue=queue)
            with pytest.raises(joblane.JoblaneError, match="invalid queue name"):
                app.enqueue_many(c, [JobSpec("k", {}), JobSpec("k", {}, queue=queue)])
            c.execute("SELECT 1")  # not aborted: nothing reached the server
    assert conn.execute(f"SELECT id FROM {table(app, 'jobs')}").fetchall() == [(kept,)]


@pytest.mark.parametrize("field, value, message", [
    ("payload", {"x": "lone \ud800 surrogate"}, "lone surrogate"),
    ("payload", {"lone \udcff key": 1}, "lone surrogate"),
    ("payload", {"x": "\x00"}, "NUL"),
    ("payload", {"x": [1, {"deep": "a\x00"}]}, "NUL"),
    ("payload", {"x": float("inf")}, "not JSON-serialisable"),
    ("payload", {"x": b"bytes"}, "not JSON-serialisable"),
    ("payload", {("tuple", "key"): 1}, "not JSON-serialisable"),
    ("kind", "k\udcff", "lone surrogate"),
    ("kind", "k\x00", "NUL"),
    ("unique_key", "u\ud800", "lone surrogate"),
    ("unique_key", "u\x00", "NUL"),
    ("delay", "10", "delay must be"),
    ("delay", float("nan"), "delay must be"),
    ("delay", dt.timedelta(days=-1), "delay must be"),
    ("delay", dt.timedelta(days=365 * 11), "delay must be"),
    ("run_after", "2030-01-01", "timezone-aware"),
    ("priority", 1.5, "priority must be"),
    ("max_attempts", 10**9, "max_attempts must be"),
])
def test_values_postgresql_would_refuse_are_caught_before_sending(app, joblane_dsn, conn, field, value, message):
    kwargs = {"kind": "k", "payload": {}}
    kwargs[field] = value
    kind, payload = kwargs.pop("kind"), kwargs.pop("payload")
    with psycopg.connect(joblane_dsn) as c:
        with c.transaction():
            with pytest.raises(joblane.JoblaneError, match=message):
                app.enqueue(c, kind, payload, **kwargs)
            # a valid job of the same kind first, so the second goes through enqueue_many's fast path
            with pytest.raises(joblane.JoblaneError, match=message):
                app.enqueue_many(c, [JobSpec("k", {}), JobSpec("k", {}), JobSpec(kind, payload, **kwargs)])
            c.execute("SELECT 1")
    assert count(conn, app) == 0


async def test_async_enqueue_refuses_the_same_values(app, joblane_dsn, conn):
    async with await psycopg.AsyncConnection.connect(joblane_dsn) as c:
        for bad in ({"x": "\ud800"}, {"x": "\x00"}):
            with pytest.raises(joblane.JoblaneError):
                await app.enqueue_async(c, "k", bad)
            with pytest.raises(joblane.JoblaneError):
                await app.enqueue_many_async(c, [("k", {}), ("k", bad)])
        await c.execute("SELECT 1")
        await c.commit()
    assert count(conn, app) == 0


def test_text_that_only_looks_like_an_escape_is_stored_as_it_is(app, conn):
    payload = {"code": "printf('\\u0000')", "path": "C:\\users\\u0000", "emoji": "😀 ok", "rtl": "\u202e"}
    job_id = app.enqueue(conn, "k", payload)
    [many] = app.enqueue_many(conn, [("k", payload)])
    assert app.get_job(job_id, conn)["payload"] == payload
    assert app.get_job(many, conn)["payload"] == payload


def test_enqueue_many_writes_nothing_when_a_later_chunk_is_bad(app, conn):
    """On an autocommit connection every chunk would commit on its own: all are validated first."""
    jobs = [JobSpec("k", {"i": i}) for i in range(joblane.app.ENQUEUE_CHUNK + 10)] + [JobSpec("k", {"x": "\x00"})]
    with pytest.raises(joblane.JoblaneError, match="NUL"):
        app.enqueue_many(conn, jobs)
    assert count(conn, app) == 0


def test_payload_limit_is_configurable_and_exact(joblane_dsn, joblane_schema, conn):
    small = joblane.App(joblane_dsn, schema=joblane_schema, max_payload_bytes=100)
    fits = {"x": "y" * (100 - len('{"x":""}'))}
    assert len(json.dumps(fits, separators=(",", ":"))) == 100
    small.enqueue(conn, "k", fits)
    for call in (lambda: small.enqueue(conn, "k", {"x": "y" * 93}),
                 lambda: small.enqueue_many(conn, [("k", fits), ("k", {"x": "y" * 93})]),
                 lambda: small.publish(conn, "t", {"x": "y" * 93})):
        with pytest.raises(joblane.JoblaneError, match=r"the limit is 100 \(App\(max_payload_bytes=...\)\)"):
            call()
    assert count(conn, small) == 1 and outbox_count(conn, small) == 0


@pytest.mark.parametrize("topic", ["crm'; DROP TABLE outbox; --", 'a"b', "übung.créée", "a;b c", "t" * 255,
                                   "\u202etopic"])
def test_hostile_topic_names_are_data_and_stored_verbatim(app, conn, topic):
    message = app.publish(conn, topic, {"ok": True}, key=topic, idempotency_key=topic)
    assert conn.execute(f"SELECT topic, key, idempotency_key FROM {table(app, 'outbox')} WHERE id = %s",
                        (message,)).fetchone() == (topic, topic, topic)


@pytest.mark.parametrize("topic, message", [("", "non-empty"), ("t" * 256, "limit is 255"), ("t\x00", "NUL"),
                                            ("t\udcff", "lone surrogate"), (b"t", "non-empty string")])
def test_bad_topics_are_refused_and_the_transaction_goes_on(app, joblane_dsn, conn, topic, message):
    with psycopg.connect(joblane_dsn) as c:
        with c.transaction():
            with pytest.raises(joblane.JoblaneError, match=message):
                app.publish(c, topic, {})
            with pytest.raises(joblane.JoblaneError):
                app.publish(c, "t", {"x": "\ud800"})
            c.execute("SELECT 1")
    assert outbox_count(conn, app) == 0


def test_absurd_but_valid_times_are_stored(app, conn):
    far = app.enqueue(conn, "k", {}, run_after=dt.datetime(9999, 12, 31, tzinfo=UTC), delay=10 * 365 * 86400)
    past = app.enqueue(conn, "k", {}, run_after=dt.datetime(1, 1, 1, tzinfo=UTC))
    rows = dict(conn.execute(f"SELECT id, extract(year FROM run_after) FROM {table(app, 'jobs')}").fetchall())
    assert rows[far] == 10009 and rows[past] == 1


# -- what a task hands back must never jam the worker ---------------------------

class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


async def test_unstorable_task_output_never_blocks_other_outcomes(app, conn):
    """One outcome PostgreSQL refuses would fail every completion batch it is in, forever."""

    @app.task("surrogate_error", max_attempts=1)
    async def surrogate_error(job):
        raise ValueError(b"caf\xe9".decode("utf-8", "surrogateescape"))

    @app.task("surrogate_result")
    async def surrogate_result(job):
        return {"name": "\ud800"}

    @app.task("nul_result")
    async def nul_result(job):
        return ["a\x00"]

    @app.task("escape_lookalike_result")
    async def escape_lookalike_result(job):
        return {"text": "\\u0000 is how JSON writes NUL"}

    @app.task("odd_meta")
    async def odd_meta(job):
        job.record(score=float("nan"), limit=float("inf"), note="a\x00b", who="\udcff", text="\\u0000",
                   when=dt.datetime(2030, 1, 1), raw=b"\xff")

    @app.task("odd_hold")
    async def odd_hold(job):
        raise joblane.Hold("check \udcff", {"score": float("nan"), "s": "\ud800\x00"})

    @app.task("unprintable", max_attempts=1)
    async def unprintable(job):
        raise Unprintable()

    @app.task("retry_forever_later")
    async def retry_forever_later(job):
        raise joblane.RetryAfter(float("inf"))

    @app.task("nan_backoff", max_attempts=2, backoff=lambda attempt: float("nan"))
    async def nan_backoff(job):
        if job.attempt == 1:
            raise RuntimeError("once")

    @app.task("fine")
    async def fine(job):
        return "fine"

    ids = {kind: app.enqueue(conn, kind, {}) for kind in app.tasks}
    await asyncio.wait_for(drain(app, timeout=20), 30)
    rows = {r[0]: r[1:] for r in conn.execute(
        f"SELECT kind, state, last_error, result, run_after > now() + interval '1 year' FROM {table(app, 'jobs')}")}
    assert rows["fine"][:3] == ("done", None, "fine")
    assert rows["surrogate_error"][0] == "failed" and "caf?" in rows["surrogate_error"][1]
    assert rows["surrogate_result"][0] == "failed" and "lone surrogate" in rows["surrogate_result"][1]
    assert rows["nul_result"][0] == "failed" and "NUL" in rows["nul_result"][1]
    assert rows["escape_lookalike_result"][:3] == ("done", None, {"text": "\\u0000 is how JSON writes NUL"})
    assert rows["odd_meta"][0] == "done"
    assert rows["odd_hold"][0] == "held" and rows["odd_hold"][2] == {"score": None, "s": "?\\0"}
    assert rows["unprintable"][0] == "failed" and "Unprintable" in rows["unprintable"][1]
    assert rows["retry_forever_later"][0] == "pending" and rows["retry_forever_later"][3] is True
    assert rows["nan_backoff"][0] == "done"
    [meta] = conn.execute(f"SELECT meta FROM {table(app, 'attempts')} WHERE job_id = %s", (ids["odd_meta"],)).fetchone()
    assert meta["score"] is None and meta["limit"] is None and meta["note"] == "a\\0b" and meta["who"] == "?"
    assert meta["text"] == "\\u0000" and meta["when"].startswith("2030-01-01")


# -- the command line -----------------------------------------------------------

def joblane_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`joblane ...` as a real process (the worker paths)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBLANE_SCHEMA")}
    full_env.update(PYTHONPATH=str(ROOT), COLUMNS="60", **(env or {}))
    return subprocess.run([sys.executable, "-m", "joblane", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`joblane ...` in this process (the short commands; a process each would cost a second apiece)."""
    full_env = {"DATABASE_URL": None, "JOBLANE_SCHEMA": None, "COLUMNS": "60", **(env or {})}
    result = CliRunner().invoke(main, list(args), env=full_env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 1, and stderr ends in exactly one `error:` line (a worker may log before it), no traceback."""
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], out.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test"
BAD_DSNS = [
    (UNREACHABLE, "cannot connect"),
    ("not a url at all", "database"),
    ("postgresql://postgres@no-such-host.invalid:5432/test", "cannot connect"),
]


@pytest.mark.parametrize("dsn, fragment", BAD_DSNS)
def test_cli_with_a_wrong_or_unreachable_database_says_so_in_one_line(dsn, fragment):
    for args in (["status"], ["migrate"], ["jobs", "--state", "failed"], ["retry", "1"], ["cancel", "1"]):
        assert_one_line_error(cli("--database-url", dsn, *args), fragment)


def test_cli_with_a_wrong_user_or_database_name(joblane_dsn):
    import urllib.parse

    parts = urllib.parse.urlsplit(joblane_dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        pytest.skip("DATABASE_URL is not a postgresql:// URL")
    host = parts.netloc.rsplit("@", 1)[-1]
    nobody = urllib.parse.urlunsplit(parts._replace(netloc=f"no_such_role_x@{host}"))
    nodb = urllib.parse.urlunsplit(parts._replace(path="/no_such_database_x"))
    assert_one_line_error(cli("--database-url", nobody, "status"), "no_such_role_x")
    assert_one_line_error(cli("--database-url", nodb, "status"), "no_such_database_x")


@pytest.mark.parametrize("schema", ['x"; DROP SCHEMA public; --', "a;b", "ünï", "[/red]", "1abc"])
def test_cli_refuses_hostile_schema_names(joblane_dsn, schema):
    assert_one_line_error(cli("--database-url", joblane_dsn, "--schema", schema, "status"),
                          "invalid schema name")
    assert_one_line_error(cli("status", env={"DATABASE_URL": joblane_dsn, "JOBLANE_SCHEMA": schema}),
                          "invalid schema name")


def test_cli_bad_arguments_are_one_line(joblane_dsn, joblane_schema):
    env = {"DATABASE_URL": joblane_dsn, "JOBLANE_SCHEMA": joblane_schema}
    assert_one_line_error(cli("retry", "abc", env=env), "job ids are integers")
    assert_one_line_error(cli("cancel", "1; DROP TABLE jobs", env=env), "job ids are integers")
    assert_one_line_error(cli("jobs", "show", "424242", env=env), "no job 424242")
    assert_one_line_error(cli("status", env={"DATABASE_URL": joblane_dsn, "JOBLANE_SCHEMA": "nothing_here"}))
    assert_one_line_error(cli("status"), "DATABASE_URL")
    for spec in ("no_colon", "tests.security.nope:app", "os:system", "tests.security.apps:missing"):
        assert_one_line_error(cli("worker", spec, env=env))


def test_the_real_command_line_process_prints_one_line_too():
    assert_one_line_error(joblane_cli("--database-url", UNREACHABLE, "status"), "cannot connect")


# -- the worker ---------------------------------------------------------------------

WORKER_APP = "tests.security.apps:app"


@pytest.mark.parametrize("command", ["worker", "relay"])
@pytest.mark.parametrize("dsn, fragment", [
    (UNREACHABLE, "0.5s"),
    ("not a url at all", "invalid database URL"),
    ("postgresql://postgres@no-such-host.invalid:5432/test", "is DATABASE_URL right"),
])
def test_worker_and_relay_with_a_wrong_or_unreachable_database_exit_with_one_line(command, dsn, fragment):
    out = joblane_cli("--database-url", dsn, command, WORKER_APP, "--connect-timeout", "0.5", "--log-format", "json",
                      timeout=60)
    assert_one_line_error(out, fragment)


@pytest.mark.parametrize("command", ["worker", "relay"])
def test_a_worker_facing_a_silent_database_says_so_at_once_and_keeps_retrying(command):
    """A server that accepts connections and never answers (a firewall, a hung host): the worker's (and the
    relay's) first words come within seconds, naming what to check and that it retries, not when the minute of
    retrying ends."""
    import socket
    import tempfile
    import time

    with socket.socket() as silent, tempfile.TemporaryFile(mode="w+") as log:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog; nobody ever answers them
        port = silent.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBLANE_SCHEMA")}
        env.update(PYTHONPATH=str(ROOT), DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/test?sslmode=disable")
        proc = subprocess.Popen([sys.executable, "-m", "joblane", command, WORKER_APP, "--log-format", "json",
                                 "--connect-timeout", "60"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                text=True)
        try:
            lines: list[dict] = []
            deadline = time.monotonic() + 25
            while len(lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
                log.seek(0)
                lines = [json.loads(line) for line in log.read().splitlines() if line.startswith("{")]
        finally:
            proc.kill()
            proc.wait(10)
    assert len(lines) >= 2, lines
    first, second = lines[0], lines[1]
    assert first["level"] == "error", first
    if command == "worker":
        assert first["message"] == ("cannot reach the database (no answer within 5s): is DATABASE_URL right and "
                                    "the server up? Retrying for up to 60s (--connect-timeout)")
        assert second["message"].startswith("database still not reachable (no answer within 5s); retrying in ")
    else:
        assert first["message"] == ("cannot connect to the database: no answer within 5s: is DATABASE_URL right and "
                                    "the server up? Retrying for up to 60s (--connect-timeout)")
        assert second["message"].startswith("cannot connect to the database: no answer within 5s; retrying in ")
    assert second["level"] == "warning"


def test_worker_refuses_hostile_names(joblane_dsn, joblane_schema):
    env = {"DATABASE_URL": joblane_dsn, "JOBLANE_SCHEMA": joblane_schema}
    assert_one_line_error(joblane_cli("worker", WORKER_APP, "-q", "x'; DROP TABLE jobs; --", env=env),
                          "invalid queue name")
    assert_one_line_error(joblane_cli("worker", WORKER_APP, "-q", "ünï", env=env), "invalid queue name")
    assert_one_line_error(joblane_cli("worker", WORKER_APP, env={**env, "JOBLANE_SCHEMA": 'x"y'}),
                          "invalid schema name")
    assert_one_line_error(joblane_cli("relay", WORKER_APP, env={**env, "JOBLANE_SCHEMA": "a;b"}),
                          "invalid schema name")
    assert_one_line_error(cli("relay", "tests.chaos.chaos_app:app", env=env), "routes no topic")


def test_worker_with_a_wrong_role_or_database_name(joblane_dsn):
    import urllib.parse

    parts = urllib.parse.urlsplit(joblane_dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        pytest.skip("DATABASE_URL is not a postgresql:// URL")
    host = parts.netloc.rsplit("@", 1)[-1]
    nobody = urllib.parse.urlunsplit(parts._replace(netloc=f"no_such_role_x@{host}"))
    nodb = urllib.parse.urlunsplit(parts._replace(path="/no_such_database_x"))
    assert_one_line_error(joblane_cli("--database-url", nobody, "worker", WORKER_APP), "cannot log in")
    assert_one_line_error(joblane_cli("--database-url", nodb, "worker", WORKER_APP), "cannot use the database")
    assert_one_line_error(joblane_cli("--database-url", nodb, "relay", WORKER_APP), "no_such_database_x")


# -- what a destination answers must never jam the relay ------------------------

async def test_a_destination_error_with_nul_or_undecodable_text_is_recorded(app, conn):
    """One error PostgreSQL refuses would keep the whole batch unrecorded, to be re-sent every lease."""
    from joblane.outbox import Delivery, Relay, Sink

    class Picky(Sink):
        async def send(self, messages):
            return [Delivery.retry("HTTP 500: \x00\x01 binary \udcff body") if m.payload.get("poison")
                    else Delivery.sent() for m in messages]

    app.route("t.", Picky(), backoff=3600)
    ids = [app.publish(conn, "t.x", {"poison": i == 1}) for i in range(3)]
    relay = Relay(app, listen=False)
    try:
        result = await relay.run_once()
    finally:
        await relay.close()
    assert (result.sent, result.retried, result.stale) == (2, 1, 0)
    rows = dict((r[0], r[1:]) for r in conn.execute(
        f"SELECT id, state, last_error FROM {table(app, 'outbox')}").fetchall())
    assert rows[ids[0]] == ("sent", None) and rows[ids[2]] == ("sent", None)
    assert rows[ids[1]] == ("pending", "HTTP 500: \\0\x01 binary ? body")


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"x": value}
    return value


def test_a_payload_nested_too_deeply_is_one_clear_error_and_the_transaction_goes_on(app, joblane_dsn, conn):
    deep = _deep(5000)
    with psycopg.connect(joblane_dsn) as c, c.transaction():
        with pytest.raises(joblane.JoblaneError, match="payload is nested too deeply to encode as JSON"):
            app.enqueue(c, "k", deep)
        with pytest.raises(joblane.JoblaneError, match="nested too deeply"):
            app.enqueue_many(c, [JobSpec("k", {"i": 1}), JobSpec("k", deep)])
        with pytest.raises(joblane.JoblaneError, match="nested too deeply"):
            app.publish(c, "t.x", deep)
        app.enqueue(c, "k", {"fine": True})  # the caller's transaction is still usable
    assert count(conn, app) == 1


def test_invalid_utf8_on_the_command_line_is_one_line_and_exit_1(app):
    bad = b"a\xed\xa0\x80b"  # a UTF-16 surrogate encoded as UTF-8: not valid UTF-8
    env = {**os.environ, "DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema}
    for args in ([b"jobs", b"--kind", bad], [b"retry", b"--kind", bad], [b"replay", b"--kind", bad, b"--dry-run"]):
        done = subprocess.run([sys.executable.encode(), b"-m", b"joblane", *args], env=env, cwd=ROOT,
                              capture_output=True, timeout=60)
        err = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 1, err
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert "is not valid UTF-8" in err
