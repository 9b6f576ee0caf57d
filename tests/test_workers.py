"""Worker-id claims under churn, exhaustion and release order, several
databases on one server, crash restarts (with the clock behind the state
file), privileges, reloading the worker-id range, read-only transactions and
pg_dump/pg_restore.

Classic layout unless a test says otherwise: 41 bits of milliseconds since
2024-01-01, 10 worker bits, 12 sequence bits."""

from __future__ import annotations

import glob
import json
import os
import random
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from conftest import PG_BINDIR, ClusterError, _run_pg, wait_until

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
needs_faketime = pytest.mark.skipif(LIBFAKETIME is None,
                                    reason="libfaketime not installed")


# ----------------------------------------------------------------- helpers
def worker_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    return (i >> sequence_bits) & ((1 << worker_bits) - 1)


def ms_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    """Unix ms of an ID of a 1 ms-tick layout with the default epoch."""
    return (i >> (sequence_bits + worker_bits)) + EPOCH_MS


def my_worker_id(conn):
    return conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]


def held_count(cluster) -> int:
    return cluster.scalar("SELECT worker_ids_held FROM snowflake_config()")


def sql_error(conn, query, params=None) -> psycopg.Error:
    """Runs `query`, which must fail; returns the error."""
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(query, params)
    return ei.value


def wait_released(cluster, worker_id: int) -> None:
    wait_until(lambda: cluster.scalar(
        "SELECT pid IS NULL FROM snowflake_workers WHERE worker_id = %s",
        worker_id), what=f"worker id {worker_id} to be released")


def faketime_env(spec: str) -> dict:
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": spec,
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_RESET": "1"}


def generate(conn, n: int) -> list[int]:
    """n IDs from one connection, one snowflake_nextval() call each, in the
    order they were made."""
    return [r[0] for r in conn.execute(
        "SELECT snowflake_nextval() FROM generate_series(1, %s) "
        "ORDER BY generate_series", (n,))]


def assert_strictly_increasing(ids, label=""):
    bad = next((k for k in range(1, len(ids)) if ids[k] <= ids[k - 1]), None)
    assert bad is None, (f"{label}: IDs not strictly increasing at {bad}: "
                         f"{ids[bad - 1]} then {ids[bad]}")


def run_client(cluster, program: str, *args, check=True, timeout=300):
    """Runs a PostgreSQL client program against the cluster as the postgres
    OS user, e.g. run_client(c, "pg_dump", "-Fc", ...)."""
    return _run_pg([os.path.join(PG_BINDIR, program), "-h", cluster.dir,
                    "-p", str(cluster.port), "-U", "postgres", *args],
                   cwd=cluster.dir, check=check, timeout=timeout)


# ------------------------------------------------ 1. churn with a tiny range
def _churn(make_cluster, seconds: float, clients: int = 32):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval())")
    stop = threading.Event()
    exhausted_sample: list[psycopg.Error] = []
    monitor = {"max_held": 0, "ids_seen": set(), "polls": 0}

    def client(k: int):
        rnd = random.Random(k)
        ok = exhausted = 0
        while not stop.is_set():
            try:
                with c.connect(application_name=f"churn{k}") as conn:
                    conn.execute("INSERT INTO t SELECT FROM generate_series(1, 100)")
                ok += 1
            except psycopg.Error as e:
                if e.sqlstate != "53400":
                    raise
                exhausted += 1
                if not exhausted_sample:
                    exhausted_sample.append(e)
                time.sleep(rnd.uniform(0, 0.005))
        return ok, exhausted

    def watch():
        with c.connect() as m:
            while not stop.is_set():
                held = m.execute(
                    "SELECT worker_ids_held FROM snowflake_config()").fetchone()[0]
                ids = {r[0] for r in m.execute(
                    "SELECT worker_id FROM snowflake_workers WHERE pid IS NOT NULL")}
                monitor["max_held"] = max(monitor["max_held"], held, len(ids))
                monitor["ids_seen"] |= ids
                monitor["polls"] += 1
                time.sleep(0.01)

    with ThreadPoolExecutor(clients + 1) as pool:
        watcher = pool.submit(watch)
        futures = [pool.submit(client, k) for k in range(clients)]
        try:
            time.sleep(seconds)
        finally:
            stop.set()
        results = [f.result() for f in futures]  # re-raises unexpected errors
        watcher.result()

    ok = sum(r[0] for r in results)
    exhausted = sum(r[1] for r in results)
    assert ok >= 10, f"only {ok} successful connections in {seconds}s"
    assert exhausted > 0, "32 clients on 4 worker ids never hit 53400"
    e = exhausted_sample[0]
    assert "all 4 snowflake worker ids" in e.diag.message_primary, str(e)
    assert "snowflake_id.worker_ids" in (e.diag.message_hint or ""), str(e)

    total, distinct = c.sql("SELECT count(*), count(DISTINCT id) FROM t")[0]
    assert total == distinct == 100 * ok, (total, distinct, ok)
    workers = {r[0] for r in c.sql("SELECT DISTINCT (id >> 12) & 1023 FROM t")}
    assert workers <= {0, 1, 2, 3}, workers

    assert monitor["polls"] > 0
    assert monitor["max_held"] <= 4, monitor
    assert monitor["ids_seen"] <= {0, 1, 2, 3}, monitor

    # Every claim ends with its backend: nothing stays held, and the counters
    # add up to the successful connections.
    wait_until(lambda: held_count(c) == 0, what="all claims to be released")
    claims, issued = c.sql(
        "SELECT sum(claims), sum(ids_issued) FROM snowflake_workers")[0]
    assert (claims, issued) == (ok, 100 * ok)
    return ok, exhausted


def test_churn_tiny_range_short(make_cluster):
    _churn(make_cluster, seconds=5)


@pytest.mark.slow
def test_churn_tiny_range_long(make_cluster):
    _churn(make_cluster, seconds=20)


# ------------------------------------- 2. exhaustion, release, release order
def test_fifth_connection_is_refused_then_gets_the_released_id(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    conns = [c.connect() for _ in range(4)]
    try:
        ids = {}
        for conn in conns:
            conn.execute("SELECT snowflake_nextval()")
            ids[conn.info.backend_pid] = my_worker_id(conn)
        assert sorted(ids.values()) == [0, 1, 2, 3]
        held = dict(c.sql("SELECT pid, worker_id FROM snowflake_workers "
                          "WHERE pid IS NOT NULL"))
        assert held == ids
        cfg = c.sql("SELECT worker_ids, worker_ids_total, worker_ids_held, "
                    "worker_ids_free, my_worker_id FROM snowflake_config()")[0]
        assert cfg == ("0-3", 4, 4, 0, None)

        with c.connect() as fifth:
            e = sql_error(fifth, "SELECT snowflake_nextval()")
            assert e.sqlstate == "53400", str(e)
            assert re.search(r"\ball 4 snowflake worker ids\b",
                             e.diag.message_primary), e.diag.message_primary
            assert "snowflake_id.worker_ids" in (e.diag.message_hint or ""), str(e)
            assert my_worker_id(fifth) is None
            e = sql_error(fifth, "SELECT snowflake_nextvals(10)")
            assert e.sqlstate == "53400"

            leaving = conns.pop(2)
            released = ids[leaving.info.backend_pid]
            leaving.close()
            wait_released(c, released)
            got = fifth.execute("SELECT snowflake_nextval()").fetchone()[0]
            assert worker_of(got) == released
            assert my_worker_id(fifth) == released
            # And the range is full again.
            with c.connect() as sixth:
                assert sql_error(sixth, "SELECT snowflake_nextval()").sqlstate == "53400"
    finally:
        for conn in conns:
            conn.close()


def test_least_recently_released_is_claimed_first(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    by_id = {}
    for _ in range(4):
        conn = c.connect()
        conn.execute("SELECT snowflake_nextval()")
        by_id[my_worker_id(conn)] = conn
    assert sorted(by_id) == [0, 1, 2, 3]
    for w in (2, 0, 3, 1):
        by_id.pop(w).close()
        wait_released(c, w)

    got, conns = [], []
    try:
        for _ in range(4):
            conn = c.connect()
            conns.append(conn)
            i = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
            got.append(worker_of(i))
        assert got == [2, 0, 3, 1]
    finally:
        for conn in conns:
            conn.close()


def test_next_holder_continues_above_the_previous_one(make_cluster):
    # One worker id; the first holder runs ~10 s ahead of the clock (4 IDs
    # per ms), so the next holder must take over the generator state.
    c = make_cluster(settings={"snowflake_id.worker_ids": "7",
                               "snowflake_id.sequence_bits": 2,
                               "snowflake_id.max_drift": "30s"},
                     create_extension=True)
    first = c.connect()
    a = [r[0] for r in first.execute("SELECT snowflake_nextvals(40000)")]
    assert {worker_of(i, sequence_bits=2) for i in a} == {7}
    with c.connect() as second:
        e = sql_error(second, "SELECT snowflake_nextval()")
        assert e.sqlstate == "53400"
        assert "all 1 snowflake worker ids" in e.diag.message_primary
        # A terminated holder releases its claim too.
        c.sql("SELECT pg_terminate_backend(%s)", first.info.backend_pid)
        wait_released(c, 7)
        b = [r[0] for r in second.execute("SELECT snowflake_nextvals(1000)")]
    first.close()
    assert {worker_of(i, sequence_bits=2) for i in b} == {7}
    assert min(b) > max(a), (min(b), max(a))
    assert c.scalar("SELECT claims FROM snowflake_workers WHERE worker_id = 7") == 2


def test_dropping_advisory_locks_does_not_free_a_claim(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-1"},
                     create_extension=True)
    with c.connect() as a, c.connect() as b:
        wa = worker_of(a.execute("SELECT snowflake_nextval()").fetchone()[0])
        a.execute("SELECT pg_advisory_unlock_all()")
        a.execute("DISCARD ALL")
        wb = worker_of(b.execute("SELECT snowflake_nextval()").fetchone()[0])
        assert wb != wa
        assert worker_of(a.execute("SELECT snowflake_nextval()").fetchone()[0]) == wa
        with c.connect() as third:
            assert sql_error(third, "SELECT snowflake_nextval()").sqlstate == "53400"


# ------------------------------------------- 3. two databases, one server
def test_two_databases_share_the_worker_ids(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-7"})
    for db in ("db1", "db2"):
        c.create_db(db)
        c.create_extension(dbname=db)
        c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval())",
              dbname=db)
    per_db, rounds, per_round = 4, 5, 10_000
    conns = [(db, c.connect(dbname=db)) for db in ("db1", "db2")
             for _ in range(per_db)]
    barrier = threading.Barrier(len(conns))

    def work(conn):
        got = []
        try:
            for _ in range(rounds):
                barrier.wait(timeout=120)
                got += generate(conn, per_round)
        except BaseException:
            barrier.abort()
            raise
        return got

    try:
        with ThreadPoolExecutor(len(conns)) as pool:
            results = list(pool.map(work, [conn for _, conn in conns]))
        mine = [my_worker_id(conn) for _, conn in conns]
        assert len(set(mine)) == len(conns), f"worker id held twice: {mine}"
        # Each database's view lists the holders of both databases.
        for db in ("db1", "db2"):
            rows = c.sql("SELECT worker_id, pid, database FROM snowflake_workers "
                         "WHERE pid IS NOT NULL", dbname=db)
            assert {(w, p, d) for w, p, d in rows} == {
                (w, conn.info.backend_pid, d)
                for w, (d, conn) in zip(mine, conns)}, rows
        # The range is server-wide: a ninth connection, in either database,
        # finds it full.
        for db in ("db1", "db2"):
            with c.connect(dbname=db) as extra:
                assert sql_error(extra, "SELECT snowflake_nextval()").sqlstate == "53400"
    finally:
        for _, conn in conns:
            conn.close()

    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == len(conns) * rounds * per_round
    assert len(set(all_ids)) == len(all_ids), "duplicate IDs across databases"
    for (db, _), w, ids in zip(conns, mine, results):
        assert {worker_of(i) for i in ids} == {w}, (db, w)
        assert_strictly_increasing(ids, f"{db} worker {w}")


# ------------------------------------------------------ 4. crash restarts
# Four sequence values per millisecond and a 30 s drift bound: 40,000 IDs from
# one connection run about 10 s ahead of the clock, so after a quick restart
# only the reservation (state file, or WAL replayed in crash recovery) keeps
# new IDs above the old ones.
DRIFT_LAYOUT = {"snowflake_id.sequence_bits": 2, "snowflake_id.max_drift": "30s",
                "snowflake_id.worker_ids": "0-3"}


def _generate_per_worker(c, n_conns: int, n: int, sequence_bits: int = 12,
                         batch: bool = True) -> dict[int, list[int]]:
    """n IDs from each of n_conns connections, all holding their worker id
    at the same time (so each id is used once): {worker id: IDs in order}.
    batch: one snowflake_nextvals(n) call, else n snowflake_nextval() calls."""
    out = {}
    conns = [c.connect() for _ in range(n_conns)]
    try:
        for conn in conns:  # claim all first
            conn.execute("SELECT snowflake_nextval()")
        for conn in conns:
            if batch:
                ids = [r[0] for r in conn.execute("SELECT snowflake_nextvals(%s)", (n,))]
            else:
                ids = generate(conn, n)
            w = my_worker_id(conn)
            assert {worker_of(i, sequence_bits) for i in ids} == {w}
            assert_strictly_increasing(ids, f"worker {w}")
            out[w] = ids
    finally:
        for conn in conns:
            conn.close()
    return out


@pytest.mark.parametrize("crash", ["immediate_stop", "backend_sigkill", "clean_stop"])
def test_crash_restart_never_repeats_ids(make_cluster, crash):
    c = make_cluster(settings=DRIFT_LAYOUT, create_extension=True)
    old = _generate_per_worker(c, 4, 40_000, sequence_bits=2)
    assert sorted(old) == [0, 1, 2, 3]
    newest_ms = max(ms_of(max(ids), sequence_bits=2) for ids in old.values())
    ahead = newest_ms - time.time() * 1000
    assert ahead > 3000, f"the IDs should run well ahead of the clock ({ahead} ms)"

    state_path = os.path.join(c.datadir, "snowflake_id.state")
    assert os.path.isfile(state_path), os.listdir(c.datadir)
    with open(state_path) as f:
        state = json.load(f)
    assert state["reserved_until_ms"] >= newest_ms, (state, newest_ms)
    assert state["layout"]["sequence_bits"] == 2, state

    if crash in ("immediate_stop", "clean_stop"):
        # After a clean stop there is no WAL to replay: the state file alone
        # must hold the reservation.
        c.stop(mode="immediate" if crash == "immediate_stop" else "fast")
        c.start()
    else:
        mark = c.log_mark()
        with c.connect() as victim:
            victim.execute("SELECT snowflake_nextval()")
            pid = victim.info.backend_pid
            os.kill(pid, signal.SIGKILL)
        c.wait_for_log(r"all server processes terminated; reinitializing", since=mark)
        wait_until(lambda: _accepts_connections(c), what="server to come back")

    new = _generate_per_worker(c, 4, 2_000, sequence_bits=2)
    assert sorted(new) == sorted(old), "the same worker ids were not reused"
    for w, ids in new.items():
        assert min(ids) > max(old[w]), (
            f"worker {w}: new ID {min(ids)} not above old {max(old[w])}")
    everything = [i for ids in (*old.values(), *new.values()) for i in ids]
    assert len(set(everything)) == len(everything)


def _accepts_connections(c) -> bool:
    try:
        return c.scalar("SELECT 1") == 1
    except psycopg.OperationalError:
        return False


# -------------------------------------- 5. clock set back after a restart
def _ids_then_restart_behind(make_cluster, max_drift: str, behind_s: int):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3",
                               "snowflake_id.max_drift": max_drift},
                     create_extension=True)
    old = _generate_per_worker(c, 4, 5_000, batch=False)
    c.stop(mode="immediate")
    c.start(env=faketime_env(f"-{behind_s}s"))
    skew = c.scalar("SELECT extract(epoch FROM clock_timestamp())::float8") - time.time()
    assert -behind_s - 2 < skew < -behind_s + 2, f"server clock not set back: skew {skew}s"
    return c, old


@needs_faketime
def test_clock_behind_after_restart_borrows_within_max_drift(make_cluster):
    c, old = _ids_then_restart_behind(make_cluster, max_drift="10s", behind_s=5)
    new = _generate_per_worker(c, 4, 5_000, batch=False)
    assert sorted(new) == sorted(old)
    for w, ids in new.items():
        assert min(ids) > max(old[w]), w
    everything = [i for ids in (*old.values(), *new.values()) for i in ids]
    assert len(set(everything)) == len(everything)
    drift = c.sql("SELECT worker_id, max_drift_ms FROM snowflake_workers "
                  "ORDER BY worker_id")
    assert [r[0] for r in drift] == [0, 1, 2, 3]
    # The IDs ran ahead of the (set back) clock, within the bound.
    assert all(0 < r[1] <= 10_000 for r in drift), drift


@needs_faketime
def test_clock_behind_after_restart_beyond_max_drift_is_refused(make_cluster):
    c, old = _ids_then_restart_behind(make_cluster, max_drift="1s", behind_s=8)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_nextval()")
        assert e.sqlstate == "55000", str(e)
        m = re.search(r"system clock is (\d+) ms behind", e.diag.message_primary)
        assert m, e.diag.message_primary
        assert 1000 < int(m.group(1)) < 12_000, m.group(0)
        assert "1000 ms" in (e.diag.message_detail or ""), str(e)
        hint = e.diag.message_hint or ""
        assert "clock" in hint and "snowflake_id.max_drift" in hint, hint
        # Same for a batch; and nothing was issued.
        assert sql_error(conn, "SELECT snowflake_nextvals(5)").sqlstate == "55000"
        w = my_worker_id(conn)
        issued = c.scalar("SELECT ids_issued FROM snowflake_workers "
                          "WHERE worker_id = %s", w)
        assert issued == 0, issued

        # The documented remedy: raise the bound and reload.
        c.configure(**{"snowflake_id.max_drift": "10s"})
        c.reload()
        wait_until(lambda: conn.execute(
            "SELECT max_drift_ms FROM snowflake_config()").fetchone()[0] == 10_000,
            what="max_drift reload")
        ids = generate(conn, 1000)
    assert_strictly_increasing(ids)
    assert min(ids) > max(old[w])
    assert not set(ids) & {i for v in old.values() for i in v}


# ----------------------------------------------------------- 6. privileges
@pytest.fixture
def app_cluster(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    c.sql("CREATE ROLE app LOGIN")
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), v text)")
    c.sql("GRANT SELECT, INSERT ON t TO app")
    return c


def test_app_role_advisory_locks_cannot_block_a_claim(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("SELECT pg_advisory_lock(0)")
        app.execute("SELECT pg_advisory_lock(1397641047, 0)")  # 'SNOW', 0
        app.execute("SELECT pg_advisory_lock(1397641047::bigint << 32)")
        app.execute("SELECT pg_advisory_lock(1397641047, 3)")
        with c.connect() as other:
            i = other.execute("SELECT snowflake_nextval()").fetchone()[0]
            assert worker_of(i) == 0
            assert my_worker_id(other) == 0


def test_app_role_inserts_with_the_default(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("INSERT INTO t (v) VALUES ('a')")
        app.execute("INSERT INTO t (v) SELECT 'b' FROM generate_series(1, 99)")
        n, distinct, w = app.execute(
            "SELECT count(*), count(DISTINCT id), min((id >> 12) & 1023) FROM t"
        ).fetchone()
        assert (n, distinct) == (100, 100)
        assert my_worker_id(app) == w
        role = c.scalar("SELECT role FROM snowflake_workers WHERE worker_id = %s", w)
        assert role == "app"


def test_app_role_reads_snowflake_workers(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("INSERT INTO t (v) VALUES ('a')")
        rows = app.execute("SELECT worker_id, role FROM snowflake_workers "
                           "WHERE pid = pg_backend_pid()").fetchall()
        assert rows == [(my_worker_id(app), "app")]


def test_app_role_is_refused_changing_how_ids_are_made(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        e = sql_error(app, "ALTER SYSTEM SET snowflake_id.worker_ids = '0-1'")
        assert e.sqlstate == "42501", str(e)
        e = sql_error(app, "SET snowflake_id.worker_ids = '0-1'")
        assert e.sqlstate in ("55P02", "42501"), str(e)
        e = sql_error(app, "SET snowflake_id.max_drift = '1h'")
        assert e.sqlstate in ("55P02", "42501"), str(e)
        e = sql_error(app, "SELECT snowflake_accept_layout()")
        assert e.sqlstate == "42501", str(e)
        assert c.scalar("SHOW snowflake_id.worker_ids") == "0-3"
    # Even with EXECUTE granted, the function checks for a superuser itself.
    c.sql("GRANT EXECUTE ON FUNCTION snowflake_accept_layout() TO app")
    with c.connect(user="app") as app:
        e = sql_error(app, "SELECT * FROM snowflake_accept_layout()")
        assert e.sqlstate == "42501", str(e)
        assert "snowflake_accept_layout" in e.diag.message_primary


# ---------------------------------------------------- 7. range on reload
def _new_worker_id(c) -> int:
    with c.connect() as conn:
        return worker_of(conn.execute("SELECT snowflake_nextval()").fetchone()[0])


def test_worker_ids_change_on_reload(make_cluster):
    c = make_cluster(create_extension=True)
    with c.connect() as keeper:
        kept = worker_of(keeper.execute("SELECT snowflake_nextval()").fetchone()[0])
        assert kept == 0
        c.sql("ALTER SYSTEM SET snowflake_id.worker_ids = '5-6'")
        c.sql("SELECT pg_reload_conf()")
        wait_until(lambda: c.scalar("SHOW snowflake_id.worker_ids") == "5-6",
                   what="reload")
        held = [c.connect() for _ in range(2)]
        try:
            got = sorted(worker_of(h.execute("SELECT snowflake_nextval()").fetchone()[0])
                         for h in held)
            assert got == [5, 6]
            assert c.sql("SELECT worker_ids, worker_ids_total, worker_ids_held "
                         "FROM snowflake_config()")[0] == ("5-6", 2, 2)
            with c.connect() as third:
                e = sql_error(third, "SELECT snowflake_nextval()")
                assert e.sqlstate == "53400"
                assert "all 2 snowflake worker ids" in e.diag.message_primary
        finally:
            for h in held:
                h.close()
        # A claim made before the reload stays.
        assert worker_of(keeper.execute("SELECT snowflake_nextval()").fetchone()[0]) == kept
        assert my_worker_id(keeper) == kept

    # Invalid values: ALTER SYSTEM refuses them ...
    with c.connect() as conn:
        for bad in ("9999", "abc", "0-1024", "3-1"):
            e = sql_error(conn, f"ALTER SYSTEM SET snowflake_id.worker_ids = '{bad}'")
            assert e.sqlstate == "22023", (bad, str(e))
            assert "invalid value for parameter" in e.diag.message_primary
    assert c.scalar("SHOW snowflake_id.worker_ids") == "5-6"

    # ... and a reload of a config file holding them keeps the old value.
    c.sql("ALTER SYSTEM RESET snowflake_id.worker_ids")
    c.configure(**{"snowflake_id.worker_ids": "5-6"})
    c.reload()
    for bad in ("9999", "abc"):
        mark = c.log_mark()
        c.configure(**{"snowflake_id.worker_ids": bad})
        c.reload()
        c.wait_for_log(r'invalid value for parameter "snowflake_id\.worker_ids": "'
                       + bad + '"', since=mark)
        assert c.scalar("SHOW snowflake_id.worker_ids") == "5-6"
        assert _new_worker_id(c) in (5, 6)


@pytest.mark.parametrize("settings", [
    {"snowflake_id.worker_ids": "abc"},
    {"snowflake_id.worker_ids": "512-1023", "snowflake_id.layout": "js53"},
], ids=["malformed", "beyond_layout"])
def test_invalid_worker_ids_at_start_never_widen_the_range(make_cluster, settings):
    c = make_cluster(settings=settings, start=False)
    # The server refuses to start, saying why, rather than falling back to
    # every worker id of the layout (which could collide with other servers).
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log()
    assert 'invalid value for parameter "snowflake_id.worker_ids"' in log, log[-2000:]
    assert "FATAL" in log, log[-2000:]


# ------------------------------------------------ 8. read-only transaction
def test_read_only_transaction_can_generate(cluster):
    with cluster.connect(autocommit=False) as conn:
        conn.execute("BEGIN READ ONLY")
        assert conn.execute("SHOW transaction_read_only").fetchone()[0] == "on"
        a = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
        batch = [r[0] for r in conn.execute("SELECT snowflake_nextvals(10)")]
        conn.commit()
        assert a > 0 and len(batch) == 10 and min(batch) > a
    with cluster.connect(autocommit=False) as conn:
        conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        conn.commit()
        assert conn.execute("SELECT snowflake_nextval()").fetchone()[0] > 0
        conn.commit()


# --------------------------------------------------- 9. pg_dump/pg_restore
def test_dump_and_restore_into_a_new_database(make_cluster):
    c = make_cluster()
    c.create_db("src")
    c.create_extension(dbname="src")
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), v int)",
          dbname="src")
    c.sql("INSERT INTO t (v) SELECT g FROM generate_series(1, 1000) g", dbname="src")
    src_max = c.scalar("SELECT max(id) FROM t", dbname="src")

    dump = os.path.join(c.dir, "src.dump")
    run_client(c, "pg_dump", "-Fc", "-f", dump, "-d", "src")
    c.create_db("dst")
    run_client(c, "pg_restore", "--exit-on-error", "-d", "dst", dump)

    assert c.scalar("SELECT count(*) FROM pg_extension WHERE extname = 'snowflake_id'",
                    dbname="dst") == 1
    n, restored_max = c.sql("SELECT count(*), max(id) FROM t", dbname="dst")[0]
    assert (n, restored_max) == (1000, src_max)
    default = c.scalar("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef "
                       "WHERE adrelid = 't'::regclass", dbname="dst")
    assert "snowflake_nextval()" in default, default
    c.sql("INSERT INTO t (v) SELECT g FROM generate_series(1001, 1100) g", dbname="dst")
    new = [r[0] for r in c.sql("SELECT id FROM t WHERE v > 1000", dbname="dst")]
    assert len(new) == 100 and min(new) > restored_max
    assert c.scalar("SELECT count(DISTINCT id) FROM t", dbname="dst") == 1100


# ------------------------------------- a claim never outlives its holder
def test_terminating_a_backend_that_waits_for_the_clock_releases_its_id(make_cluster):
    # js53 with no drift allowed: a large batch sleeps on almost every
    # millisecond, so the terminate lands while the generator waits. A FATAL
    # error exits without unwinding; the worker id must still be released.
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.max_drift": "0"},
                     create_extension=True)
    victim = c.connect()
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    done = threading.Event()

    def long_batch():
        try:
            victim.execute("SELECT count(*) FROM snowflake_nextvals(1000000)")
        except psycopg.Error:
            pass
        finally:
            done.set()

    t = threading.Thread(target=long_batch)
    t.start()
    wait_until(lambda: c.scalar(
        "SELECT count(*) FROM snowflake_workers WHERE pid = %s", pid), what="claim")
    time.sleep(0.5)
    assert c.scalar("SELECT pg_terminate_backend(%s)", pid)
    assert done.wait(30)
    t.join()
    wait_until(lambda: c.scalar(
        "SELECT worker_ids_held = 0 FROM snowflake_config()"), what="release")
    log = c.log()
    assert "already borrowed" not in log, log[-3000:]
    # Every id is free again: 64 connections can each claim one.
    conns = [c.connect() for _ in range(64)]
    try:
        for conn in conns:
            conn.execute("SELECT snowflake_nextval()")
        assert c.scalar("SELECT worker_ids_held FROM snowflake_config()") == 64
    finally:
        for conn in conns:
            conn.close()
        victim.close()


def test_unreadable_state_file_refuses_to_start(make_cluster):
    c = make_cluster(create_extension=True)
    c.scalar("SELECT snowflake_nextval()")
    c.stop()
    state = os.path.join(c.datadir, "snowflake_id.state")
    with open(state, "w") as f:
        f.write("{not json")
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    assert 'snowflake_id state file "snowflake_id.state" is unreadable' in log, log[-2000:]
    assert "Restore the file from a backup" in log, log[-2000:]
    # The documented way out: move the file away (the clock is fine here).
    os.rename(state, state + ".broken")
    c.start()
    assert c.scalar("SELECT snowflake_nextval()") > 0
