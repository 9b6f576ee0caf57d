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
    # rows and the extension's comment, which need a superuser, fail.
    server.create_extension(dbname="app_prepared")
    proc = restore(server, dump, "app_prepared", "app_owner")
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert all("snowflake_worker_registry" in ln or "snowflake_lease_blocks" in ln
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
