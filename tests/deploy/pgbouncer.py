"""A real PgBouncer (Debian's package) in front of the suite's PostgreSQL, for the deployment tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from ..helpers import free_port

BINARY = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)


def version() -> str:
    out = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].split()[-1]


@contextmanager
def pgbouncer(dsn: str, *, pool_mode: str, pool_size: int = 4) -> Iterator[str]:
    """Start PgBouncer in ``pool_mode`` for the database of ``dsn``; yield a DSN that goes through it."""
    if BINARY is None:
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is not installed (.ci/run installs Debian's package)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    info = conninfo_to_dict(dsn)
    host, port = info.get("host") or "127.0.0.1", info.get("port") or 5432
    user = info.get("user") or "postgres"
    dbname = info.get("dbname") or user
    folder = Path(tempfile.mkdtemp(prefix="joblane-pgbouncer-"))
    listen = free_port()
    password = f" password={info['password']}" if info.get("password") else ""
    (folder / "pgbouncer.ini").write_text(f"""[databases]
* = host={host} port={port} user={user}{password}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = any
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 500
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits,options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
""")
    command = [BINARY, "-q"]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        if str(host).startswith("/"):  # the embedded server's socket folder: let PgBouncer's user reach it
            os.chmod(host, 0o755)
        shutil.chown(folder, "postgres")
        for f in folder.iterdir():
            shutil.chown(f, "postgres")
        command += ["-u", "postgres"]
    proc = subprocess.Popen([*command, str(folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    through = f"postgresql://{user}@127.0.0.1:{listen}/{dbname}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(through, connect_timeout=2) as c:
                    c.execute("SELECT 1")
                break
            except psycopg.OperationalError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
                    raise RuntimeError(f"pgbouncer did not start ({exc}): {log[-2000:]}") from None
                time.sleep(0.1)
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
