# shellcheck shell=bash
#
# scripts/lib.sh -- shared helpers for the snowflake_id scripts.
#
# Source it (do not execute it):   source "$(dirname "$0")/lib.sh"
#
# Provides:
#   REPO_ROOT, PG_CONFIG, PG_BINDIR   paths used by every script
#   log / die                         short progress / error lines
#   require_root                      the scripts install system packages and
#                                     run PostgreSQL as the `postgres` user
#   as_postgres CMD...                run CMD as the postgres OS user
#   ensure_deps                       idempotently install everything needed
#                                     to build and test the extension; fast
#                                     (seconds) when everything is present
#
# Environment knobs:
#   PG_CONFIG   pg_config of the target server
#               (default /usr/lib/postgresql/15/bin/pg_config)
#   PGRX_HOME   where cargo-pgrx keeps config.toml (default ~/.pgrx)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
# shellcheck disable=SC2034  # used by the scripts that source this file
PG_BINDIR="$(dirname "$PG_CONFIG")"
PGRX_VERSION="0.18.1"

# Debian packages needed to build (pgrx/bindgen) and run/test the extension.
DEB_PACKAGES=(
    postgresql-15 postgresql-server-dev-15
    libclang-dev clang pkg-config libssl-dev
    build-essential sudo faketime
)

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

_apt_updated=0
_apt_install() {
    if [[ $_apt_updated -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq >/dev/null
        _apt_updated=1
    fi
    log "apt-get install $*"
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

_ensure_debs() {
    local missing=() pkg status
    for pkg in "${DEB_PACKAGES[@]}"; do
        status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
        [[ $status == "install ok installed" ]] || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        _apt_install "${missing[@]}"
    fi
    [[ -x $PG_CONFIG ]] || die "pg_config not found at $PG_CONFIG"
}

_ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
        # shellcheck source=/dev/null
        . "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 \
        || die "cargo not found: install Rust with rustup (https://rustup.rs) and re-run"
}

_ensure_cargo_pgrx() {
    local have
    have="$(cargo pgrx --version 2>/dev/null || true)"
    if [[ $have != "cargo-pgrx $PGRX_VERSION" ]]; then
        log "installing cargo-pgrx $PGRX_VERSION (found: ${have:-none}); this takes several minutes"
        cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
    fi
    local cfg="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
    if ! grep -Eq '^[[:space:]]*pg15[[:space:]]*=' "$cfg" 2>/dev/null; then
        log "cargo pgrx init --pg15 $PG_CONFIG"
        cargo pgrx init --pg15 "$PG_CONFIG"
    fi
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
            _apt_install python3-venv
            python3 -m venv "$venv"
        fi
    fi
    log "pip install -r tests/requirements.txt"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    printf '%s\n' "$want" >"$stamp"
}

ensure_deps() {
    require_root
    log "checking dependencies"
    _ensure_debs
    _ensure_rust
    _ensure_cargo_pgrx
    _ensure_venv
    log "dependencies OK"
}
