"""Adversarial (session 21): the registry rules of 0.8.0's commit 599db93,
attacked on real servers: the database a registry row names
(Cause::DatabaseCopied, core/src/registry/begin.rs), the failover
candidates' row kept in the data directory (snowflake_id.candidates,
durable::made_anew, src/durability/registry_candidates.rs) and the lease
table's trigger in Rust (registry::forgotten).

1. The kept file is one per data directory, the candidates' row one per
   database: a second registry database in the same cluster (a second
   fleet, a staging fleet) writes its own row to the same file.
2. A row that names no database (a 0.7.0 row, updated to 0.8.0) learns
   its database unfenced: a copy of the database taken before the update
   and put back later is not seen.
3. A kept file that cannot be read: what the registry answers, and when.
4. The original database put back after a copy served in its place: its
   row names its own database.
5. The lease table's trigger: a DELETE rolled back, a DELETE of no row.

Real holders make IDs meanwhile. Lease times of 6 s
(fleet_helpers.LEASE), the registry's limits set to match (a fence lasts
7.2 s). Strict xfails are open bugs, their reasons the numbers measured
on PostgreSQL 15."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import psycopg
import pytest

from harness import wait_until
from helpers import apart_problems, Maker, old_release
from fleet_helpers import (a_holds_b_waits, acquired_once, CONTESTED, contested_fleet, duplicates, grant_lease_role,
                           holder, hosts, lease_limits, lease_schema, lease_worker,
                           named_standby, now_ms, registry_server, registry_state,
                           require_sync, resume, sessions_gone, swap_registry)


def durable_check(r, dbname: str, user: str = "snowflake_lease") -> dict:
    """One durability check (snowflake_lease_durable, no wait) by the lease
    role of the registry in `dbname`, as its lease worker makes after a
    grant."""
    schema = lease_schema(r, dbname)
    with r.connect(dbname=dbname, user=user) as conn:
        assert conn.execute(f"SELECT {schema}.snowflake_lease_hello(%s)",
                            ("checker",)).fetchone()[0] is True
        got = conn.execute(f"SELECT {schema}.snowflake_lease_durable(%s::jsonb)::text",
                           ('{"wait_ms": 0}',)).fetchone()[0]
    return json.loads(got)


def kept_file(r, dbname: str = "postgres") -> str:
    """The kept candidates' file of the registry database `dbname` (one
    per database: snowflake_id.candidates.<database OID>)."""
    db = r.scalar(f"SELECT oid FROM pg_database WHERE datname = '{dbname}'")
    return os.path.join(r.datadir, f"snowflake_id.candidates.{db}")


def read_kept(r) -> dict | None:
    try:
        with open(kept_file(r)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def candidates(r, dbname: str = "postgres") -> list[str]:
    rows = r.sql("SELECT members FROM snowflake_lease_standbys WHERE valid_until > now()",
                 dbname=dbname)
    return rows[0][0] if rows else []


def registry_row(r, dbname: str = "postgres") -> dict:
    with r.connect(dbname=dbname) as conn:
        cur = conn.execute("SELECT incarnation, cause, database_oid,"
                           " fenced_until IS NOT NULL AND fenced_until > now() AS fenced"
                           " FROM snowflake_lease_registry")
        names = [d.name for d in cur.description]
        row = cur.fetchone()
        return dict(zip(names, row)) if row else {}


AGAIN = ("DROP EXTENSION snowflake_id CASCADE; CREATE EXTENSION snowflake_id;"
         " SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
         " max_ahead_ms => 70000)")


# ------------------------- 1. the kept file, written by another database's row
@pytest.mark.slow
def test_a_second_registry_database_overwrites_the_kept_candidates(make_cluster):
    """test_adversarial_s19's cut-off candidate, with the setting left as
    it is (its control, which 0.8.0's kept row and the setting both hold
    back), and a second registry database in the same cluster: `other`,
    the registry of a second fleet, whose lease worker was away for a
    minute. The registry P (database postgres) with two synchronous
    standbys s1 and s2 (ANY 1 (s1, s2)), both candidates; holder B holds
    block 0. s1 is cut off: it keeps P's last candidates' row naming it.
    The second fleet's lease role makes one durability check in `other`:
    its own row, past its valid_until, drops s1 (behind) and names s2
    only, and keeps that row in the data directory's one file. The DBA
    then drops and creates the extension again in postgres: the row made
    anew names the kept members, s2 only; B re-asserts block 0, durable on
    s2 alone. P dies, s1 is promoted and proves its promotion by the row
    it holds; holder C, which wants block 0 too, leases from s1. Wanted:
    the second fleet's check leaves postgres's kept row alone (a file per
    database), and B and C apart. (With one file for the cluster: the row
    made anew named s2 only, and 80,409 IDs were made by both B and C.)"""
    p = make_cluster(tcp=True, settings={"fsync": True})
    p.create_extension()
    lease_limits(p)
    p.create_db("other")
    p.create_extension("other")
    grant_lease_role(p, dbname="other")
    other_made = time.time()
    s1 = named_standby(make_cluster, p, "s1", "s1")
    named_standby(make_cluster, p, "s2", "s2")
    require_sync(p, "ANY 1 (s1, s2)", "s1", "s2")
    b = holder(make_cluster, p, **CONTESTED)
    maker_b = Maker(b, statement_timeout="40s")
    wait_until(lambda: maker_b.made, timeout=60, what="B's first IDs")
    wait_until(lambda: candidates(p) == ["s1", "s2"], timeout=60, what="s1 and s2 candidates")
    c = holder(make_cluster, p, **{**CONTESTED, "snowflake_id.registry": hosts(s1)})
    # The second fleet's row: past its valid_until and the drop margin.
    while time.time() < other_made + 50:
        time.sleep(0.5)
    s1.sql("ALTER SYSTEM SET primary_conninfo = ''")
    s1.reload()
    wait_until(lambda: p.scalar("SELECT count(*) FROM pg_stat_replication"
                                " WHERE application_name = 's1'") == 0,
               timeout=30, what="s1 cut off")
    cut = time.monotonic()
    kept_before = read_kept(p)
    check = durable_check(p, "other")
    kept_after = read_kept(p)
    before_row = registry_row(p)
    with p.connect() as conn:
        conn.execute(AGAIN)
    made_anew = candidates(p)
    wait_until(lambda: registry_row(p).get("incarnation") not in (None, before_row["incarnation"])
               and p.sql("SELECT block FROM snowflake_leases WHERE leased"),
               timeout=30, what="B's block re-asserted to P's new incarnation")
    mark = s1.scalar("SELECT max(high_water_ms) FROM snowflake_lease_blocks")
    wait_until(lambda: time.time() * 1000 > mark + 1000, timeout=30, what="B past s1's mark")
    p.stop(mode="immediate")
    s1.promote()
    promoted = time.monotonic() - cut
    maker_c = Maker(c, statement_timeout="40s")
    wait_until(lambda: registry_row(s1).get("incarnation") != before_row["incarnation"],
               timeout=60, what="s1's new incarnation")
    row = registry_row(s1)
    if not row["fenced"]:
        try:
            wait_until(lambda: maker_c.made, timeout=30, what="C's first IDs")
        except AssertionError:
            pass
        time.sleep(3)
    made_b, made_c = maker_b.stop(), maker_c.stop()
    problems = apart_problems("B", made_b, "C", made_c) + duplicates({"B": made_b, "C": made_c})
    print(f"\n[kept file from another database] kept before {kept_before and kept_before['members']},"
          f" after other's check {kept_after and kept_after['members']} (check durable"
          f" {check.get('durable')}, behind {check.get('behind')}); row made anew {made_anew};"
          f" promoted {promoted:.1f} s after the cut; s1's incarnation: fenced {row['fenced']},"
          f" {row['cause']}; B made {len(made_b)}, C {len(made_c)}; {problems}")
    assert kept_after == kept_before, "another database's check rewrote this one's kept row"
    assert not problems, "; ".join(problems)


# --------------- 2. a row that names no database: a copy taken before it learned
@pytest.mark.slow
def test_a_copy_taken_on_0_7_0_updated_and_put_back(make_cluster):
    """test_adversarial_s19's database copy put back, with a copy taken
    while the registry's row names no database: the registry `fleet` of R
    is on 0.7.0 (holders of this build lease from it); with
    both lease workers stopped, the DBA takes a copy before the update
    (CREATE DATABASE snap TEMPLATE fleet), then updates `fleet` to 0.8.0
    under the holders' sessions; A renews block 0, its marks moving on
    (fleet's row names no database: its first call starts a fenced
    incarnation, whose row names it). Some new incarnation begins in
    fleet later (here a DELETE of one row). Over 100 s after the
    postmaster started (every window closed), the DBA updates
    the copy too and puts it back (DROP DATABASE fleet WITH (FORCE);
    ALTER DATABASE snap RENAME TO fleet) while A's lease worker is
    stopped; B's continues. The copy's row names no database; the
    holders name a later incarnation (with no new incarnation, their own
    check of the grant count refuses the copy's answers: measured, no
    ID made by both, but B refused for good) and a grant count below the
    postmaster's signed count. Wanted: a fenced incarnation, and A and B
    apart. (When a row from 0.7.0 learned its database unfenced: the
    copy's row learned OID 16516, 45,949 IDs made by both A and B, 59,203
    in a second run.)"""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    with old_release("0.7.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.7.0'", dbname="fleet")
    r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
          " max_ahead_ms => 70000)", dbname="fleet")
    s = {**CONTESTED, "snowflake_id.registry": r.conninfo(dbname="fleet")}
    a, maker_a, b, maker_b = a_holds_b_waits(make_cluster, r, s)
    time.sleep(5)

    def state(db="fleet"):
        rows = r.sql("SELECT incarnation, coalesce(fenced_until > now(), false), cause,"
                     " to_jsonb(g)->'grants', to_jsonb(g)->'database_oid'"
                     " FROM snowflake_lease_registry g", dbname=db)
        return rows[0] if rows else (None, False, None, 0, None)

    workers = [lease_worker(a), lease_worker(b)]
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        sessions_gone(r, "fleet")
        r.sql("CREATE DATABASE snap TEMPLATE fleet")
    finally:
        resume(workers)
    r.sql("ALTER EXTENSION snowflake_id UPDATE", dbname="fleet")
    snap = state("snap")
    made = len(maker_a.made)
    wait_until(lambda: len(maker_a.made) > made, timeout=60, what="A's IDs after the update")
    time.sleep(5)
    updated = state()
    # Any new incarnation in fleet since (a failover would change the
    # timeline; an emptied lease table does not): here a DELETE of a row.
    r.sql("DELETE FROM snowflake_lease_blocks"
          " WHERE block = (SELECT max(block) FROM snowflake_lease_blocks)", dbname="fleet")
    made = len(maker_a.made)
    wait_until(lambda: not state()[1] and len(maker_a.made) > made, timeout=60,
               what="A's IDs after the fence")
    start_ms = int(r.scalar("SELECT extract(epoch FROM pg_postmaster_start_time()) * 1000"))
    while now_ms() < start_ms + 100_000:
        time.sleep(0.5)
    new = state()
    r.sql("ALTER EXTENSION snowflake_id UPDATE", dbname="snap")
    def swap():
        r.sql("DROP DATABASE fleet WITH (FORCE)")
        r.sql("ALTER DATABASE snap RENAME TO fleet")
    after, made_all, problems = swap_registry(a, maker_a, b, maker_b, swap, state)
    print(f"\n[0.7.0 copy updated and put back] copy {snap}; fleet updated {updated}, then {new};"
          f" put back ->"
          f" {after}; A made {len(made_all['A'])}, B {len(made_all['B'])}; {problems}")
    assert not problems, "; ".join(problems)
    assert updated[0] != snap[0] and "names no database" in updated[2], updated
    assert after[1] or "names no database" in (after[2] or ""), after


# ---------------------------------------------- 3. a kept file that cannot be read
def made_within(maker: Maker, seconds: float) -> int:
    n = len(maker.made)
    time.sleep(seconds)
    return len(maker.made) - n


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "unreadable"])
def test_a_kept_candidates_file_that_cannot_be_read(make_cluster, damage):
    """The registry R (no standby) with holder A making IDs; R's lease
    calls have kept a candidates' row in snowflake_id.candidates.<OID>.
    The file is damaged (`damage`: not JSON, mode 000; an empty file and
    a directory in its place measured the same), and so is the one of a
    new database `other`. Measured: what A makes in the next 20 s (over
    three lease times), what R logs, and what CREATE EXTENSION in `other`
    answers (SQLSTATE, hint). Wanted: no
    crash of R (the postmaster keeps its pid), CREATE EXTENSION refused
    with the documented SQLSTATE (XX001 for a file that is no row, 58030
    for one that cannot be read), and A making IDs again once the file
    is put back, and A making IDs all along: the durability check reads
    the file only when the candidates' row it stands in for is missing.
    (Before that rule A stopped about one lease time after the damage:
    the whole fleet stopped by one file.)"""
    r = registry_server(make_cluster)
    lease_limits(r)
    a = holder(make_cluster, r)
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    path = kept_file(r)
    wait_until(lambda: os.path.exists(path), timeout=30, what="the kept file")
    with open(path) as f:
        good = f.read()
    pm_pid = int(open(os.path.join(r.datadir, "postmaster.pid")).readline())
    mark = r.log_mark()
    os.rename(path, path + ".good")
    if damage == "garbage":
        with open(path, "w") as f:
            f.write("not a row {")
    else:
        with open(path, "w") as f:
            f.write(good)
        os.chmod(path, 0)
    shutil.chown(path, "postgres")
    try:
        during = made_within(maker_a, 20)
        problem = a.scalar("SELECT lease_problem FROM snowflake_config()")
        # CREATE EXTENSION reads its own database's kept file: damaged the same way.
        r.create_db("other")
        other = kept_file(r, "other")
        with open(other, "w") as f:
            f.write("not a row {" if damage == "garbage" else good)
        if damage != "garbage":
            os.chmod(other, 0)
        shutil.chown(other, "postgres")
        want = "XX001" if damage == "garbage" else "58030"
        with pytest.raises(psycopg.Error) as err:
            r.create_extension("other")
        got = (err.value.sqlstate, str(err.value).splitlines()[0],
               err.value.diag.message_hint)
        log = r.log(since=mark)
    finally:
        os.unlink(path)
        os.rename(path + ".good", path)
    after = made_within(maker_a, 15)
    made = maker_a.stop()
    same_pm = int(open(os.path.join(r.datadir, "postmaster.pid")).readline()) == pm_pid
    print(f"\n[kept file {damage}] A made {during} IDs in 20 s with it; A's lease problem"
          f" {problem!r}; CREATE EXTENSION: {got}; candidates-file lines in R's log:"
          f" {log.count('candidates file')}; after it was put back A made {after} in 15 s;"
          f" postmaster kept {same_pm}; {len(made)} IDs, dups"
          f" {len(made) - len(set(made))}")
    assert same_pm
    assert during > 0, "a damaged kept file stopped a holder while the row exists"
    assert got[0] == want, got
    assert got[2], got
    assert after > 0


# ------------------ 4. the original put back after a copy served in its place
@pytest.mark.slow
def test_the_original_registry_database_put_back_after_its_copy_served(make_cluster):
    """The mirror of the database copy put back: the copy serves, then the
    original comes back. The registry is the database `fleet` of R;
    holder A holds block 0, B wants it too. With both lease workers
    stopped and their sessions ended, the DBA copies the database and
    swaps the copy in (ALTER DATABASE fleet RENAME TO orig; ALTER DATABASE
    snap RENAME TO fleet): its row names fleet's OID, so its first call
    starts a fenced incarnation (Cause::DatabaseCopied), and A renews
    block 0 there for 15 s, its mark moving on. Over 90 s after the
    postmaster started (every window closed), the DBA swaps the original
    back (the copy renamed away, orig renamed to fleet) while A's lease
    worker is stopped; B's continues. The original's row names its own
    OID (no database rule), forgot every grant the copy made, and the
    postmaster did not restart. Wanted: a fenced incarnation (or B kept
    from block 0 until A's grant ran out), and A and B apart. Both
    holders log the incarnation going back to the original's. With the
    postmaster's signed count shared by every database the registry
    started none (Cause::GrantsBack only above that count, which the
    copy's grants had raised): 94,958 IDs made by both A and B, 36,599 in
    a second run. The count is per database now."""
    r, a, maker_a, b, maker_b = contested_fleet(make_cluster)
    time.sleep(5)

    def state():
        rows = r.sql("SELECT incarnation, coalesce(fenced_until > now(), false), cause, grants,"
                     " database_oid FROM snowflake_lease_registry", dbname="fleet")
        return rows[0] if rows else (None, False, None, 0, None)

    orig = state()
    workers = [lease_worker(a), lease_worker(b)]
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        sessions_gone(r, "fleet")
        r.sql("CREATE DATABASE snap TEMPLATE fleet")
        r.sql("ALTER DATABASE fleet RENAME TO orig")
        r.sql("ALTER DATABASE snap RENAME TO fleet")
    finally:
        resume(workers)
    wait_until(lambda: state()[0] != orig[0], timeout=60, what="the copy's new incarnation")
    copy = state()
    made = len(maker_a.made)
    wait_until(lambda: len(maker_a.made) > made, timeout=60, what="A's IDs from the copy")
    time.sleep(15)
    start_ms = int(r.scalar("SELECT extract(epoch FROM pg_postmaster_start_time()) * 1000"))
    while now_ms() < start_ms + 100_000:
        time.sleep(0.5)
    served = state()
    def swap():
        sessions_gone(r, "fleet")
        r.sql("ALTER DATABASE fleet RENAME TO copy")
        r.sql("ALTER DATABASE orig RENAME TO fleet")
    after, made_all, problems = swap_registry(a, maker_a, b, maker_b, swap, state)
    problems += apart_problems("A", made_all["A"], "B", made_all["B"])
    print(f"\n[original put back after its copy served] original {orig}; copy's incarnation"
          f" {copy}, after serving {served}; original back -> {after}; A made"
          f" {len(made_all['A'])}, B {len(made_all['B'])}; {problems}")
    assert not problems, "; ".join(problems)


# --------------------------------------- 5. the lease table's trigger, in Rust
def test_a_rolled_back_delete_of_the_lease_table_changes_nothing(make_cluster):
    """DELETE of every row of the lease table in a transaction that rolls
    back: the trigger's new incarnation and raised marks roll back with
    it. Wanted: the same incarnation, unfenced, and the same marks."""
    r = registry_server(make_cluster)
    lease_limits(r)
    before = acquired_once(r)
    marks = r.sql("SELECT block, high_water_ms FROM snowflake_lease_blocks ORDER BY block")
    with r.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("DELETE FROM snowflake_lease_blocks")
        inside = conn.execute("SELECT incarnation, fenced_until > now()"
                              " FROM snowflake_lease_registry").fetchone()
        conn.execute("ROLLBACK")
    after = registry_state(r)
    assert inside[0] != before[0] and inside[1], inside
    assert after == before, (before, after)
    assert r.sql("SELECT block, high_water_ms FROM snowflake_lease_blocks ORDER BY block") == marks


def test_a_delete_that_deletes_no_row_forgets_no_grant(make_cluster):
    """The trigger is per statement (AFTER DELETE ... FOR EACH STATEMENT)
    and SECURITY DEFINER: a DELETE that matches no row, by a role that
    may only delete from the lease table (a maintenance role), started a
    fenced incarnation (measured on PostgreSQL 15: fenced for 7.2 s,
    max_lease_ms + max_grace_ms, 12 min by default, every mark raised to
    71 s ahead), though nothing was forgotten. Wanted: the same
    incarnation, unfenced; the trigger sees the rows the statement
    deleted (a transition table) and returns when there are none."""
    r = registry_server(make_cluster)
    lease_limits(r)
    before = acquired_once(r)
    r.sql("CREATE ROLE maintenance LOGIN")
    r.sql("GRANT SELECT, DELETE ON snowflake_lease_blocks TO maintenance")
    with r.connect(user="maintenance") as conn:
        conn.execute("DELETE FROM snowflake_lease_blocks WHERE false")
    after = registry_state(r)
    print(f"\n[zero-row DELETE] {before} -> {after}")
    assert after == before, (before, after)
    # The control: one row deleted is a grant forgotten, fenced.
    with r.connect(user="maintenance") as conn:
        conn.execute("DELETE FROM snowflake_lease_blocks"
                     " WHERE block = (SELECT min(block) FROM snowflake_lease_blocks)")
    forgot = r.sql("SELECT incarnation, fenced_until > now() FROM snowflake_lease_registry")[0]
    assert forgot[0] != before[0] and forgot[1], (before, forgot)
