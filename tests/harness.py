"""The cluster harness shared by the tests (tests/conftest.py) and the
benchmarks (bench/bench.py): throwaway PostgreSQL clusters built from the
PostgreSQL of PG_CONFIG with the snowflake_id build installed into it.

* ``Cluster``       one temporary cluster: its own dir under /tmp (which is
                    also the unix-socket dir), initdb, postgresql.conf extras,
                    start/stop/restart/reload, connect()/sql(), log access.
                    When run as root, every server-side command runs as the
                    ``postgres`` OS user (``runuser -u postgres``).
* ``wait_until``    poll a condition with a deadline (instead of sleeping).
* ``LOGICAL_REPLICATION_SETTINGS``  settings for a publisher or subscriber of
                    built-in logical replication.
* ``stop_orphans``  stop servers left running by a harness process that died.
* ``run_pg``        run a PostgreSQL program as the ``postgres`` OS user.
* ``pg_ids``        that user's (uid, gid).
* ``pg_config``     one answer of PG_CONFIG (``pg_config("--sharedir")``).
* ``free_port``     a free TCP port on 127.0.0.1.
* ``PG_CONFIG``, ``PG_BINDIR``, ``PG_PKGLIBDIR``, ``PG_MAJOR``: the
                    PostgreSQL under test; ``other_pg_bindir(major)``: another
                    version's, when this run installed the extension there.

No pytest here: the fixtures are in tests/conftest.py.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psycopg
from psycopg import sql as pgsql

PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")


def pg_config(flag: str) -> str:
    return subprocess.check_output([PG_CONFIG, flag], text=True).strip()


PG_BINDIR = pg_config("--bindir")
PG_PKGLIBDIR = pg_config("--pkglibdir")
# "PostgreSQL 18.6", or "PostgreSQL 19rc1" for a release candidate.
PG_MAJOR = int(re.match(r"\d+", pg_config("--version").split()[1]).group(0))


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
kept_dirs: "list[str]" = []


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf_value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (int, float)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def pg_ids():
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def run_pg(cmd, cwd, env=None, check=True, timeout=120):
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
    bindir    the PostgreSQL programs to use (default: PG_CONFIG's)
    initdb_args  extra initdb arguments
    dir_prefix   the /tmp directory's prefix (benchmarks use their own)
    postgres  the server program pg_ctl starts (default: bindir's), e.g. a
              private copy that loads a pinned build (bench/bench.py)
    """

    def __init__(self, preload: bool = True, settings: dict | None = None,
                 tcp: bool = False, basebackup_from: "Cluster | None" = None,
                 bindir: str | None = None, initdb_args: tuple = (),
                 dir_prefix: str = DIR_PREFIX, postgres: str | None = None):
        self.bindir = bindir or PG_BINDIR
        self.postgres = postgres
        self.preload = preload
        self.tcp = tcp
        self.settings: dict = {}
        self.dir = tempfile.mkdtemp(prefix=dir_prefix, dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.datadir = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        self.port = free_port()
        self.running = False
        self.start_env: dict = {}
        # Lets a later pytest run stop servers whose harness process died.
        with open(os.path.join(self.dir, "owner.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        if AS_ROOT:
            uid, gid = pg_ids()
            os.chown(self.dir, uid, gid)
        if basebackup_from is not None:
            # postgresql.conf (with its include of harness.conf) is copied.
            run_pg([os.path.join(self.bindir, "pg_basebackup"),
                    "-D", self.datadir, "-R", "-X", "stream",
                    "-c", "fast", "--no-sync",
                    "-h", basebackup_from.dir, "-p", basebackup_from.port,
                    "-U", "postgres"], cwd=self.dir)
        else:
            run_pg([os.path.join(self.bindir, "initdb"), "-D", self.datadir,
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
            os.chown(path, *pg_ids())

    # ---------------------------------------------------------- control
    def _pg_ctl(self, *args, env=None, check=True, timeout=120, prefix=()):
        return run_pg([*prefix, os.path.join(self.bindir, "pg_ctl"), "-D",
                       self.datadir, *args], cwd=self.dir, env=env,
                      check=check, timeout=timeout)

    def start(self, env: dict | None = None, timeout: int = 60,
              address_space: int | None = None,
              options: str | None = None) -> "Cluster":
        """Start and wait until it accepts connections.

        env: extra environment for the server process (e.g. LD_PRELOAD and
        FAKETIME for libfaketime). None reuses the previous start's env.
        address_space: a limit in bytes (RLIMIT_AS, as ``ulimit -v``) for
        the server and every process it starts, for this start only.
        options: extra command-line options for the server (pg_ctl -o),
        e.g. "-b" for binary-upgrade mode, for this start only.
        """
        if env is not None:
            self.start_env = dict(env)
        prefix = () if address_space is None else \
            ("prlimit", f"--as={address_space}", "--")
        for attempt in range(3):
            mark = self.log_mark()
            proc = self._pg_ctl("-l", self.logfile, "-w", "-t", str(timeout),
                                *(("-o", options) if options else ()),
                                *(("-p", self.postgres) if self.postgres else ()),
                                "start", env=self.start_env, check=False,
                                timeout=timeout + 30, prefix=prefix)
            if proc.returncode == 0:
                self.running = True
                _live_clusters.add(self)
                return self
            new_log = self.log(since=mark)
            if self.tcp and "could not bind" in new_log and attempt < 2:
                self.port = free_port()  # lost a port race: try another
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
        """Reload the configuration and wait until the postmaster has read
        it (a new connection's pg_conf_load_time() moves), so that the next
        statement of a test sees it. pg_ctl reload only sends the signal:
        two reloads in a row could otherwise be read as one."""
        try:
            before = self.scalar("SELECT pg_conf_load_time()")
        except Exception:  # noqa: BLE001 - not accepting connections: just signal
            before = None
        self._pg_ctl("reload")
        if before is not None:
            wait_until(lambda: self.scalar("SELECT pg_conf_load_time()") > before,
                       what="the reload to be read")

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
            kept_dirs.append(self.dir)
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


def _postmaster_of(datadir: str) -> bool:
    """Whether the pid in datadir's postmaster.pid is a server running in
    it (its working directory). A server killed leaves the file behind,
    and its pid, reused since, may be another test's postmaster: pg_ctl
    stop would shut that one down (seen: a test's server stopped
    "immediate" by another pytest run's start)."""
    try:
        with open(os.path.join(datadir, "postmaster.pid")) as f:
            pid = int(f.readline().strip())
        return os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(datadir)
    except (OSError, ValueError):
        return False


def stop_orphans(dir_prefix: str = DIR_PREFIX, remove: bool = False) -> None:
    """Stop servers left running by an earlier harness process that died
    (and remove their directories if `remove`)."""
    for owner in glob.glob(f"/tmp/{dir_prefix}*/owner.pid"):
        d = os.path.dirname(owner)
        try:
            pid = int(open(owner).read().strip())
        except (OSError, ValueError):
            continue
        datadir = os.path.join(d, "data")
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if _postmaster_of(datadir):
            run_pg([os.path.join(PG_BINDIR, "pg_ctl"), "-D", datadir, "-m",
                    "immediate", "-w", "stop"], cwd="/", check=False)
        if remove:
            shutil.rmtree(d, ignore_errors=True)
