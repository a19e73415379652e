"""The floor: checks, JSON encoding, backoff, times and texts that every part of joblane shares.

A leaf: it imports nothing from joblane but ``errors``. Every other room may
import it; it calls nothing back.

One rule for times written as text (``--since``, ``--until``, the
dashboard's filters, ``App.replay(since=...)``): a duration (``90s``,
``30m``, ``24h``, ``7d``, ``2w``) means that long ago; an ISO 8601 time
with an offset means that instant; **an ISO time without an offset is
UTC**, wherever the command or the dashboard runs.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
import shlex
from typing import Any, Callable

from .errors import JoblaneError

MAX_DELAY = 10 * 365 * 24 * 3600.0  # the longest delay, pause or backoff joblane stores (ten years)
ERROR_LIMIT = 4000  # characters of an error kept in last_error (jobs and outbox rows alike)

def install_hint(extra: str) -> str:
    """How to add ``extra`` to this joblane, from where it was installed: ``pip install 'joblane[web]'`` from an
    index, ``pip install '/path/to/checkout[web]'`` (``-e`` when editable) from a checkout, ``pip install
    '/path/joblane-1.0-py3-none-any.whl[web]'`` from a wheel file (PEP 610's direct_url.json says which)."""
    from importlib import metadata
    from urllib.parse import unquote, urlsplit

    try:
        found = json.loads(metadata.distribution("joblane").read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, ValueError):
        found = None
    url = found.get("url", "") if isinstance(found, dict) else ""
    if url.startswith("file://"):
        where = unquote(urlsplit(url).path)
        editable = "-e " if (found.get("dir_info") or {}).get("editable") else ""
        return f"pip install {editable}{shlex.quote(f'{where}[{extra}]')}"
    return f"pip install {shlex.quote(f'joblane[{extra}]')}"


_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")


# -- names and texts -----------------------------------------------------------


def check_queue(queue: Any) -> str:
    """A queue name: 1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit."""
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
        raise JoblaneError(
            f"invalid queue name {queue!r}: use 1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit"
        )
    return queue


def check_text(what: str, value: Any, limit: int) -> str:
    """A non-empty string PostgreSQL can store: at most ``limit`` characters, no NUL, valid UTF-8."""
    if not isinstance(value, str) or not value:
        raise JoblaneError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise JoblaneError(f"{what} is {len(value)} characters long; the limit is {limit}")
    if "\x00" in value:
        raise JoblaneError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JoblaneError(f"{what} contains a lone surrogate (\\ud800-\\udfff), which is not valid UTF-8") from None
    return value


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    try:
        text = str(exc).strip()
    except Exception:  # a broken __str__
        text = ""
    return text.splitlines()[0] if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line for last_error: the exception type and message, NUL-free, valid UTF-8 and bounded."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the outcome
        message = "(message could not be read)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return bounded_text(text.replace("\n", " "))


def bounded_text(text: str, limit: int = ERROR_LIMIT) -> str:
    """``text`` as PostgreSQL's text column takes it: NUL shown as \\0, lone surrogates replaced, cut to ``limit``."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # surrogateescape'd bytes cannot be sent as UTF-8
    return text.replace("\x00", "\\0")[:limit]


def hold_reason(last_error: str | None) -> str | None:
    """The reason given to ``Hold`` (last_error reads "Hold: <reason>")."""
    if last_error and last_error.startswith("Hold: "):
        return last_error[len("Hold: "):]
    return last_error


def actor() -> str:
    """Who does an admin action when nobody says: ``user@host``."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_DRIVER_SUFFIX = re.compile(r"^(postgres(?:ql)?)\+[A-Za-z0-9_]+://")


def normalize_dsn(dsn: str) -> str:
    """A libpq URL from SQLAlchemy's form too: ``postgresql+psycopg://`` (or ``+asyncpg``...) -> ``postgresql://``."""
    return _DRIVER_SUFFIX.sub(r"\1://", dsn.strip(), count=1)


# -- JSON ----------------------------------------------------------------------

_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
# A real \u0000 escape in JSON text: preceded by an even number of backslashes
# (the text "\\u0000", an escaped backslash then "u0000", is fine).
NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


# The bulk enqueue's encoder: no table of the containers seen, a quarter of the time for many small
# payloads. A value that contains itself recurses until RecursionError; the bulk path then checks payload
# by payload with to_json, whose encoder names the circular reference.
_BULK_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), check_circular=False)


def encode_json(value: Any) -> str:
    """Compact JSON text (no NaN); raises TypeError, ValueError or RecursionError (also for a value that
    contains itself) like json.dumps."""
    return _BULK_ENCODER.encode(value)


def has_lone_surrogate(text: str) -> bool:
    """True when ASCII JSON text holds a lone surrogate escape (``\\ud800``), which jsonb refuses."""
    if "\\ud" not in text:
        return False
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_json_text(what: str, text: str) -> str:
    """Refuse JSON text PostgreSQL would reject mid-transaction: a NUL or a lone surrogate."""
    if "\\u0000" in text and NUL_ESCAPE.search(text):
        raise JoblaneError(f"{what} contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    if has_lone_surrogate(text):
        raise JoblaneError(f"{what} contains a lone surrogate (\\ud800-\\udfff), which PostgreSQL jsonb cannot store")
    return text


def to_json(what: str, value: Any, limit: int | None = None) -> str:
    """Serialise ``value`` for a jsonb column, with one-line errors for what PostgreSQL would refuse."""
    try:
        text = _ENCODER.encode({} if value is None else value)
    except RecursionError:
        raise JoblaneError(f"{what} is nested too deeply to encode as JSON") from None
    except (TypeError, ValueError) as exc:
        raise JoblaneError(f"{what} is not JSON-serialisable: {exc}") from None
    check_json_text(what, text)
    if limit is not None and len(text) > limit:
        raise JoblaneError(f"{what} is {len(text)} bytes as JSON; the limit is {limit} (App(max_payload_bytes=...))")
    return text


def lenient_json(value: Any) -> str | None:
    """JSON for metadata and hold data that PostgreSQL always accepts.

    One outcome that jsonb refuses would fail a whole completion batch on
    every retry, so what it cannot store is replaced instead: NaN and
    infinities by null, NUL by "\\0", lone surrogates by "?", values too
    deep to encode by their repr.
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        try:
            text = json.dumps(json.loads(json.dumps(value, default=str), parse_constant=lambda _: None),
                              separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):  # circular, deep or odd keys: keep a readable trace
            text = json.dumps(bounded_text(repr(value)))
    text = NUL_ESCAPE.sub(r"\1\\\\0", text)
    if has_lone_surrogate(text):
        text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


# -- delays and backoff --------------------------------------------------------


def exponential_backoff(base: float = 1.0, cap: float = 3600.0, jitter: float = 0.25) -> Callable[[int], float]:
    """Delay before retry ``attempt + 1``: base * 2^(attempt-1), capped, with +-jitter."""

    def delay(attempt: int) -> float:
        raw = min(cap, base * (2 ** max(0, attempt - 1)))
        return max(0.0, raw * random.uniform(1 - jitter, 1 + jitter))

    return delay


def bounded_delay(seconds: Any) -> float:
    """A delay PostgreSQL can add to now(): NaN, negative or unreadable -> 0, infinite or huge -> MAX_DELAY."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return 0.0
    if seconds != seconds or seconds < 0:
        return 0.0
    return min(seconds, MAX_DELAY)


# -- durations and times -------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|d|w)?\s*$", re.I)
_DURATION_SECONDS = {"s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "h": 3600, "d": 86400,
                     "w": 7 * 86400}
DURATION_HELP = "90s, 30m, 24h, 7d or 2w"


def parse_duration(text: Any, what: str = "duration", *, bare_seconds: bool = True) -> float:
    """``"90s"``, ``"30m"``, ``"24h"``, ``"7d"``, ``"2w"`` (or a bare number of seconds) -> seconds."""
    seconds = duration_or_none(text, bare_seconds=bare_seconds)
    if seconds is None:
        raise JoblaneError(f"{what} must be a duration such as {DURATION_HELP}, got {text!r}")
    return seconds


def duration_or_none(text: Any, *, bare_seconds: bool = True) -> float | None:
    """``parse_duration`` that answers None instead of raising."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text) if math.isfinite(text) and text >= 0 else None
    if not isinstance(text, str):
        return None
    m = _DURATION.match(text)
    if not m or (m.group(2) is None and not bare_seconds):
        return None
    return float(m.group(1)) * _DURATION_SECONDS[(m.group(2) or "s").lower()]


def parse_when(value: Any, what: str = "since") -> dt.datetime | None:
    """A point in time from a datetime, a timedelta or seconds ago, or text (see the module's rule).

    Text: a duration ago (``24h``, ``30m``, ``7d``) or an ISO 8601 time;
    an ISO time without an offset is UTC. Empty text is None.
    """
    if value is None or isinstance(value, dt.datetime):
        if value is not None and value.tzinfo is None:
            raise JoblaneError(f"{what} must be a timezone-aware datetime")
        return value
    now = dt.datetime.now(dt.timezone.utc)
    if isinstance(value, dt.timedelta):
        return now - value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return now - dt.timedelta(seconds=value)
    if isinstance(value, str):
        if not value.strip():
            return None
        seconds = duration_or_none(value, bare_seconds=False)
        if seconds is not None:
            return now - dt.timedelta(seconds=seconds)
        try:
            parsed = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
    raise JoblaneError(f"{what} must be a duration ago ({DURATION_HELP}) or an ISO time "
                       f"(UTC unless it has an offset), got {value!r}")


def format_age(seconds: float | None) -> str:
    """A duration for people: ``45s``, ``12m 5s``, ``3h 20m``, ``2d 4h``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60)}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60)}m"
    return f"{int(seconds // 86400)}d {int(seconds % 86400 // 3600)}h"


def format_span(seconds: float) -> str:
    """A window as a rate's denominator: ``s``, ``10s``, ``min``, ``2h``."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            n = seconds / size
            return unit if n == 1 else f"{n:g}{unit}"
    return "s" if seconds == 1 else f"{seconds:g}s"


def plural(n: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``3 batches``."""
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def tally(counts: Any, empty: str = "nothing") -> str:
    """Counts for a log line, in their order: ``7 done, 1 retry``; ``empty`` when all are zero."""
    def shown(n: Any) -> str:
        return f"{n:.1f}" if isinstance(n, float) and not n.is_integer() else f"{n:g}"

    parts = [f"{shown(n)} {str(name).replace('_', ' ')}" for name, n in dict(counts).items() if n]
    return ", ".join(parts) or empty


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


HORIZON_KEYS = ("kind", "who", "application", "user", "state", "seconds", "query", "xid_age")
# a replication slot this many transaction ids behind holds the horizon back noticeably (a slot has no age)
SLOT_BEHIND_XIDS = 1_000_000


def horizon_holder(rows: list) -> dict[str, Any] | None:
    """The row of the ``horizon_holder`` query as a dict of HORIZON_KEYS; None when nothing holds it."""
    return dict(zip(HORIZON_KEYS, rows[0])) if rows else None


def holds_horizon(holder: dict[str, Any] | None, seconds: float) -> bool:
    """Whether ``holder`` has held the horizon ``seconds`` or more (a slot: SLOT_BEHIND_XIDS behind)."""
    if holder is None:
        return False
    if holder["seconds"] is None:
        return (holder["xid_age"] or 0) >= SLOT_BEHIND_XIDS
    return holder["seconds"] >= seconds


def holder_name(holder: dict[str, Any]) -> str:
    """``session pid 4242``, ``replication slot 's1'``, ``prepared transaction 'tx'``."""
    kind, who = holder.get("kind"), holder.get("who")
    return f"session pid {who}" if kind == "session" else f"{kind} {who!r}"


def holder_text(holder: dict[str, Any]) -> str:
    """What holds vacuum's horizon, for people: ``session pid 4242 (psql, user alice, idle in transaction
    for 10m 2s: SELECT ...)``, ``replication slot 's1' (inactive)``, ``prepared transaction 'tx' (12m 3s)``."""
    name = holder_name(holder)
    parts = []
    if holder.get("application"):
        parts.append(str(holder["application"]))
    if holder.get("user"):
        parts.append(f"user {holder['user']}")
    state = holder.get("state")
    if holder.get("seconds") is not None:
        state = f"{state or 'open'} for {format_age(holder['seconds'])}"
    if state:
        parts.append(state)
    text = ", ".join(parts)
    query = " ".join(str(holder.get("query") or "").split())
    if query:
        text += f": {query[:120]}{'…' if len(query) > 120 else ''}"
    return f"{name} ({text})" if text else name
