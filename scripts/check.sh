#!/usr/bin/env bash
#
# scripts/check.sh -- the lint gate: fast checks that need no server.
# scripts/test.sh runs it first and stops on a failure; run it alone with
#
#   bash scripts/check.sh
#
# after the dependencies are installed (scripts/test.sh does it, or
# `source scripts/lib.sh && ensure_deps`). It checks, and reports every
# failure before exiting non-zero:
#   1. cargo fmt --check                      (the whole workspace)
#   2. cargo clippy --all-targets -D warnings for each supported version's
#      feature (SNOWFLAKE_PG_VERSIONS narrows it; lints in Cargo.toml's
#      [workspace.lints])
#   3. ruff check (pinned in tests/requirements.txt, rules in ruff.toml) on
#      tests/, bench/ and scripts/
#   4. shellcheck on every tracked shell script (scripts/, bench/, tests/)
#   5. every repository path named in a comment or a doc exists
#      (scripts/check_paths.py)
# A few minutes the first time (clippy builds each version's bindings), well
# under a minute after.

set -uo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT" || exit 1
_ensure_rust

failed=()
step() {
    local name=$1
    shift
    log "check: $name"
    "$@" || failed+=("$name")
}

step "cargo fmt --check" cargo fmt --all --check
# With --release, clippy's checks run in target/release, where the release
# build of scripts/test.sh (cargo pgrx install --release) and scripts/package.sh
# follow: they reuse the build scripts it ran, among them pgrx-pg-sys's
# bindgen of each version's headers (46 s for 15, 80 s for 17, measured on
# this loaded two-core machine), instead of running them again. The lints
# are the same (no code of the project depends on debug_assertions).
for v in "${PG_VERSIONS[@]}"; do
    step "cargo clippy (pg$v)" cargo clippy --release --quiet --keep-going --workspace --all-targets \
        --no-default-features --features "pg$v" -- -D warnings
done
[[ -x $REPO_ROOT/.venv/bin/ruff ]] \
    || die "ruff is not installed in .venv/ (tests/requirements.txt): run scripts/lib.sh ensure_deps first"
step "ruff" "$REPO_ROOT/.venv/bin/ruff" check --quiet tests bench scripts
command -v shellcheck >/dev/null 2>&1 \
    || die "shellcheck is not installed: run scripts/lib.sh ensure_deps first"
mapfile -t shell_scripts < <(git ls-files '*.sh' .ci/run)
step "shellcheck" shellcheck -x "${shell_scripts[@]}"
step "paths named in comments and docs" python3 scripts/check_paths.py

if [[ ${#failed[@]} -gt 0 ]]; then
    printf 'lint gate FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
log "lint gate passed"
