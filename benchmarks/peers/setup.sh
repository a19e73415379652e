#!/usr/bin/env bash
# Create (once) a separate virtualenv holding the peer libraries that the
# benchmark compares joblane against. Nothing here touches the project's own
# dependencies. Safe to run repeatedly; `setup.sh --upgrade` moves to the
# newest 1.x / 3.x (PGMQ: the newest 1.x client, which ships the SQL-only
# install of the PGMQ extension it pins).
set -euo pipefail

upgrade=0
case "${1:-}" in
    --upgrade) upgrade=1 ;;
    "") ;;
    *) echo "usage: $0 [--upgrade]" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PEERS_VENV:-$(dirname "$here")/.venv-peers}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv" >&2
    "$python" -m venv "$venv"
fi

# Version ranges: PgQueuer 1.x (asyncpg driver), Procrastinate 3.x (psycopg 3),
# the PGMQ client 1.x with asyncpg (pgmq 1.1.4 ships PGMQ 1.13's SQL).
want_pgq='pgqueuer[asyncpg]>=1,<2'
want_proc='procrastinate>=3,<4'
want_pgmq='pgmq[async]>=1.1,<2'

if [ "$upgrade" = 0 ] && "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
def major(name):
    return int(m.version(name).split(".")[0])
import asyncpg, psycopg  # noqa: F401  drivers present
sys.exit(0 if major("pgqueuer") == 1 and major("procrastinate") == 3 and major("pgmq") == 1 else 1)
PY
then
    echo "peers already installed in $venv" >&2
else
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet --upgrade "$want_pgq" "$want_proc" "$want_pgmq" 'psycopg[binary]' asyncpg
fi

"$venv/bin/python" - <<'PY'
import importlib.metadata as m
for name in ("pgqueuer", "procrastinate", "pgmq", "asyncpg", "psycopg"):
    print(f"{name} {m.version(name)}")
from pgmq.install import get_embedded_sql_version
print(f"PGMQ SQL {get_embedded_sql_version()}")
PY
