#!/usr/bin/env bash
#
# bench/profile.sh -- where the time of one snowflake_nextval() call goes.
#
# Run as root on Debian 12:   bash bench/profile.sh
#
# Builds like bench/run.sh (BENCH_SKIP_INSTALL=1 skips it), makes a throwaway
# cluster with the library preloaded, and runs ONE single-user backend
# (postgres --single, no postmaster, no client) executing the case 1 query
#
#     SELECT count(x) FROM (SELECT snowflake_nextval() x FROM generate_series(1, CALLS) g) s
#
# under a profiler, and the same with x = g (the bare count), random(),
# clock_timestamp() and nextval('s1') for comparison:
#
#   perf      when hardware counters work (`perf stat -e instructions true`
#             counts): perf stat for instructions per ID above the bare count
#             (Debian: linux-perf)
#   callgrind otherwise (valgrind --tool=callgrind, exact instruction counts):
#             the executor (standard_ExecutorRun) of each query for
#             instructions per ID above bare, a run collecting only inside
#             snowflake_nextval() for the cost of one call and its top
#             functions, and the executor's top functions
#
# then perf record + perf report of the snowflake query for the top functions
# by time (the hardware event, or the cpu-clock software event, which works
# without counters too), and finally the wall time per row of the same
# queries without a profiler.
#
# Knobs: PROFILE_TOOL (auto|perf|callgrind), PROFILE_CALLS (rows per query;
# 200000 for callgrind, 2000000 for perf), PROFILE_PERF_CALLS (2000000, rows
# for perf record), PROFILE_WALL_CALLS (2000000, rows for the wall times),
# PROFILE_EVENT (perf event; default instructions, or cpu-clock when the
# hardware counters do not work), PROFILE_LAYOUT (classic), PROFILE_TOP (15),
# PROFILE_KEEP=1 keeps the work directory (profiles, cluster) for
# callgrind_annotate / perf report by hand. The report is also written to
# bench/out/profile.txt.

set -euo pipefail
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TOOL="${PROFILE_TOOL:-auto}"
LAYOUT="${PROFILE_LAYOUT:-classic}"
TOP="${PROFILE_TOP:-15}"

bench_checks
bench_build
mkdir -p "$REPO_ROOT/bench/out"
exec > >(tee "$REPO_ROOT/bench/out/profile.txt")   # the report, also kept in bench/out

hw_counters_work() {
    command -v perf >/dev/null 2>&1 || return 1
    local out
    out="$(perf stat -x, -e instructions true 2>&1)" || return 1
    [[ $out == [0-9]*,*instructions* ]]
}

if [[ $TOOL == auto ]]; then
    if hw_counters_work; then
        TOOL=perf
    elif command -v valgrind >/dev/null 2>&1; then
        TOOL=callgrind
        log "perf stat -e instructions does not count here (no hardware counters): using callgrind"
    else
        die "neither working perf hardware counters nor valgrind: apt-get install linux-perf valgrind"
    fi
fi
case $TOOL in
    perf)
        command -v perf >/dev/null 2>&1 || die "perf not found: apt-get install linux-perf"
        if [[ -z ${PROFILE_EVENT:-} ]]; then
            if hw_counters_work; then PROFILE_EVENT=instructions; else PROFILE_EVENT=cpu-clock; fi
        fi
        ;;
    callgrind)
        command -v valgrind >/dev/null 2>&1 || die "valgrind not found: apt-get install valgrind"
        ;;
    *) die "PROFILE_TOOL must be auto, perf or callgrind" ;;
esac

# Rows per query: callgrind is ~50x slower; perf stat counts the backend's
# startup too, which 2,000,000 rows make small.
if [[ $TOOL == callgrind ]]; then CALLS="${PROFILE_CALLS:-200000}"; else CALLS="${PROFILE_CALLS:-2000000}"; fi

WORK="$(mktemp -d /tmp/sfbenchXXXXXX)"   # bench.py's orphan cleanup (harness.stop_orphans) knows the prefix
echo $$ >"$WORK/owner.pid"
chmod 755 "$WORK"
cleanup() {
    if [[ ${PROFILE_KEEP:-0} == 1 ]]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# A private copy of the installation with this build (bench/servers.py build_pg_tree).
POSTGRES="$("$PY" "$REPO_ROOT/bench/bench.py" --pg-tree "$WORK/pg")"
DATA="$WORK/data"
OUTD="$WORK/out"   # profiles and logs, written by the postgres OS user
mkdir "$DATA" "$OUTD" && chown postgres: "$DATA" "$OUTD" && chmod 700 "$DATA"
as_postgres "$(dirname "$PG_CONFIG")/initdb" -D "$DATA" -A trust -U postgres -E UTF8 \
    --locale=C.UTF-8 --no-sync --no-instructions >/dev/null
cat >>"$DATA/postgresql.conf" <<EOF
shared_preload_libraries = 'snowflake_id'
snowflake_id.layout = '$LAYOUT'
# A single-user backend runs no background worker: without this, the first
# claim would wait for the registry worker that never starts.
snowflake_id.registry_database = ''
jit = off
listen_addresses = ''
EOF

# One single-user backend running the given SQL, optionally under a profiler.
single() {  # single SQL [PROFILER ARGS...]
    local sql="$1"; shift
    printf '%s\n' "$sql" | as_postgres "$@" "$POSTGRES" --single -D "$DATA" \
        -c exit_on_error=on postgres
}
single "CREATE EXTENSION snowflake_id;" >"$OUTD/setup.log" 2>&1 \
    || die "CREATE EXTENSION failed: $(cat "$OUTD/setup.log")"
# Warm the catalog once (relcache init file) so both runs start alike.
single "SELECT count(snowflake_nextval()) FROM generate_series(1, 1000);" >>"$OUTD/setup.log" 2>&1 \
    || die "single-user backend failed: $(cat "$OUTD/setup.log")"

per_id() {  # per_id TOTAL_SF TOTAL_BARE -> "(sf - bare) / CALLS" with one decimal
    awk -v a="$1" -v b="$2" -v n="$CALLS" 'BEGIN { printf "%.1f", (a - b) / n }'
}
num() { tr -d ',' <<<"$1"; }
# The query form of bench case 1, for each expression.
query() { echo "SELECT count(x) FROM (SELECT $1 x FROM generate_series(1, $CALLS) g) s;"; }
EXPRS=("g" "random()" "clock_timestamp()" "nextval('s1')" "snowflake_nextval()")
LABELS=("g (bare count)" "random()" "clock_timestamp()" "nextval('s1') CACHE 1" "snowflake_nextval()")
SF=4   # index of snowflake_nextval() in EXPRS
single "CREATE SEQUENCE s1 CACHE 1;" >>"$OUTD/setup.log" 2>&1 || die "CREATE SEQUENCE failed"

echo
echo "Profile of $(query "snowflake_nextval()")"
echo "layout $LAYOUT, one single-user backend (postgres --single), tool: $TOOL${PROFILE_EVENT:+ (event $PROFILE_EVENT)}"
echo "library sha256 $(sha256sum "$WORK/pg$("$PG_CONFIG" --pkglibdir)/snowflake_id.so" | cut -c1-12) from ${BENCH_PKG:-the installed files}"

print_costs() {  # print_costs UNIT TOTAL... (one per EXPRS entry)
    local unit="$1"; shift
    local totals=("$@") i
    printf '  %-26s %12s %12s\n' "expression" "$unit/ID" "above bare"
    for i in "${!EXPRS[@]}"; do
        printf '  %-26s %12s %12s\n' "${LABELS[$i]}" "$(per_id "${totals[$i]}" 0)" \
            "$( ((i > 0)) && per_id "${totals[$i]}" "${totals[0]}")"
    done
}

if [[ $TOOL == callgrind ]]; then
    cg() {  # cg NAME SQL VALGRIND-ARGS...
        local name="$1" sql="$2"; shift 2
        single "$sql" valgrind --tool=callgrind --callgrind-out-file="$OUTD/$name.cg" \
            "$@" >"$OUTD/$name.stdout" 2>"$OUTD/$name.valgrind" \
            || die "valgrind run $name failed: $(tail -5 "$OUTD/$name.valgrind")"
    }
    total() { grep -m1 -E '^(summary|totals):' "$OUTD/$1.cg" | awk '{print $2}'; }
    totals=()
    for i in "${!EXPRS[@]}"; do
        log "callgrind: ${LABELS[$i]} (executor only)"
        cg "q$i" "$(query "${EXPRS[$i]}")" --toggle-collect=standard_ExecutorRun
        totals+=("$(total "q$i")")
    done
    log "callgrind: snowflake_nextval() (inside the function only)"
    cg call "$(query "snowflake_nextval()")" --toggle-collect=snowflake_nextval_wrapper
    call="$(total call)"
    echo
    echo "instructions (Ir, exact) of the executor per row; the case 1 query form:"
    print_costs Ir "${totals[@]}"
    echo "  inside snowflake_nextval_wrapper, per call: $(per_id "$call" 0) Ir"
    lines() {  # lines NAME INCLUSIVE -> "IR function" per line, most expensive first
        callgrind_annotate --auto=no --inclusive="$2" "$OUTD/$1.cg" 2>/dev/null \
            | awk '/file:function/ {on=1; next} on && /^ *[0-9,]+ / {print}' \
            | sed -E 's/ \[[^]]*\]$//; s/\?\?\?://'
    }
    per_line() { awk -v n="$CALLS" '{ ir=$1; gsub(",", "", ir); printf "  %7.1f  %s\n", ir / n, $0 }'; }
    annotate() {  # annotate NAME INCLUSIVE
        if [[ $2 == yes ]]; then
            # Only functions that ran inside the collected region (they have a
            # self cost), not the callers above it, whose inclusive cost is all.
            # shellcheck disable=SC2016  # awk code, not shell
            fname='{ f = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", f) }'
            lines "$1" no | awk "$fname"' { print f }' >"$OUTD/$1.inside"
            lines "$1" yes | awk "$fname"' NR == FNR { inside[$0]; next } (f in inside)' \
                "$OUTD/$1.inside" -
        else
            lines "$1" no
        fi | sed -n "1,${TOP}p" | per_line   # sed reads to the end: no SIGPIPE upstream
    }
    echo
    echo "inside one snowflake_nextval() call, self cost (Ir per call; Ir in all $CALLS calls, share):"
    annotate call no
    echo
    echo "inside one snowflake_nextval() call, inclusive cost:"
    annotate call yes
    echo
    echo "the whole executor of the snowflake query, self cost per row (0x... = PostgreSQL statics, no symbols):"
    annotate "q$SF" no
    echo
    echo "(callgrind counts user-space instructions only: time spent in system calls,"
    echo " e.g. reading the clock where the vDSO is not used, shows only in the wall times below)"
    if [[ ${PROFILE_KEEP:-0} == 1 ]]; then
        echo "callgrind files: $OUTD/{q0,q1,q2,q3,q4,call}.cg (callgrind_annotate, kcachegrind)"
    fi
else
    pstat() {  # pstat SQL -> event count of the whole backend
        single "$1" perf stat -x, -e "$PROFILE_EVENT" -o "$OUTD/stat.csv" -- >/dev/null 2>&1 \
            || die "perf stat failed"
        awk -F, -v e="$PROFILE_EVENT" '$3 ~ "^" e { print $1; exit }' "$OUTD/stat.csv"
    }
    totals=()
    for i in "${!EXPRS[@]}"; do
        log "perf stat ($PROFILE_EVENT): ${LABELS[$i]}"
        totals+=("$(num "$(pstat "$(query "${EXPRS[$i]}")")")")
    done
    unit="$PROFILE_EVENT"
    case $PROFILE_EVENT in
        cpu-clock|task-clock)  # perf reports ms: per ID in ns
            unit="CPU ns"
            for i in "${!totals[@]}"; do
                totals[i]="$(awk -v v="${totals[$i]}" 'BEGIN { printf "%.0f", v * 1e6 }')"
            done ;;
    esac
    echo
    echo "$PROFILE_EVENT of the whole backend per row (startup included, the same in each):"
    print_costs "$unit" "${totals[@]}"
fi

# Where the time goes: perf sampling of the snowflake query, with the hardware
# event, or with the cpu-clock software event (also in callgrind mode: it
# sees the time of instructions that cost more than others, such as the
# clock read, which instruction counts cannot).
PERF_CALLS="${PROFILE_PERF_CALLS:-2000000}"
if [[ $TOOL == perf ]] || { command -v perf >/dev/null 2>&1 \
        && perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; }; then
    event="${PROFILE_EVENT:-cpu-clock}"
    log "perf record ($event), $PERF_CALLS rows"

    if single "$(query "snowflake_nextval()" | sed "s/$CALLS/$PERF_CALLS/")" \
            perf record -q -F 10000 -e "$event" -o "$OUTD/perf.data" -- >/dev/null 2>&1; then
        echo
        echo "perf record -e $event of the snowflake query ($PERF_CALLS rows), self, by share of samples:"
        perf report -f -i "$OUTD/perf.data" --stdio --no-children --sort dso,symbol \
            --percent-limit 0.5 2>/dev/null | grep -vE "^(#|$)" | sed -n "1,${TOP}p" \
            | sed -E 's/ +- +- *$//; s/^/  /'
    else
        log "perf record failed: no sampling profile"
    fi
fi

# Wall time per ID without a profiler (system calls included; noisy on a busy
# machine): the server's own clock around the aggregate, median of 3 runs.
WALL_CALLS="${PROFILE_WALL_CALLS:-2000000}"
wall_ns() {  # wall_ns EXPR -> ns per row
    local i v vals=()
    for i in 1 2 3; do
        v="$(single "SELECT (extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1e9 / $WALL_CALLS)::int AS ns FROM (SELECT count(x) FROM (SELECT $1 x FROM generate_series(1, $WALL_CALLS) g) s) t;" 2>/dev/null \
            | grep -oE 'ns = "[0-9]+"' | grep -oE '[0-9]+')"
        vals+=("$v")
    done
    printf '%s\n' "${vals[@]}" | sort -n | sed -n 2p
}
log "wall time per ID, $WALL_CALLS rows, 3 runs each"
echo
echo "wall time per row, no profiler ($WALL_CALLS rows, median of 3; load average $(cut -d' ' -f1 /proc/loadavg)):"
printf '  %-26s %12s %12s\n' "expression" "ns/ID" "above bare"
bare_ns=""
for i in "${!EXPRS[@]}"; do
    ns="$(wall_ns "${EXPRS[$i]}")"
    [[ -n $bare_ns ]] || bare_ns="$ns"
    printf '  %-26s %12s %12s\n' "${LABELS[$i]}" "$ns" "$( ((i > 0)) && echo $((ns - bare_ns)))"
done
