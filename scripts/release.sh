#!/usr/bin/env bash
#
# scripts/release.sh -- a release of snowflake_id from one commit, in
# target/dist/ (SNOWFLAKE_RELEASE_DIR moves it, below):
#
#   postgresql-NN-snowflake-id_<version>_<arch>.deb   one per PostgreSQL version
#                                                     (scripts/package.sh)
#   snowflake_id-<version>.tar.gz                     the source (scripts/package.sh)
#   snowflake_id-<version>.zip                        the PGXN distribution: the
#                                                     same files, META.json at
#                                                     the top of
#                                                     snowflake_id-<version>/
#   snowflake-id-archive-keyring.gpg                  the repository's public key,
#   snowflake-id-archive-keyring.asc                  binary and ASCII-armoured
#   apt/                                              the signed apt repository
#   SHA256SUMS                                        of the files above (not apt/,
#                                                     which its signed Release
#                                                     files cover)
#
# Run as root on Debian 12:   bash scripts/release.sh [NN ...]
#                             (default: every supported version, 15 16 17 18 19)
#
# It prints the path of each artifact, one per line (apt/ as a directory).
#
# Where it writes: SNOWFLAKE_RELEASE_DIR, default CARGO_TARGET_DIR (or
# target/). It holds dist/ (the artifacts, made afresh each run: the
# directory is removed first), release-repo/, release-gnupg/, deb-stage/
# (scripts/package.sh's work) and the logs. Cargo's build stays in
# CARGO_TARGET_DIR: scripts/test.sh gives each version a directory of its
# own, in its test results, while every build shares target/, so that
# `cargo pgrx package` reuses the release build its `cargo pgrx install`
# has just made (a build for another version would compile the crate
# again).
#
# The apt repository is made with reprepro (Debian's reprepro package): one
# suite per Debian release, bookworm (12) and trixie (13), component main,
# each holding every version's package (built on Debian 12, they install on
# both: the package test proves it on Debian 12's postgresql-15 and Debian
# 13's postgresql-17). Its InRelease and Release.gpg are signed with:
#
#   SNOWFLAKE_SIGNING_KEY set: that key (a fingerprint or user id) of the
#     keyring GNUPGHOME points at, as gpg finds it. The release key comes
#     from outside the repository (the maintainer's, or CI's secret store),
#     never from a file in it.
#   otherwise: a throwaway key made here with gpg in batch mode (Ed25519,
#     no passphrase, expiring in 30 days) in target/release-gnupg/, made
#     afresh each run. Fine for tests and a trial; never publish it.
#
# The repository's state (reprepro's conf/ and db/) is in
# target/release-repo/; what is published is target/dist/apt/ with the
# public key beside it (both under SNOWFLAKE_RELEASE_DIR when it is set). A DBA adds it with one line (README.md,
# "Installing"):
#
#   deb [signed-by=/usr/share/keyrings/snowflake-id-archive-keyring.gpg] <URL>/apt <codename> main
#
# A release is made from a clean tree: uncommitted changes are in the
# tarball and the packages (scripts/package.sh), and are named in the
# repository's Description as "+ uncommitted changes".

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=("${PG_VERSIONS[@]}")
for v in "${versions[@]}"; do pg_config_for "$v" >/dev/null; done
PG_VERSIONS=("${versions[@]}")
ensure_release_deps
cd "$REPO_ROOT"

WORK="${SNOWFLAKE_RELEASE_DIR:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}}"
OUT="$WORK/dist"
REPO_STATE="$WORK/release-repo"
KEYRING_NAME=snowflake-id-archive-keyring
# The Debian releases the repository has a suite for, and their numbers.
SUITES=(bookworm:12 trixie:13)
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[[ -n $version ]] || die "no version in Cargo.toml"
commit="$(git rev-parse --short=12 HEAD)"
[[ -z "$(git status --porcelain --untracked-files=no)" ]] || commit+=" + uncommitted changes"

# 1. The packages, the tarball (and package.sh's SHA256SUMS, rewritten below).
rm -rf "$OUT"
mkdir -p "$WORK"
bash "$REPO_ROOT/scripts/package.sh" "${versions[@]}" >"$WORK/release-packages.txt"
mapfile -t built <"$WORK/release-packages.txt"
debs=() tarball=""
for f in "${built[@]}"; do
    case $f in
        *.deb) debs+=("$f") ;;
        *.tar.gz) tarball=$f ;;
    esac
done
[[ ${#debs[@]} -eq ${#versions[@]} && -n $tarball ]] \
    || die "scripts/package.sh did not print a package per version and a tarball: ${built[*]}"

# 2. The PGXN distribution: the tarball's files as a zip.
zipfile="$OUT/snowflake_id-$version.zip"
stage="$WORK/release-zip"
rm -rf "$stage" && mkdir -p "$stage"
tar -xzf "$tarball" -C "$stage"
[[ -f $stage/snowflake_id-$version/META.json ]] || die "no META.json at the top of $tarball"
(cd "$stage" && zip -qrX "$zipfile" "snowflake_id-$version")
rm -rf "$stage"
log "built $zipfile"

# 3. The signing key.
if [[ -n ${SNOWFLAKE_SIGNING_KEY:-} ]]; then
    key="$SNOWFLAKE_SIGNING_KEY"
    gpg --batch --list-secret-keys "$key" >/dev/null 2>&1 \
        || die "SNOWFLAKE_SIGNING_KEY=$key: no such secret key in ${GNUPGHOME:-~/.gnupg}"
    log "signing with $key"
else
    export GNUPGHOME="$WORK/release-gnupg"
    # The agent of an earlier run's keyring goes with it.
    [[ ! -d $GNUPGHOME ]] || gpgconf --kill gpg-agent
    trap 'gpgconf --kill gpg-agent' EXIT
    rm -rf "$GNUPGHOME" && mkdir -p "$GNUPGHOME" && chmod 0700 "$GNUPGHOME"
    gpg --batch --quiet --pinentry-mode loopback --passphrase '' \
        --quick-gen-key "snowflake_id throwaway release key (not for publishing) <snowflake-id@localhost>" \
        ed25519 sign 30d 2>"$WORK/release-gpg.log" \
        || die "gpg could not make a throwaway key: $(cat "$WORK/release-gpg.log")"
    key="$(gpg --batch --with-colons --list-secret-keys 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }')"
    log "signing with a throwaway key ($key, in $GNUPGHOME): set SNOWFLAKE_SIGNING_KEY to sign a real release"
fi
gpg --batch --export "$key" >"$OUT/$KEYRING_NAME.gpg"
gpg --batch --armor --export "$key" >"$OUT/$KEYRING_NAME.asc"
[[ -s $OUT/$KEYRING_NAME.gpg ]] || die "gpg exported no public key for $key"

# 4. The apt repository.
arch="$(dpkg --print-architecture)"
rm -rf "$REPO_STATE" && mkdir -p "$REPO_STATE/conf"
for s in "${SUITES[@]}"; do
    cat <<EOF
Origin: snowflake_id
Label: snowflake_id
Codename: ${s%%:*}
Suite: ${s%%:*}
Version: $version
Architectures: $arch
Components: main
Description: snowflake_id $version (commit $commit) for Debian ${s#*:}
SignWith: $key

EOF
done >"$REPO_STATE/conf/distributions"
reprepro=(reprepro --silent -b "$REPO_STATE" --outdir "$OUT/apt")
for s in "${SUITES[@]}"; do
    "${reprepro[@]}" includedeb "${s%%:*}" "${debs[@]}"
done
for s in "${SUITES[@]}"; do
    [[ -f $OUT/apt/dists/${s%%:*}/InRelease ]] || die "reprepro made no signed InRelease for ${s%%:*}"
done
log "built $OUT/apt (suites: ${SUITES[*]%%:*})"

# 5. The checksums of everything but the repository.
made=("${debs[@]}" "$tarball" "$zipfile" "$OUT/$KEYRING_NAME.gpg" "$OUT/$KEYRING_NAME.asc")
(cd "$OUT" && sha256sum "${made[@]##*/}" >SHA256SUMS)
log "wrote $OUT/SHA256SUMS"
printf '%s\n' "${made[@]}" "$OUT/apt" "$OUT/SHA256SUMS"
