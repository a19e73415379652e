"""What a sink is handed (Message) and what it answers for each one (Delivery)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Message:
    """One outbox row on its way out.

    ``body`` is the payload as stored, JSON text in UTF-8, sent as is;
    ``payload`` decodes it. ``idempotency_key`` is ``outbox:<id>`` unless
    the publisher gave a business key: every sink puts it in the
    destination's own dedup field. ``attempt`` is 1 on the first try.
    """

    id: int
    topic: str
    key: str | None
    idempotency_key: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    attempt: int = 1
    created_at: dt.datetime | None = None

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Delivery:
    """The answer of a destination about one message.

    ``Delivery.sent()`` when the destination has it; ``Delivery.retry(error,
    after=seconds)`` when a later try may succeed (``after`` is what the
    destination asked for, e.g. Retry-After); ``Delivery.failed(error)`` when
    no retry can help (a 4xx): the row becomes ``failed`` at once.
    """

    ok: bool
    error: str | None = None
    retry_after: float | None = None
    permanent: bool = False

    @classmethod
    def sent(cls) -> "Delivery":
        return SENT

    @classmethod
    def retry(cls, error: str, after: float | None = None) -> "Delivery":
        return cls(False, error, after, False)

    @classmethod
    def failed(cls, error: str) -> "Delivery":
        return cls(False, error, None, True)


SENT = Delivery(True)


def describe(exc: BaseException) -> str:
    """One line naming an exception: its type and the first line of its text."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
