"""NATS JetStream (nats-py): the idempotency key is the ``Nats-Msg-Id`` header.

JetStream drops a message whose id it has seen within the stream's
duplicate window (two minutes unless the stream says otherwise), so a
re-send after a relay crash stores nothing twice. A batch is published
without waiting between messages and its acks are awaited together.

A stream must capture the subjects: until one does, every try is retried
with the reason in ``last_error`` (``no JetStream stream captures subject
...``), and the first batch after the stream appears goes out, without a
relay restart. ``declare=True`` creates the stream instead.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Awaitable, Callable, Sequence

import nats
from nats.js import api
from nats.js.errors import NoStreamResponseError, NotFoundError

from ...errors import JoblaneError
from ..message import Delivery, Message, describe
from .base import Sink, standard_headers, target

log = logging.getLogger("joblane.outbox")

_EXPLAINED_PER_BATCH = 8  # subjects a failing batch looks up to name the reason


def stream_subjects(subject: str | Callable[[Message], str] | None, prefix: str) -> str:
    """The JetStream subject pattern that captures every subject a route of ``prefix`` publishes to.

    The topic is the subject by default, so the prefix ``crm.`` gives ``crm.>``;
    a template ending in ``{topic}`` (``events.{topic}``) gives ``events.crm.>``;
    a fixed subject is itself. Anything else cannot be derived: pass ``subjects=``.
    """
    spec = "{topic}" if subject is None else subject
    why = None
    if callable(spec):
        why = "the subject is a function"
    elif "{key}" in spec:
        why = "the subject names {key}"
    elif "{topic}" not in spec:
        return spec
    elif not spec.endswith("{topic}") or spec.count("{topic}") != 1:
        why = "the subject does not end with {topic}"
    elif not prefix.endswith("."):
        why = ("a prefix that does not end with '.' routes topics no subject pattern matches exactly"
               if prefix else "the route takes every topic (prefix '')")
    if why is not None:
        raise JoblaneError(f"NatsSink(declare=True) on route {prefix!r}: cannot tell the stream's subjects ({why}); "
                           "pass subjects=[...] to NatsSink")
    return spec[:-len("{topic}")] + prefix + ">"


def _stream_name(parts: Sequence[str]) -> str:
    words = [re.sub(r"[^A-Za-z0-9_-]+", "_", p).strip("_").upper() for p in parts]
    return "JOBLANE_" + ("_".join(w for w in words if w) or "OUTBOX")


class NatsSink(Sink):
    """Publish each message to JetStream on ``subject`` (default: the topic).

    ``stream`` makes the server refuse a subject captured by another stream.
    The stream is created by whoever owns it, unless ``declare=True``: then
    the sink creates it when it opens if no stream captures its subjects yet
    (named ``stream``, default ``JOBLANE_<PREFIX>``; capturing ``subjects``,
    default the route's prefix as a pattern: route ``crm.`` captures
    ``crm.>``), or adds the missing subjects to the stream of that name.
    """

    name = "nats"

    def __init__(
        self,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        subject: str | Callable[[Message], str] | None = None,
        stream: str | None = None,
        declare: bool = False,
        subjects: Sequence[str] | None = None,
        timeout: float = 10.0,
        max_pending: int = 4000,
        find: Callable[[Message], Awaitable[bool]] | None = None,
        **connect_options: Any,
    ):
        super().__init__(find=find)
        self.servers = servers
        self.subject = subject
        self.stream = stream
        self.declare = bool(declare)
        self.subjects = list(subjects) if subjects is not None else None
        self.timeout = timeout
        self.max_pending = max_pending
        self._connect_options = connect_options
        self._prefixes: list[str] = []
        self._declared = False
        self._nc = None
        self._js = None

    def routed(self, prefix: str) -> None:
        """Called by ``app.route``: with ``declare=True``, the route's prefix tells the stream's subjects."""
        if self.declare and self.subjects is None:
            stream_subjects(self.subject, prefix)  # refuses, at app.route, what cannot be derived
        self._prefixes.append(prefix)

    def stream_config(self) -> tuple[str, list[str]]:
        """The name and subjects of the stream ``declare=True`` creates."""
        if self.subjects is not None:
            patterns = list(self.subjects)
        else:
            patterns = [stream_subjects(self.subject, p) for p in self._prefixes]
        if not patterns:
            raise JoblaneError("NatsSink(declare=True) is routed nowhere: pass subjects=[...] or use it in app.route")
        return self.stream or _stream_name(self._prefixes or patterns), list(dict.fromkeys(patterns))

    async def open(self) -> None:
        """Connect, and with ``declare=True`` make sure a stream captures the subjects; called before every batch."""
        if self._nc is None or self._nc.is_closed:
            options = {"connect_timeout": 5, "max_reconnect_attempts": -1, **self._connect_options}
            self._nc = await nats.connect(self.servers, **options)
            self._js = self._nc.jetstream(publish_async_max_pending=self.max_pending)
        if self.declare and not self._declared:
            await self._declare_stream()
            self._declared = True

    async def _declare_stream(self) -> None:
        name, patterns = self.stream_config()
        missing = []
        for pattern in patterns:
            try:
                owner = await self._js.find_stream_name_by_subject(pattern)
            except NotFoundError:
                missing.append(pattern)
                continue
            if self.stream and owner != self.stream:
                raise JoblaneError(f"subjects {pattern!r} belong to stream {owner!r}, not {self.stream!r}")
        if not missing:
            return
        try:
            info = await self._js.stream_info(name)
        except NotFoundError:
            await self._js.add_stream(name=name, subjects=missing)
            log.info("created JetStream stream %s for %s", name, ", ".join(missing))
            return
        await self._js.update_stream(info.config.evolve(subjects=[*(info.config.subjects or []), *missing]))
        log.info("added %s to JetStream stream %s", ", ".join(missing), name)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            try:
                await asyncio.wait_for(self._nc.drain(), 5.0)
            except Exception:
                await self._nc.close()
        self._nc = self._js = None

    def headers_for(self, message: Message) -> dict[str, str]:
        return standard_headers(message, api.Header.MSG_ID)

    async def send(self, messages: Sequence[Message]) -> list[Delivery]:
        await self.open()
        futures: list[asyncio.Future | Delivery] = []
        subjects: list[str | None] = []
        js = self._js
        for m in messages:
            subject = None
            try:
                subject = target(self.subject, m)
                # Below the client's limit of publishes in flight nothing can stall: no timeout to arm (with
                # one, the client wraps every publish in a task of its own); at the limit, wait that long.
                stall = None if js.publish_async_pending() < self.max_pending - 1 else self.timeout
                futures.append(await js.publish_async(
                    subject, m.body, wait_stall=stall, stream=self.stream, headers=self.headers_for(m)))
            except Exception as exc:  # not published: the rest of the batch still goes
                futures.append(Delivery.retry(f"publish: {describe(exc)}"))
            subjects.append(subject)
        pending = [f for f in futures if isinstance(f, asyncio.Future)]
        if pending:
            await asyncio.wait(pending, timeout=self.timeout)
        results: list[Delivery | None] = []
        unanswered: dict[str, list[int]] = {}  # subject -> indexes of rows no stream took (or no ack came for)
        for i, f in enumerate(futures):
            if isinstance(f, Delivery):
                results.append(f)
                continue
            if not f.done():
                f.cancel()
            elif f.exception() is None:
                results.append(Delivery.sent())  # a duplicate ack is a delivery too
                continue
            elif not isinstance(f.exception(), NoStreamResponseError):
                results.append(Delivery.retry(f"JetStream: {describe(f.exception())}"))
                continue
            results.append(None)
            unanswered.setdefault(subjects[i], []).append(i)
        for n, (subject, indexes) in enumerate(unanswered.items()):
            reason = await self._explain(subject) if n < _EXPLAINED_PER_BATCH else None
            for i in indexes:
                f = futures[i]
                if f.cancelled():
                    error = f"no JetStream ack within {self.timeout:g}s" + (f": {reason}" if reason else "")
                else:
                    error = reason or f"JetStream: {describe(f.exception())}"
                results[i] = Delivery.retry(error)
        return results  # type: ignore[return-value]

    async def _explain(self, subject: str) -> str | None:
        """Why JetStream did not take a message on ``subject``, when the stream layout says why."""
        try:
            owner = await asyncio.wait_for(self._js.find_stream_name_by_subject(subject), self.timeout)
        except NotFoundError:
            self._declared = False  # with declare=True the next batch creates the stream again
            how = "the relay creates it again with the next batch" if self.declare \
                else "create one, or pass declare=True to NatsSink"
            return f"no JetStream stream captures subject {subject!r} ({how})"
        except Exception:
            return None
        if self.stream and owner != self.stream:
            return f"subject {subject!r} belongs to JetStream stream {owner!r}, not {self.stream!r}"
        return None
