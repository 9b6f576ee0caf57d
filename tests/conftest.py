"""Integration-test harness for the snowflake_id PostgreSQL extension.

Each test gets throwaway PostgreSQL clusters built from the system
PostgreSQL 15 binaries (PG_CONFIG, default /usr/lib/postgresql/15/bin/pg_config)
and the snowflake_id build installed into them (`cargo pgrx install`).

* ``Cluster``       one temporary cluster: its own dir under /tmp (which is
                    also the unix-socket dir), initdb, postgresql.conf extras,
                    start/stop/restart/reload, connect()/sql(), log access.
                    When the tests run as root, every server-side command runs
                    as the ``postgres`` OS user (``runuser -u postgres``).
* ``cluster``       fixture: a started cluster with the library preloaded
                    and ``CREATE EXTENSION snowflake_id`` done in db postgres.
* ``make_cluster``  fixture: factory ``make_cluster(**kw)`` for special
                    configurations (preload=False, extra settings, env...,
                    or ``basebackup_from=primary`` for a physical standby).
* ``LOGICAL_REPLICATION_SETTINGS``  settings for a publisher or subscriber of
                    built-in logical replication.

Clusters are always stopped at the end of their test (fixture finalizer, with
an atexit ``-m immediate`` fallback). Their directory is removed when the test
passed and kept (path printed, log tail shown) when it failed.

Tests marked ``@pytest.mark.slow`` are skipped unless SNOWFLAKE_SLOW=1.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest
from psycopg import sql as pgsql

PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")


def _pg_config(flag: str) -> str:
    return subprocess.check_output([PG_CONFIG, flag], text=True).strip()


PG_BINDIR = _pg_config("--bindir")
PG_PKGLIBDIR = _pg_config("--pkglibdir")
PG_MAJOR = int(_pg_config("--version").split()[1].split(".")[0])


def other_pg_bindir(major: int) -> "str | None":
    """The bindir of PostgreSQL `major` when this test run also installed
    the extension there (scripts/test.sh exports SNOWFLAKE_PG_CONFIG_NN for
    every version it tests), else None."""
    pgc = os.environ.get(f"SNOWFLAKE_PG_CONFIG_{major}")
    if not pgc or not os.path.exists(pgc):
        return None
    bindir = subprocess.check_output([pgc, "--bindir"], text=True).strip()
    pkglibdir = subprocess.check_output([pgc, "--pkglibdir"], text=True).strip()
    return bindir if os.path.exists(os.path.join(pkglibdir, "snowflake_id.so")) else None
EXTENSION = "snowflake_id"
EXTENSION_SO = os.path.join(PG_PKGLIBDIR, f"{EXTENSION}.so")

AS_ROOT = os.geteuid() == 0
DIR_PREFIX = "sfpy"  # /tmp/sfpyXXXXXXXX: short, it is also the socket dir

_live_clusters: "set[Cluster]" = set()
_kept_dirs: "list[str]" = []


def wait_until(predicate, timeout: float = 30.0, what: str = "condition",
               interval: float = 0.05):
    """Polls predicate() until it returns something truthy, and returns it;
    fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class ClusterError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf_value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (int, float)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def _pg_ids():
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def _run_pg(cmd, cwd, env=None, check=True, timeout=120):
    """Run a PostgreSQL binary as the postgres OS user (when we are root).

    ``env`` entries are applied with env(1) *after* switching user, so e.g.
    LD_PRELOAD only affects the PostgreSQL program, not runuser.
    """
    cmd = [str(c) for c in cmd]
    if env:
        cmd = ["env"] + [f"{k}={v}" for k, v in env.items()] + cmd
    if AS_ROOT:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    proc = subprocess.run(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise ClusterError(
            f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return proc


# Enough for a server that publishes to, or subscribes from, a few others
# with built-in logical replication (pass as / merge into ``settings``).
LOGICAL_REPLICATION_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": 10,
    "max_wal_senders": 10,
    "max_logical_replication_workers": 8,
    "max_worker_processes": 16,
}


class Cluster:
    """A throwaway PostgreSQL cluster in /tmp/sfpyXXXXXXXX.

    Layout: ``<dir>/data`` (PGDATA), ``<dir>/server.log``, ``<dir>/.s.PGSQL.<port>``.

    preload   put snowflake_id in shared_preload_libraries (default True)
    settings  dict of extra postgresql.conf settings (override the defaults)
    tcp       also listen on 127.0.0.1:<port> (default: unix socket only)
    basebackup_from
              a running Cluster: instead of initdb, copy its data directory
              with ``pg_basebackup -R`` (a physical standby of it, with
              standby.signal and primary_conninfo). Only this cluster's own
              harness settings apply (the copied harness.conf is rewritten).
    """

    def __init__(self, preload: bool = True, settings: dict | None = None,
                 tcp: bool = False, basebackup_from: "Cluster | None" = None,
                 bindir: str | None = None, initdb_args: tuple = ()):
        self.bindir = bindir or PG_BINDIR
        self.preload = preload
        self.tcp = tcp
        self.settings: dict = {}
        self.dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.datadir = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        self.port = _free_port()
        self.running = False
        self.start_env: dict = {}
        # Lets a later pytest run stop servers whose harness process died.
        with open(os.path.join(self.dir, "owner.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        if AS_ROOT:
            uid, gid = _pg_ids()
            os.chown(self.dir, uid, gid)
        if basebackup_from is not None:
            # postgresql.conf (with its include of harness.conf) is copied.
            _run_pg([os.path.join(self.bindir, "pg_basebackup"),
                     "-D", self.datadir, "-R", "-X", "stream",
                     "-c", "fast", "--no-sync",
                     "-h", basebackup_from.dir, "-p", basebackup_from.port,
                     "-U", "postgres"], cwd=self.dir)
        else:
            _run_pg([os.path.join(self.bindir, "initdb"), "-D", self.datadir,
                     "-A", "trust", "-U", "postgres", "-E", "UTF8",
                     "--locale=C.UTF-8", "--no-sync", "--no-instructions",
                     *initdb_args],
                    cwd=self.dir)
            with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
                f.write("\n# test harness settings\ninclude 'harness.conf'\n")
        self.configure(**(settings or {}))

    # ----------------------------------------------------------- config
    def base_settings(self) -> dict:
        s = {
            "port": self.port,
            "unix_socket_directories": self.dir,
            "listen_addresses": "127.0.0.1" if self.tcp else "",
            "max_connections": 120,
            "fsync": False,
            "logging_collector": False,
            "log_line_prefix": "%m [%p] %q%u@%d ",
        }
        if self.preload:
            s["shared_preload_libraries"] = EXTENSION
        return s

    def configure(self, **settings) -> None:
        """Merge settings into <datadir>/harness.conf (takes effect on the
        next start/restart, or reload() for reloadable GUCs)."""
        self.settings.update(settings)
        merged = {**self.base_settings(), **self.settings}
        path = os.path.join(self.datadir, "harness.conf")
        with open(path, "w") as f:
            for k, v in merged.items():
                f.write(f"{k} = {_conf_value(v)}\n")
        if AS_ROOT:
            os.chown(path, *_pg_ids())

    # ---------------------------------------------------------- control
    def _pg_ctl(self, *args, env=None, check=True, timeout=120):
        return _run_pg([os.path.join(self.bindir, "pg_ctl"), "-D", self.datadir,
                        *args], cwd=self.dir, env=env, check=check,
                       timeout=timeout)

    def start(self, env: dict | None = None, timeout: int = 60) -> "Cluster":
        """Start and wait until it accepts connections.

        env: extra environment for the server process (e.g. LD_PRELOAD and
        FAKETIME for libfaketime). None reuses the previous start's env.
        """
        if env is not None:
            self.start_env = dict(env)
        for attempt in range(3):
            mark = self.log_mark()
            proc = self._pg_ctl("-l", self.logfile, "-w", "-t", str(timeout),
                                "start", env=self.start_env, check=False,
                                timeout=timeout + 30)
            if proc.returncode == 0:
                self.running = True
                _live_clusters.add(self)
                return self
            new_log = self.log(since=mark)
            if self.tcp and "could not bind" in new_log and attempt < 2:
                self.port = _free_port()  # lost a port race: try another
                self.configure()
                continue
            raise ClusterError(
                f"pg_ctl start failed (exit {proc.returncode}) in {self.dir}\n"
                f"{proc.stdout}{proc.stderr}\n--- server log ---\n{new_log}")
        raise AssertionError("unreachable")

    def stop(self, mode: str = "fast", timeout: int = 60) -> None:
        if not self.is_running():
            self.running = False
            _live_clusters.discard(self)
            return
        proc = self._pg_ctl("-m", mode, "-w", "-t", str(timeout), "stop",
                            check=False, timeout=timeout + 30)
        if proc.returncode != 0 and mode != "immediate":
            self._pg_ctl("-m", "immediate", "-w", "stop", check=False)
        if self.is_running():
            raise ClusterError(f"could not stop cluster in {self.dir}:\n"
                               f"{proc.stdout}{proc.stderr}")
        self.running = False
        _live_clusters.discard(self)

    def restart(self, mode: str = "fast", env: dict | None = None) -> "Cluster":
        self.stop(mode=mode)
        return self.start(env=env)

    def reload(self) -> None:
        self._pg_ctl("reload")

    def promote(self, timeout: int = 60) -> None:
        """Promote a standby and wait until it accepts writes."""
        self._pg_ctl("-w", "-t", str(timeout), "promote", timeout=timeout + 30)

    def is_running(self) -> bool:
        if not os.path.exists(os.path.join(self.datadir, "postmaster.pid")):
            return False
        return self._pg_ctl("status", check=False).returncode == 0

    def destroy(self, keep: bool = False) -> None:
        """Stop (immediate if fast fails) and remove the dir unless keep."""
        try:
            self.stop(mode="fast")
        except Exception:
            self.stop(mode="immediate")
        if keep:
            _kept_dirs.append(self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.destroy(keep=exc_type is not None)

    def __repr__(self):
        return f"<Cluster {self.dir} port={self.port} running={self.running}>"

    # -------------------------------------------------------------- sql
    def connect(self, dbname: str = "postgres", user: str = "postgres",
                autocommit: bool = True, **kw) -> psycopg.Connection:
        return psycopg.connect(host=self.dir, port=self.port, dbname=dbname,
                               user=user, autocommit=autocommit,
                               connect_timeout=30, **kw)

    def sql(self, query, *args, dbname: str = "postgres"):
        """Run one statement on a fresh autocommit connection; returns the
        list of rows (tuples), or None for statements without a result."""
        with self.connect(dbname=dbname) as conn:
            cur = conn.execute(query, args or None)
            return cur.fetchall() if cur.description is not None else None

    def scalar(self, query, *args, dbname: str = "postgres"):
        rows = self.sql(query, *args, dbname=dbname)
        return rows[0][0]

    def conninfo(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A libpq connection string for this server, as another server
        (e.g. a subscriber) would use it: TCP on 127.0.0.1 when the cluster
        listens there, else its unix socket."""
        host = "127.0.0.1" if self.tcp else self.dir
        return f"host={host} port={self.port} dbname={dbname} user={user}"

    def create_db(self, name: str) -> None:
        self.sql(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))

    def create_extension(self, dbname: str = "postgres") -> None:
        self.sql(f"CREATE EXTENSION {EXTENSION}", dbname=dbname)

    # -------------------------------------------------------------- log
    def log_mark(self) -> int:
        """Current size of the server log, for log(since=mark)."""
        try:
            return os.path.getsize(self.logfile)
        except FileNotFoundError:
            return 0

    def log(self, since: int = 0) -> str:
        try:
            with open(self.logfile, "rb") as f:
                f.seek(since)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, since: int = 0,
                     timeout: float = 30.0) -> re.Match:
        """Wait until regex `pattern` appears in the log after `since`."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log(since=since))
            if m:
                return m
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern!r} not in server log of {self.dir}")
            time.sleep(0.05)


# ------------------------------------------------------------------ safety nets
@atexit.register
def _stop_leftover_clusters():
    for c in list(_live_clusters):
        try:
            c.stop(mode="immediate")
            print(f"[harness] stopped leftover cluster, kept {c.dir}",
                  file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - best effort at exit
            print(f"[harness] could not stop {c.dir}: {e}", file=sys.stderr)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_orphans() -> None:
    """Stop servers left running by an earlier harness process that died."""
    for owner in glob.glob(f"/tmp/{DIR_PREFIX}*/owner.pid"):
        d = os.path.dirname(owner)
        try:
            pid = int(open(owner).read().strip())
        except (OSError, ValueError):
            continue
        datadir = os.path.join(d, "data")
        if pid == os.getpid() or _pid_alive(pid) or \
                not os.path.exists(os.path.join(datadir, "postmaster.pid")):
            continue
        _run_pg([os.path.join(PG_BINDIR, "pg_ctl"), "-D", datadir, "-m",
                 "immediate", "-w", "stop"], cwd="/", check=False)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # SIGTERM (e.g. a CI timeout) -> KeyboardInterrupt, so that fixture
    # finalizers / atexit still stop the clusters.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def pytest_sessionstart(session):
    _stop_orphans()


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SNOWFLAKE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set SNOWFLAKE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def pytest_terminal_summary(terminalreporter):
    if _kept_dirs:
        terminalreporter.write_line(
            "cluster dirs kept for failed tests: " + " ".join(_kept_dirs))


def _test_failed(node) -> bool:
    """True if setup or the test itself failed, or the test never finished
    (interrupted): then its clusters' dirs are kept for inspection."""
    call = getattr(node, "rep_call", None)
    return call is None or call.failed


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def make_cluster(request):
    """Factory: make_cluster(preload=True, settings=None, tcp=False,
    start=True, env=None, create_extension=False, basebackup_from=None)
    -> Cluster.

    All clusters made are stopped at the end of the test; their dirs are
    removed if the test passed, kept (and the log tail printed) if not."""
    made: list[Cluster] = []

    def factory(preload: bool = True, settings: dict | None = None,
                tcp: bool = False, start: bool = True, env: dict | None = None,
                create_extension: bool = False,
                basebackup_from: Cluster | None = None,
                bindir: str | None = None, initdb_args: tuple = ()) -> Cluster:
        if (preload or create_extension) and not os.path.exists(EXTENSION_SO):
            pytest.fail(f"{EXTENSION_SO} not found: install the extension "
                        "first (cargo pgrx install --release --pg-config "
                        f"{PG_CONFIG})")
        c = Cluster(preload=preload, settings=settings, tcp=tcp,
                    basebackup_from=basebackup_from, bindir=bindir,
                    initdb_args=initdb_args)
        made.append(c)
        if start:
            c.start(env=env)
            if create_extension:
                c.create_extension()
        return c

    yield factory

    failed = _test_failed(request.node)
    errors = []
    for c in made:
        if failed:
            tail = "\n".join(c.log().splitlines()[-60:])
            print(f"\n--- {c.dir}/server.log (tail) ---\n{tail}",
                  file=sys.stderr)
        try:
            c.destroy(keep=failed)
        except Exception as e:  # noqa: BLE001 - report after all are stopped
            errors.append(e)
    if failed:
        print("kept cluster dirs: " + " ".join(c.dir for c in made),
              file=sys.stderr)
    if errors:
        raise errors[0]


@pytest.fixture
def cluster(make_cluster) -> Cluster:
    """A started cluster, snowflake_id preloaded, extension created in db
    postgres."""
    return make_cluster(create_extension=True)
