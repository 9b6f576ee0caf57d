"""Adversarial: registry failover with the old primary left running (issue
42, attack 2), on real servers.

The registry P has one synchronous standby s1 (synchronous_standby_names
= 'FIRST 1 (s1)'), with snowflake_id.registry_standby_name = 's1' on s1
(named) or unset (unnamed). Holders A and C both want block 0 (worker ids
0-15, max_drift 1 s, so that a floor raised by a fence stays close to the
clocks and an overlap would show); B leases anywhere. A and B name P
first, then s1; C names s1 first, then P (target_session_attrs=read-write:
before the promotion C reaches P). s1 is promoted while they make IDs, and
P is NOT stopped: P still accepts read-write sessions, and every commit
there waits for s1, which no longer streams from it.

Safety: no ID made by two holders. Reported: how long each holder made no
ID after the promotion (liveness), and the promoted registry's
incarnation."""

from __future__ import annotations

import time

import pytest

from harness import wait_until
from helpers import Maker, worker_of
from fleet_helpers import (duplicates, holder, hosts, lease_limits, named_standby,
                           registry_state, require_sync)

CONTESTED = {"snowflake_id.worker_ids": "0-15", "snowflake_id.max_drift": "1s"}
RUN_S = 40


def gap_after(maker: Maker, t0: float) -> str:
    """How `maker` fared after monotonic time t0."""
    return f"{len(maker.made)} IDs, last batch {maker.last_at - t0:.1f} s after the promotion" \
        if maker.last_at else "no IDs"


@pytest.mark.slow
@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_promotion_with_the_old_primary_left_running_repeats_no_id(make_cluster, named):
    p = make_cluster(tcp=True, settings={"fsync": True})
    p.create_extension()
    lease_limits(p)
    s1 = named_standby(make_cluster, p, "s1", "s1" if named else None)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **{"snowflake_id.registry": hosts(p, s1)}, **CONTESTED)
    maker_a = Maker(a, statement_timeout="40s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    b = holder(make_cluster, p, **{"snowflake_id.registry": hosts(p, s1)})
    maker_b = Maker(b, statement_timeout="40s")
    c = holder(make_cluster, p, **{"snowflake_id.registry": hosts(s1, p)}, **CONTESTED)
    maker_c = Maker(c, statement_timeout="40s")
    wait_until(lambda: maker_b.made and maker_c.refusals, timeout=60,
               what="B making IDs, C waiting for block 0")
    before = registry_state(p)
    t0 = time.monotonic()
    s1.promote()
    time.sleep(RUN_S)
    after = registry_state(s1)
    old = registry_state(p)
    made = {"A": maker_a.stop(), "B": maker_b.stop(), "C": maker_c.stop()}
    problems = duplicates(made)
    print(f"\n[failover, {'named' if named else 'unnamed'}, old primary running]"
          f" P: {before} then {old}; s1: {after};"
          f" A {gap_after(maker_a, t0)}; B {gap_after(maker_b, t0)}; C {gap_after(maker_c, t0)};"
          f" C's blocks {sorted({worker_of(i) // 16 for i in made['C']})}")
    assert not problems, "; ".join(problems)
