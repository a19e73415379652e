"""What people read: log lines in words, tables that keep words whole in a pipe, one-line errors, --json everywhere."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
from pathlib import Path

import click
from click.testing import CliRunner

from joblane.cli import main
from joblane.rules import plural, tally
from joblane.worker import Worker

from .conftest import count, table


async def test_a_stopping_worker_counts_in_words(app, conn, caplog):
    @app.task("quick")
    async def quick(job):
        return None

    @app.task("slow")
    async def slow(job):
        await asyncio.sleep(30)

    app.enqueue(conn, "quick", {})
    app.enqueue(conn, "slow", {})
    worker = Worker(app, poll_interval=0.05, grace_seconds=0.2, listen=False)
    with caplog.at_level(logging.INFO, logger="joblane.worker"):
        runner = asyncio.create_task(worker.run(install_signals=False))
        for _ in range(200):
            if count(conn, app, "state = 'done'") == 1 and count(conn, app, "state = 'running'") == 1:
                break
            await asyncio.sleep(0.05)
        worker.request_stop()
        await runner
    said = [r.getMessage() for r in caplog.records if r.name == "joblane.worker"]
    [giving] = [line for line in said if line.startswith("giving back ")]
    assert giving.startswith("giving back 1 job that did not finish within the grace period; stopping their tasks: "
                             "job 2 (slow) running "), giving
    [stopped] = [line for line in said if " stopped: " in line]
    assert stopped.split(" stopped: ")[1].startswith("1 done"), stopped
    assert "{" not in stopped


def test_plural_and_tally():
    assert plural(1, "job") == "1 job" and plural(2, "batch") == "2 batches"
    assert tally({"done": 7, "retry": 1, "stale": 0, "loop_stalled_seconds": 2.25}) == \
        "7 done, 1 retry, 2.2 loop stalled seconds"
    assert tally({}, "no jobs run") == "no jobs run"


# -- tables in a pipe ------------------------------------------------------------------

LONG_KIND = "enrich_lead_with_the_company_registry_lookup"
LONG_QUEUE = "leads_from_the_partner_webform_integration"


def narrow(app, *args: str):
    """`joblane ARGS` in a pipe (CliRunner's stdout is not a terminal) that claims to be 40 columns wide."""
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "40"}
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_tables_in_a_pipe_never_break_a_word(app, conn):
    job = app.enqueue(conn, LONG_KIND, {"lead": "x" * 60}, queue=LONG_QUEUE)
    held = app.enqueue(conn, LONG_KIND, {"lead": 2}, queue=LONG_QUEUE, held=True)
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'failed', finished_at = now(),"
                 " last_error = 'ValueError: the_registry_answered_with_an_unexpected_status' WHERE id = %s", (job,))
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, started_at, finished_at, outcome, error)"
                 " VALUES (%s, 1, now(), now(), 'failed', 'ValueError: the_registry_answered')", (job,))
    error = "the_registry_answered_with_an_unexpected_status"
    expected = {("status",): [LONG_QUEUE, "cancelled"], ("jobs",): [LONG_KIND, LONG_QUEUE, error],
                ("jobs", "show", str(job)): [LONG_KIND, LONG_QUEUE, error], ("held",): [LONG_KIND, LONG_QUEUE],
                ("attempts",): [LONG_KIND], ("replay", str(job), "--dry-run"): [LONG_KIND, LONG_QUEUE]}
    for args, words in expected.items():
        out = narrow(app, *args)
        for word in words:  # each on one line, whole
            assert word in out, (args, word, out)
    assert str(held) in narrow(app, "held")


def test_every_table_of_the_command_line_is_printed_by_print_table():
    # one helper decides how a table meets the terminal or the pipe: no command prints one itself
    offenders = []
    for path in sorted((Path(__file__).resolve().parents[1] / "src" / "joblane" / "cli").glob("*.py")):
        if path.name == "common.py":
            continue
        tree = ast.parse(path.read_text())
        tables = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Table"
                  for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "rich.table":
                offenders.append(f"{path.name}:{node.lineno} imports rich.table")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "print"
                    and any(isinstance(a, ast.Name) and a.id in tables for a in node.args)):
                offenders.append(f"{path.name}:{node.lineno} prints a table itself")
    assert offenders == []


# -- --json on every command that prints a result ------------------------------------------

# commands that print no result to parse: long-running processes with their own --log-format json, a
# server, and the export, whose output is its --format (csv or jsonl)
# exports write records in the format asked (jsonl is JSON already); `dataset` only groups its export
NO_JSON = {"worker", "relay", "dashboard", "attempts export", "dataset", "dataset export"}


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        found.append((path, command))
        if isinstance(command, click.Group):
            found.extend(_commands(command, path + " "))
    return found


def test_every_command_that_prints_a_result_has_json():
    commands = _commands(main)
    assert {"limits pause", "limits resume", "limits clear", "jobs show", "outbox retry"} <= {p for p, _ in commands}
    missing = [path for path, command in commands
               if path not in NO_JSON and "--json" not in {o for p in command.params for o in p.opts}]
    assert missing == []
    assert NO_JSON <= {p for p, _ in commands}  # the exceptions are real commands, kept up to date


def test_limits_pause_resume_and_clear_print_json(app):
    def run(*args):
        result = CliRunner().invoke(main, [*args, "--json"], env={"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema},
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    paused = run("limits", "pause", "models", "--for", "5m", "--reason", "429s")
    assert paused["queue"] == "models" and paused["reason"] == "429s" and paused["paused_until"]
    assert run("limits", "resume", "models") == {"queue": "models", "resumed": True}
    run("limits", "set", "models", "--concurrency", "3")
    assert run("limits", "clear", "models") == {"queue": "models", "cleared": True}


def test_export_to_a_file_shows_progress_on_a_terminal_only(app, conn, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from joblane.cli import review

    job = app.enqueue(conn, "report", {})
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, started_at, finished_at, outcome)"
                 " VALUES (%s, 1, now(), now(), 'done')", (job,))
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema}
    piped = CliRunner().invoke(main, ["attempts", "export", "-o", str(tmp_path / "a.csv")], env=env)
    assert piped.exit_code == 0 and piped.stderr == "" and piped.stdout.startswith("wrote 1 attempt to")
    screen = io.StringIO()
    monkeypatch.setattr(review, "err_console", Console(file=screen, force_terminal=True, width=100))
    shown = CliRunner().invoke(main, ["attempts", "export", "-o", str(tmp_path / "b.csv")], env=env)
    assert shown.exit_code == 0 and "attempts written" in screen.getvalue()
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


async def test_jobs_show_prints_the_stored_traceback_of_the_latest_try(app, conn):
    import joblane
    from joblane.testing import drain

    def parse_reply(text: str) -> dict:
        raise ValueError(f"malformed JSON from the model: {text!r}")

    @app.task("classify", max_attempts=2, backoff=lambda attempt: 0.0)
    async def classify(job: joblane.Job):
        return parse_reply(f"try {job.attempt}")

    job_id = app.enqueue(conn, "classify", {})
    await drain(app, timeout=20)
    result = CliRunner().invoke(main, ["jobs", "show", str(job_id)],
                                env={"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    tail = out[out.index("traceback of attempt 2; 1 earlier one in --json:"):]
    assert "Traceback (most recent call last):" in tail and "in parse_reply" in tail
    assert "ValueError: malformed JSON from the model: 'try 2'" in tail and "'try 1'" not in tail


def test_a_text_log_record_is_one_line_whatever_its_message_holds():
    from joblane.cli.common import TextFormatter

    record = logging.LogRecord("joblane.jobs", logging.WARNING, __file__, 1, "job 7 failed: %s", ("line one\nline two",),
                               None)
    [line] = TextFormatter().format(record).splitlines()
    assert line.endswith("WARNING  job 7 failed: line one\\nline two"), line
