"""The benchmark's knobs (environment variables, read once at import) and
the settings every benchmark server shares. The list of knobs with their
full / quick defaults is bench.py's docstring (`bench/run.sh --help`) and
bench/README.md."""

from __future__ import annotations

import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE_SO = os.path.join(REPO, "target", "release", "libsnowflake_id.so")
DIR_PREFIX = "sfbench"  # /tmp/sfbenchXXXXXX: servers, private tree (profile.sh too)


def _env_int(name: str, full: int, quick: int) -> int:
    v = os.environ.get(name)
    return int(v.replace("_", "")) if v else (quick if QUICK else full)


QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = _env_int("BENCH_REPS", 5, 2)
N = _env_int("BENCH_N", 2_000_000, 100_000)
N_JS53 = _env_int("BENCH_N_JS53", 500_000, 20_000)
# Case 1's side-by-side rounds (snowflake_nextval() against clock_timestamp()
# and the floor): how many, and the rows of each statement.
RATIO_ROUNDS = _env_int("BENCH_RATIO_ROUNDS", 21, 3)
RATIO_N = _env_int("BENCH_RATIO_N", 1_000_000, 100_000)
BATCH_N = min(_env_int("BENCH_BATCH_N", 1_000_000, 100_000), 1_000_000)
PGB_SECONDS = _env_int("BENCH_PGBENCH_SECONDS", 3, 1)
PGB_REPS = _env_int("BENCH_PGBENCH_REPS", 3, 1)
CLIENTS = [int(c) for c in os.environ.get(
    "BENCH_CLIENTS", "1,2,4" if QUICK else "1,2,4,8,16").split(",")]
CONNECTIONS = _env_int("BENCH_CONNECTIONS", 200, 40)
MAX_LOAD = float(os.environ["BENCH_MAX_LOAD"]) if os.environ.get("BENCH_MAX_LOAD") else None
MAX_LOAD_WAIT = _env_int("BENCH_MAX_LOAD_WAIT", 900, 900)
CASES = {c.strip() for c in os.environ.get("BENCH_CASES", "1,2,3,4,5,6,7").split(",")}
# Case 6 (INSERT into logged tables): pgbench clients (-T BENCH_PGBENCH_SECONDS,
# BENCH_PGBENCH_REPS reps), the rows of the two batched loads (the index
# inside shared_buffers; then on a server whose shared_buffers it outgrows),
# rows per INSERT statement, a CHECKPOINT every so many rows (0: none) and
# the repetitions of the loads.
INSERT_CLIENTS = [int(c) for c in os.environ.get("BENCH_INSERT_CLIENTS", "1,2").split(",")]
INSERT_ROWS = _env_int("BENCH_INSERT_ROWS", 1_000_000, 100_000)
INSERT_ROWS_BIG = _env_int("BENCH_INSERT_ROWS_BIG", 3_000_000, 300_000)
INSERT_SHARED_BUFFERS = os.environ.get("BENCH_INSERT_SHARED_BUFFERS",
                                       "2MB" if QUICK else "16MB")
INSERT_BATCH = _env_int("BENCH_INSERT_BATCH", 1000, 1000)
INSERT_CHECKPOINT_EVERY = _env_int("BENCH_INSERT_CHECKPOINT_EVERY", 250_000, 25_000)
INSERT_REPS = _env_int("BENCH_INSERT_REPS", 2, 1)
# Case 7 (backfill): rows of the legacy table each INSERT reads, repetitions.
BACKFILL_ROWS = _env_int("BENCH_BACKFILL_ROWS", 1_000_000, 200_000)
BACKFILL_REPS = _env_int("BENCH_BACKFILL_REPS", 3, 1)
OUT = os.environ.get("BENCH_OUT", os.path.join(REPO, "bench", "out"))
KEEP = os.environ.get("BENCH_KEEP", "") not in ("", "0")
# The main server's layout preset (its rows keep the label "classic"; the
# results' metadata records the layout): pgedge is classic from another epoch.
MAIN_LAYOUT = os.environ.get("BENCH_MAIN_LAYOUT", "classic")
# `cargo pgrx package` output (run.sh makes it); unset: the installed files.
PKG = os.environ.get("BENCH_PKG") or None
NCPU = os.cpu_count() or 1

# Server settings shared by both benchmark servers. fsync stays on (the
# default): the extension's state file is fsynced regardless of it.
SERVER_SETTINGS = {
    "max_connections": 100,
    "shared_buffers": "512MB",
    "synchronous_commit": False,   # case 3 inserts: no WAL flush per commit
    "jit": False,                  # same plan execution for every expression
    "autovacuum": False,           # no background vacuum/analyze mid-run
    "max_wal_size": "8GB",         # no checkpoints during a run ...
    "checkpoint_timeout": "30min",  # ... by size or by time
    "logging_collector": False,
    "log_line_prefix": "%m [%p] ",
}

# A fixed key for case 1's snowflake_to_public() row (benchmark servers only).
PUBLIC_KEY = "000102030405060708090a0b0c0d0e0f"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

