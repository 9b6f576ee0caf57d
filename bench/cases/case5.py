"""Case 5 - the first call in a new connection (the worker claim) vs later
calls, against a sequence's first nextval(); client- and server-side µs."""

import time

from psycopg import pq

from config import CONNECTIONS, log
from measure import R

CASE = "5_first_call"
GENERATORS = [("snowflake_nextval()", "snowflake_nextval()"),
              ("nextval('s1')", "nextval('s1')")]
METRICS = ("connect", "select1_first", "select1_warm", "call1_client", "call2_client",
           "call3_client", "call1_server", "call2_server")


def run(conns: dict, srv) -> None:
    k = CONNECTIONS
    log(f"case 5: first call in {k} new connections (half snowflake_nextval(), "
        "half nextval('s1'))")
    conninfo = srv.conninfo().encode()
    data = {g: {m: [] for m in METRICS} for g, _ in GENERATORS}

    def run_(pg, q: str) -> tuple[float, list]:
        t0 = time.perf_counter()
        res = pg.exec_(q.encode())
        dt_ = time.perf_counter() - t0
        if res.status != pq.ExecStatus.TUPLES_OK:
            raise RuntimeError(f"{q}: {pg.error_message.decode()}")
        vals = [res.get_value(0, i) for i in range(res.nfields)]
        return dt_ * 1e6, vals

    for i in range(k):
        g, expr = GENERATORS[i % 2]
        d = data[g]
        t0 = time.perf_counter()
        pg = pq.PGconn.connect(conninfo)
        d["connect"].append((time.perf_counter() - t0) * 1e6)
        if pg.status != pq.ConnStatus.OK:
            raise RuntimeError(f"connect failed: {pg.error_message.decode()}")
        try:
            d["select1_first"].append(run_(pg, "SELECT 1")[0])
            d["select1_warm"].append(run_(pg, "SELECT 1")[0])
            # The call sits between two clock_timestamp()s of one target list:
            # the difference is the server-side time of the call itself.
            q = (f"SELECT (extract(epoch FROM b - a) * 1e6)::int FROM (SELECT "
                 f"clock_timestamp() a, {expr} v, clock_timestamp() b OFFSET 0) s")
            for n in (1, 2, 3):
                us, vals = run_(pg, q)
                d[f"call{n}_client"].append(us)
                if n <= 2:
                    d[f"call{n}_server"].append(float(vals[0]))
        finally:
            pg.finish()
    for g, _ in GENERATORS:
        d = data[g]
        for m, vals in d.items():
            R.add(CASE, g, m, "us", vals, f"connections={len(vals)}")
        R.add(CASE, g, "first_minus_second_client", "us",
              [a - b for a, b in zip(d["call1_client"], d["call2_client"])],
              f"connections={len(d['connect'])}")
