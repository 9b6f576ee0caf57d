"""The worker registry table (snowflake_worker_registry) and the registry
worker that keeps it: the table is durable across restarts, dumped with the
database, and closed to ordinary roles; the worker waits for the extension
and for a missing database, survives failed writes, follows reloads, is
absent in binary-upgrade mode, and never calls another role's operator."""

from __future__ import annotations

import os

import psycopg
import pytest

from harness import PG_BINDIR, wait_until


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
    c.wait_for_log("WARNING:  snowflake_id registry: database \"postgres\" has no snowflake_id"
                   " extension", timeout=15)
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


# ------------------------------------------------------ the registry worker
SYNC = "snowflake_id registry"
LAUNCHER = "snowflake_id registry launcher"


def _pids(c, backend_type: str) -> list[int]:
    return [r[0] for r in c.sql(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = %s", backend_type)]


def _registered(c, app: str) -> int:
    return c.scalar("SELECT count(*) FROM snowflake_worker_registry"
                    " WHERE application_name = %s", app)


def test_missing_database_is_one_error_then_a_wait(make_cluster):
    c = make_cluster(settings={"snowflake_id.registry_database": "later"})
    c.wait_for_log(r'WARNING:  snowflake_id registry: database "later" does not exist',
                   timeout=30)
    assert "HINT:  Create the database" in c.log()
    # Nothing failed: no FATAL for the database, no worker restarts.
    assert 'FATAL:  database "later" does not exist' not in c.log()
    # Created, with the extension, and a reload to skip the wait: kept.
    c.create_db("later")
    c.create_extension(dbname="later")
    c.sql("SELECT pg_reload_conf()")
    with c.connect(dbname="later", application_name="on-later") as conn:
        conn.execute("SELECT snowflake_nextval()")
        wait_until(lambda: c.scalar(
            "SELECT count(*) FROM snowflake_worker_registry WHERE application_name = 'on-later'",
            dbname="later"), timeout=60, what="registry row in the new database")
    log = c.log()
    assert log.count('database "later" does not exist') == 1, log
    assert 'FATAL:  database "later"' not in log, log


def test_a_failed_write_does_not_kill_the_worker(cluster):
    pid = wait_until(lambda: _pids(cluster, SYNC), what="sync worker")[0]
    # Every row the worker writes now violates a constraint.
    cluster.sql("ALTER TABLE snowflake_worker_registry"
                " ADD CONSTRAINT no_rows CHECK (worker_id < 0) NOT VALID")
    mark = cluster.log_mark()
    with cluster.connect(application_name="refused") as conn:
        conn.execute("SELECT snowflake_nextval()")
        cluster.wait_for_log("could not update snowflake_worker_registry: .*no_rows",
                             since=mark, timeout=30)
    assert _pids(cluster, SYNC) == [pid], cluster.log(since=mark)
    assert "exited with exit code" not in cluster.log(since=mark)
    # Fixed, the same worker writes again.
    cluster.sql("ALTER TABLE snowflake_worker_registry DROP CONSTRAINT no_rows")
    with cluster.connect(application_name="accepted") as conn:
        conn.execute("SELECT snowflake_nextval()")
        wait_until(lambda: _registered(cluster, "accepted"), timeout=60,
                   what="registry row after the fix")
    assert _pids(cluster, SYNC) == [pid]


def test_reload_reaches_the_worker(cluster):
    pid = wait_until(lambda: _pids(cluster, SYNC), what="sync worker")[0]
    cluster.configure(log_min_messages="debug1")
    mark = cluster.log_mark()
    cluster.reload()
    with cluster.connect(application_name="after-reload") as conn:
        conn.execute("SELECT snowflake_nextval()")
        # Only a worker that reloaded logs at DEBUG1.
        cluster.wait_for_log(rf"\[{pid}\] .*DEBUG:  snowflake_id registry: "
                             "snowflake_worker_registry is up to date",
                             since=mark, timeout=30)
    assert _pids(cluster, SYNC) == [pid]


def test_no_registry_worker_in_binary_upgrade_mode(make_cluster):
    # The postmaster logs each background worker it registers at DEBUG1.
    c = make_cluster(settings={"log_min_messages": "debug1"})
    registering = 'registering background worker "snowflake_id registry'
    assert registering in c.log()
    c.stop()
    # pg_upgrade starts the new cluster with -b; it needs it to itself.
    mark = c.log_mark()
    c.start(options="-b")
    assert registering not in c.log(since=mark), c.log(since=mark)
    assert "database system is ready to accept connections" in c.log(since=mark)


def test_background_workers_never_call_another_roles_operator(make_cluster):
    """The workers run SQL as the bootstrap superuser: an operator a role
    planted on the default search_path (a public schema open to all, as in
    clusters upgraded from PostgreSQL 14) must not be what they call, or
    that role becomes superuser. Before, the registry worker's read at
    start called it (numeric * integer)."""
    c = make_cluster(create_extension=True)
    c.sql("SELECT snowflake_nextvals(10)")
    c.sql("GRANT CREATE ON SCHEMA public TO PUBLIC")
    c.sql("CREATE ROLE mallory LOGIN")
    with c.connect(user="mallory") as conn:
        conn.execute("""
            CREATE FUNCTION public.planted(numeric, integer) RETURNS numeric
            LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
                    EXECUTE 'ALTER ROLE mallory SUPERUSER';
                END IF;
                RETURN $1 * $2::numeric;
            END $$""")
        conn.execute("CREATE OPERATOR public.* (leftarg = numeric, rightarg = integer,"
                     " function = public.planted)")
    # The registry table has marks to read at the next start.
    wait_until(lambda: c.scalar("SELECT count(*) FROM snowflake_worker_registry"),
               timeout=30, what="the registry worker recording the worker id")
    c.restart()
    wait_until(lambda: "new IDs start above the registry's high-water mark" in c.log(),
               timeout=30, what="the registry worker's read at start")
    c.sql("SELECT snowflake_nextvals(10)")
    assert c.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'") is False
