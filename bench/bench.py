#!/usr/bin/env python3
"""snowflake_id benchmarks, side by side with PostgreSQL's own generators.

Run it through bench/run.sh (which installs the release build first); see
bench/README.md for what each case measures. Everything is configured with
environment variables (defaults in brackets: full run / BENCH_QUICK=1):

  BENCH_QUICK=1             small sizes, 2 reps, short pgbench runs
  BENCH_REPS                repetitions of cases 1, 2 and 4         [5 / 2]
  BENCH_N                   IDs per statement, cases 1 and 2        [2000000 / 100000]
  BENCH_N_JS53              IDs per statement for the js53 layout   [500000 / 20000]
  BENCH_RATIO_ROUNDS        case 1's side-by-side rounds            [21 / 3]
  BENCH_RATIO_N             IDs per statement in those rounds       [1000000 / 100000]
  BENCH_BATCH_N             IDs per statement, case 4 (<= 1000000)  [1000000 / 100000]
  BENCH_PGBENCH_SECONDS     pgbench -T                              [3 / 1]
  BENCH_PGBENCH_REPS        repetitions of case 3                   [3 / 1]
  BENCH_CLIENTS             pgbench client counts                   [1,2,4,8,16 / 1,2,4]
  BENCH_CONNECTIONS         new connections in case 5               [200 / 40]
  BENCH_CASES               which cases to run                      [1,2,3,4,5,6,7]
  BENCH_INSERT_CLIENTS      pgbench client counts, case 6           [1,2]
  BENCH_INSERT_ROWS         rows of case 6's load, index in buffers [1000000 / 100000]
  BENCH_INSERT_ROWS_BIG     rows of case 6's small-buffers load     [3000000 / 300000]
  BENCH_INSERT_SHARED_BUFFERS  shared_buffers of that load's server [16MB / 2MB]
  BENCH_INSERT_BATCH        rows per INSERT statement, case 6 loads [1000]
  BENCH_INSERT_CHECKPOINT_EVERY  a CHECKPOINT every N rows (0: none) [250000 / 25000]
  BENCH_INSERT_REPS         repetitions of case 6's loads           [2 / 1]
  BENCH_BACKFILL_ROWS       rows per INSERT, case 7 (backfill)      [1000000 / 200000]
  BENCH_BACKFILL_REPS       repetitions of case 7                   [3 / 1]
  BENCH_OUT                 output directory                        [bench/out]
  BENCH_KEEP=1              keep the clusters' directories (logs) at the end
  BENCH_MAIN_LAYOUT         the main server's snowflake_id.layout   [classic]
  BENCH_MAX_LOAD            wait (up to BENCH_MAX_LOAD_WAIT s, default 900) until
                            the 1-minute load average is at most this, then start
  BENCH_PKG                 a `cargo pgrx package` directory to measure (run.sh
                            sets it); unset: the installed library and script
  BENCH_SKIP_INSTALL=1      (run.sh) no build: measure BENCH_PKG or the installed files

The servers (one with the default layout, one with snowflake_id.layout =
'js53' for that single row of case 1) run as the postgres OS user in
/tmp/sfbenchXXXXXX and are stopped at the end, also on errors and signals
(tests/harness.py's Cluster; servers of a killed run are stopped by the next).

Case 6 starts a third server of its own (shared_buffers =
BENCH_INSERT_SHARED_BUFFERS) for its last load. The cases are in
bench/cases/ (one module each), the tables, goals, CSV and charts in
bench/report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time

import config
from cases import CASES, ORDER
from config import DIR_PREFIX, MAX_LOAD, MAX_LOAD_WAIT, OUT, PKG, PUBLIC_KEY, log
from measure import R
from report import metadata, report
from servers import (AS_ROOT, TREE, Server, build_pg_tree, create_floor_functions, make_tree_dir,
                     pg_ids, stop_orphans)


def start_servers(stack: contextlib.ExitStack) -> tuple[Server, dict]:
    """The classic server (with the public key file of case 1), and the js53
    one when case 1 runs; each stopped and removed when `stack` closes.
    Returns the classic server and a connection to each, by name."""
    main_srv = Server(f"main ({config.MAIN_LAYOUT})",
                      {"snowflake_id.layout": config.MAIN_LAYOUT})
    stack.callback(main_srv.destroy)
    key_file = os.path.join(main_srv.dir, "public_keys")
    with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(PUBLIC_KEY + "\n")
    if AS_ROOT:
        os.chown(key_file, *pg_ids())
    main_srv.configure(**{"snowflake_id.public_key_file": key_file})
    servers = {"main": main_srv.start()}
    if "1" in config.CASES:
        # max_drift 1 s: the js53 row shows the layout's rate limit (64 IDs
        # per ms), not a minute of borrowed ticks.
        js_srv = Server("js53", {"snowflake_id.layout": "js53", "snowflake_id.max_drift": "1s"})
        stack.callback(js_srv.destroy)
        servers["js53"] = js_srv.start()
    log(f"servers up: {', '.join(f'{s.name} port {s.port} in {s.dir}' for s in servers.values())}")
    conns = {}
    for name, s in servers.items():
        with s.connect() as c:
            c.execute("CREATE EXTENSION snowflake_id")
            c.execute("CREATE SEQUENCE s1 CACHE 1")
            c.execute("CREATE SEQUENCE s1000 CACHE 1000")
            create_floor_functions(c)
        conns[name] = stack.enter_context(s.connect())
    if "js53" in conns:
        layout = conns["js53"].execute("SELECT preset FROM snowflake_layout()").fetchone()[0]
        assert layout == "js53", layout
    return main_srv, conns


def server_meta(conn) -> dict:
    return {
        "snowflake_layout_main": conn.execute(
            "SELECT preset || ' ' || worker_bits || '/' || sequence_bits || ' bits, unit ' "
            "|| time_unit_ms || ' ms' FROM snowflake_layout()").fetchone()[0],
        "pg_version": conn.execute(
            "SELECT current_setting('server_version')").fetchone()[0].split()[0],
        "pg_settings": dict(conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
            "('fsync', 'shared_buffers', 'data_checksums', 'full_page_writes', "
            "'synchronous_commit', 'jit', 'autovacuum', 'snowflake_id.max_drift', "
            "'snowflake_id.layout')").fetchall()),
    }


def run() -> int:
    stop_orphans(DIR_PREFIX, remove=True)
    if MAX_LOAD is not None:
        deadline = time.monotonic() + MAX_LOAD_WAIT
        while os.getloadavg()[0] > MAX_LOAD and time.monotonic() < deadline:
            log(f"load average {os.getloadavg()[0]:.1f} > BENCH_MAX_LOAD={MAX_LOAD}: waiting")
            time.sleep(20)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tree_dir = make_tree_dir()
        stack.callback(shutil.rmtree, tree_dir, ignore_errors=True)
        build_pg_tree(tree_dir, PKG)
        meta = metadata()
        log(f"measuring {TREE['source']}/snowflake_id.so (sha256 "
            f"{meta['library_sha256'][:12]}), copied to {tree_dir}")
        if not meta["is_target_release_build"]:
            log(f"WARNING: that library is not the build in {config.RELEASE_SO}: "
                "the numbers may not be of the release build")
        os.makedirs(OUT, exist_ok=True)
        main_srv, conns = start_servers(stack)
        meta.update(server_meta(conns["main"]))
        for case in ORDER:
            if case in config.CASES:
                before, t0 = os.getloadavg()[0], time.monotonic()
                CASES[case].run(conns, main_srv)
                R.case_info[case] = {"load_start": round(before, 2),
                                     "load_end": round(os.getloadavg()[0], 2),
                                     "seconds": round(time.monotonic() - t0, 1)}
        meta["cases"] = R.case_info
    meta["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    report(meta, OUT)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="bench/bench.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run as root (bench/run.sh checks it): the servers run as the postgres OS user.")
    ap.add_argument("--pg-tree", metavar="DIR",
                    help="only make the private PostgreSQL tree with the build to "
                         "measure in DIR and print its postgres (bench/profile.sh)")
    args = ap.parse_args()
    if args.pg_tree:
        print(build_pg_tree(args.pg_tree, PKG)["postgres"])
        return 0
    # SIGTERM as Ctrl-C: the `with` blocks stop and remove the servers.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run()
    except KeyboardInterrupt:
        log("interrupted; servers stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
