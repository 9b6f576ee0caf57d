"""ALTER EXTENSION snowflake_id UPDATE from every earlier release gives the
same objects as a fresh CREATE EXTENSION: functions (definition, labels,
comments, privileges), the view, the registry table (columns, trigger,
privileges, pg_dump configuration) — and keeps the registry's rows.

The install scripts of earlier releases are kept in tests/upgrade/ (as they
were generated at release time) and copied into the server's extension
directory only for this test.
"""

import glob
import os
import re
import shutil

import pytest

from harness import pg_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD_SCRIPTS = sorted(glob.glob(os.path.join(REPO, "tests", "upgrade", "snowflake_id--*.sql")))
EXTDIR = os.path.join(pg_config("--sharedir"), "extension")

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
    # (A file of that name in the server's directory is left over from an
    # install of that version; the build never ships it.)
    installed = os.path.join(EXTDIR, os.path.basename(script))
    new_version = cluster.scalar("SELECT default_version FROM pg_available_extensions "
                                 "WHERE name = 'snowflake_id'")
    assert new_version != old_version
    shutil.copy(script, installed)
    os.chmod(installed, 0o644)
    try:
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
    finally:
        os.remove(installed)
    cluster.create_db("fresh")
    cluster.sql("CREATE EXTENSION snowflake_id", dbname="fresh")
    upgraded, fresh = describe(cluster, "upgraded"), describe(cluster, "fresh")
    assert [r[0] for r in upgraded] == [r[0] for r in fresh]
    for u, f in zip(upgraded, fresh):
        assert u == f, f"{u[0]} differs after the update:\n updated: {u}\n fresh:   {f}"
