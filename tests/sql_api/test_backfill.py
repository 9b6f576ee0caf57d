"""Backfill: snowflake_at(ts) makes IDs that decode to a past time and equal
no other ID (live ones, other backfills, before and after a crash), from
worker ids set aside by snowflake_id.backfill_worker_ids; it refuses times
it cannot cover, configurations that would break that, and roles that were
not granted it. The rules and the proof are in core/src/backfill.rs."""

from __future__ import annotations

import datetime as dt
import random
import os
import threading

import pytest

from harness import PG_BINDIR, ClusterError, run_pg, wait_until
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
        crossed, buckets, grants = conn.execute("""SELECT
            count(*) FILTER (WHERE ends_at >= '2024-02-01' AND starts_at <= '2024-02-28'),
            count(*), sum(grants) FROM snowflake_backfill()""").fetchone()
        # One grant per stretch of time (about 1.55 days each): the 18 or
        # 19 crossed, and nearby ones taken with them in doubling batches
        # (1, 1, 2, 4...), at most as many again.
        assert grants == buckets and 18 <= crossed <= 19 and buckets <= 2 * crossed + 1, \
            (crossed, buckets, grants)


def test_an_import_on_a_server_with_no_live_id_writes_no_reservation_per_tick(make_cluster):
    """A migration's target has made no live ID yet, so its reservation
    is behind the import's times. An ordered import one row per second
    then climbed past it at every row, and each row wrote the state file
    and a WAL record (7,200 of each here; 0.9 ms a row). Extended to the
    clock, as a live ID would, it writes about once a second."""
    c = make_cluster(settings=SET_ASIDE, create_extension=True)
    with c.connect() as conn:
        conn.execute("SELECT snowflake_at('2024-01-10')")
        before = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        assert conn.execute("""SELECT count(DISTINCT snowflake_at(t)) FROM generate_series(
            '2024-01-10 03:00:01'::timestamptz, '2024-01-10 05:00', interval '1 second') t
            """).fetchone()[0] == 7200
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                           (before,)).fetchone()[0]
        # A reservation record is tens of bytes; 7,200 of them are
        # hundreds of kB.
        assert wal < 16384, f"{wal} bytes of WAL for 7,200 backfill IDs"


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


def test_backfill_with_leased_worker_ids_asks_the_registry_and_names_it_when_unreachable(
        make_cluster):
    """With leased worker ids the grants come from the registry
    (tests/fleet/test_backfill_fleet.py); one that cannot be reached is
    named, and nothing is made."""
    c = make_cluster(settings={**SET_ASIDE,
                               "snowflake_id.registry": "host=127.0.0.1 port=1 dbname=nowhere"},
                     create_extension=True)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2025-01-01')")
        assert e.sqlstate == "08006", str(e)
        assert "could not get backfill grants from the registry" in e.diag.message_primary
        assert "port=1" in e.diag.message_primary


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


# ---------------------------------------------------------------- at scale
# Four set-aside ids, otherwise default settings; an epoch five years and a
# half back, so that five years of past times fit the layout.
AT_SCALE = {"snowflake_id.backfill_worker_ids": "1020-1023",
            "snowflake_id.epoch": "2021-06-01"}


def _legacy(conn, rows, span="5 years", table="legacy"):
    """A legacy table in key order, its times at random over `span` before
    now (never within the last minute: max_drift is not the point)."""
    conn.execute(f"""CREATE TABLE {table} AS
        SELECT g AS legacy_id,
               now() - interval '1 minute' - random() * interval '{span}' AS created_at
          FROM generate_series(1, {rows}) g""")


def _check_imported(conn, table, rows):
    n, distinct, decode, set_aside = conn.execute(f"""SELECT count(*), count(DISTINCT id),
        bool_and(snowflake_timestamp(id) = date_trunc('milliseconds', created_at)),
        bool_and(snowflake_worker_id(id) BETWEEN 1020 AND 1023) FROM {table}""").fetchone()
    assert (n, distinct, decode, set_aside) == (rows, rows, True, True)


@pytest.mark.parametrize("rows", [
    1_000_000, pytest.param(10_000_000, marks=pytest.mark.slow)], ids=["1M", "10M"])
def test_a_legacy_table_in_key_order_imports_in_one_statement(make_cluster, rows):
    """The migration's statement, rows in key order (times at random over
    five years): every row in, every ID unique (also against live IDs made
    meanwhile, in the same table), each decoding to its own time; about
    one grant per stretch. 0.7.0 ran out of grants after ~20,000 rows
    ('the backfill space ... is used up')."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    with c.connect() as conn:
        _legacy(conn, rows)
        conn.execute("CREATE TABLE posts (id bigint PRIMARY KEY, legacy_id int, created_at timestamptz)")
        conn.execute("""INSERT INTO posts SELECT snowflake_at(created_at), legacy_id, created_at
                          FROM legacy""")
        _check_imported(conn, "posts", rows)
        stretches, most, grants = conn.execute(
            "SELECT count(*), max(grants), sum(grants) FROM snowflake_backfill()").fetchone()
        # Five years: about 1,176 stretches of 37.3 h, one grant each per
        # 917,504 distinct times (the session's bound; two rows on one
        # millisecond take one grant, up to 64).
        # Stretches without rows (from the epoch on) are taken in batches
        # with the others, also one grant each per session and bound.
        per_stretch = 1 + (rows - 1) // 917_504
        full = conn.execute("SELECT count(*) FROM snowflake_backfill() WHERE grants = %s",
                            (per_stretch,)).fetchone()[0]
        assert 1176 <= stretches <= 1300 and most == per_stretch and full >= 1170, \
            (stretches, most, grants, full)
        # The session keeps them: the same rows again take none (50,000
        # more times stay within the bound for both sizes).
        conn.execute("""INSERT INTO posts SELECT snowflake_at(created_at), -legacy_id, created_at
                          FROM legacy WHERE legacy_id <= 50000""")
        assert conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0] == grants
        # Live IDs into the same key column: none equal a backfill ID.
        conn.execute("""INSERT INTO posts SELECT snowflake_nextval(), 0, now()
                          FROM generate_series(1, 100000)""")
        assert conn.execute("SELECT count(*) FROM posts").fetchone()[0] == rows + 150000


def test_eight_sessions_at_once_over_the_same_times(make_cluster):
    """Eight sessions import the same legacy rows at once, each in its own
    order, into one key column: no ID twice (the primary key would refuse
    it), each decoding to its time; each session one grant per stretch.
    On 0.7.0 three sessions of 20,000 rows already ran out of grants."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    rows = 60_000
    with c.connect() as conn:
        _legacy(conn, rows, span="1 year")
        conn.execute("CREATE TABLE posts (id bigint PRIMARY KEY, legacy_id int, created_at timestamptz)")
    errors = []

    def work(seed):
        try:
            with c.connect() as conn:
                conn.execute("SELECT setseed(%s)", (seed / 10,))
                conn.execute("""INSERT INTO posts SELECT snowflake_at(created_at), legacy_id, created_at
                                  FROM (SELECT * FROM legacy ORDER BY random()) shuffled""")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with c.connect() as conn:
        _check_imported(conn, "posts", 8 * rows)
        # One grant per stretch and session: the 235 stretches of the year
        # have 8, the others (taken in batches with them) at most 8.
        most, full = conn.execute(
            "SELECT max(grants), count(*) FILTER (WHERE grants = 8) FROM snowflake_backfill()"
        ).fetchone()
        assert most == 8 and full >= 234, (most, full)


def test_a_retry_after_failed_unordered_attempts_succeeds(make_cluster):
    """An unordered import of 300,000 rows over a year fails at its last
    row (an error, then a cancel), each time in a session that then ends:
    each failure costs at most one grant per stretch, and the retry goes
    through; in one session, a failure costs nothing. On 0.7.0 the first
    attempt ran out of grants and so did the retry, ordered or not."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    rows = 300_000
    with c.connect() as conn:
        _legacy(conn, rows, span="1 year")
        conn.execute("CREATE TABLE posts (id bigint PRIMARY KEY, legacy_id int, created_at timestamptz)")
    import_sql = """INSERT INTO posts SELECT snowflake_at(created_at), legacy_id,
                             created_at + coalesce({}, interval '0') FROM legacy"""
    with c.connect() as conn:
        e = sql_error(conn, import_sql.format(
            f"CASE WHEN legacy_id = {rows} THEN interval '1 day' / (legacy_id - legacy_id) END"))
        assert e.sqlstate == "22012", str(e)
        after_one = conn.execute("SELECT max(grants), sum(grants) FROM snowflake_backfill()").fetchone()
        assert after_one[0] == 1, after_one
        # The same session again: its grants still count the IDs the
        # failed statement made, so it takes no new one.
        conn.execute("SET statement_timeout = '3s'")
        e = sql_error(conn, import_sql.format(
            f"CASE WHEN legacy_id = {rows} THEN (SELECT interval '0' FROM pg_sleep(60)) END"))
        assert e.sqlstate == "57014", str(e)
        assert conn.execute("SELECT max(grants), sum(grants) FROM snowflake_backfill()").fetchone() \
            == after_one
        left, mine = conn.execute(
            "SELECT min(grants_left), min(this_session) FROM snowflake_backfill()").fetchone()
        assert (left, mine) == (255, 1), (left, mine)
    # A new session: the grants of the one that ended are lost, one per
    # stretch; the retry succeeds.
    with c.connect() as conn:
        conn.execute(import_sql.format("NULL"))
        _check_imported(conn, "posts", rows)
        assert conn.execute("SELECT max(grants), min(grants_left), max(this_session) "
                            "FROM snowflake_backfill()").fetchone() == (2, 254, 1)


def test_a_full_stretch_refuses_before_taking_and_names_what_it_needed(make_cluster):
    """js53 with one set-aside id: a stretch holds 8 grants of 8 IDs per
    time, one of them kept from a session's further grants. The 57th ID of
    one millisecond needs an eighth grant of the session: refused, naming
    the IDs it made there, with nothing taken; other times of the stretch
    still work with the grants the session holds, and another session's
    first grant takes the last one. Then a session that holds grants of
    120 other stretches (so that its next first grant comes in a batch of
    nearby ones) is refused the full stretch and takes no grant at all."""
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.backfill_worker_ids": "63"},
                     create_extension=True)
    stretch = "SELECT grants, capacity, grants_left, this_session FROM snowflake_backfill() " \
              "WHERE %s BETWEEN starts_at AND ends_at"
    with c.connect() as conn:
        ids = _backfill(conn, [TIMES[0]] * 56)
        assert len(set(ids)) == 56
        e = sql_error(conn, "SELECT snowflake_at(%s)", (TIMES[0],))
        assert e.sqlstate == "54000", str(e)
        assert e.diag.message_primary.startswith(
            "this session needed more than 56 backfill IDs at 2024-03-01"), e.diag.message_primary
        assert "1 of the stretch's 8 grants are left" in e.diag.message_detail, \
            e.diag.message_detail
        assert "at most 56 IDs of one time" in e.diag.message_hint, e.diag.message_hint
        assert conn.execute(stretch, (TIMES[0],)).fetchone() == (7, 8, 1, 7)
        more = _backfill(conn, [TIMES[0] + dt.timedelta(milliseconds=1)] * 56)
        assert not set(more) & set(ids)
        with c.connect() as other:
            last = _backfill(other, [TIMES[0]] * 8)
            assert not set(last) & set(ids)
        assert conn.execute(stretch, (TIMES[0],)).fetchone() == (8, 8, 0, 7)
    with c.connect() as conn:
        _backfill(conn, [dt.datetime(2025, 1, 1, tzinfo=UTC) + dt.timedelta(hours=36 * i)
                         for i in range(120)])
        before = conn.execute("SELECT bucket, grants FROM snowflake_backfill()").fetchall()
        e = sql_error(conn, "SELECT snowflake_at(%s)", (TIMES[0] + dt.timedelta(seconds=1),))
        assert "all 8 are handed out, 0 of them to this session" in e.diag.message_detail
        assert conn.execute("SELECT bucket, grants FROM snowflake_backfill()").fetchall() == before


def test_ids_sent_to_a_client_before_a_crash_are_not_made_again(make_cluster):
    """A SELECT streams backfill IDs to its client, the server crashes
    mid-statement: those IDs left the backend although nothing committed.
    After the restart the same times get other IDs (the grants were
    durable before the first ID, and are not given back)."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    with c.connect() as conn:
        _legacy(conn, 200_000, span="1 year")
    conn = c.connect()
    try:
        conn.execute("BEGIN")
        cur = conn.cursor(name="stream")
        cur.execute("SELECT snowflake_at(created_at) FROM legacy")
        sent = [r[0] for r in cur.fetchmany(50_000)]
        assert len(set(sent)) == 50_000
        c.stop(mode="immediate")
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001, S110 (the server is gone)
            pass
    c.start()
    with c.connect() as conn:
        again = {r[0] for r in conn.execute("SELECT snowflake_at(created_at) FROM legacy")}
    assert len(again) == 200_000 and not again & set(sent)


def test_sessions_at_once_on_one_millisecond_fill_its_stretch_exactly(make_cluster):
    """js53 with four set-aside ids: 8 IDs per grant and tick, 32 grants a
    stretch, 2 of them kept from further grants. Four sessions at once make
    56 IDs each at one millisecond: 7 grants each, 224 distinct IDs; four
    more sessions take the last four grants as first grants, the whole
    stretch; the next ID of that millisecond is refused, other stretches
    still work."""
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.backfill_worker_ids": "60-63"},
                     create_extension=True)
    outs: list[list[int]] = [[] for _ in range(4)]
    errors = []
    barrier = threading.Barrier(4)

    def work(n):
        try:
            with c.connect() as conn:
                conn.execute("SELECT 1")
                barrier.wait(timeout=60)
                outs[n] += _backfill(conn, [TIMES[0]] * 56)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    made = [i for out in outs for i in out]
    assert len(made) == len(set(made)) == 224
    for _ in range(4):
        with c.connect() as conn:
            made += _backfill(conn, [TIMES[0]] * 8)
    assert len(made) == len(set(made)) == 256
    with c.connect() as conn:
        assert conn.execute("SELECT grants, grants_left FROM snowflake_backfill() "
                            "WHERE %s BETWEEN starts_at AND ends_at", (TIMES[0],)).fetchone() == (32, 0)
        e = sql_error(conn, "SELECT snowflake_at(%s)", (TIMES[0],))
        assert e.sqlstate == "54000", str(e)
        assert conn.execute("SELECT snowflake_at(%s)",
                            (TIMES[0] + dt.timedelta(days=30),)).fetchone()[0] not in made


# ------------------------------------------------ dumps and restores
def _wait_for_a_copy(c, dbname="postgres"):
    """Waits until the registry worker copied the server's grants into
    snowflake_backfill_grants."""
    shm = c.scalar("SELECT coalesce(sum(grants), 0) FROM snowflake_backfill()", dbname=dbname)
    wait_until(lambda: c.scalar("SELECT coalesce(sum(grants), 0) FROM snowflake_backfill_grants",
                                dbname=dbname) == shm, timeout=30, what="the registry worker's copy")


def test_a_dump_carries_grants_the_registry_worker_has_not_copied(make_cluster):
    """The registry worker cannot copy (a session holds a lock its upsert
    waits for): an import, then pg_dump of the table's data carries every
    grant the server handed out, as snowflake_backfill_dump() shows them;
    the table itself holds fewer."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    with c.connect() as conn:
        conn.execute("SELECT snowflake_at('2022-01-01')")
    _wait_for_a_copy(c)
    with c.connect() as lock:
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE snowflake_backfill_grants IN SHARE ROW EXCLUSIVE MODE")
        with c.connect() as conn:
            conn.execute("SELECT snowflake_at(t) FROM generate_series("
                         "'2024-01-01'::timestamptz, '2024-03-01', interval '1 hour') t")
            used = conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0]
            in_table = conn.execute("SELECT sum(grants) FROM snowflake_backfill_grants").fetchone()[0]
            assert in_table < used
            assert conn.execute("SELECT sum(grants) FROM snowflake_backfill_dump()"
                                ).fetchone()[0] == used
        proc = run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-h", c.dir, "-p", str(c.port),
                       "-U", "postgres", "--data-only", "-t", "snowflake_backfill_grants",
                       "-d", "postgres"], cwd=c.dir)
        lock.execute("COMMIT")
    copied = proc.stdout.split("FROM stdin;\n", 1)[1].split("\\.", 1)[0].splitlines()
    assert sum(int(line.split("\t")[1]) for line in copied) == used, proc.stdout


def test_a_dump_on_a_server_without_the_library_preloaded_carries_the_table(make_cluster):
    """Without shared memory, snowflake_backfill_dump() (pg_dump's filter
    of the table) returns the table's rows: the dump works and carries
    them."""
    c = make_cluster(preload=False, create_extension=True)
    c.sql("INSERT INTO snowflake_backfill_grants (starts_at, grants, worker_ids) "
          "VALUES ('2024-03-01 04:18:18.24+00', 7, '1020-1023')")
    proc = run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-h", c.dir, "-p", str(c.port),
                   "-U", "postgres", "--data-only", "-t", "snowflake_backfill_grants",
                   "-d", "postgres"], cwd=c.dir)
    copied = proc.stdout.split("FROM stdin;\n", 1)[1].split("\\.", 1)[0].splitlines()
    assert [line.split("\t")[1:3] for line in copied] == [["7", "1020-1023"]], proc.stdout


def test_a_restore_without_triggers_counts_before_the_next_grant(make_cluster):
    """Rows of snowflake_backfill_grants inserted with the triggers off (as
    pg_restore --disable-triggers does) in a database the registry worker
    does not keep: a backfill there reads them before it takes a grant of
    their stretch, and its grants start above them."""
    c = make_cluster(settings=AT_SCALE, create_extension=True)
    c.create_db("other")
    c.create_extension(dbname="other")
    stretch = "SELECT starts_at, grants FROM snowflake_backfill() WHERE %s BETWEEN starts_at AND ends_at"
    with c.connect() as conn:
        conn.execute("SELECT snowflake_at(%s)", (TIMES[0],))
        starts_at, grants = conn.execute(stretch, (TIMES[0],)).fetchone()
        assert grants == 1
    with c.connect(dbname="other") as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("INSERT INTO snowflake_backfill_grants (starts_at, grants, worker_ids) "
                     "VALUES (%s, 200, '1020-1023')", (starts_at,))
    with c.connect(dbname="other") as conn:
        conn.execute("SELECT snowflake_at(%s)", (TIMES[0],))
        assert conn.execute(stretch, (TIMES[0],)).fetchone() == (starts_at, 201)


def test_the_database_owner_may_restore_the_grants(make_cluster):
    """The database's owner (not a superuser) inserts rows into
    snowflake_backfill_grants, as its pg_restore does: they raise the
    server's grants. Another role may read them, not insert."""
    c = make_cluster(settings={**AT_SCALE, "snowflake_id.registry_database": "app"})
    c.sql("CREATE ROLE app_owner LOGIN")
    c.sql("CREATE ROLE someone LOGIN")
    c.sql("CREATE DATABASE app OWNER app_owner")
    c.create_extension(dbname="app")
    with c.connect(dbname="app", user="someone") as conn:
        assert conn.execute("SELECT count(*) FROM snowflake_backfill_grants").fetchone()[0] == 0
        e = sql_error(conn, "INSERT INTO snowflake_backfill_grants (starts_at, grants) "
                            "VALUES ('2024-03-01', 5)")
        assert e.sqlstate == "42501", str(e)
    with c.connect(dbname="app") as conn:
        conn.execute("SELECT snowflake_at('2024-03-01')")
        starts_at = conn.execute("SELECT starts_at FROM snowflake_backfill()").fetchone()[0]
    with c.connect(dbname="app", user="app_owner") as conn:
        conn.execute("INSERT INTO snowflake_backfill_grants (starts_at, grants, worker_ids) "
                     "VALUES (%s, 50, '1020-1023')", (starts_at,))
        conn.execute("INSERT INTO snowflake_backfill_grants (starts_at, grants, worker_ids) "
                     "VALUES (%s, 40, '1020-1023')", (starts_at,))
        assert conn.execute("SELECT grants FROM snowflake_backfill_grants").fetchall() == [(50,)]
        assert conn.execute("SELECT grants FROM snowflake_backfill()").fetchall() == [(50,)]
