"""Worker-id claims: churn with a tiny range, sharing when every id is
held, release and release order, several databases on one server, reloading the range,
read-only transactions, a claim never outliving its holder, a free id
always claimable (also while its last holder exits), a backend waiting for
the clock showing a wait event and going on after an interrupt that raises
nothing, and the claim's advisory lock surviving the
connection resets a pooler sends (DISCARD ALL, pg_advisory_unlock_all()).

Classic layout unless a test says otherwise: 41 bits of milliseconds since
2024-01-01, 10 worker bits, 12 sequence bits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from harness import PG_MAJOR, ClusterError, wait_until
from helpers import (assert_strictly_increasing, generate, held_count, my_worker_id,
                     sql_error, wait_released, worker_of)


# ------------------------------------------------ 1. churn with a tiny range
def _churn(make_cluster, seconds: float, clients: int = 32):
    """32 clients connecting, making IDs and disconnecting on 4 worker ids:
    when all 4 are held a claim shares one, so no client ever fails."""
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval())")
    stop = threading.Event()
    monitor = {"max_held": 0, "max_sessions": 0, "ids_seen": set(), "polls": 0}

    def client(k: int):
        ok = 0
        while not stop.is_set():
            with c.connect(application_name=f"churn{k}") as conn:
                conn.execute("INSERT INTO t SELECT FROM generate_series(1, 100)")
            ok += 1
        return ok

    def watch():
        with c.connect() as m:
            while not stop.is_set():
                held = m.execute(
                    "SELECT worker_ids_held FROM snowflake_config()").fetchone()[0]
                rows = m.execute(
                    "SELECT worker_id, sessions FROM snowflake_workers "
                    "WHERE sessions > 0").fetchall()
                monitor["max_held"] = max(monitor["max_held"], held, len(rows))
                monitor["max_sessions"] = max([monitor["max_sessions"]]
                                              + [n for _, n in rows])
                monitor["ids_seen"] |= {w for w, _ in rows}
                monitor["polls"] += 1
                time.sleep(0.01)

    with ThreadPoolExecutor(clients + 1) as pool:
        watcher = pool.submit(watch)
        futures = [pool.submit(client, k) for k in range(clients)]
        try:
            time.sleep(seconds)
        finally:
            stop.set()
        results = [f.result() for f in futures]  # re-raises any error
        watcher.result()

    ok = sum(results)
    assert ok >= 10, f"only {ok} successful connections in {seconds}s"

    total, distinct = c.sql("SELECT count(*), count(DISTINCT id) FROM t")[0]
    assert total == distinct == 100 * ok, (total, distinct, ok)
    workers = {r[0] for r in c.sql("SELECT DISTINCT (id >> 12) & 1023 FROM t")}
    assert workers <= {0, 1, 2, 3}, workers

    assert monitor["polls"] > 0
    assert monitor["max_held"] <= 4, monitor
    assert monitor["max_sessions"] > 1, f"32 clients on 4 ids never shared one: {monitor}"
    assert monitor["ids_seen"] <= {0, 1, 2, 3}, monitor

    # Every claim ends with its backend: nothing stays held, and the counters
    # add up to the successful connections.
    wait_until(lambda: held_count(c) == 0, what="all claims to be released")
    claims, issued, shared = c.sql(
        "SELECT sum(claims), sum(ids_issued), sum(shared_claims) FROM snowflake_workers")[0]
    assert (claims, issued) == (ok, 100 * ok)
    assert shared > 0
    return ok


def test_churn_tiny_range_short(make_cluster):
    _churn(make_cluster, seconds=5)


@pytest.mark.slow
def test_churn_tiny_range_long(make_cluster):
    _churn(make_cluster, seconds=20)


# ---------------------------------- 2. sharing, release, release order
def test_fifth_connection_shares_then_a_released_id_is_claimed_first(make_cluster):
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
            # No id is free: the fifth shares the one claimed least recently
            # (all have one session), instead of failing with 53400.
            first = ids[conns[0].info.backend_pid]
            got = fifth.execute("SELECT snowflake_nextval()").fetchone()[0]
            assert worker_of(got) == first
            assert my_worker_id(fifth) == first
            assert c.sql("SELECT pid, sessions, shared_claims FROM snowflake_workers "
                         "WHERE worker_id = %s", first) == [(fifth.info.backend_pid, 2, 1)]
            assert c.scalar("SELECT worker_ids_held FROM snowflake_config()") == 4

            leaving = conns.pop(2)
            released = ids[leaving.info.backend_pid]
            leaving.close()
            wait_released(c, released)
            # A free id comes before any shared one.
            with c.connect() as sixth:
                got = sixth.execute("SELECT snowflake_nextval()").fetchone()[0]
                assert worker_of(got) == released
                assert c.scalar("SELECT sessions FROM snowflake_workers "
                                "WHERE worker_id = %s", released) == 1
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
    # per ms), so a sharer, and the next holder, must continue above it.
    c = make_cluster(settings={"snowflake_id.worker_ids": "7",
                               "snowflake_id.sequence_bits": 2,
                               "snowflake_id.max_drift": "30s"},
                     create_extension=True)
    first = c.connect()
    a = [r[0] for r in first.execute("SELECT snowflake_nextvals(40000)")]
    assert {worker_of(i, sequence_bits=2) for i in a} == {7}
    with c.connect() as second:
        # The only id is held: the second session shares it.
        b = [r[0] for r in second.execute("SELECT snowflake_nextvals(1000)")]
        assert min(b) > max(a), (min(b), max(a))
        a2 = [r[0] for r in first.execute("SELECT snowflake_nextvals(1000)")]
        assert min(a2) > max(b)
        assert c.scalar("SELECT sessions FROM snowflake_workers WHERE worker_id = 7") == 2
        # A terminated holder releases its share too.
        c.sql("SELECT pg_terminate_backend(%s)", first.info.backend_pid)
        wait_until(lambda: c.scalar(
            "SELECT sessions FROM snowflake_workers WHERE worker_id = 7") == 1,
            what="the first session's share to be released")
        b2 = [r[0] for r in second.execute("SELECT snowflake_nextvals(1000)")]
    first.close()
    wait_released(c, 7)
    with c.connect() as third:
        d = [r[0] for r in third.execute("SELECT snowflake_nextvals(1000)")]
    for ids in (b, b2, d):
        assert {worker_of(i, sequence_bits=2) for i in ids} == {7}
    assert min(b2) > max(a2) and min(d) > max(b2), (min(d), max(b2))
    assert c.sql("SELECT claims, shared_claims, ids_issued FROM snowflake_workers "
                 "WHERE worker_id = 7") == [(3, 1, 44_000)]


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
        # Both ids are still held: a third session shares one (a's, claimed
        # first), not a "free" id whose lock was dropped.
        with c.connect() as third:
            assert worker_of(third.execute("SELECT snowflake_nextval()").fetchone()[0]) == wa
            assert c.scalar("SELECT sessions FROM snowflake_workers "
                            "WHERE worker_id = %s", wa) == 2


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
        # finds it full and shares an id.
        for db in ("db1", "db2"):
            with c.connect(dbname=db) as extra:
                got = worker_of(extra.execute("SELECT snowflake_nextval()").fetchone()[0])
                assert got in mine
                assert c.sql("SELECT sessions FROM snowflake_workers "
                             "WHERE worker_id = %s", got, dbname=db) == [(2,)]
            wait_until(lambda: c.sql("SELECT max(sessions) FROM snowflake_workers",
                                     dbname=db) == [(1,)],
                       what="the ninth connection's share to be released")
    finally:
        for _, conn in conns:
            conn.close()

    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == len(conns) * rounds * per_round
    assert len(set(all_ids)) == len(all_ids), "duplicate IDs across databases"
    for (db, _), w, ids in zip(conns, mine, results):
        assert {worker_of(i) for i in ids} == {w}, (db, w)
        assert_strictly_increasing(ids, f"{db} worker {w}")


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
                got = worker_of(third.execute("SELECT snowflake_nextval()").fetchone()[0])
                assert got in (5, 6)
                assert c.sql("SELECT worker_ids_held FROM snowflake_config()")[0] == (2,)
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
    # The batch is under way, and waiting for the clock: it has published
    # a first chunk of 4,096 IDs, which takes 64 ms of ticks with js53.
    # (No row until the batch has claimed its worker id: not yet, not an
    # error.)
    wait_until(lambda: c.scalar(
        "SELECT coalesce(bool_or(ids_issued >= 4096), false) FROM snowflake_workers"
        " WHERE pid = %s", pid),
        what="a batch waiting for the clock")
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


def test_an_interrupt_that_raises_nothing_does_not_stop_a_waiting_batch(make_cluster):
    # js53 with no drift allowed: the batch waits for the clock on almost
    # every millisecond. pg_log_backend_memory_contexts() interrupts the
    # backend (InterruptPending) without an error: the wait returns early,
    # the interrupt is handled once the claim is no longer borrowed, and the
    # batch goes on, every ID made once and in order.
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.max_drift": "0"},
                     create_extension=True)
    n = 64_000  # about a second of ticks
    with c.connect() as worker, c.connect() as watcher:
        pid = worker.info.backend_pid
        result = {}

        def batch():
            try:
                result["ids"] = [r[0] for r in worker.execute(
                    "SELECT snowflake_nextvals(%s)", (n,))]
            except psycopg.Error as e:
                result["error"] = e

        t = threading.Thread(target=batch, daemon=True)
        t.start()
        wait_until(lambda: watcher.execute(
            "SELECT ids_issued >= 4096 FROM snowflake_workers WHERE pid = %s",
            (pid,)).fetchone() == (True,), what="a batch waiting for the clock")
        signals = 0
        while t.is_alive():
            watcher.execute("SELECT pg_log_backend_memory_contexts(%s)", (pid,))
            signals += 1
            time.sleep(0.02)
        t.join()
    assert "error" not in result, str(result.get("error"))
    ids = result["ids"]
    assert len(ids) == n and len(set(ids)) == n
    assert_strictly_increasing(ids, "interrupted batch")
    assert signals >= 5, signals
    assert c.log().count(f"logging memory contexts of PID {pid}") >= 5


# ------------------------------------------ claim locks in pg_locks
CLAIM_CLASSID = 0x534E_4F57  # "SNOW": pg_locks.classid of claim locks


def claim_lock_holders(cluster) -> set[tuple[int, int]]:
    """(pid, worker id) of every claim lock in pg_locks."""
    return {(r[0], r[1]) for r in cluster.sql(
        "SELECT pid, objid::int FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid = %s::oid AND objsubid = 3 AND granted", CLAIM_CLASSID)}


# ------------------------------------ a free id is always claimable
def test_an_exiting_holder_never_makes_a_free_id_unclaimable(make_cluster):
    """The holder's exit callback used to clear holder_pid before
    PostgreSQL released the session advisory lock; a claim in between saw
    the id free, failed to lock it and reported 53400. Now a claim never
    fails while its id is held or being released: it shares the id or
    takes it free, and the exiting session's share is gone once it has
    left. The window is widened deterministically: the exiting session owns
    many temporary tables, whose removal runs as an exit callback after
    ours and before the lock manager's release."""
    c = make_cluster(settings={"snowflake_id.worker_ids": "0",
                               "max_locks_per_transaction": 256},
                     create_extension=True)
    for attempt in range(3):
        a = c.connect()
        a.execute("DO $$ BEGIN FOR i IN 1..2000 LOOP "
                  "EXECUTE format('CREATE TEMP TABLE t%s (x int)', i); "
                  "END LOOP; END $$")
        a.execute("SELECT snowflake_nextval()")
        pa = a.info.backend_pid
        a.close()
        with c.connect() as b:
            b.execute("SELECT snowflake_nextval()")
            assert my_worker_id(b) == 0
            pb = b.info.backend_pid
            wait_until(lambda: claim_lock_holders(c) == {(pb, 0)},
                       what="the exiting session's claim lock to go")
            assert c.sql("SELECT pid, sessions FROM snowflake_workers "
                         "WHERE worker_id = 0") == [(pb, 1)]
            assert pa != pb
        wait_until(lambda: c.scalar(
            "SELECT worker_ids_held FROM snowflake_config()") == 0,
            what="release")


# ------------------------------------- waiting for the clock is visible
@pytest.mark.skipif(PG_MAJOR < 17, reason="custom wait event names need PostgreSQL 17+")
def test_a_backend_waiting_for_the_clock_shows_a_wait_event(make_cluster):
    """Two IDs per 10-second tick and no drift: the third ID waits for the
    next tick. The wait shows as wait event SnowflakeClock (type
    Extension), and a cancel ends it at once."""
    c = make_cluster(settings={"snowflake_id.time_unit_ms": 10_000,
                               "snowflake_id.sequence_bits": 1,
                               "snowflake_id.max_drift": "0"},
                     create_extension=True)
    with c.connect() as waiter, c.connect() as watcher:
        pid = waiter.info.backend_pid
        failure = {}

        def run():
            try:
                waiter.execute("SELECT snowflake_nextvals(10)")
            except psycopg.Error as e:
                failure["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        row = wait_until(lambda: watcher.execute(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity "
            "WHERE pid = %s AND wait_event = 'SnowflakeClock'", (pid,)).fetchone(),
            timeout=30, what="the wait event in pg_stat_activity")
        assert row == ("Extension", "SnowflakeClock")
        started = time.monotonic()
        watcher.execute("SELECT pg_cancel_backend(%s)", (pid,))
        t.join(timeout=10)
        assert not t.is_alive(), "cancel did not end the wait"
        assert time.monotonic() - started < 5
        assert failure["error"].sqlstate == "57014", str(failure["error"])


# --------------------------------------------------- pooler lock survival
@pytest.mark.parametrize("worker_ids", ["0-3", "0"], ids=["own_ids", "shared_id"])
def test_claim_lock_survives_discard_all_and_unlock_all(make_cluster, worker_ids):
    """A pooler resets server connections with DISCARD ALL; applications
    call pg_advisory_unlock_all(). Both drop every session advisory lock.
    The claim is re-taken when the resetting transaction commits, so
    pg_locks always shows every holder, also when two sessions share one
    worker id (worker_ids = '0')."""
    c = make_cluster(settings={"snowflake_id.worker_ids": worker_ids},
                     create_extension=True)
    with c.connect() as a, c.connect() as b:
        a.execute("SELECT snowflake_nextval()")
        b.execute("SELECT snowflake_nextval()")
        wa = a.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]
        wb = b.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]
        pa, pb = a.info.backend_pid, b.info.backend_pid
        assert (wa == wb) == (worker_ids == "0")
        assert claim_lock_holders(c) == {(pa, wa), (pb, wb)}

        a.execute("DISCARD ALL")
        assert claim_lock_holders(c) == {(pa, wa), (pb, wb)}, "after DISCARD ALL"
        b.execute("SELECT pg_advisory_unlock_all()")
        assert claim_lock_holders(c) == {(pa, wa), (pb, wb)}, \
            "after pg_advisory_unlock_all()"
        # Inside a transaction block: back once it commits.
        a.execute("BEGIN")
        a.execute("SELECT pg_advisory_unlock_all()")
        a.execute("COMMIT")
        assert claim_lock_holders(c) == {(pa, wa), (pb, wb)}, "after COMMIT"
        # The lock is held once: it is gone as soon as the session ends.
        a.close()
        wait_until(lambda: claim_lock_holders(c) == {(pb, wb)},
                   what="a's claim lock to go")
        # Still the same ids, and IDs keep coming.
        assert b.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0] == wb
        b.execute("SELECT snowflake_nextval()")
