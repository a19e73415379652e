from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

import joblane
from joblane.queries import quote_ident

pytest_plugins = ["joblane.testing"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def app(joblane_dsn: str, joblane_schema: str) -> joblane.App:
    return joblane.App(joblane_dsn, schema=joblane_schema)


@pytest.fixture
def conn(joblane_dsn: str):
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        yield c


def table(app: joblane.App, name: str) -> str:
    return f"{quote_ident(app.schema)}.{name}"


def count(conn, app, where: str = "true", params=()) -> int:
    return conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE {where}", params).fetchone()[0]


class JoblaneProcess:
    """A real `joblane worker|relay APP` process for crash and signal tests."""

    command = "worker"

    def __init__(self, app_spec: str, schema: str, *args: str, env: dict | None = None):
        full_env = {**os.environ, "JOBLANE_SCHEMA": schema, "PYTHONPATH": str(ROOT), **(env or {})}
        # a file, not a pipe: a worker that logs a line per job must never block on a full pipe
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "joblane", self.command, app_spec, "--log-format", "json", *args],
            env=full_env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class WorkerProcess(JoblaneProcess):
    command = "worker"


class RelayProcess(JoblaneProcess):
    command = "relay"


def spawner(kind: type[JoblaneProcess]):
    """A fixture body: a function that starts ``kind`` processes, all stopped when the test ends."""
    started: list[JoblaneProcess] = []

    def spawn(app_spec: str, schema: str, *args: str, env: dict | None = None) -> JoblaneProcess:
        process = kind(app_spec, schema, *args, env=env)
        started.append(process)
        return process

    yield spawn
    for process in started:
        process.stop()


@pytest.fixture
def spawn_worker():
    yield from spawner(WorkerProcess)


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
