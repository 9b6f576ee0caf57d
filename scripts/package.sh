#!/usr/bin/env bash
#
# scripts/package.sh -- the release artifacts of snowflake_id, in target/dist/:
#
#   postgresql-NN-snowflake-id_<version>_<arch>.deb   one per PostgreSQL version
#   snowflake_id-<version>.tar.gz                     the source (PGXN layout:
#                                                     META.json at its top)
#   SHA256SUMS                                        of the files above
#
# Run as root on Debian 12:   bash scripts/package.sh [NN ...]
#                             (default: every supported version, 15 16 17 18 19)
#
# It needs only what building needs (scripts/lib.sh ensure_build_deps: the
# build tools, Rust, cargo-pgrx and each version's PostgreSQL), none of the
# test dependencies (Python test environment, Citus, faketime, npm). It
# prints the path of each artifact, one per line; SHA256SUMS lists exactly
# the files this run made. CARGO_TARGET_DIR moves target/ as for cargo.
# SNOWFLAKE_RELEASE_DIR (default: that target directory) is where it writes
# dist/ and its work files (deb-stage/): a directory of its own for each
# run, while the cargo build stays shared in CARGO_TARGET_DIR
# (scripts/release.sh, scripts/test.sh).
#
# Each package holds the release build made by `cargo pgrx package` against
# PostgreSQL NN, laid out where Debian's (and the PostgreSQL project's apt
# repository's) postgresql-NN package looks for extensions:
#   /usr/lib/postgresql/NN/lib/snowflake_id.so
#   /usr/share/postgresql/NN/extension/snowflake_id.control, snowflake_id--*.sql
# and depends on postgresql-NN, the server package of that major version
# (Debian 12 ships postgresql-15, Debian 13 postgresql-17; the others come
# from apt.postgresql.org), and on the shared libraries it links (libc6, and
# libpq5 when it uses libpq), as dpkg-shlibdeps computes them.
#
# The source tarball holds the files git tracks, as they are in the working
# tree (uncommitted changes to tracked files included, untracked files not;
# a release is made from a clean tree), with the last commit's time.
#
# Install:  apt-get install ./target/dist/postgresql-17-snowflake-id_<version>_amd64.deb
# Remove:   dpkg -r postgresql-17-snowflake-id

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=("${PG_VERSIONS[@]}")
for v in "${versions[@]}"; do pg_config_for "$v" >/dev/null; done

PG_VERSIONS=("${versions[@]}")
ensure_build_deps
cd "$REPO_ROOT"
WORK="${SNOWFLAKE_RELEASE_DIR:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}}"
OUT="$WORK/dist"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[[ -n $version ]] || die "no version in Cargo.toml"
arch="$(dpkg --print-architecture)"
mkdir -p "$OUT"
made=()

for v in "${versions[@]}"; do
    pgc="$(pg_config_for "$v")"
    name="postgresql-$v-snowflake-id"
    stage="$WORK/deb-stage/$name"
    src="$WORK/deb-stage/pgrx-$v"
    log "PostgreSQL $v: cargo pgrx package"
    rm -rf "$stage" "$src"
    cargo pgrx package --pg-config "$pgc" --no-default-features --features "pg$v" \
        --out-dir "$src" >&2
    # cargo pgrx package mirrors pg_config's directories: find our files in
    # it wherever that PostgreSQL lives, and lay them out the Debian way.
    pkglibdir="$("$pgc" --pkglibdir)"
    sharedir="$("$pgc" --sharedir)"
    mkdir -p "$stage/DEBIAN" "$stage/usr/lib/postgresql/$v/lib" \
        "$stage/usr/share/postgresql/$v/extension" "$stage/usr/share/doc/$name"
    install -m 0644 "$src$pkglibdir/snowflake_id.so" "$stage/usr/lib/postgresql/$v/lib/"
    install -m 0644 "$src$sharedir/extension/snowflake_id"* "$stage/usr/share/postgresql/$v/extension/"
    install -m 0644 README.md "$stage/usr/share/doc/$name/README.md"
    install -m 0644 CHANGELOG.md "$stage/usr/share/doc/$name/changelog"
    {
        echo "snowflake_id $version"
        echo "License: PostgreSQL"
        echo
        cat LICENSE
    } >"$stage/usr/share/doc/$name/copyright"
    # The shared libraries it links (libc6, and libpq5 when it uses libpq),
    # at the versions its symbols need, as dpkg-shlibdeps says for Debian 12.
    shl="$WORK/deb-stage/shlibdeps-$v"
    rm -rf "$shl" && mkdir -p "$shl/debian"
    printf 'Source: snowflake-id\n\nPackage: %s\nArchitecture: any\n' "$name" >"$shl/debian/control"
    shlibs="$(cd "$shl" && dpkg-shlibdeps -O -e"$stage/usr/lib/postgresql/$v/lib/snowflake_id.so" \
        2> >(grep -v "should already be installed in their package's directory" >&2))"
    shlibs="${shlibs#shlibs:Depends=}"
    [[ $shlibs == *libc6* ]] || die "dpkg-shlibdeps found no libc6 dependency: $shlibs"
    size_kb="$(du -sk "$stage/usr" | cut -f1)"
    cat >"$stage/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: snowflake_id developers <snowflake-id@localhost>
Depends: postgresql-$v, $shlibs
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
    made+=("$deb")
done

# The source: the tracked files under snowflake_id-<version>/.
tarball="$OUT/snowflake_id-$version.tar.gz"
[[ -z "$(git status --porcelain --untracked-files=no)" ]] \
    || log "the working tree has uncommitted changes: they are in the tarball"
git ls-files -z | while IFS= read -r -d '' f; do
    [[ -e $f ]] && printf '%s\0' "$f"
done | tar --null -T - --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$(git log -1 --format=%ct)" --transform "s,^,snowflake_id-$version/," \
    -cf - | gzip -n >"$tarball"
log "built $tarball"
made+=("$tarball")

(cd "$OUT" && sha256sum "${made[@]##*/}" >SHA256SUMS)
log "wrote $OUT/SHA256SUMS"
printf '%s\n' "${made[@]}" "$OUT/SHA256SUMS"
