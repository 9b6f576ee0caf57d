"""The worker registry table: kept by a background worker, durable across
restarts, dumped with the database, and closed to ordinary roles."""

import os

import psycopg
import pytest

from conftest import PG_BINDIR, wait_until


def registry(cluster, dbname="postgres"):
    return cluster.sql(
        "SELECT worker_id, pid, database, role, application_name, claims, ids_issued,"
        " high_water IS NOT NULL, released_at IS NOT NULL"
        " FROM snowflake_worker_registry ORDER BY worker_id", dbname=dbname)


def test_registry_records_holders_and_survives_restart(cluster):
    with cluster.connect(application_name="billing") as a, \
            cluster.connect(application_name="shipping") as b:
        wa = a.execute("SELECT (snowflake_decode(snowflake_nextval())).worker_id").fetchone()[0]
        wb = b.execute("SELECT (snowflake_decode(snowflake_nextval())).worker_id").fetchone()[0]
        pa = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        rows = wait_until(lambda: [r for r in registry(cluster) if r[1] is not None] if len(
            [r for r in registry(cluster) if r[1] is not None]) == 2 else None)
        by_worker = {r[0]: r for r in rows}
        assert by_worker[wa][1] == pa
        assert by_worker[wa][2:5] == ("postgres", "postgres", "billing")
        assert by_worker[wb][4] == "shipping"
    # After the holders exit, the rows stay, marked released, with the holder kept.
    rows = wait_until(lambda: (lambda r: r if all(x[8] for x in r) else None)(registry(cluster)))
    assert {r[4] for r in rows} == {"billing", "shipping"}
    assert all(r[1] is None and r[7] for r in rows)

    cluster.restart(mode="immediate")
    rows = registry(cluster)
    assert {r[4] for r in rows} == {"billing", "shipping"}, "registry lost at restart"


def test_registry_is_closed_to_ordinary_roles(cluster):
    cluster.sql("CREATE ROLE app LOGIN")
    with cluster.connect(user="app") as conn:
        for stmt in ("SELECT * FROM snowflake_worker_registry",
                     "INSERT INTO snowflake_worker_registry (worker_id) VALUES (1)",
                     "DELETE FROM snowflake_worker_registry"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)


def test_past_holders_are_visible_only_to_privileged_roles(cluster):
    cluster.sql("CREATE ROLE app LOGIN")
    cluster.sql("CREATE ROLE watcher LOGIN IN ROLE pg_read_all_stats")
    with cluster.connect(application_name="gone") as c:
        c.execute("SELECT snowflake_nextval()")
    wait_until(lambda: cluster.scalar(
        "SELECT count(*) FROM snowflake_workers WHERE released_at IS NOT NULL"))
    query = ("SELECT database, role, application_name FROM snowflake_workers"
             " WHERE released_at IS NOT NULL")
    with cluster.connect(user="app") as conn:
        assert conn.execute(query).fetchone() == (None, None, None)
    with cluster.connect(user="watcher") as conn:
        assert conn.execute(query).fetchone() == ("postgres", "postgres", "gone")


def test_registry_rows_are_dumped_with_the_database(cluster, tmp_path):
    with cluster.connect(application_name="dumped") as c:
        c.execute("SELECT snowflake_nextval()")
    wait_until(lambda: cluster.scalar("SELECT count(*) FROM snowflake_worker_registry"))
    import subprocess
    dump = subprocess.run(
        ["runuser", "-u", "postgres", "--", os.path.join(PG_BINDIR, "pg_dump"),
         "-h", cluster.dir, "-p", str(cluster.port), "-U", "postgres", "-d", "postgres",
         "--data-only", "-t", "snowflake_worker_registry"],
        capture_output=True, text=True, check=True)
    assert "dumped" in dump.stdout


def test_registry_worker_waits_for_the_extension(make_cluster):
    c = make_cluster(create_extension=False)
    c.wait_for_log("has no snowflake_id extension yet", timeout=15)
    c.sql("CREATE EXTENSION snowflake_id")
    with c.connect(application_name="late") as conn:
        conn.execute("SELECT snowflake_nextval()")
        wait_until(lambda: c.scalar(
            "SELECT count(*) FROM snowflake_worker_registry WHERE application_name = 'late'"))


def test_other_roles_sessions_show_what_pg_stat_activity_shows(cluster):
    """Another role's live holder: who and which program, not when or how
    much (like pg_stat_activity); the application name is the current one."""
    for role in ("alice", "bob"):
        cluster.sql(f"CREATE ROLE {role} LOGIN")
    cluster.sql("CREATE ROLE watcher LOGIN IN ROLE pg_read_all_stats")
    query = ("SELECT role, application_name, claimed_at IS NOT NULL,"
             " ids_issued, last_id_time IS NOT NULL"
             " FROM snowflake_workers WHERE pid = %s")
    with cluster.connect(user="alice", application_name="at-claim") as a:
        a.execute("SELECT snowflake_nextval()")
        a.execute("SET application_name = 'renamed'")
        pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        with cluster.connect(user="bob") as b:
            assert b.execute(query, (pid,)).fetchone() == \
                ("alice", "renamed", False, None, False)
            # Not through the function behind the view either.
            assert b.execute(
                "SELECT claimed_at, ids_issued, last_id_time"
                " FROM snowflake_worker_status() WHERE pid = %s", (pid,)
            ).fetchone() == (None, None, None)
        for user in ("alice", "watcher", "postgres"):
            with cluster.connect(user=user) as conn:
                assert conn.execute(query, (pid,)).fetchone() == \
                    ("alice", "renamed", True, 1, True), user
