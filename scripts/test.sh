#!/usr/bin/env bash
#
# scripts/test.sh -- run the whole snowflake_id test suite.
#
# Run as root on Debian 12:   bash scripts/test.sh [extra pytest args]
#
#   1. installs whatever is missing (scripts/lib.sh ensure_deps)
#   2. `cargo pgrx test pg15`: Rust #[test] unit tests and #[pg_test] tests in
#      a pgrx-managed cluster under /tmp/sfpg, run as the postgres user (this
#      installs a debug build into the system PostgreSQL 15)
#   3. `cargo pgrx install --release`: the integration tests use the release build
#   4. pytest tests/: Python integration tests, each with its own throwaway
#      clusters (tests/conftest.py). Slow tests (@pytest.mark.slow) run only
#      with SNOWFLAKE_SLOW=1.
#
# Exits non-zero on any failure; the last line printed is pytest's summary.
# Other clusters (e.g. the quickstart demo) are left alone. CI runs this via
# .ci/run.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PGRX_PGDATA=/tmp/sfpg   # cargo pgrx test makes a per-run cluster $PGRX_PGDATA/15-<pid>

ensure_deps
cd "$REPO_ROOT"

# Clusters of earlier `cargo pgrx test` runs that were killed are left behind
# (possibly still running): stop and remove those whose test process is gone.
mkdir -p "$PGRX_PGDATA"
chown postgres: "$PGRX_PGDATA"
for d in "$PGRX_PGDATA"/15-*; do
    [[ -d $d ]] || continue
    pid="${d##*-}"
    if [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
        log "removing stale pgrx test cluster $d"
        as_postgres "$PG_BINDIR/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
        rm -rf "$d"
    fi
done

log "cargo pgrx test pg15"
cargo pgrx test pg15 --runas postgres --pgdata "$PGRX_PGDATA"

log "cargo pgrx install --release"
cargo pgrx install --release --pg-config "$PG_CONFIG"

log "pytest tests/${SNOWFLAKE_SLOW:+ (SNOWFLAKE_SLOW=$SNOWFLAKE_SLOW)}"
exec "$REPO_ROOT/.venv/bin/pytest" tests/ -ra "$@"
