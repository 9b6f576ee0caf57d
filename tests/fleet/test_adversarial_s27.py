"""Adversarial (session 27): 70cc42d, attacked on real PostgreSQL 15
servers.

1. snowflake_lease_hello looks at pg_locks, picks the node's first free
   key, ends the sessions of other roles it saw on the keys
   (pg_terminate_backend(pid, 2000): it sends SIGTERM, then polls every
   100 ms until the process is gone) and only then takes the key with
   pg_try_advisory_lock. A role that learnt two of a server's keys in
   pg_locks (one broken registry connection while it waited on the held
   one) holds one of them in a session that also holds a lock D of its
   own, and a second session waits on D, not on any node key (pg_locks
   shows nothing of it on the node's keys), then takes the other key:
   the one hello picks. Ending the first session hands D to the second,
   which takes the key before hello tries it: 55P03 "a session took the
   key just now", and the second session is now the first.
   Measured: A refused every 1.1 s for as long as X kept it up.
2. A block row from 0.6.0 records no holder session, and a row without
   one passes to any session naming its node (BlockRow::owned_by): after
   one ALTER EXTENSION UPDATE from 0.6.0 to 0.8.0, with the holder
   connected, another role took its block. 70cc42d closed this for 0.7.0
   rows that record no role only.
3. Any role fills the registry's shared lock table with advisory locks
   (kept after the statement fails): every lease call of every server
   fails "out of shared memory". Revoking pg_catalog's advisory-lock
   functions from PUBLIC in the registry's database stops it (and any
   squatting of node keys); the lease functions, SECURITY DEFINER, work
   on.
4. Held: with max_prepared_transactions = 200 a node has 204 keys; with
   every one held by prepared transactions and sessions of other roles,
   the hello ends the sessions and takes a key (0.4 s).
5. Held: server roles named with quotes, a trailing space, a backslash,
   not ASCII; X's role a member of the server's, its squatting session
   SET ROLE to it (pg_stat_activity shows the login role: ended); a
   superuser's session waiting on the key kept.
   Argued, not run: a role cannot make another server's session or a
   superuser's hold or wait for its own node's keys (no lease function
   takes a lock but the caller's own keys; s26's test covers both);
   SET SESSION AUTHORIZATION is a superuser's.
6. snowflake_lease_hello(node) takes no size limit (lease calls stop at
   64 kB) and hashes the name once per key under the registry's lock:
   with max_prepared_transactions = 200 (204 keys), X's hellos of a
   64 MB name held the lock for up to 15 s, A made no ID for 21 s.

Fixed since: 1. hello takes a key free when it looked before it ends any
squatter; 2. the update records the session holding a 0.6.0 row's block
lock, and a row with no session passes to no session naming its node; 6.
node ids past 256 bytes are refused (54000) before the registry's lock.
3. is outside the assumptions (limitations.md), with the fix the DBA
applies (the `revoked` case).

The registry's log is checked: no panic, no crash. Lease times of 6 s
(fleet_helpers.LEASE), the registry's limits set to match. Strict xfails
are open bugs or, where their reason says so, documented limits; their
reasons are the numbers measured on PostgreSQL 15."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import Maker, old_release
from fleet_helpers import ENDED, HELD_BY, log_problems
from fleet_helpers import (CONTESTED, GRACE_S, grant_server_roles, holder, Intruder, LEASE_S,
                           lease_limits, lease_worker, registry_server, Repeat, resume,
                           TimedMaker)



JUST_NOW = "a session took the key just now"
# X's own lock, no node's key: held by the session on one of A's keys,
# awaited by the one that takes the next.
D = 271828


def a_keys(spy, role: str) -> list[tuple[int, int]]:
    return spy.execute(HELD_BY, (role,)).fetchall()


class Chain:
    """X's role keeps a server out of its node's keys k0 and k1: one
    session holds D and one of them; another waits for D, then takes the
    other. When that one returns it holds the key, and a new waiter for
    the first key is started."""

    def __init__(self, r, user: str, keys: tuple[int, int]):
        self.r, self.user, self.keys = r, user, keys
        self.stop = threading.Event()
        self.grabs = 0
        self.errors: list[str] = []
        self.conns: list[psycopg.Connection] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _session(self) -> psycopg.Connection:
        c = self.r.connect(user=self.user)
        self.conns.append(c)
        return c

    def start(self, holding: int) -> None:
        """The first holder: D and keys[holding]."""
        h = self._session()
        h.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)", (D, self.keys[holding]))
        self.next_key = 1 - holding
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                w = self._session()
                w.execute("SET statement_timeout = 0")
                w.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)",
                          (D, self.keys[self.next_key]))
                self.grabs += 1
                self.next_key = 1 - self.next_key
            except psycopg.Error as e:
                if self.stop.is_set():
                    return
                self.errors.append(f"{type(e).__name__}: {e}"[:160])
                time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            try:
                c.cancel()
            except psycopg.Error:
                pass
            c.close()
        self.thread.join(timeout=10)


@pytest.mark.slow
def test_a_waiter_behind_an_ended_squatter_takes_the_key_hello_picks(make_cluster):
    """The documented configuration (a login role per server, CONNECTION
    LIMIT 3). Holder A (role a) may use block 0 only and makes IDs. X's
    role reads A's key k0 in pg_locks and waits for it; A's registry
    connection breaks (the DBA's pg_terminate_backend here), X gets k0,
    A's next hello ends X's session and takes k1, which X reads too. Then
    the chain (module docstring, 1.) is set up and A's connection breaks
    once more. Wanted: A makes IDs again within 30 s past its lease and
    grace (at most one broken connection's worth of refusals)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "x"])
    a = holder(make_cluster, r, **{**CONTESTED,
                                   "snowflake_id.registry": r.conninfo(user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    mark = r.log_mark()
    spy = r.connect(user=roles["x"])
    chain = None
    again = None
    try:
        (pid, k0), = a_keys(spy, roles["a"])
        # The first break: X waits on k0 and gets it; A takes k1.
        squat = r.connect(user=roles["x"])
        t = threading.Thread(target=lambda: squat.execute("SELECT pg_advisory_lock(%s)", (k0,)),
                             daemon=True)
        t.start()
        time.sleep(0.3)
        r.sql("SELECT pg_terminate_backend(%s, 5000)", pid)
        wait_until(lambda: [k for _, k in a_keys(spy, roles["a"]) if k != k0], timeout=30,
                   what="A's next key")
        (pid, k1), = a_keys(spy, roles["a"])
        t.join(timeout=5)
        squat.close()
        spy.close()
        # The chain: X holds k0 (A holds k1), a waiter for k1 behind it.
        chain = Chain(r, roles["x"], (k0, k1))
        chain.start(holding=0)
        time.sleep(0.5)
        r.sql("SELECT pg_terminate_backend(%s, 5000)", pid)
        t0 = time.monotonic()
        time.sleep(LEASE_S + GRACE_S)
        made = len(maker_a.made)
        while time.monotonic() - t0 < LEASE_S + GRACE_S + 30:
            if len(maker_a.made) > made + 1000:
                again = time.monotonic() - t0
                break
            time.sleep(0.2)
    finally:
        if chain:
            chain.close()
        maker_a.stop()
    log = r.log(mark)
    print(f"\n[chained waiter] X's grabs {chain.grabs if chain else None};"
          f" 55P03 'just now' {log.count(JUST_NOW)}; sessions ended by hello"
          f" {log.count(ENDED)}; A making IDs again {again} s after the second break;"
          f" X's errors {chain.errors[:3] if chain else None}")
    assert not log_problems(r, mark)
    assert again is not None, (
        f"A made no ID for {LEASE_S + GRACE_S + 30:.0f} s: {log.count(JUST_NOW)} hellos refused"
        f" 55P03 'a session took the key just now' ({chain.grabs} keys taken by X's waiters)")


# ------------------------------- 2. a 0.6.0 row, which records no session
@pytest.mark.slow
def test_a_row_from_0_6_0_passes_to_no_other_role(make_cluster):
    """A registry on 0.6.0 (rows record no holder session) with a login
    role per server; holder A (role a) may use block 0 only and holds it,
    connected. The DBA updates to 0.8.0 in one ALTER EXTENSION UPDATE (the
    0.7.0 step adds holder_session, empty; the 0.8.0 step records the role
    of the session each row names: none). Before A's next renewal (its
    lease worker stopped for a moment), X's role introduces A's node id
    and renews block 0, then every 2 s. Wanted: X never holds block 0 (a
    row without a session passes to any session naming its node,
    BlockRow::owned_by; 70cc42d closed this for 0.7.0 rows without a
    role), and A keeps making IDs."""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    with old_release("0.6.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.6.0'", dbname="fleet")
    schema = "snowflake_id_internal"
    r.sql("CREATE ROLE snowflake_lease NOLOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease", dbname="fleet")
    for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)"):
        r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_lease_{f} TO snowflake_lease",
              dbname="fleet")
    roles = {s: f"snowflake_lease_{s}" for s in ("a", "x")}
    for role in roles.values():
        r.sql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 3 IN ROLE snowflake_lease")
    a = holder(make_cluster, r, **{**CONTESTED, "snowflake_id.registry":
                                   r.conninfo(dbname="fleet", user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    time.sleep(2)
    node = r.sql("SELECT holder_node FROM snowflake_lease_blocks WHERE block = 0",
                 dbname="fleet")[0][0]
    worker = lease_worker(a)
    os.kill(worker, signal.SIGSTOP)
    x = None
    reply = None
    try:
        r.sql("ALTER EXTENSION snowflake_id UPDATE", dbname="fleet")
        after = r.sql("SELECT holder_session, holder_role FROM snowflake_lease_blocks"
                      " WHERE block = 0", dbname="fleet")[0]
        x = Intruder(r, node=node, user=roles["x"], dbname="fleet")
        x.conn.autocommit = True
        reply = x.renew([0])
    finally:
        resume([worker])
    rep = Repeat(lambda: x.renew([0]), every=2)
    roles_seen: set = set()
    t0 = time.monotonic()
    made = len(maker_a.made)
    try:
        while time.monotonic() - t0 < LEASE_S + GRACE_S + 20:
            roles_seen.add(r.scalar("SELECT holder_role FROM snowflake_lease_blocks"
                                    " WHERE block = 0", dbname="fleet"))
            time.sleep(0.5)
    finally:
        rep.stop()
        x.close()
    late = len(maker_a.made) - made
    last = maker_a.last_at - t0 if maker_a.last_at else None
    maker_a.stop()
    print(f"\n[0.6.0 row] after the update {after}; X's first renewal"
          f" {str(reply)[:200]}; block 0's roles {roles_seen}; A's IDs since {late},"
          f" last batch {last} s after the update")
    assert not log_problems(r)
    assert roles["x"] not in roles_seen, roles_seen
    assert not reply or not reply.get("blocks"), reply


# -------------------------------------- 3. the registry's lock table filled
# The advisory-lock functions revoked from PUBLIC in the registry's
# database (pg_proc is per database): the lease functions, SECURITY
# DEFINER, still take them.
def revoke_advisory() -> str:
    """The DO block of docs/operations/fleet.md's lease-role setup that
    revokes the advisory-lock functions: the SQL the DBA runs is the SQL
    tested."""
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations"
           / "fleet.md").read_text()
    m = re.search(r"^DO \$\$\n.*?advisory.*?^END \$\$;", doc, re.M | re.S)
    assert m, "fleet.md's lease-role setup revokes no advisory-lock function"
    return m.group(0)


@pytest.mark.parametrize("revoked", [
    # The documented setup runs in CI (fleet.md's REVOKE is the SQL run).
    pytest.param(False, marks=[pytest.mark.slow, pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
        "outside the assumptions (docs/design/limitations.md: a role that may take advisory"
        " locks in the registry's database can fill PostgreSQL's lock table; revoke them)."
        " Measured on PostgreSQL 15: X's one statement ended 53200 with the lock table full;"
        " every lease call of A failed 'out of shared memory' (830 in 15 s), new sessions"
        " were refused (FATAL), A made no ID past its lease"))]),
    True])
def test_a_role_filling_the_lock_table_stalls_no_other_server(make_cluster, revoked):
    """The documented configuration (a login role per server). Holder A
    (role a) makes IDs. X's role takes session advisory locks on
    distinct keys in one statement until the registry's shared lock table
    is full ("out of shared memory"; locks a session took in a failed
    statement stay held). Wanted (fleet.md: a leaked password takes one
    server's share, the others lease as before): A keeps making IDs past
    its lease and grace. `revoked`: the DBA revoked the advisory-lock
    functions from PUBLIC in the registry's database first (X's statement
    refused; no lease function needs the lease role to hold them)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "x"])
    if revoked:
        r.sql(revoke_advisory())
    a = holder(make_cluster, r, **{**CONTESTED,
                                   "snowflake_id.registry": r.conninfo(user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    mark = r.log_mark()
    x = r.connect(user=roles["x"])
    err = None
    try:
        x.execute("SELECT pg_advisory_lock(g) FROM generate_series(1, 10000000) g")
    except psycopg.Error as e:
        err = e.sqlstate
    # (New sessions are refused too: "FATAL: out of shared memory".)
    time.sleep(LEASE_S + GRACE_S + 2)
    made = len(maker_a.made)
    time.sleep(5)
    late = len(maker_a.made) - made
    x.close()
    maker_a.stop()
    log = r.log(mark)
    print(f"\n[lock table, revoked={revoked}] X's statement {err};"
          f" A's IDs in the 5 s past its lease {late}; registry errors 'out of shared memory'"
          f" {log.count('ERROR:  out of shared memory')}")
    assert not log_problems(r, mark)
    assert late > 0, (f"A made no ID for 5 s past its lease; X's statement {err},"
                      f" {log.count('ERROR:  out of shared memory')} errors 'out of shared memory'")


# ------------------ 4. 200 prepared transactions and sessions on a node's keys
@pytest.mark.slow
def test_200_prepared_transactions_and_sessions_leave_a_key(make_cluster):
    """A registry with max_prepared_transactions = 200, a login role per
    server. Every key of node n for role a (204: the superuser reads them
    with snowflake_lease_node_keys, more than a role learns) is held: 200
    by X's prepared transactions, 4 by live sessions of roles x and y
    (CONNECTION LIMIT 3 each), and one more session of y waits on a held
    key. Wanted: a's hello ends the 5 sessions and takes a key, in well
    under a second of work besides the ends (each pg_terminate_backend
    waits up to 2 s, under the registry's lock), and a second hello of a
    (a copy of its server) is told the node is in use. Then, the
    sessions gone, a hello with every key but one held by prepared
    transactions takes that one."""
    r = registry_server(make_cluster, max_prepared_transactions=200)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "x", "y"])
    keys = r.scalar("SELECT snowflake_id_internal.snowflake_lease_node_keys('n', %s)",
                    roles["a"])
    assert len(keys) == 204
    conns = []
    try:
        for i, k in enumerate(keys[:200]):
            c = r.connect(user=roles["x"])
            c.execute("BEGIN")
            c.execute("SELECT pg_advisory_xact_lock(%s)", (k,))
            c.execute(f"PREPARE TRANSACTION 'k{i}'")
            c.close()
        for user, k in ((roles["x"], keys[200]), (roles["x"], keys[201]),
                        (roles["y"], keys[202]), (roles["y"], keys[203])):
            c = r.connect(user=user)
            c.execute("SELECT pg_advisory_lock(%s)", (k,))
            conns.append(c)
        waiter = r.connect(user=roles["y"])
        conns.append(waiter)
        def wait_on() -> None:
            try:
                waiter.execute("SELECT pg_advisory_lock(%s)", (keys[202],))
            except psycopg.Error:
                pass
        threading.Thread(target=wait_on, daemon=True).start()
        time.sleep(0.5)
        mark = r.log_mark()
        a = r.connect(user=roles["a"])
        t0 = time.monotonic()
        got = a.execute("SELECT snowflake_id_internal.snowflake_lease_hello('n')").fetchone()[0]
        took = time.monotonic() - t0
        ended = r.log(mark).count(ENDED)
        copy = r.connect(user=roles["a"])
        in_use = copy.execute("SELECT snowflake_id_internal.snowflake_lease_hello('n')").fetchone()[0]
        copy.close()
        a.close()
        wait_until(lambda: not r.sql("SELECT 1 FROM pg_stat_activity WHERE usename = ANY(%s)",
                                     [roles["x"], roles["y"], roles["a"]]), timeout=10,
                   what="the sessions gone")
        # The prepared transactions still hold the first 200 keys: the
        # next free one.
        b = r.connect(user=roles["a"])
        t1 = time.monotonic()
        again = b.execute("SELECT snowflake_id_internal.snowflake_lease_hello('n')").fetchone()[0]
        took_again = time.monotonic() - t1
        slot = b.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                         " AND pid = pg_backend_pid() AND ((classid::bigint << 32)"
                         " | objid::bigint) = %s", (keys[200],)).fetchone()[0]
        b.close()
    finally:
        for c in conns:
            c.close()
        for (gid,) in r.sql("SELECT gid FROM pg_prepared_xacts"):
            r.sql(f"ROLLBACK PREPARED '{gid}'")
    print(f"\n[200 prepared] first hello {got} in {took:.2f} s, {ended} sessions ended;"
          f" a copy's hello {in_use}; with the sessions gone {again} in {took_again:.3f} s,"
          f" on the first free key {bool(slot)}")
    assert not log_problems(r)
    assert got is True and ended == 5, (got, ended)
    assert took < 5 * 2 + 1
    assert in_use is False
    assert again is True and slot == 1 and took_again < 1


# ----------------------------------------- 5. role names, SET ROLE, members
@pytest.mark.parametrize("name", ['srv "a"; x',  # the others only with SNOWFLAKE_SLOW (CI budget)
                                  pytest.param("sérveur ä ", marks=pytest.mark.slow),
                                  pytest.param("a\\", marks=pytest.mark.slow)])
def test_squatters_of_odd_role_names_ended_and_superusers_kept(make_cluster, name):
    """Server role `name` (quotes, a trailing space, a backslash, not
    ASCII) and X's role, a member of it (X may SET ROLE to it). A's
    session introduces node n and holds its first key; X's session, SET
    ROLE to A's role, waits on it, and a superuser's session waits on it
    too; A's session ends and X gets the key. A's next session: wanted,
    it ends X's session (its login role is X's, whatever its current
    role), keeps the superuser's, takes the next key, and a session of
    A's role hellos n as a copy (false)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["x"])
    a_role = name
    r.sql(f'CREATE ROLE "{a_role.replace(chr(34), chr(34) * 2)}" LOGIN IN ROLE snowflake_lease')
    r.sql(f'GRANT "{a_role.replace(chr(34), chr(34) * 2)}" TO {roles["x"]}')
    hello = "SELECT snowflake_id_internal.snowflake_lease_hello('n')"
    a1 = r.connect(user=a_role)
    assert a1.execute(hello).fetchone()[0] is True
    (_, k0), = a1.execute(HELD_BY, (a_role,)).fetchall()
    x = r.connect(user=roles["x"])
    x.execute(f'SET ROLE "{a_role.replace(chr(34), chr(34) * 2)}"')
    su = r.connect()
    pids = {"x": x.execute("SELECT pg_backend_pid()").fetchone()[0],
            "su": su.execute("SELECT pg_backend_pid()").fetchone()[0]}

    def wait_on(c) -> None:
        try:
            c.execute("SELECT pg_advisory_lock(%s)", (k0,))
        except psycopg.Error:
            pass
    threads = [threading.Thread(target=wait_on, args=(c,), daemon=True) for c in (x, su)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    mark = r.log_mark()
    a1.close()
    time.sleep(0.5)
    a2 = r.connect(user=a_role)
    got = a2.execute(hello).fetchone()[0]
    alive = {p for (p,) in r.sql("SELECT pid FROM pg_stat_activity")}
    held = [k for _, k in a2.execute(HELD_BY, (a_role,)).fetchall()]
    copy = r.connect(user=a_role)
    in_use = copy.execute(hello).fetchone()[0]
    copy.close()
    a2.close()
    for c in (x, su):
        c.close()
    log = r.log(mark)
    print(f"\n[role {name!r}] hello {got}; X's session alive {pids['x'] in alive};"
          f" superuser's alive {pids['su'] in alive}; A's key the first {held == [k0]};"
          f" a copy's hello {in_use}; ended lines {log.count(ENDED)}")
    assert not log_problems(r, mark)
    assert got is True and in_use is False
    assert pids["x"] not in alive and pids["su"] in alive
    assert held and held != [k0]


# ------------------------------------- 6. a huge node name under the registry's lock
@pytest.mark.slow
@pytest.mark.parametrize("prepared", [0, 200])
def test_a_huge_node_name_holds_the_registry_lock_briefly(make_cluster, prepared):
    """snowflake_lease_hello(node) takes the registry's lock, then hashes
    the node name once per key (4 + max_prepared_transactions) and
    passes it through jsonb to the rules: no size limit (lease calls are
    refused past 64 kB). X's role calls it with a 64 MB name from its 3
    sessions (CONNECTION LIMIT 3) in a loop while A makes IDs; the DBA's
    session times how long the registry's lock takes it. Wanted: A never
    goes a lease time (6 s) without making IDs."""
    r = registry_server(make_cluster, max_prepared_transactions=prepared)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "x"])
    a = holder(make_cluster, r, **{**CONTESTED,
                                   "snowflake_id.registry": r.conninfo(user=roles["a"])})
    maker_a = TimedMaker(a)
    wait_until(lambda: maker_a.batches, timeout=60, what="A's first IDs")
    mark = r.log_mark()
    big = "n" * (64 << 20)
    stop = threading.Event()
    times: list[float] = []
    waits: list[float] = []
    errors: list[str] = []

    def flood() -> None:
        while not stop.is_set():
            try:
                with r.connect(user=roles["x"]) as c:
                    t = time.monotonic()
                    c.execute("SELECT snowflake_id_internal.snowflake_lease_hello(%s)", (big,))
                    times.append(time.monotonic() - t)
            except psycopg.Error as e:
                errors.append(f"{e.sqlstate}: {e}"[:120])
                time.sleep(0.1)

    def lock_waits() -> None:
        with r.connect() as c:
            while not stop.is_set():
                t = time.monotonic()
                with c.transaction():
                    c.execute("LOCK TABLE snowflake_lease_registry IN SHARE UPDATE EXCLUSIVE MODE")
                waits.append(time.monotonic() - t)
                time.sleep(0.2)
    threads = [threading.Thread(target=flood, daemon=True) for _ in range(3)]
    threads.append(threading.Thread(target=lock_waits, daemon=True))
    t0 = time.time()
    for t in threads:
        t.start()
    time.sleep(30)
    t1 = time.time()
    stop.set()
    for t in threads:
        t.join(timeout=120)
    maker_a.stop()
    ends = [t0] + [end for _, end, _ in maker_a.batches if t0 <= end <= t1] + [t1]
    gap = max(b - a for a, b in zip(ends, ends[1:]))
    print(f"\n[huge node, {prepared} prepared] X's hellos {len(times)} in 30 s, each"
          f" {min(times, default=0):.1f}-{max(times, default=0):.1f} s; errors {errors[:2]};"
          f" the DBA's waits for the registry's lock up to {max(waits, default=0):.1f} s;"
          f" A's longest time without IDs {gap:.1f} s, refusals {len(maker_a.refusals)}")
    assert not log_problems(r, mark)
    assert gap < LEASE_S, (f"A made no ID for {gap:.1f} s: X's hellos took up to"
                           f" {max(times, default=0):.1f} s, the registry's lock waited for"
                           f" up to {max(waits, default=0):.1f} s")
