"""Adversarial: stalls (issue 42, attack 5), on real servers.

Holder A (6 s leases) makes IDs in batches, each batch timed by the wall
clock; holder B wants the same block (worker ids 0-15, max_drift 1 s).
Then one process is stopped with SIGSTOP for 25 s: A's lease worker, the
registry backend serving A's lease session, or the registry's
postmaster. The docs (docs/operations/fleet.md, fleet-fencing.md "Holders
and saved leases") say a holder stops using a block at its deadline
however long the registry stalls. Measured: the last batch of A's that
began after A's deadline (snowflake_config().lease_deadline, read once it
can no longer move) and still made IDs. Issue 42: 0.7.0 made IDs up to
4.5 s past the deadline.

Safety: no ID made by both A and B."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness import wait_until
from helpers import config
from fleet_helpers import (CONTESTED, duplicates, holder, lease_limits, registry_server,
                          resume, STALL_S, TimedMaker)

# Clock readings of the test and the server, on one machine.
SLACK_S = 0.05


def stalled_pid(what: str, r, a) -> int:
    if what == "lease_worker":
        return a.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowflake_id lease'")
    if what == "registry_backend":
        return r.scalar("SELECT pid FROM pg_stat_activity WHERE application_name = 'snowflake_id lease'")
    if what == "registry_postmaster":
        with open(os.path.join(r.datadir, "postmaster.pid")) as f:
            return int(f.readline())
    raise AssertionError(what)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["lease_worker", "registry_backend", "registry_postmaster"])
def test_a_stalled_process_lets_no_session_use_a_block_past_its_deadline(make_cluster, what):
    r = registry_server(make_cluster)
    lease_limits(r)
    a = holder(make_cluster, r, **CONTESTED)
    maker_a = TimedMaker(a)
    wait_until(lambda: maker_a.batches, timeout=60, what="A's first IDs")
    b = holder(make_cluster, r, **CONTESTED)
    maker_b = TimedMaker(b)
    wait_until(lambda: maker_b.refusals, timeout=60, what="B waiting for block 0")
    time.sleep(2)
    pid = stalled_pid(what, r, a)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        # Whatever reply was on its way has arrived: the deadline can no
        # longer move while the process is stopped.
        time.sleep(1.5)
        deadline = config(a)["lease_deadline"]
        time.sleep(STALL_S - 1.5)
    finally:
        resume([pid])
    time.sleep(10)
    made = {"A": maker_a.stop(), "B": maker_b.stop()}
    problems = duplicates(made)
    d = deadline.timestamp() if deadline else stopped_at
    late = [(t0 - d, len(got)) for t0, _, got in maker_a.batches if t0 > d + SLACK_S]
    during = [t0 for t0, _, _ in maker_a.batches if stopped_at < t0 < stopped_at + STALL_S]
    b_first = min((t0 for t0, _, _ in maker_b.batches), default=None)
    print(f"\n[stall {what}] deadline {deadline} ({d - stopped_at:.2f} s after the stop);"
          f" A's batches begun during the stall: {len(during)}, the last"
          f" {max(during) - d if during else float('nan'):.2f} s after the deadline;"
          f" B's first IDs {b_first - stopped_at if b_first else float('nan'):.2f} s after the stop;"
          f" A made {len(made['A'])}, B {len(made['B'])}")
    assert not problems, "; ".join(problems)
    if what != "registry_postmaster":
        assert not late, (f"A made IDs in {len(late)} batches begun after its deadline, up to"
                          f" {max(x[0] for x in late):.2f} s after it")
    else:
        # Sessions already open go on; A keeps its block throughout.
        assert during and max(during) > stopped_at + STALL_S - 2, \
            "A stopped making IDs while only the registry's postmaster was stopped"
