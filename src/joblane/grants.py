"""The least privileges each kind of joblane process needs, as SQL to review and run.

Three roles:

* ``app``: the application's own database user. It enqueues and publishes
  in its transactions and records inbox keys; it cannot read payloads,
  results or errors of jobs, nor change or delete any job.
* ``worker``: ``joblane worker`` and ``joblane relay``: claim, complete,
  heartbeat, rescue and prune jobs; deliver, retry and prune outbox rows;
  the periodic scheduler and queue limits that run inside workers.
* ``admin``: ``joblane migrate`` and the operator commands (retry, cancel,
  release, replay, the dashboard). Migrations alter tables, which only
  their owner may do, so the admin role owns the schema.

Run the statements as a superuser or the current owner, after
``joblane migrate`` (GRANT names tables that must exist) and again after an
upgrade that adds tables.
"""

from __future__ import annotations

import psycopg

from .errors import JoblaneError
from .queries import quote_ident
from .rules import first_line

ROLES = ("app", "worker", "admin")

# Every table of the schema, with what the app and the worker role may do to
# it ("" = nothing). Column lists are the columns a statement reads back:
# RETURNING, and the arbiter index of ON CONFLICT (unique_key, state).
# tests/security/test_grants.py fails when a table is missing here.
TABLES: dict[str, tuple[str, str]] = {
    # table            app                                                       worker
    "migrations":     ("",                                                       "SELECT"),
    "jobs":           ("INSERT, SELECT (id, queue, state, run_after, unique_key)",
                       "SELECT, INSERT, UPDATE, DELETE"),
    # UPDATE: a late outcome is noted on the try's row (note_late_outcomes)
    "attempts":       ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    "job_steps":      ("",                                                       "SELECT, INSERT, DELETE"),
    "outbox":         ("INSERT, SELECT (id)",                                    "SELECT, UPDATE, DELETE"),
    "inbox":          ("INSERT, SELECT (key)",                                   ""),
    "periodic_ticks": ("",                                                       "SELECT, INSERT, DELETE"),
    # each worker writes its app's limits at start
    "queue_limits":   ("",                                                       "SELECT, INSERT, UPDATE"),
    "queue_pauses":   ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    "queue_starts":   ("",                                                       "SELECT, INSERT, DELETE"),
    # workers and relays register and heartbeat themselves; the rescuer drops dead ones
    "processes":      ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    # the history service rolls slices up (ON CONFLICT reads history_slices), merges and deletes old ones
    "history_slices":   ("",                                                     "SELECT, INSERT, DELETE"),
    "history_attempts": ("",                                                     "SELECT, INSERT, DELETE"),
    "history_latency":  ("",                                                     "SELECT, INSERT, DELETE"),
    # each worker writes its app's budgets at start; the claim folds holds, a lean success notes its cost
    # on its hold, the pruner deletes ended windows
    "budgets":        ("",                                                       "SELECT, INSERT, UPDATE"),
    "budget_usage":   ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    "budget_holds":   ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    # cached steps: claim, fill, hit and release a key
    "step_cache":     ("",                                                       "SELECT, INSERT, UPDATE, DELETE"),
    # workflows: the functions below write these; the app creates batches, the pruner deletes
    "job_deps":       ("",                                                       "SELECT, DELETE"),
    "batches":        ("INSERT, SELECT (id)",                                    "SELECT, INSERT, DELETE"),
    "signals":        ("",                                                       "SELECT, DELETE"),
    # the claim's cursor storage (migration 13): the triggers on jobs write the entries as the owner;
    # the worker's claim reads lanes and entries, appends cursor rows, promotes deferred jobs and
    # appends the entries of jobs it gives back; rotate_ready empties slots as the owner
    "lanes":          ("",                                                       "SELECT, INSERT"),
    "ready":          ("",                                                       "SELECT, INSERT"),
    "cursors":        ("",                                                       "SELECT, INSERT"),
    "deferred":       ("",                                                       "SELECT, INSERT"),
    "ready_turns":    ("",                                                       "SELECT"),
    # the relay's cursor storage (migration 17): the triggers on outbox write the entries as the owner;
    # the relay's claim reads lanes and entries, appends cursor rows, promotes deferred rows and appends
    # the entries of rows it gives back or finds with an expired lease
    "outbox_lanes":    ("",                                                      "SELECT, INSERT"),
    "outbox_entries":  ("",                                                      "SELECT, INSERT"),
    "outbox_cursors":  ("",                                                      "SELECT, INSERT"),
    "outbox_deferred": ("",                                                      "SELECT, INSERT"),
    # the ring's slots: reached through their parents, whose grants cover them
    **{f"{ring}_{slot}": ("", "") for ring in ("ready", "cursors", "outbox_entries", "outbox_cursors")
       for slot in range(4)},
}

# Functions of the schema each role may call: insert_job, behind App.enqueue,
# and claim_jobs, the worker's claim (both run with the caller's privileges,
# and PUBLIC may call them: the grant is spelled out for reviewers); the SQL
# API and the workflow steps of enqueue (after=, batches) and signal (SECURITY
# DEFINER: they run as the schema's owner, and EXECUTE is revoked from
# PUBLIC); the worker also parks the jobs whose task raised WaitFor. The rest
# are internal (the trigger's).
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "app": ("enqueue", "insert_job", "publish", "signal", "link_jobs", "add_to_batch", "seal_batch"),
    "worker": ("enqueue", "insert_job", "publish", "signal", "link_jobs", "add_to_batch", "seal_batch", "park_jobs",
               "claim_jobs", "claim_ready_jobs", "rotate_ready", "ensure_attempt_generations",
               "retire_attempt_generation", "prune_deferred", "claim_outbox", "requeue_lost_outbox"),
}
# every function the migrations create, which the admin role owns
ALL_FUNCTIONS = ("add_to_batch", "attempt_generation_kept", "attempt_partitions", "batch_job_finished", "claim_jobs",
                 "claim_ready_jobs",
                 "enqueue", "ensure_attempt_generations", "finish_batch", "insert_job", "jobs_channel", "jobs_flow",
                 "link_jobs", "park_jobs", "publish", "release_children", "retire_attempt_generation", "seal_batch",
                 "signal", "queue_entries", "requeue_jobs", "jobs_added", "job_became_pending", "promote_due_jobs",
                 "rotate_ready", "lane_of", "prune_deferred", "outbox_lane_of", "outbox_entries_for", "outbox_requeue",
                 "outbox_added", "outbox_became_ready", "outbox_unblocked", "promote_due_outbox", "claim_outbox",
                 "requeue_lost_outbox")
# Partitioned tables: their partitions are made by the pruner as job ids grow (as the owner of the
# functions above), and each has an owner of its own, which ALTER TABLE ... OWNER on the parent leaves.
PARTITIONED = ("attempts",)

# Sequences a role calls nextval() on by name (identity columns need no grant).
SEQUENCES: dict[str, tuple[str, ...]] = {
    "app": ("outbox_id_seq",),  # publish draws the id first to store the default idempotency key
    # the claims (jobs and outbox) number their cursor rows and read the ring's turn (migrations 13, 15)
    "worker": ("cursor_step", "ready_turn"),
}
# Sequences of their own (not an identity column's), which the admin role owns
OWN_SEQUENCES = ("cursor_step", "ready_turn")


def quote_role(name: str) -> str:
    """Quote a role name as an SQL identifier (any characters but NUL, at most 63 bytes)."""
    if not isinstance(name, str) or not name:
        raise JoblaneError("the user name must be a non-empty string")
    if "\x00" in name:
        raise JoblaneError("the user name contains a NUL character")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise JoblaneError("the user name is not valid UTF-8") from None
    if size > 63:
        raise JoblaneError(f"the user name is {size} bytes long; PostgreSQL keeps at most 63")
    return '"' + name.replace('"', '""') + '"'


def statements(role: str, user: str, schema: str, database: str | None = None) -> list[str]:
    """The SQL that gives ``user`` the privileges of ``role`` on ``schema``."""
    if role not in ROLES:
        raise JoblaneError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    to = quote_role(user)
    s = quote_ident(schema)
    if role == "admin":
        if not database:
            raise JoblaneError("the admin grants name the database: give --database NAME or set DATABASE_URL")
        out = [
            "-- admin: `joblane migrate` (creates the schema when missing) and the operator commands",
            f"GRANT CREATE ON DATABASE {quote_role(database)} TO {to};",
            f"ALTER SCHEMA {s} OWNER TO {to};",
        ]
        out += [f"ALTER TABLE {s}.{quote_ident(table)} OWNER TO {to};" for table in TABLES]
        out += [f"ALTER SEQUENCE {s}.{quote_ident(name)} OWNER TO {to};" for name in OWN_SEQUENCES]
        out += [f"ALTER FUNCTION {s}.{quote_ident(name)} OWNER TO {to};" for name in ALL_FUNCTIONS]
        for table in PARTITIONED:
            parent = f"{s}.{quote_ident(table)}"
            body = (f"DECLARE p regclass; BEGIN FOR p IN SELECT inhrelid::regclass FROM pg_inherits"
                    f" WHERE inhparent = {_literal(parent)}::regclass LOOP"
                    f" EXECUTE format('ALTER TABLE %s OWNER TO %s', p, {_literal(to)}); END LOOP; END")
            out.append(f"-- the partitions of {table}")
            out.append(f"DO {_literal(body)};")
        return out
    column = 0 if role == "app" else 1
    out = [f"-- {role}: least privileges on schema {schema}", f"GRANT USAGE ON SCHEMA {s} TO {to};"]
    for table, privileges in TABLES.items():
        if privileges[column]:
            out.append(f"GRANT {privileges[column]} ON TABLE {s}.{quote_ident(table)} TO {to};")
    for sequence in SEQUENCES[role]:
        out.append(f"GRANT USAGE, SELECT ON SEQUENCE {s}.{quote_ident(sequence)} TO {to};")
    for function in FUNCTIONS[role]:
        out.append(f"GRANT EXECUTE ON FUNCTION {s}.{quote_ident(function)} TO {to};")
    return out


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def database_of(dsn: str | None) -> str | None:
    """The database a DSN names (libpq's default: the user name), or None without a DSN."""
    if not dsn:
        return None
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise JoblaneError(f"cannot read the database name from DATABASE_URL: {first_line(exc)}") from None
    return params.get("dbname") or params.get("user")
