"""The registry worker's life: reloads, a missing database, failed writes,
binary-upgrade mode."""

from __future__ import annotations

from conftest import wait_until

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
