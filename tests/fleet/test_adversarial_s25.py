"""Adversarial (session 25): ff32169, attacked on real PostgreSQL 15
servers.

1. RowBack: shared memory keeps, per database OID, the highest grant count
   a committed lease call left in the registry's row (an xact commit
   callback registered by snowflake_lease_decide). A lease call inside a
   PL/pgSQL block with an EXCEPTION clause runs in a subtransaction: were
   it allowed, its rollback would leave the commit callback in place
   (measured: refused, 25001).
2. Node locks bound to the login role: a role cannot compute another's
   keys, but any role reads them in pg_locks while they are held, and a
   session may wait on any advisory lock. A server whose registry session
   ends (a broken connection, the holder restarted) takes the next of its
   four keys; with the data directory's key file missing or unreadable,
   the keys are SipHash under a zero key of public values.
3. Blocks pass to a session naming the previous one only under the same
   role, but a row from 0.7.0 records no role until its next renewal.
4. A copy of a holder's data directory started beside its original, under
   the original's role (the documented configuration), with the
   original's registry session ending at the same moment.
5. The DBA's legitimate actions with holders connected (the registry's
   row deleted, DROP and CREATE EXTENSION): no RowBack fence.

The registry's log is checked: no panic, no crash, no token key. Lease
times of 6 s (fleet_helpers.LEASE), the registry's limits set to match (a
fence lasts 7.2 s). Strict xfails are open bugs, their reasons the numbers
measured on PostgreSQL 15."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import Maker, old_release
from fleet_helpers import server_roles_0_7_0
from fleet_helpers import HELD_BY, log_problems
from fleet_helpers import (CONTESTED, duplicates, GRACE_S, grant_server_roles, holder, Intruder,
                           LEASE_S, LIMITS, lease_limits, lease_worker, now_ms, registry_server, Repeat,
                           resume)



def row_of(r, dbname: str = "postgres") -> tuple:
    """(incarnation, fenced now, cause, grants)."""
    rows = r.sql("SELECT incarnation, coalesce(fenced_until > now(), false), cause,"
                 " (to_jsonb(g)->>'grants')::bigint FROM snowflake_lease_registry g",
                 dbname=dbname)
    return rows[0] if rows else (None, False, None, 0)


ROW_BACK = "a lease call found"


# ------------------------------------ 1. a lease call in a rolled-back subtransaction
def subxact_rolled_back(x: Intruder, fn: str, req: dict) -> dict:
    """Lease call `fn` in a PL/pgSQL block with an EXCEPTION clause (a
    subtransaction): the reply shown by a NOTICE, the subtransaction
    rolled back by a RAISE it catches, the DO block (top transaction)
    committed."""
    got: list[str] = []

    def notice(d):
        if (d.message_primary or "").startswith("reply "):
            got.append(d.message_primary[len("reply "):])
    x.conn.add_notice_handler(notice)
    try:
        x.conn.execute(f"""DO $do$ DECLARE rep jsonb; BEGIN
            BEGIN
                rep := {x.schema}.snowflake_lease_{fn}($j${json.dumps(req)}$j$::jsonb);
                RAISE NOTICE 'reply %', rep;
                RAISE EXCEPTION 'undo';
            EXCEPTION WHEN raise_exception THEN NULL;
            END;
            END $do$""")
    finally:
        x.conn.remove_notice_handler(notice)
    assert got, "no reply came back"
    return json.loads(got[0])


def renew_req(x: Intruder, block: int, **more) -> dict:
    return {"node": x.node, "incarnation": "", "lsn": "0/0", "layout": x.layout,
            "block_size": 16, "max_worker_id": 1023,
            "blocks": [{"block": block, "high_ms": now_ms()}], "lease_ms": 6000,
            "grace_ms": 1200, "high_ms": now_ms() + 66_000, **more}


def test_a_lease_call_in_a_rolled_back_subtransaction_does_not_fence(make_cluster):
    """The documented configuration (a login role per server). The lease
    role of server X leases a block, then renews it inside a PL/pgSQL
    block with an EXCEPTION clause that raises after the reply and catches
    its own RAISE: were the call allowed there, the subtransaction would
    roll back (the row keeps its count) and the DO block commit, and
    pgrx's commit callbacks are not dropped when a subtransaction aborts:
    the count never written would count as left, and the next call start
    a RowBack fence at the lease role's will. Then one ordinary renewal.
    Wanted: the call refused in the subtransaction, and the registry's
    incarnation unchanged and unfenced. Measured on PostgreSQL 15.20:
    refused (25001, snowflake_lease_autocommit: IsTransactionBlock() is
    true in a subtransaction), no fence."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["x"])
    x = Intruder(r, node="x", user=roles["x"])
    x.conn.autocommit = True
    got = x.acquire()
    block = got["blocks"][0]["block"]
    before = row_of(r)
    mark = r.log_mark()
    with pytest.raises(psycopg.errors.ActiveSqlTransaction):
        subxact_rolled_back(x, "renew", renew_req(x, block))
    between = row_of(r)
    x.renew([block])
    after = row_of(r)
    x.close()
    problems = log_problems(r, mark)
    print(f"\n[subtransaction rolled back] before {before}; row then {between}; after one"
          f" renewal {after}; log {problems}")
    assert not problems, problems
    assert between[3] == before[3], (before, between)
    assert after[0] == before[0] and not after[1], (before, after)


# ------------------------------------------------ 2. a node's keys squatted
MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _sipround(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def siphash13_128_h1(key: bytes, msg: bytes) -> int:
    """SipHash-1-3, 128-bit output, its first half (the siphasher crate's
    Hash128::h1), as a signed 64-bit integer."""
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F83,
         k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    end = len(msg) - len(msg) % 8
    for i in range(0, end, 8):
        m = int.from_bytes(msg[i:i + 8], "little")
        v[3] ^= m
        _sipround(v)
        v[0] ^= m
    b = ((len(msg) & 0xFF) << 56) | int.from_bytes(msg[end:], "little")
    v[3] ^= b
    _sipround(v)
    v[0] ^= b
    v[2] ^= 0xEE
    for _ in range(3):
        _sipround(v)
    h1 = v[0] ^ v[1] ^ v[2] ^ v[3]
    return h1 - (1 << 64) if h1 >> 63 else h1


def keys_without_key_file(start_us: int, node: str, role: str) -> list[int]:
    """core/src/registry/hello.rs node_keys with the key file missing
    (registry_key::read() None, key_of("") None: a zero key): from the
    postmaster's start, the node and the role, all public."""
    return [siphash13_128_h1(bytes(16), start_us.to_bytes(8, "little", signed=True)
                             + node.encode() + b"\xff" + role.encode() + b"\xff"
                             + slot.to_bytes(8, "little"))
            for slot in range(4)]


START_US = ("SELECT (extract(epoch FROM pg_postmaster_start_time()"
            " - timestamptz '2000-01-01 00:00:00+00') * 1000000)::int8")
ALL_SQUATTED = "every lock key held by sessions of other roles"


@pytest.mark.slow
@pytest.mark.parametrize("key_file", ["present", "missing", "unreadable"])
def test_another_role_cannot_squat_every_key_of_a_node(make_cluster, key_file):
    """The documented configuration (a login role per server: X may not
    end A's sessions). Holder A (role a) may use block 0 only. X's role
    reads in pg_locks the key A's registry session holds, and waits on it
    (pg_advisory_lock, which any role may call); A's registry session
    ends, as a broken connection ends it (here the DBA's
    pg_terminate_backend), and A reconnects and takes its next key while
    X holds the last. `missing`/`unreadable`: snowflake_id.key is gone (a
    restore that left it out) or unreadable (0000); X computes A's keys
    (the postmaster's start, A's node id and role are public) and takes
    the free ones at once. Wanted: A makes IDs again within a lease plus
    grace plus 5 s of its last reconnection, keeping its node id (the
    commit: another role can neither work the keys out nor keep one past
    a restart), and the key never in the log. Measured on PostgreSQL
    15.20: `present`, X held all 4 of A's keys after 4 broken connections;
    `missing`, the keys computed here matched snowflake_lease_node_keys and
    one broken connection was enough; then A's hello was refused 55P03 at
    every reconnection (24-25 refusals in 25 s), no ID from A past its
    lease, no rename, nothing leaked in the log. The refusal lasts until
    the DBA ends X's session (or the registry restarts)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "x"])
    key_path = os.path.join(r.datadir, "snowflake_id.key")
    if key_file == "missing":
        os.rename(key_path, key_path + ".aside")
    elif key_file == "unreadable":
        os.chmod(key_path, 0)
    a = holder(make_cluster, r, **{**CONTESTED,
                                   "snowflake_id.registry": r.conninfo(user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    amark = a.log_mark()
    mark = r.log_mark()
    node = r.scalar("SELECT holder_node FROM snowflake_lease_blocks WHERE holder_node IS NOT NULL")
    taken: list[int] = []
    ended = []

    class Squatter:
        """X's session; ended (A's hello ends a session of another role on
        its keys), it connects again and takes every key it knows again,
        as a persistent attacker would."""

        def __init__(self):
            self.connect()

        def connect(self):
            self.conn = r.connect(user=roles["x"])
            for k in set(taken):
                self.conn.execute("SELECT pg_try_advisory_lock(%s)", (k,))

        def q(self, sql, args=()):
            try:
                return self.conn.execute(sql, args)
            except psycopg.OperationalError:
                ended.append(time.monotonic())
                self.connect()
                return self.conn.execute(sql, args)

    x = Squatter()
    computed_ok = None
    if key_file != "present":
        keys = keys_without_key_file(x.q(START_US).fetchone()[0], node, roles["a"])
        real = r.scalar("SELECT snowflake_id_internal.snowflake_lease_node_keys(%s, %s)",
                        node, roles["a"])
        computed_ok = keys == list(real)
        for k in keys:
            if x.q("SELECT pg_try_advisory_lock(%s)", (k,)).fetchone()[0]:
                taken.append(k)
    drops = 0
    refused = False
    while drops < 6 and not refused:
        held = x.q(HELD_BY, (roles["a"],)).fetchall()
        if not held:
            break
        pid, key = held[0]

        def wait_for(k=key):
            try:
                x.conn.execute("SELECT pg_advisory_lock(%s)", (k,))
            except psycopg.Error:
                pass
        waiting = threading.Thread(target=wait_for, daemon=True)
        waiting.start()
        time.sleep(0.3)
        # A's registry connection breaks.
        r.sql("SELECT pg_terminate_backend(%s)", pid)
        waiting.join(timeout=30)
        taken.append(key)
        drops += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ALL_SQUATTED in r.log(mark):
                refused = True
                break
            if any(k not in taken for _, k in x.q(HELD_BY, (roles["a"],)).fetchall()):
                break
            time.sleep(0.2)
    t0 = time.monotonic()
    made = len(maker_a.made)
    again = None
    while time.monotonic() - t0 < 25:
        if len(maker_a.made) > made + 1000 and maker_a.last_at and maker_a.last_at > t0 + (
                LEASE_S + GRACE_S):
            again = time.monotonic() - t0
            break
        time.sleep(0.2)
    x.conn.close()
    maker_a.stop()
    renames = [line for line in a.log(amark).splitlines() if "this server is now node" in line]
    refusals = r.log(mark).count(ALL_SQUATTED)
    problems = log_problems(r, mark)
    print(f"\n[keys squatted, key file {key_file}] computed keys right: {computed_ok};"
          f" {len(set(taken))} keys of A held by X after {drops} broken connections; 55P03"
          f" refusals logged {refusals}; X's session ended {len(ended)} times;"
          f" A making IDs past its lease at {again} s;"
          f" {len(renames)} renames; {problems}")
    assert not problems, problems
    assert not renames, renames[:1]
    assert again is not None, (
        f"A made no ID for 25 s: X holds {len(set(taken))} of its keys after {drops} broken"
        f" connections ({refusals} refusals 55P03)")


# ----------------------------------- 3. a 0.7.0 block row, no role recorded
@pytest.mark.slow
@pytest.mark.parametrize("steal", [False, True])
def test_another_role_naming_a_holders_session_after_the_update_takes_nothing(make_cluster,
                                                                               steal):
    """A registry on 0.7.0 with a login role per server; holder A (role
    a) may use block 0 only and holds it; its rows record no role (0.7.0).
    The DBA updates to 0.8.0 with A connected; before A's next renewal
    (minutes with the default lease of 10 min; here A's lease worker is
    stopped for 1 s), X's role introduces A's node id (A's session holds
    the pre-0.8.0 key: another role's, passed over) and renews block 0
    naming A's live session, pid:start from pg_stat_activity, as its
    previous one; then renews it every 2 s. `steal=False`: the control, no
    X. Wanted: block 0 stays A's session's and A goes on making IDs (its
    node id its own), as under 0.8.0 rows (owned_by: the same role).
    Measured on PostgreSQL 15.20: the control keeps block 0 (its row then
    records role snowflake_lease_a); with X, block 0's row names X's
    session and role and A made no ID for 12 s after its lease ran out
    (X renewing it holds it for good)."""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    with old_release("0.7.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.7.0'", dbname="fleet")
    r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
          " max_ahead_ms => 70000)", dbname="fleet")
    roles = server_roles_0_7_0(r, "fleet", ["a", "x"])
    a = holder(make_cluster, r, **{**CONTESTED, "snowflake_id.registry":
                                   r.conninfo(dbname="fleet", user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    time.sleep(2)
    node, role_before = r.sql("SELECT holder_node, to_jsonb(b)->>'holder_role'"
                              " FROM snowflake_lease_blocks b WHERE block = 0", dbname="fleet")[0]
    worker = lease_worker(a)
    os.kill(worker, signal.SIGSTOP)
    x = None
    try:
        r.sql("ALTER EXTENSION snowflake_id UPDATE", dbname="fleet")
        pid, start = r.sql("SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8"
                           " FROM pg_stat_activity WHERE usename = %s", roles["a"],
                           dbname="fleet")[0]
        if steal:
            x = Intruder(r, node=node, user=roles["x"], dbname="fleet")
            x.conn.autocommit = True
            x.renew([0], previous_session=f"{pid}:{start}")
        time.sleep(1)
    finally:
        resume([worker])
    rep = Repeat(lambda: x.renew([0]), every=2) if x else None
    time.sleep(LEASE_S + GRACE_S + 2)
    t0 = time.monotonic()
    made = len(maker_a.made)
    try:
        wait_until(lambda: len(maker_a.made) > made + 1000, timeout=12, what="A's IDs")
        again = time.monotonic() - t0
    except AssertionError:
        again = None
    holder_now = r.sql("SELECT holder_node, holder_session, to_jsonb(b)->>'holder_role'"
                       " FROM snowflake_lease_blocks b WHERE block = 0", dbname="fleet")[0]
    if rep:
        rep.stop()
    if x:
        x.close()
    maker_a.stop()
    print(f"\n[0.7.0 row, steal={steal}] block 0 of node {node} (role {role_before}), A's"
          f" session {pid}:{start}; after: {holder_now}; A's next 1000 IDs {again} s after"
          f" its lease ran out ({LEASE_S + GRACE_S + 2} s after the update)")
    assert holder_now[1] != "" and holder_now[2] == roles["a"], holder_now
    assert again is not None, "A made no ID after its lease ran out"


# --------------------------------- 4. a copy of a data directory beside its original
@pytest.mark.parametrize("original", ["connected", "reconnecting"])
def test_a_copy_under_the_originals_role_is_told_in_use(make_cluster, original):
    """The documented configuration: a login role per server. A
    pg_basebackup copy of holder A, its saved leases made to look like
    A's own (the data directory's name removed from snowflake_id.leases,
    as a volume snapshot keeps it), started beside A under A's role.
    `reconnecting`: A's registry session ends (a broken connection) as
    the copy starts, and A's lease worker reconnects only once the copy
    introduced itself (here: stopped until then). Wanted: exactly one of them is the
    node id (the other takes a new one, 'in use by another running
    server'), no ID made by both. Measured on PostgreSQL 15.20: connected,
    the copy renamed; reconnecting, A renamed; no ID made by both (1.5 to
    1.7 million IDs each)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a"])
    a = holder(make_cluster, r, **{"wal_level": "replica", "snowflake_id.registry":
                                   r.conninfo(user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    copy = make_cluster(basebackup_from=a, start=False, settings={
        "snowflake_id.registry": r.conninfo(user=roles["a"]), "snowflake_id.lease_time": "6s"})
    os.remove(os.path.join(copy.datadir, "standby.signal"))
    path = os.path.join(copy.datadir, "snowflake_id.leases")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("data_directory", None)
    with open(path, "w") as f:
        json.dump(saved, f)
    node = saved["node_id"]
    amark = a.log_mark()
    worker = lease_worker(a)
    if original == "reconnecting":
        os.kill(worker, signal.SIGSTOP)
    try:
        if original == "reconnecting":
            pid = r.scalar("SELECT pid FROM pg_stat_activity WHERE usename = %s", roles["a"])
            r.sql("SELECT pg_terminate_backend(%s)", pid)
        copy.start()
        maker_c = Maker(copy, statement_timeout="30s")
        if original == "reconnecting":
            wait_until(lambda: r.scalar("SELECT count(*) FROM pg_stat_activity"
                                        " WHERE usename = %s", roles["a"]) > 0,
                       timeout=30, what="the copy's registry session")
            time.sleep(1)
    finally:
        resume([worker])
    try:
        wait_until(lambda: maker_c.made, timeout=60, what="the copy's first IDs")
    except AssertionError:
        pass
    time.sleep(LEASE_S + GRACE_S + 3)
    made = {"A": maker_a.stop(), "copy": maker_c.stop()}
    in_use = "is in use by another running server"
    renamed = {"A": in_use in a.log(amark), "copy": in_use in copy.log()}
    problems = duplicates(made)
    print(f"\n[copy beside A, A {original}] node {node}; A made {len(made['A'])}, copy"
          f" {len(made['copy'])}; renamed {renamed}; {problems}")
    assert not problems, "; ".join(problems)
    assert sum(renamed.values()) == 1, renamed


# ------------------------------------------------ 5. the DBA's own actions
@pytest.mark.slow
@pytest.mark.parametrize("action", ["delete_row", "drop_create"])
def test_the_dbas_own_actions_start_no_row_back_fence(make_cluster, action):
    """Holders A and B (roles of their own) make IDs. The DBA deletes the
    registry's row (`delete_row`), or drops and creates the extension
    (`drop_create`, in one transaction with the limits and the grants,
    the holders' sessions connected and holding their block locks: the
    row is made by the first lease call), then the holders go on. A row made
    anew goes on from the count calls left. Wanted: whatever fence this
    starts is not RowBack (no 'a lease call found'), at most one new
    incarnation, and a new server C (made and started after the action,
    3 to 4 s here) gets its first IDs within a lease plus grace plus 10 s
    of the action. Measured on PostgreSQL 15.20: one fence each, 'a
    registry with no incarnation' (the row made by the first call), its
    count going on (6 -> 8, 7 -> 9); C's first IDs 11.9 s and 11.4 s after
    the action."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "b", "c"])
    servers = {}
    makers = {}
    for s in ("a", "b"):
        servers[s] = holder(make_cluster, r, **{"snowflake_id.registry":
                                               r.conninfo(user=roles[s])})
        makers[s] = Maker(servers[s], statement_timeout="30s")
    wait_until(lambda: all(m.made for m in makers.values()), timeout=60, what="first IDs")
    mark = r.log_mark()
    before = row_of(r)
    if action == "delete_row":
        r.sql("DELETE FROM snowflake_lease_registry")
    else:
        schema = "snowflake_id_internal"
        with r.connect() as conn, conn.transaction():
            conn.execute("DROP EXTENSION snowflake_id CASCADE")
            conn.execute("CREATE EXTENSION snowflake_id")
            conn.execute(LIMITS)
            conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
            for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)",
                      "durable(jsonb)"):
                conn.execute(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_lease_{f}"
                             " TO snowflake_lease")
    t0 = time.monotonic()
    seen: list[tuple] = []

    def watch():
        row = row_of(r)
        if not seen or seen[-1][0] != row[0]:
            seen.append(row)
    rep = Repeat(watch, every=0.3)
    c = holder(make_cluster, r, **{"snowflake_id.registry": r.conninfo(user=roles["c"])})
    maker_c = Maker(c, statement_timeout="30s")
    waited = None
    while time.monotonic() - t0 < 30:
        if maker_c.made:
            waited = time.monotonic() - t0
            break
        time.sleep(0.2)
    time.sleep(3)
    rep.stop()
    made = {"A": makers["a"].stop(), "B": makers["b"].stop(), "C": maker_c.stop()}
    causes = [row[2] for row in seen]
    problems = duplicates(made) + log_problems(r, mark)
    print(f"\n[{action}] row before {before[:2]} grants {before[3]}; incarnations since:"
          f" {[(row[0][:8] if row[0] else None, row[3], (row[2] or '')[:90]) for row in seen]};"
          f" C's first IDs after {waited} s; {problems}")
    assert not problems, "; ".join(problems)
    assert not any(ROW_BACK in (cause or "") for cause in causes), causes
    assert len({row[0] for row in seen if row[0]}) <= 1, causes
    assert waited is not None and waited < LEASE_S + GRACE_S + 10, waited
