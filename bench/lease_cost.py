"""What fleet leases cost the registry: one lease (plus giving it back) and
one renewal, as the lease worker calls them, timed from a client on the
registry's own unix socket (so network latency is not included).

    PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config .venv/bin/python bench/lease_cost.py

The registry runs with fsync on and the session commits synchronously, as
the lease worker's does (0.4.0): the numbers include the WAL flush.

A server renews all its blocks in one call every tenth of
snowflake_id.lease_time (at most every 5 s), and leases a block only when a
quarter of a block's ids are left: neither is on the path of an INSERT.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness import Cluster  # noqa: E402
from helpers import LEASE_SCHEMA_SQL, old_release  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fleet"))
# The registry's own layout (0.8.0 refuses a request under another).
from fleet_helpers import DEFAULT_LAYOUT  # noqa: E402

N = int(os.environ.get("BENCH_LEASE_N", "500"))
ALL = list(range(64))
# BENCH_FSYNC=off measures the calls' own work; on (the default) adds the
# WAL flush of each grant, which durable leases need.
FSYNC = os.environ.get("BENCH_FSYNC", "on") != "off"
# BENCH_VERSION=0.7.0: a registry of that release (its install script from
# tests/upgrade/, with this build's library), for a before/after.
VERSION = os.environ.get("BENCH_VERSION")


def per_call_ms(call, n=N) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1000)
    return times


class Protocol:
    """The lease calls of the installed version: 0.4.0's jsonb requests
    (with the incarnation checks and the caller's lock), or 0.3.x's
    positional ones, so that one script measures both."""

    def __init__(self, conn):
        self.c = conn
        # Where the lease worker finds the functions (0.6.0 and later:
        # snowflake_id_internal); 0.3.x's are in the extension's schema.
        found = conn.execute(LEASE_SCHEMA_SQL).fetchone()
        self.jsonb = found is not None
        self.schema = found[0] + "." if found else ""
        self.incarnation, self.lsn = "", "0/0"

    def hello(self, node):
        self.c.execute(f"SELECT {self.schema}snowflake_lease_hello(%s)", (node,))

    def _call(self, fn, req):
        reply = self.c.execute(f"SELECT {self.schema}{fn}(%s::jsonb)",
                               (json.dumps(req),)).fetchone()[0]
        self.incarnation, self.lsn = reply["incarnation"], reply["lsn"]
        return reply

    def acquire(self, want):
        if not self.jsonb:
            return [r[0] for r in self.c.execute(
                "SELECT block FROM snowflake_lease_acquire('n1', 'bench', 'L', 16, 1023, %s,"
                " %s, 600000, 120000, 0)", (ALL, want)).fetchall()]
        reply = self._call("snowflake_lease_acquire", dict(
            node="n1", name="bench", layout=DEFAULT_LAYOUT, block_size=16, max_worker_id=1023,
            allowed=ALL, want=want, lease_ms=600000, grace_ms=120000, high_ms=0,
            incarnation=self.incarnation, lsn=self.lsn))
        return [b["block"] for b in reply["blocks"]]

    def release(self, block):
        if not self.jsonb:
            self.c.execute("SELECT snowflake_lease_release('n1', %s, 0)", (block,)).fetchall()
            return
        self._call("snowflake_lease_release", dict(node="n1", block=block, high_ms=0,
                                                   incarnation=self.incarnation, lsn=self.lsn))

    def renew(self, blocks):
        if not self.jsonb:
            self.c.execute("SELECT * FROM snowflake_lease_renew('n1', %s, 600000, 120000, 1)",
                           (blocks,)).fetchall()
            return
        self._call("snowflake_lease_renew", dict(
            node="n1", layout=DEFAULT_LAYOUT, block_size=16, max_worker_id=1023,
            blocks=[dict(block=b, high_ms=1) for b in blocks], lease_ms=600000,
            grace_ms=120000, high_ms=1, incarnation=self.incarnation, lsn=self.lsn))


def main() -> int:
    r = Cluster(settings={"fsync": FSYNC})
    r.start()
    try:
        if VERSION:
            with old_release(VERSION):
                r.sql(f"CREATE EXTENSION snowflake_id VERSION '{VERSION}'")
        else:
            r.create_extension()
        with r.connect() as c:
            c.autocommit = True
            # As the lease worker's session: synchronous commits.
            c.execute("SET synchronous_commit = on")
            p = Protocol(c)
            p.hello("n1")
            acquire, release = [], []
            for _ in range(N):
                t = time.perf_counter()
                block = p.acquire(1)[0]
                acquire.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                p.release(block)
                release.append((time.perf_counter() - t) * 1000)
            blocks = p.acquire(4)
            renew = per_call_ms(lambda: p.renew(blocks))
            # 0.7.0: the holder uses a renewal once the registry says it is
            # durable (snowflake_lease_durable, a second call; here with no
            # standby: the registry's own flush).
            durable = None
            if p.jsonb and c.execute(f"SELECT to_regprocedure('{p.schema}snowflake_lease_durable(jsonb)')"
                                     " IS NOT NULL").fetchone()[0]:
                def renew_durable():
                    p.renew(blocks)
                    c.execute(f"SELECT {p.schema}snowflake_lease_durable('{{\"wait_ms\": 100}}')")
                durable = per_call_ms(renew_durable)
            version = c.execute("SELECT extversion FROM pg_extension"
                                " WHERE extname = 'snowflake_id'").fetchone()[0]
        print(f"registry: snowflake_id {version} on PostgreSQL {r.scalar('SHOW server_version')},"
              f" fsync {'on' if FSYNC else 'off'}, {N} calls each, median (p90) ms per call")
        rows = [("lease one block", acquire), ("give a block back", release),
                (f"renew {len(blocks)} blocks", renew)]
        if durable:
            rows.append((f"renew {len(blocks)}, check durable", durable))
        for name, xs in rows:
            xs = sorted(xs)
            print(f"  {name:20s} {statistics.median(xs):6.3f} ({xs[int(len(xs) * 0.9)]:.3f})")
    finally:
        r.stop()
        r.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
