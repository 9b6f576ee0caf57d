"""Physical standbys: a standby promoted after its primary crashed never
repeats an ID the primary issued, also when its clock is behind the
primary's: through the reservation's WAL records when it received them, and
when it lagged (asynchronous replication) through the floor at promotion
(its clock plus snowflake_id.standby_clock_skew plus max_drift); a
synchronous standby has every reservation the primary used, because a
reservation waits for it. A hot standby makes IDs from its own worker-id
range.

Run: .venv/bin/pytest tests/durability/test_standbys.py -ra -q  (add -s for
the numbers each test prints).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from harness import AS_ROOT, pg_ids, wait_until
from helpers import LIBFAKETIME

# The classic layout (the default every server here runs).
EPOCH_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
WORKER_SHIFT, WORKER_MASK = 12, (1 << 10) - 1
TICK_SHIFT = 22


def worker_of(i: int) -> int:
    return (i >> WORKER_SHIFT) & WORKER_MASK


def tick_of(i: int) -> int:
    return i >> TICK_SHIFT


def ms_of(i: int) -> int:
    """Unix milliseconds an ID carries."""
    return tick_of(i) + EPOCH_MS


P_RANGE, S_STANDBY_RANGE = "0-15", "16-31"
ID_BATCH = 100
PAUSE = 0.003  # between batches: IDs in most milliseconds, not millions


def _make_primary(make_cluster):
    p = make_cluster(settings={"snowflake_id.worker_ids": P_RANGE},
                     create_extension=True)
    p.sql("CREATE TABLE ids (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), "
          "origin text NOT NULL)")
    return p


def _standby_caught_up(p, s) -> bool:
    lsn = p.scalar("SELECT pg_current_wal_lsn()")
    return s.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", str(lsn))


class _Generator(threading.Thread):
    """Keeps inserting batches of rows into `ids` on one connection and
    records every ID the server returned, until stopped or the server dies."""

    def __init__(self, cluster, origin: str):
        super().__init__(daemon=True)
        self.conn = cluster.connect()
        self.origin, self.ids, self.error = origin, [], None
        self.stop_flag = threading.Event()

    def run(self):
        try:
            while not self.stop_flag.is_set():
                rows = self.conn.execute(
                    "INSERT INTO ids (origin) SELECT %s FROM generate_series(1, %s) "
                    "RETURNING id", (self.origin, ID_BATCH)).fetchall()
                self.ids.extend(r[0] for r in rows)
                time.sleep(PAUSE)
        except psycopg.Error as e:
            self.error = e

    def finish(self):
        self.stop_flag.set()
        self.join(30)
        self.conn.close()
        return self.ids


def _generate_on(cluster, connections: int, seconds: float) -> list[int]:
    """IDs from `connections` sessions (so as many worker ids), each making
    batches for `seconds`."""
    def one(_):
        got = []
        with cluster.connect() as conn:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                got += [r[0] for r in conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, %s)",
                    (ID_BATCH,)).fetchall()]
                time.sleep(PAUSE)
        return got
    with ThreadPoolExecutor(connections) as pool:
        return [i for ids in pool.map(one, range(connections)) for i in ids]


FAILOVER_CASES = {
    # S's clock equals P's (one machine).
    "same_clock": dict(offset=None, lagging=False),
    # S's clock 3 s behind P's; S streams until P crashes. The copy of
    # snowflake_id.state that pg_basebackup gave S is from backup time, so S
    # is safe only if P's later reservations reach it: through the WAL
    # records of src/durability/wal.rs. (max_drift 10s: S's IDs then run
    # up to ~4 s ahead of its clock, 3 s plus the 1 s reservation; with
    # max_drift 1s S refuses with 55000 "clock behind" until its clock
    # catches up.)
    "standby_clock_behind": dict(offset="-3s", lagging=False),
    # S's clock 3 s behind, and S stopped receiving WAL 2 s before P crashed
    # (a network partition, then failover to the lagging standby: Patroni's
    # default, asynchronous replication). P's IDs of those 2 s are above
    # every reservation S replayed; S starts above its clock plus
    # standby_clock_skew (1 s) plus max_drift (10 s): above them while the
    # skew is within that bound.
    "standby_clock_behind_and_lagging": dict(offset="-3s", lagging=True),
}

# The log line of the end of recovery (src/durability/reservation.rs).
RECOVERY_END = (r"recovery ended as a new primary: IDs start above (\S+ \S+) \(([^;]+); "
                r"the replayed reservation ([^,]+), this server's clock (\S+ \S+) "
                r"\+ standby_clock_skew (\d+) ms \+ max_drift (\d+) ms\)")


def _unix_ms(text: str) -> float:
    """Unix ms of the log's `YYYY-MM-DD HH:MM:SS.fffZ`."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%fZ").replace(
        tzinfo=dt.timezone.utc).timestamp() * 1000


def _promote_and_check_the_clock(s, offset_s: float, skew_ms: int, drift_ms: int):
    """Promotes `s`, and checks the floor its startup process computed: from
    its own clock (libfaketime's offset reaches that process), plus the
    skew bound and max_drift. Returns the floor (Unix ms)."""
    mark = s.log_mark()
    before = time.time() * 1000
    s.promote()
    after = time.time() * 1000
    m = s.wait_for_log(RECOVERY_END, since=mark)
    floor_ms, clock_ms = _unix_ms(m.group(1)), _unix_ms(m.group(4))
    assert int(m.group(5)) == skew_ms and int(m.group(6)) == drift_ms, m.group(0)
    # The clock read where the floor is computed carries the test's offset.
    assert before + offset_s * 1000 - 500 <= clock_ms <= after + offset_s * 1000 + 500, \
        (m.group(0), before, after)
    assert floor_ms >= clock_ms + skew_ms + drift_ms - 1, m.group(0)
    # A session's first ID: above the floor, after a wait of up to the skew
    # bound (the floor is that much beyond max_drift), with no error.
    t = time.monotonic()
    first = s.scalar("SELECT snowflake_nextval()")
    print(f"\n  first ID {time.monotonic() - t:.2f}s after the promotion finished, "
          f"{ms_of(first) - time.time() * 1000 - offset_s * 1000:+.0f} ms from the promoted "
          f"server's clock; floor {floor_ms - clock_ms:+.0f} ms from its clock at the end of recovery")
    assert ms_of(first) > floor_ms
    return floor_ms


@pytest.mark.parametrize("case", [
    "same_clock",
    pytest.param("standby_clock_behind", marks=pytest.mark.skipif(
        LIBFAKETIME is None, reason="libfaketime not installed")),
    pytest.param("standby_clock_behind_and_lagging", marks=pytest.mark.skipif(
        LIBFAKETIME is None, reason="libfaketime not installed")),
])
def test_promoted_standby_never_repeats_the_primary(make_cluster, case):
    offset, lagging = FAILOVER_CASES[case]["offset"], FAILOVER_CASES[case]["lagging"]
    phases, t_phase = [], time.monotonic()

    def phase(name):
        nonlocal t_phase
        now = time.monotonic()
        phases.append(f"{name} {now - t_phase:.1f}s")
        t_phase = now

    p = _make_primary(make_cluster)
    before_backup = [r[0] for r in p.sql(
        "INSERT INTO ids (origin) SELECT 'p' FROM generate_series(1, 1000) "
        "RETURNING id")]

    s_settings = {"snowflake_id.worker_ids": P_RANGE, "hot_standby": True}
    env = None
    if offset:
        s_settings["snowflake_id.max_drift"] = "10s"
        env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset,
               "FAKETIME_DONT_RESET": "1", "FAKETIME_NO_CACHE": "1"}
    phase("primary")
    s = make_cluster(basebackup_from=p, settings=s_settings, env=env)
    phase("standby")
    assert s.scalar("SELECT pg_is_in_recovery()")
    if offset:
        skew = (dt.datetime.now(dt.timezone.utc) -
                s.scalar("SELECT clock_timestamp()")).total_seconds()
        assert 2.5 < skew < 3.5, skew

    # P keeps making IDs (two sessions, so two worker ids) until it crashes.
    gens = [_Generator(p, "p") for _ in range(2)]
    for g in gens:
        g.start()
    time.sleep(1.0)
    if lagging:
        wait_until(lambda: _standby_caught_up(p, s), 30, "standby replay")
        s.sql("ALTER SYSTEM SET primary_conninfo = ''")
        s.sql("SELECT pg_reload_conf()")
        wait_until(lambda: not s.sql("SELECT 1 FROM pg_stat_wal_receiver"), 30,
                   "the standby's WAL receiver to stop")
        time.sleep(2.0)
    else:
        time.sleep(1.0)
    phase("generate")
    p.stop(mode="immediate")
    for g in gens:
        g.finish()
    phase("crash")
    issued = before_backup + [i for g in gens for i in g.ids]
    assert len(issued) == len(set(issued))
    t_crash = time.monotonic()

    drift_ms = 10_000 if offset else 60_000
    _promote_and_check_the_clock(s, -3 if offset else 0, 1000, drift_ms)
    phase("promote")
    # The same range on the promoted standby: it takes over P's worker ids.
    # (P used 0 before the backup, then 1 and 2; S's fresh server hands out
    # 0, 1, 2.)
    after = _generate_on(s, connections=3, seconds=1.5)
    t_after = time.monotonic() - t_crash
    assert not s.scalar("SELECT pg_is_in_recovery()")
    replicated = {r[0] for r in s.sql("SELECT id FROM ids")}
    before = set(issued) | replicated
    # What a user would see: the standby's new IDs against the table rows
    # replicated from P (a duplicate key error for each one).
    clash_with_table = s.scalar(
        "WITH t AS (INSERT INTO ids (id, origin) SELECT unnest(%s::bigint[]), 's' "
        "ON CONFLICT DO NOTHING RETURNING 1) SELECT %s - count(*) FROM t",
        after, len(after))

    repeats = set(after) & before
    undercut = {}
    for w in sorted({worker_of(i) for i in after}):
        prev = [i for i in before if worker_of(i) == w]
        if prev and min(i for i in after if worker_of(i) == w) <= max(prev):
            undercut[w] = (max(prev) - min(i for i in after if worker_of(i) == w)) >> TICK_SHIFT
    lost = set(issued) - replicated
    for w in sorted({worker_of(i) for i in before | set(after)}):
        pw = [i for i in before if worker_of(i) == w]
        sw = [i for i in after if worker_of(i) == w]
        print(f"  worker {w}: P {len(pw)} IDs, last at {ms_of(max(pw)) if pw else None}; "
              f"S {len(sw)} IDs, {ms_of(min(sw)) if sw else None} .. {ms_of(max(sw)) if sw else None}")
    print(f"\n[failover {case}] P issued {len(issued)} IDs (client-side), "
          f"{len(replicated)} replicated, {len(lost)} lost in the failover; "
          f"S made {len(after)} IDs in {t_after:.1f}s after the crash "
          f"(worker ids {sorted({worker_of(i) for i in after})}); "
          f"repeats {len(repeats)}; duplicate-key clashes with replicated rows "
          f"{clash_with_table}; worker ids whose first post-promotion ID is not "
          f"above P's last (ms below): {undercut}; "
          f"S's first ID at {ms_of(min(after)) - ms_of(max(issued))} ms from "
          f"P's last; phases: {', '.join(phases)}")
    assert len(after) == len(set(after))
    assert not repeats, f"{len(repeats)} IDs repeated after promotion"
    assert not undercut, f"per worker id, IDs went back after promotion: {undercut}"
    assert clash_with_table == 0


def test_hot_standby_generates_from_its_own_range(make_cluster):
    p = _make_primary(make_cluster)
    s = make_cluster(basebackup_from=p, settings={
        "snowflake_id.worker_ids": S_STANDBY_RANGE, "hot_standby": True})
    assert s.scalar("SELECT pg_is_in_recovery()")
    # The extension (created on P) reached S with the catalog.
    assert s.scalar("SELECT count(*) FROM pg_extension WHERE extname = 'snowflake_id'") == 1

    gen = _Generator(p, "p")
    gen.start()
    try:
        with s.connect() as conn:
            one = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
            batch = [r[0] for r in conn.execute(
                "SELECT * FROM snowflake_nextvals(1000)").fetchall()]
            mine = conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]
            # A read-only transaction is fine too (it is one anyway here).
            conn.execute("BEGIN READ ONLY")
            ro = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
            conn.execute("COMMIT")
        on_s = [one] + batch + [ro] + _generate_on(s, connections=3, seconds=1.0)
    finally:
        p_ids = gen.finish()
    assert gen.error is None, gen.error
    assert [one] + batch + [ro] == sorted([one] + batch + [ro])
    assert len(on_s) == len(set(on_s))
    s_workers = {worker_of(i) for i in on_s}
    assert mine in range(16, 32)
    assert s_workers <= set(range(16, 32)) and len(s_workers) >= 3, s_workers
    assert p_ids and {worker_of(i) for i in p_ids} <= set(range(0, 16))
    assert not set(on_s) & set(p_ids)
    # S's IDs carry S's time.
    now_ms = time.time() * 1000
    assert all(now_ms - 10_000 < ms_of(i) <= now_ms + 1_000 for i in on_s)
    # The claims show in the standby's view.
    view = dict(s.sql("SELECT worker_id, ids_issued FROM snowflake_workers"))
    assert set(view) == s_workers and sum(view.values()) == len(on_s), view
    assert s.scalar("SELECT pg_is_in_recovery()")
    print(f"\n[hot standby] S made {len(on_s)} IDs with worker ids "
          f"{sorted(s_workers)} while P made {len(p_ids)} with "
          f"{sorted({worker_of(i) for i in p_ids})}; none shared")


class _Selecter(_Generator):
    """Like _Generator, with SELECT: no transaction commit waits for a
    standby, so an ID the server returned is in use at once."""

    def run(self):
        try:
            while not self.stop_flag.is_set():
                rows = self.conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, %s)",
                    (ID_BATCH,)).fetchall()
                self.ids.extend(r[0] for r in rows)
                time.sleep(PAUSE)
        except psycopg.Error as e:
            self.error = e


def _synchronous_standby(make_cluster, p, settings, env=None):
    """A standby of `p` streaming as s1, which `p`'s
    synchronous_standby_names then names."""
    s = make_cluster(basebackup_from=p, start=False, settings=settings)
    with open(os.path.join(s.datadir, "postgresql.auto.conf"), "a") as f:
        f.write(f"primary_conninfo = 'host={p.dir} port={p.port} user=postgres"
                f" application_name=s1'\n")
    s.start(env=env)
    wait_until(lambda: p.scalar("SELECT count(*) FROM pg_stat_replication "
                                "WHERE application_name = 's1' AND state = 'streaming'") == 1,
               60, "s1 streaming")
    p.configure(synchronous_standby_names="s1")
    p.reload()
    wait_until(lambda: p.scalar("SELECT sync_state FROM pg_stat_replication "
                                "WHERE application_name = 's1'") == "sync", 60, "s1 sync")
    return s


def _cut_off(s):
    """The standby stops receiving WAL (a partition)."""
    s.sql("ALTER SYSTEM SET primary_conninfo = ''")
    s.sql("SELECT pg_reload_conf()")
    wait_until(lambda: not s.sql("SELECT 1 FROM pg_stat_wal_receiver"), 30,
               "the standby's WAL receiver to stop")


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_promoted_synchronous_standby_never_repeats_the_primary(make_cluster):
    """P names S in synchronous_standby_names. S's clock is 3 s behind P's,
    and its floor at promotion gives no margin (standby_clock_skew 0,
    max_drift 1 s): only the reservations S has keep it above P's IDs. S is
    cut off (a partition); P's sessions keep asking for IDs with SELECT (no
    commit waits). A reservation waits for S like a commit, so P's sessions
    stop at the last reservation S flushed, waiting (wait event SyncRep),
    and a cancel fails the call (57014) rather than hand out IDs S may lack.
    Then P crashes and S is promoted: none of its IDs repeats or undercuts
    P's. (Before 0.8.0, P went on making IDs under reservations S never
    received, and S repeated them.)"""
    p = make_cluster(settings={"snowflake_id.worker_ids": P_RANGE}, create_extension=True)
    s = _synchronous_standby(make_cluster, p, {
        "snowflake_id.worker_ids": P_RANGE, "hot_standby": True,
        "snowflake_id.standby_clock_skew": 0, "snowflake_id.max_drift": "1s"},
        env={"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "-3s",
             "FAKETIME_DONT_RESET": "1", "FAKETIME_NO_CACHE": "1"})

    # One session, with synchronous_commit off: it extends every
    # reservation, and its own commits would not wait for s1, but a
    # reservation covers every session's IDs and waits all the same.
    gens = [_Selecter(p, "p")]
    gens[0].conn.execute("SET synchronous_commit = off")
    for g in gens:
        g.start()
    time.sleep(1.0)
    wait_until(lambda: _standby_caught_up(p, s), 30, "standby replay")
    _cut_off(s)
    # P's sessions reach the end of the reservation S has within about a
    # second (RESERVE_MS), then wait for S as a commit would.
    time.sleep(2.5)
    counts = [len(g.ids) for g in gens]
    time.sleep(0.5)
    assert [len(g.ids) for g in gens] == counts, "P made IDs its standby lacks the reservation of"
    assert p.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                    "AND query LIKE '%%snowflake_nextval%%'") == 1
    # A cancel ends the wait: the call fails, no ID is handed out.
    mark = p.log_mark()
    p.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
          "WHERE query LIKE '%%snowflake_nextval%%' AND pid <> pg_backend_pid()")
    p.wait_for_log("canceling wait for synchronous replication", since=mark)
    for g in gens:
        g.join(30)
        assert isinstance(g.error, psycopg.errors.QueryCanceled), g.error
        assert "not confirmed by the synchronous standbys" in str(g.error), g.error
        # The session's own setting is back.
        assert g.conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    issued = [i for g in gens for i in g.ids]
    # Another session (synchronous_commit on) extends in turn, waits, and a
    # statement timeout ends the wait with the same error.
    with p.connect() as conn:
        conn.execute("SET statement_timeout = '1s'")
        with pytest.raises(psycopg.errors.QueryCanceled,
                           match="not confirmed by the synchronous standbys"):
            for _ in range(100):
                issued += [r[0] for r in conn.execute(
                    "SELECT snowflake_nextval() FROM generate_series(1, 10000)")]
    for g in gens:
        g.conn.close()
    p.stop(mode="immediate")

    floor_ms = _promote_and_check_the_clock(s, -3, 0, 1000)
    after = _generate_on(s, connections=3, seconds=1.5)
    assert len(after) == len(set(after))
    assert not set(after) & set(issued), "IDs repeated after promotion"
    undercut = {w for w in {worker_of(i) for i in after}
                if min(i for i in after if worker_of(i) == w)
                <= max([i for i in issued if worker_of(i) == w], default=-1)}
    print(f"\n[synchronous failover] P issued {len(issued)} IDs, the last at "
          f"{ms_of(max(issued))}; S's floor {floor_ms:.0f}, S made {len(after)} "
          f"IDs from {ms_of(min(after))}")
    assert not undercut, f"per worker id, IDs went back after promotion: {undercut}"
    assert max(ms_of(i) for i in issued) <= floor_ms + 1


def test_backfill_grant_waits_for_the_synchronous_standby(make_cluster):
    """A backfill grant, like a reservation, is used only once the
    synchronous standby flushed it: with s1 cut off, snowflake_at() waits,
    and a statement timeout fails it (57014) without an ID. In a
    transaction, so that no commit waits for s1 before the ID is returned
    (before 0.8.0 the ID came back at once)."""
    p = make_cluster(settings={"snowflake_id.worker_ids": P_RANGE,
                               "snowflake_id.backfill_worker_ids": "1023"},
                     create_extension=True)
    s = _synchronous_standby(make_cluster, p, {
        "snowflake_id.worker_ids": S_STANDBY_RANGE,
        "snowflake_id.backfill_worker_ids": "1023"})
    assert p.scalar("SELECT snowflake_at('2025-01-01')") > 0
    _cut_off(s)
    with p.connect(autocommit=False) as conn:
        conn.execute("SET statement_timeout = '1s'")
        with pytest.raises(psycopg.errors.QueryCanceled,
                           match="backfill grant was not confirmed by the synchronous standbys"):
            conn.execute("SELECT snowflake_at('2024-06-01')").fetchone()
        conn.rollback()


def test_a_fast_stop_does_not_wait_for_a_synchronous_standby_that_is_gone(make_cluster):
    """P names s1 in synchronous_standby_names, and s1 is cut off. At a
    fast stop the registry worker writes its last copy of the claims
    (snowflake_worker_registry): P stops as PostgreSQL's own processes do,
    without waiting for s1. Before 0.8.0 that commit waited for s1, and
    the worker never saw SIGTERM: pg_ctl gave up after its timeout."""
    p = _make_primary(make_cluster)
    s = _synchronous_standby(make_cluster, p, {"snowflake_id.worker_ids": S_STANDBY_RANGE})
    p.sql("INSERT INTO ids (origin) SELECT 'p' FROM generate_series(1, 1000)")
    _cut_off(s)
    proc = p._pg_ctl("-m", "fast", "-w", "-t", "40", "stop", check=False, timeout=70)
    assert proc.returncode == 0, f"a fast stop did not end in 40 s: {proc.stdout}{proc.stderr}"


def test_crash_recovery_keeps_ids_near_the_clock(make_cluster):
    """Crash recovery replays the server's own WAL, which has every
    reservation it used: no clock bound (IDs do not jump max_drift ahead),
    and no line about a new primary."""
    p = _make_primary(make_cluster)
    p.sql("INSERT INTO ids (origin) SELECT 'p' FROM generate_series(1, 1000)")
    p.stop(mode="immediate")
    mark = p.log_mark()
    p.start()
    first = p.scalar("SELECT snowflake_nextval()")
    # The reservation is 1 s ahead of the last ID; max_drift is a minute.
    assert ms_of(first) < time.time() * 1000 + 5_000, ms_of(first) - time.time() * 1000
    assert "recovery ended as a new primary" not in p.log(since=mark)


def test_restored_backup_ending_archive_recovery_starts_above_the_clock_bound(make_cluster):
    """A base backup restored with recovery.signal (point-in-time recovery
    that ends at the end of its WAL) ends archive recovery as a new
    primary: like a promotion, its IDs start above its clock plus
    standby_clock_skew plus max_drift, since the original may have made
    IDs after the backup's WAL ends."""
    p = _make_primary(make_cluster)
    r = make_cluster(basebackup_from=p, start=False, settings={
        "snowflake_id.worker_ids": P_RANGE, "restore_command": "false",
        "snowflake_id.max_drift": "5s"})
    os.remove(os.path.join(r.datadir, "standby.signal"))
    with open(os.path.join(r.datadir, "recovery.signal"), "w"):
        pass
    if AS_ROOT:
        os.chown(os.path.join(r.datadir, "recovery.signal"), *pg_ids())
    mark = r.log_mark()
    before = time.time() * 1000
    r.start()
    m = r.wait_for_log(RECOVERY_END, since=mark)
    floor_ms, clock_ms = _unix_ms(m.group(1)), _unix_ms(m.group(4))
    assert before - 500 <= clock_ms <= time.time() * 1000 + 500, m.group(0)
    assert floor_ms >= clock_ms + 1000 + 5000 - 1, m.group(0)
    # The line is logged as recovery ends, before the server takes writes
    # (its end-of-recovery checkpoint): on a loaded machine a moment later.
    wait_until(lambda: not r.scalar("SELECT pg_is_in_recovery()"), timeout=60,
               what="the end of archive recovery")
    assert ms_of(r.scalar("SELECT snowflake_nextval()")) > floor_ms
