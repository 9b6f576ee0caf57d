"""Several servers merged through built-in logical replication.

* Three writers with disjoint hand-set worker-id ranges merge into a fourth
  server: no key conflict, no lost row, and ID order is time order across
  servers (tests/sql/several_servers_*.sql are the files
  docs/operations/fleet.md quotes, "Hand-set ranges").
* Overlapping ranges (a misconfiguration): the merger's apply worker fails on
  a duplicate key, and keeps failing.
* Three writers with no `worker_ids` setting lease their worker ids from a
  fourth server, which also merges their rows, with the same files.

Physical standbys and promotion are in tests/durability/test_standbys.py.

Run: .venv/bin/pytest tests/fleet/test_several_servers.py -ra -q  (add -s
for the numbers each test prints: rows merged, inversions, what a user
sees).
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg

from harness import LOGICAL_REPLICATION_SETTINGS, PG_BINDIR, PG_MAJOR, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
SQL_DIR = ROOT / "tests" / "sql"
WRITER_SQL = SQL_DIR / "several_servers_writer.sql"
MERGER_SQL = SQL_DIR / "several_servers_merger.sql"
FLEET_DOC = ROOT / "docs" / "operations" / "fleet.md"

SLOW = os.environ.get("SNOWFLAKE_SLOW") == "1"

# The classic layout (the default every server here runs).
EPOCH_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
WORKER_SHIFT, WORKER_MASK = 12, (1 << 10) - 1
TICK_SHIFT = 22
MAX_DRIFT = dt.timedelta(seconds=1)  # snowflake_id.max_drift of the writers


def worker_of(i: int) -> int:
    return (i >> WORKER_SHIFT) & WORKER_MASK


def tick_of(i: int) -> int:
    return i >> TICK_SHIFT


def ms_of(i: int) -> int:
    """Unix milliseconds an ID carries."""
    return tick_of(i) + EPOCH_MS


def run_sql_file(cluster, path, **variables) -> str:
    """Runs a SQL file with psql, as a user would (psql variables allowed)."""
    cmd = [os.path.join(PG_BINDIR, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
           "-h", cluster.dir, "-p", str(cluster.port), "-U", "postgres",
           "-d", "postgres"]
    for k, v in variables.items():
        cmd += ["-v", f"{k}={v}"]
    cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (f"psql -f {path} failed on {cluster}:\n"
                                  f"{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def subscriptions_ready(m) -> bool:
    """Every subscribed table finished its initial sync."""
    states = m.sql("SELECT srsubstate FROM pg_subscription_rel")
    return bool(states) and all(s == "r" for (s,) in states)


def subscription_errors(m) -> dict:
    return {name: (apply_err, sync_err) for name, apply_err, sync_err in m.sql(
        "SELECT subname, apply_error_count, sync_error_count "
        "FROM pg_stat_subscription_stats ORDER BY subname")}


def counts_by_origin(c) -> dict:
    return dict(c.sql("SELECT origin, count(*) FROM events GROUP BY origin"))


# --------------------------------------------------------------------------
# 1. Three writers, one merger
# --------------------------------------------------------------------------
WRITER_RANGES = {"a": "0-340", "b": "341-681", "c": "682-1023"}
CLIENTS_PER_WRITER = 4
ROWS_PER_CLIENT = 25_000 if SLOW else 4_000
ROWS_PER_TXN = 50
TXNS_PER_CONNECTION = 5  # then reconnect: worker ids change hands meanwhile


def _insert_rows(writer, origin: str, n: int, barrier: threading.Barrier) -> int:
    """Single-row INSERTs that take their id and created_at from the column
    defaults, ROWS_PER_TXN per transaction, a new connection every
    TXNS_PER_CONNECTION transactions."""
    done = 0
    try:
        barrier.wait(timeout=60)
        while done < n:
            with writer.connect(autocommit=False) as conn:
                for _ in range(TXNS_PER_CONNECTION):
                    k = min(ROWS_PER_TXN, n - done)
                    if k == 0:
                        break
                    with conn.cursor() as cur:
                        cur.executemany("INSERT INTO events (origin) VALUES (%s)",
                                        [(origin,)] * k)
                    conn.commit()
                    done += k
    except BaseException:
        barrier.abort()
        raise
    return done


def test_three_writers_merge_without_conflict(make_cluster):
    writers = {}
    for origin, rng in WRITER_RANGES.items():
        w = make_cluster(tcp=True, settings={**LOGICAL_REPLICATION_SETTINGS,
                                            "snowflake_id.max_drift": "1s",
                                            "snowflake_id.worker_ids": rng})
        run_sql_file(w, WRITER_SQL)
        writers[origin] = w
    # Only events is published (FOR ALL TABLES would also publish the
    # extension's snowflake_worker_registry, which the merger lacks).
    assert w.sql("SELECT schemaname, tablename FROM pg_publication_tables") == [
        ("public", "events")]
    # The merger: plain PostgreSQL defaults, no extension.
    m = make_cluster(preload=False)
    m_mark = m.log_mark()
    run_sql_file(m, MERGER_SQL, **{f"conninfo_{o}": w.conninfo()
                                   for o, w in writers.items()})
    wait_until(lambda: subscriptions_ready(m), 60, "initial table sync")

    n_clients = CLIENTS_PER_WRITER * len(writers)
    barrier = threading.Barrier(n_clients)
    t0 = time.monotonic()
    with ThreadPoolExecutor(n_clients) as pool:
        futures = {origin: [pool.submit(_insert_rows, w, origin,
                                        ROWS_PER_CLIENT, barrier)
                            for _ in range(CLIENTS_PER_WRITER)]
                   for origin, w in writers.items()}
        inserted = {o: sum(f.result() for f in fs) for o, fs in futures.items()}
    t_insert = time.monotonic() - t0
    expected = {o: CLIENTS_PER_WRITER * ROWS_PER_CLIENT for o in writers}
    assert inserted == expected

    on_writers = {o: counts_by_origin(w) for o, w in writers.items()}
    assert on_writers == {o: {o: expected[o]} for o in writers}, on_writers

    def caught_up():
        errors = subscription_errors(m)
        assert all(e == (0, 0) for e in errors.values()), (
            f"subscription errors on the merger: {errors}\n"
            + "\n".join(l for l in m.log(since=m_mark).splitlines()
                        if "ERROR" in l or "DETAIL" in l))
        return counts_by_origin(m) == expected
    wait_until(caught_up, 120, f"the merger to hold {expected}", interval=0.5)
    t_merge = time.monotonic() - t0

    # Zero conflicts: no apply error, no duplicate key anywhere in M's log.
    m_log = m.log(since=m_mark)
    assert "duplicate key" not in m_log
    assert not re.search(r"ERROR:", m_log), m_log[-3000:]
    assert all(e == (0, 0) for e in subscription_errors(m).values())
    # ... and every subscription still has its apply worker running.
    assert m.sql("SELECT subname, pid IS NOT NULL FROM pg_stat_subscription "
                 "WHERE relid IS NULL ORDER BY subname") == [
        (f"events_from_{o}", True) for o in sorted(writers)]

    # Zero lost rows, and exactly the writers' rows (same ids, same origin,
    # same created_at).
    merged = m.sql("SELECT id, origin, created_at FROM events ORDER BY id")
    source = sorted(r for w in writers.values() for r in w.sql(
        "SELECT id, origin, created_at FROM events"))
    assert len(merged) == sum(expected.values())
    assert merged == source

    # Every row carries a worker id of its writer's range.
    for origin, rng in WRITER_RANGES.items():
        lo, hi = map(int, rng.split("-"))
        ws = {worker_of(i) for i, o, _ in merged if o == origin}
        assert ws and min(ws) >= lo and max(ws) <= hi, (origin, sorted(ws))
    workers_used = {o: len({worker_of(i) for i, oo, _ in merged if oo == o})
                    for o in writers}

    # ORDER BY id is time order across servers: consecutive rows by id never
    # go back in created_at by more than the clock skew (one machine: 0) plus
    # the drift bound. Also against all earlier rows (running maximum).
    worst_step = dt.timedelta(0)
    worst_running = dt.timedelta(0)
    running_max = merged[0][2]
    for (_, _, prev), (_, _, cur) in zip(merged, merged[1:]):
        worst_step = max(worst_step, prev - cur)
        worst_running = max(worst_running, running_max - cur)
        running_max = max(running_max, cur)
    # An ID's own time vs the row's created_at (ms truncation: -1 ms).
    id_ahead = max(dt.timedelta(milliseconds=ms_of(i)) -
                   (c - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc))
                   for i, _, c in merged)
    id_behind = max((c - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) -
                    dt.timedelta(milliseconds=ms_of(i)) for i, _, c in merged)
    print(f"\n[three writers] rows merged {len(merged)} "
          f"({', '.join(f'{o}={n}' for o, n in expected.items())}); "
          f"worker ids used per writer {workers_used}; "
          f"insert {t_insert:.1f}s, merged after {t_merge:.1f}s; "
          f"max created_at inversion between consecutive ids "
          f"{worst_step.total_seconds() * 1000:.3f} ms, against any earlier id "
          f"{worst_running.total_seconds() * 1000:.3f} ms; "
          f"ID time ahead of created_at at most "
          f"{id_ahead.total_seconds() * 1000:.3f} ms, behind at most "
          f"{id_behind.total_seconds() * 1000:.3f} ms")
    assert worst_step <= MAX_DRIFT, worst_step
    assert worst_running <= MAX_DRIFT, worst_running
    assert id_ahead <= MAX_DRIFT, id_ahead


def markdown_section(text: str, title: str) -> str:
    """The body of the Markdown section headed `title`: up to the next
    heading of the same or a higher level. Lines inside fenced blocks are
    never headings (an ```ini block's `# server A` comment is not one)."""
    lines = text.splitlines(keepends=True)
    fence = None
    level = start = None
    for n, line in enumerate(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        h = re.match(r"^(#{1,6})[ \t]+(.*?)[ \t#]*$", line)
        if not h:
            continue
        if start is None:
            if h.group(2) == title:
                level, start = len(h.group(1)), n + 1
        elif len(h.group(1)) <= level:
            return "".join(lines[start:n])
    assert start is not None, f'no "{title}" section'
    return "".join(lines[start:])


def test_readme_quotes_the_replication_files():
    """docs/operations/fleet.md, "Hand-set ranges", quotes the writer and
    merger files verbatim (```psql: the merger file uses psql variables, so
    tests/docs/test_docs.py does not run it as plain SQL)."""
    assert FLEET_DOC.is_file(), f"{FLEET_DOC.relative_to(ROOT)} is missing"
    section = markdown_section(FLEET_DOC.read_text(), "Hand-set ranges")
    blocks = [b.strip() for b in re.findall(r"^```p?sql[^\n]*\n(.*?)^```",
                                            section, flags=re.M | re.S)]
    for path in (WRITER_SQL, MERGER_SQL):
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
        assert path.read_text().strip() in blocks, (
            f'{FLEET_DOC.relative_to(ROOT)}, "Hand-set ranges", does not quote '
            f"{path.relative_to(ROOT)} verbatim")


# --------------------------------------------------------------------------
# 2. Overlapping ranges
# --------------------------------------------------------------------------
OVERLAP_ROWS = 50_000


def _claim_worker_id(writer, wanted: int) -> tuple[psycopg.Connection, list]:
    """A connection whose backend holds worker id `wanted`: lower free ids
    are claimed first (the least recently released, never released ones by
    id), so hold those with other connections."""
    holders = []
    while True:
        conn = writer.connect()
        conn.execute("SELECT snowflake_nextval()")
        got = conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]
        if got == wanted:
            return conn, holders
        assert got < wanted, (got, wanted)
        holders.append(conn)


def test_overlapping_ranges_break_the_merger(make_cluster):
    """The misconfiguration docs/operations/fleet.md warns about: A has
    '0-9', B has '5-14'. Both hand out worker id 7 (forced here by holding
    0-6 and 5-6); rows made in the same millisecond with the same sequence
    get the same ID, and the merger's apply worker stops on the duplicate
    key, retrying forever."""
    a = make_cluster(tcp=True, settings={**LOGICAL_REPLICATION_SETTINGS,
                                        "snowflake_id.worker_ids": "0-9"})
    b = make_cluster(tcp=True, settings={**LOGICAL_REPLICATION_SETTINGS,
                                        "snowflake_id.worker_ids": "5-14"})
    for w in (a, b):
        run_sql_file(w, WRITER_SQL)
    m = make_cluster(preload=False, settings={
        # default 5s; shorter so the test sees the retries sooner
        "wal_retrieve_retry_interval": "1s"})
    m_mark = m.log_mark()
    m.sql("CREATE TABLE events (id bigint PRIMARY KEY, origin text NOT NULL, "
          "created_at timestamptz NOT NULL)")
    for name, w in (("events_from_a", a), ("events_from_b", b)):
        m.sql(f"CREATE SUBSCRIPTION {name} CONNECTION '{w.conninfo()}' "
              "PUBLICATION events_pub")
    wait_until(lambda: subscriptions_ready(m), 60, "initial table sync")

    held = []
    try:
        conns = {}
        for origin, w in (("a", a), ("b", b)):
            conns[origin], holders = _claim_worker_id(w, 7)
            held += holders
        overlap = set()
        for attempt in range(3):
            barrier = threading.Barrier(2)

            def insert(origin):
                barrier.wait(timeout=30)
                return [r[0] for r in conns[origin].execute(
                    "INSERT INTO events (origin) SELECT %s FROM "
                    "generate_series(1, %s) RETURNING id",
                    (origin, OVERLAP_ROWS)).fetchall()]
            with ThreadPoolExecutor(2) as pool:
                ids_a, ids_b = pool.map(insert, ("a", "b"))
            overlap |= set(ids_a) & set(ids_b)
            if overlap:
                break
    finally:
        for c in held + list(conns.values()):
            c.close()
    assert overlap, "the two writers never made the same ID"
    assert {worker_of(i) for i in overlap} == {7}

    # What the user sees: the merger's log.
    # PostgreSQL 18 reports the apply conflict as "conflict=insert_exists",
    # without the key's value; earlier versions as a unique violation.
    apply_error = (r'ERROR:  duplicate key value violates unique constraint "events_pkey"'
                   if PG_MAJOR < 18 else
                   r'ERROR:  conflict detected on relation "public.events": '
                   r'conflict=insert_exists')
    wait_until(lambda: len(re.findall(apply_error, m.log(since=m_mark))) >= 2,
               90, "the apply error (twice: the worker retries)")
    log = m.log(since=m_mark)
    if PG_MAJOR < 18:
        dup = int(re.search(r"DETAIL:  Key \(id\)=\((\d+)\) already exists", log).group(1))
        assert dup in overlap
    else:
        assert re.search(r'DETAIL:  Key already exists in unique index "events_pkey"', log)
    errors = subscription_errors(m)
    assert sum(e for e, _ in errors.values()) >= 1, errors
    # The failing transaction is never applied: the merger misses rows.
    on_writers = {**counts_by_origin(a), **counts_by_origin(b)}
    on_m = counts_by_origin(m)
    assert sum(on_m.values()) < sum(on_writers.values()), (on_m, on_writers)
    seen = [l for l in log.splitlines()
            if re.search(r"ERROR|DETAIL|CONTEXT|logical replication|"
                         r"exited with exit code", l)]
    print(f"\n[overlapping ranges] {len(overlap)} IDs made by both writers "
          f"(of {OVERLAP_ROWS} each, attempt {attempt + 1}); rows on the merger "
          f"{on_m}; pg_stat_subscription_stats (apply, sync errors) {errors}\n"
          "merger log:\n" + "\n".join(seen[:14]))


# --------------------------------------------------------------------------
# 3. Three writers leasing their worker ids from the merger
# --------------------------------------------------------------------------
def test_three_writers_leasing_from_the_merger(make_cluster):
    r = make_cluster(tcp=True, create_extension=True)
    writers = {}
    for origin in ("a", "b", "c"):
        w = make_cluster(tcp=True, settings={**LOGICAL_REPLICATION_SETTINGS,
                                            "snowflake_id.registry": r.conninfo()})
        run_sql_file(w, WRITER_SQL)
        writers[origin] = w
    mark = r.log_mark()
    run_sql_file(r, MERGER_SQL, **{f"conninfo_{o}": w.conninfo() for o, w in writers.items()})
    wait_until(lambda: subscriptions_ready(r), 60, "initial table sync")

    n_clients = CLIENTS_PER_WRITER * len(writers)
    barrier = threading.Barrier(n_clients)
    with ThreadPoolExecutor(n_clients) as pool:
        futures = {o: [pool.submit(_insert_rows, w, o, ROWS_PER_CLIENT, barrier)
                       for _ in range(CLIENTS_PER_WRITER)] for o, w in writers.items()}
        inserted = {o: sum(f.result() for f in fs) for o, fs in futures.items()}
    expected = {o: CLIENTS_PER_WRITER * ROWS_PER_CLIENT for o in writers}
    assert inserted == expected

    def caught_up():
        errors = subscription_errors(r)
        assert all(e == (0, 0) for e in errors.values()), errors
        return counts_by_origin(r) == expected
    wait_until(caught_up, 120, f"the merger to hold {expected}", interval=0.5)
    log = r.log(since=mark)
    assert "duplicate key" not in log and "conflict=" not in log
    assert not re.search(r"ERROR:", log), log[-3000:]
    merged = r.sql("SELECT id, origin FROM events ORDER BY id")
    assert len(merged) == len({i for i, _ in merged}) == sum(expected.values())
    # Each writer made its IDs under worker ids leased to it alone.
    used = {o: {worker_of(i) for i, oo in merged if oo == o} for o in writers}
    for a in writers:
        for b in writers:
            assert a == b or not used[a] & used[b], (a, b, used[a] & used[b])
        assert writers[a].scalar("SELECT mode FROM snowflake_config()") == "registry"
    holders = {name for (name,) in r.sql(
        "SELECT DISTINCT holder_name FROM snowflake_leases WHERE leased")}
    assert len(holders) == 3, holders
