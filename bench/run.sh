#!/usr/bin/env bash
#
# bench/run.sh -- snowflake_id benchmarks side by side with PostgreSQL's own
# generators (bigserial/sequences, gen_random_uuid(), uuidv7() on 18) and, in
# case 6 where it is installed, pgEdge's snowflake.nextval().
#
# Run as root on Debian 12, from anywhere:   bash bench/run.sh
#
#   1. builds and installs the release build into PG_CONFIG's PostgreSQL
#      (default the system 15; cargo pgrx install --release --features pgNN),
#      and packages the same build into
#      bench/out/pkg (cargo pgrx package); BENCH_SKIP_INSTALL=1 skips both and
#      measures the installed library instead
#   2. runs bench/bench.py with the repo's venv (.venv: psycopg 3 from
#      tests/requirements.txt, matplotlib from bench/requirements.txt, both
#      installed when missing): two
#      throwaway servers as the postgres OS user in /tmp/sfbenchXXXXXX (the
#      default layout, and snowflake_id.layout = 'js53' for one row of case 1;
#      case 6 adds one with a small shared_buffers) running a private copy of
#      that build; always stopped at the end
#   3. prints the results and the goals (PASS/MISS), and writes bench/out/
#      results.csv, chart.svg (and chart.png), chart_insert.svg (and .png,
#      case 6), results.txt and meta.json
#
# bash bench/run.sh --help lists the knobs (no build, no servers).
#
# A full run takes about 15-18 minutes (case 6 alone, BENCH_CASES=6, about 7);
# BENCH_QUICK=1 about 2. The knobs (BENCH_REPS, BENCH_N, BENCH_CASES=1,3, ...)
# are listed in bench/README.md. Another PostgreSQL: PG_CONFIG=/path/to/pg_config.
# To publish a run: cp bench/out/{results.csv,chart.svg,chart_insert.svg,results.txt,profile.txt} bench/results/

set -euo pipefail
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    [[ -x $PY ]] || die "no .venv yet: run bash bench/run.sh once (as root)"
    exec "$PY" "$REPO_ROOT/bench/bench.py" --help
fi
bench_checks
bench_build
exec "$PY" "$REPO_ROOT/bench/bench.py" "$@"
