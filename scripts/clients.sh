#!/usr/bin/env bash
#
# scripts/clients.sh -- the real clients tests/clients/test_*.py drive, pinned.
#
#   bash scripts/clients.sh           install what is missing, then check
#                                     (scripts/lib.sh ensure_deps runs this,
#                                     before any test starts)
#   bash scripts/clients.sh --check [PART...]
#                                     only check (the tests run this: a test
#                                     never installs anything); exits non-zero
#                                     naming what is missing or has another
#                                     version, and the command that installs it
#
# PARTS (all without arguments):
#   python  tests/clients/requirements.txt in the repository's .venv/
#           (Django, SQLAlchemy, asyncpg)
#   debian  pgbouncer; nodejs and npm when no node is installed;
#           postgresql-15-partman (pg_partman 4.7) for Debian's PostgreSQL 15
#   npm     tests/clients/js/package-lock.json into tests/clients/js/node_modules
#   java    openjdk-17-jdk-headless (javac, java), libpostgresql-jdbc-java
#           (pgjdbc, /usr/share/java/postgresql.jar)
#   rails   ruby, ruby-activerecord (ActiveRecord 6.1, standalone), ruby-pg
#
# Pinned to what Debian 12 ships (apt-cache policy, when this was written):
#   openjdk-17-jdk-headless 17.0.15+6-1~deb12u1 (security updates move it)
#   libpostgresql-jdbc-java 42.5.5-0+deb12u1
#   ruby 1:3.1 (ruby3.1 3.1.7+really3.1.2-0+deb12u1)
#   ruby-activerecord 2:6.1.7.10+dfsg-1~deb12u3
#   ruby-pg 1.4.5-1+b1
# The check compares upstream versions (JDK: its major), so a Debian security
# rebuild passes and another release of a client is reported.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WANT_JDK=17
WANT_PGJDBC=42.5.5
WANT_RUBY=3.1
WANT_ACTIVERECORD=6.1.7.10
WANT_RUBY_PG=1.4.5
JAR=/usr/share/java/postgresql.jar
CLIENTS="$REPO_ROOT/tests/clients"
PY="$REPO_ROOT/.venv/bin/python"
PY_STAMP="$REPO_ROOT/.venv/.clients-requirements"
JS="$CLIENTS/js"

check_only=0
if [[ ${1:-} == --check ]]; then
    check_only=1
    shift
fi
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(python debian npm java rails)
for p in "${parts[@]}"; do
    case $p in
        python | debian | npm | java | rails) ;;
        *) die "unknown part $p (python, debian, npm, java, rails)" ;;
    esac
done
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }

# The Debian packages of the parts asked for that are missing.
missing_debs() {
    local need=() missing
    if want debian; then
        command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || need+=(pgbouncer)
        command -v node >/dev/null 2>&1 || need+=(nodejs)
        command -v npm >/dev/null 2>&1 || need+=(npm)
        if [[ -d /usr/lib/postgresql/15 && ! -f /usr/share/postgresql/15/extension/pg_partman.control ]]; then
            need+=(postgresql-15-partman)
        fi
    fi
    if want java; then
        command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
        [[ -f $JAR ]] || need+=(libpostgresql-jdbc-java)
    fi
    if want rails; then
        if ! command -v ruby >/dev/null 2>&1; then
            need+=(ruby ruby-activerecord ruby-pg)
        else
            # One ruby start: prints what it cannot load.
            missing=$(ruby -e '%w[active_record pg].each { |l| begin; require l; rescue LoadError; puts l; end }' 2>/dev/null) || true
            [[ $missing != *active_record* ]] || need+=(ruby-activerecord)
            [[ $missing != *pg* ]] || need+=(ruby-pg)
        fi
        command -v node >/dev/null 2>&1 || need+=(nodejs)
    fi
    printf '%s\n' "${need[@]}" | sort -u | sed '/^$/d'
}

install() {
    local need
    mapfile -t need < <(missing_debs)
    if [[ ${#need[@]} -gt 0 ]]; then
        require_root
        apt_install "${need[@]}"
        # The Debian package starts a pgbouncer service on port 6432; the
        # tests start their own, so stop the packaged one if it runs.
        if [[ " ${need[*]} " == *" pgbouncer "* ]] && command -v systemctl >/dev/null 2>&1; then
            systemctl stop pgbouncer >/dev/null 2>&1 || true
        fi
    fi
    if want python && ! cmp -s "$CLIENTS/requirements.txt" "$PY_STAMP"; then
        [[ -x $PY ]] || die "no $PY: scripts/lib.sh ensure_deps makes it first"
        log "pip install -r tests/clients/requirements.txt"
        "$PY" -m pip install --quiet --disable-pip-version-check -r "$CLIENTS/requirements.txt"
        cp "$CLIENTS/requirements.txt" "$PY_STAMP"
    fi
    if want npm && ! cmp -s "$JS/package-lock.json" "$JS/node_modules/.clients-lock"; then
        log "npm ci in tests/clients/js"
        (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        cp "$JS/package-lock.json" "$JS/node_modules/.clients-lock"
    fi
}

upstream() {  # a Debian version without its epoch and revision
    local v=$1
    v=${v#*:}
    echo "${v%-*}"
}
deb_version() {
    dpkg-query -W -f '${Version}' "$1" 2>/dev/null || echo "not installed"
}

# Prints the versions in use; exits non-zero naming what is missing or
# differs from the pins.
check() {
    local bad=() report=() need versions jdk pgjdbc rb ar pg
    mapfile -t need < <(missing_debs)
    [[ ${#need[@]} -eq 0 ]] || bad+=("missing Debian packages: ${need[*]}")
    if want python; then
        if ! cmp -s "$CLIENTS/requirements.txt" "$PY_STAMP" \
            || ! versions=$("$PY" -c 'import django, sqlalchemy, asyncpg; print("Django", django.__version__, "SQLAlchemy", sqlalchemy.__version__, "asyncpg", asyncpg.__version__)' 2>&1); then
            bad+=("the Python clients of tests/clients/requirements.txt are not installed in .venv/")
        else
            report+=("$versions")
        fi
    fi
    if want npm; then
        if ! cmp -s "$JS/package-lock.json" "$JS/node_modules/.clients-lock" 2>/dev/null; then
            bad+=("tests/clients/js/node_modules does not hold package-lock.json's packages")
        else
            report+=("pg $(node -p 'require(process.argv[1] + "/node_modules/pg/package.json").version' "$JS")")
        fi
    fi
    if want debian && [[ ${#need[@]} -eq 0 ]]; then
        report+=("node $(node --version)" "$( (/usr/sbin/pgbouncer --version 2>/dev/null || pgbouncer --version) | head -1)")
    fi
    if want java && command -v javac >/dev/null 2>&1; then
        jdk=$(javac -version 2>&1 | awk '{print $2}')
        [[ ${jdk%%.*} == "$WANT_JDK" ]] || bad+=("javac $jdk, want JDK $WANT_JDK")
        pgjdbc=$(upstream "$(deb_version libpostgresql-jdbc-java)")
        [[ $pgjdbc == "$WANT_PGJDBC" ]] || bad+=("libpostgresql-jdbc-java $pgjdbc, want $WANT_PGJDBC")
        report+=("javac $jdk (openjdk-17-jdk-headless $(deb_version openjdk-17-jdk-headless))"
                 "pgjdbc $pgjdbc (libpostgresql-jdbc-java $(deb_version libpostgresql-jdbc-java))")
    fi
    if want rails && command -v ruby >/dev/null 2>&1; then
        if versions=$(ruby -e 'require "active_record"; require "pg"
                               puts RUBY_VERSION, ActiveRecord::VERSION::STRING, PG::VERSION' 2>&1); then
            read -r -d '' rb ar pg <<<"$versions" || true
            [[ ${rb%.*} == "$WANT_RUBY" ]] || bad+=("ruby $rb, want $WANT_RUBY")
            [[ $ar == "$WANT_ACTIVERECORD" ]] || bad+=("activerecord $ar, want $WANT_ACTIVERECORD")
            [[ $pg == "$WANT_RUBY_PG" ]] || bad+=("pg $pg, want $WANT_RUBY_PG")
            report+=("ruby $rb (ruby3.1 $(deb_version ruby3.1))"
                     "activerecord $ar (ruby-activerecord $(deb_version ruby-activerecord))"
                     "pg $pg (ruby-pg $(deb_version ruby-pg))")
        else
            bad+=("ruby cannot load active_record and pg: $versions")
        fi
    fi
    if [[ ${#bad[@]} -gt 0 ]]; then
        printf 'clients (%s): %s\n' "${parts[*]}" "${bad[@]}" >&2
        echo "install them with: bash scripts/clients.sh ${parts[*]} (scripts/test.sh does, before any test)" >&2
        return 1
    fi
    local line
    printf -v line '%s, ' "${report[@]}"
    echo "clients: ${line%, }"
}

[[ $check_only -eq 1 ]] || install
check
