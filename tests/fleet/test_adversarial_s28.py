"""Adversarial (session 28): 53801d7, attacked on real PostgreSQL 15
servers.

1. The 0.7.0 -> 0.8.0 update records, on a 0.6.0 block row (no holder
   session), the session holding the block's advisory lock (1936613751,
   block) and its role. Any role may call pg_advisory_lock(int, int) in
   the registry's database, and a 0.6.0 lease call takes the block's lock
   with pg_try_advisory_lock, ignoring a failure: X's role locks block 0
   before A leases it (or waits for it, and gets it at A's next broken
   connection); A leases and renews block 0 on 0.6.0 without its lock.
   The update, with A connected as the runbook says, records X's session
   and role on A's block. X's session then introduces A's node (a node's
   keys are per role: X's hello of A's node succeeds) and renews block 0:
   it is X's, and X renews it every 2 s: A, connected all along, makes no ID again.
   (Tried too: X releasing it to a waiting holder B: B gets it only past
   the update's floor, 14 min ahead here; no duplicate ID.)

Fixed since: the update records the session holding the node's 0.6.0
lock (hashtextextended('snowflake_id node ' || holder_node, 0), objsubid
1), which 0.6.0's hello took and every lease call of the node needed, not
the one holding the block's lock.

The registry's log is checked: no panic, no crash. Lease times of 6 s
(fleet_helpers.LEASE)."""

from __future__ import annotations

import re
import time

import pytest

from harness import wait_until
from helpers import Maker, old_release
from fleet_helpers import CONTESTED, GRACE_S, holder, Intruder, LEASE_S, Repeat

SCHEMA = "snowflake_id_internal"
BLOCK_CLASS = 1936613751


def log_problems(r, since: int = 0) -> list[str]:
    text = r.log(since)
    return [line for line in text.splitlines()
            if re.search(r"PANIC|panicked|internal error|terminated by signal|XX000", line)]


def registry_0_6_0(make_cluster, servers: list[str]) -> tuple:
    """A registry on 0.6.0 in database fleet, a login role per server
    (CONNECTION LIMIT 3, members of snowflake_lease, as fleet.md)."""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    with old_release("0.6.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.6.0'", dbname="fleet")
    r.sql("CREATE ROLE snowflake_lease NOLOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {SCHEMA} TO snowflake_lease", dbname="fleet")
    for f in ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)"):
        r.sql(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.snowflake_lease_{f} TO snowflake_lease",
              dbname="fleet")
    roles = {s: f"snowflake_lease_{s}" for s in servers}
    for role in roles.values():
        r.sql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 3 IN ROLE snowflake_lease")
    return r, roles


def intruder_on(conn, r, node: str) -> Intruder:
    """An Intruder in session `conn` (the one holding the block's lock),
    introduced as `node`."""
    x = Intruder.__new__(Intruder)
    x.r, x.node, x.schema, x.conn = r, node, SCHEMA, conn
    got = conn.execute(f"SELECT {SCHEMA}.snowflake_lease_hello(%s)", (node,)).fetchone()[0]
    assert got is True, f"X's hello of {node}: {got}"
    x.layout = r.sql("SELECT DISTINCT layout FROM snowflake_lease_blocks", dbname="fleet")[0][0]
    return x


@pytest.mark.slow
def test_the_update_records_no_other_roles_session_on_a_0_6_0_row(make_cluster):
    """Registry on 0.6.0, login roles a and x. X's session locks
    (1936613751, 0) (pg_advisory_lock, open to PUBLIC). Holder A (role a,
    may use block 0 only) leases block 0 (its pg_try_advisory_lock of the
    block fails, ignored) and makes IDs. The DBA updates to 0.8.0 with A
    connected. X's session introduces A's node and renews block 0, then
    every 2 s. Wanted: the update records no session of X's role on
    block 0, X never holds it, and A makes IDs past its lease and grace."""
    r, roles = registry_0_6_0(make_cluster, ["a", "x"])
    xs = r.connect(dbname="fleet", user=roles["x"])
    xs.execute("SELECT pg_advisory_lock(%s, 0)", (BLOCK_CLASS,))
    settings = {**CONTESTED, "snowflake_id.registry": r.conninfo(dbname="fleet", user=roles["a"])}
    a = holder(make_cluster, r, **settings)
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    time.sleep(2)
    node = r.sql("SELECT holder_node FROM snowflake_lease_blocks WHERE block = 0",
                 dbname="fleet")[0][0]
    lock_holder = r.sql("SELECT s.usename FROM pg_locks l JOIN pg_stat_activity s USING (pid)"
                        " WHERE l.locktype = 'advisory' AND l.classid = %s::oid"
                        " AND l.objid = 0 AND l.objsubid = 2 AND l.granted",
                        BLOCK_CLASS, dbname="fleet")
    mark = r.log_mark()
    r.sql("ALTER EXTENSION snowflake_id UPDATE", dbname="fleet")
    t0 = time.monotonic()
    after = r.sql("SELECT holder_session, holder_role FROM snowflake_lease_blocks"
                  " WHERE block = 0", dbname="fleet")[0]
    x = intruder_on(xs, r, node)
    renewed = x.renew([0])
    rep = Repeat(lambda: x.renew([0]), every=2)
    roles_seen: set = set()
    try:
        while time.monotonic() - t0 < LEASE_S + GRACE_S + 15:
            roles_seen.add(r.scalar("SELECT holder_role FROM snowflake_lease_blocks"
                                    " WHERE block = 0", dbname="fleet"))
            time.sleep(0.5)
        made = len(maker_a.made)
        time.sleep(5)
        late = len(maker_a.made) - made
    finally:
        rep.stop()
        xs.close()
    last = maker_a.last_at - t0 if maker_a.last_at else None
    maker_a.stop()
    print(f"\n[0.6.0 row, X's lock] block 0's lock held by {lock_holder} before the update;"
          f" after it block 0 records {after}; X's renewal {str(renewed)[:160]};"
          f" block 0's roles since {roles_seen}; A's IDs in the last 5 s {late}, its last"
          f" batch {last} s after the update, refusals {len(maker_a.refusals)}")
    assert not log_problems(r, mark)
    assert after[1] != roles["x"], f"the update recorded X's session on A's block: {after}"
    assert not renewed.get("blocks"), renewed
    assert roles["x"] not in roles_seen, roles_seen
    assert late > 0, f"A made no ID past its lease: its last batch {last} s after the update"
