"""Routes: which sink delivers a topic (longest matching prefix), ordered or not, with what retry budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import JoblaneError
from ..rules import exponential_backoff
from .sinks.base import Sink

DEFAULT_MAX_ATTEMPTS = 25


def outbox_backoff(attempt: int) -> float:
    """Delay before try ``attempt + 1``: 1 s doubling to a 10-minute cap, with +-25 % jitter."""
    return exponential_backoff(base=1.0, cap=600.0)(attempt)


@dataclass(frozen=True)
class Route:
    prefix: str
    sink: Sink
    ordered: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Callable[[int], float] = outbox_backoff


def make_route(
    routes: list[Route],
    topic_prefix: str,
    sink: Sink,
    *,
    ordered: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    backoff: float | Callable[[int], float] | None = None,
) -> Route:
    if not isinstance(topic_prefix, str) or "\x00" in topic_prefix or len(topic_prefix) > 255:
        raise JoblaneError(f"topic prefix must be a string of at most 255 characters ('' routes every topic), "
                           f"got {topic_prefix!r}")
    if not callable(getattr(sink, "send", None)):
        raise JoblaneError(f"route {topic_prefix!r}: the sink must be a joblane.outbox.sinks.Sink, "
                           f"got {type(sink).__name__}")
    if not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100_000:
        raise JoblaneError(f"route {topic_prefix!r}: max_attempts must be an integer from 1 to 100000, "
                           f"got {max_attempts!r}")
    if any(r.prefix == topic_prefix for r in routes):
        raise JoblaneError(f"topic prefix {topic_prefix!r} is routed twice")
    if backoff is None:
        backoff_fn = outbox_backoff
    elif callable(backoff):
        backoff_fn = backoff
    else:
        backoff_fn = exponential_backoff(base=float(backoff), cap=600.0)
    routed = getattr(sink, "routed", None)
    if callable(routed):
        routed(topic_prefix)  # e.g. NatsSink(declare=True) derives its stream's subjects from the prefix
    route = Route(topic_prefix, sink, bool(ordered), max_attempts, backoff_fn)
    routes.append(route)
    return route


def route_for(routes: list[Route], topic: str) -> Route | None:
    """The route of the longest prefix that ``topic`` starts with."""
    best = None
    for r in routes:
        if topic.startswith(r.prefix) and (best is None or len(r.prefix) > len(best.prefix)):
            best = r
    return best
