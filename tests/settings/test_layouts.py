"""Layouts: the js53 and sonyflake presets on a real server, layouts that
must refuse to start, changing the layout of a server that has made IDs
(snowflake_accept_layout), and the SQL helpers (compose, decode,
from_timestamp, nextvals) with their errors."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from harness import ClusterError, wait_until

UTC = dt.timezone.utc
EPOCH = dt.datetime(2024, 1, 1, tzinfo=UTC)
EPOCH_MS = 1_704_067_200_000
LAYOUT_COLUMNS = ("preset", "epoch", "time_unit_ms", "total_bits", "time_bits",
                  "worker_bits", "sequence_bits", "max_worker_id", "max_sequence",
                  "max_id", "ends_at")


# ----------------------------------------------------------------- helpers
def layout_of(conn) -> dict:
    row = conn.execute("SELECT * FROM snowflake_layout()").fetchone()
    return dict(zip(LAYOUT_COLUMNS, row))


def sql_error(conn, query, params=None) -> psycopg.Error:
    """Runs `query`, which must fail; returns the error."""
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(query, params)
    return ei.value


def decode(i: int, unit_ms: int, worker_bits: int, sequence_bits: int):
    """(unix ms, worker id, sequence) of an ID with the default epoch."""
    return ((i >> (worker_bits + sequence_bits)) * unit_ms + EPOCH_MS,
            (i >> sequence_bits) & ((1 << worker_bits) - 1),
            i & ((1 << sequence_bits) - 1))


def generate_concurrently(c, n_conns: int, per_conn: int, chunk: int = 5000):
    """IDs from n_conns connections working at the same time (single
    snowflake_nextval() calls); returns one list per connection, in order."""
    conns = [c.connect() for _ in range(n_conns)]
    barrier = threading.Barrier(n_conns)

    def work(conn):
        got = []
        try:
            barrier.wait(timeout=60)
            while len(got) < per_conn:
                got += [r[0] for r in conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, %s) "
                    "ORDER BY generate_series", (min(chunk, per_conn - len(got)),))]
        except BaseException:
            barrier.abort()
            raise
        return got

    try:
        with ThreadPoolExecutor(n_conns) as pool:
            return list(pool.map(work, conns))
    finally:
        for conn in conns:
            conn.close()


def assert_strictly_increasing(ids, label=""):
    bad = next((k for k in range(1, len(ids)) if ids[k] <= ids[k - 1]), None)
    assert bad is None, (f"{label}: IDs not strictly increasing at {bad}: "
                         f"{ids[bad - 1]} then {ids[bad]}")


def now_utc():
    return dt.datetime.now(UTC)


# --------------------------------------------------------------- 10. js53
def test_js53_after_restart_of_a_fresh_cluster(make_cluster):
    c = make_cluster(create_extension=True)  # classic, no ID made yet
    c.configure(**{"snowflake_id.layout": "js53"})
    c.restart()
    with c.connect() as conn:
        lay = layout_of(conn)
    assert (lay["preset"], lay["total_bits"], lay["time_bits"], lay["worker_bits"],
            lay["sequence_bits"], lay["time_unit_ms"]) == ("js53", 53, 41, 6, 6, 1)
    assert lay["max_id"] == 2**53 - 1
    assert (lay["max_worker_id"], lay["max_sequence"]) == (63, 63)
    assert lay["epoch"] == EPOCH

    t0 = now_utc()
    per_conn = generate_concurrently(c, 4, 25_000)
    t1 = now_utc()
    ids = [i for chunk in per_conn for i in chunk]
    assert len(ids) == 100_000 and len(set(ids)) == 100_000
    assert 0 < min(ids) and max(ids) < 2**53
    for n, chunk in enumerate(per_conn):
        assert_strictly_increasing(chunk, f"connection {n}")
        assert len({decode(i, 1, 6, 6)[1] for i in chunk}) == 1
    lo = (t0.timestamp() - 2) * 1000
    hi = (t1.timestamp() + 2) * 1000
    for i in ids:
        ms, w, s = decode(i, 1, 6, 6)
        assert lo <= ms <= hi and w < 64 and s < 64, (i, ms, w, s)

    # The server decodes them the same way.
    with c.connect() as conn:
        conn.execute("CREATE TEMP TABLE ids (id bigint)")
        with conn.cursor().copy("COPY ids FROM STDIN") as cp:
            for i in ids:
                cp.write_row((i,))
        bad = conn.execute(
            "SELECT count(*) FROM ids, snowflake_decode(id) d "
            "WHERE d.worker_id <> (id >> 6) & 63 OR d.sequence <> id & 63 "
            "   OR d.ts <> to_timestamp(((id >> 12) + %s) / 1000.0) "
            "   OR d.ts NOT BETWEEN %s AND %s",
            (EPOCH_MS, t0 - dt.timedelta(seconds=2),
             t1 + dt.timedelta(seconds=2))).fetchone()[0]
        assert bad == 0


# ----------------------------------------------------------- 11. sonyflake
def test_sonyflake_ticks_are_ten_milliseconds(make_cluster):
    c = make_cluster(settings={"snowflake_id.layout": "sonyflake"},
                     create_extension=True)
    with c.connect() as conn:
        lay = layout_of(conn)
    assert (lay["preset"], lay["time_unit_ms"], lay["total_bits"], lay["time_bits"],
            lay["worker_bits"], lay["sequence_bits"]) == ("sonyflake", 10, 63, 39, 16, 8)
    t0 = now_utc()
    per_conn = generate_concurrently(c, 4, 5_000)
    t1 = now_utc()
    ids = [i for chunk in per_conn for i in chunk]
    assert len(set(ids)) == len(ids) == 20_000
    for chunk in per_conn:
        assert_strictly_increasing(chunk)
    ticks = set()
    for i in ids:
        ms, w, s = decode(i, 10, 16, 8)
        assert ms % 10 == 0 and s < 256 and w < 65536
        assert (t0.timestamp() - 2) * 1000 <= ms <= (t1.timestamp() + 2) * 1000
        ticks.add(ms)
    assert len(ticks) > 1
    with c.connect() as conn:
        rows = conn.execute(
            "SELECT (extract(epoch FROM d.ts) * 1000)::bigint, d.worker_id, d.sequence "
            "FROM unnest(%s::bigint[]) id, snowflake_decode(id) d",
            (ids[::97],)).fetchall()
    assert rows == [decode(i, 10, 16, 8) for i in ids[::97]]
    assert all(r[0] % 10 == 0 for r in rows)


# ---------------------------------------------- 12. layouts that cannot start
BAD_LAYOUTS = [
    ({"snowflake_id.worker_bits": 16, "snowflake_id.sequence_bits": 30},
     "less than 10 years"),  # 17 time bits of ms
    ({"snowflake_id.total_bits": 45, "snowflake_id.worker_bits": 16,
      "snowflake_id.sequence_bits": 30}, "must leave at least 1 time bit"),
    ({"snowflake_id.epoch": "yesterday"}, '"yesterday" is not a UTC date'),
    ({"snowflake_id.total_bits": 40}, "less than 10 years"),
    ({"snowflake_id.layout": "js53", "snowflake_id.worker_bits": 16},
     "less than 10 years"),
]


def test_invalid_layouts_refuse_to_start(make_cluster):
    c = make_cluster(start=False)
    for settings, fragment in BAD_LAYOUTS:
        c.configure(**settings)
        mark = c.log_mark()
        with pytest.raises(ClusterError):
            c.start(timeout=20)
        assert not c.is_running(), settings
        log = c.log(since=mark)
        assert "invalid snowflake_id layout: " in log, (settings, log)
        line = next(l for l in log.splitlines() if "invalid snowflake_id layout" in l)
        assert "FATAL" in line and fragment in line, (settings, line)
        assert "HINT:  Fix snowflake_id.layout" in log, log
        for k in settings:
            c.settings.pop(k)
        c.configure()
    # The same cluster starts once the settings are fixed.
    c.start()
    c.create_extension()
    assert c.scalar("SELECT snowflake_nextval()") > 0


# ---------------------------------------------------- 13. changing layouts
def _layout_change_refused(conn):
    e = sql_error(conn, "SELECT snowflake_nextval()")
    assert e.sqlstate == "55000", str(e)
    assert "layout differs" in e.diag.message_primary, str(e)
    assert "snowflake_accept_layout()" in (e.diag.message_hint or ""), str(e)
    assert sql_error(conn, "SELECT snowflake_nextvals(3)").sqlstate == "55000"


def _change_layout(make_cluster, old_preset: str, new_preset: str):
    """A server that made IDs with old_preset, restarted with new_preset."""
    c = make_cluster(settings={"snowflake_id.layout": old_preset},
                     create_extension=True)
    old = [r[0] for r in c.sql("SELECT snowflake_nextvals(10000)")]
    old += [i for chunk in generate_concurrently(c, 2, 2000) for i in chunk]
    c.configure(**{"snowflake_id.layout": new_preset})
    c.restart()
    with c.connect() as conn:
        assert layout_of(conn)["preset"] == new_preset
        _layout_change_refused(conn)
    return c, old


def _accept_and_check(c, old):
    with c.connect() as conn:
        changed, first_id, _resume_at = conn.execute(
            "SELECT * FROM snowflake_accept_layout()").fetchone()
        assert changed is True
        assert first_id > max(old)
        new = [r[0] for r in conn.execute("SELECT snowflake_nextvals(1000)")]
    new += [i for chunk in generate_concurrently(c, 2, 1000) for i in chunk]
    assert min(new) >= first_id > max(old)
    assert len(set(new)) == len(new)

    # Recorded: a restart with the same layout just works, still above.
    c.restart()
    with c.connect() as conn:
        again = [r[0] for r in conn.execute("SELECT snowflake_nextvals(1000)")]
        assert min(again) > max(old)
        assert not set(again) & set(new)
        changed = conn.execute("SELECT changed FROM snowflake_accept_layout()").fetchone()[0]
        assert changed is False


def test_classic_to_sonyflake_is_refused_until_an_earlier_epoch(make_cluster):
    # Sonyflake IDs of today are smaller than classic IDs of today (10 ms
    # ticks, 24 low bits): they would only pass the old IDs around 2031, so
    # accepting must refuse rather than leave the server unable to make IDs.
    c, old = _change_layout(make_cluster, "classic", "sonyflake")
    with c.connect() as conn:
        e = sql_error(conn, "SELECT * FROM snowflake_accept_layout()")
        assert e.sqlstate == "22023", str(e)
        assert "only get above the IDs already issued at 20" in (e.diag.message_detail or ""), str(e)
        assert "earlier snowflake_id.epoch" in (e.diag.message_hint or ""), str(e)
        _layout_change_refused(conn)
    # Following the hint: an earlier epoch makes sonyflake IDs larger.
    c.configure(**{"snowflake_id.epoch": "1990-01-01"})
    c.restart()
    _accept_and_check(c, old)


def test_sonyflake_to_classic_accepted_then_ids_above_old(make_cluster):
    c, old = _change_layout(make_cluster, "sonyflake", "classic")
    _accept_and_check(c, old)


def test_classic_to_js53_cannot_be_accepted(make_cluster):
    c, old = _change_layout(make_cluster, "classic", "js53")
    with c.connect() as conn:
        e = sql_error(conn, "SELECT * FROM snowflake_accept_layout()")
        assert e.sqlstate == "22023", str(e)
        assert "cannot make IDs above" in e.diag.message_primary, str(e)
        # Nothing changed: still refused.
        _layout_change_refused(conn)
    # Going back to the recorded layout needs no accepting.
    c.configure(**{"snowflake_id.layout": "classic"})
    c.restart()
    with c.connect() as conn:
        new = [r[0] for r in conn.execute("SELECT snowflake_nextvals(1000)")]
        assert conn.execute(
            "SELECT changed FROM snowflake_accept_layout()").fetchone()[0] is False
    assert min(new) > max(old)


def test_a_changed_layout_stays_refused_across_restarts(make_cluster):
    """Nothing but snowflake_accept_layout() adopts a changed layout. The
    registry worker raises the reservation at start from the registry's
    high-water marks (here: past the end of the new 1 s tick), and that
    write must keep the recorded layout: before, it recorded the new one,
    and the next start made IDs below the old ones with no refusal.
    snowflake_advance_past(), which decodes its argument, refuses too."""
    c = make_cluster(settings={"snowflake_id.registry_database": "postgres"},
                     create_extension=True)
    old = [r[0] for r in c.sql("SELECT snowflake_nextvals(10000)")]
    c.configure(**{"snowflake_id.time_unit_ms": "1000"})
    for _ in range(2):
        c.restart()
        wait_until(lambda: "new IDs start above the registry's high-water mark"
                   in c.log(), timeout=30, what="the registry worker's read at start")
        with c.connect() as conn:
            _layout_change_refused(conn)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_advance_past(%s)", (max(old),))
        assert e.sqlstate == "55000", str(e)
    c.restart()
    with c.connect() as conn:
        _layout_change_refused(conn)
    with open(os.path.join(c.datadir, "snowflake_id.state")) as f:
        assert json.load(f)["layout"]["unit_ms"] == 1
    # Back to the recorded layout: IDs resume above the old ones.
    c.configure(**{"snowflake_id.time_unit_ms": "-1"})
    c.restart()
    with c.connect() as conn:
        assert conn.execute("SELECT snowflake_nextval()").fetchone()[0] > max(old)
        assert conn.execute(
            "SELECT changed FROM snowflake_accept_layout()").fetchone()[0] is False


# -------------------------------------------------------- 14. SQL helpers
def test_from_timestamp_bounds_ids_made_before_and_after(cluster):
    with cluster.connect() as conn:
        before = [r[0] for r in conn.execute("SELECT snowflake_nextvals(100)")]
        conn.execute("SELECT pg_sleep(0.01)")
        ts = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        after = [r[0] for r in conn.execute("SELECT snowflake_nextvals(100)")]
        bound = conn.execute("SELECT snowflake_from_timestamp(%s)", (ts,)).fetchone()[0]
        assert max(before) < bound <= min(after), (max(before), bound, min(after))
        # The bound is the first ID of ts's millisecond.
        ms = (ts - EPOCH) // dt.timedelta(milliseconds=1)
        assert bound == ms << 22

        # Every ID lies in [from_timestamp(its time), from_timestamp(+1 tick)).
        bad = conn.execute(
            "SELECT count(*) FROM snowflake_nextvals(5000) i "
            "WHERE NOT (snowflake_from_timestamp(snowflake_timestamp(i)) <= i "
            "  AND i < snowflake_from_timestamp(snowflake_timestamp(i) + interval '1 ms'))"
        ).fetchone()[0]
        assert bad == 0


def test_compose_round_trips_through_decode(cluster):
    samples = [
        (EPOCH, 0, 0),
        (dt.datetime(2024, 1, 1, 0, 0, 0, 1000, tzinfo=UTC), 1, 1),
        (dt.datetime(2030, 6, 15, 12, 34, 56, 789000, tzinfo=UTC), 1023, 4095),
        (dt.datetime(2026, 2, 28, 23, 59, 59, 999000, tzinfo=UTC), 512, 2048),
    ]
    with cluster.connect() as conn:
        lay = layout_of(conn)
        assert (lay["preset"], lay["total_bits"], lay["time_bits"], lay["worker_bits"],
                lay["sequence_bits"], lay["max_id"]) == ("classic", 63, 41, 10, 12, 2**63 - 1)
        assert lay["ends_at"] == EPOCH + dt.timedelta(milliseconds=2**41 - 1)
        samples.append((lay["ends_at"], 1023, 4095))
        for ts, w, s in samples:
            i = conn.execute("SELECT snowflake_compose(%s, %s, %s)", (ts, w, s)).fetchone()[0]
            ms = (ts - EPOCH) // dt.timedelta(milliseconds=1)
            assert i == (ms << 22) | (w << 12) | s, (ts, w, s, i)
            assert conn.execute("SELECT * FROM snowflake_decode(%s)",
                                (i,)).fetchone() == (ts, w, s)
            assert conn.execute("SELECT snowflake_timestamp(%s)", (i,)).fetchone()[0] == ts
        assert conn.execute("SELECT snowflake_compose(%s, 1023, 4095)",
                            (lay["ends_at"],)).fetchone()[0] == lay["max_id"]
        # Sub-millisecond precision is truncated to the tick.
        ts = dt.datetime(2025, 5, 5, 5, 5, 5, 123999, tzinfo=UTC)
        got = conn.execute("SELECT (snowflake_decode(snowflake_compose(%s, 3, 4))).ts",
                           (ts,)).fetchone()[0]
        assert got == ts.replace(microsecond=123000)
        # A generated ID decomposes and recomposes to itself.
        i = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
        assert conn.execute("SELECT snowflake_compose(d.ts, d.worker_id, d.sequence) "
                            "FROM snowflake_decode(%s) d", (i,)).fetchone()[0] == i


def test_out_of_range_parts_and_timestamps(cluster):
    with cluster.connect() as conn:
        ends_at = layout_of(conn)["ends_at"]
        for w, s in ((1024, 0), (-1, 0), (0, 4096), (0, -1), (2**31 - 1, 0)):
            e = sql_error(conn, "SELECT snowflake_compose(now(), %s, %s)", (w, s))
            assert e.sqlstate == "22003", (w, s, str(e))
        for bad_id in (-1, -(2**63)):
            e = sql_error(conn, "SELECT * FROM snowflake_decode(%s)", (bad_id,))
            assert e.sqlstate == "22003", str(e)
            e = sql_error(conn, "SELECT snowflake_timestamp(%s)", (bad_id,))
            assert e.sqlstate == "22003", str(e)

        too_early = EPOCH - dt.timedelta(milliseconds=1)
        too_late = ends_at + dt.timedelta(milliseconds=1)
        for ts in (too_early, too_late, "infinity", "-infinity",
                   "1970-01-01 00:00:00+00", "2200-01-01 00:00:00+00"):
            e = sql_error(conn, "SELECT snowflake_compose(%s::timestamptz, 0, 0)", (ts,))
            assert e.sqlstate == "22008", (ts, str(e))
            e = sql_error(conn, "SELECT snowflake_from_timestamp(%s::timestamptz)", (ts,))
            assert e.sqlstate == "22008", (ts, str(e))
        # The ends themselves are fine.
        assert conn.execute("SELECT snowflake_from_timestamp(%s)",
                            (EPOCH,)).fetchone()[0] == 0
        assert conn.execute("SELECT snowflake_from_timestamp(%s)",
                            (ends_at,)).fetchone()[0] == (2**41 - 1) << 22


def test_nextvals_batches(cluster):
    with cluster.connect() as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT i FROM snowflake_nextvals(1000) WITH ORDINALITY AS t(i, n) ORDER BY n")]
        assert len(ids) == 1000
        assert_strictly_increasing(ids)
        one = conn.execute("SELECT array_agg(i) FROM snowflake_nextvals(1) i").fetchone()[0]
        assert len(one) == 1 and one[0] > ids[-1]
        big = conn.execute("SELECT count(*), count(DISTINCT i), min(i) FROM "
                           "snowflake_nextvals(1000000) i").fetchone()
        assert big[:2] == (1_000_000, 1_000_000) and big[2] > one[0]
        for n in (0, -1, 1_000_001, -(2**31)):
            e = sql_error(conn, "SELECT * FROM snowflake_nextvals(%s)", (n,))
            assert e.sqlstate == "22023", (n, str(e))
            assert str(n) in e.diag.message_primary, str(e)


def test_strict_functions_map_null_to_null(cluster):
    with cluster.connect() as conn:
        row = conn.execute(
            "SELECT snowflake_timestamp(NULL), snowflake_from_timestamp(NULL), "
            "snowflake_compose(NULL, 0, 0), snowflake_compose(now(), NULL, 0), "
            "snowflake_compose(now(), 0, NULL)").fetchone()
        assert row == (None,) * 5
        # snowflake_decode() returns one row (not a set): NULL gives a row of
        # NULLs. Set-returning strict functions return no rows.
        assert conn.execute("SELECT * FROM snowflake_decode(NULL)").fetchall() == [
            (None, None, None)]
        assert conn.execute("SELECT snowflake_worker_id(NULL), snowflake_sequence(NULL)"
                            ).fetchone() == (None, None)
        assert conn.execute("SELECT * FROM snowflake_nextvals(NULL)").fetchall() == []
        assert conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0] is None


def test_decoding_past_postgresql_timestamps_is_22008(make_cluster):
    # 41 bits of minutes reach far beyond the year 294276, where timestamptz
    # ends: decoding such an ID is a range error, not an internal error.
    c = make_cluster(settings={"snowflake_id.time_unit_ms": 60000},
                     create_extension=True)
    with c.connect() as conn:
        max_id = conn.execute("SELECT max_id FROM snowflake_layout()").fetchone()
        assert max_id is not None
        for q in ("SELECT * FROM snowflake_decode(%s)", "SELECT snowflake_timestamp(%s)"):
            e = sql_error(conn, q % 9223372036854775807)
            assert e.sqlstate == "22008", str(e)
            assert "beyond PostgreSQL's timestamp range" in e.diag.message_primary, str(e)
