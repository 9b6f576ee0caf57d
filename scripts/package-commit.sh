#!/usr/bin/env bash
#
# scripts/package-commit.sh COMMIT NN -- the Debian package for PostgreSQL NN
# of an earlier commit, as that commit's own scripts/package.sh makes it:
# the previous release's package, which the repository test
# (tests/upgrade/test_package.py) upgrades from. PREVIOUS_RELEASE_COMMIT in
# scripts/lib.sh names that release's commit.
#
# Run as root:   bash scripts/package-commit.sh 68e1fe1 17
#
# Prints the package's path. It is built once into
# .cache/packages/<commit>/NN/ (git-ignored) and reused: a second run
# prints the path at once. The build (minutes) happens in a clone of this
# repository at that commit (.cache/packages/<commit>/src, sharing this
# repository's objects), with its own target directory and cargo-pgrx
# configuration, and this clone's PostgreSQL trees (.pg/). It is built
# unoptimised (CARGO_PROFILE_RELEASE_OPT_LEVEL=0, no link-time
# optimisation, 16 codegen units): the same code, built in about half the
# CPU time (3 min 20 s against 6 min 8 s for 15 on an idle 2-core machine),
# which the test run's other builds share; the tests use it to upgrade
# from and as a 0.7.0 holder, not to time it. The release's own packages
# were built with its Cargo.toml's release profile.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 2 ]] || die "usage: bash scripts/package-commit.sh COMMIT NN"
pg_config_for "$2" >/dev/null
require_root
commit="$(git -C "$REPO_ROOT" rev-parse --verify --quiet "$1^{commit}")" \
    || die "no commit $1 in this repository"
v=$2
base="$REPO_ROOT/.cache/packages/$commit"
mkdir -p "$base"
exec 9>"$base/lock"
flock 9

shopt -s nullglob
debs=("$base/$v/"*.deb)
if [[ ${#debs[@]} -ne 1 ]]; then
    checkout="$base/src"
    if [[ ! -d $checkout/.git ]]; then
        rm -rf "$checkout"
        git clone --quiet --shared --no-checkout "$REPO_ROOT" "$checkout"
        git -C "$checkout" -c advice.detachedHead=false checkout --quiet --detach "$commit"
        ln -s "$PG_CACHE" "$checkout/.pg"
    fi
    log "PostgreSQL $v: the package of commit ${commit:0:12} (once; minutes)"
    (
        cd "$checkout"
        unset SNOWFLAKE_PG_VERSIONS
        PGRX_HOME="$base/pgrx" CARGO_TARGET_DIR="$base/target" \
            CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false \
            CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
            bash scripts/package.sh "$v" >"$base/built-$v.txt"
    ) || die "the package.sh of commit ${commit:0:12} failed for PostgreSQL $v"
    deb="$(grep '\.deb$' "$base/built-$v.txt")"
    [[ -f $deb ]] || die "the package.sh of commit ${commit:0:12} printed no package: $(cat "$base/built-$v.txt")"
    rm -rf "${base:?}/$v" && mkdir -p "$base/$v"
    mv "$deb" "$base/$v/"
    debs=("$base/$v/"*.deb)
fi
echo "${debs[0]}"
