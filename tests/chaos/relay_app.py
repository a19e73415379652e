"""The app the relay chaos test runs in real `joblane relay` processes.

Its destination appends every message it accepts to the file named by
CHAOS_SINK, one write(2) per batch on an O_APPEND descriptor: what a
destination received survives the relay being SIGKILLed right after, as a
broker's copy would. It turns away a few messages (a retryable failure), so
retries and backoff are part of the run. An HTTP destination costs a few
milliseconds of CPU per message, which two shared cores cannot spend on
5,000 rows; tests/outbox covers the real sinks.
"""

from __future__ import annotations

import json
import os
import random
from typing import Sequence

import joblane
from joblane.outbox import Delivery, Message, Sink


class AppendSink(Sink):
    name = "append"

    def __init__(self, path: str, refuse: float = 0.03):
        super().__init__()
        self.path = path
        self.refuse = refuse
        self._fd: int | None = None

    async def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        if self._fd is None:
            await self.open()
        answers, lines = [], []
        for m in messages:
            if random.random() < self.refuse:
                answers.append(Delivery.retry("destination busy"))
                continue
            lines.append(json.dumps([m.idempotency_key, m.topic, m.body.decode()]) + "\n")
            answers.append(Delivery.sent())
        if lines:
            os.write(self._fd, "".join(lines).encode())
        return answers

    def __repr__(self) -> str:
        return f"<AppendSink {self.path}>"


app = joblane.App()
app.route("chaos.", AppendSink(os.environ.get("CHAOS_SINK", os.devnull)), backoff=0.05)
