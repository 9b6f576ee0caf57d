# shellcheck shell=bash
#
# bench/common.sh -- shared by bench/run.sh and bench/profile.sh (source it).
#
#   REPO_ROOT, PG_CONFIG, PY        paths
#   log / die                       progress / error lines
#   bench_checks                    root, postgres user, pg_config, .venv with psycopg
#   bench_build                     unless BENCH_SKIP_INSTALL=1:
#                                     cargo pgrx install --release   (the system install)
#                                     cargo pgrx package             (bench/out/pkg, same build)
#                                   and exports BENCH_PKG=bench/out/pkg, the files the
#                                   benchmark copies and measures. With BENCH_SKIP_INSTALL=1
#                                   nothing is built: BENCH_PKG=<dir> if set, else the
#                                   installed files are measured.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
export PG_CONFIG
PY="$REPO_ROOT/.venv/bin/python"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

bench_checks() {
    [[ $EUID -eq 0 ]] || die "run as root: the servers run as the 'postgres' OS user (runuser)"
    id postgres >/dev/null 2>&1 || die "no 'postgres' OS user: install postgresql-15"
    [[ -x $PG_CONFIG ]] || die "pg_config not found at $PG_CONFIG"
    if ! { [[ -x $PY ]] && "$PY" -c 'import psycopg' 2>/dev/null; }; then
        die "$PY with psycopg not found: run 'bash scripts/test.sh' once (it creates .venv), or
       python3 -m venv .venv && .venv/bin/pip install -r tests/requirements.txt"
    fi
}

bench_build() {
    if [[ ${BENCH_SKIP_INSTALL:-0} == 1 ]]; then
        if [[ -n ${BENCH_PKG:-} ]]; then
            log "BENCH_SKIP_INSTALL=1: measuring the package in $BENCH_PKG"
        else
            log "BENCH_SKIP_INSTALL=1: measuring the installed $("$PG_CONFIG" --pkglibdir)/snowflake_id.so"
        fi
        return 0
    fi
    if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
        # shellcheck source=/dev/null
        . "$HOME/.cargo/env"
    fi
    log "building and installing the release build (BENCH_SKIP_INSTALL=1 skips this)"
    (cd "$REPO_ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG")
    # The same build again as a package directory: the benchmark copies the
    # library and SQL script from there, so a debug build that someone else
    # installs into the system directories meanwhile cannot get measured.
    log "cargo pgrx package --out-dir bench/out/pkg"
    rm -rf "$REPO_ROOT/bench/out/pkg"
    (cd "$REPO_ROOT" && cargo pgrx package --pg-config "$PG_CONFIG" \
        --out-dir "$REPO_ROOT/bench/out/pkg" >/dev/null)
    export BENCH_PKG="$REPO_ROOT/bench/out/pkg"
}
