"""pg_partman 4.7 (Debian's postgresql-15-partman) keeping daily partitions
of a snowflake-keyed table, with the recipe quoted from
docs/guides/partitions.md as it is: every partition starts at a UTC
midnight, IDs made now land in today's partition, and run_maintenance()
keeps the premade days ahead."""
from __future__ import annotations

import pytest

from harness import PG_MAJOR
from clients.support import doc_blocks, require_clients

pytestmark = pytest.mark.skipif(
    PG_MAJOR != 15, reason="pg_partman is installed from Debian's postgresql-15-partman,"
                           " which exists for Debian's PostgreSQL 15 only")


def readme_recipe() -> str:
    """The pg_partman recipe of docs/guides/partitions.md (its one ```psql
    block that calls partman.create_parent)."""
    blocks = doc_blocks("docs/guides/partitions.md", "psql")
    recipe = [b for b in blocks if "partman.create_parent" in b]
    assert len(recipe) == 1, "the pg_partman recipe of docs/guides/partitions.md is missing"
    return recipe[0]


def test_daily_partitions_at_utc_midnights(make_cluster):
    require_clients()
    c = make_cluster(create_extension=True)
    with c.connect() as conn:
        conn.execute(readme_recipe())
        bounds = conn.execute("""
            SELECT c.relname,
                   (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                 'FROM \\(''?(-?\\d+)''?\\) TO \\(''?(-?\\d+)''?\\)'))[1:2]
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'public.measurements'::regclass
               AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
             ORDER BY 2""").fetchall()
        ranges = sorted((int(lo), int(hi), name) for name, (lo, hi) in bounds)
        assert len(ranges) >= 8, ranges  # today and 7 days ahead
        for lo, hi, name in ranges:
            at_midnight, days = conn.execute(
                "SELECT snowflake_timestamp(%s) = date_trunc('day', snowflake_timestamp(%s), 'UTC'),"
                " snowflake_timestamp(%s) - snowflake_timestamp(%s)", (lo, lo, hi, lo)).fetchone()
            assert at_midnight, (name, lo)
            assert days.days == 1 and days.seconds == 0, (name, days)
            assert name == f"measurements_p{lo}"
        # Contiguous, starting today.
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        today = conn.execute(
            "SELECT snowflake_from_timestamp(date_trunc('day', now(), 'UTC'))").fetchone()[0]
        assert ranges[0][0] == today
        # A row made now lands in today's partition.
        part, id_ = conn.execute("INSERT INTO measurements (value) VALUES (1)"
                                 " RETURNING tableoid::regclass::text, id").fetchone()
        lo, hi, name = next(r for r in ranges if r[0] <= id_ < r[1])
        assert part == name and lo == today
        # Maintenance again changes nothing while the days ahead exist.
        conn.execute("SELECT partman.run_maintenance('public.measurements')")
        assert conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent ="
                            " 'public.measurements'::regclass").fetchone()[0] == len(bounds) + \
            conn.execute("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                         " WHERE i.inhparent = 'public.measurements'::regclass"
                         " AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'").fetchone()[0]
