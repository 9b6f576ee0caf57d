"""Grants durable where a failover can reach them (issue 30, 0.7.0), on real
servers: a registry primary whose synchronous_standby_names names physical
standbys, and holders that reach it through a connection string naming the
primary and its standby (target_session_attrs=read-write), so that they
follow a promotion. A holder uses a lease or a renewal only once the
registry's snowflake_id_internal.snowflake_lease_durable says enough
synchronous standbys flushed it (src/sql/leases.sql, core/src/holder.rs).

How a grant ends up committed on the primary only: the registry's COMMIT
waits for its synchronous standby, and a query cancel ends that wait with a
WARNING; the call then returns its reply as if the grant were replicated
(it is committed and visible on the primary). The tests cancel the lease
sessions' waits (SyncRepCanceller), as an operator's pg_cancel_backend()
would. statement_timeout does not end such a wait: PostgreSQL turns it off
before it commits (finish_xact_command in postgres.c); a wait nothing
cancels outlasts the lease worker's own 10 s call timeout, which gives the
call up without using a reply.

How a standby misses what its primary committed: the primary's WAL sender
for it is stopped (StalledStandby, SIGSTOP), and the primary stops
(-m immediate) before the sender goes on. Stopping the standby's WAL
receiver instead loses nothing: what the sender had sent waits in the
socket, and the receiver, once continued, writes it, also after its
primary stopped (a cancelled commit reached the promoted standby that way).

Lease times are short (6 s, renewals every 600 ms); every wait is a
wait_until on a condition, with bounds far above the lease arithmetic."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading

import psycopg
import pytest

from harness import wait_until
from helpers import (Maker, apart_problems, can_make_id, config, hba_accept_tcp, hba_reject_tcp,
                     ids, unix_conninfo, worker_of)

LEASE = "6s"
# Both holders want block 0. max_drift 1 s (not the default 60 s): a
# holder's marks, and so the floor a new incarnation raises every block to,
# are its lease time plus max_drift ahead of its clock. With 60 s, the
# next holder's IDs would start a minute ahead, above any ID a lost grant
# of less than a minute allowed, and an overlap would not show.
CONTESTED = {"snowflake_id.worker_ids": "0-15", "snowflake_id.max_drift": "1s"}
NOT_DURABLE = "not on its synchronous standbys"   # problems.rs, not_durable_text


# ------------------------------------------------------------------ helpers
def registry_primary(make_cluster, preload: bool = True):
    """A registry (fsync on: the registry fences after a restart that may
    have lost grants), listening on 127.0.0.1 too; preload=False: the
    library is not loaded there (a registry needs it only to make IDs)."""
    r = make_cluster(tcp=True, settings={"fsync": True}, preload=preload)
    r.create_extension()
    # The fleet's limits (0.7.0) for these holders: leases of 6 s, and 30 s
    # for the one whose lease time is raised (grace 6 s), marks up to 70 s
    # ahead (6 s + the default max_drift of 60 s, with room). A fence
    # after a failover then lasts 36 s rather than the defaults' 12 min.
    r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 30000, max_grace_ms => 6000,"
          " max_ahead_ms => 70000)")
    return r


def standby(make_cluster, primary, name: str, refuse_tcp: bool = False):
    """A physical standby of `primary` streaming as application_name `name`
    (over the unix socket); `refuse_tcp`: it refuses clients on 127.0.0.1
    (helpers.hba_reject_tcp)."""
    s = make_cluster(basebackup_from=primary, tcp=True, start=False, settings={"fsync": True})
    # pg_basebackup -R wrote a primary_conninfo without an application
    # name; the last line of postgresql.auto.conf wins.
    with open(os.path.join(s.datadir, "postgresql.auto.conf"), "a") as f:
        f.write(f"primary_conninfo = 'host={primary.dir} port={primary.port} user=postgres"
                f" application_name={name}'\n")
    if refuse_tcp:
        hba_reject_tcp(s)
    s.start()
    return s


def require_synchronous(primary, names: str, *standbys: str) -> None:
    """synchronous_standby_names = `names` on `primary`, once `standbys`
    stream; waits until they are its synchronous (or quorum) standbys."""
    wait_until(lambda: primary.scalar(
        "SELECT count(*) FROM pg_stat_replication"
        " WHERE state = 'streaming' AND application_name = ANY (%s)", list(standbys))
        == len(standbys), timeout=60, what=f"{', '.join(standbys)} streaming")
    primary.configure(synchronous_standby_names=names)
    primary.reload()
    state = "quorum" if names.lower().startswith("any") else "sync"
    wait_until(lambda: primary.scalar(
        "SELECT count(*) FROM pg_stat_replication"
        " WHERE sync_state = %s AND application_name = ANY (%s)", state, list(standbys))
        == len(standbys), timeout=60, what=f"{', '.join(standbys)} as {state} standbys")


def holder(make_cluster, conninfo: str, **settings):
    c = make_cluster(settings={"snowflake_id.registry": conninfo,
                               "snowflake_id.lease_time": LEASE, **settings}, start=False)
    c.start()
    c.create_extension()
    return c


def following(p, s, tcp: bool) -> str:
    """A connection string naming the primary `p`, then its standby `s`,
    for a read-write session: a holder follows a promotion of `s`."""
    hosts = "127.0.0.1,127.0.0.1" if tcp else f"{p.dir},{s.dir}"
    return (f"host={hosts} port={p.port},{s.port} dbname=postgres user=postgres"
            " target_session_attrs=read-write")


def leased_to(r) -> list[str]:
    return [n for (n,) in r.sql("SELECT holder_node FROM snowflake_leases WHERE leased"
                                " ORDER BY block")]


class StalledStandby:
    """The primary's WAL sender to standby `name` stopped (SIGSTOP): the
    standby stays connected (pg_stat_replication keeps its row and its old
    flush position) and receives nothing more."""

    def __init__(self, primary, name: str):
        self.pid = primary.scalar("SELECT pid FROM pg_stat_replication"
                                  " WHERE application_name = %s", name)
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass   # ended with its primary


class SyncRepCanceller:
    """Cancels, on `server`, every lease session waiting for a synchronous
    standby (wait event SyncRep), until stop() or the server stops: the
    COMMIT returns with a WARNING, committed on `server` only."""

    QUERY = """
        WITH waiting AS MATERIALIZED (
            SELECT pid, host(client_addr) AS addr FROM pg_stat_activity
             WHERE application_name = 'snowflake_id lease' AND wait_event = 'SyncRep')
        SELECT pid, addr FROM waiting WHERE pg_cancel_backend(pid)"""

    def __init__(self, server):
        self.cancelled: list[tuple[int, str | None]] = []   # (pid, client address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server):
        try:
            with server.connect() as conn:
                while not self._stop.is_set():
                    self.cancelled += conn.execute(self.QUERY).fetchall()
                    self._stop.wait(0.02)
        except psycopg.OperationalError:
            pass   # the server stopped

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def duplicate_problems(name: str, made: list[int]) -> list[str]:
    dup = len(made) - len(set(made))
    return [f"{dup} IDs made twice by {name}"] if dup else []


def refusals_since(maker: Maker, n: int, sqlstate: str = "55000") -> list[psycopg.Error]:
    return [e for e in maker.refusals[n:] if e.sqlstate == sqlstate]


def problem_of(c) -> str:
    # (.get: a server from before 0.7.0 has no lease_problem column.)
    return config(c).get("lease_problem") or ""


# ------------------------------------------------------------------ tests
def test_a_renewal_committed_on_the_primary_only_is_not_used_and_a_failover_repeats_nothing(
        make_cluster):
    """Issue 30's first run. H1 holds block 0 of the registry P, whose
    synchronous standby is S; H2 waits for the same block. S stops
    receiving, H1's lease time is raised from 6 s to 30 s, and H1's
    renewals commit on P only (their waits for S are cancelled). P dies, S
    is promoted: it knows H1's lease as 6 s, so its new incarnation is
    fenced for 6 s plus grace, then it leases block 0 to H2. H1 cannot
    reach S (S refuses its address) until H2 makes IDs. 0.6.0 used the
    renewals: H1 went on under a 30 s lease S never knew, with the worker
    ids H2 got. 0.7.0: H1 says the renewal is not on the synchronous
    standby, keeps the deadline of its last durable renewal and stops
    before H2 begins; no ID is made by both."""
    p = registry_primary(make_cluster)
    s = standby(make_cluster, p, "s1", refuse_tcp=True)
    require_synchronous(p, "FIRST 1 (s1)", "s1")
    h1 = holder(make_cluster, following(p, s, tcp=True), **CONTESTED)
    maker1 = Maker(h1, statement_timeout="40s")
    wait_until(lambda: maker1.made, timeout=60, what="H1's first IDs")
    h2 = holder(make_cluster, following(p, s, tcp=False), **CONTESTED)
    maker2 = Maker(h2, statement_timeout="40s")
    node1 = config(h1)["node_id"]
    assert leased_to(p) == [node1]
    seen: set[str] = set()

    def stall_took_effect() -> bool:
        cfg = config(h1)
        seen.add(cfg.get("lease_problem") or "")
        deadline = cfg["lease_deadline"]
        # 0.7.0: H1 said so and stopped at its last durable deadline.
        stopped = cfg["blocks_held"] == 0 and any(NOT_DURABLE in t for t in seen)
        # 0.6.0: H1 uses a 30 s renewal that only P has.
        extended = deadline is not None and \
            deadline - dt.datetime.now(dt.timezone.utc) > dt.timedelta(seconds=15)
        return stopped or extended

    stall = StalledStandby(p, "s1")
    canceller = SyncRepCanceller(p)
    try:
        h1.sql("ALTER SYSTEM SET snowflake_id.lease_time = '30s'")
        h1.sql("SELECT pg_reload_conf()")
        wait_until(stall_took_effect, timeout=90,
                   what="H1 stopping at its deadline, or using a renewal S did not get")
        p.stop(mode="immediate")
    finally:
        canceller.stop()
        stall.resume()
    h1_cancelled = sum(1 for _, addr in canceller.cancelled if addr == "127.0.0.1")
    assert h1_cancelled >= 1, canceller.cancelled
    refused1 = len(maker1.refusals)
    s.promote()
    wait_until(lambda: maker2.made and refusals_since(maker1, refused1), timeout=150,
               what="H2 making IDs from S and H1 refusing")
    # H1 reaches S too.
    hba_accept_tcp(s)
    s.reload()
    wait_until(lambda: config(h1)["registry_unreachable_since"] is None, timeout=60,
               what="H1 reaching the promoted standby")
    made1, made2 = maker1.stop(), maker2.stop()
    problems = (apart_problems("H1", made1, "H2", made2) + duplicate_problems("H1", made1)
                + duplicate_problems("H2", made2))
    if not any(NOT_DURABLE in t for t in seen):
        problems.append(f"H1 never said its renewal was not durable (lease_problem: {seen})")
    print(f"\n[stalled standby] H1 made {len(made1)} IDs, H2 {len(made2)}; "
          f"{h1_cancelled} of H1's commits cancelled on P; H1's lease problems: {seen}; "
          f"H1's 55000 after the failover: {refusals_since(maker1, refused1)[0].diag.message_detail}")
    assert not problems, "; ".join(problems)
    assert made2 and {worker_of(i) // 16 for i in made2} == {0}
    assert f"{NOT_DURABLE} (0 of 1 flushed" in h1.log()


def test_split_brain_the_old_primary_grants_nothing_its_holder_uses(make_cluster):
    """S is promoted while the old primary P goes on, with
    synchronous_standby_names still naming S, which no longer streams from
    it. A reaches P only, B the new primary S only; both want block 0,
    which A held from P. Every grant P makes now commits there only (its
    waits for S are cancelled). 0.6.0: A used them and went on with block
    0 while S leased it to B. 0.7.0: none counts, A's leases run out and a
    session of A gets 55000; B makes IDs from block 0 after S's fence; no
    ID is made by both."""
    p = registry_primary(make_cluster)
    s = standby(make_cluster, p, "s1")
    require_synchronous(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, unix_conninfo(p), **CONTESTED)
    maker_a = Maker(a, statement_timeout="40s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    b = holder(make_cluster, unix_conninfo(s) + " target_session_attrs=read-write", **CONTESTED)
    maker_b = Maker(b, statement_timeout="40s")
    refused_a = len(maker_a.refusals)
    s.promote()
    canceller = SyncRepCanceller(p)
    try:
        def settled() -> bool:
            # 0.7.0: A refuses. 0.6.0: A goes on after B began.
            overlapping = (maker_b.first_at is not None and maker_a.last_at is not None
                           and maker_a.last_at - maker_b.first_at > 5.0)
            return bool(maker_b.made) and (bool(refusals_since(maker_a, refused_a)) or overlapping)
        wait_until(settled, timeout=150, what="B making IDs from S and A refusing (55000)")
        cfg_a = config(a)
    finally:
        canceller.stop()
    made_a, made_b = maker_a.stop(), maker_b.stop()
    refusals = refusals_since(maker_a, refused_a)
    problems = (apart_problems("A (old primary)", made_a, "B (new primary)", made_b)
                + duplicate_problems("A", made_a) + duplicate_problems("B", made_b))
    if not refusals:
        problems.append("A never refused with 55000 after the promotion")
    print(f"\n[split brain] A made {len(made_a)} IDs, B {len(made_b)}; "
          f"{len(canceller.cancelled)} commits cancelled on P; A's lease problem: "
          f"{cfg_a.get('lease_problem')}; A's 55000: "
          f"{refusals[0].diag.message_detail if refusals else None}")
    assert not problems, "; ".join(problems)
    assert canceller.cancelled, "no lease call of A waited for S on P"
    assert cfg_a["blocks_held"] == 0, cfg_a
    assert made_b and {worker_of(i) // 16 for i in made_b} == {0}


def test_any_1_of_2_synchronous_standbys_with_one_stalled_grants_still_count(make_cluster):
    """synchronous_standby_names = 'ANY 1 (s1, s2)' and s1 stalled (still
    connected, its flush position behind): a lease made now is on s2,
    which is enough; the holder uses it and reports no problem."""
    p = registry_primary(make_cluster)
    standby(make_cluster, p, "s1")
    standby(make_cluster, p, "s2")
    require_synchronous(p, "ANY 1 (s1, s2)", "s1", "s2")
    stall = StalledStandby(p, "s1")
    try:
        stalled_at = p.scalar("SELECT flush_lsn::text FROM pg_stat_replication"
                              " WHERE application_name = 's1'")
        h = holder(make_cluster, unix_conninfo(p))
        with h.connect() as conn:
            wait_until(lambda: can_make_id(conn), timeout=60, what="IDs from a lease on s2")
            made = ids(conn, 1000)
        cfg = config(h)
        # s1 is still a quorum standby, and has not flushed the lease.
        s1 = p.sql("SELECT sync_state, flush_lsn::text, flush_lsn < pg_current_wal_flush_lsn()"
                   " FROM pg_stat_replication WHERE application_name = 's1'")
    finally:
        stall.resume()
    assert s1 == [("quorum", stalled_at, True)], (s1, stalled_at)
    assert len(set(made)) == 1000
    # The holder asked P whether its grants are on the standbys P names.
    assert "used once its synchronous standbys have them" in h.log()
    assert cfg["lease_problem"] is None, cfg["lease_problem"]
    assert cfg["blocks_held"] >= 1, cfg


def test_lease_replication_synchronous_uses_nothing_from_a_registry_without_synchronous_standby(
        make_cluster):
    """snowflake_id.lease_replication = synchronous on a holder whose
    registry names no synchronous standby: its grants are never used, a
    session gets 55000 and the problem names both settings. Back to auto
    (the default), the same registry's grants are used."""
    r = registry_primary(make_cluster)
    h = holder(make_cluster, unix_conninfo(r), **{"snowflake_id.lease_replication": "synchronous"})
    maker = Maker(h, statement_timeout="40s")   # a session waits up to 30 s for a lease
    # The problem ends with what to do: all of it is shown (0.7.0's first
    # build cut it at 255 bytes, before the setting's name).
    remedy = "or set snowflake_id.lease_replication = auto here"
    wait_until(lambda: "snowflake_id.lease_replication" in problem_of(h), timeout=60,
               what="the lease problem naming snowflake_id.lease_replication")
    problem = problem_of(h)
    assert "synchronous_standby_names is empty there" in problem, problem
    assert problem.endswith(remedy), problem
    wait_until(lambda: maker.refusals, timeout=90, what="a session refused")
    e = maker.refusals[0]
    assert e.sqlstate == "55000", f"{e.sqlstate} {e}"
    assert (e.diag.message_detail or "").endswith(remedy), e.diag.message_detail
    assert not maker.made
    assert config(h)["blocks_held"] == 0
    h.sql("ALTER SYSTEM SET snowflake_id.lease_replication = 'auto'")
    h.reload()
    wait_until(lambda: maker.made, timeout=60, what="IDs once lease_replication is auto")
    made = maker.stop()
    assert len(set(made)) == len(made)
    assert config(h)["lease_problem"] is None


# ------------------------------------------------ promotion without a fence
def named_standby(make_cluster, primary, name: str, registry_name: str | None):
    """standby() whose snowflake_id.registry_standby_name is `registry_name`
    (None: not set)."""
    s = make_cluster(basebackup_from=primary, tcp=True, start=False, settings={"fsync": True})
    with open(os.path.join(s.datadir, "postgresql.auto.conf"), "a") as f:
        f.write(f"primary_conninfo = 'host={primary.dir} port={primary.port} user=postgres"
                f" application_name={name}'\n")
        if registry_name is not None:
            f.write(f"snowflake_id.registry_standby_name = '{registry_name}'\n")
    s.start()
    return s


def candidates(r) -> list[str]:
    """The registry's failover candidates, while its row is valid (a
    session may be writing it: the row seen until it commits)."""
    rows = r.sql("SELECT members FROM snowflake_lease_standbys WHERE valid_until > now()")
    return rows[0][0] if rows else []


def registry_row(r) -> dict:
    with r.connect() as conn:
        cur = conn.execute("SELECT incarnation, previous_incarnation, cause,"
                           " fenced_until IS NOT NULL AND fenced_until > now() AS fenced"
                           " FROM snowflake_lease_registry")
        names = [d.name for d in cur.description]
        return dict(zip(names, cur.fetchone()))


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_switchover_to_the_synchronous_standby_is_not_fenced_when_it_can_show_it_has_every_grant(
        make_cluster, named):
    """A planned switchover: the registry P (the default limits: a fence
    lasts 12 min) with its synchronous standby s1; holder A holds a block.
    P stops cleanly, s1 is promoted, and a new holder B asks s1 for a
    block. named: s1's snowflake_id.registry_standby_name is 's1', a
    failover candidate of P's in the last row it received: its new
    incarnation continues P's without a fence, B makes IDs within seconds
    and A keeps its block. unnamed: the same switchover is fenced (0.7.0's
    first build fenced every promotion: 36 s with 30 s leases, 12 min with
    the defaults). No ID is made by both."""
    p = make_cluster(tcp=True, settings={"fsync": True})
    p.create_extension()
    s = named_standby(make_cluster, p, "s1", "s1" if named else None)
    require_synchronous(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, following(p, s, tcp=False))
    maker_a = Maker(a, statement_timeout="40s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    wait_until(lambda: candidates(p) == ["s1"], timeout=60, what="s1 a failover candidate of P")
    before = registry_row(p)
    p.stop(mode="fast")
    s.promote()
    b = holder(make_cluster, following(p, s, tcp=False))
    maker_b = Maker(b, statement_timeout="40s")
    if named:
        wait_until(lambda: maker_b.made, timeout=60, what="B's IDs from the promoted s1")
        row = registry_row(s)
        assert not row["fenced"], row
        assert row["previous_incarnation"] == before["incarnation"], (row, before)
        assert "standby s1 promoted" in row["cause"] and "every durable grant" in row["cause"], row
        # A went on with its block, renewed on s1.
        made_a_before = len(maker_a.made)
        wait_until(lambda: len(maker_a.made) > made_a_before + 100, timeout=60,
                   what="A making IDs after the switchover")
    else:
        wait_until(lambda: registry_row(s)["incarnation"] != before["incarnation"], timeout=60,
                   what="s1's new incarnation")
        row = registry_row(s)
        assert row["fenced"] and row["previous_incarnation"] is None, row
        wait_until(lambda: "fenced until" in problem_of(b), timeout=60, what="B reporting the fence")
        assert not maker_b.made
    made_a, made_b = maker_a.stop(), maker_b.stop()
    problems = (apart_problems("A", made_a, "B", made_b) + duplicate_problems("A", made_a)
                + duplicate_problems("B", made_b))
    assert not problems, "; ".join(problems)
    print(f"\n[switchover, {'named' if named else 'unnamed'}] s1's incarnation: {row['cause']};"
          f" A made {len(made_a)} IDs, B {len(made_b)}")


def test_a_failover_candidate_that_falls_behind_holds_grants_back_then_is_dropped_and_fenced(
        make_cluster):
    """P with two quorum standbys, s1 and s2 (ANY 1), both failover
    candidates (named). s1's WAL sender stops: a grant on s2 satisfies
    ANY 1, but s1 is a candidate whose promotion would not fence, so the
    holder does not use it and says which standby lacks it. About 45 s
    after the last candidates' row (its valid_until plus the clocks'
    margin) P drops s1 and grants count again. Then P dies and s1, whose
    last row names it but has expired, is promoted: fenced. P does not load
    the library, so snowflake_id.registry_standby_name is a placeholder a
    session can SET: P takes its own name from its configuration files
    only (issue 30's review: a lease session that set 's1' had s1 dropped
    at once, and a renewal that only s2 had used: 265,556 IDs made twice)."""
    p = registry_primary(make_cluster, preload=False)
    s1 = named_standby(make_cluster, p, "s1", "s1")
    named_standby(make_cluster, p, "s2", "s2")
    require_synchronous(p, "ANY 1 (s1, s2)", "s1", "s2")
    h = holder(make_cluster, following(p, s1, tcp=False))
    maker = Maker(h, statement_timeout="40s")
    wait_until(lambda: maker.made, timeout=60, what="the holder's first IDs")
    wait_until(lambda: candidates(p) == ["s1", "s2"], timeout=60, what="s1 and s2 candidates")
    stall = StalledStandby(p, "s1")
    try:
        seen: set[str] = set()

        def held_back() -> bool:
            seen.add(problem_of(h))
            return any("not yet on s1 (failover candidates" in t for t in seen)
        wait_until(held_back, timeout=60, what="the holder saying s1 lacks its grant")
        with p.connect() as conn:
            conn.execute("SET snowflake_id.registry_standby_name = 's1'")
            d = conn.execute("SELECT snowflake_id_internal.snowflake_lease_durable("
                             "'{\"wait_ms\": 0}')").fetchone()[0]
        assert d["durable"] is False and d["behind"] == ["s1"], d
        wait_until(lambda: "standby s1 dropped from the failover candidates" in p.log(),
                   timeout=120, what="P dropping s1")
        wait_until(lambda: candidates(p) == ["s2"] and not problem_of(h), timeout=60,
                   what="grants durable again, on s2")
        made = len(maker.made)
        wait_until(lambda: len(maker.made) > made + 100, timeout=60, what="IDs after s1 was dropped")
        before = registry_row(p)
        p.stop(mode="immediate")
    finally:
        stall.resume()
    s1.promote()
    # The holder's next lease call, on s1, begins the new timeline's incarnation.
    wait_until(lambda: registry_row(s1)["incarnation"] != before["incarnation"], timeout=60,
               what="s1's new incarnation")
    row = registry_row(s1)
    assert row["fenced"] and row["previous_incarnation"] is None, row
    made = maker.stop()
    assert len(set(made)) == len(made)


def test_concurrent_durability_checks_that_renew_the_candidates_row_do_not_deadlock(make_cluster):
    """snowflake_lease_durable reads the failover candidates' row and, when
    it must change (here every call: another session keeps making it
    stale), changes it under the row's lock. Two holders' checks at once
    must wait for each other, not deadlock: a first read FOR SHARE upgraded
    to FOR UPDATE did (40P01 "deadlock detected" in the registry's log and
    a failed call for a holder, in storms after a stalled registry
    resumed)."""
    p = registry_primary(make_cluster, preload=False)
    stop = threading.Event()
    errors: list[str] = []
    calls = [0, 0]

    def check(n: int) -> None:
        with p.connect() as conn:
            conn.autocommit = True
            while not stop.is_set():
                try:
                    conn.execute("SELECT snowflake_id_internal.snowflake_lease_durable("
                                 "'{\"wait_ms\": 0}')")
                    calls[n] += 1
                except psycopg.Error as e:
                    errors.append(f"{e.sqlstate}: {e}")

    def make_stale() -> None:
        with p.connect() as conn:
            conn.autocommit = True
            while not stop.is_set():
                conn.execute("UPDATE snowflake_lease_standbys SET valid_until = '-infinity'")

    threads = [threading.Thread(target=check, args=(n,)) for n in (0, 1)]
    threads.append(threading.Thread(target=make_stale))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: min(calls) >= 2000 or errors, timeout=120,
                   what="2,000 durability checks in each session")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, f"{len(errors)} failed checks, the first: {errors[0]}"
    assert "deadlock detected" not in p.log()
