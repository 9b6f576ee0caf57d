"""The benchmark servers: tests/harness.py's Cluster (start, stop, cleanup,
orphans) running a private copy of the PostgreSQL installation that holds
the build being measured."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import psycopg

from config import DIR_PREFIX, KEEP, REPO, SERVER_SETTINGS, log

sys.path.insert(0, os.path.join(REPO, "tests"))
from harness import (AS_ROOT, PG_BINDIR, PG_PKGLIBDIR, Cluster,  # noqa: E402
                     _conf_value, pg_config, pg_ids, stop_orphans)

__all__ = ["AS_ROOT", "FLOOR_FUNCTIONS", "PGEDGE", "PG_BINDIR", "PG_PKGLIBDIR", "PG_SHAREDIR", "TREE", "Server",
           "_conf_value", "build_pg_tree", "create_floor_functions", "make_tree_dir", "pg_ids", "stop_orphans"]

PG_SHAREDIR = pg_config("--sharedir")
TREE: dict = {}  # postgres, so, source: set by build_pg_tree()
# pgEdge's snowflake extension, when this PostgreSQL has it (case 6 adds its
# snowflake.nextval() then): the servers get the snowflake.node it needs.
PGEDGE = os.path.exists(os.path.join(PG_SHAREDIR, "extension", "snowflake.control"))


def build_pg_tree(root: str, pkg: str | None) -> dict:
    """A private copy of the PostgreSQL installation with this build of
    snowflake_id, so that other builds installed into the system directories
    while the benchmark runs (cargo pgrx test installs a debug build there)
    cannot change what is measured.

    PostgreSQL finds $libdir and the extension scripts relative to its own
    executable, so the tree mirrors the installation's paths under `root`:
    a copy of the postgres binary, symlinks to every other file, and copies of
    snowflake_id.so, .control and .sql taken from `pkg` (the output of
    `cargo pgrx package`) or, without it, from the installed files."""
    def src(path: str) -> str:
        return os.path.join(pkg, path.lstrip("/")) if pkg else path

    bindir, libdir = root + PG_BINDIR, root + PG_PKGLIBDIR
    sharedir, extdir = root + PG_SHAREDIR, root + PG_SHAREDIR + "/extension"
    for d in (bindir, libdir, extdir):
        os.makedirs(d, exist_ok=True)
    shutil.copy2(os.path.join(PG_BINDIR, "postgres"), bindir)
    for name in os.listdir(PG_PKGLIBDIR):
        if name != "snowflake_id.so":
            os.symlink(os.path.join(PG_PKGLIBDIR, name), os.path.join(libdir, name))
    shutil.copy2(os.path.join(src(PG_PKGLIBDIR), "snowflake_id.so"), libdir)
    for name in os.listdir(PG_SHAREDIR):
        if name != "extension":
            os.symlink(os.path.join(PG_SHAREDIR, name), os.path.join(sharedir, name))
    sys_ext = os.path.join(PG_SHAREDIR, "extension")
    for name in os.listdir(sys_ext):
        if not name.startswith("snowflake_id"):
            os.symlink(os.path.join(sys_ext, name), os.path.join(extdir, name))
    copied = [n for n in os.listdir(src(sys_ext)) if n.startswith("snowflake_id")]
    if not any(n.endswith(".sql") for n in copied):
        raise RuntimeError(f"no snowflake_id SQL script in {src(sys_ext)}")
    for name in copied:
        shutil.copy2(os.path.join(src(sys_ext), name), extdir)
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o755)
    TREE.update({"postgres": os.path.join(bindir, "postgres"),
                 "so": os.path.join(libdir, "snowflake_id.so"),
                 "source": src(PG_PKGLIBDIR),
                 "floor": build_floor(libdir)})
    return TREE


FLOOR_SOURCE = os.path.join(REPO, "bench", "floor", "bench_floor.c")
# The floor's functions (bench/floor/bench_floor.c), made in each server that
# has them: name -> what it is, for the report.
FLOOR_FUNCTIONS = ("bench_clock_ms", "bench_clock_seq")


def build_floor(libdir: str) -> bool:
    """Compiles bench/floor/bench_floor.c (case 1's floor: a C function that
    only reads the clock) into the private tree's libdir, with the compiler
    and flags PostgreSQL was built with. False (and why, in the log) when it
    cannot: case 1 then runs without the floor rows."""
    cc = pg_config("--cc").split()
    cmd = [*cc, "-O2", *pg_config("--cflags_sl").split(), "-shared",
           f"-I{pg_config('--includedir-server')}", "-o",
           os.path.join(libdir, "bench_floor.so"), FLOOR_SOURCE]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        log(f"case 1 runs without its floor rows: {' '.join(cmd)} failed: {err.strip()[:400]}")
        return False
    return True


def create_floor_functions(conn) -> None:
    """The floor's functions in the connection's database (when built)."""
    if not TREE.get("floor"):
        return
    for name in FLOOR_FUNCTIONS:
        conn.execute(f"CREATE FUNCTION {name}() RETURNS bigint VOLATILE LANGUAGE c "
                     f"AS '$libdir/bench_floor', '{name}'")


def make_tree_dir() -> str:
    """/tmp/sfbenchXXXXXX for the private tree, with the owner.pid that lets
    harness.stop_orphans() remove it when this process dies."""
    d = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp")
    with open(os.path.join(d, "owner.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    return d


class Server(Cluster):
    """A throwaway cluster in /tmp/sfbenchXXXXXX (also the socket dir),
    started from the private tree's postgres (see build_pg_tree)."""

    def __init__(self, name: str, settings: dict):
        self.name = name
        # The harness's test defaults (fsync off, 120 connections...) are
        # replaced by the benchmark's settings: fsync stays on.
        pgedge = {"snowflake.node": 1} if PGEDGE else {}
        super().__init__(preload=True, settings={"fsync": True, **SERVER_SETTINGS,
                                                 **pgedge, **settings},
                         dir_prefix=DIR_PREFIX, postgres=TREE["postgres"])

    def start(self, env: dict | None = None, timeout: int = 60, **kw) -> "Server":
        super().start(env=env, timeout=timeout, **kw)
        with open(os.path.join(self.datadir, "postmaster.pid")) as f:
            pid = int(f.readline())
        with open(f"/proc/{pid}/maps") as f:
            mapped = {line.split()[-1] for line in f if "snowflake_id" in line}
        if mapped != {TREE["so"]}:
            raise RuntimeError(f"{self.name} server mapped {mapped}, not {TREE['so']}")
        return self

    def destroy(self, keep: bool = False) -> None:
        if KEEP:
            log(f"kept {self.name} server dir {self.dir}")
        super().destroy(keep=keep or KEEP)

    def connect(self, dbname: str = "postgres", **kw) -> psycopg.Connection:
        # No server-side prepared statements: every rep plans alike.
        return super().connect(dbname=dbname, prepare_threshold=None, **kw)
