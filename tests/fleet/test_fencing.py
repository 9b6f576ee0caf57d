"""Fleet fencing (docs/design/fleet-fencing.md): never a duplicate across
a fleet when the registry forgets grants it confirmed, when a base backup
is restored in place over a holder, when Citus lives in an application
database, or when a role that may call the lease functions names another
server's node. Real servers, started as tests/fleet/test_leases.py starts them.

Where two servers may hold the same block, the test lets both make IDs at
the same time and checks that no ID was made by both, and that no worker id was used by both over overlapping
milliseconds (the lease rules keep the holders of one block apart in
time). Lease times are short (6 s unless a test says otherwise); every
wait is a wait_until on a condition, with bounds far above the lease
arithmetic."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time

import psycopg
import pytest

from harness import run_pg, wait_until
from helpers import Maker, assert_apart, config, hba_accept_tcp, hba_reject_tcp, ids, unix_conninfo
from helpers import lease_schema, needs_citus, run_client
from helpers import worker_of as worker_bits
from fleet_helpers import GRACE_S, LEASE, LEASE_S, lease_limits, leases, registry_server


# ------------------------------------------------------------------ helpers
def holder_of(make_cluster, conninfo: str, start: bool = True, **settings):
    """A server leasing from the registry `conninfo`, lease time LEASE."""
    s = {"snowflake_id.registry": conninfo, "snowflake_id.lease_time": LEASE, **settings}
    c = make_cluster(settings=s, start=False)
    if start:
        c.start()
        c.create_extension()
    return c


def block_range(block: int) -> str:
    return f"{block * 16}-{block * 16 + 15}"


def new_protocol(r) -> bool:
    """Whether the registry runs the 0.4.0 lease protocol (jsonb requests,
    incarnations, fences) rather than 0.3.1's."""
    return lease_schema(r) is not None


class Stall:
    """The registry answers no lease call for a while: a transaction holds
    a lock on its lease table that every lease call waits for (a registry
    that is up but slow: a long DDL, a lock queue)."""

    def __init__(self, r):
        self.conn = r.connect(autocommit=False)
        self.conn.execute("LOCK TABLE snowflake_lease_blocks IN EXCLUSIVE MODE")

    def end(self):
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


STALL_S = 3.0   # well below the lease session's lock_timeout (5 s)


# -------------------------------------------------- 1. Citus in another database
CITUS = {"shared_preload_libraries": "citus,snowflake_id",
         "citus.node_conninfo": "sslmode=prefer",
         "max_connections": 200}
CITUS_SESSIONS = 3
CITUS_ROWS = 5_000
CITUS_BATCH = 500


def citus_in_app(make_cluster, settings: dict):
    """Coordinator and two workers with citus and snowflake_id created in
    database `app` (none in `postgres`), the cluster set up in `app`."""
    nodes = [make_cluster(tcp=True, settings={**CITUS, **settings}) for _ in range(3)]
    for n in nodes:
        n.create_db("app")
        n.sql("CREATE EXTENSION citus", dbname="app")
        n.create_extension(dbname="app")
        assert not n.sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    coordinator = nodes[0]
    coordinator.sql("SELECT citus_set_coordinator_host('127.0.0.1', %s)",
                    int(coordinator.port), dbname="app")
    for n in nodes[1:]:
        coordinator.sql("SELECT citus_add_node('127.0.0.1', %s)", int(n.port), dbname="app")
    return nodes


def citus_workload(nodes) -> tuple[int, list[tuple[int, psycopg.Error]]]:
    """CITUS_SESSIONS sessions per node insert CITUS_ROWS rows each through
    their node into one distributed table keyed by snowflake_nextval(), at
    the same time; returns the rows inserted and the errors."""
    coordinator = nodes[0]
    coordinator.sql("CREATE TABLE events (id bigint PRIMARY KEY DEFAULT snowflake_nextval(),"
                    " node int NOT NULL, session int NOT NULL, n int NOT NULL)", dbname="app")
    coordinator.sql("SELECT create_distributed_table('events', 'id')", dbname="app")
    errors: list[tuple[int, psycopg.Error]] = []
    inserted = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(nodes) * CITUS_SESSIONS)

    def session(node_no: int, s: int) -> None:
        with nodes[node_no].connect(dbname="app") as conn:
            start.wait()
            for b in range(CITUS_ROWS // CITUS_BATCH):
                try:
                    cur = conn.execute(
                        "INSERT INTO events (node, session, n)"
                        " SELECT %s::int, %s::int, g FROM generate_series(%s::int, %s::int) g",
                        (node_no, s, b * CITUS_BATCH, (b + 1) * CITUS_BATCH - 1))
                    with lock:
                        inserted[0] += cur.rowcount
                except psycopg.Error as e:
                    with lock:
                        errors.append((node_no, e))

    threads = [threading.Thread(target=session, args=(i, s))
               for i in range(len(nodes)) for s in range(CITUS_SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return inserted[0], errors


def names_registry_database(e: psycopg.Error) -> bool:
    d = e.diag
    return "snowflake_id.registry_database" in " ".join(
        x or "" for x in (d.message_primary, d.message_detail, d.message_hint))


def citus_config(n) -> dict:
    with n.connect(dbname="app") as conn:
        cur = conn.execute("SELECT * FROM snowflake_config()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def assert_citus_rows_apart(nodes, inserted: int) -> None:
    coordinator = nodes[0]
    assert coordinator.scalar("SELECT count(*) FROM events", dbname="app") == inserted
    assert coordinator.scalar("SELECT count(DISTINCT id) FROM events", dbname="app") == inserted
    seen: dict[int, int] = {}
    for node, workers in coordinator.sql(
            "SELECT node, array_agg(DISTINCT snowflake_worker_id(id)) FROM events GROUP BY node",
            dbname="app"):
        for w in workers:
            assert seen.setdefault(w, node) == node, \
                f"worker id {w} used by nodes {seen[w]} and {node}"


@needs_citus
@pytest.mark.slow  # CI budget: the database named by registry_database stays
def test_citus_in_an_application_database_without_configuration_never_runs_local(make_cluster):
    """Citus created in `app`, not in `postgres`, and no snowflake_id
    setting: three nodes inserting at once make no duplicate key. Either
    the nodes find the cluster in `app`, or every refusal is a 55000 that
    names `snowflake_id.registry_database`; no node runs in local mode with
    every worker id (0.3.1: local mode 0-1023 on all three, thousands of
    duplicate-key errors)."""
    nodes = citus_in_app(make_cluster, {})
    inserted, errors = citus_workload(nodes)
    dup = [(n, e) for n, e in errors if e.sqlstate == "23505"]
    assert not dup, f"{len(dup)} duplicate-key errors, e.g. node {dup[0][0]}: {dup[0][1]}"
    unclear = [(n, e) for n, e in errors
               if not (e.sqlstate == "55000" and names_registry_database(e))]
    assert not unclear, (f"node {unclear[0][0]}: {unclear[0][1].sqlstate} {unclear[0][1]}"
                         f" (detail: {unclear[0][1].diag.message_detail},"
                         f" hint: {unclear[0][1].diag.message_hint})")
    assert_citus_rows_apart(nodes, inserted)
    for i, n in enumerate(nodes):
        cfg = citus_config(n)
        assert not (cfg["mode"] == "local"
                    and cfg["worker_ids_total"] == cfg["max_worker_id"] + 1), \
            (f"node {i} runs in local mode with every worker id ({cfg['worker_ids']}) "
             "although Citus is preloaded")
        # Each node either makes IDs without duplicates or refuses clearly.
        with n.connect(dbname="app") as conn:
            try:
                conn.execute("SELECT snowflake_nextval()")
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                assert names_registry_database(e), str(e)


@needs_citus
def test_citus_in_an_application_database_named_by_registry_database(make_cluster):
    """With `snowflake_id.registry_database = 'app'` every node leases from
    the coordinator it finds in `app`: no duplicate key, each node's rows
    from worker ids no other node used."""
    nodes = citus_in_app(make_cluster, {"snowflake_id.registry_database": "app"})
    for n in nodes:
        wait_until(lambda n=n: citus_config(n)["mode"] == "citus", timeout=60,
                   what=f"citus mode on {n.port}")
    inserted, errors = citus_workload(nodes)
    assert not errors, f"{len(errors)} errors, e.g. node {errors[0][0]}: {errors[0][1]}"
    assert inserted == len(nodes) * CITUS_SESSIONS * CITUS_ROWS
    assert_citus_rows_apart(nodes, inserted)


# ------------------------------------------ 2. a registry that loses a grant
def test_a_registry_crash_that_loses_a_confirmed_grant(make_cluster):
    """The registry runs with `synchronous_commit = off` and crashes
    (`-m immediate`) right after it granted block 0 to C1, before its WAL
    writer wrote the grant (the WAL writer is held still, so the window is
    certain). C1 cannot reach the restarted registry (its TCP address is
    refused) and goes on with its lease, as any holder does during an
    outage; C2 leases from the restarted registry. 0.3.1 forgets the grant
    and gives C2 block 0 at once, "never used before": both make IDs under
    the same worker ids. The fix: the grant is durable before C1 uses it,
    and C2 gets block 0 only after C1's lease ran out, above C1's IDs."""
    one_block = {"snowflake_id.worker_ids": "0-15"}
    r = make_cluster(tcp=True, settings={
        "synchronous_commit": "off", "wal_writer_delay": "10s", "autovacuum": "off",
        "bgwriter_lru_maxpages": 0, "checkpoint_timeout": "1h"})
    r.create_extension()
    # Its restart with fsync off fences: for the limits' lease time and grace.
    lease_limits(r)
    r.sql("CHECKPOINT")
    c1 = holder_of(make_cluster, r.conninfo(), **one_block)       # TCP
    c2 = holder_of(make_cluster, unix_conninfo(r), start=False, **one_block)
    walwriter = r.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
    os.kill(walwriter, signal.SIGSTOP)
    try:
        maker1 = Maker(c1)
        wait_until(lambda: maker1.made, timeout=60, what="C1's first IDs")
        node1 = config(c1)["node_id"]
        assert {row[1] for row in leases(r)} == {node1}
        hba_reject_tcp(r)
        r.reload()
        # The crash: nothing written since the WAL writer stopped survives.
        os.kill(walwriter, signal.SIGKILL)
        r.stop(mode="immediate")
    finally:
        try:
            os.kill(walwriter, signal.SIGCONT)
        except ProcessLookupError:
            pass
    crashed = time.monotonic()
    r.start()
    fixed = new_protocol(r)
    if fixed:
        # A grant is durable before its holder uses it.
        assert node1 in {row[1] for row in leases(r)}, leases(r)
    c2.start()
    c2.create_extension()
    maker2 = Maker(c2)
    wait_until(lambda: maker1.refused_with("55000") and maker2.made, timeout=120,
               what="C1's lease running out and C2 making IDs")
    made1, made2 = maker1.stop(), maker2.stop()
    assert_apart("C1", made1, "C2", made2)
    assert min(made2) > max(made1), "C2's IDs are not all above C1's"
    if fixed:
        assert maker2.first_at - crashed >= LEASE_S - 1.0, "C2 did not wait for C1's lease"


@pytest.mark.parametrize("fleet", [pytest.param("running", marks=pytest.mark.slow), "new"])
def test_failover_to_an_asynchronous_standby_that_missed_a_grant(make_cluster, fleet):
    """The registry P streams to a standby S. S stops receiving; P grants a
    block to C1 (S never sees it); P dies and S is promoted. C1's
    connection string names both (`target_session_attrs=read-write`), but
    S refuses C1's address until C1's lease ran out; C2 leases from S at
    once. "running": another holder had leased from P before (S knows its
    lease); "new": C1's was P's first grant. 0.3.1 gives C2 the block C1
    holds, "never used before". The fix: S starts a new incarnation, fenced
    for the lease time plus grace (0.7.0: the registry's limits, set on P
    for 6 s leases and replicated), so C2's lease waits until C1's ran out
    and its IDs are above C1's; C1, once it reaches S, sees the new
    incarnation."""
    p = make_cluster(tcp=True)
    p.create_extension()
    lease_limits(p)
    s = make_cluster(tcp=True, basebackup_from=p)
    contested = {"snowflake_id.worker_ids": "16-31" if fleet == "running" else "0-15"}
    if fleet == "running":
        c0 = holder_of(make_cluster, unix_conninfo(p), **{"snowflake_id.worker_ids": "0-15"})
        with c0.connect() as conn:
            ids(conn, 100)
    lsn = p.scalar("SELECT pg_current_wal_insert_lsn()::text")
    wait_until(lambda: s.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn),
               timeout=60, what="S replaying P's WAL")
    # S stops receiving (an asynchronous standby that is behind).
    s.sql("ALTER SYSTEM SET primary_conninfo = ''")
    s.sql("SELECT pg_reload_conf()")
    wait_until(lambda: s.scalar("SELECT count(*) FROM pg_stat_wal_receiver") == 0,
               timeout=60, what="S's WAL receiver to stop")
    hba_reject_tcp(s)
    s.reload()
    both = (f"host=127.0.0.1,127.0.0.1 port={p.port},{s.port} dbname=postgres user=postgres"
            " target_session_attrs=read-write")
    c1 = holder_of(make_cluster, both, **contested)
    c2 = holder_of(make_cluster, unix_conninfo(s), start=False, **contested)
    maker1 = Maker(c1)
    wait_until(lambda: maker1.made, timeout=60, what="C1's first IDs")
    node1 = config(c1)["node_id"]
    assert node1 in {row[1] for row in leases(p)}
    p.stop(mode="immediate")
    s.promote()
    promoted = time.monotonic()
    assert node1 not in {row[1] for row in leases(s)}, "S saw C1's grant"
    fixed = new_protocol(s)
    c2.start()
    c2.create_extension()
    maker2 = Maker(c2)
    wait_until(lambda: maker1.refused_with("55000") and maker2.made, timeout=120,
               what="C1's lease running out and C2 making IDs")
    # C1 reaches S.
    mark1 = c1.log_mark()
    hba_accept_tcp(s)
    s.reload()
    wait_until(lambda: config(c1)["registry_unreachable_since"] is None,
               timeout=60, what="C1 reaching S")
    made1, made2 = maker1.stop(), maker2.stop()
    assert_apart("C1", made1, "C2", made2)
    assert min(made2) > max(made1), "C2's IDs are not all above C1's"
    if fixed:
        waited = maker2.first_at - promoted
        assert waited >= LEASE_S + GRACE_S - 0.5, \
            f"C2 made IDs {waited:.1f} s after the promotion: no fence"
        wait_until(lambda: re.search("new incarnation", c1.log(since=mark1)),
                   timeout=60, what="C1 logging S's new incarnation")


# --------------------------------------- 3. a base backup restored in place
def restore_in_place(c, backup: str) -> None:
    """Replaces the content of `c`'s data directory with `backup`, keeping
    the directory itself (as `rsync --delete` or pgBackRest `--delta`)."""
    for name in os.listdir(c.datadir):
        path = os.path.join(c.datadir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    run_pg(["cp", "-a", backup + "/.", c.datadir], cwd=c.dir)


@pytest.mark.parametrize("registry", [pytest.param("up", marks=pytest.mark.slow), "down"])
def test_a_base_backup_restored_in_place_uses_no_block_that_moved_on(make_cluster, registry):
    """H holds two blocks when a base backup of it is taken; then it gives
    one back (idle) and C2 leases it. H's data directory is replaced in
    place by the backup (same directory, so same device and inode) and H
    starts again, allowed only that block, while C2 makes IDs from it.
    0.3.1 uses the backup's saved lease at once: both make IDs under the
    same worker ids. The fix: a saved block is used only once the registry
    confirms it; with the registry down (or answering slowly: "up" holds
    its lease table locked for the first 3 s), H refuses with 55000."""
    lease = {"snowflake_id.lease_time": "50s"}   # the backup's leases are still current
    r = registry_server(make_cluster)
    h = holder_of(make_cluster, r.conninfo(), **{"snowflake_id.worker_ids": "0-31"}, **lease)
    conns = [h.connect() for _ in range(14)]     # 14 of 16 ids busy: a second block
    try:
        for conn in conns:
            ids(conn, 5)
        wait_until(lambda: config(h)["blocks_held"] == 2, timeout=60,
                   what="H leasing a second block")
        more = [h.connect() for _ in range(4)]
        conns += more
        for conn in more:
            ids(conn, 5)
    finally:
        for conn in conns:
            conn.close()
    backup = os.path.join(h.dir, "backup")
    run_client(h, "pg_basebackup", "-D", backup, "-X", "stream", "-c", "fast", "--no-sync")
    node_h = config(h)["node_id"]
    wait_until(lambda: len(leases(r)) == 1, timeout=120, what="H giving an idle block back")
    moved = next(b for (b,) in r.sql("SELECT block FROM snowflake_leases WHERE NOT leased"))
    c2 = holder_of(make_cluster, r.conninfo(),
                   **{"snowflake_id.worker_ids": block_range(moved)}, **lease)
    maker2 = Maker(c2)
    wait_until(lambda: maker2.made, timeout=60, what="C2 making IDs from the block H gave back")
    h.stop()
    inode = os.stat(h.datadir).st_ino
    restore_in_place(h, backup)
    assert os.stat(h.datadir).st_ino == inode
    assert os.path.exists(os.path.join(h.datadir, "backup_label"))
    h.configure(**{"snowflake_id.worker_ids": block_range(moved)})
    stall = None
    if registry == "down":
        r.stop()
    else:
        stall = Stall(r)
    try:
        h.start()
        # With the registry down, a call may wait for the first lease (up to
        # 30 s) before its 55000.
        maker_h = Maker(h, statement_timeout="40s" if registry == "down" else "10s")
        if stall is not None:
            time.sleep(STALL_S)   # the scenario: H's first STALL_S seconds
            stall.end()
        wait_until(lambda: maker_h.refusals, timeout=120, what="H refusing to make IDs")
    finally:
        if stall is not None:
            stall.end()
    made_h, made2 = maker_h.stop(), maker2.stop()
    assert config(h)["node_id"] == node_h
    assert_apart("H restored", made_h, "C2", made2)
    if registry == "down":
        assert not made_h
        e = maker_h.refusals[0]
        assert e.sqlstate == "55000", f"{e.sqlstate} {e}"


# ---------------------------- 4. only the holder of a node's lock releases its blocks
def lease_request(r, conn, fn: str, node: str, block: int):
    """Calls `fn` (release or renew) for `node`'s `block` in `conn`, with
    the signature the registry's version has."""
    now_ms = int(time.time() * 1000)
    if new_protocol(r):
        incarnation = ""
        if r.scalar("SELECT to_regclass('snowflake_lease_registry') IS NOT NULL"):
            incarnation = r.scalar("SELECT coalesce((SELECT incarnation::text"
                                   " FROM snowflake_lease_registry LIMIT 1), '')")
        lsn = r.scalar("SELECT pg_current_wal_lsn()::text")
        base = {"node": node, "incarnation": incarnation, "lsn": lsn}
        if fn == "release":
            req = {**base, "block": block, "high_ms": 0}
        else:
            req = {**base, "blocks": [{"block": block, "high_ms": now_ms + 60_000}],
                   "layout": "", "block_size": 16, "max_worker_id": 1023,
                   "lease_ms": 600_000, "grace_ms": 120_000, "high_ms": now_ms + 600_000}
        return conn.execute(f"SELECT {lease_schema(r)}.snowflake_lease_{fn}(%s::jsonb)",
                            (json.dumps(req),)).fetchall()
    if fn == "release":
        return conn.execute("SELECT snowflake_lease_release(%s, %s, 0)",
                            (node, block)).fetchall()
    return conn.execute("SELECT * FROM snowflake_lease_renew(%s, ARRAY[%s]::int[], 600000,"
                        " 120000, %s)", (node, block, now_ms + 600_000)).fetchall()


def test_a_role_without_the_nodes_lock_cannot_release_or_renew_its_blocks(make_cluster):
    """A role allowed to lease (EXECUTE on the lease functions, rights on
    the lease table) names a live holder's node: the node's lock is bound
    to the login role (0.8.0), so it takes that node's lock of its own
    role, and releasing or renewing the holder's block is refused with
    42501 or leaves it alone (the block is the holder's session's), with
    or without a node of its own; the block stays the holder's. 0.3.1
    releases it (mark 0), so a third server could lease it while its
    holder still uses it."""
    r = registry_server(make_cluster)
    a = holder_of(make_cluster, r.conninfo())
    with a.connect() as conn:
        made = ids(conn, 100)
    node = config(a)["node_id"]
    block = worker_bits(made[0]) // 16
    before = leases(r)
    assert [(row[0], row[1]) for row in before] == [(block, node)], before
    r.sql("CREATE ROLE lessee LOGIN")
    schema = lease_schema(r)
    for granted in sorted({"public", schema}):
        r.sql(f"GRANT USAGE ON SCHEMA {granted} TO lessee")
        r.sql(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {granted} TO lessee")
    r.sql("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO lessee")
    with r.connect(user="lessee") as conn:
        for own_node in (False, True):
            if own_node:
                conn.close()
                conn = r.connect(user="lessee")
                assert conn.execute(
                    f"SELECT {schema}.snowflake_lease_hello('intruder')").fetchone()[0]
            else:
                assert conn.execute(f"SELECT {schema}.snowflake_lease_hello(%s)",
                                    (node,)).fetchone()[0] is True
            for fn in ("release", "renew"):
                try:
                    got = lease_request(r, conn, fn, node, block)
                except psycopg.errors.InsufficientPrivilege:
                    continue
                reply = got[0][0] if got and isinstance(got[0][0], dict) else {}
                held = [b for b in reply.get("blocks", []) if b.get("block") == block]
                assert fn == "release" or not held, (
                    f"a session of another role as node {node} renewed its block {block}: {got}")
        conn.close()
    after = leases(r)
    assert [(row[0], row[1], row[3]) for row in after] == [(block, node, True)], after
    assert after[0][4] >= before[0][4], (before, after)   # its floor was not lowered
    with a.connect() as conn:
        more = ids(conn, 100)
    assert min(more) > max(made)


# ------------------- 5. saved leases wait for the registry's confirmation
def test_a_restart_with_the_registry_up_uses_saved_blocks_once_it_confirms_them(make_cluster):
    """H holds block 0 (lease 60 s) and stops. Its lease runs out at the
    registry (its expiry set in the past, as a registry clock ahead of H's
    would do; a TRUNCATE would fence, see test 2) and C2 leases block 0. H restarts
    in the same directory with the registry up but slow for its first 3 s
    (its lease table locked), while C2 makes IDs. 0.3.1 uses the saved
    block before its first renewal: both make IDs under worker id 0. The
    fix: a saved block is used once a renewal confirms it, and the
    registry does not confirm a block another node holds."""
    one_block = {"snowflake_id.worker_ids": "0-15"}
    r = registry_server(make_cluster)
    h = holder_of(make_cluster, r.conninfo(), **one_block, **{"snowflake_id.lease_time": "60s"})
    with h.connect() as conn:
        made_before = ids(conn, 100)
    h.stop()
    r.sql("UPDATE snowflake_lease_blocks SET expires_at = now() - interval '1 hour'")
    c2 = holder_of(make_cluster, r.conninfo(), **one_block)
    maker2 = Maker(c2)
    wait_until(lambda: maker2.made, timeout=60, what="C2 leasing block 0")
    stall = Stall(r)
    try:
        h.start()
        maker_h = Maker(h)
        time.sleep(STALL_S)   # the scenario: H's first STALL_S seconds
        stall.end()
        wait_until(lambda: maker_h.refusals or len(maker_h.made) > 20_000, timeout=120,
                   what="H refusing, or making IDs")
    finally:
        stall.end()
    made_h, made2 = maker_h.stop(), maker2.stop()
    assert_apart("H restarted", made_h, "C2", made2)
    assert not made_h or min(made_h) > max(made_before)
