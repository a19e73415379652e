"""joblane.testing as a user meets it: a project's own pytest suite (docs/examples/testing) run as its own process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..conftest import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "testing"


def test_a_users_suite_runs_green_with_the_plugin_fixtures_and_helpers(tmp_path, joblane_dsn):
    for name in ("signups.py", "conftest.py", "test_signups.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "DATABASE_URL": joblane_dsn}, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
    assert "warning" not in result.stdout
