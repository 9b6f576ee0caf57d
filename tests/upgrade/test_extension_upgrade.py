"""ALTER EXTENSION snowflake_id UPDATE from every earlier release gives the
same objects as a fresh CREATE EXTENSION: functions (definition, labels,
comments, privileges, schema), the view, the registry table (columns,
trigger, privileges, pg_dump configuration), the internal schema
(privileges, comment) — and keeps the registry's rows.

The install scripts of earlier releases are kept in tests/upgrade/ (as they
were generated at release time) and copied into the server's extension
directory only for this test (helpers.old_release).
"""

import glob
import os
import re

import psycopg
import pytest

from helpers import OLD_SCRIPTS_DIR, old_release

OLD_SCRIPTS = sorted(glob.glob(os.path.join(OLD_SCRIPTS_DIR, "snowflake_id--*.sql")))

# One row per object of the extension, with everything that must match.
DESCRIBE = r"""
WITH members AS (
    SELECT d.classid, d.objid, d.objsubid
      FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND e.extname = 'snowflake_id'
)
SELECT pg_describe_object(m.classid, m.objid, m.objsubid) AS object,
       CASE m.classid
         WHEN 'pg_proc'::regclass THEN
           pg_get_functiondef(m.objid) || ' acl=' || coalesce(
             (SELECT proacl::text FROM pg_proc WHERE oid = m.objid), 'default')
         WHEN 'pg_class'::regclass THEN
           (SELECT relkind::text || ' acl=' || coalesce(relacl::text, 'default')
                   || coalesce(' view=' || pg_get_viewdef(c.oid), '')
              FROM pg_class c WHERE c.oid = m.objid)
           || coalesce((SELECT ' columns=' || string_agg(
                 a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                 || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                 || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''),
                 ', ' ORDER BY a.attnum)
              FROM pg_attribute a
              LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
             WHERE a.attrelid = m.objid AND a.attnum > 0 AND NOT a.attisdropped), '')
           || coalesce((SELECT ' triggers=' || string_agg(pg_get_triggerdef(t.oid), '; '
                                                        ORDER BY t.tgname)
              FROM pg_trigger t WHERE t.tgrelid = m.objid AND NOT t.tgisinternal), '')
           || coalesce((SELECT ' indexes=' || string_agg(pg_get_indexdef(i.indexrelid), '; '
                                                       ORDER BY i.indexrelid::regclass::text)
              FROM pg_index i WHERE i.indrelid = m.objid), '')
         WHEN 'pg_type'::regclass THEN format_type(m.objid, NULL)
         WHEN 'pg_namespace'::regclass THEN
           (SELECT 'acl=' || coalesce(nspacl::text, 'default')
              FROM pg_namespace WHERE oid = m.objid)
         ELSE ''
       END AS definition,
       obj_description(m.objid, (SELECT relname FROM pg_class WHERE oid = m.classid))
         AS comment
  FROM members m
UNION ALL
SELECT 'extension config', array_to_string(ARRAY(
         SELECT c::regclass::text FROM unnest(extconfig) c ORDER BY 1), ','), NULL
  FROM pg_extension WHERE extname = 'snowflake_id'
ORDER BY 1
"""


def describe(cluster, dbname):
    rows = cluster.sql(DESCRIBE, dbname=dbname)
    # Index names carry the table's name only; nothing else is per database.
    return [tuple(re.sub(r"\s+", " ", str(v)) if v is not None else None for v in r)
            for r in rows]


@pytest.mark.skipif(not OLD_SCRIPTS, reason="no earlier release to upgrade from")
@pytest.mark.parametrize("script", OLD_SCRIPTS, ids=os.path.basename)
def test_update_from_an_earlier_release_matches_a_fresh_install(cluster, script):
    old_version = re.search(r"snowflake_id--(.+)\.sql$", script).group(1)
    new_version = cluster.scalar("SELECT default_version FROM pg_available_extensions "
                                 "WHERE name = 'snowflake_id'")
    assert new_version != old_version
    with old_release(old_version):
        cluster.create_db("upgraded")
        with cluster.connect(dbname="upgraded") as conn:
            conn.execute(f"CREATE EXTENSION snowflake_id VERSION '{old_version}'")
            conn.execute("INSERT INTO snowflake_worker_registry (worker_id, high_water) "
                         "VALUES (1000, now() - interval '1 day')")
            conn.execute("ALTER EXTENSION snowflake_id UPDATE")
            assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = "
                                "'snowflake_id'").fetchone()[0] == new_version
            # The registry's rows survive the update.
            assert conn.execute("SELECT count(*) FROM snowflake_worker_registry "
                                "WHERE worker_id = 1000").fetchone()[0] == 1
            # And it works.
            ids = [r[0] for r in conn.execute(
                "SELECT snowflake_nextval() FROM generate_series(1, 100)").fetchall()]
            assert ids == sorted(ids) and len(set(ids)) == 100
    cluster.create_db("fresh")
    cluster.sql("CREATE EXTENSION snowflake_id", dbname="fresh")
    upgraded, fresh = describe(cluster, "upgraded"), describe(cluster, "fresh")
    assert [r[0] for r in upgraded] == [r[0] for r in fresh]
    for u, f in zip(upgraded, fresh):
        assert u == f, f"{u[0]} differs after the update:\n updated: {u}\n fresh:   {f}"


# The objects 0.6.0 moved from the extension's schema to
# snowflake_id_internal (with ALTER ... SET SCHEMA: same OIDs).
MOVED = [
    "snowflake_lease_hello(text)", "snowflake_lease_begin(jsonb)",
    "snowflake_lease_reply(text,timestamp with time zone,jsonb)",
    "snowflake_lease_acquire(jsonb)", "snowflake_lease_renew(jsonb)",
    "snowflake_lease_release(jsonb)", "snowflake_lease_forget()",
    "snowflake_registry_high_water()", "snowflake_registry_merge()",
    "snowflake_layout_shift(bigint,integer,integer,integer)",
    "snowflake_layout_id(bigint,integer)",
    "snowflake_layout_ticks(numeric,integer,timestamp with time zone,timestamp with time zone)",
]


def test_update_from_0_5_0_moves_internal_functions_and_keeps_what_uses_them(cluster):
    """0.5.0 -> 0.6.0 moves the internal functions to snowflake_id_internal
    with their OIDs: an index, a generated column and a partition bound on
    the explicit-layout decoders (whose SQL-standard bodies call the moved
    checks by OID) stay valid and keep working, the registry's triggers fire,
    and a role that may execute the lease functions gets USAGE on the new
    schema."""
    explicit = "'2024-01-01', 1, 10, 12, 63"
    with old_release("0.5.0"):
        cluster.create_db("from050")
        with cluster.connect(dbname="from050") as conn:
            conn.execute("CREATE EXTENSION snowflake_id VERSION '0.5.0'")
            before = dict(conn.execute(
                "SELECT p.oid::regprocedure::text, p.oid FROM pg_proc p"
                " JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'"
                " JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'"
            ).fetchall())
            assert set(MOVED) <= set(before), sorted(before)
            conn.execute("CREATE ROLE lessee050")
            conn.execute("GRANT EXECUTE ON FUNCTION snowflake_lease_hello(text),"
                         " snowflake_lease_renew(jsonb) TO lessee050")
            conn.execute(f"""
                CREATE TABLE events (
                    id bigint PRIMARY KEY,
                    at timestamptz GENERATED ALWAYS AS (snowflake_timestamp(id, {explicit})) STORED)""")
            conn.execute(f"CREATE INDEX events_at ON events (snowflake_timestamp(id, {explicit}))")
            conn.execute("CREATE TABLE parted (id bigint) PARTITION BY RANGE (id)")
            conn.execute(f"""
                CREATE TABLE parted_2025 PARTITION OF parted FOR VALUES
                  FROM (snowflake_from_timestamp('2025-01-01', {explicit}))
                  TO (snowflake_from_timestamp('2026-01-01', {explicit}))""")
            first = conn.execute(f"SELECT snowflake_from_timestamp('2025-06-01', {explicit})"
                                 ).fetchone()[0]
            conn.execute("INSERT INTO events (id) VALUES (%s)", (first,))
            conn.execute("INSERT INTO parted VALUES (%s)", (first,))
            warnings = []
            conn.add_notice_handler(lambda d: warnings.append(d.message_primary))
            conn.execute("ALTER EXTENSION snowflake_id UPDATE TO '0.6.0'")
            assert any("lessee050" in w for w in warnings), warnings

            after = dict(conn.execute(
                "SELECT p.oid, n.nspname FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.oid = ANY(%s)", (list(before.values()),)).fetchall())
            for sig in MOVED:
                assert after.get(before[sig]) == "snowflake_id_internal", (sig, after)
            for sig, oid in before.items():
                if sig not in MOVED:
                    assert after.get(oid) == "public", (sig, after)
            assert conn.execute("SELECT to_regprocedure('public.snowflake_layout_id(bigint,int)')"
                                ).fetchone()[0] is None
            # The role that could execute the lease functions still can.
            assert conn.execute("SELECT has_schema_privilege('lessee050', 'snowflake_id_internal',"
                                " 'USAGE')").fetchone()[0]
            assert not conn.execute("SELECT has_schema_privilege('public', 'snowflake_id_internal',"
                                    " 'USAGE')").fetchone()[0]

            # The index is valid and used; the generated column, the bound and
            # the decoders work as before.
            assert conn.execute("SELECT indisvalid FROM pg_index"
                                " WHERE indexrelid = 'events_at'::regclass").fetchone()[0]
            conn.execute("SET enable_seqscan = off")
            plan = "\n".join(r[0] for r in conn.execute(
                f"EXPLAIN SELECT id FROM events WHERE snowflake_timestamp(id, {explicit})"
                " = '2025-06-01'").fetchall())
            assert "events_at" in plan, plan
            assert conn.execute(
                f"SELECT id FROM events WHERE snowflake_timestamp(id, {explicit}) = '2025-06-01'"
            ).fetchall() == [(first,)]
            conn.execute("INSERT INTO events (id) VALUES (%s)", (first + 1,))
            assert conn.execute("SELECT count(*) FROM events WHERE at = '2025-06-01'"
                                ).fetchone()[0] == 2
            conn.execute("REINDEX INDEX events_at")
            assert conn.execute("SELECT tableoid::regclass::text FROM parted").fetchone()[0] \
                == "parted_2025"
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"INSERT INTO parted_2025 VALUES (snowflake_from_timestamp("
                             f"'2027-01-01', {explicit}))")
            # The checks still raise their errors through the decoders.
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                conn.execute("SELECT snowflake_timestamp(1, '2024-01-01', 1, 10, 12, 20)")
            # The registry's triggers still fire: a restored row raises the floor.
            conn.execute("INSERT INTO snowflake_worker_registry (worker_id, high_water)"
                         " VALUES (1000, now() + interval '2 seconds')")
            got = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
            assert got > conn.execute("SELECT snowflake_from_timestamp(now() + interval"
                                      " '1.9 seconds')").fetchone()[0]


def test_update_from_0_7_0_lets_the_lease_role_take_backfill_grants(cluster):
    """A role that may renew leases on a 0.7.0 registry may call
    snowflake_backfill_grant after the update (a holder's snowflake_at()
    calls it: docs/guides/backfill.md, in a fleet); PUBLIC may not."""
    with old_release("0.7.0"):
        cluster.create_db("from070")
        with cluster.connect(dbname="from070") as conn:
            conn.execute("CREATE EXTENSION snowflake_id VERSION '0.7.0'")
            conn.execute("CREATE ROLE lessee070")
            conn.execute("GRANT USAGE ON SCHEMA snowflake_id_internal TO lessee070")
            conn.execute("GRANT EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text),"
                         " snowflake_id_internal.snowflake_lease_renew(jsonb) TO lessee070")
            conn.execute("ALTER EXTENSION snowflake_id UPDATE")
            may = conn.execute(
                "SELECT has_function_privilege(r, 'snowflake_id_internal.snowflake_backfill_grant(jsonb)',"
                " 'EXECUTE') FROM unnest(ARRAY['lessee070', 'public']) r").fetchall()
            assert may == [(True,), (False,)], may
            conn.execute("DROP EXTENSION snowflake_id")
            conn.execute("DROP OWNED BY lessee070")
            conn.execute("DROP ROLE lessee070")


def test_a_0_7_0_database_under_this_library_refuses_snowflake_backfill_clearly(make_cluster):
    """The library updated, ALTER EXTENSION UPDATE not yet run in a
    database: 0.7.0's snowflake_backfill() (six columns, C symbol
    snowflake_backfill_wrapper) raises 55000 naming the update, and the
    server goes on. Before, this library's eight-column rows under that
    declaration crashed the backend once a grant existed, and the registry
    worker, which called it each pass, in a loop (the apt upgrade test,
    tests/upgrade/test_package.py, saw it)."""
    c = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"},
                     create_extension=True)
    assert c.scalar("SELECT snowflake_at('2024-06-01')") > 0
    with old_release("0.7.0"):
        c.create_db("from070")
        with c.connect(dbname="from070") as conn:
            conn.execute("CREATE EXTENSION snowflake_id VERSION '0.7.0'")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match="snowflake_backfill\\(\\) of snowflake_id 0.7.0 is not supported"):
                conn.execute("SELECT * FROM snowflake_backfill()")
            conn.execute("ALTER EXTENSION snowflake_id UPDATE")
            assert conn.execute("SELECT sum(grants) FROM snowflake_backfill()").fetchone()[0] >= 1
    assert c.scalar("SELECT count(*) FROM pg_stat_activity"
                    " WHERE backend_type = 'snowflake_id registry'") == 1
