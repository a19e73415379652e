"""Headless Chromium for the dashboard's browser tests and screenshots: Debian's package, driven by Playwright.

``ensure_chromium()`` finds the browser or installs it with apt-get (idempotent,
one install at a time); Playwright never downloads a browser of its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from ..helpers import free_port

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]
LOCK = "/tmp/joblane-chromium-install.lock"


def find_chromium() -> str | None:
    for path in CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


def ensure_chromium() -> tuple[str | None, str]:
    """(path to chromium, "") or (None, why it cannot be had here)."""
    path = find_chromium()
    if path:
        return path, ""
    if not shutil.which("apt-get"):
        return None, "no chromium and no apt-get to install it: install a Chromium build at /usr/bin/chromium"
    if os.geteuid() != 0:
        return None, "no chromium, and installing it needs root: run `sudo apt-get install -y chromium`"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time across test processes
        if find_chromium():
            return find_chromium(), ""
        install = ["apt-get", "install", "-y", "-q", "chromium"]
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:  # the package lists may be missing or stale: refresh once and retry
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"apt-get install chromium failed: {last[0]}"
    path = find_chromium()
    return (path, "") if path else (None, "apt-get installed chromium but no binary was found")


@contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium browser (Playwright's sync API), or RuntimeError saying why there is none."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise RuntimeError("Playwright for Python is missing: pip install 'joblane[test]'") from None
    path, why = ensure_chromium()
    if path is None:
        raise RuntimeError(why)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=LAUNCH_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class LiveServer:
    """An ASGI app served by uvicorn on a loopback port, in a thread of this process."""

    def __init__(self, web, port: int | None = None):
        import uvicorn

        port = port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
