"""pgbouncer (Debian's package) in front of a real server: how many worker
ids a pooler holds in transaction and session mode, idle server
connections, server_idle_timeout, and whether pg_locks shows every claim
after the pooler's DISCARD ALL."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading

import psycopg
import pytest

from harness import AS_ROOT, free_port, pg_ids, wait_until
from clients.support import require_clients, module_server

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
CLAIM_LOCKS = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = 0 "
               "AND classid = 1397641047 AND objsubid = 3")


@pytest.fixture(scope="module")
def server(request):
    require_clients()
    yield from module_server(request)


class Bouncer:
    """A pgbouncer on 127.0.0.1 in front of `server`'s db postgres."""

    def __init__(self, server, **settings):
        self.dir = tempfile.mkdtemp(prefix="sfpgb", dir="/tmp")
        self.port = free_port()
        conf = {"listen_addr": "127.0.0.1", "listen_port": self.port, "unix_socket_dir": "",
                "auth_type": "any", "max_client_conn": 200, "logfile":
                os.path.join(self.dir, "pgbouncer.log"), **settings}
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(ini, "w") as f:
            f.write("[databases]\n")
            f.write(f"postgres = host={server.dir} port={server.port} dbname=postgres "
                    "user=postgres\n[pgbouncer]\n")
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        cmd = [PGBOUNCER, ini]
        if AS_ROOT:  # pgbouncer refuses to run as root: it switches itself
            os.chown(self.dir, *pg_ids())
            os.chown(ini, *pg_ids())
            cmd = [PGBOUNCER, "-u", "postgres", ini]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        wait_until(self._accepts, timeout=30, what="pgbouncer to accept connections")

    def _accepts(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {self.log()}")
        try:
            self.connect().close()
            return True
        except psycopg.OperationalError:
            return False

    def connect(self) -> psycopg.Connection:
        # prepare_threshold=None: pgbouncer 1.18 in transaction mode does not
        # keep prepared statements.
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname="postgres",
                               user="postgres", autocommit=True, prepare_threshold=None,
                               connect_timeout=30)

    def log(self) -> str:
        try:
            return open(os.path.join(self.dir, "pgbouncer.log")).read()[-3000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def bouncer(server):
    made = []

    def factory(**settings):
        b = Bouncer(server, **settings)
        made.append(b)
        return b
    yield factory
    for b in made:
        b.stop()
    # Server connections close with pgbouncer: their worker ids come back.
    wait_until(lambda: held(server) == 0, timeout=60, what="worker ids released")


def held(server) -> int:
    return server.scalar("SELECT worker_ids_held FROM snowflake_config()")


def pooled_backends(server) -> int:
    """Server connections (backends) other than the harness's own."""
    return server.scalar("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                         "'client backend' AND pid <> pg_backend_pid()")


def make_ids(bouncer, clients: int, per_client: int) -> list[int]:
    ids: list[int] = []
    lock = threading.Lock()
    errors = []
    conns = [bouncer.connect() for _ in range(clients)]

    def work(conn):
        try:
            got = [conn.execute("SELECT snowflake_nextval()").fetchone()[0]
                   for _ in range(per_client)]
            with lock:
                ids.extend(got)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    assert errors == []
    return ids


def test_transaction_mode_holds_one_worker_id_per_server_connection(server, bouncer):
    b = bouncer(pool_mode="transaction", default_pool_size=3)
    ids = make_ids(b, clients=12, per_client=50)
    assert len(ids) == 600 and len(set(ids)) == 600
    # 12 clients, but only the pool's server connections hold worker ids.
    backends = pooled_backends(server)
    assert 1 <= backends <= 3
    assert held(server) == backends
    assert server.scalar(CLAIM_LOCKS) == held(server)


def test_session_mode_idle_server_connections_keep_their_ids(server, bouncer):
    b = bouncer(pool_mode="session", default_pool_size=20, server_reset_query="DISCARD ALL")
    ids = make_ids(b, clients=6, per_client=20)
    assert len(set(ids)) == 120
    # The clients are gone; their server connections stay open, idle in
    # the pool (server_idle_timeout, 600 s by default), holding the ids.
    assert pooled_backends(server) == 6
    assert held(server) == 6


def test_session_mode_pg_locks_counts_every_claim_after_discard_all(server, bouncer):
    b = bouncer(pool_mode="session", default_pool_size=20, server_reset_query="DISCARD ALL")
    make_ids(b, clients=4, per_client=5)
    assert held(server) == 4
    assert server.scalar(CLAIM_LOCKS) == 4


def test_server_idle_timeout_gives_ids_back(server, bouncer):
    b = bouncer(pool_mode="session", default_pool_size=20, server_idle_timeout=1)
    make_ids(b, clients=5, per_client=5)
    # pgbouncer closes the idle server connections; their ids are free again.
    wait_until(lambda: held(server) == 0, timeout=60, what="idle server connections closed")
    assert pooled_backends(server) == 0
