"""A real Citus 13.2 cluster (coordinator and two workers, PostgreSQL 15):
a distributed table keyed by `DEFAULT snowflake_nextval()`, three
concurrent sessions per node inserting through that node. Every node makes
its own IDs, so two nodes under one worker id would make the same keys.

- zero configuration: nothing but `shared_preload_libraries =
  'citus,snowflake_id'` on every node: each node leases worker ids from the
  coordinator it finds in Citus's metadata;
- `snowflake_id.registry` naming the coordinator on every node;
- hand-set disjoint `snowflake_id.worker_ids` (the no-registry way).

Citus is built from the tarball in ../shared/citus by scripts/lib.sh
before any test (PostgreSQL 15 only; the tests fail on 15 when it is
missing, and on the other versions skip unless citus.so was installed
there by hand). The one
Citus setting here, `citus.node_conninfo = 'sslmode=prefer'`, is for Citus
itself: the test servers have no TLS.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import CITUS_MARKS, can_make_id

SESSIONS_PER_NODE = 3
ROWS_PER_SESSION = 6_000
BATCH = 500

pytestmark = CITUS_MARKS

CITUS = {"shared_preload_libraries": "citus,snowflake_id",
         "citus.node_conninfo": "sslmode=prefer",
         "max_connections": 200}


def citus_cluster(make_cluster, settings_for=lambda i, coordinator: {}):
    """Coordinator (node 0) and two workers, each with citus and
    snowflake_id created in database postgres; returns the nodes."""
    coordinator = make_cluster(tcp=True, settings={**CITUS, **settings_for(0, None)})
    nodes = [coordinator]
    for i in (1, 2):
        nodes.append(make_cluster(tcp=True, settings={**CITUS, **settings_for(i, coordinator)}))
    for n in nodes:
        n.sql("CREATE EXTENSION citus")
        n.create_extension()
    coordinator.sql("SELECT citus_set_coordinator_host('127.0.0.1', %s)", int(coordinator.port))
    for n in nodes[1:]:
        coordinator.sql("SELECT citus_add_node('127.0.0.1', %s)", int(n.port))
    return nodes


def mode(n) -> str:
    return n.scalar("SELECT mode FROM snowflake_config()")


def workload(nodes) -> tuple[int, list[str]]:
    """SESSIONS_PER_NODE sessions per node, each inserting ROWS_PER_SESSION
    rows through its node in batches; returns the rows inserted and the
    errors seen. Starts once every node makes IDs: a node that found its
    registry may still be connecting to it (after the coordinator's
    restart, its lease worker retries with a backoff of up to 5 s), and a
    session fails at once while its server holds no lease and the registry
    is unreachable."""
    for n in nodes:
        with n.connect() as conn:
            wait_until(lambda conn=conn: can_make_id(conn), timeout=60,
                       what=f"IDs on node {n.port} before the workload")
    coordinator = nodes[0]
    coordinator.sql("CREATE TABLE events (id bigint PRIMARY KEY DEFAULT snowflake_nextval(),"
                    " node int NOT NULL, session int NOT NULL, n int NOT NULL)")
    coordinator.sql("SELECT create_distributed_table('events', 'id')")
    errors: list[str] = []
    inserted = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(nodes) * SESSIONS_PER_NODE)

    def session(node_no: int, s: int) -> None:
        with nodes[node_no].connect() as conn:
            start.wait()
            for b in range(ROWS_PER_SESSION // BATCH):
                try:
                    cur = conn.execute(
                        "INSERT INTO events (node, session, n)"
                        " SELECT %s::int, %s::int, g FROM generate_series(%s::int, %s::int) g",
                        (node_no, s, b * BATCH, (b + 1) * BATCH - 1))
                    with lock:
                        inserted[0] += cur.rowcount
                except psycopg.Error as e:
                    with lock:
                        errors.append(f"node {node_no}: {e.sqlstate} {e}")

    threads = [threading.Thread(target=session, args=(i, s))
               for i in range(len(nodes)) for s in range(SESSIONS_PER_NODE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return inserted[0], errors


def check(nodes, inserted, errors) -> None:
    total = len(nodes) * SESSIONS_PER_NODE * ROWS_PER_SESSION
    dup = [e for e in errors if e.split(": ", 1)[1].startswith("23505")]
    assert not dup, f"{len(dup)} duplicate-key errors, e.g. {dup[0]}"
    assert not errors, errors[:3]
    assert inserted == total
    coordinator = nodes[0]
    assert coordinator.scalar("SELECT count(*) FROM events") == total
    assert coordinator.scalar("SELECT count(DISTINCT id) FROM events") == total
    # Each node's rows came from worker ids no other node used.
    per_node = coordinator.sql(
        "SELECT node, array_agg(DISTINCT snowflake_worker_id(id)) FROM events GROUP BY node")
    seen: dict[int, int] = {}
    for node, workers in per_node:
        for w in workers:
            assert seen.setdefault(w, node) == node, f"worker id {w} used by nodes {seen[w]} and {node}"


def test_zero_configuration(make_cluster):
    nodes = citus_cluster(make_cluster)
    # Each node finds the coordinator in Citus's metadata within a second
    # or two of joining the cluster.
    for n in nodes:
        wait_until(lambda n=n: mode(n) == "citus", timeout=60, what=f"citus mode on {n.port}")
    inserted, errors = workload(nodes)
    check(nodes, inserted, errors)
    cfg = nodes[1].sql("SELECT registry, blocks_held FROM snowflake_config()")[0]
    assert f"127.0.0.1:{nodes[0].port}" in cfg[0] and cfg[1] >= 1, cfg
    # The coordinator's registry shows each node's leases, live.
    holders = nodes[0].sql("SELECT holder_name, count(*) FROM snowflake_leases"
                           " WHERE leased AND live GROUP BY holder_name")
    assert len(holders) == 3, holders
    # A worker restarted while the coordinator is down goes on with the
    # leases it held: it saved the registry it found in Citus's metadata.
    w = nodes[1]
    node_id = w.scalar("SELECT node_id FROM snowflake_config()")
    blocks = {b for (b,) in nodes[0].sql(
        "SELECT block FROM snowflake_leases WHERE holder_node = %s", node_id)}
    before = nodes[0].scalar("SELECT max(id) FROM events WHERE node = 1")
    nodes[0].stop()
    w.restart()
    with w.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=30,
                   what="IDs on a restarted worker with the coordinator down")
        made = [conn.execute("SELECT snowflake_nextval()").fetchone()[0] for _ in range(100)]
    assert min(made) > before
    assert {w.scalar("SELECT snowflake_worker_id(%s)", i) // 16 for i in made} <= blocks
    assert mode(w) == "citus"
    nodes[0].start()



@pytest.mark.slow  # CI budget
def test_a_worker_whose_metadata_empties_stays_in_citus_mode(make_cluster):
    """stop_metadata_sync_to_node() empties a worker's pg_dist_node while it
    stays in the cluster. 0.6.0 read that as "no cluster" and went local
    with every worker id (issue 30: 212,041 IDs made twice); the worker
    now keeps leasing from the coordinator it knew, says so, and makes IDs
    only from its leased blocks."""
    nodes = citus_cluster(make_cluster)
    for n in nodes:
        wait_until(lambda n=n: mode(n) == "citus", timeout=60, what=f"citus mode on {n.port}")
    coordinator, w = nodes[0], nodes[1]
    with w.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=30, what="IDs on the worker")
    coordinator.sql("SELECT stop_metadata_sync_to_node('127.0.0.1', %s)", int(w.port))
    wait_until(lambda: w.scalar("SELECT count(*) FROM pg_dist_node") == 0, timeout=60,
               what="the worker's pg_dist_node emptied")
    wait_until(lambda: "lists no cluster" in (w.scalar("SELECT lease_problem FROM snowflake_config()")
                                              or ""),
               timeout=30, what="the worker's lease problem")
    assert mode(w) == "citus"
    node_id = w.scalar("SELECT node_id FROM snowflake_config()")
    blocks = {b for (b,) in coordinator.sql(
        "SELECT block FROM snowflake_leases WHERE holder_node = %s", node_id)}
    assert blocks
    with w.connect() as conn:
        made = [conn.execute("SELECT snowflake_nextval()").fetchone()[0] for _ in range(200)]
    assert {w.scalar("SELECT snowflake_worker_id(%s)", i) // 16 for i in made} <= blocks
    assert "lists no cluster" in w.log()


def test_registry_naming_the_coordinator(make_cluster):
    def settings(i, coordinator):
        # The coordinator names itself: its port is known only once made.
        # It is the registry and restarts: fsync on (a registry with fsync
        # off fences after every restart, see tests/fleet/test_fencing.py).
        return {"fsync": True} if coordinator is None else {
            "snowflake_id.registry": coordinator.conninfo()}
    nodes = citus_cluster(make_cluster, settings)
    nodes[0].configure(**{"snowflake_id.registry": nodes[0].conninfo()})
    nodes[0].restart()
    for n in nodes:
        wait_until(lambda n=n: mode(n) == "registry", timeout=60, what=f"registry mode on {n.port}")
    inserted, errors = workload(nodes)
    check(nodes, inserted, errors)


@pytest.mark.slow  # CI budget
def test_hand_set_ranges(make_cluster):
    ranges = ["0-340", "341-681", "682-1023"]
    nodes = citus_cluster(make_cluster, lambda i, c: {"snowflake_id.worker_ids": ranges[i]})
    # Citus preloaded: the lease worker finds the cluster and leases from
    # the coordinator, within the hand-set ranges.
    inserted, errors = workload(nodes)
    check(nodes, inserted, errors)


@pytest.mark.slow  # CI budget
def test_a_locked_pg_dist_node_does_not_stop_renewals(make_cluster):
    """A LOCK (or a VACUUM FULL) of pg_dist_node on a worker, held longer
    than a lease: the lease worker's metadata read gives up within a
    second, says so, and the worker goes on renewing its blocks and making
    IDs. Before, the read had no timeout: the lease worker sat in the lock
    wait, neither renewing nor revoking its blocks at their deadline."""
    nodes = citus_cluster(make_cluster, lambda i, c: {"snowflake_id.lease_time": "4s"})
    for n in nodes:
        wait_until(lambda n=n: mode(n) == "citus", timeout=60, what=f"citus mode on {n.port}")
    w = nodes[1]
    # Connections opened (and their caches warm) before the lock: a new
    # backend of a Citus node may read pg_dist_node itself.
    with w.connect() as conn, w.connect() as cfg, w.connect() as lock:
        wait_until(lambda: can_make_id(conn), timeout=30, what="IDs on the worker")

        def deadline():
            return cfg.execute("SELECT lease_deadline FROM snowflake_config()").fetchone()[0]

        deadline()
        lock.execute("SELECT 1")
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE pg_dist_node IN ACCESS EXCLUSIVE MODE")
        try:
            # Longer than a lease: only renewals made while the lock is
            # held keep the deadline ahead of the clock (4 s leases renew
            # every 0.4 s; the metadata read gives up after at most 1 s).
            time.sleep(6)
            ahead = cfg.execute("SELECT lease_deadline > now() FROM snowflake_config()")
            assert ahead.fetchone()[0], \
                f"no renewal while pg_dist_node was locked (deadline {deadline()})"
            made = [conn.execute("SELECT snowflake_nextval()").fetchone()[0] for _ in range(100)]
            assert len(set(made)) == 100
            assert "Citus metadata could not be read within" in w.log()
        finally:
            lock.execute("ROLLBACK")
    assert mode(w) == "citus"


def test_backfill_through_the_coordinator(make_cluster):
    """Backfill on a Citus cluster (docs/guides/backfill.md, in a fleet):
    every node sets aside the same ids; each node's sessions take grants
    from the coordinator, the cluster's registry, and the three nodes
    backfilling the same times at once make no ID twice."""
    set_aside = {"snowflake_id.backfill_worker_ids": "1008-1023"}
    nodes = citus_cluster(make_cluster, lambda i, c: set_aside)
    for n in nodes:
        wait_until(lambda n=n: mode(n) == "citus", timeout=60, what=f"citus mode on {n.port}")
        with n.connect() as conn:
            wait_until(lambda conn=conn: can_make_id(conn), timeout=60, what=f"IDs on {n.port}")
    start = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    times = [start + dt.timedelta(minutes=97 * i, milliseconds=i % 5) for i in range(600)]
    made: dict[int, list[int]] = {}
    errors: list[str] = []

    def work(i, n):
        order = times[:]
        random.Random(i).shuffle(order)
        try:
            with n.connect() as conn:
                made[i] = [r[0] for r in conn.execute(
                    "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", (order,)).fetchall()]
        except psycopg.Error as e:
            errors.append(f"node {i}: {e.sqlstate} {e}")

    threads = [threading.Thread(target=work, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    every = [i for ids in made.values() for i in ids]
    assert len(every) == 3 * len(times)
    assert len(set(every)) == len(every), f"{len(every) - len(set(every))} IDs made twice"
    workers = {w for (w,) in nodes[0].sql(
        "SELECT DISTINCT snowflake_worker_id(i) FROM unnest(%s::bigint[]) i", every)}
    assert workers <= set(range(1008, 1024)), workers
    # The coordinator counted them.
    assert nodes[0].scalar("SELECT sum(grants) FROM snowflake_backfill()") >= 3 * 50
