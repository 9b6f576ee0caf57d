"""The SQL API on a real server: IDs unique and strictly increasing per
connection under concurrency, decoding to the time they were made; use as a
column default; without shared_preload_libraries, 55000 with a hint while
the pure functions keep working, and snowflake_config() saying "not
preloaded"; and the layout-changed error naming what changed."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

N_CONN = 8
ROUNDS = 10
PER_ROUND = 10_000


def test_concurrent_connections_distinct_and_increasing(cluster):
    conns = [cluster.connect() for _ in range(N_CONN)]
    barrier = threading.Barrier(N_CONN)

    def worker(conn):
        got = []
        try:
            for _ in range(ROUNDS):
                barrier.wait(timeout=120)  # interleave the rounds of all threads
                rows = conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, %s)",
                    (PER_ROUND,)).fetchall()
                got.extend(r[0] for r in rows)
        except BaseException:
            barrier.abort()  # don't leave the other threads waiting
            raise
        return got

    t0 = dt.datetime.now(dt.timezone.utc)
    try:
        with ThreadPoolExecutor(N_CONN) as pool:
            results = list(pool.map(worker, conns))
    finally:
        for c in conns:
            c.close()
    t1 = dt.datetime.now(dt.timezone.utc)

    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == N_CONN * ROUNDS * PER_ROUND
    assert all(isinstance(i, int) and i > 0 for i in all_ids)
    assert len(set(all_ids)) == len(all_ids), "duplicate IDs across connections"
    for n, ids in enumerate(results):
        bad = next((k for k in range(1, len(ids)) if ids[k] <= ids[k - 1]), None)
        assert bad is None, (f"connection {n}: IDs not strictly increasing at "
                             f"position {bad}: {ids[bad - 1]} then {ids[bad]}")

    # Decoded timestamps lie within the generation window (ms truncation and
    # clock granularity allowed for).
    slack = dt.timedelta(seconds=2)
    samples = [results[0][0], results[N_CONN // 2][len(all_ids) // (2 * N_CONN)],
               results[-1][-1], max(all_ids), min(all_ids)]
    with cluster.connect() as conn:
        for i in samples:
            rows = conn.execute("SELECT * FROM snowflake_decode(%s)",
                                (i,)).fetchall()
            assert len(rows) == 1, rows
            ts, worker_id, seq = rows[0]
            assert isinstance(ts, dt.datetime) and ts.tzinfo is not None
            assert t0 - slack <= ts <= t1 + slack, (i, ts, t0, t1)
            assert isinstance(worker_id, int) and worker_id >= 0
            assert isinstance(seq, int) and seq >= 0
            ts2 = conn.execute("SELECT snowflake_timestamp(%s)",
                               (i,)).fetchone()[0]
            assert ts2 == ts, (i, ts, ts2)


def test_without_preload_functions_fail_with_55000_and_hint(make_cluster):
    c = make_cluster(preload=False)
    c.create_extension()
    with c.connect() as conn:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
        e = ei.value
        assert e.sqlstate == "55000", (e.sqlstate, str(e))
        hint = e.diag.message_hint
        assert hint is not None and "shared_preload_libraries" in hint, hint

        # Pure functions need no shared memory and keep working.
        some_id = (1_000_000_000 << 22) | (3 << 12) | 7
        rows = conn.execute("SELECT * FROM snowflake_decode(%s)",
                            (some_id,)).fetchall()
        assert len(rows) == 1 and None not in rows[0], rows


def test_column_default_and_two_sessions(cluster):
    cluster.sql("CREATE TABLE orders (id bigint PRIMARY KEY "
                "DEFAULT snowflake_nextval(), item text)")
    n = 1000
    barrier = threading.Barrier(2)

    def insert(name):
        with cluster.connect() as conn:
            barrier.wait(timeout=60)  # start both sessions together
            for k in range(n):
                conn.execute("INSERT INTO orders (item) VALUES (%s)",
                             (f"{name} #{k}",))

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(insert, s) for s in ("alice", "bob")]:
            f.result()

    total, distinct = cluster.sql(
        "SELECT count(*), count(DISTINCT id) FROM orders")[0]
    assert (total, distinct) == (2 * n, 2 * n)
    # Within each session, later inserts got larger IDs.
    for name in ("alice", "bob"):
        ids = [r[0] for r in cluster.sql(
            "SELECT id FROM orders WHERE item LIKE %s "
            "ORDER BY split_part(item, '#', 2)::int", f"{name} #%")]
        assert len(ids) == n
        assert ids == sorted(ids) and len(set(ids)) == n, name


def test_config_without_preload_says_not_preloaded(make_cluster):
    c = make_cluster(preload=False)
    c.create_extension()
    rows = c.sql("SELECT worker_ids, worker_ids_total, worker_ids_held, worker_ids_free, "
                 "my_worker_id FROM snowflake_config()")
    assert rows == [("not preloaded", None, None, None, None)]


def test_layout_changed_error_names_the_settings_recorded_vs_now(make_cluster):
    c = make_cluster(create_extension=True)
    assert c.scalar("SELECT snowflake_nextval()") > 0
    c.configure(**{"snowflake_id.layout": "js53"})
    c.restart()
    with c.connect() as conn:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
    e = ei.value
    assert e.sqlstate == "55000"
    detail = e.diag.message_detail or ""
    assert ("Changed: snowflake_id.total_bits 63 (recorded) vs 53 (now); "
            "snowflake_id.worker_bits 10 (recorded) vs 6 (now); "
            "snowflake_id.sequence_bits 12 (recorded) vs 6 (now).") in detail, detail
    assert "epoch" not in detail and "time_unit_ms" not in detail, detail
