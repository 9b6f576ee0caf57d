"""Helpers the fleet tests share (tests/fleet/): the short lease time they
run with, a registry server and a server leasing from it, the registry's
limits for that lease time, the registry's view of its leases, the
errors of a server that refuses to make IDs, waking stopped processes,
and the attacks' makers (timed batches; first IDs; an action repeated in
a thread). Test modules import these from here, never from one another;
helpers of several folders are in tests/helpers.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time

import psycopg
import pytest

from harness import free_port, run_pg, wait_until
from helpers import Maker

LEASE = "6s"
LEASE_S = 6.0
GRACE_S = 1.2  # lease::Timing: max(lease / 5, 1 s)


def registry_server(make_cluster, **settings):
    # fsync on: with fsync off, a restart may have lost grants, and the
    # registry fences after each one (tests/fleet/test_fencing.py).
    r = make_cluster(settings={"fsync": True, **settings})
    r.create_extension()
    return r


LIMITS = ("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
          " max_ahead_ms => 70000)")


def lease_limits(r, dbname: str = "postgres") -> None:
    """The registry's limits for LEASE (0.7.0, snowflake_lease_set_limits):
    a fence after a failover that lost grants lasts the limits' lease time
    plus grace, 6 s + 1.2 s, rather than the defaults' 10 min + 2 min. Marks
    are the holder's clock + 6 s + the default max_drift (60 s): 70 s
    leaves 4 s for its clock."""
    if r.scalar("SELECT to_regproc('snowflake_lease_set_limits') IS NOT NULL", dbname=dbname):
        r.sql(LIMITS, dbname=dbname)


def holder(make_cluster, registry, start=True, env=None, **settings):
    s = {"snowflake_id.registry": registry.conninfo(),
         "snowflake_id.lease_time": LEASE, **settings}
    c = make_cluster(settings=s, start=False)
    if start:
        c.start(env=env)
        c.create_extension()
    return c


def leases(r) -> list[tuple]:
    return r.sql("SELECT block, holder_node, holder_name, live, floor, expires_at"
                 " FROM snowflake_leases WHERE leased ORDER BY block")


# What a server that may not make IDs answers: no usable lease (55000),
# or a wait for one cut short by statement_timeout (57014).
REFUSED = (psycopg.errors.ObjectNotInPrerequisiteState, psycopg.errors.QueryCanceled)


def resume(pids) -> None:
    """SIGCONT to each of `pids` (processes a test stopped with SIGSTOP)
    that still exists."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)


def lease_worker(c) -> int:
    """The pid of server `c`'s lease worker."""
    return c.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowflake_id lease'")


def contested_fleet(make_cluster, dbname: str = "fleet") -> tuple:
    """The registry in database `dbname` of a server R (fsync on, the
    limits for LEASE); holder A making IDs from block 0 (CONTESTED: worker
    ids 0-15, one block), holder B waiting for it. Returns (r, a, maker_a,
    b, maker_b)."""
    r = make_cluster(settings={"fsync": True})
    r.create_db(dbname)
    r.create_extension(dbname)
    lease_limits(r, dbname)
    s = {**CONTESTED, "snowflake_id.registry": r.conninfo(dbname=dbname)}
    return (r, *a_holds_b_waits(make_cluster, r, s))


def a_holds_b_waits(make_cluster, r, settings: dict, statement_timeout: str = "60s") -> tuple:
    """Holders A and B of registry `r` with `settings` (one block between
    them, as CONTESTED): A making IDs, B waiting for A's block, each in a
    Maker. Returns (a, maker_a, b, maker_b)."""
    a = holder(make_cluster, r, **settings)
    maker_a = Maker(a, statement_timeout=statement_timeout)
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    b = holder(make_cluster, r, **settings)
    maker_b = Maker(b, statement_timeout=statement_timeout)
    wait_until(lambda: maker_b.refusals, timeout=60, what="B waiting for block 0")
    return a, maker_a, b, maker_b


def swap_registry(a, maker_a: Maker, b, maker_b: Maker, swap, state) -> tuple:
    """Another database put in the registry's place while holders A and B
    both want block 0: with both lease workers stopped, `swap()` runs
    (renames, a drop); B's worker resumes at once, A's only once B had up
    to 30 s to make IDs from block 0, and 8 s more. Returns `state()`
    after the swap, each holder's IDs and the duplicates between them."""
    workers = [lease_worker(a), lease_worker(b)]
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        swap()
    finally:
        resume(workers[1:])
    made_b = len(maker_b.made)
    try:
        wait_until(lambda: len(maker_b.made) > made_b, timeout=30, what="B's IDs from block 0")
    except AssertionError:
        pass
    time.sleep(8)
    after = state()
    resume(workers[:1])
    made_all = {"A": maker_a.stop(), "B": maker_b.stop()}
    return after, made_all, duplicates(made_all)


# ------------------------------------------------------- a hostile lease role
# (tests/fleet/test_adversarial_*.py; test_registry_limits.py has its own,
# older copy.)
def now_ms() -> int:
    return int(time.time() * 1000)


def lease_schema(r, dbname: str = "postgres") -> str:
    """The schema of the lease functions in database `dbname`."""
    return r.scalar("SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                    " WHERE p.proname = 'snowflake_lease_begin'", dbname=dbname)


def grant_lease_role(r, name: str = "snowflake_lease", dbname: str = "postgres") -> None:
    """The lease role with the rights docs/operations/fleet.md grants it in
    registry database `dbname`, and its documented CONNECTION LIMIT 20
    (made when missing: roles are the cluster's, one for several registry
    databases)."""
    schema = lease_schema(r, dbname)
    if not r.scalar("SELECT count(*) FROM pg_roles WHERE rolname = %s", name):
        r.sql(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT 20")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO {name}", dbname=dbname)
    for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)",
              "durable(jsonb)"):
        r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_lease_{f} TO {name}", dbname=dbname)


def grant_server_roles(r, servers: list[str], connection_limit: int = 3) -> dict[str, str]:
    """The configuration docs/operations/fleet.md documents for a hostile
    lease role: the group role snowflake_lease (NOLOGIN) with the lease
    role's rights, a login role per server (snowflake_lease_<server>, a
    member, CONNECTION LIMIT `connection_limit`), and max_blocks_per_role
    at max_blocks_per_node. Returns each server's role."""
    schema = r.scalar(
        "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE p.proname = 'snowflake_lease_begin'")
    r.sql("CREATE ROLE snowflake_lease NOLOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
    for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)",
              "durable(jsonb)"):
        r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_lease_{f} TO snowflake_lease")
    roles = {}
    for server in servers:
        roles[server] = f"snowflake_lease_{server}"
        r.sql(f"CREATE ROLE {roles[server]} LOGIN CONNECTION LIMIT {connection_limit}"
              " IN ROLE snowflake_lease")
    per_node = r.scalar("SELECT value FROM snowflake_lease_set_limits()"
                        " WHERE name = 'max_blocks_per_node'")
    r.sql("SELECT snowflake_lease_set_limits(max_blocks_per_role => %s)", per_node)
    return roles


# The default layout as holders send it (and as a registry with the default
# settings takes as the fleet's until the DBA fixes one).
DEFAULT_LAYOUT = ("63 total bits, 10 worker bits, 12 sequence bits, 1 ms per tick,"
                  " epoch 2024-01-01 00:00:00.000Z")


class Intruder:
    """One session of the lease role, introduced as a made-up node, sending
    whatever that role may send (requests as jsonb text)."""

    def __init__(self, r, node: str = "intruder", user: str = "snowflake_lease",
                 dbname: str = "postgres"):
        self.r = r
        self.node = node
        self.schema = lease_schema(r, dbname)
        self.conn = r.connect(dbname=dbname, user=user)
        got = self.conn.execute(f"SELECT {self.schema}.snowflake_lease_hello(%s)",
                                (node,)).fetchone()[0]
        assert got is True, f"node {node} is taken"
        rows = r.sql("SELECT DISTINCT layout FROM snowflake_lease_blocks", dbname=dbname)
        self.layout = rows[0][0] if rows else DEFAULT_LAYOUT

    def close(self) -> None:
        self.conn.close()

    def raw(self, fn: str, text: str):
        got = self.conn.execute(
            f"SELECT {self.schema}.snowflake_lease_{fn}(%s::jsonb)::text", (text,)).fetchone()[0]
        return json.loads(got)

    def call(self, fn: str, **req):
        return self.raw(fn, json.dumps({"node": self.node, "incarnation": "", "lsn": "0/0",
                                        **req}))

    def acquire(self, **req):
        now = int(time.time() * 1000)
        base = {"name": "intruder", "layout": self.layout, "block_size": 16,
                "max_worker_id": 1023, "allowed": list(range(64)), "want": 1,
                "lease_ms": 6000, "grace_ms": 1200, "high_ms": now + 66_000}
        return self.call("acquire", **{**base, **req})

    def renew(self, blocks: list[int], **req):
        now = int(time.time() * 1000)
        base = {"layout": self.layout, "block_size": 16, "max_worker_id": 1023,
                "blocks": [{"block": b, "high_ms": now} for b in blocks],
                "lease_ms": 6000, "grace_ms": 1200, "high_ms": now + 66_000}
        return self.call("renew", **{**base, **req})


def registry_state(r) -> tuple:
    """(incarnation, fenced: whether the registry is fenced now, cause);
    (None, False, None) while it has no row (made again under live block
    locks, until the first lease call)."""
    rows = r.sql("SELECT incarnation, coalesce(fenced_until > now(), false), cause"
                 " FROM snowflake_lease_registry")
    return rows[0] if rows else (None, False, None)


def acquired_once(r) -> tuple:
    """One block leased by the lease role (an intruder node), then the
    registry's state."""
    grant_lease_role(r)
    x = Intruder(r)
    assert x.acquire()["blocks"], "no block leased"
    x.close()
    return registry_state(r)


def rolled_back_reply(x: Intruder, fn: str, req: dict) -> dict:
    """Lease call `fn` in a DO block that shows the reply by a NOTICE and
    then raises: the reply (and its token) reach the caller, the grant
    count never commits."""
    got: list[str] = []

    def notice(d):
        if (d.message_primary or "").startswith("reply "):
            got.append(d.message_primary[len("reply "):])
    x.conn.add_notice_handler(notice)
    try:
        with contextlib.suppress(psycopg.errors.RaiseException):
            x.conn.execute(f"""DO $do$ DECLARE rep jsonb; BEGIN
                rep := {x.schema}.snowflake_lease_{fn}($j${json.dumps(req)}$j$::jsonb);
                RAISE NOTICE 'reply %', rep;
                RAISE EXCEPTION 'undo';
                END $do$""")
            raise AssertionError("the DO block did not raise")
    finally:
        x.conn.remove_notice_handler(notice)
    assert got, "no reply came back"
    return json.loads(got[0])


def sessions_gone(r, db: str) -> None:
    """Every session of database `db` ended."""
    r.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
          " WHERE datname = %s AND pid <> pg_backend_pid()", db)
    wait_until(lambda: r.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                db) == 0, timeout=30, what=f"no session in {db}")


def duplicates(made: dict[str, list[int]]) -> list[str]:
    """IDs made twice, within one server or by two: one line per server or
    pair of servers, with the count."""
    problems = []
    sets = {name: set(got) for name, got in made.items()}
    for name, got in made.items():
        if len(sets[name]) != len(got):
            problems.append(f"{len(got) - len(sets[name])} IDs made twice by {name}")
    names = list(made)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = len(sets[a] & sets[b])
            if both:
                problems.append(f"{both} IDs made by both {a} and {b}")
    return problems


# ------------------------------------------- a registry with a synchronous standby
def named_standby(make_cluster, primary, name: str, registry_name: str | None, **settings):
    """A physical standby of `primary` streaming as application_name `name`,
    its snowflake_id.registry_standby_name `registry_name` (None: unset),
    with `settings`."""
    s = make_cluster(basebackup_from=primary, tcp=True, start=False,
                     settings={"fsync": True, **settings})
    with open(os.path.join(s.datadir, "postgresql.auto.conf"), "a") as f:
        f.write(f"primary_conninfo = 'host={primary.dir} port={primary.port} user=postgres"
                f" application_name={name}'\n")
        if registry_name is not None:
            f.write(f"snowflake_id.registry_standby_name = '{registry_name}'\n")
    s.start()
    return s


def require_sync(primary, names: str, *standbys: str) -> None:
    """synchronous_standby_names = `names` on `primary` once `standbys`
    stream, and until they are its sync (or quorum) standbys."""
    from harness import wait_until
    wait_until(lambda: primary.scalar(
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        " AND application_name = ANY (%s)", list(standbys)) == len(standbys),
        timeout=60, what="standbys streaming")
    primary.configure(synchronous_standby_names=names)
    primary.reload()
    state = "quorum" if names.lower().startswith("any") else "sync"
    wait_until(lambda: primary.scalar(
        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = %s"
        " AND application_name = ANY (%s)", state, list(standbys)) == len(standbys),
        timeout=60, what="standbys synchronous")


def hosts(*servers) -> str:
    """A connection string naming `servers` in order (unix sockets), for a
    read-write session: a holder follows a promotion."""
    return (f"host={','.join(s.dir for s in servers)}"
            f" port={','.join(str(s.port) for s in servers)} dbname=postgres user=postgres"
            " target_session_attrs=read-write")


# The attacks' contested block: worker ids 0-15, 1 s of drift; a stall
# of over four lease times.
CONTESTED = {"snowflake_id.worker_ids": "0-15", "snowflake_id.max_drift": "1s"}
STALL_S = 25


class TimedMaker:
    """A session making IDs in batches of 200: each batch's start and end
    (wall clock) and its IDs, until stop()."""

    def __init__(self, c):
        self.batches: list[tuple[float, float, list[int]]] = []
        self.refusals: list[psycopg.Error] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(c,), daemon=True)
        self._thread.start()

    def _run(self, c):
        with c.connect(options="-c statement_timeout=40s") as conn:
            while not self._stop.is_set():
                t0 = time.time()
                try:
                    got = [r[0] for r in conn.execute(
                        "SELECT snowflake_nextval() FROM generate_series(1, 200)").fetchall()]
                except REFUSED as e:
                    self.refusals.append(e)
                    self._stop.wait(0.02)
                    continue
                self.batches.append((t0, time.time(), got))
                self._stop.wait(0.002)

    def made(self) -> list[int]:
        return [i for _, _, got in self.batches for i in got]

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()
        return self.made()


def first_ids_within(maker: Maker, seconds: float) -> float | None:
    """Seconds until `maker` made its first IDs, or None within `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if maker.made:
            return time.monotonic() - start
        time.sleep(0.1)
    return None


class Repeat:
    """`action` every `every` seconds in a thread until stop()."""

    def __init__(self, action, every: float):
        self.errors: list[BaseException] = []
        self.count = 0
        self._stop = threading.Event()

        def run():
            while not self._stop.is_set():
                try:
                    action()
                    self.count += 1
                except psycopg.Error as e:
                    self.errors.append(e)
                self._stop.wait(every)
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# ------------------------------------------------------- backfill in a fleet
def try_scalar(c, query):
    """The query's value, or None when it raises."""
    try:
        return c.scalar(query)
    except psycopg.Error:
        return None


def wait_live(c) -> None:
    """Waits until holder `c` makes live IDs (it holds a lease)."""
    from harness import wait_until
    wait_until(lambda: try_scalar(c, "SELECT snowflake_nextval()") is not None, timeout=90,
               what="a lease")


def backfill_ids(conn, times) -> list[int]:
    """snowflake_at() of each time, in the order given."""
    return [r[0] for r in conn.execute(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) WITH ORDINALITY u(t, n)"
        " ORDER BY n", (times,)).fetchall()]


def grants_by_stretch(c) -> dict:
    return dict(c.sql("SELECT bucket, grants FROM snowflake_backfill()"))


def total_grants(c) -> int:
    return c.scalar("SELECT coalesce(sum(grants), 0) FROM snowflake_backfill()")

def restore_in_place(r, aside: str) -> None:
    """R stopped, its data directory replaced by the copy `aside`, started
    elsewhere to write well past every WAL position a holder saw, then
    started again on its own port (holders reach it from then on)."""
    r.stop()
    run_pg(["rm", "-rf", r.datadir], cwd=r.dir)
    run_pg(["cp", "-a", aside, r.datadir], cwd=r.dir)
    port = r.port
    r.port = free_port()
    r.configure()
    r.start()
    r.sql("CREATE TABLE filler AS SELECT g, repeat('x', 100) AS pad"
          " FROM generate_series(1, 400000) g")
    r.stop()
    r.port = port
    r.configure()
    r.start()


def seen_of(reply: dict) -> dict:
    return {k: reply[k] for k in ("incarnation", "lsn", "grants", "token")}


def renew_req(x: Intruder, block: int, **seen) -> dict:
    return {"node": x.node, "incarnation": "", "lsn": "0/0", "layout": x.layout,
            "block_size": 16, "max_worker_id": 1023,
            "blocks": [{"block": block, "high_ms": now_ms()}], "lease_ms": 6000,
            "grace_ms": 1200, "high_ms": now_ms() + 66_000, **seen}


def stacked_ghost(x: Intruder, block: int, seconds: float = 1.5) -> dict:
    """(tests/fleet/test_adversarial_s23.py, s24) The lease role's node `x` renews its block again and again in one DO
    block for `seconds` (under lease_lock::HOLD_MS), shows the last reply by
    a NOTICE and raises: the reply's signed count is the committed one
    plus every renewal of the block, none of which commits."""
    got: list[str] = []

    def notice(d):
        if (d.message_primary or "").startswith("reply "):
            got.append(d.message_primary[len("reply "):])
    x.conn.add_notice_handler(notice)
    req = json.dumps(renew_req(x, block))
    try:
        with pytest.raises(psycopg.errors.RaiseException):
            x.conn.execute(f"""DO $do$ DECLARE rep jsonb; t0 timestamptz := clock_timestamp();
                BEGIN
                LOOP
                    rep := {x.schema}.snowflake_lease_renew($j${req}$j$::jsonb);
                    EXIT WHEN clock_timestamp() > t0 + interval '{seconds} s';
                END LOOP;
                RAISE NOTICE 'reply %', rep;
                RAISE EXCEPTION 'undo';
                END $do$""")
    finally:
        x.conn.remove_notice_handler(notice)
    assert got, "no reply shown"
    return json.loads(got[0])


def server_roles_0_7_0(r, dbname: str, servers: list[str]) -> dict[str, str]:
    """grant_server_roles on a 0.7.0 registry (no
    max_blocks_per_role there): the group role and a login role per
    server."""
    schema = "snowflake_id_internal"
    r.sql("CREATE ROLE snowflake_lease NOLOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease", dbname=dbname)
    for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)",
              "durable(jsonb)"):
        r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_lease_{f} TO snowflake_lease",
              dbname=dbname)
    roles = {}
    for server in servers:
        roles[server] = f"snowflake_lease_{server}"
        r.sql(f"CREATE ROLE {roles[server]} LOGIN CONNECTION LIMIT 3 IN ROLE snowflake_lease")
    return roles


def log_problems(r, since: int = 0) -> list[str]:
    """A panic or a crash, an internal error, or the data directory's
    token key in the registry's log."""
    text = r.log(since)
    problems = [line for line in text.splitlines()
                if re.search(r"PANIC|panicked|internal error|terminated by signal|XX000", line)]
    key_file = os.path.join(r.datadir, "snowflake_id.key")
    try:
        key = open(key_file).read().strip()
    except OSError:
        key = ""
    if key and key in text:
        problems.append("the token key is in the log")
    return problems


# The advisory locks a login role's sessions hold on node keys (pid, key).
HELD_BY = ("SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
           " JOIN pg_stat_activity s ON s.pid = l.pid WHERE l.locktype = 'advisory'"
           " AND l.objsubid = 1 AND l.granted AND s.usename = %s")
# The registry's log line for a squatter's session ended by hello.
ENDED = "snowflake_id registry: ended session"
