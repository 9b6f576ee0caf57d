# shellcheck shell=bash
#
# bench/common.sh -- shared by bench/run.sh and bench/profile.sh (source it).
#
# Sources scripts/lib.sh, which provides REPO_ROOT, PG_CONFIG, log, die,
# require_root, as_postgres and the dependency steps; adds only what is the
# benchmark's own:
#
#   PY                              the repo's venv Python
#   bench_checks                    root, postgres user, pg_config, and the venv:
#                                   tests/requirements.txt (psycopg; lib.sh's
#                                   _ensure_venv) plus bench/requirements.txt
#                                   (matplotlib), each installed only when its
#                                   requirements changed (a stamp of their hash)
#   bench_build                     unless BENCH_SKIP_INSTALL=1:
#                                     cargo pgrx install --release   (into PG_CONFIG's PostgreSQL)
#                                     cargo pgrx package             (bench/out/pkg, same build)
#                                   both with --features pgNN for PG_CONFIG's major version
#                                   and exports BENCH_PKG=bench/out/pkg, the files the
#                                   benchmark copies and measures. With BENCH_SKIP_INSTALL=1
#                                   nothing is built: BENCH_PKG=<dir> if set, else the
#                                   installed files are measured.

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
export PG_CONFIG
PY="$REPO_ROOT/.venv/bin/python"

# bench/requirements.txt into .venv, when the stamp (the hash of the file and
# of the interpreter's version) says it changed.
_ensure_bench_venv() {
    local req="$REPO_ROOT/bench/requirements.txt" stamp="$REPO_ROOT/.venv/.bench-requirements.sha256" want
    want="$( { sha256sum <"$req"; "$PY" --version; } 2>&1 | sha256sum | cut -d' ' -f1)"
    [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] && return 0
    log "pip install -r bench/requirements.txt"
    "$PY" -m pip install -q --disable-pip-version-check -r "$req"
    printf '%s\n' "$want" >"$stamp"
}

bench_checks() {
    require_root
    id postgres >/dev/null 2>&1 || die "no 'postgres' OS user: install postgresql-15"
    [[ -x $PG_CONFIG ]] || die "pg_config not found at $PG_CONFIG"
    _ensure_venv
    _ensure_bench_venv
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
    # The build tools, Rust and cargo-pgrx for PG_CONFIG's major version only,
    # and the build for that version (its pgNN feature: 15 is the default).
    local major
    major="$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
    # shellcheck disable=SC2034  # read by lib.sh's ensure_build_deps
    PG_VERSIONS=("$major")
    ensure_build_deps
    log "building and installing the release build for PostgreSQL $major (BENCH_SKIP_INSTALL=1 skips this)"
    (cd "$REPO_ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG" \
        --no-default-features --features "pg$major")
    # The same build again as a package directory: the benchmark copies the
    # library and SQL script from there, so a debug build that someone else
    # installs into the system directories meanwhile cannot get measured.
    log "cargo pgrx package --out-dir bench/out/pkg"
    rm -rf "$REPO_ROOT/bench/out/pkg"
    (cd "$REPO_ROOT" && cargo pgrx package --pg-config "$PG_CONFIG" \
        --no-default-features --features "pg$major" \
        --out-dir "$REPO_ROOT/bench/out/pkg" >/dev/null)
    export BENCH_PKG="$REPO_ROOT/bench/out/pkg"
}
