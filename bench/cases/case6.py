"""Case 6 - INSERT into a logged table keyed by each generator (issue 33):
rows/s with pgbench (one row per transaction, 1 and 2 clients), and after a
batched load of N rows the primary key's size, the WAL per row and the
load's rows/s: once with the index well inside shared_buffers (the main
server), once on a server of its own whose small shared_buffers the index
outgrows.

snowflake_nextval(), bigserial, gen_random_uuid(), uuidv7() (PostgreSQL 18
and later) and pgEdge's snowflake.nextval() (where that extension is
installed: servers.PGEDGE)."""

from __future__ import annotations

import os
import time

from cases.case3 import run_pgbench
from config import (INSERT_BATCH, INSERT_CHECKPOINT_EVERY, INSERT_CLIENTS, INSERT_REPS,
                    INSERT_ROWS, INSERT_ROWS_BIG, INSERT_SHARED_BUFFERS, PGB_REPS,
                    PGB_SECONDS, log)
from measure import R, settle_drift, timed_cpu
from servers import PGEDGE, Server

CASE = "6_insert"
VARIANTS = [
    # label, table, key column, needs: None, "uuidv7" (PostgreSQL 18+) or "pgedge"
    ("bigserial", "ins_bigserial", "id bigserial PRIMARY KEY", None),
    ("snowflake_nextval()", "ins_snowflake",
     "id bigint PRIMARY KEY DEFAULT snowflake_nextval()", None),
    ("uuidv7()", "ins_uuidv7", "id uuid PRIMARY KEY DEFAULT uuidv7()", "uuidv7"),
    ("gen_random_uuid()", "ins_uuid4", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()", None),
    ("pgEdge snowflake.nextval()", "ins_pgedge",
     "id bigint PRIMARY KEY DEFAULT snowflake.nextval()", "pgedge"),
]
SNOWFLAKE, BIGSERIAL, UUIDV7 = "snowflake_nextval()", "bigserial", "uuidv7()"
# The two batched loads: (key, title); the rows and the server are run()'s.
PHASES = [("fits", "the index inside shared_buffers"),
          ("outgrows", "the index outgrows shared_buffers")]


def available(conn) -> list[tuple]:
    """The variants this server can run."""
    has_v7 = conn.execute("SELECT to_regprocedure('uuidv7()') IS NOT NULL").fetchone()[0]
    return [v for v in VARIANTS
            if v[3] is None or (v[3] == "uuidv7" and has_v7) or (v[3] == "pgedge" and PGEDGE)]


def setup(conn, variants: list[tuple]) -> None:
    """The tables (key only: the key's share of a row is largest there)."""
    if PGEDGE:
        conn.execute("CREATE EXTENSION IF NOT EXISTS snowflake")
    for _, t, col, _ in variants:
        conn.execute(f"CREATE TABLE {t} ({col})")
    for _, t, _, _ in variants:  # warm-up: the worker claim, plans, caches
        conn.execute(f"INSERT INTO {t} SELECT FROM generate_series(1, 1000)")
        conn.execute(f"TRUNCATE {t}")


def _counters(conn, table: str) -> dict:
    """WAL insert position, full-page images written and the index's buffer
    reads/hits so far. The backend's pending statistics are flushed first
    (pg_stat_force_next_flush(): before the server answers the next query)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    lsn, fpi, reads, hits = conn.execute(
        "SELECT pg_current_wal_insert_lsn(), (SELECT wal_fpi FROM pg_stat_wal), "
        "coalesce(idx_blks_read, 0), coalesce(idx_blks_hit, 0) "
        "FROM pg_statio_user_indexes WHERE indexrelid = %s::regclass",
        (f"{table}_pkey",)).fetchone()
    return {"lsn": lsn, "fpi": int(fpi), "reads": int(reads), "hits": int(hits)}


def load(conn, table: str, rows: int) -> dict:
    """TRUNCATE, CHECKPOINT, then `rows` rows in statements of INSERT_BATCH
    rows (each its own transaction), with a CHECKPOINT every
    INSERT_CHECKPOINT_EVERY rows, as a server's checkpoints would come; only
    the INSERT statements are timed. Returns the figures of the load."""
    conn.execute(f"TRUNCATE {table}")
    conn.execute("CHECKPOINT")
    if table == "ins_snowflake":
        settle_drift(conn)
    c0 = _counters(conn, table)
    wall = cpu = 0.0
    done, next_cp = 0, INSERT_CHECKPOINT_EVERY
    while done < rows:
        n = min(INSERT_BATCH, rows - done)
        w, c = timed_cpu(conn, f"INSERT INTO {table} SELECT FROM generate_series(1, {n})")
        wall, cpu, done = wall + w, cpu + c, done + n
        if INSERT_CHECKPOINT_EVERY and next_cp <= done < rows:
            conn.execute("CHECKPOINT")
            next_cp += INSERT_CHECKPOINT_EVERY
    c1 = _counters(conn, table)
    wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (c1["lsn"], c0["lsn"])).fetchone()[0]
    pkey, heap, sb = conn.execute(
        "SELECT pg_relation_size(%s::regclass), pg_relation_size(%s::regclass), "
        "pg_size_bytes(current_setting('shared_buffers'))",
        (f"{table}_pkey", table)).fetchone()
    return {"rows_per_s": rows / wall, "cpu_us_per_row": cpu * 1e6 / rows,
            "pkey_bytes_per_row": pkey / rows, "pkey_mb": pkey / 2**20,
            "heap_bytes_per_row": heap / rows, "pkey_over_shared_buffers": pkey / sb,
            "wal_bytes_per_row": float(wal) / rows,
            "fpi_per_1k_rows": (c1["fpi"] - c0["fpi"]) * 1000 / rows,
            "idx_reads_per_1k_rows": (c1["reads"] - c0["reads"]) * 1000 / rows}


LOAD_METRICS = {  # metric: unit, note
    "rows_per_s": ("rows/s", "wall time of the INSERT statements only"),
    "cpu_us_per_row": ("us", "the backend's CPU time of the INSERT statements, per row"),
    "pkey_bytes_per_row": ("B", "pg_relation_size of the primary key / rows"),
    "pkey_mb": ("MiB", "pg_relation_size of the primary key"),
    "heap_bytes_per_row": ("B", "pg_relation_size of the table / rows"),
    "pkey_over_shared_buffers": ("x", "primary key size / shared_buffers"),
    "wal_bytes_per_row": ("B", "pg_current_wal_insert_lsn() difference / rows, "
                          "checkpoints included"),
    "fpi_per_1k_rows": ("", "full-page images (pg_stat_wal.wal_fpi) per 1000 rows"),
    "idx_reads_per_1k_rows": ("", "primary-key blocks read into shared_buffers "
                              "(pg_statio_user_indexes.idx_blks_read) per 1000 rows"),
}
# Compared per rep with the same rep's bigserial (rows/s, size) or uuidv7 (WAL).
RATIOS = [("rows_per_s", BIGSERIAL, "rows_per_s_ratio_to_bigserial"),
          ("pkey_bytes_per_row", BIGSERIAL, "pkey_ratio_to_bigserial"),
          ("wal_bytes_per_row", UUIDV7, "wal_ratio_to_uuidv7")]


def run_loads(conn, phase: str, rows: int, variants: list[tuple]) -> None:
    sb = conn.execute("SELECT current_setting('shared_buffers')").fetchone()[0]
    log(f"  {phase}: {rows:,} rows per load, shared_buffers {sb}, {INSERT_REPS} reps")
    res: dict = {v[0]: [] for v in variants}
    for rep in range(INSERT_REPS):
        shift = rep % len(variants)
        for label, t, _, _ in variants[shift:] + variants[:shift]:
            res[label].append(load(conn, t, rows))
            conn.execute(f"TRUNCATE {t}")
        log(f"  {phase} rep {rep + 1}/{INSERT_REPS}: " + ", ".join(
            f"{label} {res[label][-1]['rows_per_s']:,.0f} rows/s "
            f"pkey {res[label][-1]['pkey_bytes_per_row']:.1f} B "
            f"WAL {res[label][-1]['wal_bytes_per_row']:.0f} B" for label, *_ in variants))
    params = (f"phase={phase} rows={rows} shared_buffers={sb} batch={INSERT_BATCH} "
              f"checkpoint_every={INSERT_CHECKPOINT_EVERY}")
    for label, *_ in variants:
        for m, (unit, note) in LOAD_METRICS.items():
            R.add(CASE, f"{label} | {phase}", m, unit, [r[m] for r in res[label]], params, note)
        for m, base, name in RATIOS:
            if base in res:
                R.add(CASE, f"{label} | {phase}", name, "x",
                      [a[m] / b[m] for a, b in zip(res[label], res[base])], params,
                      f"{m} over {base}'s, per rep")


def run_pgbench_inserts(srv, conn, variants: list[tuple]) -> None:
    log(f"  pgbench -T {PGB_SECONDS}, clients {INSERT_CLIENTS}, {PGB_REPS} reps")
    files = {}
    for _, t, _, _ in variants:
        files[t] = os.path.join(srv.dir, f"{t}.sql")
        with open(files[t], "w") as f:
            f.write(f"INSERT INTO {t} DEFAULT VALUES;\n")
    for _, t, _, _ in variants:  # warm-up
        run_pgbench(srv, files[t], 1, 1)
        conn.execute(f"TRUNCATE {t}")
    tps: dict = {(v[0], c): [] for v in variants for c in INSERT_CLIENTS}
    failed = 0
    for rep in range(PGB_REPS):
        for ci, clients in enumerate(INSERT_CLIENTS):
            shift = (rep + ci) % len(variants)
            for label, t, _, _ in variants[shift:] + variants[:shift]:
                conn.execute(f"TRUNCATE {t}")
                conn.execute("CHECKPOINT")  # no checkpoint's writes from the last run
                r = run_pgbench(srv, files[t], clients, PGB_SECONDS)
                tps[(label, clients)].append(r["tps"])
                failed += r["failed"]
            log(f"  pgbench rep {rep + 1}/{PGB_REPS}, {clients} clients: " + ", ".join(
                f"{v[0]} {tps[(v[0], clients)][-1]:,.0f}" for v in variants) + " rows/s")
    for _, t, _, _ in variants:
        conn.execute(f"TRUNCATE {t}")
    for label, *_ in variants:
        for c in INSERT_CLIENTS:
            params = f"T={PGB_SECONDS}s clients={c}"
            R.add(CASE, f"{label} | clients={c}", "rows_per_s", "rows/s", tps[(label, c)],
                  params, "pgbench TPS, one INSERT of one row per transaction")
            R.add(CASE, f"{label} | clients={c}", "rows_per_s_ratio_to_bigserial", "x",
                  [a / b for a, b in zip(tps[(label, c)], tps[(BIGSERIAL, c)])], params,
                  "per rep, paired")
        if 1 in INSERT_CLIENTS and 2 in INSERT_CLIENTS:
            R.add(CASE, label, "scaling_1_to_2_clients", "x",
                  [b / a for a, b in zip(tps[(label, 1)], tps[(label, 2)])],
                  f"T={PGB_SECONDS}s", "rows/s with 2 clients / 1 client, per rep")
    if failed:
        log(f"  WARNING: pgbench reported {failed} failed transactions")


def run(conns: dict, srv) -> None:
    conn = conns["main"]
    variants = available(conn)
    log(f"case 6: INSERT into logged tables keyed by {', '.join(v[0] for v in variants)}")
    setup(conn, variants)
    run_pgbench_inserts(srv, conn, variants)
    run_loads(conn, "fits", INSERT_ROWS, variants)
    for _, t, _, _ in variants:
        conn.execute(f"DROP TABLE {t}")
    # The second load runs on a server of its own: shared_buffers needs a restart.
    small = Server(f"insert, shared_buffers {INSERT_SHARED_BUFFERS}",
                   {"shared_buffers": INSERT_SHARED_BUFFERS})
    try:
        t0 = time.monotonic()
        small.start()
        with small.connect() as c:
            c.execute("CREATE EXTENSION snowflake_id")
            setup(c, variants)
            log(f"  server with shared_buffers {INSERT_SHARED_BUFFERS} up "
                f"({time.monotonic() - t0:.1f} s), port {small.port} in {small.dir}")
            run_loads(c, "outgrows", INSERT_ROWS_BIG, variants)
            small_pkeys = [R.get(CASE, f"{v[0]} | outgrows", "pkey_over_shared_buffers")
                           for v in variants]
            if any(m and m.s["min"] < 1 for m in small_pkeys):
                log(f"  WARNING: a primary key stayed within shared_buffers = "
                    f"{INSERT_SHARED_BUFFERS}: raise BENCH_INSERT_ROWS_BIG")
    finally:
        small.destroy()
