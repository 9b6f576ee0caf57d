"""The logical-replication fleet of issue 11: three writers that lease their
worker ids from a fourth server, which also merges their rows. No writer
has a `worker_ids` setting; the README's writer and merger files are used
as they are (tests/sql/several_servers_*.sql)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import LOGICAL_REPLICATION_SETTINGS, wait_until
from test_servers import (
    CLIENTS_PER_WRITER, MERGER_SQL, ROWS_PER_CLIENT, WRITER_SQL, _insert_rows,
    counts_by_origin, run_sql_file, subscription_errors, subscriptions_ready, worker_of,
)


def test_three_writers_leasing_from_the_merger(make_cluster):
    r = make_cluster(tcp=True, create_extension=True)
    writers = {}
    for origin in ("a", "b", "c"):
        w = make_cluster(tcp=True, settings={**LOGICAL_REPLICATION_SETTINGS,
                                            "snowflake_id.registry": r.conninfo()})
        run_sql_file(w, WRITER_SQL)
        writers[origin] = w
    mark = r.log_mark()
    run_sql_file(r, MERGER_SQL, **{f"conninfo_{o}": w.conninfo() for o, w in writers.items()})
    wait_until(lambda: subscriptions_ready(r), 60, "initial table sync")

    n_clients = CLIENTS_PER_WRITER * len(writers)
    barrier = threading.Barrier(n_clients)
    with ThreadPoolExecutor(n_clients) as pool:
        futures = {o: [pool.submit(_insert_rows, w, o, ROWS_PER_CLIENT, barrier)
                       for _ in range(CLIENTS_PER_WRITER)] for o, w in writers.items()}
        inserted = {o: sum(f.result() for f in fs) for o, fs in futures.items()}
    expected = {o: CLIENTS_PER_WRITER * ROWS_PER_CLIENT for o in writers}
    assert inserted == expected

    def caught_up():
        errors = subscription_errors(r)
        assert all(e == (0, 0) for e in errors.values()), errors
        return counts_by_origin(r) == expected
    wait_until(caught_up, 120, f"the merger to hold {expected}", interval=0.5)
    log = r.log(since=mark)
    assert "duplicate key" not in log and "conflict=" not in log
    assert not re.search(r"ERROR:", log), log[-3000:]
    merged = r.sql("SELECT id, origin FROM events ORDER BY id")
    assert len(merged) == len({i for i, _ in merged}) == sum(expected.values())
    # Each writer made its IDs under worker ids leased to it alone.
    used = {o: {worker_of(i) for i, oo in merged if oo == o} for o in writers}
    for a in writers:
        for b in writers:
            assert a == b or not used[a] & used[b], (a, b, used[a] & used[b])
        assert writers[a].scalar("SELECT mode FROM snowflake_config()") == "registry"
    holders = {name for (name,) in r.sql(
        "SELECT DISTINCT holder_name FROM snowflake_leases WHERE leased")}
    assert len(holders) == 3, holders
