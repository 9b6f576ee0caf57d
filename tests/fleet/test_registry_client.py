"""The lease worker's connection to its registry, on real servers: libpq
(TLS, passfile, several hosts), bounded waits on a stalled registry, the
per-server block cap, and the warning about a registry database every role
may connect to, and where the lease functions are on registries of 0.5.0
and 0.6.0 (and through the registry's update). The holder's rules are tested in core/src/holder/tests.rs and
tests/fleet/test_leases.py; the fencing in tests/fleet/test_fencing.py."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time

import psycopg
import pytest

from harness import AS_ROOT, PG_MAJOR, other_pg_bindir, pg_config, pg_ids, wait_until
from helpers import REPO, can_make_id, config, ids, lease_schema, old_release, sql_error
from fleet_helpers import (LEASE, LEASE_S, grant_server_roles, holder, leases, registry_server,
                           resume)


def server_pids(c) -> list[int]:
    """The postmaster of `c` and every process it started."""
    with open(os.path.join(c.datadir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(postmaster)],
                         capture_output=True, text=True).stdout
    return [postmaster] + [int(p) for p in out.split()]


def owned_file(path: str, text: str) -> str:
    """A file only the server's OS user can read (as libpq wants a passfile)."""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    if AS_ROOT:
        os.chown(path, *pg_ids())
    return path


def test_a_first_host_that_accepts_connections_and_never_answers_is_passed_over(make_cluster):
    """A connection string with two hosts whose first accepts connections
    and never answers (its processes stopped: a frozen VM; the kernel still
    completes the TCP handshake). libpq moves to the next host only on a
    refused connection, so 0.6.0 waited 10 s on the first host at every
    attempt and never leased (issue 30). The lease worker now tries the
    hosts one by one, each within the call timeout, and after a failure
    begins with the next: the holder leases from the second host, and its
    later reconnections start there."""
    frozen = make_cluster(tcp=True)
    r = registry_server(make_cluster)
    pids = server_pids(frozen)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        conninfo = (f"host=127.0.0.1,{r.dir} port={frozen.port},{r.port} dbname=postgres"
                    " user=postgres")
        a = holder(make_cluster, r, **{"snowflake_id.registry": conninfo})
        with a.connect() as conn:
            wait_until(lambda: can_make_id(conn), timeout=60, what="IDs with the first host frozen")
        assert [row[1] for row in leases(r)] == [config(a)["node_id"]]
        # A broken session: the next attempt begins with the second host,
        # so the holder is back at once (no 10 s on the frozen one).
        r.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
              " WHERE application_name = 'snowflake_id lease'")
        wait_until(lambda: r.scalar("SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name = 'snowflake_id lease'") == 1,
                   timeout=8, what="the lease worker back on the second host before 10 s")
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)


def test_a_stalled_registry_is_detected_and_the_holder_still_stops_fast(make_cluster):
    """A registry whose processes are stopped (SIGSTOP: a hung disk, a
    frozen VM) answers nothing while the kernel keeps its sockets open. The
    holder's calls give up after 10 s, or at the deadline of the blocks in
    use when that comes first (here: a 6 s lease renewed every 600 ms, so
    the first call to stall gives up at the deadline, and the next
    connection attempt, with no block in use, after 10 s):
    registry_unreachable_since is set,
    the error after the lease ran out names an unreachable registry, and
    `pg_ctl stop -m fast` on the holder finishes within 10 s. (0.3.1's
    client waited forever: nothing logged, and the holder did not stop.)"""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    with a.connect() as conn:
        assert len(ids(conn, 100)) == 100
    pids = server_pids(r)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        wait_until(lambda: config(a)["registry_unreachable_since"] is not None,
                   timeout=40, what="the stalled registry noticed")
        with a.connect() as conn:
            def refused():
                try:
                    ids(conn, 1)
                    return False
                except psycopg.errors.ObjectNotInPrerequisiteState as e:
                    refused.error = e
                    return True
            wait_until(refused, timeout=LEASE_S + 40, what="55000 once the lease ran out")
        msg = refused.error.diag.message_primary
        assert "unreachable" in msg, msg
        assert "other servers" not in (refused.error.diag.message_detail or "")
        log = a.log()
        assert "no answer before the lease deadline" in log, log[-3000:]
        started = time.monotonic()
        a.stop(mode="fast", timeout=30)
        took = time.monotonic() - started
        assert took < 10, f"pg_ctl stop -m fast took {took:.1f} s with the registry stalled"
    finally:
        resume(pids)


def test_a_holder_stops_at_its_lease_deadline_while_a_call_waits_on_a_stalled_registry(
        make_cluster):
    """The registry's processes are stopped (SIGSTOP) right after a
    renewal; the holder's next renewal then waits for an answer that does
    not come. Every wait on the registry ends by the earliest deadline of
    the blocks in use, so the lease worker gets back to its loop and
    revokes them at the deadline, as the holder's contract says (a fence
    after a registry that forgets relies on it). Up to 0.6.0 the call
    waited its whole 10 s timeout (longer than the 6 s lease), and the
    holder made IDs about 4.5 s past its deadline."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)   # 6 s leases, renewed every 600 ms
    tolerance_s = 1.5             # a loaded two-core machine
    with a.connect() as conn, a.connect() as watch:
        assert len(ids(conn, 10)) == 10

        def deadline():
            return watch.execute("SELECT lease_deadline FROM snowflake_config()").fetchone()[0]

        pids = server_pids(r)
        try:
            # Right after a renewal (the published deadline moves on by a
            # renewal interval), the next one comes about 600 ms later,
            # well before the deadline, and waits on the stalled registry.
            before = deadline()
            started = time.monotonic()
            while (deadline() - before).total_seconds() < 0.3:
                assert time.monotonic() - started < 30, "no renewal seen"
                time.sleep(0.01)
            for p in pids:
                os.kill(p, signal.SIGSTOP)
            time.sleep(0.3)   # a reply already on its way is in by now
            stalled_at = deadline()
            last_ok = None
            refused = None
            giving_up = time.monotonic() + LEASE_S + 20
            while refused is None and time.monotonic() < giving_up:
                try:
                    _, at = conn.execute(
                        "SELECT snowflake_nextval(), clock_timestamp()").fetchone()
                    last_ok = at
                except psycopg.errors.ObjectNotInPrerequisiteState as e:
                    refused = e
                time.sleep(0.01)
            assert last_ok is not None, "no ID made after the registry stalled"
            assert refused is not None, "IDs went on for 26 s with the registry stalled"
            final = deadline()
            over = (last_ok - final).total_seconds()
            assert abs((final - stalled_at).total_seconds()) < 0.1, (stalled_at, final)
            assert over <= tolerance_s, (
                f"an ID was made {over:.2f} s after the lease deadline {final}"
                f" (last ID at {last_ok})")
            msg = refused.diag.message_primary
            assert refused.sqlstate == "55000", refused
            assert msg.startswith("no worker id is leased: the registry"), msg
            assert "has been unreachable" in msg, msg
            assert "leases ran out at" in (refused.diag.message_detail or ""), refused
            assert "before the lease deadline" in a.log(), a.log()[-3000:]
        finally:
            resume(pids)


def make_cert(dirpath: str) -> tuple[str, str]:
    crt, key = os.path.join(dirpath, "server.crt"), os.path.join(dirpath, "server.key")
    subprocess.run(["openssl", "req", "-new", "-x509", "-days", "2", "-nodes",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", crt],
                   check=True, capture_output=True)
    os.chmod(key, 0o600)
    if AS_ROOT:
        for p in (crt, key):
            os.chown(p, *pg_ids())
    return crt, key


def ssl_bindir() -> "str | None":
    """A server build with TLS for the registry: this version's, or
    Debian's PostgreSQL 15 when this one has none (the PyPI builds of 16
    and 18); the holder is this version either way, and its client is the
    system's libpq."""
    if "openssl" in pg_config("--configure"):
        return None
    return other_pg_bindir(15) or pytest.skip(
        f"PostgreSQL {PG_MAJOR} here is built without TLS and no PostgreSQL 15 with the"
        " extension is installed in this run to be the registry")


def test_a_hostssl_only_registry_with_a_passfile(make_cluster):
    """The registry allows only TLS connections with a password
    (`hostssl ... scram-sha-256`); the holder's connection string says
    `sslmode=require` and names a passfile, and leases work over TLS. Without
    TLS the registry refuses the same role. (0.3.1 connected without TLS
    and read no passfile.)"""
    r = make_cluster(tcp=True, settings={"fsync": True}, start=False, bindir=ssl_bindir())
    crt, key = make_cert(r.dir)
    r.configure(ssl=True, ssl_cert_file=crt, ssl_key_file=key,
                password_encryption="scram-sha-256")
    with open(os.path.join(r.datadir, "pg_hba.conf"), "w") as f:
        f.write("local all postgres trust\n"
                "hostssl all lease 127.0.0.1/32 scram-sha-256\n"
                "host all all 127.0.0.1/32 reject\n")
    r.start()
    r.create_extension()
    r.sql("CREATE ROLE lease LOGIN PASSWORD 'correct horse'")
    r.sql("GRANT USAGE ON SCHEMA snowflake_id_internal TO lease")
    r.sql("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA snowflake_id_internal TO lease")
    passfile = owned_file(os.path.join(r.dir, "lease.pgpass"),
                          f"127.0.0.1:{r.port}:postgres:lease:correct horse\n")
    base = f"host=127.0.0.1 port={r.port} dbname=postgres user=lease passfile={passfile}"
    a = make_cluster(settings={"snowflake_id.registry": f"{base} sslmode=require",
                               "snowflake_id.lease_time": LEASE})
    a.create_extension()
    with a.connect() as conn:
        assert len(set(ids(conn, 200))) == 200
    assert config(a)["mode"] == "registry"
    assert r.scalar("SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a"
                    " USING (pid) WHERE a.application_name = 'snowflake_id lease'") is True
    # The same role without TLS: refused by the registry's pg_hba.conf.
    b = make_cluster(settings={"snowflake_id.registry": f"{base} sslmode=disable",
                               "snowflake_id.lease_time": LEASE})
    b.create_extension()
    b.wait_for_log("could not connect to", timeout=30)
    assert not config(b)["blocks_held"]


def test_a_registry_with_a_standby_named_second_keeps_serving_after_failover(make_cluster):
    """The registry connection string names a primary and its standby
    (`target_session_attrs=read-write`). The primary stops, the standby is
    promoted: the holder connects to it, sees its new incarnation (new
    timeline), re-asserts its block and keeps making IDs, all distinct and
    increasing."""
    p = registry_server(make_cluster)
    s = make_cluster(basebackup_from=p, settings={"fsync": True})
    conninfo = (f"host={p.dir},{s.dir} port={p.port},{s.port} dbname=postgres"
                " target_session_attrs=read-write")
    a = make_cluster(settings={"snowflake_id.registry": conninfo,
                               "snowflake_id.lease_time": "20s"})
    a.create_extension()
    made = []
    with a.connect() as conn:
        made += ids(conn, 200)
        wait_until(lambda: s.scalar("SELECT count(*) FROM snowflake_lease_blocks"
                                    " WHERE holder_node IS NOT NULL") >= 1,
                   timeout=30, what="the lease replicated to the standby")
        p.stop(mode="fast")
        s.promote()
        mark = a.log_mark()
        a.wait_for_log("began a new incarnation", since=mark, timeout=60)
        made += ids(conn, 200)
    assert made == sorted(made) and len(set(made)) == len(made)
    assert s.scalar("SELECT count(*) FROM snowflake_lease_blocks"
                    " WHERE holder_node = %s", config(a)["node_id"]) >= 1


def test_one_server_leases_no_more_than_max_blocks(make_cluster):
    """Many sessions on one server (a role that opens connections) do not
    drain the fleet's blocks: the server leases at most
    `snowflake_id.max_blocks`, and its sessions share those ids. (0.3.1
    leased another block whenever a quarter of its ids were busy.)"""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.max_blocks": 2, "max_connections": 80})
    conns = [a.connect() for _ in range(60)]
    try:
        made = []
        for c in conns:
            made += ids(c, 3)
        time.sleep(3 * 0.6)   # a few renewal rounds in which it could ask for more
        for c in conns:
            made += ids(c, 3)
        assert len(set(made)) == len(made)
        held = r.scalar("SELECT count(*) FROM snowflake_lease_blocks WHERE holder_node = %s",
                        config(a)["node_id"])
        assert held <= 2, held
        assert config(a)["blocks_held"] <= 2
    finally:
        for c in conns:
            c.close()


def test_a_registry_database_every_role_may_connect_to_is_warned_about_once(make_cluster):
    """Every role that can connect to the registry's database sees the
    holders' lock keys in pg_locks and can take them: the lease worker warns
    once. With CONNECT revoked from PUBLIC, no warning."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    with a.connect() as conn:
        ids(conn, 1)
    wait_until(lambda: "every role may connect to the registry database" in a.log(),
               timeout=30, what="the warning")
    r.sql("REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
    b = holder(make_cluster, r)
    with b.connect() as conn:
        ids(conn, 1)
    assert "every role may connect" not in b.log()
    assert a.log().count("every role may connect to the registry database") == 1


LEASE_FUNCTIONS = ("snowflake_lease_hello(text)", "snowflake_lease_acquire(jsonb)",
                   "snowflake_lease_renew(jsonb)", "snowflake_lease_release(jsonb)")
# From 0.7.0: holders check each grant durable (a registry before it has no
# such function).
DURABLE_FUNCTION = "snowflake_lease_durable(jsonb)"


def lease_role(r, schema: str, usage: bool = True) -> str:
    """A login role that may call the lease functions in `schema` and
    nothing else (docs/operations/fleet.md), for a holder's conninfo."""
    r.sql("CREATE ROLE snowflake_lease LOGIN")
    if usage and schema != "public":
        r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
    functions = list(LEASE_FUNCTIONS)
    if r.scalar("SELECT to_regprocedure(%s) IS NOT NULL", f"{schema}.{DURABLE_FUNCTION}"):
        functions.append(DURABLE_FUNCTION)
    r.sql("GRANT EXECUTE ON FUNCTION "
          + ", ".join(f"{schema}.{f}" for f in functions) + " TO snowflake_lease")
    return r.conninfo(user="snowflake_lease")


@pytest.mark.not_core
def test_a_holder_leases_from_a_0_5_0_registry_and_through_its_update(make_cluster):
    """A 0.6.0 holder on a registry still on 0.5.0 (lease functions in the
    extension's schema), leasing as a role that may only execute them, finds
    them through the extension's membership; the registry's ALTER EXTENSION
    UPDATE moves them to snowflake_id_internal under the holder's open
    session: its next call fails (42883), it reconnects, finds them there
    (the update granted its role USAGE) and renews its block without a
    gap: IDs keep coming for more than two lease times."""
    r = make_cluster(settings={"fsync": True})
    with old_release("0.5.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.5.0'")
    assert lease_schema(r) == "public"
    conninfo = lease_role(r, "public")
    a = holder(make_cluster, r, **{"snowflake_id.registry": conninfo,
                                   "snowflake_id.worker_ids": "0-15"})
    with a.connect() as conn:
        before = ids(conn, 100)
    assert [row[1] for row in leases(r)] == [config(a)["node_id"]]

    with r.connect() as conn:
        warnings = []
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary))
        conn.execute("ALTER EXTENSION snowflake_id UPDATE")
        updated_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert any("snowflake_lease" in w for w in warnings), warnings
    assert lease_schema(r) == "snowflake_id_internal"
    wait_until(lambda: r.scalar("SELECT max(renewed_at) FROM snowflake_lease_blocks"
                                " WHERE holder_node IS NOT NULL") > updated_at,
               timeout=LEASE_S * 2, what="a renewal after the registry's update")
    assert "no longer in schema public" in a.log()
    made = []
    with a.connect(options="-c statement_timeout=5s") as conn:
        deadline = time.monotonic() + 2.5 * LEASE_S
        while time.monotonic() < deadline:
            made += ids(conn, 100)
            time.sleep(0.2)
    assert min(made) > max(before) and len(set(made)) == len(made)
    cfg = config(a)
    assert cfg["registry_unreachable_since"] is None and cfg["blocks_held"] == 1, cfg


@pytest.mark.not_core
def test_a_holder_leases_from_a_0_7_0_registry_and_through_its_update(make_cluster):
    """A rolling upgrade (issue 42): a holder of this build leases from a
    registry still on 0.7.0 (its lease functions in PL/pgSQL, replies
    without a token), as the lease role; the registry's ALTER EXTENSION
    UPDATE to 0.8.0 (the rules in the extension) happens under the
    holder's open session, which renews its block, and IDs keep coming for
    more than two lease times. The first call after the update starts one
    fenced incarnation: 0.7.0's row names no database, and a copy of the
    database taken before the update looks the same (only new blocks wait
    for the fence)."""
    r = make_cluster(settings={"fsync": True})
    with old_release("0.7.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.7.0'")
    r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
          " max_ahead_ms => 70000)")
    conninfo = lease_role(r, "snowflake_id_internal")
    a = holder(make_cluster, r, **{"snowflake_id.registry": conninfo,
                                   "snowflake_id.worker_ids": "0-15"})
    with a.connect() as conn:
        before = ids(conn, 100)
    assert [row[1] for row in leases(r)] == [config(a)["node_id"]]
    incarnation = r.scalar("SELECT incarnation FROM snowflake_lease_registry")

    with r.connect() as conn:
        conn.execute("ALTER EXTENSION snowflake_id UPDATE")
        updated_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert r.scalar("SELECT extversion FROM pg_extension WHERE extname = 'snowflake_id'") != "0.7.0"
    wait_until(lambda: r.scalar("SELECT max(renewed_at) FROM snowflake_lease_blocks"
                                " WHERE holder_node IS NOT NULL") > updated_at,
               timeout=LEASE_S * 2, what="a renewal after the registry's update")
    made = []
    with a.connect(options="-c statement_timeout=5s") as conn:
        deadline = time.monotonic() + 2.5 * LEASE_S
        while time.monotonic() < deadline:
            made += ids(conn, 100)
            time.sleep(0.2)
    assert min(made) > max(before) and len(set(made)) == len(made)
    now, cause, oid = r.sql("SELECT incarnation, cause, database_oid FROM snowflake_lease_registry")[0]
    assert now != incarnation and "names no database" in cause, cause
    assert oid == r.scalar("SELECT oid FROM pg_database WHERE datname = current_database()")
    cfg = config(a)
    assert cfg["registry_unreachable_since"] is None and cfg["blocks_held"] == 1, cfg


def packaged_0_7_0() -> str | None:
    """The pg_config of a copy of Debian's PostgreSQL 15 with the 0.7.0
    package unpacked into it (.cache/packages/<commit>/root15), when this
    run's server is Debian's 15: the package scripts/package-commit.sh
    builds (scripts/test.sh starts it in the background; this waits for
    it, or builds it) for the repository test. Nothing is installed on
    the host."""
    if pg_config("--bindir") != "/usr/lib/postgresql/15/bin":
        return None
    out = subprocess.check_output(
        ["bash", "-c", 'source scripts/lib.sh && echo "$PREVIOUS_RELEASE_VERSION '
                       '$PREVIOUS_RELEASE_COMMIT"'], cwd=REPO, text=True)
    version, commit = out.split()
    assert version == "0.7.0", f"the previous release is {version}: update this test"
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts/package-commit.sh"), commit, "15"],
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    deb = proc.stdout.strip().splitlines()[-1]
    root = os.path.join(os.path.dirname(os.path.dirname(deb)), "root15")
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(root, "complete")):
            shutil.rmtree(root, ignore_errors=True)
            for tree in ("usr/lib/postgresql/15", "usr/share/postgresql/15"):
                os.makedirs(os.path.dirname(os.path.join(root, tree)), exist_ok=True)
                subprocess.run(["cp", "-a", "/" + tree, os.path.join(root, tree)], check=True)
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
            open(os.path.join(root, "complete"), "w").close()
    return os.path.join(root, "usr/lib/postgresql/15/bin/pg_config")


def holder_0_7_0_bindir() -> str:
    """The bindir of a PostgreSQL where a 0.7.0 build of the extension is
    installed, for a real 0.7.0 holder: SNOWFLAKE_PG_CONFIG_0_7_0 names its
    pg_config, or, on Debian's 15, the previous release's package unpacked
    into a copy (packaged_0_7_0); no test installs it."""
    pgc = os.environ.get("SNOWFLAKE_PG_CONFIG_0_7_0") or packaged_0_7_0()
    if not pgc or not os.path.exists(pgc):
        pytest.skip("no 0.7.0 build: set SNOWFLAKE_PG_CONFIG_0_7_0 to the pg_config of one"
                    " (on Debian's 15 the previous release's package is used)")
    share = subprocess.check_output([pgc, "--sharedir"], text=True).strip()
    with open(os.path.join(share, "extension", "snowflake_id.control")) as f:
        assert "default_version = '0.7.0'" in f.read(), f"{pgc}: not a 0.7.0 build"
    return subprocess.check_output([pgc, "--bindir"], text=True).strip()


@pytest.mark.parametrize("roles", [pytest.param("superuser", marks=pytest.mark.slow),
                                   "per_server"])
def test_a_0_7_0_holder_leases_from_this_registry(make_cluster, roles):
    """A rolling upgrade (issue 42): a server of 0.7.0 (its lease worker
    sends no token) leases from a registry of this build, renews its block
    for more than two lease times in the registry's first incarnation,
    unfenced, and makes IDs throughout. per_server: as its own login role,
    with max_blocks_per_role set (docs/operations/fleet.md), which the
    registry records with its block."""
    r = registry_server(make_cluster)
    r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
          " max_ahead_ms => 70000)")
    user = grant_server_roles(r, ["a"])["a"] if roles == "per_server" else "postgres"
    incarnation = r.scalar("SELECT incarnation FROM snowflake_lease_registry")
    a = make_cluster(settings={"snowflake_id.registry": r.conninfo(user=user),
                               "snowflake_id.lease_time": LEASE,
                               "snowflake_id.worker_ids": "0-15"},
                     bindir=holder_0_7_0_bindir())
    a.create_extension()
    assert a.scalar("SELECT extversion FROM pg_extension WHERE extname = 'snowflake_id'") == "0.7.0"
    made = []
    with a.connect(options="-c statement_timeout=35s") as conn:
        made += ids(conn, 100)
        deadline = time.monotonic() + 2.5 * LEASE_S
        while time.monotonic() < deadline:
            made += ids(conn, 100)
            time.sleep(0.2)
    assert sorted(made) == made and len(set(made)) == len(made)
    assert [row[1] for row in leases(r)] == [config(a)["node_id"]]
    assert r.scalar("SELECT count(*) FROM snowflake_lease_blocks WHERE renewed_at > leased_at") == 1
    assert r.sql("SELECT DISTINCT holder_role FROM snowflake_lease_blocks") == [(user,)]
    assert r.sql("SELECT incarnation, fenced_until FROM snowflake_lease_registry") \
        == [(incarnation, None)]


def test_a_lease_role_without_usage_on_the_internal_schema_is_told_so(make_cluster):
    """On a 0.6.0 registry, a lease role with EXECUTE on the lease functions
    but no USAGE on snowflake_id_internal leases nothing, and the holder's
    log says which GRANT is missing; once granted, it leases."""
    r = registry_server(make_cluster)
    schema = lease_schema(r)
    assert schema == "snowflake_id_internal"
    conninfo = lease_role(r, schema, usage=False)
    a = holder(make_cluster, r, **{"snowflake_id.registry": conninfo})
    wait_until(lambda: "may not use schema snowflake_id_internal" in a.log(), timeout=30,
               what="the lease worker's message")
    assert f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease" in a.log()
    assert leases(r) == []
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10
    assert [row[1] for row in leases(r)] == [config(a)["node_id"]]


def test_a_lease_role_without_the_durability_check_leases_one_block_and_says_why(make_cluster):
    """On a 0.7.0 registry, a lease role granted the four functions of
    earlier releases but not snowflake_lease_durable: every grant is
    committed and its durability check refused. The holder uses none, asks
    for no other block while one waits (0.7.0 at first leased every block of
    the registry, one after the other, and reported "no free block"), and
    its log names the refused function; once granted, it leases."""
    r = registry_server(make_cluster)
    schema = lease_schema(r)
    r.sql("CREATE ROLE snowflake_lease LOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
    r.sql("GRANT EXECUTE ON FUNCTION " + ", ".join(f"{schema}.{f}" for f in LEASE_FUNCTIONS)
          + " TO snowflake_lease")
    a = holder(make_cluster, r, **{"snowflake_id.registry": r.conninfo(user="snowflake_lease")})
    wait_until(lambda: "permission denied for function snowflake_lease_durable" in a.log(),
               timeout=30, what="the refused durability check in the holder's log")
    time.sleep(2.0)   # a few rounds (renewals every 600 ms)
    assert len(leases(r)) == 1, leases(r)
    assert config(a)["blocks_held"] == 0
    r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.{DURABLE_FUNCTION} TO snowflake_lease")
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10
    assert {row[1] for row in leases(r)} == {config(a)["node_id"]}


def test_a_lease_answered_after_its_own_deadline_is_not_used(make_cluster):
    """With no block in use, an acquire waits up to the 10 s call timeout.
    When the registry answers it later than the lease time (here: a lock
    on its blocks table holds the call for about 5 s on a 2 s lease), the
    grant's deadline, counted from when the call was sent, has already
    passed: the block must not be activated (sessions could use it past
    its deadline until the worker's expire_due runs) and then revoked at
    once. Found by an adversarial review: the log showed "leased block 1"
    and "the lease of block 1 ran out" in the same millisecond."""
    import datetime
    import re
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.lease_time": "2s"})
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10
    mark = a.log_mark()
    with r.connect() as lock:
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE snowflake_lease_blocks IN ACCESS EXCLUSIVE MODE")
        time.sleep(7)
        lock.execute("COMMIT")
    with a.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=30, what="IDs again")
    log = a.log(mark)

    def at(line):
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f")

    lines = log.splitlines()
    leased = {}
    for line in lines:
        m = re.search(r"snowflake_id lease: leased block (\d+) ", line)
        if m:
            leased[m.group(1)] = at(line)
        m = re.search(r"snowflake_id lease: the lease of block (\d+) ran out", line)
        if m and m.group(1) in leased:
            assert (at(line) - leased[m.group(1)]).total_seconds() > 1.0, (
                f"block {m.group(1)} was leased (and activated) with its deadline already"
                f" past:\n{log[-3000:]}")


def test_lease_problem_stays_while_a_lock_at_the_registry_holds_the_renewals(make_cluster):
    """A lock on the registry's blocks table (EXCLUSIVE: reads and new
    sessions go on, writes wait) holds the holder's renewals: the worker
    gives each call up at its blocks' deadline, reconnects, which works,
    and renews again, which waits again. snowflake_config().lease_problem
    says so the whole time, naming a lock as a possible cause, until a
    renewal is answered; then it clears by itself. Before, each new
    session cleared it, so it read NULL for most of the stall while no ID
    could be made (found by the adversarial review of 0.7.0's deadlock
    fix)."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.lease_time": "2s"})
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10

    def problem(conn):
        return conn.execute("SELECT lease_problem FROM snowflake_config()").fetchone()[0]

    def since(conn):
        return conn.execute(
            "SELECT registry_unreachable_since FROM snowflake_config()").fetchone()[0]

    seen, seen_since = [], []
    with a.connect() as watch, r.connect() as lock:
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE snowflake_lease_blocks IN EXCLUSIVE MODE")
        try:
            wait_until(lambda: problem(watch) is not None, timeout=20,
                       what="a lease problem while the renewals wait")
            # Several deadlines and new sessions (2 s leases).
            until = time.monotonic() + 7
            while time.monotonic() < until:
                seen.append(problem(watch))
                seen_since.append(since(watch))
                time.sleep(0.05)
            e = sql_error(watch, "SELECT snowflake_nextval()")
        finally:
            lock.execute("COMMIT")
        cleared = [p for p in seen if p is None]
        assert not cleared, (f"lease_problem read NULL {len(cleared)} times of {len(seen)}"
                             f" while the renewals waited: {sorted(set(seen) - {None})}")
        # registry_unreachable_since ("since when the registry does not
        # answer") stays at the first call given up, and the sessions'
        # 55000 counts from it: before, each new session cleared it, and
        # the error said "unreachable for 0 s".
        assert None not in seen_since and len(set(seen_since)) == 1, sorted(
            set(seen_since), key=str)
        assert e.sqlstate == "55000", str(e)
        m = re.search(r"unreachable for (\d+) s", e.diag.message_primary)
        assert m and int(m.group(1)) >= 6, e.diag.message_primary
        assert any("did not answer" in p and "lock" in p and "pg_stat_activity" in p
                   for p in seen), sorted(set(seen))
        wait_until(lambda: problem(watch) is None, timeout=30,
                   what="lease_problem cleared once a renewal was answered")
        wait_until(lambda: can_make_id(watch), timeout=30, what="IDs again")


def refuse_when_flagged(r, sqlstate: str) -> None:
    """A trigger on the registry's blocks table that fails every lease call
    that writes it with `sqlstate` while the table `refuse` has a row."""
    r.sql("CREATE TABLE refuse (why text)")
    # The lease functions run with search_path = pg_catalog, pg_temp.
    r.sql(f"""CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF EXISTS (SELECT 1 FROM public.refuse) THEN
                 RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{sqlstate}';
               END IF;
               RETURN NEW;
             END $$""")
    r.sql("CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON snowflake_lease_blocks "
          "FOR EACH ROW EXECUTE FUNCTION public.refuse()")


def holder_of_a_refusing_registry(make_cluster, sqlstate: str):
    """A registry whose lease calls fail with `sqlstate` once flagged
    (`refuse_when_flagged`), and a holder of it with 2 s leases that has
    made IDs."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.lease_time": "2s"})
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10
    refuse_when_flagged(r, sqlstate)
    return r, a


def unreachable_since_and_problem(conn):
    return conn.execute("SELECT registry_unreachable_since, lease_problem "
                        "FROM snowflake_config()").fetchone()


@pytest.mark.not_core
def test_a_refusal_after_unanswered_calls_is_an_answer(make_cluster):
    """After lease calls went unanswered (a lock on the registry's blocks
    table), the registry refuses the renewals with an error of its own (a
    trigger here; a limit, a privilege in life): that is an answer.
    registry_unreachable_since clears and lease_problem names the
    refusal, while no ID can be made. Only the registry's own timeouts
    (lock_timeout, statement_timeout) are not answers. Found by the review
    of the change that keeps registry_unreachable_since through new
    sessions: it stayed set through refusals."""
    r, a = holder_of_a_refusing_registry(make_cluster, "22023")
    cfg = unreachable_since_and_problem
    with a.connect() as watch:
        with r.connect() as lock:
            lock.execute("BEGIN")
            lock.execute("LOCK TABLE snowflake_lease_blocks IN EXCLUSIVE MODE")
            try:
                wait_until(lambda: cfg(watch)[0] is not None, timeout=20,
                           what="registry_unreachable_since while the renewals wait")
                r.sql("INSERT INTO refuse VALUES ('on')")
            finally:
                lock.execute("COMMIT")
        wait_until(lambda: cfg(watch)[0] is None, timeout=20,
                   what="registry_unreachable_since cleared by a refusal")
        since, problem = cfg(watch)
        assert problem and "refused by the test" in problem, problem
        assert not can_make_id(watch), "an ID was made while every lease call was refused"
        r.sql("DELETE FROM refuse")
        wait_until(lambda: can_make_id(watch), timeout=30, what="IDs again")


def test_a_call_the_registry_times_out_is_not_answered(make_cluster):
    """A lease call the registry gives up at its lock_timeout (55P03: a
    lock held longer than 5 s, before a default 10 min lease's deadline;
    raised by a trigger here) got no answer: registry_unreachable_since is
    set and stays, lease_problem says the registry did not answer in time,
    and no ID is made once the blocks ran out; all of it clears when a
    call is answered. Before, it was an ordinary refusal: NULL, and
    sessions waited 30 s rather than 2 (found by the review of 0.7.0's
    lease answers)."""
    r, a = holder_of_a_refusing_registry(make_cluster, "55P03")
    cfg = unreachable_since_and_problem
    with a.connect() as watch:
        r.sql("INSERT INTO refuse VALUES ('on')")
        wait_until(lambda: cfg(watch)[0] is not None, timeout=20,
                   what="registry_unreachable_since after a lock timeout at the registry")
        first, problem = cfg(watch)
        assert problem and "did not answer in time" in problem \
            and "refused by the test" in problem, problem
        wait_until(lambda: not can_make_id(watch), timeout=20, what="the blocks running out")
        assert cfg(watch)[0] == first, (cfg(watch), first)
        # Said in the log as the problem, not as a refusal each round: once
        # while it stays the problem. On a loaded machine a renewal may run
        # into its blocks' lease deadline (2 s here) before the registry's
        # answer: that is another problem, logged, and the lock timeout is
        # said again when it is the problem again; never twice in a row.
        problems = [line.split("WARNING:", 1)[1] for line in a.log().splitlines()
                    if "WARNING:" in line and "snowflake_id lease:" in line
                    and "did not answer" in line]
        refusals = [w for w in problems if "refused by the test" in w]
        assert refusals and all("did not answer in time" in w for w in refusals), problems
        assert all(x != y for x, y in zip(problems, problems[1:])), problems
        r.sql("DELETE FROM refuse")
        wait_until(lambda: can_make_id(watch), timeout=30, what="IDs again")
        wait_until(lambda: cfg(watch) == (None, None), timeout=20, what="both cleared")
