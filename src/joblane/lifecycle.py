"""What the long-running processes (worker, relay) share: stop-aware sleeps, retry delays, signal handling."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from typing import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)

# a worker or relay started without --pgbouncer that finds a pooler between it and the server (%g: its poll interval)
POOLER_FOUND = ("the database is reached through a pooler or proxy (its ends differ from this connection's): running "
                "as with --pgbouncer (no prepared statements; polling every %gs instead of LISTEN); --no-pgbouncer "
                "keeps the direct mode")


async def sleep_unless(event: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``event`` is set meanwhile."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except asyncio.TimeoutError:
        pass


class GracefulSignals:
    """SIGTERM/SIGINT once: ``stop()`` (drain within the grace period); twice: exit at once.

    ``draining`` and ``abandoning`` finish the log lines, e.g. "finishing
    running jobs (grace 30s)" and "running jobs return when their leases expire".
    """

    def __init__(self, stop: Callable[[], None], log: logging.Logger, *, draining: str, abandoning: str):
        self.stop = stop
        self.log = log
        self.draining = draining
        self.abandoning = abandoning
        self.received = 0

    def __call__(self, signame: str) -> None:
        self.received += 1
        if self.received == 1:
            self.log.info("%s received: %s; send again to exit at once", signame, self.draining)
            self.stop()
        else:
            self.log.warning("%s received again: exiting now; %s", signame, self.abandoning)
            os._exit(1)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self, sig.name)

    @staticmethod
    def remove(loop: asyncio.AbstractEventLoop) -> None:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


def retry_delay(failures: int, *, base: float, cap: float, jitter: float = 0.0) -> float:
    """Seconds to wait after ``failures`` failures in a row: base doubling up to cap, +-jitter."""
    delay = min(cap, base * 2 ** min(failures, 16))
    return delay * random.uniform(1 - jitter, 1 + jitter) if jitter else delay


def version() -> str:
    """The installed joblane's version (what workers and relays register with)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("joblane")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without an install
        return "0+unknown"
