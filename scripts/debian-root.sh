#!/usr/bin/env bash
#
# scripts/debian-root.sh -- a Debian 13 (trixie) root directory made with
# debootstrap from Debian's own packages, for the package test that installs
# the PostgreSQL 17 package into Debian 13's postgresql-17
# (tests/upgrade/test_package.py).
#
# Run as root:   bash scripts/debian-root.sh
#
# Prints the root's path: .chroot/trixie/root (git-ignored). It is made once
# (about a minute and a half) and reused: a second run prints the path at
# once. The root is a pristine starting point that the test copies before
# changing anything. Besides the minimal base system it holds trixie's
# package lists and the downloaded .debs of postgresql-17 and what it
# depends on (apt-get install --download-only), so installing them in a
# copy needs no network. Remove .chroot/ to start over with today's Debian 13.
#
# DEBIAN_MIRROR (scripts/lib.sh) names the mirror: deb.debian.org.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_root
command -v debootstrap >/dev/null 2>&1 || _ensure_debs debootstrap
base="$REPO_ROOT/.chroot/trixie"
root="$base/root"
mkdir -p "$base"

# One maker at a time (two test runs could start together).
exec 9>"$base/lock"
flock 9

if [[ ! -f $base/complete ]]; then
    rm -rf "$root" "$root.tmp"
    log "debootstrap trixie into $root (once; about a minute and a half)"
    debootstrap --variant=minbase trixie "$root.tmp" "$DEBIAN_MIRROR" >"$base/debootstrap.log" 2>&1 \
        || die "debootstrap failed; its log: $base/debootstrap.log"
    cp /etc/resolv.conf "$root.tmp/etc/resolv.conf"
    # Services are never started by package scripts inside the root (no init
    # runs there), and the test makes its own cluster with pg_createcluster.
    printf '#!/bin/sh\nexit 101\n' >"$root.tmp/usr/sbin/policy-rc.d"
    chmod 0755 "$root.tmp/usr/sbin/policy-rc.d"
    # No "main" cluster at install: the test makes its own. (A file in
    # createcluster.d, which Debian's createcluster.conf includes, so that
    # the packaged createcluster.conf itself is installed unchanged.)
    mkdir -p "$root.tmp/etc/postgresql-common/createcluster.d"
    echo "create_main_cluster = false" \
        >"$root.tmp/etc/postgresql-common/createcluster.d/no-main-cluster.conf"
    chroot "$root.tmp" apt-get "${APT_LOCK_WAIT[@]}" update -qq >/dev/null
    chroot "$root.tmp" apt-get "${APT_LOCK_WAIT[@]}" install -y -qq --download-only --no-install-recommends \
        postgresql-17 >/dev/null
    mv "$root.tmp" "$root"
    date -u +%FT%TZ >"$base/complete"
fi
echo "$root"
