"""The docs show only code the suite runs.

Every fenced block of README.md and docs/*.md says what it is (an info string: python, sh, text, ...), and:

* a ``<!-- example: PATH -->`` block is the file it names, byte for byte, and some test runs that file;
* every other ```python block runs, in order with the page's other blocks (one namespace, as a reader goes
  through the page), in a fresh database named by DATABASE_URL with joblane migrated; a
  ``<!-- setup: SQL -->`` comment above a block creates what the page takes for granted (your own tables);
* a ```sh block's ``joblane ...`` lines parse as the command line would, and those that finish on their own
  (not worker, relay, dashboard, demo, bench) run against that database: exit 0, or 1 with a one-line reason
  (e.g. an id the page made up), never a traceback;
* a block that is not meant to run says why in a ``<!-- not run: REASON -->`` comment above it.

After editing an example file, refresh the pages with:
    python -m tests.integrations.test_docs
"""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLE = re.compile(r"<!-- example: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```\n", re.S)
LINK = re.compile(r"\]\((?P<target>[^)#:]+\.md)(?:#[^)]*)?\)")
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
MARK = re.compile(r"^\s*<!-- (?P<kind>example|not run|setup): (?P<text>.+?) -->\s*$")
INFO = {"python", "sh", "text"}
INTEGRATION_PAGES = ("sqlalchemy.md", "django.md", "fastapi.md", "periodic.md", "testing.md", "telemetry.md")
# commands that keep running (or start servers, or take minutes): the suite only parses their lines
LONG_RUNNING = {"worker", "relay", "dashboard", "demo", "bench"}


@dataclass
class Block:
    page: Path
    line: int
    info: str
    body: str
    marks: dict[str, list[str]] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.info == "python" and "example" not in self.marks and "not run" not in self.marks


def render(text: str) -> str:
    """The page with every example block refilled from its file."""
    return EXAMPLE.sub(
        lambda m: f"<!-- example: {m['path']} -->\n```python\n{(ROOT / m['path']).read_text()}```\n", text)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def all_pages() -> list[Path]:
    return [ROOT / "README.md", *pages()]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        above = text[:m.start()].splitlines()
        marks: dict[str, list[str]] = {}
        while above and (mark := MARK.match(above[-1])):
            marks.setdefault(mark["kind"], []).insert(0, mark["text"])
            above.pop()
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m["info"].strip(),
                           textwrap.dedent(m["body"]), marks))
    return found


def command_lines(block: Block) -> list[list[str]]:
    """The ``joblane`` invocations of a shell block, as argument lists (comments and exports left out)."""
    commands = []
    for line in block.body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":  # started in the background: the command itself
            words = words[:-1]
        if words and Path(words[0]).name == "joblane":
            commands.append(words[1:])
    return commands


# -- every block says what it is ----------------------------------------------------


def test_every_block_has_an_info_string_and_marks_name_a_reason():
    for page in all_pages():
        for block in blocks(page):
            assert block.info.split(" ")[0] in INFO, f"{block.where}: say what the block is (```python, ```sh, ```text)"
            for reason in block.marks.get("not run", []):
                assert len(reason.split()) >= 3, f"{block.where}: say why the block does not run"
            if "setup" in block.marks:
                assert block.runs, f"{block.where}: a setup comment above a block that does not run"


def test_every_example_block_is_the_file_it_names():
    for page in pages():
        text = page.read_text()
        for m in EXAMPLE.finditer(text):
            assert (ROOT / m["path"]).is_file(), f"{page.name} shows {m['path']}, which does not exist"
        assert text == render(text), f"{page.name} differs from its example files: run python -m tests.integrations.test_docs"


def test_every_example_file_is_run_by_a_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests" / "integrations").glob("test_*.py"))
    shown_anywhere = False
    for page in all_pages():
        for m in EXAMPLE.finditer(page.read_text()):
            shown_anywhere = True
            path = m["path"]
            stem = Path(path).relative_to("docs/examples").as_posix() if path.startswith("docs/examples/") else None
            # docs/examples files are loaded by name; the Django project is the test project itself
            assert (stem and stem.split("/")[0] in tests) or path.startswith("tests/integrations/"), \
                f"{path} (shown in {page.name}) is run by no test"
    assert shown_anywhere


def test_each_integration_page_shows_code_the_suite_runs():
    for name in INTEGRATION_PAGES:
        assert EXAMPLE.search((DOCS / name).read_text()), f"{name} shows no tested example"


def test_links_between_pages_resolve():
    for page in all_pages():
        for m in LINK.finditer(page.read_text()):
            assert (page.parent / m["target"]).is_file(), f"{page.name} links to missing {m['target']}"


def test_the_readme_lists_every_extra_and_installs_from_a_checkout_a_wheel_or_an_index():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| extra | brings | for |"):]
    table = table[:table.index("\n\n")]
    listed = set(re.findall(r"^\| `([a-z]+)` \|", table, re.M))
    assert listed == extras, f"README's extras table: missing {extras - listed}, unknown {listed - extras}"
    [install] = [b for b in blocks(ROOT / "README.md") if b.info == "sh" and "pip install" in b.body][:1]
    lines = [shlex.split(line, comments=True) for line in install.body.splitlines()]
    targets = [words[2] for words in lines if words[:2] == ["pip", "install"]]
    assert targets[0] == ".[web]" and targets[1].startswith("$(echo dist/joblane-*.whl)") and \
        targets[2] == "joblane[web]", targets
    assert "pip install joblane " not in readme and "pip install joblane\n" not in readme


def test_an_extra_is_hinted_from_where_joblane_was_installed():
    """This suite's joblane is an editable install of the checkout: the hint installs the extra from it."""
    import json
    from importlib import metadata

    from joblane.rules import install_hint

    direct = json.loads(metadata.distribution("joblane").read_text("direct_url.json") or "{}")
    if not (direct.get("dir_info") or {}).get("editable"):
        pytest.skip("joblane is not an editable install of a checkout here")
    assert install_hint("web") == f"pip install -e '{ROOT}[web]'"


# -- the blocks run -------------------------------------------------------------------


@pytest.fixture
def database(joblane_dsn, monkeypatch, tmp_path):
    """A fresh database with joblane migrated in schema "joblane", as DATABASE_URL; dropped afterwards."""
    from .test_fastapi import to_url

    import joblane

    name = f"joblane_docs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(joblane_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = to_url(make_conninfo(joblane_dsn, dbname=name))
    try:
        joblane.App(url, schema="joblane").migrate()
        monkeypatch.setenv("DATABASE_URL", url)
        monkeypatch.delenv("JOBLANE_SCHEMA", raising=False)
        monkeypatch.chdir(tmp_path)
        yield url
    finally:
        with psycopg.connect(joblane_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


RUNNABLE = [page for page in all_pages() if any(b.runs for b in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_python_blocks_run_in_a_fresh_database(page, database):
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    with psycopg.connect(database, autocommit=True) as db:
        for block in (b for b in blocks(page) if b.runs):
            for sql in block.marks.get("setup", []):
                db.execute(sql)
            try:
                exec(compile(block.body, block.where, "exec"), namespace)
            except Exception as exc:
                pytest.fail(f"{block.where} does not run as written: {type(exc).__name__}: {exc}")


SHELL = [page for page in all_pages()
         if any(command_lines(b) for b in blocks(page) if b.info == "sh" and "not run" not in b.marks)]


def parse_only(args: list[str]) -> click.Context:
    """Parse ``joblane ARGS`` as the command line does (types, choices, required arguments), running nothing."""
    from joblane.cli import main

    seen = []

    def walk(command: click.Command):
        yield command
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from walk(sub)

    callbacks = [(c, c.callback) for c in walk(main)]
    try:
        for command, _ in callbacks:
            command.callback = click.pass_context(lambda ctx, **params: seen.append(ctx))
        main.main(args, prog_name="joblane", standalone_mode=False)
    finally:
        for command, callback in callbacks:
            command.callback = callback
    return seen[-1]


@pytest.mark.parametrize("page", SHELL, ids=[p.name for p in SHELL])
def test_joblane_command_lines_parse_and_the_harmless_ones_run(page, database):
    from joblane.cli import main

    runner = CliRunner()
    for block in (b for b in blocks(page) if b.info == "sh" and "not run" not in b.marks):
        for args in command_lines(block):
            line = f"{block.where}: joblane {shlex.join(args)}"
            try:
                ctx = parse_only(args)
            except click.ClickException as exc:
                pytest.fail(f"{line} does not parse: {exc.format_message()}")
            if ctx.command.name in LONG_RUNNING:
                continue
            result = runner.invoke(main, args, env={"DATABASE_URL": database, "JOBLANE_SCHEMA": None})
            output = result.output.strip()
            assert "Traceback" not in output, f"{line}:\n{output}"
            if result.exit_code == 0:
                continue
            assert result.exit_code == 1 and isinstance(result.exception, SystemExit), \
                f"{line} exited {result.exit_code}: {result.exception!r}\n{output}"
            # one error line, last (a bulk command first reports what it did and skipped)
            errors = [o for o in output.splitlines() if o.startswith("error: ")]
            assert len(errors) == 1 and output.splitlines()[-1] == errors[0], f"{line}:\n{output}"


# -- the quick start, as a reader runs it ------------------------------------------------


def test_the_quick_start_runs_as_a_reader_runs_it(database, tmp_path):
    """docs/quickstart.md line by line in one shell's order: its files saved, its commands run as processes (the
    worker and the dashboard in the background, as the page starts them), its waits honoured; then what the page
    says the reader sees: job 1 done, job 2 failed, then done after the fix and `joblane retry 2`, the dashboard up."""
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    from ..helpers import free_port

    import shutil

    page = DOCS / "quickstart.md"
    if shutil.which("psql") is None:
        pytest.skip("the quick start fixes a row with psql, which is not installed here")
    for m in EXAMPLE.finditer(page.read_text()):  # "Save this as tasks.py": the files the page shows
        (tmp_path / Path(m["path"]).name).write_text((ROOT / m["path"]).read_text())
    bin_dir = str(Path(sys.executable).parent)  # `joblane` and `python` of this environment, as after pip install
    env = {**os.environ, "DATABASE_URL": database, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    env.pop("JOBLANE_SCHEMA", None)
    dashboard_port = free_port()
    background: list[subprocess.Popen] = []
    said: dict[str, list[str]] = {}

    def unfinished() -> int:
        with psycopg.connect(database) as c:
            return c.execute("SELECT count(*) FROM joblane.jobs WHERE state IN ('pending', 'running')").fetchone()[0]

    try:
        for block in (b for b in blocks(page) if b.info == "sh"):
            for line in block.body.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if not words or words[0] in ("pip", "export"):
                    continue  # joblane is installed here; DATABASE_URL is this test's fresh database
                command = shlex.join(words)
                if words[0] == "sleep":  # the reader waits for the worker: wait until it has nothing left to do
                    deadline = time.monotonic() + 60
                    while unfinished() and time.monotonic() < deadline:
                        time.sleep(0.2)
                    assert not unfinished(), f"{block.where}: the worker left jobs unfinished"
                    continue
                if words[-1] == "&":
                    run = words[:-1] + (["--port", str(dashboard_port)] if words[1:2] == ["dashboard"] else [])
                    background.append(subprocess.Popen(run, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                                       stderr=subprocess.DEVNULL))
                    continue
                done = subprocess.run(line.split(" #")[0], shell=True, cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=60)
                assert done.returncode == 0, f"{block.where}: {command}\n{done.stdout}{done.stderr}"
                said.setdefault(command, []).append(" ".join(done.stdout.replace("│", " ").split()))
        assert said["python signup.py"] == ["submission 1: job 1 submission 2: job 2"]
        [listed] = said["joblane jobs"]
        assert re.search(r"2 emails welcome failed 2/2", listed) and re.search(r"1 emails welcome done 1/2", listed)
        before, after = said["joblane jobs show 2"]
        assert "state failed" in before and "not an email address" in before and "Traceback" in before
        assert "state done" in after and "max_attempts 3" in after and '"sent_to": "grace@acme.test"' in after
        deadline = time.monotonic() + 30
        while True:
            try:
                html = urllib.request.urlopen(f"http://127.0.0.1:{dashboard_port}/", timeout=2).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.2)
        assert "emails" in html
    finally:
        for process in background:  # `kill %1 %2`
            process.send_signal(signal.SIGTERM)
        for process in background:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


if __name__ == "__main__":
    for page in pages():
        text = page.read_text()
        if render(text) != text:
            page.write_text(render(text))
            print(f"refreshed {page.relative_to(ROOT)}", file=sys.stderr)
