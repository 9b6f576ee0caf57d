"""The registry enforces the fleet's limits (issue 30; src/sql/leases.sql:
snowflake_lease_limits, snowflake_lease_check): no request can exceed them.

A caller with only the lease role's documented rights (USAGE on
snowflake_id_internal and EXECUTE on the lease functions,
docs/operations/fleet.md) introduces a made-up node with
snowflake_lease_hello and calls snowflake_lease_acquire/renew/release with
crafted requests: a 10-year lease, a 10-year grace, 64 blocks, a mark a year
ahead, a mark near 2^63, a release with mark 0. Each is refused (54000, the
node and the limit named, and a LOG line on the registry naming the node) or
clamped; afterwards the lease table is emptied (a new, fenced incarnation,
as after a failover that lost grants): no bigint error, a fence no longer
than the limits allow, and a new holder makes IDs while the first one goes
on. 0.6.0 granted each request; a later new incarnation was then fenced
until 2036, floored a year ahead or failed with 'bigint out of range', and
a release with mark 0 let the next holder start at 1970.

Real servers, as tests/fleet/test_leases.py starts them; lease times of
6 s, and the registry's limits set to match (a fence of 6 s + 1.2 s).
SNOWFLAKE_LIMITS_REGISTRY=0.6.0 makes every registry here a 0.6.0 one (its
install script from tests/upgrade/, no limits): the tests then fail as the
issue describes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time

import psycopg
import pytest

from harness import wait_until
from helpers import can_make_id, config, ids, lease_schema, old_release, run_client
from fleet_helpers import DEFAULT_LAYOUT, holder, registry_server

OLD = os.environ.get("SNOWFLAKE_LIMITS_REGISTRY")   # e.g. "0.6.0": the registry's version

# The registry's limits for 6 s leases (LEASE): a holder asks for lease_ms
# 6000, grace_ms 1200 (lease::Timing) and marks of its clock + 6 s + the
# default max_drift (60 s); 4 s more for its clock, on the same machine.
LIMITS = {"max_lease_ms": 6000, "max_grace_ms": 1200, "max_ahead_ms": 70_000}
FENCE_S = (LIMITS["max_lease_ms"] + LIMITS["max_grace_ms"]) / 1000
TEN_YEARS_MS = 10 * 365 * 86_400_000
YEAR_MS = 365 * 86_400_000
NEAR_2_63 = 2**63 - 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def limited_registry(make_cluster, **limits):
    """A registry (fsync on) with the limits for LEASE, or 0.6.0's."""
    if OLD:
        r = make_cluster(settings={"fsync": True})
        with old_release(OLD):
            r.sql(f"CREATE EXTENSION snowflake_id VERSION '{OLD}'")
        return r
    r = registry_server(make_cluster)
    set_limits(r, **{**LIMITS, **limits})
    return r


def set_limits(r, **limits) -> dict:
    args = ", ".join(f"{k} => {int(v)}" if k != "layout" else f"{k} => %s"
                     for k, v in limits.items())
    return {name: (value, fence, until) for name, value, fence, until
            in r.sql(f"SELECT * FROM snowflake_lease_set_limits({args})",
                     *[v for k, v in limits.items() if k == "layout"])}


def lease_role(r) -> None:
    """The lease role with the documented rights only."""
    schema = lease_schema(r)
    r.sql("CREATE ROLE snowflake_lease LOGIN")
    r.sql(f"GRANT USAGE ON SCHEMA {schema} TO snowflake_lease")
    functions = [f"{schema}.snowflake_lease_{f}" for f in
                 ("hello(text)", "acquire(jsonb)", "renew(jsonb)", "release(jsonb)",
                  "durable(jsonb)")]
    for f in functions:
        if r.scalar("SELECT to_regprocedure(%s) IS NOT NULL", f):
            r.sql(f"GRANT EXECUTE ON FUNCTION {f} TO snowflake_lease")


class Intruder:
    """A session of the lease role under a made-up node id, calling the
    lease functions with crafted requests."""

    def __init__(self, r, node: str = "intruder"):
        self.r = r
        self.node = node
        self.schema = lease_schema(r)
        self.conn = r.connect(user="snowflake_lease")
        assert self.conn.execute(f"SELECT {self.schema}.snowflake_lease_hello(%s)",
                                 (node,)).fetchone()[0] is True
        rows = r.sql("SELECT DISTINCT layout FROM snowflake_lease_blocks")
        self.layout = rows[0][0] if rows else DEFAULT_LAYOUT

    def close(self) -> None:
        self.conn.close()

    def call(self, fn: str, **req):
        body = {"node": self.node, "incarnation": "", "lsn": "0/0", **req}
        got = self.conn.execute(f"SELECT {self.schema}.snowflake_lease_{fn}(%s::jsonb)::text",
                                (json.dumps(body),)).fetchone()[0]
        return json.loads(got)

    def acquire(self, **req):
        base = {"name": "intruder", "layout": self.layout, "block_size": 16,
                "max_worker_id": 1023, "allowed": list(range(64)), "want": 1,
                "lease_ms": 6000, "grace_ms": 1200, "high_ms": now_ms() + 66_000}
        return self.call("acquire", **{**base, **req})

    def renew(self, blocks: list[int], **req):
        base = {"layout": self.layout, "block_size": 16, "max_worker_id": 1023,
                "blocks": [{"block": b, "high_ms": now_ms()} for b in blocks],
                "lease_ms": 6000, "grace_ms": 1200, "high_ms": now_ms() + 66_000}
        return self.call("renew", **{**base, **req})


@contextlib.contextmanager
def refused(r, sqlstate: str, *words: str):
    """The call in the block is refused with `sqlstate`, a message naming
    the intruder and `words`, and a LOG line on the registry naming it.
    On a 0.6.0 registry (OLD) nothing is checked: the test goes on to show
    what follows when the request is granted."""
    if OLD:
        with contextlib.suppress(psycopg.Error):
            yield
        return
    mark = r.log_mark()
    with pytest.raises(psycopg.Error) as e:
        yield
    err = e.value
    assert err.sqlstate == sqlstate, f"{err.sqlstate} {err}"
    text = str(err)
    assert "intruder" in text and all(w in text for w in words), text
    wait_until(lambda: re.search(r"LOG: .*refused .*node intruder", r.log(since=mark)),
               timeout=10, what="the registry's LOG line naming the node")


def intruder_blocks(r) -> int:
    return r.scalar("SELECT count(*) FROM snowflake_lease_blocks WHERE holder_node = 'intruder'")


def attack(kind: str, r, intruder: Intruder) -> None:
    """One request beyond the limits, refused or clamped."""
    if kind == "ten_year_lease":
        with refused(r, "54000", "max_lease_ms"):
            intruder.acquire(lease_ms=TEN_YEARS_MS)
        # Within the limits it leases; a renewal for ten years is refused.
        got = intruder.acquire()["blocks"]
        assert len(got) == 1, got
        with refused(r, "54000", "max_lease_ms"):
            intruder.renew([got[0]["block"]], lease_ms=TEN_YEARS_MS)
    elif kind == "ten_year_grace":
        with refused(r, "54000", "max_grace_ms"):
            intruder.acquire(grace_ms=TEN_YEARS_MS)
    elif kind == "all_blocks":
        with refused(r, "54000", "max_blocks_per_node"):
            intruder.acquire(want=64)
        # One at a time: no more than max_blocks_per_node (8 by default).
        for _ in range(8):
            assert len(intruder.acquire()["blocks"]) == 1, \
                f"the intruder leased {intruder_blocks(r)} blocks"
        with refused(r, "54000", "max_blocks_per_node"):
            intruder.acquire()
        assert intruder_blocks(r) == 8
        # Another node in the same session is refused too.
        with refused(r, "54000"):
            intruder.conn.execute(f"SELECT {intruder.schema}.snowflake_lease_hello('intruder2')")
    elif kind == "mark_a_year_ahead":
        with refused(r, "54000", "max_ahead_ms"):
            intruder.acquire(high_ms=now_ms() + YEAR_MS)
        got = intruder.acquire()["blocks"]
        with refused(r, "54000", "max_ahead_ms"):
            intruder.renew([got[0]["block"]], high_ms=now_ms() + YEAR_MS)
    elif kind == "mark_near_2_63":
        with refused(r, "54000", "max_ahead_ms"):
            intruder.acquire(high_ms=NEAR_2_63)
        got = intruder.acquire()["blocks"]
        block = got[0]["block"]
        with refused(r, "54000", "max_ahead_ms"):
            intruder.renew([block], high_ms=NEAR_2_63)
        with refused(r, "54000", "max_ahead_ms"):
            intruder.call("release", block=block, high_ms=NEAR_2_63)
        with refused(r, "22023"):
            intruder.acquire(high_ms=-NEAR_2_63)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["ten_year_lease", "ten_year_grace", "all_blocks",
                                  "mark_a_year_ahead", "mark_near_2_63"])
def test_a_request_beyond_the_limits_is_refused_and_the_fleet_goes_on(make_cluster, kind):
    """H makes IDs; the intruder's request beyond the limits is refused
    (54000 naming it and the limit, logged on the registry). Then the lease
    table's free rows are deleted, which starts a new, fenced incarnation
    (as a failover that lost grants does): no error, fenced for at most the
    limits' lease + grace, floors at most the limits' lead + grace ahead; a
    new holder N makes IDs once the fence is over, H goes on, no ID twice.
    0.6.0 grants each request; then the DELETE fences until 2036 (ten-year
    lease or grace), raises every floor a year ahead (N makes no ID), or
    fails with 'bigint out of range' (a mark near 2^63); all_blocks: the
    intruder leases every free block."""
    r = limited_registry(make_cluster)
    lease_role(r)
    h = holder(make_cluster, r)
    with h.connect() as conn:
        made = ids(conn, 100)
    intruder = Intruder(r)
    try:
        attack(kind, r, intruder)
    finally:
        intruder.close()
    assert intruder_blocks(r) <= 8

    node_h = config(h)["node_id"]
    before = now_ms()
    # A row to forget even when the intruder was refused every block (a
    # DELETE that deletes no row fences nothing): the last block, free.
    r.sql("INSERT INTO snowflake_lease_blocks (block, first_worker_id, last_worker_id, layout,"
          " high_water_ms) SELECT 63, 1008, 1023, layout, 0 FROM snowflake_lease_blocks"
          " LIMIT 1 ON CONFLICT DO NOTHING")
    r.sql("DELETE FROM snowflake_lease_blocks WHERE holder_node IS DISTINCT FROM %s", node_h)
    fenced_until, floor_ms = r.sql(
        "SELECT (extract(epoch FROM fenced_until) * 1000)::bigint, fence_floor_ms"
        " FROM snowflake_lease_registry")[0]
    assert fenced_until is not None
    assert fenced_until - before <= FENCE_S * 1000 + 2000, \
        f"fenced for {(fenced_until - before) / 1000:.0f} s"
    ahead = floor_ms - before
    assert ahead <= LIMITS["max_ahead_ms"] + LIMITS["max_grace_ms"] + 2000, \
        f"floors raised {ahead / 1000:.0f} s ahead"

    n = holder(make_cluster, r)
    with n.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=60, what="N making IDs")
        made_n = ids(conn, 100)
    with h.connect() as conn:
        made += ids(conn, 100)
    assert len(set(made) | set(made_n)) == len(made) + len(made_n)
    assert r.scalar("SELECT max(fenced_until) < now() + interval '10 s'"
                    " FROM snowflake_lease_registry")


def test_a_release_never_lowers_a_mark_below_the_floor_it_was_leased_with(make_cluster):
    """H makes IDs from block 0 and stops; its lease runs out (its expiry
    set in the past, as a registry clock ahead would do). The intruder
    leases block 0 (its floor: H's mark, above H's IDs) and gives it back
    with mark 0. The block's floor stays at least H's mark, and a new
    holder's IDs are above H's. 0.6.0 records mark 0: the next holder
    starts above 1970, and one whose clock is behind H's last ID makes IDs
    H made."""
    one_block = {"snowflake_id.worker_ids": "0-15"}
    r = limited_registry(make_cluster)
    lease_role(r)
    h = holder(make_cluster, r, **one_block)
    with h.connect() as conn:
        made = ids(conn, 1000)
    h.stop()
    mark_h = r.scalar("SELECT high_water_ms FROM snowflake_lease_blocks WHERE block = 0")
    r.sql("UPDATE snowflake_lease_blocks SET expires_at = now() - interval '1 hour'")
    intruder = Intruder(r)
    try:
        got = intruder.acquire(allowed=[0])["blocks"]
        assert got == [{"block": 0, "floor_ms": mark_h}], got
        assert intruder.call("release", block=0, high_ms=0)["released"] is True
    finally:
        intruder.close()
    after = r.scalar("SELECT high_water_ms FROM snowflake_lease_blocks WHERE block = 0")
    assert after >= mark_h, f"the release lowered block 0's mark from {mark_h} to {after}"
    n = holder(make_cluster, r, **one_block)
    with n.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=60, what="N leasing block 0")
        made_n = ids(conn, 1000)
    assert min(made_n) > max(made)


def test_a_re_assertion_takes_no_more_than_max_blocks_per_node(make_cluster):
    """During a fence, a node that knew the older incarnation re-asserts the
    blocks it names. The intruder learns the incarnation from a lease of its
    own; the lease table is emptied (a new, fenced incarnation that forgot
    every row), and the intruder "re-asserts" 20 blocks: it gets no more
    than max_blocks_per_node (8), and the registry logs it. 0.6.0 gives it
    all 20."""
    r = limited_registry(make_cluster)
    lease_role(r)
    intruder = Intruder(r)
    try:
        known = intruder.acquire()["incarnation"]
        r.sql("DELETE FROM snowflake_lease_blocks")
        mark = r.log_mark()
        got = intruder.renew(list(range(20)), incarnation=known)
    finally:
        intruder.close()
    assert got["fenced_until_ms"] is not None, got
    assert len(got["blocks"]) <= 8, f"the intruder re-asserted {len(got['blocks'])} blocks"
    assert intruder_blocks(r) <= 8
    assert re.search(r"node intruder re-asserted 20 blocks", r.log(since=mark))


@pytest.mark.skipif(bool(OLD), reason="0.6.0 has no limits to set")
def test_a_holder_beyond_the_limits_says_which_setting_and_leases_once_raised(make_cluster):
    """A holder whose snowflake_id.lease_time (60 s) is above the registry's
    max_lease_ms (6 s) is refused: its sessions' 55000 and its log name
    the limit, the setting to lower and this server's value. Once the
    limit is raised it leases. (0.6.0 has no limits: it grants whatever
    a request says.)"""
    r = limited_registry(make_cluster)
    h = holder(make_cluster, r, **{"snowflake_id.lease_time": "60s"})
    wait_until(lambda: "max_lease_ms" in h.log(), timeout=60, what="the refusal in H's log")
    log = h.log()
    assert "refused a call" in log and "snowflake_id.lease_time" in log, log[-2000:]
    assert "snowflake_id.lease_time = 60000 ms" in log, log[-2000:]
    with h.connect(options="-c statement_timeout=60s") as conn:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            conn.execute("SELECT snowflake_nextval()")
    assert "max_lease_ms" in (e.value.diag.message_detail or ""), e.value.diag.message_detail
    set_limits(r, max_lease_ms=60_000, max_grace_ms=12_000, max_ahead_ms=130_000)
    with h.connect() as conn:
        wait_until(lambda: can_make_id(conn), timeout=60, what="H leasing")
    assert r.scalar("SELECT max_lease_ms FROM snowflake_lease_registry") == 60_000


@pytest.mark.skipif(bool(OLD), reason="0.6.0 has no limits to set")
def test_the_limits_are_checked_kept_after_lowering_and_dumped(make_cluster):
    """snowflake_lease_set_limits() refuses values out of range (22023) and
    a DELETE of the limits (55000); for the owner only. Lowered while a
    grant made under the higher limit runs, fences keep the higher values
    until it has run out. pg_dump dumps the row."""
    r = registry_server(make_cluster)
    defaults = set_limits(r)
    assert defaults["max_lease_ms"] == (600_000, 600_000, None)
    bad_reserve = ()
    if "reserve_blocks" in defaults:   # 0.8.0
        assert defaults["reserve_blocks"] == (8, 8, None)
        bad_reserve = ({"reserve_blocks": -1}, {"reserve_blocks": 64})
    if "max_blocks_per_role" in defaults:   # 0.8.0: none by default, 0 removes it
        assert defaults["max_blocks_per_role"] == (None, None, None)
        assert set_limits(r, max_blocks_per_role=8)["max_blocks_per_role"] == (8, 8, None)
        assert set_limits(r, max_blocks_per_role=0)["max_blocks_per_role"] == (None, None, None)
        bad_reserve += ({"max_blocks_per_role": -1}, {"max_blocks_per_role": 65})
    for bad in ({"max_lease_ms": 1000}, {"max_lease_ms": 86_400_001},
                {"max_grace_ms": -1}, {"max_ahead_ms": 2**62}, {"max_blocks_per_node": 65},
                *bad_reserve):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            set_limits(r, **bad)
    h = holder(make_cluster, r)
    with h.connect() as conn:
        ids(conn, 10)
    # Lowered while H's grant (made under the defaults) runs.
    got = set_limits(r, **LIMITS)
    assert got["max_lease_ms"][:2] == (6000, 600_000), got
    assert got["max_lease_ms"][2] is not None, got
    before = now_ms()
    r.sql("DELETE FROM snowflake_lease_blocks")
    fence_ms = r.scalar("SELECT (extract(epoch FROM fenced_until) * 1000)::bigint"
                        " FROM snowflake_lease_registry") - before
    assert 600_000 + 120_000 - 5000 <= fence_ms <= 600_000 + 120_000 + 5000, fence_ms
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        r.sql("DELETE FROM snowflake_lease_limits")
    r.sql("CREATE ROLE someone LOGIN")
    with r.connect(user="someone") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM snowflake_lease_set_limits(max_lease_ms => 86400000)")
    dump = run_client(r, "pg_dump", "--data-only", "-t", "snowflake_lease_limits",
                      "postgres").stdout
    assert re.search(r"^6000\t1200\t70000\t8\t", dump, flags=re.M), dump


@pytest.mark.skipif(bool(OLD), reason="about the update to the limits")
def test_an_update_from_0_6_0_keeps_serving_holders_with_longer_leases(make_cluster):
    """A 0.6.0 registry serves a holder with a 20-minute lease time (above
    the default max_lease_ms). ALTER EXTENSION UPDATE sets the limits to
    what the holder asked for (a WARNING says so), and the holder's next
    renewals are granted: without that, the update would refuse them and
    the holder would stop at its deadline."""
    r = make_cluster(settings={"fsync": True})
    with old_release("0.6.0"):
        r.sql("CREATE EXTENSION snowflake_id VERSION '0.6.0'")
    h = holder(make_cluster, r, **{"snowflake_id.lease_time": "20min"})
    with h.connect() as conn:
        made = ids(conn, 10)
    notices = []
    with r.connect() as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute("ALTER EXTENSION snowflake_id UPDATE")
        updated_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert any("lease limits were set" in n for n in notices), notices
    limits = set_limits(r)
    assert limits["max_lease_ms"][0] == 1_200_000, limits
    assert limits["max_grace_ms"][0] == 240_000, limits
    # The lead seen (20 min + the default max_drift, minus the call's
    # latency), with 60 s for the holders' clocks.
    assert limits["max_ahead_ms"][0] >= 1_260_000 + 55_000, limits
    wait_until(lambda: r.scalar("SELECT max(renewed_at) FROM snowflake_lease_blocks"
                                " WHERE holder_node IS NOT NULL") > updated_at,
               timeout=60, what="a renewal after the update")
    assert "refused" not in h.log()
    with h.connect() as conn:
        assert min(ids(conn, 10)) > max(made)


# What the lease role may send, and may not make the registry believe
# (issue 42: found on 0.7.0 by the attack on real servers). With
# SNOWFLAKE_LIMITS_REGISTRY=0.7.0 (0.7.0's install script) each fails as
# the issue describes.

def registry_row(r) -> tuple:
    return r.sql("SELECT incarnation, fenced_until FROM snowflake_lease_registry")[0]


def test_a_position_from_a_node_holding_no_block_starts_no_incarnation(make_cluster):
    """One renewal from the lease role, for a node that holds no block,
    saying it saw WAL position FFFFFFFF/FFFFFFFF (with no token the
    registry issued): the registry keeps its incarnation, is not fenced,
    and leases the next request at once. 0.7.0 started a new incarnation
    ('a holder saw WAL position FFFFFFFF/FFFFFFFF') fenced for the limits'
    lease time plus grace, and could be kept fenced by repeating it."""
    r = limited_registry(make_cluster)
    lease_role(r)
    before = registry_row(r)
    assert before[1] is None
    x = Intruder(r)
    try:
        reply = x.renew([], lsn="FFFFFFFF/FFFFFFFF", incarnation=before[0])
        assert reply["fenced_until_ms"] is None, reply
        assert registry_row(r) == before
        assert len(x.acquire()["blocks"]) == 1
    finally:
        x.close()
    assert registry_row(r) == before


def test_a_made_up_layout_does_not_lock_out_the_fleet(make_cluster):
    """The lease role's first acquire names the layout 'not a layout' on a
    fresh registry: it is refused (55000, another layout: the fleet's
    layout is the registry server's own settings until the DBA fixes one),
    no row is made, and a real holder leases at once. 0.7.0 made all 64
    rows under the made-up layout, and refused every real holder until the
    table was edited. The DBA can still fix another layout with
    snowflake_lease_set_limits(layout => ...)."""
    r = limited_registry(make_cluster)
    lease_role(r)
    x = Intruder(r)
    try:
        with pytest.raises(psycopg.Error) as err:
            x.acquire(layout="not a layout")
        assert err.value.sqlstate == "55000", err.value
        assert "another layout" in str(err.value)
    finally:
        x.close()
    assert r.scalar("SELECT count(*) FROM snowflake_lease_blocks") == 0
    h = holder(make_cluster, r)
    with h.connect(options="-c statement_timeout=60s") as conn:
        wait_until(lambda: can_make_id(conn), timeout=60, what="the real holder leasing")
    assert {row[0] for row in r.sql("SELECT layout FROM snowflake_lease_blocks")} == {DEFAULT_LAYOUT}
    set_limits(r, layout=DEFAULT_LAYOUT)
    assert r.scalar("SELECT layout FROM snowflake_lease_limits") == DEFAULT_LAYOUT


def test_a_request_without_a_token_is_served_and_the_reply_has_one(make_cluster):
    """A 0.7.0 holder's requests carry no token: a lease and its renewal
    (the reply's incarnation and WAL position, no token) are served in the
    same incarnation, unfenced. Every reply carries the registry's token
    (32 hex digits) for its incarnation and position; 0.7.0's replies have
    none."""
    r = limited_registry(make_cluster)
    lease_role(r)
    x = Intruder(r)
    try:
        first = x.acquire()
        block = first["blocks"][0]["block"]
        again = x.renew([block], incarnation=first["incarnation"], lsn=first["lsn"])
        assert again["incarnation"] == first["incarnation"], (first, again)
        assert [b["block"] for b in again["blocks"]] == [block]
        assert again["fenced_until_ms"] is None
        for reply in (first, again):
            assert re.fullmatch(r"[0-9a-f]{40}", reply.get("token", "")), reply
        assert first["token"] != again["token"]
    finally:
        x.close()
