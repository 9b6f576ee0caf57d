#!/usr/bin/env bash
#
# scripts/quickstart.sh -- build snowflake_id, start a demo cluster, show it off.
#
# Run as root on Debian 12:   bash scripts/quickstart.sh
#
#   1. installs what building the extension needs, when missing
#      (scripts/lib.sh ensure_build_deps): Debian's postgresql-15 and
#      postgresql-server-dev-15, clang, libclang-dev, pkg-config, libssl-dev,
#      build-essential, dpkg-dev, ca-certificates; and cargo-pgrx 0.19.3
#      (cargo install). Rust itself is checked, not installed (rustup).
#      Nothing of the test suite (scripts/test.sh installs that). The script
#      stops, starts or reconfigures no service of the host (Debian's
#      postgresql-15 package, when it is first installed, makes and starts
#      its own cluster 15/main on port 5432).
#   2. builds and installs the extension (release) into the system PostgreSQL 15
#   3. (re)creates a throwaway cluster in /tmp/snowflake_id_demo listening on
#      port 5499 (PORT=... overrides) with shared_preload_libraries = 'snowflake_id'
#   4. creates a table whose id defaults to snowflake_nextval(), inserts rows
#      from two concurrent psql sessions and prints them decoded
#
# The cluster is left running; the last lines printed say how to connect and
# how to stop it, and the wall time of each step. Running the script again
# replaces the demo cluster.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEMO_DIR=/tmp/snowflake_id_demo   # data in $DEMO_DIR/data, socket in $DEMO_DIR
PORT="${PORT:-5499}"
DATA="$DEMO_DIR/data"
PG_CTL="$PG_BINDIR/pg_ctl"
PSQL=("$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$DEMO_DIR" -p "$PORT" -U postgres -d postgres)

PG_VERSIONS=(15)   # the demo runs on Debian's PostgreSQL 15
trap phase_report EXIT
ensure_build_deps   # its own phases: the Debian packages, cargo-pgrx

phase_start "build and install snowflake_id (release)"
log "building and installing snowflake_id (release)"
cd "$REPO_ROOT"
cargo pgrx install --release --pg-config "$PG_CONFIG"

phase_start "demo cluster, table, IDs"

if [[ -f $DATA/postmaster.pid ]]; then
    log "stopping the previous demo cluster"
    as_postgres "$PG_CTL" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
fi
log "creating demo cluster in $DEMO_DIR (port $PORT)"
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
chown postgres: "$DEMO_DIR"
as_postgres "$PG_BINDIR/initdb" -D "$DATA" -A trust -U postgres -E UTF8 \
    --locale=C.UTF-8 --no-sync --no-instructions >/dev/null
cat >>"$DATA/postgresql.conf" <<EOF

# snowflake_id quickstart demo
port = $PORT
unix_socket_directories = '$DEMO_DIR'
listen_addresses = ''
shared_preload_libraries = 'snowflake_id'
EOF
if ! as_postgres "$PG_CTL" -D "$DATA" -l "$DEMO_DIR/server.log" -w start >/dev/null; then
    tail -n 20 "$DEMO_DIR/server.log" >&2 || true
    die "the demo cluster did not start (log: $DEMO_DIR/server.log)"
fi

log "creating extension and table orders"
"${PSQL[@]}" <<'SQL'
CREATE EXTENSION snowflake_id;
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), item text);
SQL

log "inserting from two concurrent sessions (alice, bob)"
pids=()
for who in alice bob; do
    for n in 1 2 3 4 5; do
        printf "INSERT INTO orders (item) VALUES ('%s order %d');\n" "$who" "$n"
        printf "SELECT pg_sleep(0.01);\n"
    done | "${PSQL[@]}" -o /dev/null &
    pids+=("$!")
done
for pid in "${pids[@]}"; do
    wait "$pid"
done

"${PSQL[@]}" -c 'SELECT o.id, o.item, d.* FROM orders o, snowflake_decode(o.id) d ORDER BY o.id'

cat <<EOF
The demo cluster is running (data: $DATA, log: $DEMO_DIR/server.log).
Connect:  psql -h $DEMO_DIR -p $PORT -U postgres
          (or: runuser -u postgres -- psql -h $DEMO_DIR -p $PORT)
Stop:     runuser -u postgres -- $PG_CTL -D $DATA -m fast stop
EOF
