"""Fleet leases: servers lease blocks of worker ids from a registry server
(`snowflake_id.registry`), on real servers. The registry's clock rules are
in src/sql/leases.sql, the holder's in core/src/lease.rs, core/src/holder.rs and
src/workers/lease_worker/.

Lease times are short here (6 s; renewals every 600 ms) so that expiries
happen within a test; every wait is a wait_until on a condition, with
bounds far above the lease arithmetic."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import can_make_id, config, ids, lease_schema, ms_of
from helpers import LIBFAKETIME, FakeClock, server_skew
from fleet_helpers import LEASE, LEASE_S, holder, leases, registry_server


def worker_of(c, id_: int) -> int:
    return c.scalar("SELECT snowflake_worker_id(%s)", id_)


def test_two_servers_lease_disjoint_blocks_without_configuration(make_cluster):
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    b = holder(make_cluster, r)
    # The first call right after start waits for the first lease.
    with a.connect() as ca, b.connect() as cb:
        got_a, got_b = ids(ca, 2000), ids(cb, 2000)
    assert len(set(got_a) | set(got_b)) == 4000
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    wa = {worker_of(a, i) for i in got_a[:1] + got_a[-1:]}
    wb = {worker_of(b, i) for i in got_b[:1] + got_b[-1:]}
    assert not wa & wb, (wa, wb)
    ca_, cb_ = config(a), config(b)
    assert ca_["mode"] == "registry" and cb_["mode"] == "registry"
    assert ca_["blocks_held"] >= 1 and cb_["blocks_held"] >= 1
    assert ca_["node_id"] != cb_["node_id"]
    assert "dbname=postgres" in ca_["registry"]
    # The registry's view: one block each, held by live sessions, with
    # each holder's node id; blocks are 16 ids in the classic layout.
    rows = leases(r)
    holders = {row[1] for row in rows}
    assert holders == {ca_["node_id"], cb_["node_id"]}, rows
    assert all(row[3] for row in rows), rows
    blocks_a = {row[0] for row in rows if row[1] == ca_["node_id"]}
    assert {w // 16 for w in wa} <= blocks_a
    # The holder's session on the registry is visible by name.
    assert r.scalar("SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = 'snowflake_id lease'") == 2


def test_registry_setting_is_hidden_from_other_roles(make_cluster):
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    a.sql("CREATE ROLE app LOGIN")
    with a.connect(user="app") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SHOW snowflake_id.registry")
        assert conn.execute(
            "SELECT count(*) FROM pg_settings WHERE name = 'snowflake_id.registry'"
        ).fetchone()[0] == 0
        # Generating IDs needs no privilege on the registry.
        assert conn.execute("SELECT snowflake_nextval()").fetchone()[0] > 0
        # snowflake_config() shows neither where the registry is nor this
        # server's node id there (with it, a role that can reach the
        # registry could hold the node id's lock).
        cfg = conn.execute("SELECT mode, registry, node_id FROM snowflake_config()").fetchone()
        assert cfg == ("registry", None, None), cfg
    cfg = config(a)
    assert cfg["registry"] and cfg["node_id"], cfg
    # On the registry, the lease functions are not for PUBLIC (nor is the
    # schema they are in).
    r.sql("CREATE ROLE app LOGIN")
    schema = lease_schema(r)
    assert schema == "snowflake_id_internal"
    with r.connect(user="app") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT {schema}.snowflake_lease_hello('x')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM snowflake_leases")


def test_a_registry_setting_the_lease_worker_cannot_use_refuses_the_start(make_cluster):
    """An unusable connection string is refused like any bad setting, at
    start and by ALTER SYSTEM, without echoing it (it may hold a password):
    before, the server started and every snowflake_nextval() failed."""
    from harness import ClusterError
    bad = "host=127.0.0.1 port=notaport password=sekret-pw"
    c = make_cluster(start=False, settings={"snowflake_id.registry": bad})
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    assert not c.is_running()
    log = c.log(since=mark)
    line = next(l for l in log.splitlines()
                if 'FATAL:  invalid value for parameter "snowflake_id.registry"' in l)
    assert "not shown" in line, line
    assert "port" in log and "sekret-pw" not in log, log
    c.settings.pop("snowflake_id.registry")
    c.configure()
    c.start()
    with c.connect() as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            conn.execute(f"ALTER SYSTEM SET snowflake_id.registry = '{bad}'")
        assert "sekret-pw" not in str(e.value) + (e.value.diag.message_detail or "")
        assert "connection string" in (e.value.diag.message_hint or ""), str(e.value)


def test_registry_down_holders_go_on_until_the_deadline_then_55000_then_resume(make_cluster):
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    made = []
    with a.connect() as conn:
        made += ids(conn, 100)
        wait_until(lambda: config(a)["lease_deadline"] is not None, timeout=30,
                   what="a lease deadline")
        r.stop()
        stopped = time.monotonic()
        err = None
        while time.monotonic() - stopped < LEASE_S + 30:
            try:
                made += ids(conn, 10)
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                err = e
                break
            time.sleep(0.1)
        failed_after = time.monotonic() - stopped
        assert err is not None, "IDs were still made long after every lease ran out"
        # Renewals run every 600 ms, so the last deadline was at least
        # LEASE_S - 0.6 s after the stop; the error came after it.
        assert failed_after >= LEASE_S - 1.0, failed_after
        msg = err.diag.message_primary
        assert "registry" in msg and "unreachable for" in msg, msg
        assert "dbname=postgres" in msg, msg
        assert err.diag.context is None or "password" not in (err.diag.context or "")
        assert "leases ran out at" in (err.diag.message_detail or ""), err.diag.message_detail
        assert "snowflake_id.registry" in err.diag.message_hint
        cfg = config(a)
        assert cfg["registry_unreachable_since"] is not None
        assert cfg["blocks_held"] == 0
        # Back: IDs resume by themselves, above every earlier one.
        r.start()
        wait_until(lambda: can_make_id(conn), timeout=60, what="IDs after the registry returned")
        after = ids(conn, 100)
    assert min(after) > max(made)
    assert len(set(made) | set(after)) == len(made) + len(after)
    assert config(a)["registry_unreachable_since"] is None
    log = a.log()
    # (The warning that PUBLIC may connect to the registry's database is
    # not about the outage.)
    warnings = log.count("WARNING:  snowflake_id lease:") - log.count("every role may connect")
    assert 1 <= warnings <= 2, f"the outage was logged {warnings} times, not once"
    assert "is reachable again" in log



def test_restart_while_the_registry_is_down_reuses_the_leases_held(make_cluster):
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.lease_time": "60s"})
    with a.connect() as conn:
        before = ids(conn, 100)
    node = config(a)["node_id"]
    block = worker_of(a, before[0]) // 16
    r.stop()
    a.restart()
    with a.connect() as conn:
        after = ids(conn, 100)
    assert min(after) > max(before)
    cfg = config(a)
    assert cfg["node_id"] == node
    assert cfg["registry_unreachable_since"] is not None
    assert worker_of(a, after[0]) // 16 == block, "a block the server did not hold was used"
    r.start()


def test_holder_cut_off_keeps_its_blocks_until_its_deadline_then_hands_over_above(make_cluster):
    """A's registry session is terminated and A cannot log in again: its
    block (the only one both may use) goes to B only after A's lease
    expired plus the grace period, and B's IDs are all above A's."""
    r = registry_server(make_cluster)
    r.sql("CREATE ROLE lease_a LOGIN SUPERUSER")
    one_block = {"snowflake_id.worker_ids": "0-15"}
    a = make_cluster(settings={
        "snowflake_id.registry": r.conninfo(user="lease_a"),
        "snowflake_id.lease_time": LEASE, **one_block})
    a.create_extension()
    with a.connect() as conn:
        made_a = ids(conn, 500)
        r.sql("ALTER ROLE lease_a NOLOGIN")
        r.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
              " WHERE application_name = 'snowflake_id lease' AND usename = 'lease_a'")
        cut = time.monotonic()
        b = holder(make_cluster, r, **one_block)
        node_a = config(a)["node_id"]
        # Until A's deadline, A goes on and the block stays A's.
        with b.connect() as cb:
            while time.monotonic() - cut < LEASE_S - 1.5:
                made_a += ids(conn, 10)
                holders = {row[1] for row in leases(r)}
                assert holders == {node_a}, holders
                time.sleep(0.2)
            # Then A stops (its own deadline) ...
            wait_until(lambda: not can_make_id(conn), timeout=30,
                       what="A stopping at its deadline")
            # ... and B gets the block, above every ID of A.
            wait_until(lambda: can_make_id(cb), timeout=60, what="B leasing A's block")
            handed = time.monotonic() - cut
            made_b = ids(cb, 500)
    assert handed >= LEASE_S, handed
    assert min(made_b) > max(made_a)
    assert {worker_of(b, made_b[0]) // 16} == {0}
    assert {row[1] for row in leases(r)} == {config(b)["node_id"]}


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_hand_over_to_a_server_whose_clock_is_5s_behind(make_cluster):
    """B's clock is 5 s behind the registry's and behind the times of A's
    IDs: B must start above A's IDs all the same. The skew is put on the
    registry and on A (libfaketime, +5 s), and B runs on the real clock:
    libfaketime preloaded into a server reaches its client backends, but on
    Debian's PostgreSQL 15 not its background workers (the lease worker's
    marks there follow the real clock), so a holder under libfaketime would
    be skewed only in part. The registry's clock rules run in its client
    backends, and A's IDs are made in its backends: both are checked to be
    5 s ahead, and B 5 s behind them."""
    r = make_cluster(settings={"fsync": True}, start=False)
    registry_clock = FakeClock(r.dir)
    registry_clock.set("+5")
    r.start(env=registry_clock.env())
    r.create_extension()
    one_block = {"snowflake_id.worker_ids": "0-15"}
    a = holder(make_cluster, r, start=False, **one_block)
    a_clock = FakeClock(a.dir)
    a_clock.set("+5")
    a.start(env=a_clock.env())
    a.create_extension()
    with r.connect() as conn:
        assert 4 < server_skew(conn) < 6
    with a.connect() as conn:
        assert 4 < server_skew(conn) < 6
        made_a = ids(conn, 2000)
        real_ms = time.time() * 1000
    # A's IDs are ahead of the real clock, which B runs on.
    assert ms_of(max(made_a)) > real_ms + 3_000
    a.stop()
    b = holder(make_cluster, r, **one_block)
    with b.connect() as conn:
        assert abs(server_skew(conn)) < 1
        # B waits for A's lease to expire (plus grace) and for its own
        # clock to come within max_drift of A's mark.
        wait_until(lambda: can_make_id(conn), timeout=90, what="B leasing A's block")
        made_b = ids(conn, 2000)
    assert min(made_b) > max(made_a), (min(made_b), max(made_a))
    assert {worker_of(b, made_b[0]) // 16} == {0}


def _copy_of(make_cluster, a, r, lease=LEASE):
    """A pg_basebackup copy of `a` that starts as an independent server (as
    a restored backup), not as a standby."""
    copy = make_cluster(basebackup_from=a, start=False, settings={
        "snowflake_id.registry": r.conninfo(), "snowflake_id.lease_time": lease})
    os.remove(os.path.join(copy.datadir, "standby.signal"))
    return copy


def _assert_apart(a, made_a, copy, made_c):
    wa = {worker_of(a, i) // 16 for i in made_a}
    wc = {worker_of(copy, i) // 16 for i in made_c}
    assert not wa & wc, (wa, wc)
    assert len(set(made_a) | set(made_c)) == len(made_a) + len(made_c)


@pytest.mark.parametrize("keeps_identity", [False, True],
                         ids=["new directory", "same directory numbers"])
def test_copied_data_directory_takes_a_new_node_id_and_its_own_blocks(make_cluster,
                                                                      keeps_identity):
    """A pg_basebackup copy started while its original runs leases blocks
    of its own under a new node id. It knows itself a copy from its data
    directory; one that looks like its original's directory (a volume
    snapshot can keep device and inode numbers; here the copied file no
    longer says where it was written) is caught when it introduces itself:
    the node id's lock at the registry is held by the running original."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"wal_level": "replica"})
    with a.connect() as conn:
        made_a = ids(conn, 200)
        node_a = config(a)["node_id"]
        copy = _copy_of(make_cluster, a, r)
        if keeps_identity:
            path = os.path.join(copy.datadir, "snowflake_id.leases")
            with open(path) as f:
                saved = json.load(f)
            assert saved["node_id"] == node_a and saved["blocks"], saved
            del saved["data_directory"]
            with open(path, "w") as f:
                json.dump(saved, f)
        copy.start()
        with copy.connect() as cc:
            made_c = ids(cc, 200)
        made_a += ids(conn, 200)
    cfg = config(copy)
    assert cfg["node_id"] != node_a
    _assert_apart(a, made_a, copy, made_c)
    assert (("is in use by another running server" if keeps_identity
             else "was written in another data directory") in copy.log())
    assert {row[1] for row in leases(r)} == {node_a, cfg["node_id"]}


def _lease_worker_pid(c) -> int:
    with open(os.path.join(c.datadir, "postmaster.pid")) as f:
        postmaster = f.readline().strip()
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", postmaster],
                         capture_output=True, text=True).stdout
    (pid,) = [int(line.split()[0]) for line in out.splitlines() if "snowflake_id lease" in line]
    return pid


def test_a_copy_that_takes_over_the_node_id_of_a_cut_off_original_gets_other_blocks(
        make_cluster):
    """A volume snapshot of a holder (the same directory numbers, no backup
    label: it takes itself for the original) started while the registry is
    reachable and the original is cut off from it (here: the original's
    lease worker stopped, its registry session ended, while its sessions go
    on making IDs up to its marks): the node id's lock is free, so the copy
    takes over the node id. 0.6.0 then renewed the original's blocks for
    the copy while the original still used them until its deadline (issue
    30: 216,248 IDs made by both). A node's blocks now stay with the
    registry session that leased them, or one that names it as its
    previous session: the copy gets other blocks."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.lease_time": "20s", "wal_level": "replica"})
    worker = None
    with a.connect() as conn:
        made_a = ids(conn, 300)
        node_a = config(a)["node_id"]
        blocks_a = {row[0] for row in leases(r) if row[1] == node_a}
        copy = _copy_of(make_cluster, a, r, lease="20s")
        path = os.path.join(copy.datadir, "snowflake_id.leases")
        with open(path) as f:
            saved = json.load(f)
        assert saved["node_id"] == node_a and saved["blocks"], saved
        st = os.stat(copy.datadir)
        saved["data_directory"] = [st.st_dev, st.st_ino]
        with open(path, "w") as f:
            json.dump(saved, f)
        os.remove(os.path.join(copy.datadir, "backup_label"))
        # A is cut off: its lease worker stops and its registry session ends.
        worker = _lease_worker_pid(a)
        os.kill(worker, signal.SIGSTOP)
        try:
            r.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                  " WHERE application_name = 'snowflake_id lease'")
            copy.start()
            with copy.connect() as cc:
                wait_until(lambda: can_make_id(cc), timeout=60, what="IDs on the copy")
                assert config(copy)["node_id"] == node_a, "the copy took over the node id"
                made_c = ids(cc, 300)
                made_a += ids(conn, 300)
                made_c += ids(cc, 300)
        finally:
            os.kill(worker, signal.SIGCONT)
    _assert_apart(a, made_a, copy, made_c)
    blocks_c = {worker_of(copy, i) // 16 for i in made_c}
    assert not blocks_c & blocks_a, (blocks_c, blocks_a)


def test_a_copy_started_while_the_registry_is_down_uses_none_of_its_originals_leases(
        make_cluster):
    """The copy cannot ask the registry whether its original is alive: it
    knows itself a copy from its data directory, makes no ID until it has
    leases of its own, and the original goes on meanwhile."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"wal_level": "replica", "snowflake_id.lease_time": "60s"})
    with a.connect() as conn:
        made_a = ids(conn, 200)
        node_a = config(a)["node_id"]
        copy = _copy_of(make_cluster, a, r, lease="60s")
        r.stop()
        copy.start()
        with copy.connect() as cc:
            assert not can_make_id(cc), "the copy made an ID from its original's leases"
        cfg = config(copy)
        assert cfg["node_id"] != node_a and cfg["blocks_held"] == 0, cfg
        assert "was written in another data directory" in copy.log()
        made_a += ids(conn, 200)   # the original still holds its leases
        r.start()
        with copy.connect() as cc:
            wait_until(lambda: can_make_id(cc), timeout=60,
                       what="the copy leasing blocks of its own")
            made_c = ids(cc, 200)
        made_a += ids(conn, 200)
    _assert_apart(a, made_a, copy, made_c)


def _busy_on_two_blocks(a, more: int) -> list[list[int]]:
    """14 sessions on A (of 16 ids a block), so that it leases a second
    block, then `more` sessions; each makes 5 IDs. All are closed again.
    Returns each session's IDs."""
    conns = [a.connect() for _ in range(14)]
    try:
        made = [ids(c, 5) for c in conns]
        # 14 of 16 ids busy: fewer than a quarter free, so a second block.
        wait_until(lambda: config(a)["blocks_held"] == 2, timeout=30,
                   what="A leasing a second block")
        extra = [a.connect() for _ in range(more)]
        made += [ids(c, 5) for c in extra]
        conns += extra
    finally:
        for c in conns:
            c.close()
    return made


def test_ids_flow_to_where_the_sessions_are(make_cluster):
    """A busy server leases a second block and gives it back once idle;
    another server leases it at once, above every ID made under it."""
    r = registry_server(make_cluster)
    two_blocks = {"snowflake_id.worker_ids": "0-31"}
    a = holder(make_cluster, r, **two_blocks)
    made = _busy_on_two_blocks(a, 4)
    node_a = config(a)["node_id"]
    # Idle for half the lease time (at least 10 s): one block goes back.
    wait_until(lambda: config(a)["blocks_held"] == 1, timeout=60,
               what="A giving an idle block back")
    assert "gave idle block" in a.log()
    free = [row for row in r.sql("SELECT block, floor, live, registry_pid"
                                 " FROM snowflake_leases WHERE NOT leased")]
    assert len(free) == 1, free
    # The block's lock went with it, although A's session took it again at
    # every renewal while it held the block (session locks stack).
    assert free[0][2:] == (False, None), free
    assert [row[3] for row in leases(r)] == [True], leases(r)
    b = holder(make_cluster, r, **two_blocks)
    with b.connect() as cb:
        made_b = ids(cb, 100)   # no wait for A's lease time: it was given back
    assert worker_of(b, made_b[0]) // 16 == free[0][0]
    from_block = [i for batch in made for i in batch
                  if worker_of(a, i) // 16 == free[0][0]]
    assert from_block and min(made_b) > max(from_block)
    assert {row[1] for row in leases(r)} == {node_a, config(b)["node_id"]}


def test_after_a_restart_the_blocks_held_before_wait_out_their_lease(make_cluster):
    """A block belongs to the registry session that leased it (or the next
    session of the same running server, which names it). A restarted
    server cannot name its earlier session, as a copy of its data directory
    could not: the blocks it held stay leased to that session until their
    lease and grace run out, and it leases other blocks meanwhile. (0.6.0
    renewed them for the new session, as it did for a copy that took over
    the node id: tested above.)"""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"snowflake_id.worker_ids": "0-31"})
    with a.connect() as conn:
        before = ids(conn, 300)
    old_blocks = {worker_of(a, i) // 16 for i in before}
    assert len(old_blocks) == 1, old_blocks
    a.restart()
    with a.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=60, what="IDs after the restart")
        after = ids(conn, 300)
    assert {worker_of(a, i) // 16 for i in after}.isdisjoint(old_blocks)
    node = config(a)["node_id"]
    assert {row[0] for row in leases(r) if row[1] == node} == {0, 1}
    # Its old block is no longer renewed: once its lease and grace ran out,
    # the registry may lease it anew (above its mark).
    wait_until(lambda: r.scalar("SELECT expires_at + grace < now() FROM snowflake_lease_blocks"
                                " WHERE block = %s", list(old_blocks)[0]),
               timeout=LEASE_S * 3, what="the old block's lease running out")


class _CuttableProxy:
    """TCP on 127.0.0.1 to a server's unix socket. `cut()` resets the
    client's side of every connection open so far and leaves the server's
    side open and silent: the server keeps the session, as after a network
    break it did not see (a half-open connection). Later connections pass."""

    def __init__(self, server):
        self.target = os.path.join(server.dir, f".s.PGSQL.{server.port}")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open: list[dict] = []
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres"

    def _accept(self):
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.target)
            pair = {"client": client, "upstream": upstream, "cut": threading.Event()}
            with self.lock:
                self.open.append(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair):
        sel = selectors.DefaultSelector()
        sel.register(pair["client"], selectors.EVENT_READ, pair["upstream"])
        sel.register(pair["upstream"], selectors.EVENT_READ, pair["client"])
        try:
            while not (self.stopping.is_set() or pair["cut"].is_set()):
                for key, _ in sel.select(0.1):
                    data = key.fileobj.recv(65536)
                    if not data:
                        pair["client"].close()
                        pair["upstream"].close()
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            if not pair["cut"].is_set():
                pair["client"].close()
                pair["upstream"].close()

    def cut(self) -> int:
        with self.lock:
            pairs, self.open = self.open, []
        for pair in pairs:
            pair["cut"].set()
            pair["client"].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
            pair["client"].close()
            self.kept = getattr(self, "kept", []) + [pair["upstream"]]
        return len(pairs)

    def close(self):
        self.stopping.set()
        self.listener.close()
        for pair in self.open:
            pair["client"].close()
            pair["upstream"].close()
        for s in getattr(self, "kept", []):
            s.close()


def test_a_lingering_registry_session_of_its_own_is_ended_not_taken_for_a_copy(make_cluster):
    """A network break the registry does not see leaves the holder's
    session there, holding its node id's lock. The holder, reconnected,
    ends that session (it remembers its pid and start) and keeps its node
    id and blocks; it does not take itself for a copy of itself."""
    r = registry_server(make_cluster)
    proxy = _CuttableProxy(r)
    try:
        a = make_cluster(settings={"snowflake_id.registry": proxy.conninfo(),
                                   "snowflake_id.lease_time": LEASE})
        a.create_extension()
        with a.connect() as conn:
            made = ids(conn, 200)
            node_a = config(a)["node_id"]
            held = {row[0] for row in leases(r)}
            old_pid = r.scalar("SELECT pid FROM pg_stat_activity"
                               " WHERE application_name = 'snowflake_id lease'")
            assert proxy.cut() == 1
            # A's next renewal finds its connection broken and reconnects;
            # the registry still has the old session, which holds the lock.
            wait_until(lambda: "ended this server's earlier session" in a.log(),
                       timeout=30, what="A ending its lingering registry session")
            assert not r.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                old_pid)
            wait_until(lambda: [row[3] for row in leases(r)] == [True] * len(held),
                       timeout=30, what="A's blocks live again under its new session")
            made += ids(conn, 200)
        assert config(a)["node_id"] == node_a
        assert "is in use by another running server" not in a.log()
        assert {row[0] for row in leases(r)} == held
        assert {row[1] for row in leases(r)} == {node_a}
        assert {worker_of(a, i) // 16 for i in made} <= held
        assert len(set(made)) == len(made)
    finally:
        proxy.close()


def test_a_registry_session_of_its_own_that_cannot_be_ended_is_not_taken_for_a_copy(
        make_cluster):
    """The holder's own registry backend stops (SIGSTOP: a stuck backend;
    the rest of the registry answers). Its renewals get no answer; the
    holder reconnects and finds its node id's lock held by that session,
    which it remembers as its own, and pg_terminate_backend() cannot end a
    stopped process. It takes a new node id (it does not wait for that
    session), and its log says why: its own earlier session could not be
    ended. No other server has the node id, and up to 0.6.0 the log said
    one did ("is in use by another running server (this data directory is
    a copy of it, or it of this one)")."""
    r = registry_server(make_cluster)
    a = holder(make_cluster, r)
    with a.connect() as conn:
        assert len(ids(conn, 10)) == 10
        node_a = config(a)["node_id"]
        backend = r.scalar("SELECT pid FROM pg_stat_activity"
                           " WHERE application_name = 'snowflake_id lease'")
        mark = a.log_mark()
        os.kill(backend, signal.SIGSTOP)
        try:
            a.wait_for_log("this server is now node", since=mark, timeout=90)
        finally:
            os.kill(backend, signal.SIGCONT)
        log = a.log(since=mark)
        assert (f"node id {node_a} is still held on the registry by this server's own"
                f" earlier session (pid {backend}), which could not be ended") in log, log
        assert "did not exit within 5 s of pg_terminate_backend()" in log, log
        assert "in use by another running server" not in log, log
        wait_until(lambda: can_make_id(conn), timeout=60, what="IDs under the new node id")
    assert config(a)["node_id"] not in ("", node_a)


def test_a_standby_refuses_then_leases_its_own_blocks_once_promoted(make_cluster):
    r = registry_server(make_cluster)
    a = holder(make_cluster, r, **{"wal_level": "replica"})
    with a.connect() as conn:
        made_a = ids(conn, 200)
    node_a = config(a)["node_id"]
    s = make_cluster(basebackup_from=a, settings={
        "snowflake_id.registry": r.conninfo(), "snowflake_id.lease_time": LEASE})
    with s.connect() as conn:
        t = time.monotonic()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            conn.execute("SELECT snowflake_nextval()")
        assert time.monotonic() - t < 5, "the standby waited for a lease"
        assert "standby" in e.value.diag.message_primary
    s.promote()
    with s.connect() as conn:
        made_s = ids(conn, 200)
    with a.connect() as conn:
        made_a += ids(conn, 200)
    assert config(s)["node_id"] != node_a
    assert min(made_s) > max(made_a[:200]), "the promoted server is below the primary's floor"
    ws = {worker_of(s, i) // 16 for i in made_s}
    wa = {worker_of(a, i) // 16 for i in made_a}
    assert not ws & wa, (ws, wa)
    assert len(set(made_a) | set(made_s)) == len(made_a) + len(made_s)
