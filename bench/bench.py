#!/usr/bin/env python3
"""snowflake_id benchmarks, side by side with PostgreSQL's own generators.

Run it through bench/run.sh (which installs the release build first); see
bench/README.md for what each case measures. Everything is configured with
environment variables (defaults in brackets: full run / BENCH_QUICK=1):

  BENCH_QUICK=1             small sizes, 2 reps, short pgbench runs
  BENCH_REPS                repetitions of cases 1, 2 and 4         [5 / 2]
  BENCH_N                   IDs per statement, cases 1 and 2        [2000000 / 100000]
  BENCH_N_JS53              IDs per statement for the js53 layout   [500000 / 20000]
  BENCH_BATCH_N             IDs per statement, case 4 (<= 1000000)  [1000000 / 100000]
  BENCH_PGBENCH_SECONDS     pgbench -T                              [3 / 1]
  BENCH_PGBENCH_REPS        repetitions of case 3                   [3 / 1]
  BENCH_CLIENTS             pgbench client counts                   [1,2,4,8,16 / 1,2,4]
  BENCH_CONNECTIONS         new connections in case 5               [200 / 40]
  BENCH_CASES               which cases to run                      [1,2,3,4,5]
  BENCH_OUT                 output directory                        [bench/out]
  BENCH_KEEP=1              keep the clusters' directories (logs) at the end
  BENCH_MAX_LOAD            wait (up to BENCH_MAX_LOAD_WAIT s, default 900) until
                            the 1-minute load average is at most this, then start
  BENCH_PKG                 a `cargo pgrx package` directory to measure (run.sh
                            sets it); unset: the installed library and script

The servers (one with the default layout, one with snowflake_id.layout =
'js53' for that single row of case 1) run as the postgres OS user in
/tmp/sfbenchXXXXXX and are stopped at the end, also on errors and signals.
"""

from __future__ import annotations

import atexit
import csv
import datetime as dt
import glob
import hashlib
import json
import os
import platform
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psycopg
from psycopg import pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
PG_BINDIR = subprocess.check_output([PG_CONFIG, "--bindir"], text=True).strip()
PG_PKGLIBDIR = subprocess.check_output([PG_CONFIG, "--pkglibdir"], text=True).strip()
PG_SHAREDIR = subprocess.check_output([PG_CONFIG, "--sharedir"], text=True).strip()
EXTENSION_SO = os.path.join(PG_PKGLIBDIR, "snowflake_id.so")
RELEASE_SO = os.path.join(REPO, "target", "release", "libsnowflake_id.so")
AS_ROOT = os.geteuid() == 0
DIR_PREFIX = "sfbench"


# --------------------------------------------------------------------- config
def _env_int(name: str, full: int, quick: int) -> int:
    v = os.environ.get(name)
    return int(v.replace("_", "")) if v else (quick if QUICK else full)


QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPS = _env_int("BENCH_REPS", 5, 2)
N = _env_int("BENCH_N", 2_000_000, 100_000)
N_JS53 = _env_int("BENCH_N_JS53", 500_000, 20_000)
BATCH_N = min(_env_int("BENCH_BATCH_N", 1_000_000, 100_000), 1_000_000)
PGB_SECONDS = _env_int("BENCH_PGBENCH_SECONDS", 3, 1)
PGB_REPS = _env_int("BENCH_PGBENCH_REPS", 3, 1)
CLIENTS = [int(c) for c in os.environ.get(
    "BENCH_CLIENTS", "1,2,4" if QUICK else "1,2,4,8,16").split(",")]
CONNECTIONS = _env_int("BENCH_CONNECTIONS", 200, 40)
MAX_LOAD = float(os.environ["BENCH_MAX_LOAD"]) if os.environ.get("BENCH_MAX_LOAD") else None
MAX_LOAD_WAIT = _env_int("BENCH_MAX_LOAD_WAIT", 900, 900)
CASES = {c.strip() for c in os.environ.get("BENCH_CASES", "1,2,3,4,5").split(",")}
OUT = os.environ.get("BENCH_OUT", os.path.join(REPO, "bench", "out"))
KEEP = os.environ.get("BENCH_KEEP", "") not in ("", "0")
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


# --------------------------------------------------------------------- server
# The cluster harness is the tests' one (tests/harness.py).
sys.path.insert(0, os.path.join(REPO, "tests"))
from harness import AS_ROOT, Cluster, _conf_value, _pg_ids, stop_orphans  # noqa: E402


def run_pg(cmd, check=True, timeout=300, input=None):
    """Run a PostgreSQL server binary, as the postgres OS user when root."""
    cmd = [str(c) for c in cmd]
    if AS_ROOT:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    proc = subprocess.run(cmd, cwd="/", input=input, capture_output=True,
                          text=True, timeout=timeout,
                          stdin=None if input is not None else subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"command failed (exit {proc.returncode}): "
                           f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return proc


def build_pg_tree(root: str, pkg: str | None) -> dict:
    """A private copy of the PostgreSQL installation with this build of
    snowflake_id, so that other builds installed into the system directories
    while the benchmark runs (cargo pgrx test installs a debug build there)
    cannot change what is measured.

    PostgreSQL finds $libdir and the extension scripts relative to its own
    executable, so the tree mirrors the installation's paths under `root`:
    a copy of the postgres binary, symlinks to every other file, and copies of
    snowflake_id.so, .control and .sql taken from `pkg` (the output of
    `cargo pgrx package`) or, without it, from the installed files."""
    def src(path: str) -> str:
        return os.path.join(pkg, path.lstrip("/")) if pkg else path

    bindir, libdir = root + PG_BINDIR, root + PG_PKGLIBDIR
    sharedir, extdir = root + PG_SHAREDIR, root + PG_SHAREDIR + "/extension"
    for d in (bindir, libdir, extdir):
        os.makedirs(d, exist_ok=True)
    shutil.copy2(os.path.join(PG_BINDIR, "postgres"), bindir)
    for name in os.listdir(PG_PKGLIBDIR):
        if name != "snowflake_id.so":
            os.symlink(os.path.join(PG_PKGLIBDIR, name), os.path.join(libdir, name))
    shutil.copy2(os.path.join(src(PG_PKGLIBDIR), "snowflake_id.so"), libdir)
    for name in os.listdir(PG_SHAREDIR):
        if name != "extension":
            os.symlink(os.path.join(PG_SHAREDIR, name), os.path.join(sharedir, name))
    sys_ext = os.path.join(PG_SHAREDIR, "extension")
    for name in os.listdir(sys_ext):
        if not name.startswith("snowflake_id"):
            os.symlink(os.path.join(sys_ext, name), os.path.join(extdir, name))
    copied = [n for n in os.listdir(src(sys_ext)) if n.startswith("snowflake_id")]
    if not any(n.endswith(".sql") for n in copied):
        raise RuntimeError(f"no snowflake_id SQL script in {src(sys_ext)}")
    for name in copied:
        shutil.copy2(os.path.join(src(sys_ext), name), extdir)
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o755)
    return {"postgres": os.path.join(bindir, "postgres"),
            "so": os.path.join(libdir, "snowflake_id.so"),
            "source": src(PG_PKGLIBDIR)}


def make_tree_dir() -> str:
    d = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp")
    with open(os.path.join(d, "owner.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    return d


TREE: dict = {}
_made: "list[Server]" = []  # every server directory made by this run


class Server(Cluster):
    """A throwaway cluster in /tmp/sfbenchXXXXXX (also the socket dir),
    started from the private tree's postgres (see build_pg_tree)."""

    def __init__(self, name: str, settings: dict):
        self.name = name
        # The harness's test defaults (fsync off, 120 connections...) are
        # replaced by the benchmark's settings: fsync stays on.
        super().__init__(preload=True, settings={"fsync": True, **SERVER_SETTINGS,
                                                 **settings},
                         dir_prefix=DIR_PREFIX, postgres=TREE["postgres"])
        _made.append(self)

    def start(self, env: dict | None = None, timeout: int = 60, **kw) -> "Server":
        super().start(env=env, timeout=timeout, **kw)
        with open(os.path.join(self.datadir, "postmaster.pid")) as f:
            pid = int(f.readline())
        with open(f"/proc/{pid}/maps") as f:
            mapped = {line.split()[-1] for line in f if "snowflake_id" in line}
        if mapped != {TREE["so"]}:
            raise RuntimeError(f"{self.name} server mapped {mapped}, not {TREE['so']}")
        return self

    def destroy(self, keep: bool = False) -> None:
        if KEEP:
            log(f"kept {self.name} server dir {self.dir}")
        super().destroy(keep=keep or KEEP)

    @property
    def conninfo(self) -> str:
        return f"host={self.dir} port={self.port} dbname=postgres user=postgres"

    def connect(self, dbname: str = "postgres", **kw) -> psycopg.Connection:
        # No server-side prepared statements: every rep plans alike.
        return super().connect(dbname=dbname, prepare_threshold=None, **kw)


def _stop_orphans() -> None:
    """Stops and removes servers left by an earlier run whose process died."""
    stop_orphans(DIR_PREFIX, remove=True)


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# -------------------------------------------------------------------- results
def summarize(values: list[float]) -> dict:
    v = sorted(values)
    med = statistics.median(v)
    if len(v) >= 2:
        q = statistics.quantiles(v, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = med
    return {"median": med, "min": v[0], "max": v[-1], "p25": p25, "p75": p75,
            "reps": len(v)}


@dataclass
class Metric:
    case: str
    variant: str
    metric: str
    unit: str
    values: list
    params: str = ""
    note: str = ""
    value: float | None = None  # the figure reported, when not the median

    @property
    def s(self) -> dict:
        return summarize(self.values)


@dataclass
class Results:
    metrics: list = field(default_factory=list)

    def add(self, case, variant, metric, unit, values, params="", note="", value=None):
        m = Metric(case, variant, metric, unit, list(values), params, note, value)
        self.metrics.append(m)
        return m

    def get(self, case, variant, metric) -> Metric | None:
        for m in self.metrics:
            if (m.case, m.variant, m.metric) == (case, variant, metric):
                return m
        return None


R = Results()
GOALS: list[dict] = []
CASE_INFO: dict = {}  # case -> 1-minute load average at its start and end, duration
META: dict = {}


def load_note(case: str) -> str:
    i = CASE_INFO.get(case)
    return (f"; {i['seconds']:.0f} s, load average {i['load_start']:.1f} → {i['load_end']:.1f}"
            if i else "")


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_spread(m: Metric | None) -> str:
    if m is None:
        return "-"
    s = m.s
    if s["reps"] < 2:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}]"


def fmt_iqr(m: Metric | None) -> str:
    if m is None:
        return "-"
    s = m.s
    return f"{fmt(s['median'])} [{fmt(s['p25'])}–{fmt(s['p75'])}]"


OUTPUT: list[str] = []


def out(line: str = "") -> None:
    print(line, flush=True)
    OUTPUT.append(line)


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> None:
    widths = [max(len(str(r[i])) for r in [headers] + rows)
              for i in range(len(headers))]

    def line(cells):
        parts = []
        for i, c in enumerate(cells):
            parts.append(str(c).rjust(widths[i]) if i in right
                         else str(c).ljust(widths[i]))
        return "  ".join(parts).rstrip()

    out("  " + line(headers))
    out("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        out("  " + line(r))


# ---------------------------------------------------------------- measurement
def backend_cpu_ns(conn: psycopg.Connection) -> int | None:
    """CPU time the connection's backend has run so far, in ns: the first
    field of /proc/<pid>/schedstat (the server runs on this machine)."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def timed(conn: psycopg.Connection, query: str) -> float:
    """Client-side seconds for one statement over a warm connection
    (unix socket; the round trip is ~0.1 ms, noise next to the runs)."""
    return timed_cpu(conn, query)[0]


def timed_cpu(conn: psycopg.Connection, query: str) -> tuple[float, float]:
    """(wall seconds as timed(), CPU seconds of the backend for the statement).

    Wall time is what a client sees, but on a machine busy with other work it
    also counts the time the backend waited for a CPU. The backend's CPU time
    does not, so it is the steadier estimate of the work per ID (it leaves
    out sleeping and I/O waits, e.g. js53 waiting for the clock)."""
    c0 = backend_cpu_ns(conn)
    t0 = time.perf_counter()
    cur = conn.execute(query)
    if cur.description is not None:
        cur.fetchall()
    wall = time.perf_counter() - t0
    c1 = backend_cpu_ns(conn)
    return wall, ((c1 - c0) / 1e9 if c0 is not None and c1 is not None else float("nan"))


def drift_state(conn) -> tuple[int, int]:
    """(current drift in ms, ticks exhausted so far) of this backend's worker."""
    row = conn.execute(
        "SELECT current_drift_ms, sequence_exhausted FROM snowflake_worker_status() "
        "WHERE pid = pg_backend_pid()").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def settle_drift(conn, limit_s: float = 10.0) -> None:
    """Waits until this backend's IDs no longer run ahead of the clock, so
    that every snowflake rep starts from the same state (no borrowed ticks)."""
    deadline = time.monotonic() + limit_s
    while True:
        drift, _ = drift_state(conn)
        if drift <= 0 or time.monotonic() > deadline:
            return
        time.sleep(min(drift / 1000 + 0.005, 1.0))


def series_query(expr: str, n: int) -> str:
    return f"SELECT count(x) FROM (SELECT {expr} x FROM generate_series(1, {n}) g) s"


# ------------------------------------------------------------------- case 1
CASE1 = [
    # key, label, expression, server, uses snowflake
    ("bare", "g (bare count)", "g", "main", False),
    ("random", "random()", "random()", "main", False),
    ("clock", "clock_timestamp()", "clock_timestamp()", "main", False),
    ("seq1", "nextval('s1')  CACHE 1", "nextval('s1')", "main", False),
    ("seq1000", "nextval('s1000')  CACHE 1000", "nextval('s1000')", "main", False),
    ("uuid", "gen_random_uuid()", "gen_random_uuid()", "main", False),
    ("snowflake", "snowflake_nextval()  classic", "snowflake_nextval()", "main", True),
    # The cheapest text form of a new ID (decimal): the floor under any
    # token, so that the token's own cost reads as the difference.
    ("text", "snowflake_nextval()::text", "snowflake_nextval()::text", "main", True),
    # Public IDs (issue 12): the token of each new ID; the main server's
    # snowflake_id.public_key_file holds PUBLIC_KEY.
    ("public", "snowflake_to_public(snowflake_nextval())",
     "snowflake_to_public(snowflake_nextval())", "main", True),
    ("bare_js53", "g (bare count, js53 server)", "g", "js53", False),
    ("snowflake_js53", "snowflake_nextval()  js53", "snowflake_nextval()", "js53", True),
]


def case1(conns: dict) -> None:
    log(f"case 1: single session, N={N:,} (js53: {N_JS53:,}), {REPS} reps")
    n_of = {k: (N_JS53 if srv == "js53" else N) for k, _, _, srv, _ in CASE1}
    for k, _, expr, srv, _ in CASE1:  # warm-up: claims, caches, plans
        conns[srv].execute(series_query(expr, min(n_of[k], 20_000))).fetchall()
    secs: dict[str, list[float]] = {k: [] for k, *_ in CASE1}
    cpus: dict[str, list[float]] = {k: [] for k, *_ in CASE1}
    drift_after: dict[str, list[float]] = {c[0]: [] for c in CASE1 if c[4]}
    for rep in range(REPS):
        order = CASE1[rep % len(CASE1):] + CASE1[:rep % len(CASE1)]
        for k, _, expr, srv, sf in order:
            c = conns[srv]
            if sf:
                settle_drift(c)
            wall, cpu = timed_cpu(c, series_query(expr, n_of[k]))
            secs[k].append(wall)
            cpus[k].append(cpu)
            if sf:
                drift_after[k].append(drift_state(c)[0])
        log(f"  rep {rep + 1}/{REPS}: " + ", ".join(
            f"{k} {secs[k][-1] * 1e9 / n_of[k]:.0f}" for k, *_ in CASE1) + " ns/ID")
    for k, label, expr, srv, sf in CASE1:
        n = n_of[k]
        base = "bare_js53" if srv == "js53" else "bare"
        per = [s * 1e9 / n for s in secs[k]]
        R.add("1_single_session", label, "seconds", "s", secs[k], f"N={n}")
        R.add("1_single_session", label, "ns_per_id", "ns", per, f"N={n}")
        R.add("1_single_session", label, "cpu_ns_per_id", "ns",
              [s * 1e9 / n for s in cpus[k]], f"N={n}", "CPU time of the backend")
        if k != base:
            above = [(s - b) * 1e9 / n for s, b in zip(secs[k], secs[base])]
            R.add("1_single_session", label, "ns_per_id_above_bare", "ns",
                  above, f"N={n}", "paired with the bare count of the same rep")
            R.add("1_single_session", label, "cpu_ns_per_id_above_bare", "ns",
                  [(s - b) * 1e9 / n for s, b in zip(cpus[k], cpus[base])], f"N={n}",
                  "CPU time of the backend, paired with the bare count of the same rep")
        if sf:
            R.add("1_single_session", label, "drift_after_rep", "ms",
                  drift_after[k], f"N={n}",
                  "how far the last ID ran ahead of the clock (bound: snowflake_id.max_drift)")


def report_case1() -> None:
    if R.get("1_single_session", CASE1[0][1], "ns_per_id") is None:
        return
    out()
    out("Case 1 - single session: SELECT count(x) FROM (SELECT <expr> x FROM "
        "generate_series(1, N)) s")
    out(f"         median [min–max] over {REPS} reps; wall: client-timed over a warm "
        f"unix-socket connection; CPU: the backend's CPU time{load_note('1')}")
    rows = []
    for k, label, expr, srv, sf in CASE1:
        g = lambda m: R.get("1_single_session", label, m)  # noqa: E731
        per = g("ns_per_id")
        if per is None:
            continue
        drift = g("drift_after_rep")
        rows.append([label, f"{int(per.params[2:]):,}", fmt_spread(per),
                     fmt_spread(g("ns_per_id_above_bare")) if g("ns_per_id_above_bare") else "-",
                     fmt(g("cpu_ns_per_id").s["median"]),
                     fmt_spread(g("cpu_ns_per_id_above_bare"))
                     if g("cpu_ns_per_id_above_bare") else "-",
                     f"{drift.s['median']:.0f} ms" if drift else ""])
    table(["expression", "N", "wall ns/ID", "wall above bare", "CPU ns/ID",
           "CPU above bare", "drift after"], rows, {1, 2, 3, 4, 5, 6})
    out("  drift after: how far the newest snowflake ran ahead of the wall clock "
        "after the rep (each rep starts at 0;")
    out("  ticks are borrowed when the sequence of a tick is used up, up to "
        "snowflake_id.max_drift = 1000 ms, then it waits).")


# ------------------------------------------------------------------- case 2
BULK = [
    ("bigserial", "bulk_bigserial", "id bigserial PRIMARY KEY"),
    ("bigint + sequence CACHE 1000", "bulk_seq1000",
     "id bigint PRIMARY KEY DEFAULT nextval('bulk_s1000')"),
    ("uuid gen_random_uuid()", "bulk_uuid", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()"),
    ("bigint snowflake_nextval()", "bulk_snowflake",
     "id bigint PRIMARY KEY DEFAULT snowflake_nextval()"),
]


def case2(conn) -> None:
    log(f"case 2: bulk load of {N:,} rows into UNLOGGED tables, {REPS} reps")
    conn.execute("CREATE UNLOGGED SEQUENCE bulk_s1000 CACHE 1000")
    for _, t, cols in BULK:
        conn.execute(f"CREATE UNLOGGED TABLE {t} ({cols})")
    for _, t, _ in BULK:  # warm-up
        conn.execute(f"INSERT INTO {t} SELECT FROM generate_series(1, 10000)")
        conn.execute(f"TRUNCATE {t}")
    secs = {t: [] for _, t, _ in BULK}
    cpus = {t: [] for _, t, _ in BULK}
    for rep in range(REPS):
        order = BULK[rep % len(BULK):] + BULK[:rep % len(BULK)]
        for label, t, _ in order:
            conn.execute(f"TRUNCATE {t}")
            if t == "bulk_snowflake":
                settle_drift(conn)
            wall, cpu = timed_cpu(conn, f"INSERT INTO {t} SELECT FROM generate_series(1, {N})")
            secs[t].append(wall)
            cpus[t].append(cpu)
        for _, t, _ in BULK:
            conn.execute(f"TRUNCATE {t}")
        log(f"  rep {rep + 1}/{REPS}: " + ", ".join(
            f"{t} {secs[t][-1]:.2f}s" for _, t, _ in BULK))
    for label, t, _ in BULK:
        R.add("2_bulk_load", label, "seconds", "s", secs[t], f"N={N}")
        R.add("2_bulk_load", label, "ratio_to_bigserial", "x",
              [a / b for a, b in zip(secs[t], secs["bulk_bigserial"])], f"N={N}",
              "per rep, paired")
        R.add("2_bulk_load", label, "ns_per_row", "ns",
              [s * 1e9 / N for s in secs[t]], f"N={N}")
        R.add("2_bulk_load", label, "cpu_seconds", "s", cpus[t], f"N={N}",
              "CPU time of the backend")
        R.add("2_bulk_load", label, "cpu_ratio_to_bigserial", "x",
              [a / b for a, b in zip(cpus[t], cpus["bulk_bigserial"])], f"N={N}",
              "CPU time of the backend, per rep, paired")


def report_case2() -> None:
    if R.get("2_bulk_load", BULK[0][0], "seconds") is None:
        return
    out()
    out(f"Case 2 - bulk load: INSERT INTO t SELECT FROM generate_series(1, {N:,}) "
        "into an UNLOGGED table with its primary key")
    out(f"         median [min–max] over {REPS} reps, table truncated before each{load_note('2')}")
    rows = []
    for label, t, _ in BULK:
        s = R.get("2_bulk_load", label, "seconds")
        if s is None:
            return
        rows.append([label, fmt_spread(s),
                     fmt_spread(R.get("2_bulk_load", label, "ns_per_row")),
                     fmt_spread(R.get("2_bulk_load", label, "ratio_to_bigserial")),
                     fmt_spread(R.get("2_bulk_load", label, "cpu_seconds")),
                     fmt_spread(R.get("2_bulk_load", label, "cpu_ratio_to_bigserial"))])
    table(["key", "wall seconds", "wall ns/row", "wall × bigserial", "CPU seconds",
           "CPU × bigserial"], rows, {1, 2, 3, 4, 5})


# ------------------------------------------------------------------- case 3
PGB_SCRIPTS = [
    ("SELECT snowflake_nextval()", "sel_snowflake", "SELECT snowflake_nextval();", None),
    ("SELECT nextval('s')", "sel_nextval", "SELECT nextval('s');", None),
    ("INSERT bigserial", "ins_bigserial", "INSERT INTO pgb_bigserial DEFAULT VALUES;",
     "pgb_bigserial"),
    ("INSERT seq CACHE 1000", "ins_seq1000", "INSERT INTO pgb_seq1000 DEFAULT VALUES;",
     "pgb_seq1000"),
    ("INSERT uuid", "ins_uuid", "INSERT INTO pgb_uuid DEFAULT VALUES;", "pgb_uuid"),
    ("INSERT snowflake", "ins_snowflake", "INSERT INTO pgb_snowflake DEFAULT VALUES;",
     "pgb_snowflake"),
]


def run_pgbench(srv: Server, script: str, clients: int, seconds: int) -> dict:
    cmd = [f"{PG_BINDIR}/pgbench", "-h", srv.dir, "-p", str(srv.port),
           "-U", "postgres", "-n", "-M", "prepared", "-T", str(seconds),
           "-c", str(clients), "-j", str(min(clients, NCPU)), "-f", script,
           "postgres"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120,
                       stdin=subprocess.DEVNULL)
    text = p.stdout + p.stderr
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"pgbench failed (exit {p.returncode}): {' '.join(cmd)}\n{text}")
    lat = re.search(r"latency average = ([0-9.]+) ms", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    return {"tps": float(m.group(1)),
            "latency_ms": float(lat.group(1)) if lat else float("nan"),
            "failed": int(failed.group(1)) if failed else 0}


def case3(srv: Server, conn) -> None:
    log(f"case 3: pgbench -T {PGB_SECONDS} -M prepared, clients {CLIENTS}, "
        f"{PGB_REPS} reps ({len(PGB_SCRIPTS) * len(CLIENTS) * PGB_REPS} runs)")
    conn.execute("CREATE SEQUENCE s")
    conn.execute("CREATE SEQUENCE pgb_s1000 CACHE 1000")
    conn.execute("CREATE TABLE pgb_bigserial (id bigserial PRIMARY KEY)")
    conn.execute("CREATE TABLE pgb_seq1000 (id bigint PRIMARY KEY DEFAULT nextval('pgb_s1000'))")
    conn.execute("CREATE TABLE pgb_uuid (id uuid PRIMARY KEY DEFAULT gen_random_uuid())")
    conn.execute("CREATE TABLE pgb_snowflake (id bigint PRIMARY KEY DEFAULT snowflake_nextval())")
    files = {}
    for _, key, sql, _ in PGB_SCRIPTS:
        files[key] = os.path.join(srv.dir, f"{key}.sql")
        with open(files[key], "w") as f:
            f.write(sql + "\n")
    for _, key, _, _ in PGB_SCRIPTS:  # warm-up
        run_pgbench(srv, files[key], 1, 1)
    tps: dict = {(k, c): [] for _, k, _, _ in PGB_SCRIPTS for c in CLIENTS}
    lat: dict = {(k, c): [] for _, k, _, _ in PGB_SCRIPTS for c in CLIENTS}
    failed = 0
    for rep in range(PGB_REPS):
        for ci, clients in enumerate(CLIENTS):
            shift = (rep + ci) % len(PGB_SCRIPTS)
            for label, key, _, table_ in PGB_SCRIPTS[shift:] + PGB_SCRIPTS[:shift]:
                if table_:
                    conn.execute(f"TRUNCATE {table_}")
                r = run_pgbench(srv, files[key], clients, PGB_SECONDS)
                tps[(key, clients)].append(r["tps"])
                lat[(key, clients)].append(r["latency_ms"])
                failed += r["failed"]
            log(f"  rep {rep + 1}/{PGB_REPS}, {clients:>2} clients: " + ", ".join(
                f"{k} {tps[(k, clients)][-1]:,.0f}" for _, k, _, _ in PGB_SCRIPTS) + " tps")
    for label, key, _, _ in PGB_SCRIPTS:
        for c in CLIENTS:
            R.add("3_concurrency", f"{label} | clients={c}", "tps", "tps",
                  tps[(key, c)], f"T={PGB_SECONDS}s clients={c}")
            R.add("3_concurrency", f"{label} | clients={c}", "latency_avg", "ms",
                  lat[(key, c)], f"T={PGB_SECONDS}s clients={c}")
        if 1 in CLIENTS and 2 in CLIENTS:
            R.add("3_concurrency", label, "scaling_1_to_2_clients", "x",
                  [b / a for a, b in zip(tps[(key, 1)], tps[(key, 2)])],
                  f"T={PGB_SECONDS}s", "tps(2 clients) / tps(1 client), per rep")
    if failed:
        log(f"  WARNING: pgbench reported {failed} failed transactions")


def report_case3() -> None:
    if R.get("3_concurrency", f"{PGB_SCRIPTS[0][0]} | clients={CLIENTS[0]}", "tps") is None:
        return
    out()
    out(f"Case 3 - concurrency: pgbench -n -M prepared -T {PGB_SECONDS}, one "
        f"statement per transaction, synchronous_commit = off")
    out(f"         TPS, median of {PGB_REPS} reps (min–max in bench/out/results.csv); "
        f"{NCPU} CPUs, pgbench threads = min(clients, {NCPU}){load_note('3')}")
    rows = []
    for label, key, _, _ in PGB_SCRIPTS:
        row = [label]
        for c in CLIENTS:
            row.append(fmt(R.get("3_concurrency", f"{label} | clients={c}", "tps").s["median"]))
        sc = R.get("3_concurrency", label, "scaling_1_to_2_clients")
        row.append(fmt_spread(sc) if sc else "-")
        rows.append(row)
    table(["script"] + [f"{c} cl" for c in CLIENTS] + ["2 cl / 1 cl"], rows,
          set(range(1, len(CLIENTS) + 2)))


# ------------------------------------------------------------------- case 4
def case4(conn) -> None:
    n = BATCH_N
    log(f"case 4: batch vs single, N={n:,}, {REPS} reps")
    qs = [("bare", series_query("g", n), False),
          ("single", series_query("snowflake_nextval()", n), True),
          ("batch", f"SELECT count(*) FROM snowflake_nextvals({n})", True)]
    for _, q, _ in qs:
        conn.execute(q.replace(str(n), "1000")).fetchall()
    secs = {k: [] for k, _, _ in qs}
    cpus = {k: [] for k, _, _ in qs}
    for rep in range(REPS):
        for k, q, sf in qs[rep % 3:] + qs[:rep % 3]:
            if sf:
                settle_drift(conn)
            wall, cpu = timed_cpu(conn, q)
            secs[k].append(wall)
            cpus[k].append(cpu)
    for k, _, _ in qs:
        R.add("4_batch", CASE4_LABELS[k], "ns_per_id", "ns",
              [s * 1e9 / n for s in secs[k]], f"N={n}")
        R.add("4_batch", CASE4_LABELS[k], "cpu_ns_per_id", "ns",
              [s * 1e9 / n for s in cpus[k]], f"N={n}", "CPU time of the backend")
    for k in ("single", "batch"):
        R.add("4_batch", CASE4_LABELS[k], "ns_per_id_above_bare", "ns",
              [(a - b) * 1e9 / n for a, b in zip(secs[k], secs["bare"])], f"N={n}")
        R.add("4_batch", CASE4_LABELS[k], "cpu_ns_per_id_above_bare", "ns",
              [(a - b) * 1e9 / n for a, b in zip(cpus[k], cpus["bare"])], f"N={n}",
              "CPU time of the backend")
    R.add("4_batch", "single / batch", "ratio", "x",
          [a / b for a, b in zip(secs["single"], secs["batch"])], f"N={n}",
          "wall time of the single form over the batch form, per rep")
    R.add("4_batch", "single / batch", "cpu_ratio", "x",
          [a / b for a, b in zip(cpus["single"], cpus["batch"])], f"N={n}",
          "CPU time of the single form over the batch form, per rep")


CASE4_LABELS = {"bare": "generate_series count (bare)",
                "single": "snowflake_nextval() over generate_series",
                "batch": "snowflake_nextvals(n)"}


def report_case4() -> None:
    if R.get("4_batch", CASE4_LABELS["batch"], "ns_per_id") is None:
        return
    out()
    out(f"Case 4 - batch vs single: SELECT count(*) FROM snowflake_nextvals({BATCH_N:,}) "
        f"vs the single form over generate_series")
    out(f"         median [min–max] over {REPS} reps{load_note('4')}")
    rows = []
    for k in ("bare", "single", "batch"):
        g = lambda m: R.get("4_batch", CASE4_LABELS[k], m)  # noqa: E731
        rows.append([CASE4_LABELS[k], fmt_spread(g("ns_per_id")),
                     fmt_spread(g("ns_per_id_above_bare")) if k != "bare" else "",
                     fmt_spread(g("cpu_ns_per_id")),
                     fmt_spread(g("cpu_ns_per_id_above_bare")) if k != "bare" else ""])
    table(["form", "wall ns/ID", "wall above bare", "CPU ns/ID", "CPU above bare"],
          rows, {1, 2, 3, 4})
    out(f"  single / batch time: wall {fmt_spread(R.get('4_batch', 'single / batch', 'ratio'))} ×,"
        f" CPU {fmt_spread(R.get('4_batch', 'single / batch', 'cpu_ratio'))} ×")


# ------------------------------------------------------------------- case 5
def case5(srv: Server) -> None:
    k = CONNECTIONS
    log(f"case 5: first call in {k} new connections (half snowflake_nextval(), "
        "half nextval('s1'))")
    conninfo = srv.conninfo.encode()
    gens = [("snowflake_nextval()", "snowflake_nextval()"), ("nextval('s1')", "nextval('s1')")]
    data = {g: {m: [] for m in ("connect", "select1_first", "select1_warm", "call1_client",
                                "call2_client", "call3_client", "call1_server",
                                "call2_server")} for g, _ in gens}

    def run(pg, q: str) -> tuple[float, list]:
        t0 = time.perf_counter()
        res = pg.exec_(q.encode())
        dt_ = time.perf_counter() - t0
        if res.status != pq.ExecStatus.TUPLES_OK:
            raise RuntimeError(f"{q}: {pg.error_message.decode()}")
        vals = [res.get_value(0, i) for i in range(res.nfields)]
        return dt_ * 1e6, vals

    for i in range(k):
        g, expr = gens[i % 2]
        d = data[g]
        t0 = time.perf_counter()
        pg = pq.PGconn.connect(conninfo)
        d["connect"].append((time.perf_counter() - t0) * 1e6)
        if pg.status != pq.ConnStatus.OK:
            raise RuntimeError(f"connect failed: {pg.error_message.decode()}")
        try:
            d["select1_first"].append(run(pg, "SELECT 1")[0])
            d["select1_warm"].append(run(pg, "SELECT 1")[0])
            # The call sits between two clock_timestamp()s of one target list:
            # the difference is the server-side time of the call itself.
            q = (f"SELECT (extract(epoch FROM b - a) * 1e6)::int FROM (SELECT "
                 f"clock_timestamp() a, {expr} v, clock_timestamp() b OFFSET 0) s")
            for n in (1, 2, 3):
                us, vals = run(pg, q)
                d[f"call{n}_client"].append(us)
                if n <= 2:
                    d[f"call{n}_server"].append(float(vals[0]))
        finally:
            pg.finish()
    for g, _ in gens:
        d = data[g]
        for m, vals in d.items():
            R.add("5_first_call", g, m, "us", vals, f"connections={len(vals)}")
        R.add("5_first_call", g, "first_minus_second_client", "us",
              [a - b for a, b in zip(d["call1_client"], d["call2_client"])],
              f"connections={len(d['connect'])}")


def report_case5() -> None:
    if R.get("5_first_call", "snowflake_nextval()", "connect") is None:
        return
    out()
    out("Case 5 - first call in a new connection (worker claim) vs later calls, "
        f"{CONNECTIONS // 2} new connections each{load_note('5')}")
    out("         µs, median [p25–p75] over connections; client = round trip timed "
        "by the client (libpq, unix socket);")
    out("         server = time between two clock_timestamp() around the call in "
        "the same target list (1 µs resolution)")
    names = [("connect", "connect (client)"), ("select1_first", "first SELECT 1 (client)"),
             ("select1_warm", "second SELECT 1 (client, round-trip baseline)"),
             ("call1_client", "1st call statement (client)"),
             ("call2_client", "2nd call statement (client)"),
             ("call3_client", "3rd call statement (client)"),
             ("first_minus_second_client", "1st − 2nd statement (client)"),
             ("call1_server", "1st call (server)"), ("call2_server", "2nd call (server)")]
    rows = [[label, fmt_iqr(R.get("5_first_call", "snowflake_nextval()", m)),
             fmt_iqr(R.get("5_first_call", "nextval('s1')", m))] for m, label in names]
    table(["µs", "snowflake_nextval()", "nextval('s1')  (reference)"], rows, {1, 2})


# --------------------------------------------------------------------- goals
def goals() -> None:
    def add(name, basis, m: Metric | None, limit, better, unit, detail="", spread=None):
        """m: the metric whose median is the measured figure; spread: the
        per-rep values behind it (default m's own): their min–max, and how
        many of them meet the goal on their own."""
        if m is None:
            GOALS.append({"goal": name, "basis": basis, "status": "n/a", "measured": None,
                          "unit": unit, "limit": limit, "detail": "case not run",
                          "values": [], "reps_meeting": ""})
            return
        meets = (lambda x: x <= limit) if better == "le" else (lambda x: x >= limit)
        v = m.s["median"]
        values = spread or m.values
        GOALS.append({"goal": name, "basis": basis, "status": "PASS" if meets(v) else "MISS",
                      "measured": v, "unit": unit, "limit": limit, "values": values,
                      "reps_meeting": f"{sum(map(meets, values))}/{len(values)}",
                      "detail": detail or f"[{fmt(min(values))}–{fmt(max(values))}]"})

    def ratio_goal(basis, metric):
        """snowflake above bare over nextval CACHE 1 above bare: the ratio of
        the two medians (a per-rep ratio is unstable when its denominator is
        small and noisy); the per-rep ratios give the spread."""
        sf = R.get("1_single_session", "snowflake_nextval()  classic", metric)
        seq = R.get("1_single_session", "nextval('s1')  CACHE 1", metric)
        if not (sf and seq and seq.s["median"] > 0):
            add("snowflake_nextval() ≤ 1/5 of nextval CACHE 1 above bare", basis, None,
                0.2, "le", "x")
            return
        per_rep = [a / b for a, b in zip(sf.values, seq.values) if b > 0]
        add("snowflake_nextval() ≤ 1/5 of nextval CACHE 1 above bare", basis,
            Metric("goal", "", "", "x", [sf.s["median"] / seq.s["median"]]), 0.2, "le", "x",
            f"{fmt(sf.s['median'])} ns / {fmt(seq.s['median'])} ns; per-rep "
            f"[{fmt(min(per_rep))}–{fmt(max(per_rep))}]" if per_rep else "",
            spread=per_rep)

    sf_wall = R.get("1_single_session", "snowflake_nextval()  classic", "ns_per_id_above_bare")
    sf_cpu = R.get("1_single_session", "snowflake_nextval()  classic", "cpu_ns_per_id_above_bare")
    add("snowflake_nextval() ≤ 60 ns/ID above bare", "wall", sf_wall, 60, "le", "ns")
    add("snowflake_nextval() ≤ 60 ns/ID above bare", "CPU", sf_cpu, 60, "le", "ns")
    pub = "snowflake_to_public(snowflake_nextval())"
    add(f"{pub} < 100 ns/ID above bare", "wall",
        R.get("1_single_session", pub, "ns_per_id_above_bare"), 100, "le", "ns")
    add(f"{pub} < 100 ns/ID above bare", "CPU",
        R.get("1_single_session", pub, "cpu_ns_per_id_above_bare"), 100, "le", "ns")
    ratio_goal("wall", "ns_per_id_above_bare")
    ratio_goal("CPU", "cpu_ns_per_id_above_bare")
    add("bulk load ≤ 1.0 × bigserial", "wall", R.get(
        "2_bulk_load", "bigint snowflake_nextval()", "ratio_to_bigserial"), 1.0, "le", "x")
    add("bulk load ≤ 1.0 × bigserial", "CPU", R.get(
        "2_bulk_load", "bigint snowflake_nextval()", "cpu_ratio_to_bigserial"), 1.0, "le", "x")
    add("2 clients ≥ 1.8 × 1 client, SELECT snowflake_nextval()", "TPS",
        R.get("3_concurrency", "SELECT snowflake_nextval()", "scaling_1_to_2_clients"),
        1.8, "ge", "x")
    add("2 clients ≥ 1.8 × 1 client, INSERT snowflake key", "TPS",
        R.get("3_concurrency", "INSERT snowflake", "scaling_1_to_2_clients"), 1.8, "ge", "x")
    out()
    out("Goals: PASS/MISS by the median across reps; 'reps' = how many single reps meet "
        "the goal on their own")
    out("       wall = elapsed time as a client sees it (what the goals are about); CPU = "
        "the backend's CPU time, the")
    out("       cross-check that other work on the machine does not disturb "
        f"(load average at start {META.get('loadavg_start', '?')})")
    rows = [[g["status"], g["goal"], g["basis"],
             f"{fmt(g['measured'])} {g['unit']}" if g["measured"] is not None else "-",
             g["reps_meeting"], g["detail"]] for g in GOALS]
    table(["", "goal", "basis", "measured", "reps", "spread"], rows, {3, 4})
    for g in GOALS:
        R.add("goals", f"{g['goal']} ({g['basis']})", "measured", g["unit"],
              g["values"] or [float("nan")], f"limit={g['limit']}",
              f"{g['status']}; reps meeting it: {g['reps_meeting']}",
              value=g["measured"] if g["measured"] is not None else float("nan"))


# ---------------------------------------------------------------- outputs
def write_csv(path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "variant", "metric", "value", "unit", "median", "min", "max",
                    "p25", "p75", "reps", "params", "note"])
        for m in R.metrics:
            s = m.s
            r = lambda x: f"{x:.6g}"  # noqa: E731
            value = s["median"] if m.value is None else m.value
            w.writerow([m.case, m.variant, m.metric, r(value), m.unit, r(s["median"]),
                        r(s["min"]), r(s["max"]), r(s["p25"]), r(s["p75"]), s["reps"],
                        m.params, m.note])


def _esc(s: str) -> str:
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def write_svg(path: str, meta: dict) -> None:
    """A hand-written horizontal bar chart: case 1 (ns/ID above bare, with
    min–max whiskers), case 2 (× bigserial) and case 3 (TPS by clients)."""
    W, LW, RW = 980, 300, 190  # width, label column, right margin
    PW = W - LW - RW            # plot width
    font = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'
    parts: list[str] = []
    y = 20
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
              "#b07aa1", "#9c755f"]

    def text(x, y_, s, size=12, anchor="start", weight="normal", fill="#222"):
        parts.append(f'<text x="{x:.1f}" y="{y_:.1f}" font-size="{size}" '
                     f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}" '
                     f'{font}>{_esc(s)}</text>')

    def axis(y0, y1, vmax, unit):
        steps = nice_ticks(vmax)
        for t in steps:
            x = LW + PW * t / vmax
            parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" '
                         'stroke="#ddd" stroke-width="1"/>')
            text(x, y1 + 14, f"{t:,.0f}" if steps[1:2] and steps[1] >= 1 else fmt(t),
                 10, "middle", fill="#555")
        text(LW + PW, y1 + 28, unit, 10, "end", fill="#555")

    def bars(title, subtitle, items, unit, cap_outliers=True):
        """items: (label, median, lo, hi, color, annotation)."""
        nonlocal y
        if not items:
            return
        text(10, y + 14, title, 15, weight="bold")
        text(10, y + 31, subtitle, 11, fill="#555")
        y += 44
        vals = sorted(max(i[1], i[3] if i[3] is not None else 0) for i in items)
        vmax = vals[-1]
        if cap_outliers and len(vals) > 2 and vals[-1] > 4 * vals[-2] > 0:
            vmax = vals[-2] * 1.25  # keep the others readable; clipped bars are marked
        vmax = max(vmax, 1e-9)
        bh, gap = 16, 6
        y0 = y
        axis_y1 = y + len(items) * (bh + gap)
        axis(y0 - 4, axis_y1, vmax, unit)
        for label, med, lo, hi, color, ann in items:
            clipped = med > vmax
            w = PW * min(max(med, 0), vmax) / vmax
            text(LW - 8, y + bh - 4, label, 11, "end")
            parts.append(f'<rect x="{LW}" y="{y}" width="{w:.1f}" height="{bh}" '
                         f'fill="{color}"/>')
            if clipped:
                x = LW + w
                parts.append(f'<path d="M{x - 10:.1f},{y - 1} l6,{bh / 2 + 1} l-6,{bh / 2 + 1}" '
                             'stroke="#fff" stroke-width="3" fill="none"/>')
            elif lo is not None and hi is not None:
                x1 = LW + PW * max(lo, 0) / vmax
                x2 = LW + PW * min(hi, vmax) / vmax
                ym = y + bh / 2
                parts.append(f'<line x1="{x1:.1f}" y1="{ym}" x2="{x2:.1f}" y2="{ym}" '
                             'stroke="#222" stroke-width="1.2"/>')
                for xx in (x1, x2):
                    parts.append(f'<line x1="{xx:.1f}" y1="{ym - 4}" x2="{xx:.1f}" '
                                 f'y2="{ym + 4}" stroke="#222" stroke-width="1.2"/>')
            label_x = LW + min(w, PW) + 6
            if not clipped and hi is not None:
                label_x = max(label_x, LW + PW * min(hi, vmax) / vmax + 6)
            text(min(label_x, LW + PW + 4), y + bh - 4,
                 fmt(med) + (" (clipped)" if clipped else "") + (f"  {ann}" if ann else ""),
                 10, fill="#222")
            y += bh + gap
        y = axis_y1 + 44

    # Case 1
    items = []
    for i, (k, label, expr, srv, sf) in enumerate(CASE1):
        m = R.get("1_single_session", label, "ns_per_id_above_bare")
        if m is None:
            continue
        s = m.s
        color = "#e15759" if sf else "#4e79a7"
        items.append((label, s["median"], s["min"], s["max"], color, ""))
    bars("Case 1 — ns per ID above the bare generate_series count (single session)",
         f"N = {N:,} IDs per statement (js53: {N_JS53:,}); median, whiskers min–max "
         f"over {REPS} reps; lower is better", items, "ns per ID")

    # Case 2
    items = []
    for label, t, _ in BULK:
        m = R.get("2_bulk_load", label, "seconds")
        if m is None:
            continue
        s = m.s
        r = R.get("2_bulk_load", label, "ratio_to_bigserial").s["median"]
        items.append((label, s["median"], s["min"], s["max"],
                      "#e15759" if "snowflake" in label else "#4e79a7", f"({r:.2f}× bigserial)"))
    bars("Case 2 — bulk load, seconds for one INSERT … SELECT FROM generate_series",
         f"{N:,} rows into an UNLOGGED table with the primary-key index; median, "
         f"whiskers min–max over {REPS} reps; lower is better", items, "seconds",
         cap_outliers=False)

    # Case 3
    items = []
    for label, key, _, _ in PGB_SCRIPTS:
        for ci, c in enumerate(CLIENTS):
            m = R.get("3_concurrency", f"{label} | clients={c}", "tps")
            if m is None:
                continue
            s = m.s
            items.append((f"{label}, {c} cl", s["median"], s["min"], s["max"],
                          colors[ci % len(colors)], ""))
    bars("Case 3 — pgbench TPS by number of clients",
         f"-M prepared -T {PGB_SECONDS}, {NCPU} CPUs; median, whiskers min–max "
         f"over {PGB_REPS} reps; higher is better", items, "transactions per second",
         cap_outliers=False)

    text(10, y - 8, f"snowflake_id {meta.get('git_commit', '')[:10]}"
         f"{' (dirty)' if meta.get('git_dirty') else ''} · {meta.get('date', '')} · "
         f"PostgreSQL {meta.get('pg_version', '')} · {NCPU} CPUs · "
         f"load avg at start {meta.get('loadavg_start', '')}", 10, fill="#777")
    H = y + 4
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}">\n<rect width="100%" height="100%" fill="#fff"/>\n'
           + "\n".join(parts) + "\n</svg>\n")
    with open(path, "w") as f:
        f.write(svg)


def nice_ticks(vmax: float) -> list[float]:
    if vmax <= 0:
        return [0]
    raw = vmax / 5
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks, t = [], 0.0
    while t <= vmax * 1.0001:
        ticks.append(t)
        t += step
    return ticks


# ---------------------------------------------------------------- metadata
def sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def metadata() -> dict:
    def cmd(*a):
        try:
            return subprocess.check_output(a, text=True, cwd=REPO,
                                           stderr=subprocess.DEVNULL).strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    cpu = ""
    try:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                    if l.startswith("model name")), "")
    except OSError:
        pass
    so = sha256(TREE["so"])
    return {
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "git_commit": cmd("git", "rev-parse", "HEAD"),
        "git_dirty": bool(cmd("git", "status", "--porcelain", "--", "src", "Cargo.toml")),
        "library_source": TREE["source"],
        "library_sha256": so,
        "is_target_release_build": so is not None and so == sha256(RELEASE_SO),
        "installed_library_is_the_same": so == sha256(EXTENSION_SO),
        "pg_version": "",  # filled in from the server
        "cpu": cpu, "ncpu": NCPU, "kernel": platform.release(),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "quick": QUICK,
        "params": {"reps": REPS, "n": N, "n_js53": N_JS53, "batch_n": BATCH_N,
                   "pgbench_seconds": PGB_SECONDS, "pgbench_reps": PGB_REPS,
                   "clients": CLIENTS, "connections": CONNECTIONS,
                   "cases": sorted(CASES)},
        "server_settings": {k: _conf_value(v) for k, v in SERVER_SETTINGS.items()},
    }


# -------------------------------------------------------------------- main
def main() -> int:
    signal.signal(signal.SIGTERM, _sigterm)
    if sys.argv[1:2] == ["--pg-tree"]:  # for bench/profile.sh
        TREE.update(build_pg_tree(sys.argv[2], PKG))
        print(TREE["postgres"])
        return 0
    _stop_orphans()
    if MAX_LOAD is not None:
        deadline = time.monotonic() + MAX_LOAD_WAIT
        while os.getloadavg()[0] > MAX_LOAD and time.monotonic() < deadline:
            log(f"load average {os.getloadavg()[0]:.1f} > BENCH_MAX_LOAD={MAX_LOAD}: waiting")
            time.sleep(20)
    started = time.monotonic()
    tree_dir = make_tree_dir()
    servers = _made
    conns: dict = {}
    try:
        TREE.update(build_pg_tree(tree_dir, PKG))
        meta = metadata()
        META.update(meta)
        log(f"measuring {TREE['source']}/snowflake_id.so (sha256 "
            f"{meta['library_sha256'][:12]}), copied to {tree_dir}")
        if not meta["is_target_release_build"]:
            log(f"WARNING: that library is not the build in {RELEASE_SO}: "
                "the numbers may not be of the release build")
        os.makedirs(OUT, exist_ok=True)
        main_srv = Server("main (classic)", {})
        key_file = os.path.join(main_srv.dir, "public_keys")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(PUBLIC_KEY + "\n")
        if AS_ROOT:
            os.chown(key_file, *_pg_ids())
        main_srv.configure(**{"snowflake_id.public_key_file": key_file})
        main_srv.start()
        need_js53 = "1" in CASES
        if need_js53:
            js_srv = Server("js53", {"snowflake_id.layout": "js53"})
            js_srv.start()
        log(f"servers up: {', '.join(f'{s.name} port {s.port} in {s.dir}' for s in servers)}")
        for s in servers:
            with s.connect() as c:
                c.execute("CREATE EXTENSION snowflake_id")
                c.execute("CREATE SEQUENCE s1 CACHE 1")
                c.execute("CREATE SEQUENCE s1000 CACHE 1000")
        conns["main"] = main_srv.connect()
        if need_js53:
            conns["js53"] = js_srv.connect()
            layout = conns["js53"].execute("SELECT preset FROM snowflake_layout()").fetchone()[0]
            assert layout == "js53", layout
        meta["snowflake_layout_main"] = conns["main"].execute(
            "SELECT preset || ' ' || worker_bits || '/' || sequence_bits || ' bits, unit ' "
            "|| time_unit_ms || ' ms' FROM snowflake_layout()").fetchone()[0]
        meta["pg_version"] = conns["main"].execute(
            "SELECT current_setting('server_version')").fetchone()[0].split()[0]
        meta["pg_settings"] = dict(conns["main"].execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
            "('fsync', 'shared_buffers', "
            "'synchronous_commit', 'jit', 'autovacuum', 'snowflake_id.max_drift', "
            "'snowflake_id.layout')").fetchall())

        steps = [("1", lambda: case1(conns)), ("2", lambda: case2(conns["main"])),
                 ("4", lambda: case4(conns["main"])), ("5", lambda: case5(main_srv)),
                 ("3", lambda: case3(main_srv, conns["main"]))]
        for case, run in steps:
            if case in CASES:
                before, t0 = os.getloadavg()[0], time.monotonic()
                run()
                CASE_INFO[case] = {"load_start": round(before, 2),
                                   "load_end": round(os.getloadavg()[0], 2),
                                   "seconds": round(time.monotonic() - t0, 1)}
        meta["cases"] = CASE_INFO
    finally:
        for c in conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        for s in servers:
            try:
                s.destroy()
            except Exception as e:  # noqa: BLE001
                log(f"could not stop {s.dir}: {e}")
        shutil.rmtree(tree_dir, ignore_errors=True)

    meta["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta["elapsed_s"] = round(time.monotonic() - started, 1)

    out()
    out(f"snowflake_id benchmarks — {meta['date']}, commit {meta['git_commit'][:10]}"
        f"{' + uncommitted changes in src/' if meta['git_dirty'] else ''}"
        f"{'  [QUICK MODE]' if QUICK else ''}")
    out(f"PostgreSQL {meta['pg_version']}, {NCPU} CPUs ({meta['cpu']}), load average "
        f"{meta['loadavg_start']} at start, {meta['loadavg_end']} at end; "
        f"{meta['elapsed_s']:.0f} s")
    out(f"library {meta['library_source']}/snowflake_id.so sha256 "
        f"{meta['library_sha256'][:12]} ("
        f"{'= the target/release build' if meta['is_target_release_build'] else 'NOT the target/release build'}"
        f"; a private copy, so builds installed meanwhile do not matter)")
    out("server: " + ", ".join(f"{k}={v}" for k, v in meta.get("pg_settings", {}).items()))
    report_case1()
    report_case2()
    report_case3()
    report_case4()
    report_case5()
    goals()

    write_csv(os.path.join(OUT, "results.csv"))
    write_svg(os.path.join(OUT, "chart.svg"), meta)
    with open(os.path.join(OUT, "results.txt"), "w") as f:
        f.write("\n".join(OUTPUT).lstrip("\n") + "\n")
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    out()
    out(f"wrote {OUT}/results.csv, chart.svg, results.txt, meta.json")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); servers stopped")
        sys.exit(130)
