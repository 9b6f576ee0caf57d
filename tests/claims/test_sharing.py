"""Worker ids are never exhausted: when every id of the range is
held, a session shares the held id with the fewest sessions. The position
of each worker id is one word advanced by compare-and-swap, so IDs stay
distinct and each session's IDs strictly increase.

Classic layout: 41 bits of milliseconds, 10 worker bits, 12 sequence bits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import wait_until
from helpers import assert_strictly_increasing, held_count, my_worker_id, worker_of

CLAIM_LOCKS = ("SELECT pid, objid::int, mode FROM pg_locks WHERE locktype = 'advisory' "
               "AND database = 0 AND classid = 1397641047 AND objsubid = 3 AND granted")


def sessions_by_id(c) -> dict[int, int]:
    return dict(c.sql("SELECT worker_id, sessions FROM snowflake_workers "
                      "WHERE sessions > 0"))


@pytest.mark.parametrize("leased", [False, True], ids=["local", "leased"])
def test_capacity_12_holders_and_16_churning_clients_on_4_ids(make_cluster, leased):
    """The Capacity test: worker_ids = '0-3', 12 sessions holding IDs at
    once and 16 clients connecting, making IDs and disconnecting, all at
    the same time: no error, every ID distinct, each session's IDs strictly
    increasing. Once with this server's own ids, once with them leased
    from a registry (the block of ids 0-15, of which 0-3 may be used)."""
    settings = {"snowflake_id.worker_ids": "0-3", "max_connections": 60}
    if leased:
        r = make_cluster(create_extension=True)
        settings["snowflake_id.registry"] = r.conninfo()
    c = make_cluster(settings=settings, create_extension=True)
    holders = [c.connect(application_name=f"holder{k}") for k in range(12)]
    try:
        # Claimed one after the other: the fewest-sessions rule spreads
        # them evenly, three sessions per id.
        for h in holders:
            h.execute("SELECT snowflake_nextval()")
        mine = {h.info.backend_pid: my_worker_id(h) for h in holders}
        assert sorted(mine.values()) == sorted([0, 1, 2, 3] * 3), mine
        assert sessions_by_id(c) == {0: 3, 1: 3, 2: 3, 3: 3}
        assert c.scalar("SELECT sum(shared_claims) FROM snowflake_workers") == 8
        # pg_locks shows every holder, sharers included, in ShareLock mode.
        locks = c.sql(CLAIM_LOCKS)
        assert {(p, w) for p, w, _ in locks} == set(mine.items()), locks
        assert {m for _, _, m in locks} == {"ShareLock"}, locks

        stop = threading.Event()
        holder_ids: dict[int, list[int]] = {}
        churn_ids: list[list[int]] = []
        churn_lock = threading.Lock()

        def hold(h):
            got = []
            while not stop.is_set():
                got += [r[0] for r in h.execute("SELECT snowflake_nextvals(500)")]
            holder_ids[h.info.backend_pid] = got

        def churn(k):
            n = 0
            while not stop.is_set():
                with c.connect(application_name=f"churn{k}") as conn:
                    ids = [r[0] for r in conn.execute(
                        "SELECT snowflake_nextval() FROM generate_series(1, 100)")]
                    ids += [r[0] for r in conn.execute("SELECT snowflake_nextvals(100)")]
                with churn_lock:
                    churn_ids.append(ids)
                n += 1
            return n

        with ThreadPoolExecutor(28) as pool:
            hf = [pool.submit(hold, h) for h in holders]
            cf = [pool.submit(churn, k) for k in range(16)]
            # Run until enough churn has happened (at least 5 s), whatever
            # the machine's speed.
            started = time.monotonic()
            wait_until(lambda: len(churn_ids) >= 100 and time.monotonic() - started >= 5,
                       timeout=120, what="100 churning connections")
            stop.set()
            for f in hf + cf:
                f.result()  # re-raises any error: there must be none

        # Every ID distinct; each session's strictly increasing.
        every = [i for ids in holder_ids.values() for i in ids] + \
                [i for ids in churn_ids for i in ids]
        assert len(set(every)) == len(every), "duplicate IDs"
        assert {worker_of(i) for i in every} <= {0, 1, 2, 3}
        for pid, ids in holder_ids.items():
            assert len(ids) >= 500
            assert {worker_of(i) for i in ids} == {mine[pid]}
            assert_strictly_increasing(ids, f"holder {pid}")
        for k, ids in enumerate(churn_ids):
            assert len(ids) == 200
            assert len({worker_of(i) for i in ids}) == 1
            assert_strictly_increasing(ids, f"churn connection {k}")

        # The churners are gone; the holders still share evenly.
        wait_until(lambda: sessions_by_id(c) == {0: 3, 1: 3, 2: 3, 3: 3},
                   what="the churning sessions to release their ids")
        assert len(c.sql(CLAIM_LOCKS)) == 12
        claims, shared, issued = c.sql(
            "SELECT sum(claims), sum(shared_claims), sum(ids_issued) "
            "FROM snowflake_workers")[0]
        assert claims == 12 + len(churn_ids)
        assert shared == 8 + len(churn_ids), "every churning claim shared an id"
        assert issued == len(every) + 12  # and each holder's first ID
    finally:
        for h in holders:
            h.close()
    wait_until(lambda: held_count(c) == 0, what="all claims to be released")
    assert sessions_by_id(c) == {}


def test_a_shared_id_goes_to_the_fewest_sessions_and_free_ids_come_first(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-1"},
                     create_extension=True)
    conns = [c.connect() for _ in range(5)]
    try:
        got = []
        for conn in conns[:3]:
            conn.execute("SELECT snowflake_nextval()")
            got.append(my_worker_id(conn))
        # Two free ids, then the one claimed least recently is shared.
        assert got[2] == got[0] and got[1] != got[0], got
        assert sessions_by_id(c) == {got[0]: 2, got[1]: 1}
        # The fewest sessions: the other id.
        conns[3].execute("SELECT snowflake_nextval()")
        assert my_worker_id(conns[3]) == got[1]
        row = c.sql("SELECT pid, sessions, shared_claims, claims FROM snowflake_workers "
                    "WHERE worker_id = %s", got[1])[0]
        # The row names the most recent claim while its session holds it.
        assert row == (conns[3].info.backend_pid, 2, 1, 2), row
        # Both sessions on an id leave: it is free again and taken first,
        # before any shared one.
        conns[1].close()
        conns[3].close()
        wait_until(lambda: got[1] not in sessions_by_id(c), what="release")
        assert c.sql("SELECT pid, sessions FROM snowflake_workers WHERE worker_id = %s",
                     got[1]) == [(None, 0)]
        conns[4].execute("SELECT snowflake_nextval()")
        assert my_worker_id(conns[4]) == got[1]
        assert c.scalar("SELECT shared_claims FROM snowflake_workers WHERE worker_id = %s",
                        got[1]) == 1
        # The most recent claimant of a shared id leaves: the row no
        # longer names a session, and still counts the one left.
        conns[2].close()
        wait_until(lambda: sessions_by_id(c).get(got[0]) == 1, what="release")
        assert c.sql("SELECT pid, sessions FROM snowflake_workers WHERE worker_id = %s",
                     got[0]) == [(None, 1)]
        assert conns[0].execute("SELECT snowflake_nextval()").fetchone()[0] > 0
    finally:
        for conn in conns:
            conn.close()


def test_sharers_of_one_id_interleave_without_repeating(make_cluster):
    """One worker id and 4 ID sequence bits (16 IDs per ms), so the sharers
    collide on almost every ID and borrow ticks together."""
    c = make_cluster(settings={"snowflake_id.worker_ids": "5",
                               "snowflake_id.sequence_bits": 4,
                               "snowflake_id.max_drift": "10s"},
                     create_extension=True)
    conns = [c.connect() for _ in range(4)]
    try:
        barrier = threading.Barrier(len(conns))

        def work(conn):
            barrier.wait(timeout=60)
            got = []
            for _ in range(20):
                got += [r[0] for r in conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, 500)")]
            return got

        with ThreadPoolExecutor(len(conns)) as pool:
            results = list(pool.map(work, conns))
        every = [i for ids in results for i in ids]
        assert len(set(every)) == len(every) == 4 * 10_000
        for k, ids in enumerate(results):
            assert {worker_of(i, sequence_bits=4) for i in ids} == {5}
            assert_strictly_increasing(ids, f"session {k}")
        row = c.sql("SELECT sessions, shared_claims, ids_issued, sequence_exhausted "
                    "FROM snowflake_workers WHERE worker_id = 5")[0]
        full_ticks = sum(1 for i in every if i & 15 == 15)
        assert row == (4, 3, 40_000, full_ticks), row
    finally:
        for conn in conns:
            conn.close()


def test_a_sharer_arriving_while_the_first_session_holds_ids_ahead(make_cluster):
    """A session alone on its worker id takes sequence numbers ahead in the
    id's position (255 beyond each ID it makes through the position, claims::AHEAD) and
    makes those IDs without touching it; a session that starts sharing the
    id meanwhile continues above them in the same tick, takes none ahead,
    and the first goes on with the ones it holds, then above the sharer's.
    One-minute ticks, so that the test's IDs fall in one or two."""
    c = make_cluster(settings={"snowflake_id.worker_ids": "5",
                               "snowflake_id.time_unit_ms": 60_000},
                     create_extension=True)
    with c.connect() as a, c.connect() as b:
        nextval = "SELECT snowflake_nextval()"
        ids_a = [a.execute(nextval).fetchone()[0] for _ in range(3)]
        ids_b = []
        for _ in range(100):
            ids_b.append(b.execute(nextval).fetchone()[0])
            ids_a.append(a.execute(nextval).fetchone()[0])
        every = ids_a + ids_b
        assert len(set(every)) == len(every) == 203
        assert {worker_of(i) for i in every} == {5}
        assert_strictly_increasing(ids_a, "a")
        assert_strictly_increasing(ids_b, "b")

        def tick(i):
            return i >> 22

        def seq(i):
            return i & 4095

        if tick(ids_b[0]) == tick(ids_a[0]) == tick(ids_a[3]):
            # b's first ID is above a's first and the 255 a held with it;
            # a's next ones are those it held, below b's.
            assert seq(ids_b[0]) == seq(ids_a[0]) + 256, (ids_a[:4], ids_b[0])
            assert [seq(i) - seq(ids_a[0]) for i in ids_a[:4]] == [0, 1, 2, 3]
            assert ids_a[3] < ids_b[0]
        assert c.sql("SELECT sessions, ids_issued FROM snowflake_workers "
                     "WHERE worker_id = 5") == [(2, 203)]
