"""`joblane dashboard` as a user starts it: a real process on a real port, and its one-line refusals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
from click.testing import CliRunner

from joblane.cli import main

from ..conftest import ROOT, wait_until
from ..helpers import free_port


def get(url: str, **kwargs) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2, **kwargs)
    except httpx.TransportError:
        return None


def test_dashboard_command_serves_with_a_token_beyond_loopback(joblane_schema):
    token = "a-long-random-token-0123456789"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "joblane", "dashboard", "--host", "0.0.0.0", "--port", str(port), "--read-only"],
        env={**os.environ, "JOBLANE_SCHEMA": joblane_schema, "JOBLANE_DASHBOARD_TOKEN": token}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    bearer = {"authorization": f"Bearer {token}"}
    try:
        first = wait_until(lambda: get(base + "/metrics"), timeout=30, message="the dashboard answering")
        assert first.status_code == 401
        assert get(base + "/", follow_redirects=False).headers["location"] == "/login?next=%2F"
        metrics = get(base + "/metrics", headers=bearer)
        assert metrics.status_code == 200 and "joblane_jobs" in metrics.text
        page = get(base + "/jobs", headers=bearer)
        assert page.status_code == 200 and "read-only" in page.text and 'name="ids"' not in page.text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert f"on http://0.0.0.0:{port}/ (read-only) (token required)" in out


def test_dashboard_command_refusals_are_one_line(joblane_schema):
    runner = CliRunner()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = runner.invoke(main, ["--schema", joblane_schema, "dashboard", "--port", str(port)])
    assert busy.exit_code == 1 and "pick another --port" in busy.output
    unmigrated = runner.invoke(main, ["--schema", "never_migrated_here", "dashboard", "--port", str(free_port())])
    assert unmigrated.exit_code == 1 and "joblane migrate" in unmigrated.output
    for result in (busy, unmigrated):
        assert len(result.output.strip().splitlines()) == 1, result.output
