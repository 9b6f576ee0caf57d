#!/usr/bin/env bash
# Installs the real clients the tests/clients/test_*.py suite drives, pinned,
# idempotently (a second run changes nothing and takes about a second):
#   - Python: tests/clients/requirements.txt into the repository's .venv/
#   - Debian: pgbouncer; nodejs and npm when no node is installed;
#             postgresql-15-partman (pg_partman 4.7) for Debian's PostgreSQL 15
#   - npm:    tests/clients/js/package-lock.json into tests/clients/js/node_modules
# Exits non-zero with the reason when something cannot be installed; the
# tests then fail with that reason (they never skip).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="$ROOT/.venv/bin/python"

[ -x "$PY" ] || { echo "no $PY: run scripts/lib.sh ensure_deps first" >&2; exit 1; }

# Python clients: pip is quick when everything is already at the pinned version.
stamp="$ROOT/.venv/.clients-requirements"
if ! cmp -s "$HERE/requirements.txt" "$stamp" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"
    cp "$HERE/requirements.txt" "$stamp"
fi

# Debian packages.
need=()
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# pg_partman 4.7 for Debian's PostgreSQL 15 (tests/clients/test_partman.py).
if [ -d /usr/lib/postgresql/15 ] && [ ! -f /usr/share/postgresql/15/extension/pg_partman.control ]; then
    need+=(postgresql-15-partman)
fi
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing Debian packages ${need[*]} and not root: apt-get install ${need[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null
    }
    # The Debian package starts a pgbouncer service on port 6432; the tests
    # start their own, so stop the packaged one if it runs.
    if [[ " ${need[*]} " == *" pgbouncer "* ]] && command -v systemctl >/dev/null 2>&1; then
        systemctl stop pgbouncer >/dev/null 2>&1 || true
    fi
fi

# npm packages, exactly as locked.
cd "$HERE/js"
if ! cmp -s package-lock.json node_modules/.clients-lock 2>/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error >/dev/null
    cp package-lock.json node_modules/.clients-lock
fi
echo "clients installed: $("$PY" -c 'import django, sqlalchemy, asyncpg; print("Django", django.__version__, "SQLAlchemy", sqlalchemy.__version__, "asyncpg", asyncpg.__version__)'), node $(node --version), pg $(node -p 'require("pg/package.json").version'), $(/usr/sbin/pgbouncer --version 2>/dev/null | head -1 || pgbouncer --version | head -1)"
