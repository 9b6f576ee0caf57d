"""Claims under an outside review (issue 10): a free worker id is always
claimable (defect 3), a waiting backend shows a wait event (defect 9), and
the claim's advisory lock survives connection resets a pooler sends
(DISCARD ALL, pg_advisory_unlock_all()).

Classic layout unless a test says otherwise."""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest

from conftest import PG_CONFIG, wait_until
from helpers import my_worker_id

CLAIM_CLASSID = 0x534E_4F57  # "SNOW": pg_locks.classid of claim locks


def pg_major() -> int:
    import subprocess
    out = subprocess.run([PG_CONFIG, "--version"], capture_output=True,
                         text=True, check=True).stdout
    return int(re.search(r"(\d+)", out).group(1))


def claim_lock_holders(cluster) -> set[tuple[int, int]]:
    """(pid, worker id) of every claim lock in pg_locks."""
    return {(r[0], r[1]) for r in cluster.sql(
        "SELECT pid, objid::int FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid = %s::oid AND objsubid = 3 AND granted", CLAIM_CLASSID)}


# ------------------------------------------------------------ defect 3
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


# ------------------------------------------------------------ defect 9
@pytest.mark.skipif(pg_major() < 17, reason="custom wait event names need PostgreSQL 17+")
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
