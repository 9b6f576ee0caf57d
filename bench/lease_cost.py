"""What fleet leases cost the registry: one lease (plus giving it back) and
one renewal, as the lease worker calls them, timed from a client on the
registry's own unix socket (so network latency is not included).

    PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config .venv/bin/python bench/lease_cost.py

A server renews all its blocks in one call every tenth of
snowflake_id.lease_time (at most every 5 s), and leases a block only when a
quarter of a block's ids are left: neither is on the path of an INSERT.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness import Cluster  # noqa: E402

N = int(os.environ.get("BENCH_LEASE_N", "500"))
ALL = "ARRAY(SELECT generate_series(0, 63))"
ACQUIRE = (f"SELECT * FROM snowflake_lease_acquire('n1', 'bench', 'L', 16, 1023, {ALL},"
           " 1, 600000, 120000, 0)")


def per_call_ms(conn, query, args=None, n=N) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.execute(query, args).fetchall()
        times.append((time.perf_counter() - t) * 1000)
    return times


def main() -> int:
    r = Cluster()
    r.start()
    try:
        r.create_extension()
        with r.connect() as c:
            c.execute("SELECT snowflake_lease_hello('n1')")
            acquire, release = [], []
            for _ in range(N):
                t = time.perf_counter()
                block = c.execute(ACQUIRE).fetchone()[0]
                acquire.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                c.execute("SELECT snowflake_lease_release('n1', %s, 0)", (block,))
                release.append((time.perf_counter() - t) * 1000)
            c.execute(ACQUIRE.replace(" 1, 600000", " 4, 600000")).fetchall()
            blocks = [x[0] for x in c.execute(
                "SELECT block FROM snowflake_lease_blocks WHERE holder_node = 'n1'")]
            renew = per_call_ms(c, "SELECT * FROM snowflake_lease_renew('n1', %s, 600000,"
                                   " 120000, 1)", (blocks,))
        print(f"registry: PostgreSQL {r.scalar('SHOW server_version')}, {N} calls each,"
              " median (p90) ms per call")
        for name, xs in (("lease one block", acquire), ("give a block back", release),
                         (f"renew {len(blocks)} blocks", renew)):
            xs = sorted(xs)
            print(f"  {name:20s} {statistics.median(xs):6.3f} ({xs[int(len(xs) * 0.9)]:.3f})")
    finally:
        r.stop()
        r.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
