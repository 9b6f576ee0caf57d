"""Adversarial: the sessions' stop at a block's deadline (a stop time per
slot, computed by the lease worker on its clock, compared by each session
with its own before every ID), against a clock stepped back on the
holder's backends.

Holder A (6 s leases, worker ids 0-15, max_drift 1 s) runs under
libfaketime: on Debian's PostgreSQL 15 it reaches the client backends and
not the lease worker (tests/fleet/test_leases.py), so the sessions' clock
is stepped back while the worker's stop stays on the real clock. Holder B
wants the same block. A's lease worker is then stopped (SIGSTOP) for 25 s
and continued: the block goes to B while A's sessions still run.

Safety: no ID made by both A and B, whatever A's sessions' clock says.
Measured (printed): how long after its deadline A's sessions went on
making IDs, and when B made its first."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness import wait_until
from helpers import LIBFAKETIME, FakeClock, config, server_skew
from fleet_helpers import (CONTESTED, duplicates, holder, lease_limits, registry_server,
                          resume, STALL_S, TimedMaker)

pytestmark = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")



def lease_worker_pid(c) -> int:
    return c.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowflake_id lease'")


@pytest.mark.slow
@pytest.mark.parametrize("back", ["-0.8", "-5", "-60"])
def test_a_holders_clock_stepped_back_repeats_no_id_when_its_block_is_handed_over(
        make_cluster, back):
    """A's sessions' clock is stepped back by `back` seconds (within
    max_drift, beyond it, far beyond) while A makes IDs and B waits for the
    block; then A's lease worker stops for 25 s, so that the block goes to
    B while A's sessions, behind the real clock, still run."""
    r = registry_server(make_cluster)
    lease_limits(r)
    a = holder(make_cluster, r, start=False, **CONTESTED)
    clock = FakeClock(a.dir)
    a.start(env=clock.env())
    a.create_extension()
    maker_a = TimedMaker(a)
    wait_until(lambda: maker_a.batches, timeout=60, what="A's first IDs")
    b = holder(make_cluster, r, **CONTESTED)
    maker_b = TimedMaker(b)
    wait_until(lambda: maker_b.refusals, timeout=60, what="B waiting for block 0")
    clock.set(back)
    with a.connect() as conn:
        skew = server_skew(conn)
    stepped_at = time.time()
    time.sleep(1.0)
    pid = lease_worker_pid(a)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        time.sleep(1.5)
        deadline = config(a)["lease_deadline"]
        time.sleep(STALL_S - 1.5)
    finally:
        resume([pid])
    time.sleep(10)
    made = {"A": maker_a.stop(), "B": maker_b.stop()}
    problems = duplicates(made)
    d = deadline.timestamp() if deadline else stopped_at
    after_step = [t0 for t0, _, _ in maker_a.batches if t0 > stepped_at]
    late = [t0 - d for t0, _, _ in maker_a.batches if t0 > d]
    # When B's first IDs had been made (its first batch waited for the
    # block), and A's batches begun after that.
    b_first = min((t1 for _, t1, _ in maker_b.batches if t1 > stopped_at), default=None)
    both = [t0 - b_first for t0, _, _ in maker_a.batches if b_first and t0 > b_first]
    print(f"\n[stop, clock {back} s] A's skew {skew:.2f} s; deadline"
          f" {d - stopped_at:.2f} s after the SIGSTOP; A's batches after the step:"
          f" {len(after_step)}, begun after the deadline: {len(late)}, the last"
          f" {max(late) if late else float('nan'):.2f} s after it; B's first IDs"
          f" {b_first - stopped_at if b_first else float('nan'):.2f} s after the SIGSTOP; A's"
          f" batches begun after that: {len(both)}, the last"
          f" {max(both) if both else float('nan'):.2f} s after;"
          f" A made {len(made['A'])}, B {len(made['B'])}")
    assert not problems, "; ".join(problems)
    assert b_first is not None, "B made no ID"
    # The stop follows A's sessions' clock: stepped back, they go on past
    # the deadline up to the step (docs/design/fleet-fencing.md), under the
    # mark still, which B's floor is above: no bound on `late` here.


@pytest.mark.slow
def test_a_lease_worker_stopped_and_continued_again_and_again_repeats_no_id(make_cluster):
    """A's lease worker (real clocks here) is stopped with SIGSTOP and
    continued, again and again: stopped for 4 to 8 s (around the 6 s lease
    and its 1.2 s grace), running for 0.05 to 0.5 s, for 40 s, while A's
    sessions make IDs and B wants the same block. Each continue may find a
    renewal's reply, a revoked block or B holding it. Wanted: no ID made by
    both; the block changes hands (printed: how often each made IDs)."""
    import random
    rng = random.Random(16)
    r = registry_server(make_cluster)
    lease_limits(r)
    a = holder(make_cluster, r, **CONTESTED)
    maker_a = TimedMaker(a)
    wait_until(lambda: maker_a.batches, timeout=60, what="A's first IDs")
    b = holder(make_cluster, r, **CONTESTED)
    maker_b = TimedMaker(b)
    wait_until(lambda: maker_b.refusals, timeout=60, what="B waiting for block 0")
    pid = lease_worker_pid(a)
    first_stop = time.time()
    end = first_stop + 40
    cycles = 0
    try:
        while time.time() < end:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(rng.uniform(4.0, 8.0))
            os.kill(pid, signal.SIGCONT)
            time.sleep(rng.uniform(0.05, 0.5))
            cycles += 1
    finally:
        resume([pid])
    time.sleep(5)
    made = {"A": maker_a.stop(), "B": maker_b.stop()}
    problems = duplicates(made)

    def runs(m):
        # Runs of batches that came back less than 1 s apart (seconds from
        # the first stop): when a server held the block and made IDs. (A
        # batch's start is no time: it may wait for a lease.)
        out = []
        for _, t1, _ in m.batches:
            if out and t1 - out[-1][1] < 1.0:
                out[-1][1] = t1
            else:
                out.append([t1, t1])
        return [(round(x - first_stop, 1), round(y - first_stop, 1)) for x, y in out]
    b_first = min((t1 for _, t1, _ in maker_b.batches), default=None)
    both = sum(1 for t0, _, _ in maker_a.batches if b_first and t0 > b_first)
    print(f"\n[stop/continue] {cycles} cycles; A made {len(made['A'])} IDs, runs {runs(maker_a)};"
          f" B {len(made['B'])}, runs {runs(maker_b)}; A's batches begun after B's first IDs:"
          f" {both}")
    assert not problems, "; ".join(problems)
