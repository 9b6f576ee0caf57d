"""Case 7 - backfill at migration scale (issue 44): rows/s of the migration's
INSERT ... SELECT from a legacy table into a logged table keyed by a bigint
primary key, the key made by snowflake_at(created_at) with the legacy rows
in time order and in key order (times at random: unordered), against the
same INSERT with snowflake_nextval() and with the legacy table's own bigint
(in key order, and in the random order unordered IDs arrive in, which
shows what random inserts into the primary key cost); and snowflake_at()
into a table without an index (the cost of making the IDs alone).

A server of its own: four set-aside worker ids (1020-1023) and an epoch
five and a half years back, so that five years of past times fit. Each rep
of each variant runs in a new session (backfill takes its grants again, as
a migration in a new session would: one per stretch, each a state-file
write with fsync and a WAL flush), after a TRUNCATE and a CHECKPOINT; the
variants rotate between reps."""

from __future__ import annotations

import time

from config import BACKFILL_REPS, BACKFILL_ROWS, log
from measure import R, timed_cpu
from servers import Server

CASE = "7_backfill"
SETTINGS = {"snowflake_id.backfill_worker_ids": "1020-1023",
            "snowflake_id.epoch": "2021-06-01"}
# label, the key expression, the legacy table it reads, the table it fills
VARIANTS = [
    ("plain bigint", "legacy_id::bigint", "legacy", "target"),
    ("plain bigint, random order", "legacy_id::bigint", "legacy_by_time", "target"),
    ("snowflake_nextval()", "snowflake_nextval()", "legacy", "target"),
    ("snowflake_at() ordered", "snowflake_at(created_at)", "legacy_by_time", "target"),
    ("snowflake_at() unordered", "snowflake_at(created_at)", "legacy", "target"),
    ("snowflake_at() ordered, no index", "snowflake_at(created_at)", "legacy_by_time",
     "target_heap"),
    ("snowflake_at() unordered, no index", "snowflake_at(created_at)", "legacy", "target_heap"),
]
PLAIN, PLAIN_RANDOM, NEXTVAL, ORDERED, UNORDERED, ORDERED_HEAP, UNORDERED_HEAP = (
    v[0] for v in VARIANTS)
# (numerator, denominator, metric): per rep, paired
RATIOS = [(UNORDERED, ORDERED, "time_ratio_unordered_to_ordered"),
          (UNORDERED_HEAP, ORDERED_HEAP, "time_ratio_unordered_to_ordered"),
          (ORDERED, NEXTVAL, "time_ratio_ordered_to_nextval"),
          (NEXTVAL, PLAIN, "time_ratio_nextval_to_plain"),
          (PLAIN_RANDOM, PLAIN, "time_ratio_random_to_key_order")]


def setup(conn, rows: int) -> None:
    """The legacy table in key order, its times at random over five years,
    and the same rows in time order; the target table."""
    conn.execute("SELECT setseed(0.44)")
    conn.execute(f"""CREATE TABLE legacy AS
        SELECT g AS legacy_id,
               now() - interval '1 minute' - random() * interval '5 years' AS created_at
          FROM generate_series(1, {rows}) g""")
    conn.execute("CREATE TABLE legacy_by_time AS SELECT * FROM legacy ORDER BY created_at")
    conn.execute("CREATE TABLE target (id bigint PRIMARY KEY, legacy_id int, created_at timestamptz)")
    conn.execute("CREATE TABLE target_heap (id bigint, legacy_id int, created_at timestamptz)")
    conn.execute("VACUUM ANALYZE legacy")
    conn.execute("VACUUM ANALYZE legacy_by_time")


def run_variant(srv, expr: str, source: str, target: str) -> tuple[float, float]:
    with srv.connect() as conn:
        conn.execute(f"TRUNCATE {target}")
        conn.execute("CHECKPOINT")
        return timed_cpu(conn, f"INSERT INTO {target} SELECT {expr}, legacy_id, created_at "
                               f"FROM {source}")


def run(conns: dict, srv) -> None:
    del conns, srv  # a server of its own
    log(f"case 7: backfill, {BACKFILL_ROWS:,} rows per INSERT, {BACKFILL_REPS} reps")
    own = Server("backfill", SETTINGS)
    try:
        t0 = time.monotonic()
        own.start()
        with own.connect() as conn:
            conn.execute("CREATE EXTENSION snowflake_id")
            setup(conn, BACKFILL_ROWS)
        log(f"  server up and legacy tables made ({time.monotonic() - t0:.1f} s), "
            f"port {own.port} in {own.dir}")
        run_variant(own, "snowflake_at(created_at)", "legacy", "target")  # warm-up
        res: dict = {v[0]: [] for v in VARIANTS}
        for rep in range(BACKFILL_REPS):
            shift = rep % len(VARIANTS)
            for label, expr, source, target in VARIANTS[shift:] + VARIANTS[:shift]:
                res[label].append(run_variant(own, expr, source, target))
            log(f"  rep {rep + 1}/{BACKFILL_REPS}: " + ", ".join(
                f"{label} {BACKFILL_ROWS / res[label][-1][0]:,.0f} rows/s" for label in res))
        with own.connect() as conn:
            stretches, most = conn.execute(
                "SELECT count(*), max(grants) FROM snowflake_backfill()").fetchone()
        log(f"  grants: {stretches} stretches, at most {most} grants in one")
    finally:
        own.destroy()
    params = f"rows={BACKFILL_ROWS}"
    for label, *_ in VARIANTS:
        R.add(CASE, label, "rows_per_s", "rows/s", [BACKFILL_ROWS / w for w, _ in res[label]],
              params, "wall time of the INSERT ... SELECT, one statement")
        R.add(CASE, label, "cpu_us_per_row", "us", [c * 1e6 / BACKFILL_ROWS for _, c in res[label]],
              params, "the backend's CPU time of the statement, per row")
    for a, b, metric in RATIOS:
        R.add(CASE, a, metric, "x", [x[0] / y[0] for x, y in zip(res[a], res[b])], params,
              f"wall time over {b}'s, per rep")
