"""Helpers shared by the worker-id tests (test_claims, test_restarts,
test_privileges, test_leases, test_citus): decoding classic IDs, claims,
client programs."""

from __future__ import annotations

import glob
import os

import psycopg
import pytest

from conftest import PG_BINDIR, _run_pg, wait_until

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
needs_faketime = pytest.mark.skipif(LIBFAKETIME is None,
                                    reason="libfaketime not installed")

def worker_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    return (i >> sequence_bits) & ((1 << worker_bits) - 1)


def ms_of(i: int, sequence_bits: int = 12, worker_bits: int = 10) -> int:
    """Unix ms of an ID of a 1 ms-tick layout with the default epoch."""
    return (i >> (sequence_bits + worker_bits)) + EPOCH_MS


def can_make_id(conn) -> bool:
    """Whether a call makes an ID now (False: 55000, e.g. no lease)."""
    try:
        conn.execute("SELECT snowflake_nextval()")
        return True
    except psycopg.errors.ObjectNotInPrerequisiteState:
        return False


def my_worker_id(conn):
    return conn.execute("SELECT my_worker_id FROM snowflake_config()").fetchone()[0]


def held_count(cluster) -> int:
    return cluster.scalar("SELECT worker_ids_held FROM snowflake_config()")


def sql_error(conn, query, params=None) -> psycopg.Error:
    """Runs `query`, which must fail; returns the error."""
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(query, params)
    return ei.value


def wait_released(cluster, worker_id: int) -> None:
    wait_until(lambda: cluster.scalar(
        "SELECT sessions = 0 FROM snowflake_workers WHERE worker_id = %s",
        worker_id), what=f"worker id {worker_id} to be released")


def faketime_env(spec: str) -> dict:
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": spec,
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_RESET": "1"}


def generate(conn, n: int) -> list[int]:
    """n IDs from one connection, one snowflake_nextval() call each, in the
    order they were made."""
    return [r[0] for r in conn.execute(
        "SELECT snowflake_nextval() FROM generate_series(1, %s) "
        "ORDER BY generate_series", (n,))]


def assert_strictly_increasing(ids, label=""):
    bad = next((k for k in range(1, len(ids)) if ids[k] <= ids[k - 1]), None)
    assert bad is None, (f"{label}: IDs not strictly increasing at {bad}: "
                         f"{ids[bad - 1]} then {ids[bad]}")


def run_client(cluster, program: str, *args, check=True, timeout=300):
    """Runs a PostgreSQL client program against the cluster as the postgres
    OS user, e.g. run_client(c, "pg_dump", "-Fc", ...)."""
    return _run_pg([os.path.join(PG_BINDIR, program), "-h", cluster.dir,
                    "-p", str(cluster.port), "-U", "postgres", *args],
                   cwd=cluster.dir, check=check, timeout=timeout)
