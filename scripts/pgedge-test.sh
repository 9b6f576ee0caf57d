#!/usr/bin/env bash
#
# scripts/pgedge-test.sh SRC -- runs tests/sql_api/test_from_pgedge.py
# against pgEdge's real snowflake extension, built from its source in SRC
# (a checkout of https://github.com/pgEdge/snowflake at tag v2.6.0; the
# project neither ships nor fetches it: CI has no network for it, and
# there the tests use their reimplementation, saying so).
#
# It copies Debian's PostgreSQL 15 (with the snowflake_id build that
# `cargo pgrx install` put there) into a temporary directory, builds and
# installs pgEdge's extension into the copy with PGXS, and runs the tests
# with PG_CONFIG pointing at the copy; the system's PostgreSQL is not
# changed. Run as root after scripts/test.sh (or an install) on Debian 12.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_root
[[ $# -eq 1 && -f $1/snowflake.c && -f $1/snowflake.control ]] \
    || die "usage: scripts/pgedge-test.sh SRC (a checkout of pgEdge's snowflake, tag v2.6.0)"
checkout=$(cd "$1" && pwd)
grep -q "default_version = '2.6.0'" "$checkout/snowflake.control" \
    || die "$checkout is not pgEdge snowflake 2.6.0 (its snowflake.control says otherwise)"
[[ -f /usr/lib/postgresql/15/lib/snowflake_id.so ]] \
    || die "snowflake_id is not installed in PostgreSQL 15: run scripts/test.sh or cargo pgrx install first"

root=$(mktemp -d /tmp/pgedge15.XXXXXX)
build=$(mktemp -d /tmp/pgedge-build.XXXXXX)
trap 'rm -rf "$root" "$build"' EXIT
mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql" "$root/usr/include"
cp -a /usr/lib/postgresql/15 "$root/usr/lib/postgresql/"
cp -a /usr/share/postgresql/15 "$root/usr/share/postgresql/"
ln -s /usr/include/postgresql "$root/usr/include/postgresql"
pg_config="$root/usr/lib/postgresql/15/bin/pg_config"
cp -a "$checkout/." "$build/"
log "building pgEdge snowflake 2.6.0 from $checkout into $root"
make -C "$build" -s USE_PGXS=1 PG_CONFIG="$pg_config" >/dev/null
make -C "$build" -s USE_PGXS=1 PG_CONFIG="$pg_config" install >/dev/null
chown -R postgres: "$root"
cd "$REPO_ROOT"
PG_CONFIG="$pg_config" "$REPO_ROOT/.venv/bin/pytest" tests/sql_api/test_from_pgedge.py \
    -p no:cacheprovider -v -rs
