#!/usr/bin/env bash
#
# scripts/package.sh -- build a Debian package of snowflake_id per PostgreSQL
# version:  target/debs/postgresql-NN-snowflake-id_<version>_<arch>.deb
#
# Run as root on Debian 12:   bash scripts/package.sh [NN ...]
#                             (default: every supported version, 15 16 18)
#
# Each package holds the release build made by `cargo pgrx package` against
# PostgreSQL NN, laid out where Debian's (and the PostgreSQL project's apt
# repository's) postgresql-NN package looks for extensions:
#   /usr/lib/postgresql/NN/lib/snowflake_id.so
#   /usr/share/postgresql/NN/extension/snowflake_id.control, snowflake_id--*.sql
# and depends on postgresql-NN, the server package of that major version
# (Debian 12 ships postgresql-15; 16 and 18 come from apt.postgresql.org).
#
# Install:  apt-get install ./target/debs/postgresql-15-snowflake-id_0.3.1_amd64.deb
# Remove:   dpkg -r postgresql-15-snowflake-id

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$REPO_ROOT/target/debs"
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=("${PG_VERSIONS[@]}")

PG_VERSIONS=("${versions[@]}")
ensure_deps
cd "$REPO_ROOT"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
arch="$(dpkg --print-architecture)"
mkdir -p "$OUT"

for v in "${versions[@]}"; do
    pgc="$(pg_config_for "$v")"
    name="postgresql-$v-snowflake-id"
    stage="$REPO_ROOT/target/deb-stage/$name"
    log "PostgreSQL $v: cargo pgrx package"
    rm -rf "$stage" "$REPO_ROOT/target/deb-stage/pgrx-$v"
    cargo pgrx package --pg-config "$pgc" --no-default-features --features "pg$v" \
        --out-dir "$REPO_ROOT/target/deb-stage/pgrx-$v" >&2
    # cargo pgrx package mirrors pg_config's directories: find our files in
    # it wherever that PostgreSQL lives, and lay them out the Debian way.
    pkglibdir="$("$pgc" --pkglibdir)"
    sharedir="$("$pgc" --sharedir)"
    src="$REPO_ROOT/target/deb-stage/pgrx-$v"
    mkdir -p "$stage/DEBIAN" "$stage/usr/lib/postgresql/$v/lib" \
        "$stage/usr/share/postgresql/$v/extension" "$stage/usr/share/doc/$name"
    install -m 0644 "$src$pkglibdir/snowflake_id.so" "$stage/usr/lib/postgresql/$v/lib/"
    install -m 0644 "$src$sharedir/extension/snowflake_id"* "$stage/usr/share/postgresql/$v/extension/"
    install -m 0644 README.md "$stage/usr/share/doc/$name/README.md"
    cat >"$stage/usr/share/doc/$name/copyright" <<EOF
snowflake_id $version
License: PostgreSQL
EOF
    size_kb="$(du -sk "$stage/usr" | cut -f1)"
    cat >"$stage/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: snowflake_id developers <snowflake-id@localhost>
Depends: postgresql-$v, libc6
Section: database
Priority: optional
Installed-Size: $size_kb
Description: time-ordered, unique 64-bit IDs for PostgreSQL $v
 snowflake_id generates snowflake IDs inside PostgreSQL: bigint keys that
 sort by creation time, with worker ids claimed automatically per backend
 and a durable reservation so IDs never repeat after a restart or crash.
 Add snowflake_id to shared_preload_libraries, restart the server, then run
 CREATE EXTENSION snowflake_id in each database that uses it.
EOF
    deb="$OUT/${name}_${version}_${arch}.deb"
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
    log "built $deb"
    echo "$deb"
done
