"""pg_dump / pg_restore of a database that uses snowflake_id, restored by
its owner who is not a superuser (docs/operations/backup-restore.md)."""
from __future__ import annotations

import os

import pytest

from harness import PG_BINDIR, run_pg
from clients.support import module_server


@pytest.fixture(scope="module")
def server(request):
    yield from module_server(request)


def restore(server, dump, db, user):
    return run_pg([os.path.join(PG_BINDIR, "pg_restore"), "-h", server.dir, "-p",
                    server.port, "-U", user, "-d", db, dump], cwd=server.dir, check=False)


def test_restore_by_non_superuser_owner(server):
    server.sql("CREATE ROLE app_owner LOGIN")
    for db in ("app", "app_copy", "app_prepared"):
        server.sql(f"CREATE DATABASE {db} OWNER app_owner")
    server.create_extension(dbname="app")
    with server.connect(dbname="app", user="app_owner") as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), "
                     "item text)")
        conn.execute("INSERT INTO orders (item) SELECT 'o' || g FROM generate_series(1, 10) g")
    # Something in the registry table, as the registry worker would write.
    server.sql("INSERT INTO snowflake_worker_registry (worker_id, role) VALUES (7, 'old server')",
               dbname="app")
    dump = os.path.join(server.dir, "app.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-h", server.dir, "-p", server.port,
             "-U", "postgres", "-Fc", "-f", dump, "app"], cwd=server.dir)

    # The owner alone cannot restore it: the extension is untrusted.
    proc = restore(server, dump, "app_copy", "app_owner")
    assert proc.returncode != 0
    assert "permission denied to create extension \"snowflake_id\"" in proc.stderr, proc.stderr

    # With the extension created first by a superuser, the owner restores
    # the tables and rows; only the registry's and the lease registry's
    # rows (blocks, limits) and the extension's comment, which need a
    # superuser, fail.
    server.create_extension(dbname="app_prepared")
    proc = restore(server, dump, "app_prepared", "app_owner")
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert all("snowflake_worker_registry" in ln or "snowflake_lease_blocks" in ln
               or "snowflake_backfill_grants" in ln or "snowflake_lease_limits" in ln
               or "extension snowflake_id" in ln for ln in errors), proc.stderr
    assert server.scalar("SELECT count(*) FROM orders", dbname="app_prepared") == 10
    with server.connect(dbname="app_prepared", user="app_owner") as conn:
        assert conn.execute("INSERT INTO orders (item) VALUES ('new') RETURNING id > 0"
                            ).fetchone()[0]
    # Restored by a superuser, the old server's registry rows come along.
    server.create_extension(dbname="app_copy")
    proc = run_pg([os.path.join(PG_BINDIR, "pg_restore"), "-h", server.dir, "-p", server.port,
                    "-U", "postgres", "--data-only", "-t", "snowflake_worker_registry", "-d",
                    "app_copy", dump], cwd=server.dir, check=False)
    assert proc.returncode == 0, proc.stderr
    assert server.sql("SELECT worker_id, role FROM snowflake_worker_registry",
                      dbname="app_copy") == [(7, "old server")]


def test_dump_leaves_the_internal_schema_to_create_extension(server):
    """pg_dump does not dump snowflake_id_internal (a member of the
    extension) nor its functions; what uses the explicit-layout decoders
    (whose bodies call functions there) is dumped with the user-facing
    names and restores into a database where CREATE EXTENSION made the
    schema again. A GRANT on the schema made after CREATE EXTENSION (the
    lease role's USAGE) is dumped and restored."""
    explicit = "'2024-01-01+00', 1, 10, 12, 63"
    server.sql("CREATE ROLE lease_role LOGIN")
    server.sql("CREATE DATABASE internal_src")
    server.create_extension(dbname="internal_src")
    with server.connect(dbname="internal_src") as conn:
        conn.execute("GRANT USAGE ON SCHEMA snowflake_id_internal TO lease_role")
        conn.execute(f"""CREATE TABLE events (
            id bigint PRIMARY KEY DEFAULT snowflake_nextval(),
            at timestamptz GENERATED ALWAYS AS (snowflake_timestamp(id, {explicit})) STORED)""")
        conn.execute(f"CREATE INDEX events_at ON events (snowflake_timestamp(id, {explicit}))")
        conn.execute("CREATE TABLE parted (id bigint) PARTITION BY RANGE (id)")
        conn.execute(f"""CREATE TABLE parted_now PARTITION OF parted FOR VALUES
            FROM (snowflake_from_timestamp(now() - interval '1 day', {explicit}))
            TO (snowflake_from_timestamp(now() + interval '1 day', {explicit}))""")
        conn.execute("INSERT INTO events DEFAULT VALUES")
        conn.execute("INSERT INTO parted SELECT snowflake_nextval()")
    dump = os.path.join(server.dir, "internal_src.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-h", server.dir, "-p", server.port,
            "-U", "postgres", "-Fc", "-f", dump, "internal_src"], cwd=server.dir)
    listing = run_pg([os.path.join(PG_BINDIR, "pg_restore"), "-f", "-", dump],
                     cwd=server.dir).stdout
    assert "CREATE SCHEMA snowflake_id_internal" not in listing
    assert "CREATE FUNCTION snowflake_id_internal" not in listing
    assert "GRANT USAGE ON SCHEMA snowflake_id_internal TO lease_role" in listing
    assert "public.snowflake_timestamp(id, " in listing

    server.sql("CREATE DATABASE internal_copy")
    proc = restore(server, dump, "internal_copy", "postgres")
    assert proc.returncode == 0, proc.stderr
    db = "internal_copy"
    assert server.scalar("SELECT has_schema_privilege('lease_role', 'snowflake_id_internal',"
                         " 'USAGE')", dbname=db)
    assert server.scalar("SELECT count(*) FROM events WHERE at = snowflake_timestamp(id, "
                         f"{explicit})", dbname=db) == 1
    assert server.scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = "
                         "'events_at'::regclass", dbname=db)
    assert server.scalar("SELECT count(*) FROM parted_now", dbname=db) == 1
    with server.connect(dbname=db) as conn:
        conn.execute("INSERT INTO events DEFAULT VALUES")
        conn.execute("INSERT INTO parted SELECT snowflake_nextval()")
