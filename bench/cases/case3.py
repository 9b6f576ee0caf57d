"""Case 3 - concurrency: pgbench -n -M prepared -T S -c C -j min(C, CPUs)
with one-statement scripts; TPS and the scaling from 1 to 2 clients.

One client is a ping-pong: pgbench sends a statement and sleeps until the
answer, the backend sleeps until the next statement, so at every turn a
CPU goes idle and must wake up again. On a VM that wake-up (a halted
vCPU the hypervisor resumes) costs tens of µs, more than any statement
here, so one client gets the same ~16,000 TPS (about 60 µs a transaction)
for every script, `SELECT 1` included, and two clients, which keep both
CPUs busy, 4-9× that. The `SELECT 1` row measures that floor: a script
whose one-client TPS is at `SELECT 1`'s measures the machine's round trip,
not the expression, and its 2/1 scaling says nothing about contention."""

import os
import re
import subprocess

from config import CLIENTS, NCPU, PGB_REPS, PGB_SECONDS, log
from measure import R
from servers import PG_BINDIR

CASE = "3_concurrency"
VARIANTS = [
    # label, key, script, table truncated before each run
    ("SELECT snowflake_nextval()", "sel_snowflake", "SELECT snowflake_nextval();", None),
    ("SELECT nextval('s')", "sel_nextval", "SELECT nextval('s');", None),
    ("INSERT bigserial", "ins_bigserial", "INSERT INTO pgb_bigserial DEFAULT VALUES;",
     "pgb_bigserial"),
    ("INSERT seq CACHE 1000", "ins_seq1000", "INSERT INTO pgb_seq1000 DEFAULT VALUES;",
     "pgb_seq1000"),
    ("INSERT uuid", "ins_uuid", "INSERT INTO pgb_uuid DEFAULT VALUES;", "pgb_uuid"),
    ("INSERT snowflake", "ins_snowflake", "INSERT INTO pgb_snowflake DEFAULT VALUES;",
     "pgb_snowflake"),
    # The round trip alone: the floor of every script's one-client TPS.
    ("SELECT 1 (round trip)", "sel_1", "SELECT 1;", None),
]


def run_pgbench(srv, script: str, clients: int, seconds: int) -> dict:
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


def run(conns: dict, srv) -> None:
    conn = conns["main"]
    log(f"case 3: pgbench -T {PGB_SECONDS} -M prepared, clients {CLIENTS}, "
        f"{PGB_REPS} reps ({len(VARIANTS) * len(CLIENTS) * PGB_REPS} runs)")
    conn.execute("CREATE SEQUENCE s")
    conn.execute("CREATE SEQUENCE pgb_s1000 CACHE 1000")
    conn.execute("CREATE TABLE pgb_bigserial (id bigserial PRIMARY KEY)")
    conn.execute("CREATE TABLE pgb_seq1000 (id bigint PRIMARY KEY DEFAULT nextval('pgb_s1000'))")
    conn.execute("CREATE TABLE pgb_uuid (id uuid PRIMARY KEY DEFAULT gen_random_uuid())")
    conn.execute("CREATE TABLE pgb_snowflake (id bigint PRIMARY KEY DEFAULT snowflake_nextval())")
    files = {}
    for _, key, sql, _ in VARIANTS:
        files[key] = os.path.join(srv.dir, f"{key}.sql")
        with open(files[key], "w") as f:
            f.write(sql + "\n")
    for _, key, _, _ in VARIANTS:  # warm-up
        run_pgbench(srv, files[key], 1, 1)
    tps: dict = {(k, c): [] for _, k, _, _ in VARIANTS for c in CLIENTS}
    lat: dict = {(k, c): [] for _, k, _, _ in VARIANTS for c in CLIENTS}
    failed = 0
    for rep in range(PGB_REPS):
        for ci, clients in enumerate(CLIENTS):
            shift = (rep + ci) % len(VARIANTS)
            for label, key, _, table_ in VARIANTS[shift:] + VARIANTS[:shift]:
                if table_:
                    conn.execute(f"TRUNCATE {table_}")
                r = run_pgbench(srv, files[key], clients, PGB_SECONDS)
                tps[(key, clients)].append(r["tps"])
                lat[(key, clients)].append(r["latency_ms"])
                failed += r["failed"]
            log(f"  rep {rep + 1}/{PGB_REPS}, {clients:>2} clients: " + ", ".join(
                f"{k} {tps[(k, clients)][-1]:,.0f}" for _, k, _, _ in VARIANTS) + " tps")
    for label, key, _, _ in VARIANTS:
        for c in CLIENTS:
            R.add(CASE, f"{label} | clients={c}", "tps", "tps",
                  tps[(key, c)], f"T={PGB_SECONDS}s clients={c}")
            R.add(CASE, f"{label} | clients={c}", "latency_avg", "ms",
                  lat[(key, c)], f"T={PGB_SECONDS}s clients={c}")
        if 1 in CLIENTS and 2 in CLIENTS:
            R.add(CASE, label, "scaling_1_to_2_clients", "x",
                  [b / a for a, b in zip(tps[(key, 1)], tps[(key, 2)])],
                  f"T={PGB_SECONDS}s", "tps(2 clients) / tps(1 client), per rep")
    if failed:
        log(f"  WARNING: pgbench reported {failed} failed transactions")
