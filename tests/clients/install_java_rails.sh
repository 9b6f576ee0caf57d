#!/usr/bin/env bash
# Installs the Java and Rails clients tests/clients/test_jdbc.py and
# test_rails.py drive, from Debian 12's packages, idempotently (when they are
# present this only checks their versions, well under a second):
#   java:  openjdk-17-jdk-headless (javac, java), libpostgresql-jdbc-java
#          (pgjdbc, /usr/share/java/postgresql.jar)
#   rails: ruby, ruby-activerecord (ActiveRecord 6.1, standalone), ruby-pg;
#          nodejs when no node is installed (JSON round trips in JavaScript)
# Usage: install_java_rails.sh [java] [rails]   (both without arguments)
#
# Pinned to what Debian 12 ships (apt-cache policy, when this was written):
#   openjdk-17-jdk-headless 17.0.15+6-1~deb12u1 (security updates move it)
#   libpostgresql-jdbc-java 42.5.5-0+deb12u1
#   ruby 1:3.1 (ruby3.1 3.1.7+really3.1.2-0+deb12u1)
#   ruby-activerecord 2:6.1.7.10+dfsg-1~deb12u3
#   ruby-pg 1.4.5-1+b1
# The check below compares upstream versions (JDK: its major), so a Debian
# security rebuild passes and another release of a client is reported.
# Exits non-zero with the reason when something cannot be installed or has
# another version; the tests then fail with that reason (they never skip).
set -euo pipefail

WANT_JDK=17
WANT_PGJDBC=42.5.5
WANT_RUBY=3.1
WANT_ACTIVERECORD=6.1.7.10
WANT_RUBY_PG=1.4.5
JAR=/usr/share/java/postgresql.jar

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(java rails)
java=0 rails=0
for p in "${parts[@]}"; do
    case "$p" in
        java) java=1 ;;
        rails) rails=1 ;;
        *) echo "unknown part $p (java, rails)" >&2; exit 2 ;;
    esac
done

need=()
if [ $java = 1 ]; then
    command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
    [ -f "$JAR" ] || need+=(libpostgresql-jdbc-java)
fi
if [ $rails = 1 ]; then
    if ! command -v ruby >/dev/null 2>&1; then
        need+=(ruby ruby-activerecord ruby-pg)
    else
        # One ruby start: prints what it cannot load.
        missing=$(ruby -e '%w[active_record pg].each { |l| begin; require l; rescue LoadError; puts l; end }' 2>/dev/null) || true
        [[ "$missing" != *active_record* ]] || need+=(ruby-activerecord)
        [[ "$missing" != *pg* ]] || need+=(ruby-pg)
    fi
    command -v node >/dev/null 2>&1 || need+=(nodejs)
fi

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing Debian packages ${need[*]} and not root: apt-get install --no-install-recommends ${need[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # Others may be running apt at the same time: wait for the lock.
    apt_install() {
        apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${need[@]}"
    }
    log=$(mktemp)
    if ! apt_install >"$log" 2>&1; then
        if ! { apt-get update -q -o DPkg::Lock::Timeout=600 && apt_install; } >>"$log" 2>&1; then
            echo "apt-get install ${need[*]} failed:" >&2
            tail -20 "$log" >&2
            rm -f "$log"
            exit 1
        fi
    fi
    rm -f "$log"
fi

# The versions in use, against the pins.
upstream() {  # a Debian version without its epoch and revision
    local v="$1"; v="${v#*:}"; echo "${v%-*}"
}
deb_version() {
    dpkg-query -W -f '${Version}' "$1" 2>/dev/null || echo "not installed"
}
bad=()
report=()
if [ $java = 1 ]; then
    jdk=$(javac -version 2>&1 | awk '{print $2}')
    [ "${jdk%%.*}" = "$WANT_JDK" ] || bad+=("javac $jdk, want JDK $WANT_JDK")
    pgjdbc=$(upstream "$(deb_version libpostgresql-jdbc-java)")
    [ "$pgjdbc" = "$WANT_PGJDBC" ] || bad+=("libpostgresql-jdbc-java $pgjdbc, want $WANT_PGJDBC")
    [ -f "$JAR" ] || bad+=("no $JAR")
    report+=("javac $jdk (openjdk-17-jdk-headless $(deb_version openjdk-17-jdk-headless))"
             "pgjdbc $pgjdbc (libpostgresql-jdbc-java $(deb_version libpostgresql-jdbc-java))")
fi
if [ $rails = 1 ]; then
    versions=$(ruby -e 'require "active_record"; require "pg"
                        puts RUBY_VERSION, ActiveRecord::VERSION::STRING, PG::VERSION' 2>&1) ||
        { echo "ruby cannot load active_record and pg: $versions" >&2; exit 1; }
    read -r -d '' rb ar pg <<<"$versions" || true
    [ "${rb%.*}" = "$WANT_RUBY" ] || bad+=("ruby $rb, want $WANT_RUBY")
    [ "$ar" = "$WANT_ACTIVERECORD" ] || bad+=("activerecord $ar, want $WANT_ACTIVERECORD")
    [ "$pg" = "$WANT_RUBY_PG" ] || bad+=("pg $pg, want $WANT_RUBY_PG")
    report+=("ruby $rb (ruby3.1 $(deb_version ruby3.1))"
             "activerecord $ar (ruby-activerecord $(deb_version ruby-activerecord))"
             "pg $pg (ruby-pg $(deb_version ruby-pg))"
             "node $(node --version)")
fi
if [ ${#bad[@]} -gt 0 ]; then
    printf 'client version mismatch (tests/clients/install_java_rails.sh pins): %s\n' "${bad[@]}" >&2
    exit 1
fi
printf -v line '%s, ' "${report[@]}"
echo "clients installed: ${line%, }"
