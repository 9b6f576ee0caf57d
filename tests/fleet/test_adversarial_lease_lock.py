"""Adversarial: the registry's lock held by the lease role without a
transaction block.

Lease calls are decided one at a time under a lock on
snowflake_lease_registry held to the end of their transaction, and refuse
to run inside a transaction block (25001). One statement is a transaction
too: a lease call with pg_sleep() (open to every role) in one SELECT, in a
DO block that catches the cancel, or an extended-protocol pipeline left
without its Sync after the call would keep the lock as long as the lease
role likes. The rule (src/sql/lease_lock.rs): from its decision, a lease
call's transaction has 2 s to end, or its session is ended (57P01) and
the registry logs it. Real holder A makes IDs meanwhile; wanted: A goes on.

Lease times of 6 s (fleet_helpers.LEASE), the registry's limits set to
match."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import Maker
from fleet_helpers import Intruder, duplicates, grant_lease_role, holder, lease_limits, registry_server

HOLD_S = 20


def hold(x: Intruder, how: str, call: str, req: dict) -> None:
    """The lease role's session `x` makes lease call `call` and then keeps
    its transaction open for HOLD_S, `how`."""
    fn, text = f"{x.schema}.snowflake_lease_{call}", json.dumps(req)
    if how == "statement":
        x.conn.execute(f"SELECT {fn}(%s::jsonb), pg_sleep(%s)", (text, HOLD_S))
    elif how == "caught":
        # A cancel is an error PL/pgSQL can catch; the sleep goes on.
        x.conn.execute(f"""DO $do$ BEGIN
            PERFORM {fn}($j${text}$j$::jsonb);
            BEGIN PERFORM pg_sleep({HOLD_S});
            EXCEPTION WHEN query_canceled THEN PERFORM pg_sleep({HOLD_S}); END;
            END $do$""")
    else:
        # Parse, Bind, Execute and no Sync: the transaction stays open
        # while the session waits for the client's next message.
        pg = x.conn.pgconn
        pg.enter_pipeline_mode()
        pg.send_query_params(f"SELECT {fn}($1::jsonb)".encode(), [text.encode()])
        pg.flush()
        t0 = time.monotonic()
        while time.monotonic() - t0 < HOLD_S:
            pg.consume_input()
            if pg.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the connection was closed")
            time.sleep(0.2)


@pytest.mark.parametrize("call,how", [("acquire", "statement"), ("durable", "statement"),
                                      ("acquire", "caught"), ("acquire", "pipeline")])
def test_a_lease_call_that_keeps_its_transaction_open_does_not_stop_the_fleet(
        make_cluster, call, how):
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    a = holder(make_cluster, r)
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    x = Intruder(r)
    now = int(time.time() * 1000)
    if call == "acquire":
        req = {"node": x.node, "incarnation": "", "lsn": "0/0", "name": "intruder",
               "layout": x.layout, "block_size": 16, "max_worker_id": 1023,
               "allowed": list(range(64)), "want": 1, "lease_ms": 6000, "grace_ms": 1200,
               "high_ms": now + 66_000}
    else:
        req = {"wait_ms": 0}
    errors: list[str] = []
    mark = r.log_mark()

    def run():
        try:
            hold(x, how, call, req)
        except psycopg.Error as e:
            errors.append(f"{e.sqlstate} {e}".strip())
    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    stopped_at = None
    while t.is_alive() and time.monotonic() - t0 < HOLD_S + 10:
        if maker_a.refusals and stopped_at is None:
            stopped_at = time.monotonic() - t0
        time.sleep(0.2)
    held = time.monotonic() - t0
    t.join(timeout=30)
    x.close()
    made = len(maker_a.made)
    wait_until(lambda: len(maker_a.made) > made, timeout=60, what="A making IDs again")
    refusals = maker_a.refusals[:]
    problems = duplicates({"A": maker_a.stop()})
    print(f"\n[lock kept, {call} {how}] the session held {held:.1f} s ({errors or 'no error'});"
          f" A refused from {stopped_at} s, {len(refusals)} refusals, first:"
          f" {refusals[0].sqlstate + ' ' + str(refusals[0]).splitlines()[0] if refusals else None}")
    assert not problems, "; ".join(problems)
    assert stopped_at is None, (f"A stopped making IDs {stopped_at:.1f} s after the lease role's"
                                f" call began ({held:.1f} s long)")
    assert held < HOLD_S / 2, f"the lease role's session kept its transaction {held:.1f} s"
    assert errors and ("57P01" in errors[0] or "closed" in errors[0]), errors
    wait_until(lambda: "kept the registry's lock over 2000 ms" in r.log(mark), timeout=10,
               what="the registry's log line")
