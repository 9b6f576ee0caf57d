"""Self-tests of the Cluster harness (harness.py). They use plain clusters
without snowflake_id, so they also run before the extension is installed."""

import datetime as dt
import glob
import os
import shutil

import pytest

from harness import Cluster, stop_orphans

LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


def _postmaster_environ(c: Cluster) -> dict:
    with open(os.path.join(c.datadir, "postmaster.pid")) as f:
        pid = int(f.readline())
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def test_plain_cluster_lifecycle(make_cluster):
    c = make_cluster(preload=False, settings={"work_mem": "7MB"})
    assert c.scalar("SELECT 1") == 1
    assert c.scalar("SHOW work_mem") == "7MB"
    assert int(c.scalar("SHOW max_connections")) >= 100
    assert c.scalar("SHOW shared_preload_libraries") == ""
    assert c.scalar("SHOW unix_socket_directories") == c.dir
    assert c.scalar("SELECT current_user") == "postgres"

    c.create_db("other")
    assert c.scalar("SELECT current_database()", dbname="other") == "other"

    mark = c.log_mark()
    c.restart(mode="immediate")
    c.wait_for_log(r"database system is ready to accept connections", since=mark)
    assert c.scalar("SELECT 2") == 2

    c.configure(work_mem="9MB")
    c.reload()
    with c.connect() as conn:
        assert conn.execute("SHOW work_mem").fetchone()[0] == "9MB"

    c.stop()
    assert not c.is_running()


def test_start_env_reaches_server(make_cluster):
    c = make_cluster(preload=False, env={"SNOWFLAKE_HARNESS_PROBE": "42"})
    assert _postmaster_environ(c).get("SNOWFLAKE_HARNESS_PROBE") == "42"
    c.restart()  # env=None: the previous env is reused
    assert _postmaster_environ(c).get("SNOWFLAKE_HARNESS_PROBE") == "42"


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_server_under_libfaketime(make_cluster):
    c = make_cluster(preload=False, env={"LD_PRELOAD": LIBFAKETIME,
                                         "FAKETIME": "+400d"})
    now = c.scalar("SELECT now()")
    delta = now - dt.datetime.now(dt.timezone.utc)
    assert dt.timedelta(days=399) < delta < dt.timedelta(days=401), delta


def test_tcp_listen(make_cluster):
    c = make_cluster(preload=False, tcp=True)
    import psycopg
    with psycopg.connect(host="127.0.0.1", port=c.port, user="postgres",
                         dbname="postgres") as conn:
        assert conn.execute("SELECT 3").fetchone()[0] == 3


def test_an_orphan_whose_pid_was_reused_is_left_alone(make_cluster, tmp_path):
    """A dead harness's directory whose postmaster.pid names a pid now used
    by another test's server: stop_orphans must not shut that server down
    (pg_ctl stop signals whatever the file names)."""
    live = make_cluster()
    pid = int(open(os.path.join(live.datadir, "postmaster.pid")).readline())
    prefix = f"sfpyorphan{os.getpid()}_"
    stale = f"/tmp/{prefix}x"
    os.makedirs(os.path.join(stale, "data"))
    try:
        with open(os.path.join(stale, "owner.pid"), "w") as f:
            f.write("999999999\n")   # above pid_max: dead
        with open(os.path.join(stale, "data", "postmaster.pid"), "w") as f:
            f.write(f"{pid}\n{stale}/data\n")
        shutil.copy(os.path.join(live.datadir, "PG_VERSION"), os.path.join(stale, "data"))
        for d, _, files in os.walk(stale):
            for name in [d, *(os.path.join(d, f) for f in files)]:
                shutil.chown(name, "postgres", "postgres")
        stop_orphans(prefix, remove=True)
        assert live.is_running() and live.scalar("SELECT 1") == 1
        assert not os.path.exists(stale)
    finally:
        shutil.rmtree(stale, ignore_errors=True)
