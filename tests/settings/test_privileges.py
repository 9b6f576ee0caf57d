"""What an ordinary role can and cannot do with the extension's objects."""

from __future__ import annotations

import psycopg
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


# ------------------------------------------ internal objects (0.6.0)
# The user-facing objects (docs/reference/functions.md): in the schema the
# extension was created in. Every other member is internal, in the schema
# snowflake_id_internal (src/sql/internal_schema.sql).
USER_FACING = {
    "function": {
        "snowflake_nextval", "snowflake_nextvals", "snowflake_decode",
        "snowflake_timestamp", "snowflake_worker_id", "snowflake_sequence",
        "snowflake_from_timestamp", "snowflake_compose", "snowflake_layout",
        "snowflake_to_public", "snowflake_from_public", "snowflake_convert_column",
        "snowflake_create_partitions", "snowflake_config", "snowflake_worker_status",
        "snowflake_health",
        "snowflake_accept_layout", "snowflake_advance_past",
        "snowflake_at", "snowflake_backfill", "snowflake_backfill_raise",
        "snowflake_backfill_dump",
        "snowflake_lease_set_limits",
    },
    # views and tables, and their row types (members on PostgreSQL 18)
    "relation": {
        "snowflake_workers", "snowflake_leases", "snowflake_worker_registry",
        "snowflake_lease_blocks", "snowflake_lease_registry", "snowflake_backfill_grants",
        "snowflake_lease_limits", "snowflake_lease_standbys",
    },
}
INTERNAL = "snowflake_id_internal"

MEMBERS = """
SELECT CASE d.classid WHEN 'pg_proc'::regclass THEN 'function'
                      WHEN 'pg_namespace'::regclass THEN 'schema'
                      ELSE 'relation' END,
       coalesce(p.proname, c.relname, t.typname, n.nspname),
       coalesce(p.pronamespace, c.relnamespace, t.typnamespace)::regnamespace::text,
       t.typelem <> 0 AS array_type
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'
  LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
  LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
  LEFT JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
  LEFT JOIN pg_namespace n ON d.classid = 'pg_namespace'::regclass AND n.oid = d.objid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
"""


# An argument of each type the internal functions take (not NULL: a STRICT
# function called with a NULL constant is folded away before anything runs).
SAMPLE = {"jsonb": "'{}'::jsonb", "text": "'x'::text",
          "timestamp with time zone": "now()", "bigint": "0::bigint",
          "integer": "0", "numeric": "0::numeric", "text[]": "ARRAY[]::text[]",
          "pg_lsn": "'0/0'::pg_lsn"}


# Every function in snowflake_id_internal: the registry's SQL that gathers
# facts and applies decisions, the Rust decisions it calls, the checks the
# decoders call by OID and the trigger functions.
INTERNAL_FUNCTIONS = sorted([
    "snowflake_backfill_grant", "snowflake_backfill_grant_take", "snowflake_backfill_merge",
    "snowflake_backfill_restored", "snowflake_layout_id", "snowflake_layout_shift",
    "snowflake_layout_ticks", "snowflake_lease_acquire", "snowflake_lease_apply",
    "snowflake_lease_autocommit", "snowflake_lease_begin", "snowflake_lease_block_class",
    "snowflake_lease_call", "snowflake_lease_candidates_anew",
    "snowflake_lease_candidates_json", "snowflake_lease_candidates_keep",
    "snowflake_lease_candidates_kept", "snowflake_lease_data_key", "snowflake_lease_decide",
    "snowflake_lease_durable", "snowflake_lease_durable_decide",
    "snowflake_lease_durable_progress", "snowflake_lease_facts", "snowflake_lease_forget",
    "snowflake_lease_forget_decide", "snowflake_lease_hello",
    "snowflake_lease_hello_decide", "snowflake_lease_history",
    "snowflake_lease_limits_changed", "snowflake_lease_limits_decide",
    "snowflake_lease_limits_in_force", "snowflake_lease_lock_registry",
    "snowflake_lease_ms", "snowflake_lease_node_keys", "snowflake_lease_release", "snowflake_lease_renew",
    "snowflake_lease_reply", "snowflake_lease_session", "snowflake_lease_sign",
    "snowflake_lease_standby_name", "snowflake_lease_standbys_now", "snowflake_lease_time",
    "snowflake_lease_timeline", "snowflake_registry_high_water", "snowflake_registry_merge",
])


def internal_calls(c) -> list[str]:
    """A call of every function in snowflake_id_internal."""
    rows = c.sql(f"""
        SELECT p.proname, ARRAY(SELECT format_type(a.t, NULL)
                                  FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, i)
                                 ORDER BY a.i)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = '{INTERNAL}' ORDER BY p.proname""")
    return [f"SELECT {INTERNAL}.{name}({', '.join(SAMPLE[t] for t in types)})"
            for name, types in rows]


def test_every_object_but_the_user_facing_ones_is_in_the_internal_schema(make_cluster):
    """The extension's members: the documented user-facing ones in the
    extension's schema, every other one in snowflake_id_internal, a schema
    the extension made (a member itself, dropped with it), where PUBLIC
    may neither look nor create."""
    c = make_cluster(create_extension=True)
    c.create_db("other")
    c.sql("CREATE SCHEMA app_schema", dbname="other")
    c.sql("CREATE EXTENSION snowflake_id SCHEMA app_schema", dbname="other")
    for dbname, home in (("postgres", "public"), ("other", "app_schema")):
        rows = c.sql(MEMBERS, dbname=dbname)
        assert ("schema", INTERNAL, None, None) in rows, rows
        internal = sorted(name for kind, name, schema, _ in rows if schema == INTERNAL)
        for kind, name, schema, array_type in rows:
            if kind == "schema":
                continue
            base = name.lstrip("_") if array_type else name
            facing = base in USER_FACING["function" if kind == "function" else "relation"]
            assert schema == (home if facing else INTERNAL), (kind, name, schema)
        assert internal == INTERNAL_FUNCTIONS, internal
        usage, create, owner = c.sql(
            f"SELECT has_schema_privilege('public', '{INTERNAL}', 'USAGE'),"
            f" has_schema_privilege('public', '{INTERNAL}', 'CREATE'),"
            f" nspowner::regrole::text FROM pg_namespace WHERE nspname = '{INTERNAL}'",
            dbname=dbname)[0]
        assert (usage, create, owner) == (False, False, "postgres")
    # Dropped with the extension, and made again with it.
    c.sql("DROP EXTENSION snowflake_id", dbname="other")
    assert c.scalar(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{INTERNAL}'",
                    dbname="other") == 0
    c.sql("CREATE EXTENSION snowflake_id", dbname="other")
    assert c.scalar(f"SELECT count(*) FROM pg_proc WHERE pronamespace = '{INTERNAL}'::regnamespace",
                    dbname="other") == len(INTERNAL_FUNCTIONS)


def test_an_ordinary_role_cannot_call_internal_functions_but_uses_the_decoders(app_cluster):
    """An ordinary role can call no function of snowflake_id_internal by
    name: no USAGE on the schema (42501), and with USAGE granted, no
    EXECUTE on the lease and trigger functions. It still uses the
    explicit-layout decoders, whose SQL-standard bodies call the checks
    there by OID (PostgreSQL checks EXECUTE on them, not USAGE on their
    schema): inlined in a query, run whole in plpgsql, in a generated
    column, an index and partition bounds, with the checks' errors."""
    c = app_cluster
    calls = internal_calls(c)
    assert len(calls) == len(INTERNAL_FUNCTIONS), calls
    c.sql("GRANT CREATE ON SCHEMA public TO app")
    explicit = "'2024-01-01+00', 1, 10, 12, 63"
    with c.connect(user="app") as app:
        for call in calls:
            e = sql_error(app, call)
            assert e.sqlstate == "42501", (call, str(e))
            assert f"permission denied for schema {INTERNAL}" in str(e), (call, str(e))
        # Nothing of it is left under the old names.
        assert app.execute("SELECT count(*) FROM pg_proc p JOIN pg_namespace n"
                           " ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
                           " AND p.proname ~ '^snowflake_(lease_|layout_|registry_)'"
                           " AND p.proname <> 'snowflake_lease_set_limits'"
                           ).fetchone()[0] == 0

        i = app.execute("SELECT snowflake_nextval()").fetchone()[0]
        ts = app.execute(f"SELECT snowflake_timestamp(%s, {explicit})", (i,)).fetchone()[0]
        assert ts == app.execute("SELECT snowflake_timestamp(%s)", (i,)).fetchone()[0]
        assert app.execute("SELECT snowflake_timestamp(%s, '2024-01-01+00', 1, 10, 12)",
                           (i,)).fetchone()[0] == ts
        low = app.execute(f"SELECT snowflake_from_timestamp(%s, {explicit})", (ts,)).fetchone()[0]
        assert low == app.execute("SELECT snowflake_from_timestamp(%s)", (ts,)).fetchone()[0]
        assert low <= i
        # Inlined: the plan calls the check by its schema's name.
        plan = "\n".join(r[0] for r in app.execute(
            f"EXPLAIN VERBOSE SELECT snowflake_timestamp(id, {explicit}) FROM t").fetchall())
        assert f"{INTERNAL}.snowflake_layout_id" in plan, plan
        # Not inlined: plpgsql, a generated column, an index, partitions.
        app.execute(f"DO $$ BEGIN PERFORM snowflake_timestamp({i}::bigint, {explicit}); END $$")
        app.execute(f"""CREATE TABLE app_events (
            id bigint PRIMARY KEY DEFAULT snowflake_nextval(),
            at timestamptz GENERATED ALWAYS AS (snowflake_timestamp(id, {explicit})) STORED)""")
        app.execute("INSERT INTO app_events DEFAULT VALUES")
        app.execute(f"CREATE INDEX ON app_events (snowflake_timestamp(id, {explicit}))")
        assert app.execute(f"SELECT count(*) FROM app_events"
                           f" WHERE at = snowflake_timestamp(id, {explicit})").fetchone()[0] == 1
        app.execute("CREATE TABLE app_parted (id bigint) PARTITION BY RANGE (id)")
        app.execute(f"""CREATE TABLE app_parted_now PARTITION OF app_parted FOR VALUES
            FROM (snowflake_from_timestamp(now() - interval '1 day', {explicit}))
            TO (snowflake_from_timestamp(now() + interval '1 day', {explicit}))""")
        app.execute("INSERT INTO app_parted SELECT snowflake_nextval()")
        # The checks' errors reach the role.
        for query, sqlstate in (
                ("SELECT snowflake_timestamp(1, '2024-01-01', 1, 10, 12, 20)", "22023"),
                ("SELECT snowflake_timestamp(-1, '2024-01-01', 1, 10, 12, 63)", "22003"),
                ("SELECT snowflake_from_timestamp('2000-01-01', '2024-01-01', 1, 10, 12, 63)",
                 "22008")):
            e = sql_error(app, query)
            assert e.sqlstate == sqlstate, (query, str(e))

    # USAGE alone gives no more: the lease and trigger functions keep
    # EXECUTE revoked from PUBLIC (the checks are PUBLIC's, as the
    # decoders need).
    c.sql(f"GRANT USAGE ON SCHEMA {INTERNAL} TO app")
    with c.connect(user="app") as app:
        for call in calls:
            if "snowflake_layout_" in call:
                try:   # it runs (and may refuse its made-up arguments)
                    app.execute(call)
                except psycopg.Error as e:
                    assert e.sqlstate in ("22023", "22003", "22008"), (call, str(e))
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match="permission denied for function"):
                app.execute(call)
