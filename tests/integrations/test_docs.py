"""The docs show only code the suite runs: each example block is the file it names, byte for byte.

After editing an example file, refresh the pages with:
    python -m tests.integrations.test_docs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLE = re.compile(r"<!-- example: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```\n", re.S)
LINK = re.compile(r"\]\((?P<target>[^)#:]+\.md)(?:#[^)]*)?\)")
INTEGRATION_PAGES = ("sqlalchemy.md", "django.md", "fastapi.md", "periodic.md", "testing.md", "telemetry.md")


def render(text: str) -> str:
    """The page with every example block refilled from its file."""
    return EXAMPLE.sub(
        lambda m: f"<!-- example: {m['path']} -->\n```python\n{(ROOT / m['path']).read_text()}```\n", text)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_every_example_block_is_the_file_it_names():
    for page in pages():
        text = page.read_text()
        for m in EXAMPLE.finditer(text):
            assert (ROOT / m["path"]).is_file(), f"{page.name} shows {m['path']}, which does not exist"
        assert text == render(text), f"{page.name} differs from its example files: run python -m tests.integrations.test_docs"


def test_each_integration_page_shows_code_the_suite_runs():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests" / "integrations").glob("test_*.py"))
    for name in INTEGRATION_PAGES:
        shown = [m["path"] for m in EXAMPLE.finditer((DOCS / name).read_text())]
        assert shown, f"{name} shows no tested example"
        for path in shown:
            stem = Path(path).relative_to("docs/examples").as_posix() if path.startswith("docs/examples/") else None
            # docs/examples files are loaded by name; the Django project is the test project itself
            assert (stem and stem.split("/")[0] in tests) or path.startswith("tests/integrations/"), \
                f"{path} (shown in {name}) is run by no test"


def test_links_between_pages_resolve():
    for page in pages():
        for m in LINK.finditer(page.read_text()):
            assert (page.parent / m["target"]).is_file(), f"{page.name} links to missing {m['target']}"


if __name__ == "__main__":
    for page in pages():
        text = page.read_text()
        if render(text) != text:
            page.write_text(render(text))
            print(f"refreshed {page.relative_to(ROOT)}", file=sys.stderr)
