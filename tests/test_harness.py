"""Self-tests of the Cluster harness (harness.py). They use plain clusters
without snowflake_id, so they also run before the extension is installed."""

import datetime as dt
import glob
import os

import pytest

from harness import Cluster

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
