"""Backfill: snowflake_at(ts) makes IDs that decode to a past time and equal
no other ID (live ones, other backfills, before and after a crash), from
worker ids set aside by snowflake_id.backfill_worker_ids; it refuses times
it cannot cover, configurations that would break that, and roles that were
not granted it. The rules and the proof are in core/src/backfill.rs."""

from __future__ import annotations

import datetime as dt
import random
import threading

import pytest

from harness import ClusterError, wait_until
from helpers import sql_error

UTC = dt.timezone.utc
SET_ASIDE = {"snowflake_id.backfill_worker_ids": "1022-1023"}
# Times of 2024 and 2025, several on one millisecond, not in order.
TIMES = [dt.datetime(2024, 3, 1, tzinfo=UTC) + dt.timedelta(hours=7 * i, milliseconds=i % 3)
         for i in range(200)]


def _decode(conn, ids):
    return conn.execute(
        "SELECT id, ts, worker_id, sequence FROM unnest(%s::bigint[]) id, snowflake_decode(id)",
        (ids,)).fetchall()


def _backfill(conn, times):
    return [r[0] for r in conn.execute(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) WITH ORDINALITY u(t, n) ORDER BY n",
        (times,)).fetchall()]


def test_backfill_is_refused_until_ids_are_set_aside(cluster):
    with cluster.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "55000", str(e)
        assert "no worker ids are set aside" in e.diag.message_primary
        assert "snowflake_id.backfill_worker_ids" in e.diag.message_hint


def test_backfill_ids_decode_to_their_time_never_repeat_and_survive_a_crash(make_cluster):
    c = make_cluster(settings=SET_ASIDE, create_extension=True)
    made = []
    with c.connect() as conn:
        ids = _backfill(conn, TIMES + TIMES)  # each time twice, unordered
        rows = _decode(conn, ids)
        for (i, ts, worker, _seq), want in zip(rows, TIMES + TIMES):
            assert ts == want.replace(microsecond=want.microsecond // 1000 * 1000), (i, ts, want)
            assert worker in (1022, 1023)
        assert len(set(ids)) == len(ids)
        made += ids
        # A rollback does not hand the same IDs out again.
        conn.execute("BEGIN")
        rolled = _backfill(conn, TIMES[:10])
        conn.execute("ROLLBACK")
        made += rolled
        made += _backfill(conn, TIMES[:10])
        live = [r[0] for r in conn.execute(
            "SELECT snowflake_nextval() FROM generate_series(1, 2000)").fetchall()]
        assert all(w not in (1022, 1023) for _i, _t, w, _s in _decode(conn, live[:5] + live[-5:]))
        made += live
        grants = conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0]
        assert grants > 0
    # Several sessions at once, the same times, each in its own order.
    def work(seed, out):
        times = TIMES[:]
        random.Random(seed).shuffle(times)
        with c.connect() as conn:
            out.extend(_backfill(conn, times))
    outs = [[] for _ in range(4)]
    threads = [threading.Thread(target=work, args=(n, outs[n])) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in outs:
        assert len(out) == len(TIMES)
        made += out
    # A crash: the grants handed out are durable, new ones come after them.
    c.stop(mode="immediate")
    c.start()
    with c.connect() as conn:
        after = conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0]
        assert after >= grants
        made += _backfill(conn, TIMES + TIMES)
    assert len(made) == len(set(made)), "a backfill ID was made twice"


def test_a_time_ordered_import_uses_few_grants(make_cluster):
    c = make_cluster(settings=SET_ASIDE, create_extension=True)
    with c.connect() as conn:
        conn.execute("""CREATE TABLE imported AS
            SELECT snowflake_at(t) AS id, t FROM generate_series(
              '2024-02-01'::timestamptz, '2024-02-28', interval '1 minute') t ORDER BY t""")
        n, distinct, ordered = conn.execute("""SELECT count(*), count(DISTINCT id),
            bool_and(snowflake_timestamp(id) = t) FROM imported""").fetchone()
        assert n == distinct == 38881 and ordered
        buckets, grants = conn.execute(
            "SELECT count(*), sum(grants) FROM snowflake_backfill()").fetchone()
        # One grant per stretch of time crossed (about 1.55 days each).
        assert grants == buckets and 18 <= buckets <= 19, (buckets, grants)


def test_js53_backfill_ids_stay_below_2_to_the_53(make_cluster):
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.backfill_worker_ids": "60-63"},
                     create_extension=True)
    with c.connect() as conn:
        ids = _backfill(conn, TIMES)
        assert max(ids) < 2 ** 53 and len(set(ids)) == len(ids)
        assert conn.execute("SELECT bool_and(snowflake_worker_id(id) BETWEEN 60 AND 63) "
                            "FROM unnest(%s::bigint[]) id", (ids,)).fetchone()[0]


def test_times_it_cannot_cover_are_refused(make_cluster):
    c = make_cluster(settings=SET_ASIDE, create_extension=True)
    with c.connect() as conn:
        for ts, words in [("2023-12-31 23:59:59+00", "before the layout's epoch"),
                          ("now() + interval '2 minutes'", "ahead of the clock"),
                          ("'infinity'::timestamptz", "infinity")]:
            expr = ts if "(" in ts or "::" in ts else f"'{ts}'"
            e = sql_error(conn, f"SELECT snowflake_at({expr})")
            assert e.sqlstate == "22008", (ts, str(e))
            assert words in str(e), (ts, str(e))
        # Within max_drift of the clock is fine.
        conn.execute("SELECT snowflake_at(now() + interval '30 seconds')")
        assert conn.execute("SELECT snowflake_at(NULL)").fetchone()[0] is None


def test_only_granted_roles_may_backfill(make_cluster):
    c = make_cluster(settings=SET_ASIDE, create_extension=True)
    c.sql("CREATE ROLE importer LOGIN; CREATE ROLE other LOGIN")
    c.sql("GRANT EXECUTE ON FUNCTION snowflake_at(timestamptz) TO importer")
    with c.connect(user="other") as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "42501", str(e)
    with c.connect(user="importer") as conn:
        assert conn.execute("SELECT snowflake_at('2025-01-01')").fetchone()[0] > 0


def test_configurations_that_could_repeat_ids_are_refused(make_cluster):
    # Set-aside ids that the live range names too: the server does not start.
    c = make_cluster(settings={**SET_ASIDE, "snowflake_id.worker_ids": "0-1022"}, start=False)
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    assert "snowflake_id.backfill_worker_ids (1022-1023) and snowflake_id.worker_ids (0-1022) overlap" \
        in c.log(since=mark)
    # Disjoint: fine; a reload that makes them overlap is refused.
    c.configure(**{"snowflake_id.worker_ids": "0-1021"})
    c.start()
    c.create_extension()
    c.configure(**{"snowflake_id.worker_ids": "0-1023"})
    mark = c.log_mark()
    c.reload()
    assert "set aside for backfill" in c.log(since=mark)
    assert c.scalar("SHOW snowflake_id.worker_ids") == "0-1021"
    c.scalar("SELECT snowflake_at('2025-01-01')")
    # Grants were numbered across 1022-1023: other ids would reuse them.
    c.configure(**{"snowflake_id.worker_ids": "1020-1022",
                   "snowflake_id.backfill_worker_ids": "1023"})
    c.restart()
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "55000", str(e)
        assert "(1023) does not start with the ids backfill IDs were made from (1022-1023)" \
            in e.diag.message_primary
    # Nor do live claims take 1022, which backfill IDs used: three sessions
    # share 1020 and 1021.
    conns = [c.connect() for _ in range(3)]
    try:
        held = {conn.execute("SELECT snowflake_worker_id(snowflake_nextval())").fetchone()[0]
                for conn in conns}
    finally:
        for conn in conns:
            conn.close()
    assert held == {1020, 1021}, held
    # Back as before: fine again, and the earlier grants still count.
    c.configure(**{"snowflake_id.worker_ids": "0-1021",
                   "snowflake_id.backfill_worker_ids": "1022-1023"})
    c.restart()
    assert c.scalar("SELECT sum(grants) FROM snowflake_backfill()") == 1
    c.scalar("SELECT snowflake_at('2025-01-01')")


def test_no_backfill_while_worker_ids_are_leased(make_cluster):
    c = make_cluster(settings={**SET_ASIDE,
                               "snowflake_id.registry": "host=127.0.0.1 port=1 dbname=nowhere"},
                     create_extension=True)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "55000", str(e)
        assert "leases its worker ids" in e.diag.message_primary


def test_a_promoted_standby_continues_above_the_primarys_grants(make_cluster):
    """Grants reach a standby through WAL (the state file its base backup
    copied has none): promoted after the primary crashed, it hands out the
    next grants, so the same times get other IDs. Without the WAL records
    its first grants would be the primary's, and the IDs the same."""
    p = make_cluster(settings=SET_ASIDE, create_extension=True)
    p.sql("SELECT 1")
    s = make_cluster(basebackup_from=p, settings=SET_ASIDE)
    assert s.scalar("SELECT pg_is_in_recovery()")
    made = {r[0] for r in p.sql(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", TIMES)}
    lsn = p.scalar("SELECT pg_current_wal_lsn()")
    wait_until(lambda: s.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", str(lsn)),
               30, "standby replay")
    with s.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "55000" and "during recovery" in e.diag.message_primary, str(e)
        assert conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0] \
            == p.scalar("SELECT sum(grants) FROM snowflake_backfill()")
    p.stop(mode="immediate")
    s.promote()
    again = {r[0] for r in s.sql(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", TIMES)}
    assert len(again) == len(made) and not again & made


@pytest.mark.parametrize("registry_kept", [True, False], ids=["registry", "no-registry"])
def test_ids_that_made_live_ids_backfill_only_after_them(make_cluster, registry_kept):
    """Worker id 1022 made live IDs, then is set aside: a backfill ID of a
    time it was live at could equal one of them, so those times are
    refused (up to this start's floor, which is above every ID made
    before); later times are fine. Also when no registry table was kept
    while it was live (its history is unknown). Found by the adversarial
    reviews: before, grant 0 of a stretch was exactly the live (t, 1022, 0)."""
    settings = {"snowflake_id.worker_ids": "1022"}
    if not registry_kept:
        settings["snowflake_id.registry_database"] = ""
    c = make_cluster(settings=settings, create_extension=True)
    live = [r[0] for r in c.sql("SELECT snowflake_nextval() FROM generate_series(1, 100)")]
    assert {r[0] for r in c.sql("SELECT snowflake_worker_id(unnest(%s::bigint[]))", live)} == {1022}
    c.stop()
    c.configure(**{"snowflake_id.worker_ids": "0-1021", "snowflake_id.backfill_worker_ids": "1022",
                   "snowflake_id.registry_database": "postgres"})
    c.start()
    with c.connect() as conn:
        for i in live[:3] + live[-3:]:
            e = sql_error(conn, "SELECT snowflake_at(snowflake_timestamp(%s))", (i,))
            assert e.sqlstate == "22008", str(e)
            assert "up to which the set-aside worker ids made live IDs" in str(e), str(e)
        bound = str(e).split("not after ")[1].split(",")[0]
        # The first time after the bound (a guess such as now() + 2 s would
        # race the bound, which depends on how fast the restart was).
        later = conn.execute(AFTER_BOUND, (bound,)).fetchone()[0]
        assert later not in live
    # Decided once: after another restart the bound stays, and a fresh id
    # added at the end (never claimed) brings no refusal of its own, unless
    # no registry was kept when the server made IDs (then nothing is known
    # of any id's past, and times before this start are refused too).
    c.configure(**{"snowflake_id.backfill_worker_ids": "1022-1023"})
    c.restart()
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at(snowflake_timestamp(%s))", (live[-1],))
        assert e.sqlstate == "22008", str(e)
        again = str(e).split("not after ")[1].split(",")[0]
        assert (again == bound) == registry_kept, (bound, again)
        # Without a registry kept, the bound is this start's floor: the
        # reservation of the first start, which reached 1 s past the
        # first snowflake_at's time. A time just after it is accepted.
        later = conn.execute(AFTER_BOUND, (again,)).fetchone()[0]
        assert later not in live
        assert conn.execute("SELECT snowflake_timestamp(%s) > %s::timestamptz",
                            (later, again)).fetchone()[0]


# The first millisecond after a bound printed by a 22008 refusal (or now(),
# when that is later): accepted by snowflake_at, which refuses the bound.
AFTER_BOUND = ("SELECT snowflake_at(greatest(now(), %s::timestamptz + interval '1 millisecond'))")


def test_backfill_needs_the_registry_tables(make_cluster):
    c = make_cluster(settings={**SET_ASIDE, "snowflake_id.registry_database": ""},
                     create_extension=True)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "55000", str(e)
        assert "snowflake_id.registry_database is empty" in e.diag.message_primary
