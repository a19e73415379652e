"""Load the named queries of ``sql/*.sql`` for one schema.

A file is a catalogue: each query starts with ``-- name: <name>`` followed by
a one-line ``-- description``. ``{schema}`` is replaced by the schema name,
validated and quoted as an identifier; values are always ``$n`` parameters.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.M)
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
QUERY_FILES = ("jobs.sql", "admin.sql", "outbox.sql", "dashboard.sql", "periodic.sql", "review.sql", "limits.sql",
               "history.sql", "ai.sql", "flows.sql")


def validate_schema(name: str) -> str:
    """Return ``name`` if it is a safe schema name, else raise ValueError."""
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise ValueError(
            f"invalid schema name {name!r}: use 1-48 letters, digits or underscores, not starting with a digit"
        )
    return name


def quote_ident(name: str) -> str:
    """Quote a validated identifier for SQL text."""
    return '"' + validate_schema(name).replace('"', '""') + '"'


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str


def parse(text: str) -> dict[str, Query]:
    """Split a catalogue into its named queries."""
    found: dict[str, Query] = {}
    marks = list(_NAME.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = text[mark.end():end].strip("\n")
        lines = body.splitlines()
        if not lines or not lines[0].startswith("--"):
            raise ValueError(f"query {mark.group(1)!r} has no one-line description")
        description = lines[0].lstrip("-").strip()
        sql = "\n".join(lines[1:]).strip().rstrip(";").strip()
        if mark.group(1) in found:
            raise ValueError(f"query {mark.group(1)!r} is defined twice")
        found[mark.group(1)] = Query(mark.group(1), description, sql)
    return found


@functools.lru_cache(maxsize=None)
def catalogue() -> dict[str, Query]:
    """Every named query, with the ``{schema}`` placeholder still in place."""
    merged: dict[str, Query] = {}
    folder = resources.files("joblane") / "sql"
    for filename in QUERY_FILES:
        path = folder / filename
        if not path.is_file():
            continue
        for name, query in parse(path.read_text()).items():
            if name in merged:
                raise ValueError(f"query {name!r} is defined in two files")
            merged[name] = query
    return merged


class Queries:
    """The SQL text of every named query for one schema, as attributes.

    ``queries`` is joblane's catalogue unless given (e.g. ``parse(text)`` of a file of one's own).
    """

    def __init__(self, schema: str, queries: dict[str, Query] | None = None):
        self.schema = validate_schema(schema)
        quoted = quote_ident(schema)
        chosen = catalogue() if queries is None else queries
        self._sql = {name: q.sql.replace("{schema}", quoted) for name, q in chosen.items()}

    def __getattr__(self, name: str) -> str:
        try:
            return self._sql[name]
        except KeyError:
            raise AttributeError(f"no named query {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._sql)


@functools.lru_cache(maxsize=None)
def for_schema(schema: str) -> Queries:
    return Queries(schema)
