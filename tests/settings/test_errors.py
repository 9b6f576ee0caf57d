"""Errors reach the client the PostgreSQL way, and none takes the server
down.

* Out of memory in a backend is an error (53200) or is avoided, never an
  abort: ``snowflake_nextvals(1000000)`` under an address-space limit does
  not crash the backend (a crash restarts every session of the server).
* With ``RUST_BACKTRACE=1`` in the server's environment, a statement_timeout
  during a clock wait returns PostgreSQL's own error, without a Rust
  backtrace in its DETAIL.
"""

from __future__ import annotations

import psycopg
import pytest


def _vm_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def _backend_vm_size(c) -> int:
    """VmSize of a warmed-up backend that has made a few IDs."""
    with c.connect() as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("SET work_mem = '64kB'")
        conn.execute("SELECT count(*) FROM snowflake_nextvals(10)")
        return _vm_size(pid)


def test_large_batch_under_an_address_space_limit_does_not_crash(cluster):
    # The server restarts with an address-space limit of what a backend
    # needs plus 6 MB: less than the 8 MB a million IDs take at once.
    limit = _backend_vm_size(cluster) + 6 * 1024 * 1024
    cluster.stop()
    cluster.start(address_space=limit)
    with cluster.connect() as other, cluster.connect() as conn:
        other_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        # Keep the tuplestore small, so that the limit only bites on what
        # grows with n.
        conn.execute("SET work_mem = '64kB'")
        assert conn.execute("SELECT count(*) FROM snowflake_nextvals(10)").fetchone()[0] == 10
        mark = cluster.log_mark()
        try:
            n = conn.execute(
                "SELECT count(*) FROM snowflake_nextvals(1000000)").fetchone()[0]
            assert n == 1_000_000
        except psycopg.Error as e:
            # Running out of memory is allowed, as PostgreSQL's own error.
            assert e.sqlstate == "53200", e
        log = cluster.log(since=mark)
        assert "terminated by signal" not in log, log
        assert "memory allocation of" not in log, log
        # No restart: the other session is alive.
        assert other.execute("SELECT pg_backend_pid()").fetchone()[0] == other_pid


def test_no_rust_backtrace_in_errors(make_cluster):
    # js53 makes 64 IDs per millisecond; with no drift allowed a million
    # IDs wait for ticks for about 15 s, far longer than the timeout.
    c = make_cluster(settings={"snowflake_id.layout": "js53",
                               "snowflake_id.max_drift": 0},
                     env={"RUST_BACKTRACE": "1"}, create_extension=True)
    with c.connect() as conn:
        conn.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled) as ei:
            conn.execute("SELECT count(*) FROM snowflake_nextvals(1000000)")
        diag = ei.value.diag
        assert diag.message_primary == "canceling statement due to statement timeout"
        assert diag.message_detail is None, diag.message_detail
        # The session carries on.
        conn.execute("RESET statement_timeout")
        assert conn.execute("SELECT snowflake_nextval()").fetchone()[0] > 0
