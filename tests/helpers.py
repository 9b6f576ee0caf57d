"""Helpers shared by tests of several folders: decoding classic IDs,
claims, client programs, the key file of public IDs, a server clock
under libfaketime (FakeClock, server_skew), an earlier release's install
script (old_release), where a registry's lease functions are
(lease_schema), and for the fleet tests a session making IDs in a thread
(Maker), whether two servers' IDs are apart (apart_problems,
assert_apart) and a server refusing TCP (hba_reject_tcp). The cluster
harness itself is tests/harness.py."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import threading
import time

import psycopg
import pytest

from harness import (AS_ROOT, PG_BINDIR, PG_MAJOR, PG_PKGLIBDIR, pg_config, pg_ids, run_pg,
                     wait_until)

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
needs_faketime = pytest.mark.skipif(LIBFAKETIME is None,
                                    reason="libfaketime not installed")
# Citus is built for Debian's PostgreSQL 15 (scripts/lib.sh ensure_deps,
# before any test starts): its tests fail on 15 when it is not installed (a
# missing install step, not a reason to skip). On another version they run
# where citus.so was installed by hand, and skip where it was not.
CITUS_SO = os.path.join(PG_PKGLIBDIR, "citus.so")
CITUS_MARKS = [
    pytest.mark.skipif(PG_MAJOR != 15 and not os.path.exists(CITUS_SO),
                       reason="Citus is built for PostgreSQL 15 only (scripts/lib.sh);"
                       f" no {CITUS_SO}"),
    pytest.mark.usefixtures("citus_installed"),  # tests/conftest.py
]


def needs_citus(test):
    """A test of a Citus cluster (CITUS_MARKS; a module's pytestmark can be
    CITUS_MARKS itself)."""
    for mark in CITUS_MARKS:
        test = mark(test)
    return test


# apt-get as every script of the project runs it (scripts/lib.sh apt_get):
# waiting for the dpkg lock another apt-get holds. Only the package test
# uses it, to install the package it tests.
APT_GET = ("apt-get", "-o", "DPkg::Lock::Timeout=600")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The install scripts of earlier releases, as generated at their release.
OLD_SCRIPTS_DIR = os.path.join(REPO, "tests", "upgrade")


def old_script(version: str) -> str:
    return os.path.join(OLD_SCRIPTS_DIR, f"snowflake_id--{version}.sql")


@contextlib.contextmanager
def old_release(version: str):
    """While in the block, `CREATE EXTENSION snowflake_id VERSION
    '<version>'` works: the release's install script (tests/upgrade/) is
    in the server's extension directory, where no build installs it. Tests
    on several pytest workers share that directory: a lock keeps one test's
    removal of the file from pulling it from under another."""
    extdir = os.path.join(pg_config("--sharedir"), "extension")
    installed = os.path.join(extdir, f"snowflake_id--{version}.sql")
    with open(os.path.join(extdir, ".snowflake_id_old_release.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            shutil.copy(old_script(version), installed)
            os.chmod(installed, 0o644)
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(installed)
            fcntl.flock(lock, fcntl.LOCK_UN)


# Where the registry's lease functions are, found as the lease worker finds
# them (src/workers/lease_worker/connection.rs): the schema of the
# extension's member snowflake_lease_begin(jsonb). The extension's schema up
# to 0.5.0, snowflake_id_internal from 0.6.0.
LEASE_SCHEMA_SQL = """
SELECT quote_ident(n.nspname)
  FROM pg_catalog.pg_depend d
  JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'
  JOIN pg_catalog.pg_proc p ON p.oid = d.objid
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE d.classid = 'pg_catalog.pg_proc'::regclass
   AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'
   AND p.proname = 'snowflake_lease_begin' AND p.pronargs = 1
   AND p.proargtypes[0] = 'pg_catalog.jsonb'::regtype
"""


def lease_schema(cluster, dbname: str = "postgres") -> "str | None":
    """The schema of the registry's lease functions on `cluster`, quoted
    (None: the extension is missing or predates 0.4.0)."""
    rows = cluster.sql(LEASE_SCHEMA_SQL, dbname=dbname)
    return rows[0][0] if rows else None


def worker_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    return (i >> sequence_bits) & ((1 << worker_bits) - 1)


def ms_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    """Unix ms of an ID of a 1 ms-tick layout with the default epoch."""
    return (i >> (sequence_bits + worker_bits)) + EPOCH_MS


def can_make_id(conn) -> bool:
    """Whether a call makes an ID now (False: 55000, e.g. no lease)."""
    try:
        conn.execute("SELECT snowflake_nextval()")
        return True
    except psycopg.errors.ObjectNotInPrerequisiteState:
        return False


def my_worker_id(conn):
    return conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]


def held_count(cluster) -> int:
    return cluster.scalar("SELECT worker_ids_held FROM snowflake_config()")


def sql_error(conn, query, params=None) -> psycopg.Error:
    """Runs `query`, which must fail; returns the error."""
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(query, params)
    return ei.value


def wait_released(cluster, worker_id: int) -> None:
    wait_until(lambda: cluster.scalar(
        "SELECT sessions = 0 FROM snowflake_workers WHERE worker_id = %s",
        worker_id), what=f"worker id {worker_id} to be released")


def faketime_env(spec: str) -> dict:
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": spec,
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_RESET": "1"}


def generate(conn, n: int) -> list[int]:
    """n IDs from one connection, one snowflake_nextval() call each, in the
    order they were made."""
    return [r[0] for r in conn.execute(
        "SELECT snowflake_nextval() FROM generate_series(1, %s) "
        "ORDER BY generate_series", (n,))]


def assert_strictly_increasing(ids, label=""):
    bad = next((k for k in range(1, len(ids)) if ids[k] <= ids[k - 1]), None)
    assert bad is None, (f"{label}: IDs not strictly increasing at {bad}: "
                         f"{ids[bad - 1]} then {ids[bad]}")


def run_client(cluster, program: str, *args, check=True, timeout=300):
    """Runs a PostgreSQL client program against the cluster as the postgres
    OS user, e.g. run_client(c, "pg_dump", "-Fc", ...)."""
    return run_pg([os.path.join(PG_BINDIR, program), "-h", cluster.dir,
                    "-p", str(cluster.port), "-U", "postgres", *args],
                   cwd=cluster.dir, check=check, timeout=timeout)


def write_key_file(cluster, text: str, name: str = "public_keys",
                   mode: int = 0o600) -> str:
    """Writes `text` (keys of public IDs) as an operator would for
    snowflake_id.public_key_file: a new file in the cluster's directory,
    owned by the server's OS user with `mode`, renamed over the old one.
    Returns its path."""
    path = os.path.join(cluster.dir, name)
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    if AS_ROOT:
        os.chown(tmp, *pg_ids())
    os.replace(tmp, path)
    return path


def keyed_cluster(make_cluster, keys: str, settings: dict | None = None,
                  **kw):
    """A started cluster with the extension, whose
    snowflake_id.public_key_file holds `keys`."""
    c = make_cluster(settings=settings, start=False, **kw)
    path = write_key_file(c, keys)
    c.configure(**{"snowflake_id.public_key_file": path})
    c.start()
    c.create_extension()
    return c


def reload_session(conn, *others) -> None:
    """pg_reload_conf() through `conn` (a superuser's), and wait until it
    and the sessions `others` have reloaded (their next statements see the
    new settings and key file)."""
    def load_time(c):
        return c.execute("SELECT pg_conf_load_time()").fetchone()[0]
    before = [(c, load_time(c)) for c in (conn, *others)]
    conn.execute("SELECT pg_reload_conf()")
    for c, t in before:
        wait_until(lambda: load_time(c) > t, what="the reload to reach the session")


class FakeClock:
    """The offset file of a server started under libfaketime
    (``FAKETIME_TIMESTAMP_FILE`` + ``FAKETIME_NO_CACHE=1``: every clock
    reading re-reads it). ``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps
    PostgreSQL's timeouts and latch waits on the real monotonic clock; the
    generator reads the (faked) realtime clock. Offsets are seconds: ``+0``,
    ``-0.05``, ``-5``, ``+600`` (``-50ms`` would be -50 *minutes*)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "faketime.rc")
        self.offset = None
        self.set("+0")

    def env(self) -> dict:
        return {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": self.path,
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_RESET": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def set(self, offset) -> tuple[float, float]:
        """Atomically switch the offset: libfaketime syntax (e.g. "-0.9"),
        or a number of seconds. Returns the real monotonic times just before
        and just after the switch: the server may see the new offset
        anywhere between them."""
        spec = offset if isinstance(offset, str) else f"{offset:+.3f}"
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(spec + "\n")
        os.chmod(tmp, 0o644)
        if AS_ROOT:
            os.chown(tmp, *pg_ids())
        before = time.monotonic()
        os.rename(tmp, self.path)
        after = time.monotonic()
        self.offset = spec
        return before, after


def server_skew(conn) -> float:
    """Seconds the server's clock is ahead of the real one."""
    t0 = time.time()
    srv = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    return srv - (t0 + time.time()) / 2


# ------------------------------------------------------------------ fleets
# Shared by the fleet tests (tests/fleet/): snowflake_config() as a dict,
# IDs in a batch, a session making IDs in a thread (Maker), whether two
# servers' IDs are apart, and a server refusing TCP from 127.0.0.1.


def config(c) -> dict:
    """`c`'s snowflake_config() row as a dict (as a superuser sees it)."""
    with c.connect() as conn:
        cur = conn.execute("SELECT * FROM snowflake_config()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def ids(conn, n: int) -> list[int]:
    """n IDs from one snowflake_nextval() query on `conn`."""
    return [r[0] for r in conn.execute(
        "SELECT snowflake_nextval() FROM generate_series(1, %s)", (n,)).fetchall()]


REFUSED = (psycopg.errors.ObjectNotInPrerequisiteState, psycopg.errors.QueryCanceled)


def unix_conninfo(c) -> str:
    """`c`'s unix socket, also when it listens on TCP too."""
    return f"host={c.dir} port={c.port} dbname=postgres user=postgres"


class Maker:
    """One session on `cluster` making IDs in batches, in a thread, until
    stop(): every ID made, and every refusal (55000, or a call that waited
    for a lease past the statement timeout)."""

    def __init__(self, cluster, batch: int = 1000, dbname: str = "postgres",
                 statement_timeout: str = "10s"):
        self.name = f"{cluster.dir} port {cluster.port}"
        self.made: list[int] = []
        self.refusals: list[psycopg.Error] = []
        self.errors: list[BaseException] = []
        self.first_at: float | None = None
        self.last_at: float | None = None   # when the last batch came back
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(cluster, batch, dbname, statement_timeout), daemon=True)
        self._thread.start()

    def _run(self, cluster, batch, dbname, statement_timeout):
        try:
            with cluster.connect(dbname=dbname,
                                 options=f"-c statement_timeout={statement_timeout}") as conn:
                self._conn = conn
                while not self._stop.is_set():
                    try:
                        got = ids(conn, batch)
                    except REFUSED as e:
                        self.refusals.append(e)
                        self._stop.wait(0.05)
                        continue
                    self.last_at = time.monotonic()
                    if self.first_at is None:
                        self.first_at = self.last_at
                    self.made.extend(got)
                    self._stop.wait(0.005)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.errors.append(e)

    def refused_with(self, sqlstate: str) -> bool:
        return any(e.sqlstate == sqlstate for e in self.refusals)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._thread.is_alive() and self._conn is not None:
            self._conn.cancel()   # a call waiting for a lease
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), f"the session on {self.name} did not stop"
        assert not self.errors, f"{self.name}: {self.errors[0]!r}"
        return self.made


def apart_problems(a_name: str, a_ids: list[int], b_name: str, b_ids: list[int]) -> list[str]:
    """What keeps two servers' IDs from being apart: IDs made by both, and
    worker ids used by both over overlapping milliseconds (a block's
    holders follow each other in time). Empty when they are apart."""
    problems = []
    both = set(a_ids) & set(b_ids)
    if both:
        problems.append(f"{len(both)} IDs made by both {a_name} and {b_name}, e.g. "
                        f"{sorted(both)[:3]} (worker id {worker_of(min(both))})")

    def spans(made):
        out: dict[int, list[int]] = {}
        for i in made:
            w, ms = worker_of(i), ms_of(i)
            lo_hi = out.setdefault(w, [ms, ms])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], ms), max(lo_hi[1], ms)
        return out

    sa, sb = spans(a_ids), spans(b_ids)
    for w in sorted(sa.keys() & sb.keys()):
        (a0, a1), (b0, b1) = sa[w], sb[w]
        if not (a1 < b0 or b1 < a0):
            problems.append(
                f"worker id {w} was used by {a_name} from {a0} to {a1} ms and by {b_name} "
                f"from {b0} to {b1} ms (Unix): {min(a1, b1) - max(a0, b0) + 1} ms in common")
    return problems


def assert_apart(a_name: str, a_ids: list[int], b_name: str, b_ids: list[int]) -> None:
    """No ID made by both, and no worker id used by both over overlapping
    milliseconds (apart_problems)."""
    problems = apart_problems(a_name, a_ids, b_name, b_ids)
    assert not problems, problems[0]


def hba_reject_tcp(c) -> None:
    """`c` refuses new connections over TCP on 127.0.0.1 (after a reload or
    start): a holder that reaches it that way is cut off, one on the unix
    socket is not."""
    path = os.path.join(c.datadir, "pg_hba.conf")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write("host all all 127.0.0.1/32 reject  # helpers.hba_reject_tcp\n" + text)


def hba_accept_tcp(c) -> None:
    path = os.path.join(c.datadir, "pg_hba.conf")
    with open(path) as f:
        lines = [l for l in f if "# helpers.hba_reject_tcp" not in l]
    with open(path, "w") as f:
        f.writelines(lines)
