"""The sink interface: open, deliver a batch, report per message, close; optionally read back."""

from __future__ import annotations

from typing import Awaitable, Callable, Sequence

from ..message import Delivery, Message


class Sink:
    """Delivers outbox messages to one destination.

    Subclasses implement ``send(messages)`` and return one ``Delivery`` per
    message, in order; they deliver the whole batch at once where the client
    allows it (pipelined requests, acks awaited together). An exception from
    ``send`` counts as a retryable failure of every message in the batch.

    Read-back, for destinations that cannot deduplicate: a sink whose
    ``find(message)`` is implemented (override it, or pass ``find=`` an async
    function) is asked before every re-send (``message.attempt > 1``) whether
    the destination already has the record; if it does, the row is marked
    sent without sending it again.
    """

    name = "sink"

    def __init__(self, *, find: Callable[[Message], Awaitable[bool]] | None = None):
        self._find = find

    def routed(self, prefix: str) -> None:
        """Called by ``app.route(prefix, sink)`` for each route that uses this sink (a sink that declares its
        destination learns from it what to declare); may raise ``JoblaneError`` to refuse the route."""

    async def open(self) -> None:
        """Connect; called by the relay when it starts. Sinks that connect lazily call it again before each
        batch, so a destination that was missing or down is picked up without a restart."""

    async def close(self) -> None:
        """Disconnect; called once when the relay stops."""

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        raise NotImplementedError

    async def find(self, message: Message) -> bool:
        """Whether the destination already holds ``message`` (read-back)."""
        if self._find is None:
            raise NotImplementedError(f"{type(self).__name__} has no read-back")
        return bool(await self._find(message))

    @property
    def reads_back(self) -> bool:
        return self._find is not None or type(self).find is not Sink.find

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def target(spec: "str | Callable[[Message], str] | None", message: Message) -> str:
    """Where a message goes: the topic itself, a template with ``{topic}``/``{key}``, or a function of it."""
    if spec is None:
        return message.topic
    if callable(spec):
        return spec(message)
    return spec.format(topic=message.topic, key=message.key or "")


def standard_headers(message: Message, idempotency_header: str) -> dict[str, str]:
    """The publisher's headers, then the topic and key, then the idempotency key (which always wins)."""
    headers = dict(message.headers)
    headers["Joblane-Topic"] = message.topic
    if message.key is not None:
        headers["Joblane-Key"] = message.key
    headers[idempotency_header] = message.idempotency_key
    return headers
