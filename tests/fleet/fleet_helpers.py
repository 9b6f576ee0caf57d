"""Helpers the fleet tests share (tests/fleet/): the short lease time they
run with, a registry server and a server leasing from it, the registry's
limits for that lease time, the registry's view of its leases, the
errors of a server that refuses to make IDs, and waking stopped processes. Test modules import these
from here, never from one another; helpers of several folders are in
tests/helpers.py."""

from __future__ import annotations

import contextlib
import os
import signal

import psycopg

LEASE = "6s"
LEASE_S = 6.0
GRACE_S = 1.2  # lease::Timing: max(lease / 5, 1 s)


def registry_server(make_cluster, **settings):
    # fsync on: with fsync off, a restart may have lost grants, and the
    # registry fences after each one (tests/fleet/test_fencing.py).
    r = make_cluster(settings={"fsync": True, **settings})
    r.create_extension()
    return r


def lease_limits(r) -> None:
    """The registry's limits for LEASE (0.7.0, snowflake_lease_set_limits):
    a fence after a failover that lost grants lasts the limits' lease time
    plus grace, 6 s + 1.2 s, rather than the defaults' 10 min + 2 min. Marks
    are the holder's clock + 6 s + the default max_drift (60 s): 70 s
    leaves 4 s for its clock."""
    if r.scalar("SELECT to_regproc('snowflake_lease_set_limits') IS NOT NULL"):
        r.sql("SELECT snowflake_lease_set_limits(max_lease_ms => 6000, max_grace_ms => 1200,"
              " max_ahead_ms => 70000)")


def holder(make_cluster, registry, start=True, env=None, **settings):
    s = {"snowflake_id.registry": registry.conninfo(),
         "snowflake_id.lease_time": LEASE, **settings}
    c = make_cluster(settings=s, start=False)
    if start:
        c.start(env=env)
        c.create_extension()
    return c


def leases(r) -> list[tuple]:
    return r.sql("SELECT block, holder_node, holder_name, live, floor, expires_at"
                 " FROM snowflake_leases WHERE leased ORDER BY block")


# What a server that may not make IDs answers: no usable lease (55000),
# or a wait for one cut short by statement_timeout (57014).
REFUSED = (psycopg.errors.ObjectNotInPrerequisiteState, psycopg.errors.QueryCanceled)


def resume(pids) -> None:
    """SIGCONT to each of `pids` (processes a test stopped with SIGSTOP)
    that still exists."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)
