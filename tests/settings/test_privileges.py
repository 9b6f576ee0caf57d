"""What an ordinary role can and cannot do with the extension's objects."""

from __future__ import annotations

import pytest

from helpers import my_worker_id, sql_error, worker_of


# ----------------------------------------------------------- 6. privileges
@pytest.fixture
def app_cluster(make_cluster):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    c.sql("CREATE ROLE app LOGIN")
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), v text)")
    c.sql("GRANT SELECT, INSERT ON t TO app")
    return c


def test_app_role_advisory_locks_cannot_block_a_claim(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("SELECT pg_advisory_lock(0)")
        app.execute("SELECT pg_advisory_lock(1397641047, 0)")  # 'SNOW', 0
        app.execute("SELECT pg_advisory_lock(1397641047::bigint << 32)")
        app.execute("SELECT pg_advisory_lock(1397641047, 3)")
        with c.connect() as other:
            i = other.execute("SELECT snowflake_nextval()").fetchone()[0]
            assert worker_of(i) == 0
            assert my_worker_id(other) == 0


def test_app_role_inserts_with_the_default(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("INSERT INTO t (v) VALUES ('a')")
        app.execute("INSERT INTO t (v) SELECT 'b' FROM generate_series(1, 99)")
        n, distinct, w = app.execute(
            "SELECT count(*), count(DISTINCT id), min((id >> 12) & 1023) FROM t"
        ).fetchone()
        assert (n, distinct) == (100, 100)
        assert my_worker_id(app) == w
        role = c.scalar("SELECT role FROM snowflake_workers WHERE worker_id = %s", w)
        assert role == "app"


def test_app_role_reads_snowflake_workers(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        app.execute("INSERT INTO t (v) VALUES ('a')")
        rows = app.execute("SELECT worker_id, role FROM snowflake_workers "
                           "WHERE pid = pg_backend_pid()").fetchall()
        assert rows == [(my_worker_id(app), "app")]


def test_app_role_is_refused_changing_how_ids_are_made(app_cluster):
    c = app_cluster
    with c.connect(user="app") as app:
        e = sql_error(app, "ALTER SYSTEM SET snowflake_id.worker_ids = '0-1'")
        assert e.sqlstate == "42501", str(e)
        e = sql_error(app, "SET snowflake_id.worker_ids = '0-1'")
        assert e.sqlstate in ("55P02", "42501"), str(e)
        e = sql_error(app, "SET snowflake_id.max_drift = '1h'")
        assert e.sqlstate in ("55P02", "42501"), str(e)
        e = sql_error(app, "SELECT snowflake_accept_layout()")
        assert e.sqlstate == "42501", str(e)
        assert c.scalar("SHOW snowflake_id.worker_ids") == "0-3"
    # Even with EXECUTE granted, the function checks for a superuser itself.
    c.sql("GRANT EXECUTE ON FUNCTION snowflake_accept_layout() TO app")
    with c.connect(user="app") as app:
        e = sql_error(app, "SELECT * FROM snowflake_accept_layout()")
        assert e.sqlstate == "42501", str(e)
        assert "snowflake_accept_layout" in e.diag.message_primary


def test_sql_functions_never_call_another_roles_operators(make_cluster):
    """The plpgsql functions run with search_path = pg_catalog, pg_temp: a
    function or operator a role planted on the caller's search_path (a
    public schema open to all, as in clusters upgraded from PostgreSQL 14)
    is never what they call. Before, a planted left(name, integer) ran with
    the caller's privileges in snowflake_create_partitions(), and a planted
    bigint * interval changed what the IMMUTABLE explicit-layout
    snowflake_timestamp() answered."""
    c = make_cluster(create_extension=True)
    c.sql("GRANT CREATE ON SCHEMA public TO PUBLIC")
    c.sql("CREATE ROLE mallory LOGIN")
    args = "'2024-01-01+00', 1, 10, 12"
    id_ = c.scalar("SELECT snowflake_nextval()")
    honest = c.scalar(f"SELECT snowflake_timestamp(%s, {args})", id_)
    with c.connect(user="mallory") as conn:
        conn.execute("""
            CREATE FUNCTION public.left(name, integer) RETURNS text
            LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
                    EXECUTE 'ALTER ROLE mallory SUPERUSER';
                END IF;
                RETURN pg_catalog.left($1::text, $2);
            END $$""")
        conn.execute("CREATE FUNCTION public.far(bigint, interval) RETURNS interval"
                     " LANGUAGE sql AS $$ SELECT interval '100 years' $$")
        conn.execute("CREATE OPERATOR public.* (leftarg = bigint, rightarg = interval,"
                     " function = public.far)")
    c.sql("CREATE TABLE events (id bigint) PARTITION BY RANGE (id)")
    assert len(c.sql("SELECT * FROM snowflake_create_partitions('events', '1 month', 2)")) == 2
    assert c.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'") is False
    assert c.scalar(f"SELECT snowflake_timestamp(%s, {args})", id_) == honest
    # Past the layout's end: refused, not wrapped around to a wrong ID.
    with c.connect() as conn:
        e = sql_error(conn, f"SELECT snowflake_from_timestamp('2100-01-01+00', {args})")
        assert e.sqlstate == "22008", str(e)
