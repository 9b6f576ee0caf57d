#!/usr/bin/env bash
#
# scripts/debian-root.sh -- a Debian root directory made with debootstrap
# from Debian's own packages:
#
#   trixie (the default)  Debian 13, for the package test that installs the
#                         PostgreSQL 17 package into Debian 13's
#                         postgresql-17 (tests/upgrade/test_package.py). It
#                         holds trixie's package lists and the downloaded
#                         .debs of postgresql-17 and what it depends on
#                         (apt-get install --download-only), so installing
#                         them in a copy needs no network.
#   bookworm              Debian 12, the same with postgresql-15: the
#                         package test installs the 15 package from the apt
#                         repository there (not into this system's own 15).
#   sid                   Debian unstable with postgresql-19,
#                         postgresql-client-19 and postgresql-server-dev-19
#                         from experimental, installed (PG19_DEB_VERSION,
#                         their sha256 pinned in scripts/lib.sh): PostgreSQL
#                         19 for the whole suite (scripts/lib.sh
#                         _ensure_pg19 runs it from .pg/19/ with this root's
#                         loader and libraries) and the root the 19 package
#                         test installs into.
#
# Run as root:   bash scripts/debian-root.sh [trixie|bookworm|sid]
#
# Prints the root's path: .chroot/<suite>/root (git-ignored). It is made once
# (one to three minutes) and reused: a second run prints the path at once.
# The root is a pristine starting point that tests copy before changing
# anything. Remove .chroot/<suite> to start over with today's Debian.
#
# DEBIAN_MIRROR (scripts/lib.sh) names the mirror: deb.debian.org.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

suite="${1:-trixie}"
# The distribution's own PostgreSQL server package, downloaded into the root.
_distribution_postgresql() {
    case $1 in
        trixie) echo postgresql-17 ;;
        bookworm) echo postgresql-15 ;;
    esac
}
case $suite in
    trixie | bookworm | sid) ;;
    *) die "usage: bash scripts/debian-root.sh [trixie|bookworm|sid]" ;;
esac
require_root
command -v debootstrap >/dev/null 2>&1 || _ensure_debs debootstrap
base="$REPO_ROOT/.chroot/$suite"
root="$base/root"
mkdir -p "$base"

# One maker at a time (two test runs could start together).
exec 9>"$base/lock"
flock 9

# sid's and experimental's Release files carry a Valid-Until a few days
# ahead, and the mirror reachable here may serve them after it: apt would
# refuse them. The packages that matter are checked against the sha256
# pinned in scripts/lib.sh.
apt_opts=("${APT_LOCK_WAIT[@]}")
[[ $suite != sid ]] || apt_opts+=(-o Acquire::Check-Valid-Until=false)

if [[ ! -f $base/complete ]]; then
    rm -rf "$root" "$root.tmp"
    log "debootstrap $suite into $root (once; one to three minutes)"
    debootstrap --variant=minbase "$suite" "$root.tmp" "$DEBIAN_MIRROR" >"$base/debootstrap.log" 2>&1 \
        || die "debootstrap failed; its log: $base/debootstrap.log"
    cp /etc/resolv.conf "$root.tmp/etc/resolv.conf"
    # Services are never started by package scripts inside the root (no init
    # runs there), and the tests make their own clusters.
    printf '#!/bin/sh\nexit 101\n' >"$root.tmp/usr/sbin/policy-rc.d"
    chmod 0755 "$root.tmp/usr/sbin/policy-rc.d"
    # No "main" cluster at install: the test makes its own. (A file in
    # createcluster.d, which Debian's createcluster.conf includes, so that
    # the packaged createcluster.conf itself is installed unchanged.)
    mkdir -p "$root.tmp/etc/postgresql-common/createcluster.d"
    echo "create_main_cluster = false" \
        >"$root.tmp/etc/postgresql-common/createcluster.d/no-main-cluster.conf"
    if [[ $suite != sid ]]; then
        chroot "$root.tmp" apt-get "${apt_opts[@]}" update -qq >/dev/null
        chroot "$root.tmp" apt-get "${apt_opts[@]}" install -y -qq --download-only --no-install-recommends \
            "$(_distribution_postgresql "$suite")" >/dev/null
    else
        echo "deb $DEBIAN_MIRROR experimental main" >"$root.tmp/etc/apt/sources.list.d/experimental.list"
        chroot "$root.tmp" apt-get "${apt_opts[@]}" update -qq >/dev/null
        v="$PG19_DEB_VERSION"
        pkgs=("postgresql-19=$v" "postgresql-client-19=$v" "postgresql-server-dev-19=$v"
              libpq5/experimental libpq-dev/experimental)
        chroot "$root.tmp" apt-get "${apt_opts[@]}" install -y -qq --download-only --no-install-recommends \
            "${pkgs[@]}" >"$base/install.log" 2>&1 \
            || die "postgresql-19 $v is not in Debian experimental any more (its log: $base/install.log): update PG19_DEB_VERSION and the PG19_*_SHA256 pins in scripts/lib.sh"
        archives="$root.tmp/var/cache/apt/archives"
        for pin in "postgresql-19:$PG19_SERVER_SHA256" "postgresql-server-dev-19:$PG19_DEV_SHA256"; do
            f="$archives/${pin%%:*}_${v//:/%3a}_amd64.deb"
            sha256sum -c --status <<<"${pin#*:}  $f" \
                || die "$f does not match its sha256 pinned in scripts/lib.sh (PG19_*_SHA256)"
        done
        # The packages' scripts need /proc (systemd-tmpfiles).
        mount -t proc proc "$root.tmp/proc"
        if ! chroot "$root.tmp" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install \
                -y -qq --no-install-recommends "${pkgs[@]}" >>"$base/install.log" 2>&1; then
            umount "$root.tmp/proc"
            die "installing postgresql-19 in the sid root failed; its log: $base/install.log"
        fi
        umount "$root.tmp/proc"
    fi
    mv "$root.tmp" "$root"
    date -u +%FT%TZ >"$base/complete"
fi
echo "$root"
