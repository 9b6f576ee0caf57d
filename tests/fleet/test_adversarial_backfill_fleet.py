"""Adversarial: backfill in a fleet (docs/guides/backfill.md, "In a
fleet", "Why no ID repeats", "Dumps and restores", "Limits"). Holders get
snowflake_at() grants from a registry; each test tries, on real servers,
to make two backfill IDs equal: several holders and the registry over
the same times at once (with live IDs); a holder killed mid-statement,
then its clock behind; a registry failover to its synchronous standby, a
registry crash, an old registry left running after a failover, an
asynchronous standby promoted; the registry's extension dropped and
created again; a registry restored from a dump (with each documented
carry-over) or from a base backup; a server that backfilled alone before
it joined the fleet; a holder's dump restored on another server; a grant
call cancelled in its durability wait; a holder losing its lease
mid-statement; ids added on the registry while holders hold grants; and
requests the lease role makes up.

Each test asserts that its attack really happened (the failover, the
clock behind, the grants taken, backward steps). Strict xfails are open
problems, their reasons the numbers seen on PostgreSQL 15."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import signal
import threading
import time

import psycopg
import pytest

from fleet_helpers import (duplicates, grant_lease_role, holder, hosts, lease_limits,
                           named_standby, registry_server, registry_state, require_sync)
from fleet_helpers import backfill_ids as _backfill
from fleet_helpers import grants_by_stretch as _grants
from fleet_helpers import total_grants as _total
from fleet_helpers import try_scalar as _try
from fleet_helpers import wait_live as _live
from harness import ClusterError, wait_until
from helpers import LIBFAKETIME, FakeClock, run_client, sql_error

UTC = dt.timezone.utc
IDS = "1008-1023"
SET_ASIDE = {"snowflake_id.backfill_worker_ids": IDS}
# Half of block 63: room to add ids at the end (docs: "Dumps and restores").
HALF = {"snowflake_id.backfill_worker_ids": "1008-1015"}
START = dt.datetime(2024, 5, 1, tzinfo=UTC)
# Times over about 80 days (about 53 stretches), several on one millisecond.
TIMES = [START + dt.timedelta(minutes=97 * i, milliseconds=i % 5) for i in range(1200)]
# One millisecond shared by more rows than a grant holds (64 a tick).
HOT = START + dt.timedelta(days=3, milliseconds=7)


def _backward_steps(times) -> int:
    return sum(1 for a, b in zip(times, times[1:]) if b < a)


def _decoded_ok(c, made: list[int]) -> None:
    """Every backfill ID decodes to a set-aside worker id."""
    bad = c.scalar("SELECT count(*) FROM unnest(%s::bigint[]) u(id), snowflake_decode(id) d"
                   " WHERE d.worker_id < 1008", made)
    assert bad == 0, f"{bad} backfill IDs of a live worker id"


def _no_duplicates(made: dict[str, list[int]]) -> None:
    problems = duplicates(made)
    assert not problems, "; ".join(problems)


def _postmaster(c) -> int:
    with open(os.path.join(c.datadir, "postmaster.pid")) as f:
        return int(f.readline())


def _gone(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _started(c) -> bool:
    try:
        c.start(timeout=30)
        return True
    except ClusterError:
        time.sleep(1)
        return False


def _quietly_close(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001, S110 (the server is gone)
        pass


# ------------------------------------ 1. several holders, the same times, at once
def _registry_and_holders(make_cluster, names: str):
    """A registry setting the ids aside, and a holder per letter of
    `names`, each making live IDs."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    hs = {n: holder(make_cluster, r, **SET_ASIDE) for n in names}
    for c in hs.values():
        _live(c)
    return r, hs


def test_three_holders_and_the_registry_backfilling_the_same_times_repeat_no_id(make_cluster):
    """Holders A, B, C (two sessions each) and the registry itself import
    the same 1,200 times plus 150 rows of one millisecond, shuffled (over
    500 backward steps each), twice per session with another order; the
    holders make live IDs meanwhile. No ID is made twice; the registry
    handed out the further grants the shared millisecond needs (three per
    session)."""
    r, hs = _registry_and_holders(make_cluster, "ABC")
    made: dict[str, list[int]] = {}
    steps: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(key, c, seed):
        rng = random.Random(seed)
        try:
            with c.connect() as conn:
                got = []
                for _ in range(2):
                    times = TIMES + [HOT] * 150
                    rng.shuffle(times)
                    steps.append(_backward_steps(times))
                    got += _backfill(conn, times)
            made[key] = got
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def live(key, c):
        got = []
        try:
            with c.connect() as conn:
                while not stop.is_set():
                    got += [row[0] for row in conn.execute(
                        "SELECT snowflake_nextval() FROM generate_series(1, 500)").fetchall()]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        made[key] = got

    importers = [threading.Thread(target=work, args=(f"{n}{s}", c, i))
                 for i, (n, c, s) in enumerate(
                     [(n, c, s) for s in (1, 2) for n, c in hs.items()] + [("R", r, 1)])]
    livers = [threading.Thread(target=live, args=(f"live {n}", c)) for n, c in hs.items()]
    for t in importers + livers:
        t.start()
    for t in importers:
        t.join()
    stop.set()
    for t in livers:
        t.join()
    assert not errors, errors
    assert len(steps) == 14 and min(steps) > 500, steps
    assert all(len(made[f"live {n}"]) >= 500 for n in hs), {k: len(v) for k, v in made.items()}
    backfilled = [i for k, v in made.items() if not k.startswith("live") for i in v]
    assert len(backfilled) == 7 * 2 * 1350
    _decoded_ok(r, backfilled)
    _no_duplicates(made)
    hot_grants = r.scalar("SELECT grants FROM snowflake_backfill() WHERE %s BETWEEN starts_at"
                          " AND ends_at", HOT)
    # 7 sessions, each 300 rows of HOT: 5 grants of 64 each.
    assert hot_grants >= 35, hot_grants
    print(f"\n[same times] {len(backfilled)} backfill IDs, HOT stretch {hot_grants} grants,"
          f" steps {min(steps)}..{max(steps)}")


# --------------------------- 2. a holder crashed mid-statement, its clock behind
@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_a_holder_killed_mid_statement_then_its_clock_behind_repeats_no_id(make_cluster):
    """Holder A (under libfaketime) commits backfill rows, streams IDs to a
    client from a statement left running, and runs an import that sleeps
    mid-statement after 700 IDs: its grants are taken. kill -9 of A's
    postmaster; its clock is set an hour back; A is started again. The
    same times backfilled again on A (several sessions) and on holder B:
    no ID equals a committed one or one the client received."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, start=False, **SET_ASIDE)
    clock = FakeClock(a.dir)
    a.start(env=clock.env())
    a.create_extension()
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    times = TIMES[:900] + [HOT] * 100
    random.Random(7).shuffle(times)
    with a.connect() as conn:
        conn.execute("CREATE TABLE legacy AS SELECT n AS k, t FROM unnest(%s::timestamptz[])"
                     " WITH ORDINALITY u(t, n)", (times,))
        conn.execute("CREATE TABLE done AS SELECT snowflake_at(t) AS id FROM legacy WHERE k <= 300")
        conn.execute("CREATE TABLE pending (id bigint)")
    streamer = a.connect()
    importer = a.connect()
    failure: list[BaseException] = []
    try:
        rows = streamer.cursor().stream("SELECT snowflake_at(t) FROM legacy ORDER BY k DESC")
        sent = [next(rows)[0] for _ in range(400)]
        pid = importer.info.backend_pid

        def run_import():
            try:
                importer.execute("""INSERT INTO pending SELECT snowflake_at(t) FROM legacy,
                    LATERAL (SELECT CASE WHEN k = 700 THEN pg_sleep(600) END) z""")
            except psycopg.Error as e:
                failure.append(e)
        t = threading.Thread(target=run_import)
        t.start()
        wait_until(lambda: a.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
                                    " AND wait_event = 'PgSleep'", pid) == 1,
                   timeout=60, what="the import to sleep mid-statement")
        grants_before = _total(r)
        postmaster = _postmaster(a)
        os.kill(postmaster, signal.SIGKILL)
        t.join(60)
        assert failure, "the import did not fail"
    finally:
        _quietly_close(streamer)
        _quietly_close(importer)
    # Three sessions of A took grants of the stretches of `times`.
    assert grants_before >= 100, grants_before
    clock.set(-3600)
    wait_until(lambda: _gone(postmaster), timeout=60, what="the old postmaster to go")
    a.running = False
    wait_until(lambda: _started(a), timeout=120, what="A started again")
    made = {"done": [row[0] for row in a.sql("SELECT id FROM done")], "sent": sent}
    with a.connect() as conn:
        behind = float(conn.execute("SELECT extract(epoch FROM now())").fetchone()[0])
        assert behind < time.time() - 3000, "A's clock is not behind"
        assert conn.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
    for n in range(3):
        with a.connect() as conn:
            made[f"A again {n}"] = _backfill(conn, times)
    with b.connect() as conn:
        made["B"] = _backfill(conn, times)
    assert _total(r) > grants_before
    _decoded_ok(r, made["A again 0"] + made["B"])
    _no_duplicates(made)


# ------------------------------------------------ 3. a registry failover
class Rounds:
    """Two sessions per holder, each kept open, importing the same times
    in rounds (150 of the times, the later rounds reaching further
    stretches, and 40 rows of HOT); a round that fails (no registry
    answers) is run again in the same session, which keeps its grants."""

    def __init__(self, holders: dict):
        self.keys = [f"{n}{i}" for n in holders for i in (1, 2)]
        self.made: dict[str, list[int]] = {k: [] for k in self.keys}
        self.rounds = dict.fromkeys(self.keys, 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(k, holders[k[0]], i))
                         for i, k in enumerate(self.keys)]
        for t in self._threads:
            t.start()

    def _work(self, key, c, seed):
        rng = random.Random(seed)
        with c.connect() as conn:
            while not self._stop.is_set():
                times = rng.sample(TIMES[:200 + 100 * self.rounds[key]], 150) + [HOT] * 40
                try:
                    self.made[key] += _backfill(conn, times)
                    self.rounds[key] += 1
                except psycopg.Error as e:
                    self.failures.append(f"{key} {e.sqlstate}: {e.diag.message_primary}")
                    self._stop.wait(0.3)

    def wait_more(self, since: dict, n: int, what: str) -> None:
        wait_until(lambda: all(self.rounds[k] >= since.get(k, 0) + n for k in self.keys),
                   timeout=180, what=what)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def test_sessions_holding_grants_across_a_registry_failover_repeat_no_id(make_cluster):
    """Registry P with its synchronous standby s1; holders A and B each
    keep two sessions open, importing the same times in rounds. P is
    stopped (immediate) mid-import and s1 promoted. No ID is made twice;
    s1 handed out grants after the failover, above P's."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    hs = {n: holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s)})
          for n in "AB"}
    for c in hs.values():
        _live(c)
    work = Rounds(hs)
    try:
        work.wait_more({}, 2, "imports on P")
        p.stop(mode="immediate")
        at_failover = dict(work.rounds)
        before = _grants(s)
        s.promote()
        work.wait_more(at_failover, 3, "imports going on against the promoted s1")
    finally:
        work.stop()
    assert not s.scalar("SELECT pg_is_in_recovery()")
    after = _grants(s)
    assert sum(after.values()) > sum(before.values()), "s1 handed out no grant"
    for bucket, n in before.items():
        assert after.get(bucket, 0) >= n
    _decoded_ok(s, work.made["A1"])
    _no_duplicates(work.made)
    print(f"\n[failover] rounds {work.rounds}, failures {len(work.failures)}:"
          f" {work.failures[:2]}")


def test_sessions_holding_grants_across_a_registry_crash_repeat_no_id(make_cluster):
    """kill -9 of the registry's postmaster while holders A and B import
    the same times in sessions kept open; the registry is started again
    (crash recovery: its counters from the state file and WAL). No ID is
    made twice; it handed out grants after the crash."""
    r, hs = _registry_and_holders(make_cluster, "AB")
    work = Rounds(hs)
    try:
        work.wait_more({}, 2, "imports before the crash")
        before = _total(r)
        mark = r.log_mark()
        postmaster = _postmaster(r)
        os.kill(postmaster, signal.SIGKILL)
        at_crash = dict(work.rounds)
        wait_until(lambda: _gone(postmaster), timeout=60, what="the registry's postmaster to go")
        r.running = False
        wait_until(lambda: _started(r), timeout=120, what="the registry started again")
        work.wait_more(at_crash, 3, "imports going on after the crash")
    finally:
        work.stop()
    assert "was interrupted" in r.log(since=mark) or "not properly shut down" in r.log(since=mark)
    assert _total(r) > before
    _decoded_ok(r, work.made["A1"])
    _no_duplicates(work.made)
    print(f"\n[registry crash] rounds {work.rounds}, failures {len(work.failures)}")


@pytest.mark.slow
def test_an_old_registry_left_running_after_a_failover_grants_nothing_used(make_cluster):
    """Split brain with one synchronous standby (kept, docs/operations/
    fleet.md): P's standby s1 is promoted while P keeps running. Holder A,
    whose connection string names P first, keeps asking P: P hands out
    grants, which it cannot make durable (its standby is gone), and A
    uses none (55000 after its wait). Holder B asks s1 for the same
    times; A's earlier IDs and B's never repeat."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s)})
    b = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(s, p)})
    _live(a)
    times = TIMES[:300]
    made = {}
    with a.connect() as conn:
        made["A before"] = _backfill(conn, times)
    s.promote()
    assert not s.scalar("SELECT pg_is_in_recovery()")
    assert p.scalar("SELECT NOT pg_is_in_recovery()")
    before = _total(p)
    with a.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", (times,))
    assert e.sqlstate == "55000", str(e)
    assert "not durable" in e.diag.message_primary, str(e)
    assert _total(p) > before, "P handed out no grant after the promotion"
    with b.connect() as conn:
        made["B from s1"] = _backfill(conn, times)
    _no_duplicates(made)


def test_the_registrys_extension_dropped_and_created_mid_import_repeats_no_id(make_cluster):
    """DROP EXTENSION snowflake_id CASCADE and CREATE EXTENSION again on
    the registry while holders A and B import the same times in sessions
    kept open: its table of grants is made again, empty; its counters (of
    the server, not of the extension) go on. No ID is made twice; grants
    are handed out after it, above the earlier ones."""
    r, hs = _registry_and_holders(make_cluster, "AB")
    work = Rounds(hs)
    try:
        work.wait_more({}, 2, "imports before the DROP")
        before = _grants(r)
        r.sql("DROP EXTENSION snowflake_id CASCADE")
        at_drop = dict(work.rounds)
        r.create_extension()
        lease_limits(r)
        work.wait_more(at_drop, 3, "imports going on after CREATE EXTENSION")
    finally:
        work.stop()
    after = _grants(r)
    assert sum(after.values()) > sum(before.values())
    for bucket, n in before.items():
        assert after.get(bucket, 0) >= n
    _no_duplicates(work.made)
    print(f"\n[drop/create] rounds {work.rounds}, failures {len(work.failures)}:"
          f" {sorted(set(f.split(':')[0][3:] for f in work.failures))}")


def test_a_promoted_asynchronous_standby_hands_out_grants_again(make_cluster):
    """Outside the assumptions (docs: "A promoted asynchronous standby may
    hand out again grants it did not receive"): registry P with an
    asynchronous standby s1, which is stopped; holder A imports (grants
    s1 never receives); P is lost and s1 promoted; holder B imports the
    same times from s1 and gets A's grants again: IDs repeat."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", None, **SET_ASIDE)
    a = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s)})
    _live(a)
    with a.connect() as conn:
        first = _backfill(conn, TIMES[:300])
    lsn = p.scalar("SELECT pg_current_wal_flush_lsn()::text")
    wait_until(lambda: s.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn),
               timeout=60, what="s1 replaying A's first grants")
    s.stop(mode="immediate")
    with a.connect() as conn:
        lost = _backfill(conn, TIMES[:300])
    p.stop(mode="immediate")
    s.start()
    s.promote()
    assert s.scalar("SELECT pg_is_in_recovery()") is False
    b = holder(make_cluster, s, **SET_ASIDE)
    _live(b)
    with b.connect() as conn:
        again = _backfill(conn, TIMES[:300])
    problems = duplicates({"A first": first, "A lost": lost, "B from s1": again})
    # s1 knew it may have forgotten grants (a fenced incarnation), and
    # handed out backfill grants all the same.
    state = registry_state(s)
    print(f"\n[async failover] {problems}; registry {state}")
    assert state[2] != "created", state
    assert problems and all("A lost and B" in x for x in problems), problems


@pytest.mark.slow
def test_a_holder_insisting_on_a_synchronous_standby_uses_no_grant_of_an_async_one(
        make_cluster):
    """The documented protection against the test above: with
    snowflake_id.lease_replication = synchronous, a holder of a registry
    whose standby is asynchronous uses none of its grants (55000 after the
    30 s wait), though the registry handed them out."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", None, **SET_ASIDE)
    strict = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s),
                                        "snowflake_id.lease_replication": "synchronous"})
    with strict.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    assert e.sqlstate == "55000", str(e)
    assert "not durable on its synchronous standbys" in e.diag.message_primary, str(e)
    assert "mode async" in e.diag.message_detail or "0 of" in e.diag.message_detail, \
        e.diag.message_detail
    assert _total(p) >= 1


# -------------------------------------- 4. the registry restored from a dump
def _tcp_registry(make_cluster, ids: dict):
    r = make_cluster(tcp=True, settings={"fsync": True, **ids})
    r.create_extension()
    lease_limits(r)
    return r


def _dump_restore_fleet(make_cluster, ids: dict):
    """Registry R with holders A and B, whose connection strings name R,
    then R2 (initialized, not started: the restore's target)."""
    r = _tcp_registry(make_cluster, ids)
    r2 = make_cluster(tcp=True, start=False, settings={"fsync": True, **ids})
    a = holder(make_cluster, r, **{**ids, "snowflake_id.registry": hosts(r, r2)})
    b = holder(make_cluster, r, **{**ids, "snowflake_id.registry": hosts(r, r2)})
    _live(a)
    _live(b)
    return r, r2, a, b


def _dump(r) -> str:
    path = os.path.join(r.dir, "registry.dump")
    run_client(r, "pg_dump", "-Fc", "-f", path, "-d", "postgres")
    return path


def _restore(r2, path) -> None:
    """The dump restored on R2 in one transaction: the holders' lease
    workers, which connect to R2 as soon as it runs, lease blocks there as
    soon as the extension exists; a restore in several transactions then
    fails on the lease rows (duplicate key in snowflake_lease_blocks)."""
    r2.start()
    run_client(r2, "pg_restore", "--exit-on-error", "--single-transaction", "-d", "postgres",
               path)


@pytest.mark.parametrize("carry_over", ["none", "old registry running", "old registry gone",
                                        "rows read while holders import"])
def test_a_registry_restored_from_a_dump(make_cluster, carry_over):
    """R hands out grants to A's session sa; R's database is dumped; A's
    session sb takes grants after the dump (both sessions stay open);
    R is lost and its dump restored on R2 (the holders' connection strings
    name it next). Then sa and sb go on, and B imports the same times
    from R2.
    none: R2 hands out sb's grants again: IDs repeat (documented).
    old registry running: each row of R's snowflake_backfill(), read
    before R stops, is raised on R2 (documented): no ID repeats.
    old registry gone: each stretch imported into since the dump is
    raised on R2 to its capacity, and ids added at the end on R2 and every
    holder (documented): no ID repeats.
    rows read while holders import: R's rows read before sb's grants,
    then raised on R2 (the docs say to stop every import first): IDs
    repeat."""
    ids = HALF if carry_over == "old registry gone" else SET_ASIDE
    r, r2, a, b = _dump_restore_fleet(make_cluster, ids)
    times = TIMES[:400]
    sa, sb = a.connect(), a.connect()
    try:
        made = {"sa before": _backfill(sa, times)}
        path = _dump(r)
        dumped = _total(r)
        if carry_over == "rows read while holders import":
            old_rows = r.sql("SELECT starts_at, grants, worker_ids FROM snowflake_backfill()")
        made["sb after dump"] = _backfill(sb, times)
        assert _total(r) > dumped, "no grant after the dump"
        if carry_over != "rows read while holders import":
            old_rows = r.sql("SELECT starts_at, grants, worker_ids FROM snowflake_backfill()")
        r.stop(mode="immediate")
        _restore(r2, path)
        assert _total(r2) == dumped
        if carry_over in ("old registry running", "rows read while holders import"):
            for row in old_rows:
                r2.sql("SELECT snowflake_backfill_raise(%s, %s, %s)", *row)
        elif carry_over == "old registry gone":
            capacity = r2.scalar("SELECT max(capacity) FROM snowflake_backfill()")
            assert capacity == 8 * 64
            r2.sql("SELECT count(snowflake_backfill_raise(t, %s))"
                   " FROM unnest(%s::timestamptz[]) t", capacity, times)
            _quietly_close(sa)
            _quietly_close(sb)
            # Restarted holders lease no block while R2 is fenced (12 min:
            # the limits were lowered less than that before the dump);
            # backfill needs none.
            for c in (r2, a, b):
                c.configure(**{"snowflake_id.backfill_worker_ids": "1008-1023"})
                c.restart()
        if carry_over != "old registry gone":
            made["sa again"] = _backfill(sa, times)
            made["sb again"] = _backfill(sb, times)
        with b.connect() as conn:
            made["B from R2"] = _backfill(conn, times)
        with a.connect() as conn:
            made["A new session"] = _backfill(conn, times)
    finally:
        _quietly_close(sa)
        _quietly_close(sb)
    problems = duplicates(made)
    print(f"\n[dump restore, {carry_over}] {problems}")
    if carry_over == "old registry gone":
        # New grants of the raised stretches come from the added ids.
        low = r2.scalar("SELECT count(*) FROM unnest(%s::bigint[]) u(id), snowflake_decode(id) d"
                        " WHERE d.worker_id < 1016", made["B from R2"])
        assert low == 0, low
    if carry_over in ("none", "rows read while holders import"):
        assert problems and all("sb after dump and" in x for x in problems), problems
    else:
        assert not problems, "; ".join(problems)


@pytest.mark.parametrize("carry_over", ["ids added", "raised and ids added"])
def test_a_registry_restored_from_a_base_backup(make_cluster, carry_over):
    """R hands out grants to A; a base backup of R is taken into R_b's
    directory; A takes more grants; R is lost and R_b started in its place
    (no archive: the WAL after the backup is lost). Then ids are added at
    the end on R_b and every holder, and B imports the same times.
    ids added: alone, as the docs advised before: the grants below the old
    capacity are handed out again, numbered over the old ids: IDs repeat.
    raised and ids added: each stretch imported into since the backup is
    first raised to its capacity (docs/guides/backfill.md, Limits): no ID
    repeats, B's from the added ids."""
    r = _tcp_registry(make_cluster, HALF)
    rb = make_cluster(tcp=True, start=False, settings={"fsync": True, **HALF})
    a = holder(make_cluster, r, **{**HALF, "snowflake_id.registry": hosts(r, rb)})
    b = holder(make_cluster, r, **{**HALF, "snowflake_id.registry": hosts(r, rb)})
    _live(a)
    _live(b)
    times = TIMES[:400]
    made = {}
    with a.connect() as conn:
        made["A before"] = _backfill(conn, times)
    shutil.rmtree(rb.datadir)
    run_client(r, "pg_basebackup", "-D", rb.datadir, "-X", "stream", "-c", "fast", "--no-sync")
    at_backup = _total(r)
    with a.connect() as conn:
        made["A after backup"] = _backfill(conn, times)
    assert _total(r) > at_backup
    r.stop(mode="immediate")
    rb.configure()  # its own port: harness.conf came with the backup
    rb.start()
    assert _total(rb) == at_backup
    if carry_over == "raised and ids added":
        rb.sql("SELECT count(snowflake_backfill_raise(t, 512)) FROM unnest(%s::timestamptz[]) t",
               times)
    for c in (rb, a, b):
        c.configure(**{"snowflake_id.backfill_worker_ids": IDS})
        c.restart()
    with b.connect() as conn:
        made["B"] = _backfill(conn, times)
    problems = duplicates(made)
    print(f"\n[base backup, {carry_over}] {problems}; registry {registry_state(rb)}")
    if carry_over == "ids added":
        assert problems and all("A after backup and B" in x for x in problems), problems
    else:
        assert not problems, "; ".join(problems)
        low = rb.scalar("SELECT count(*) FROM unnest(%s::bigint[]) u(id), snowflake_decode(id) d"
                        " WHERE d.worker_id < 1016", made["B"])
        assert low == 0, low


# --------------------------------------------------------------- 5. others
def test_a_server_that_backfilled_alone_then_joins_the_fleet(make_cluster):
    """A backfills on its own (hand-set ranges, the documented one server
    that imports); later a registry is set up with the same set-aside
    ids and A becomes its holder, as does B. A and B import the same
    times. A's requests carry its own counts, which the registry raises
    its counters to first. Before, the registry handed out its grants from
    0 again: 300 of A's earlier IDs made again (a strict xfail, seen
    failing)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = make_cluster(settings={"snowflake_id.worker_ids": "0-15", **SET_ASIDE})
    a.create_extension()
    times = TIMES[:300]
    made = {}
    with a.connect() as conn:
        made["A alone"] = _backfill(conn, times)
    assert _total(a) > 0
    a.configure(**{"snowflake_id.worker_ids": "", "snowflake_id.registry": r.conninfo(),
                   "snowflake_id.lease_time": "6s"})
    a.restart()
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    assert a.scalar("SELECT mode FROM snowflake_config()") == "registry"
    with a.connect() as conn:
        made["A in the fleet"] = _backfill(conn, times)
    with b.connect() as conn:
        made["B"] = _backfill(conn, times)
    problems = duplicates(made)
    print(f"\n[alone, then fleet] {problems}")
    assert not problems, "; ".join(problems)


def test_a_holders_dump_restored_on_a_server_that_backfills_alone(make_cluster):
    """A holder counts the fleet's grants it used in its own counters
    (durably, before use), so its dump carries them. Before, a holder's
    counters stayed empty: restored on a server that backfills alone with
    the same ids, 300 restored IDs were made again (a strict xfail, seen
    failing)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    times = TIMES[:300]
    a.sql("CREATE TABLE posts (id bigint PRIMARY KEY, created_at timestamptz)")
    a.sql("INSERT INTO posts SELECT snowflake_at(t), t FROM unnest(%s::timestamptz[]) t", times)
    path = os.path.join(a.dir, "holder.dump")
    run_client(a, "pg_dump", "-Fc", "-f", path, "-d", "postgres")
    n = make_cluster(settings={"snowflake_id.worker_ids": "0-15", **SET_ASIDE})
    run_client(n, "pg_restore", "--exit-on-error", "-d", "postgres", path)
    assert n.scalar("SELECT count(*) FROM posts") == 300
    restored = [row[0] for row in n.sql("SELECT id FROM posts")]
    with n.connect() as conn:
        again = _backfill(conn, times)
    problems = duplicates({"restored": restored, "N": again})
    print(f"\n[holder dump] {problems}")
    assert not problems, "; ".join(problems)


def test_a_grant_call_cancelled_in_its_durability_wait_is_never_used(make_cluster):
    """Registry P's synchronous standby s1 stops: A's snowflake_at() waits
    for P to say its grants are durable, and is cancelled
    (pg_cancel_backend): 57014. s1 comes back; the same session and
    holder B import the same times. The grants of the cancelled call were
    handed out (P's counters moved) and are never used: no ID repeats."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **SET_ASIDE)
    b = holder(make_cluster, p, **SET_ASIDE)
    _live(a)
    _live(b)
    times = TIMES[:300]
    made = {}
    conn = a.connect()
    try:
        made["A first"] = _backfill(conn, TIMES[600:700])
        s.stop(mode="immediate")
        before = _total(p)
        pid = conn.info.backend_pid
        failure: list[psycopg.Error] = []

        def run():
            try:
                conn.execute("SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", (times,))
            except psycopg.Error as e:
                failure.append(e)
        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: _total(p) > before, timeout=30, what="P handing out the grants")
        time.sleep(1)
        assert a.scalar("SELECT pg_cancel_backend(%s)", pid)
        t.join(30)
        assert failure and failure[0].sqlstate == "57014", failure
        handed_out = _total(p)
        s.start()
        wait_until(lambda: p.scalar("SELECT count(*) FROM pg_stat_replication"
                                    " WHERE sync_state = 'sync'") == 1,
                   timeout=60, what="s1 synchronous again")
        made["A retry"] = _backfill(conn, times)
    finally:
        _quietly_close(conn)
    with b.connect() as c:
        made["B"] = _backfill(c, times)
    assert _total(p) > handed_out
    _no_duplicates(made)


def test_a_holder_that_loses_its_lease_mid_statement_repeats_no_id(make_cluster):
    """A statement of holder A streams backfill IDs to its client, then
    sleeps; meanwhile the registry stops and A's lease runs out (A refuses
    snowflake_nextval()). The statement resumes with times of stretches
    it holds no grant of: it fails (08006). The registry starts again;
    the same session and holder B import the same times: no ID equals
    one the client received."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    times = sorted(TIMES[:600])
    a.sql("CREATE TABLE legacy AS SELECT n AS k, t FROM unnest(%s::timestamptz[])"
          " WITH ORDINALITY u(t, n)", times)
    made: dict[str, list[int]] = {"sent": []}
    failure: list[psycopg.Error] = []
    back = threading.Event()
    pid: list[int] = []

    def stream():
        with a.connect() as conn:
            pid.append(conn.info.backend_pid)
            try:
                for (i,) in conn.cursor().stream(
                        "SELECT snowflake_at(t) FROM legacy,"
                        " LATERAL (SELECT CASE WHEN k = 300 THEN pg_sleep(15) END) z"):
                    made["sent"].append(i)
            except psycopg.Error as e:
                failure.append(e)
            back.wait(120)
            made["A same session"] = _backfill(conn, times)
    t = threading.Thread(target=stream)
    t.start()
    try:
        wait_until(lambda: pid and a.scalar("SELECT count(*) FROM pg_stat_activity"
                                            " WHERE pid = %s AND wait_event = 'PgSleep'",
                                            pid[0]) == 1,
                   timeout=60, what="the statement to sleep")
        r.stop(mode="fast")
        wait_until(lambda: _try(a, "SELECT snowflake_nextval()") is None, timeout=13,
                   what="A losing its lease")
        wait_until(lambda: failure, timeout=60, what="the statement to fail")
        r.start()
    finally:
        back.set()
        t.join(120)
    assert failure[0].sqlstate == "08006", str(failure[0])
    assert 299 <= len(made["sent"]) < 600, len(made["sent"])
    with b.connect() as conn:
        made["B"] = _backfill(conn, times)
    _no_duplicates(made)


@pytest.mark.slow  # CI budget
def test_ids_added_at_the_end_on_the_registry_while_holders_hold_grants(make_cluster):
    """R and holders A and B set aside 1008-1015; A's session sa holds
    grants. R is restarted with 1008-1023: sa goes on with the grants it
    holds; a grant it needs is refused (55000, naming both lists). A and
    B restart with 1008-1023 and import the same times: no ID repeats,
    and new grants of a full stretch come from the added ids."""
    r = registry_server(make_cluster, **HALF)
    lease_limits(r)
    a = holder(make_cluster, r, **HALF)
    b = holder(make_cluster, r, **HALF)
    _live(a)
    _live(b)
    times = TIMES[:200]
    made = {}
    sa = a.connect()
    try:
        made["sa"] = _backfill(sa, times)
        # HOT's stretch full under the first ids: refused before any grant.
        r.sql("SELECT snowflake_backfill_raise(%s, 512)", HOT)
        e = sql_error(sa, "SELECT snowflake_at(%s) FROM generate_series(1, 100)", (HOT,))
        assert e.sqlstate == "54000", str(e)
        r.configure(**{"snowflake_id.backfill_worker_ids": IDS})
        r.restart()
        made["sa held"] = _backfill(sa, times)
        e = sql_error(sa, "SELECT snowflake_at(%s)", (START + dt.timedelta(days=400),))
        assert e.sqlstate == "55000", str(e)
        assert "'1008-1015'" in e.diag.message_primary and "'1008-1023'" in e.diag.message_primary
    finally:
        _quietly_close(sa)
    for c in (a, b):
        c.configure(**{"snowflake_id.backfill_worker_ids": IDS})
        c.restart()
    _live(a)
    _live(b)
    with b.connect() as conn:
        made["B"] = _backfill(conn, times + [HOT] * 700)
    with a.connect() as conn:
        made["A"] = _backfill(conn, times + [HOT] * 700)
    workers = r.sql("SELECT DISTINCT d.worker_id FROM unnest(%s::bigint[]) u(id),"
                    " snowflake_decode(id) d", made["A"] + made["B"])
    assert any(w >= 1016 for (w,) in workers), workers
    _no_duplicates(made)


def test_requests_the_lease_role_makes_up_take_no_grant_twice(make_cluster):
    """The lease role calls snowflake_backfill_grant itself: malformed,
    oversized, other ids, quoting in every text, first grants asked again
    and again; it cannot call snowflake_backfill_grant_take or raise the
    counters. Each refusal has its SQLSTATE; holders then import and no
    grant number is handed out twice."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    grant_lease_role(r)
    schema = r.scalar("SELECT n.nspname FROM pg_proc p JOIN pg_namespace n"
                      " ON n.oid = p.pronamespace WHERE p.proname = 'snowflake_backfill_grant'")
    r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_backfill_grant(jsonb) TO snowflake_lease")
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    with a.connect() as conn:
        made = {"A": _backfill(conn, TIMES[:300])}
    layout = r.scalar("SELECT DISTINCT layout FROM snowflake_lease_blocks")
    bucket = r.scalar("SELECT bucket FROM snowflake_backfill() WHERE %s BETWEEN starts_at"
                      " AND ends_at", TIMES[0])
    base = {"node": "x'); DROP TABLE snowflake_lease_blocks; --", "name": "n\"'\\",
            "layout": layout, "ids": IDS, "buckets": [bucket], "first": [True]}
    conn = r.connect(user="snowflake_lease")
    call = f"SELECT {schema}.snowflake_backfill_grant(%s::jsonb)::text"
    try:
        cases = [({"buckets": [-1]}, "22023"), ({"buckets": [16384]}, "22023"),
                 ({"buckets": [1, 1], "first": [True, True]}, "22023"),
                 ({"buckets": list(range(257)), "first": [True] * 257}, "22023"),
                 ({"first": []}, "22023"), ({"ids": "1008-1022"}, "55000"),
                 ({"ids": "1008-1023'"}, "55000"), ({"layout": "x"}, "55000"),
                 ({"buckets": "1"}, "22023"), ({"buckets": [1e30]}, "22023"),
                 ({"first": [None]}, "22023"), ({"ids": None}, "22023"),
                 ({"name": "x" * 70000}, "54000")]
        for change, state in cases:
            e = sql_error(conn, call, (json.dumps({**base, **change}),))
            assert e.sqlstate == state, (change, e.sqlstate, str(e))
        for text in ("{}", "[]", '"x"', "null"):
            e = sql_error(conn, call, (text,))
            assert e.sqlstate == "22023", (text, e.sqlstate, str(e))
        e = sql_error(conn, f"SELECT {schema}.snowflake_backfill_grant_take('{{}}', '{{}}')")
        assert e.sqlstate == "42501", str(e)
        e = sql_error(conn, "SELECT snowflake_backfill_raise(now(), 100000)")
        assert e.sqlstate == "42501", str(e)
        conn.autocommit = False
        e = sql_error(conn, call, (json.dumps(base),))
        assert e.sqlstate == "25001", str(e)
        conn.rollback()
        conn.autocommit = True
        got = []
        for _ in range(20):
            reply = json.loads(conn.execute(call, (json.dumps(base),)).fetchone()[0])
            got.append(reply["grants"][0])
    finally:
        _quietly_close(conn)
    assert r.scalar("SELECT count(*) FROM snowflake_lease_blocks") > 0
    assert len(set(got)) == 20 and None not in got, got
    with a.connect() as c:
        made["A again"] = _backfill(c, TIMES[:300])
    # The grants A took after the made-up calls are not among the 20 given
    # to the lease role: A's new IDs of that stretch, decoded.
    span = r.sql("SELECT starts_at, ends_at FROM snowflake_backfill() WHERE bucket = %s",
                 bucket)[0]
    with_grant = a.sql("SELECT DISTINCT ((d.worker_id - 1008) * 64 + d.sequence / 64)"
                       " FROM unnest(%s::bigint[]) u(id), snowflake_decode(id) d"
                       " WHERE d.ts BETWEEN %s AND %s", made["A again"], *span)
    assert with_grant and not ({g for (g,) in with_grant} & set(got)), (with_grant, got)
    _no_duplicates(made)
