"""Adversarial: the reserve of blocks for new servers (reserve_blocks,
default 8, core/src/registry/blocks.rs) against the lease role, and
against a legitimate fleet.

docs/operations/fleet.md grants the lease role CONNECTION LIMIT 20 and
says a session introduces one node only (snowflake_lease_hello refuses a
second), so that the reserve keeps a block for a new server while fewer
than reserve_blocks sessions arrive holding none. The attacks: every
session the limit allows, each a node taking what it may; one session
that gives up its node's lock (pg_advisory_unlock, open to every role)
and introduces another node, again and again. A new server B must still
make IDs. And the reserve must not keep a fleet of servers from the
blocks they want while more than the reserve is free.

Lease times of 6 s (fleet_helpers.LEASE), the registry's limits set to
match."""

from __future__ import annotations


import psycopg
import pytest

from harness import wait_until
from helpers import Maker
from fleet_helpers import (duplicates, first_ids_within, grant_lease_role, holder, Intruder,
                          lease_limits, registry_server, Repeat)


def fleet(make_cluster, reserve: int | None = None):
    """A registry with the lease role (reserve_blocks `reserve`, default
    if None), and holder A making IDs."""
    r = registry_server(make_cluster)
    lease_limits(r)
    if reserve is not None:
        r.sql("SELECT snowflake_lease_set_limits(reserve_blocks => %s)", reserve)
    grant_lease_role(r)
    a = holder(make_cluster, r)
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    return r, a, maker_a


def take_all(x: Intruder) -> int:
    """Blocks `x`'s node takes, one acquire at a time until refused or
    given none."""
    taken = 0
    for _ in range(64):
        try:
            got = len(x.acquire(want=8)["blocks"])
        except psycopg.Error as e:
            assert e.sqlstate == "54000", f"{e.sqlstate} {e}"
            break
        if not got:
            break
        taken += got
    return taken


def held_by(r, node: str) -> list[int]:
    return [b for (b,) in r.sql(
        "SELECT block FROM snowflake_lease_blocks WHERE holder_node = %s", node)]


def free_blocks(r) -> int:
    return r.scalar("SELECT 64 - count(*) FROM snowflake_leases WHERE leased")


def check(maker_a, maker_b) -> None:
    made = {"A": maker_a.stop(), "B": maker_b.stop()}
    problems = duplicates(made)
    assert not problems, "; ".join(problems)


@pytest.mark.xfail(strict=True, reason=(
    "measured on PostgreSQL 15: with the documented CONNECTION LIMIT 20 and the default"
    " reserve_blocks 8, 20 sessions of the lease role hold all 63 blocks A leaves (7"
    " sessions take 55, then 8 take one block of the reserve each) and B makes no ID in"
    " 20 s; docs/operations/fleet.md says to raise reserve_blocks to the limit minus the"
    " servers, but the defaults do not"))
def test_the_lease_roles_sessions_within_its_connection_limit_leave_a_new_server_a_block(
        make_cluster):
    """Every session CONNECTION LIMIT 20 allows, each a made-up node
    taking all it may, renewing every second; then a new server B."""
    r, a, maker_a = fleet(make_cluster)
    xs = [Intruder(r, node=f"intruder{i}") for i in range(20)]
    taken = [take_all(x) for x in xs]
    keep = Repeat(lambda: [x.renew(held_by(r, x.node)) for x in xs], every=1.0)
    left = free_blocks(r)
    b = holder(make_cluster, r)
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    keep.stop()
    for x in xs:
        x.close()
    check(maker_a, maker_b)
    print(f"\n[reserve/20 sessions] taken per session {taken} (sum {sum(taken)}), free after:"
          f" {left}; B's first IDs after {took} s")
    assert took is not None, (f"20 sessions of the lease role hold {sum(taken)} blocks"
                              f" ({left} free): B made no ID in 20 s")


def test_one_session_of_the_lease_role_is_one_node_only(make_cluster):
    """reserve_blocks 20, the lease role's whole CONNECTION LIMIT, as the
    docs advise. One session: takes what its node may, then unlocks its
    node's advisory lock (any role may) and introduces another node, up to
    60 nodes, renewing each node's blocks every second the same way. Then
    a new server B."""
    r, a, maker_a = fleet(make_cluster, reserve=20)
    x = Intruder(r, node="churn0")
    nodes = {}
    hello_refused = None

    def become(node: str) -> bool:
        x.conn.execute("SELECT pg_advisory_unlock(hashtextextended('snowflake_id node ' || %s, 0))",
                       (x.node,))
        ok = x.conn.execute(f"SELECT {x.schema}.snowflake_lease_hello(%s)", (node,)).fetchone()[0]
        x.node = node
        return ok

    for i in range(60):
        node = f"churn{i}"
        try:
            if i and not become(node):
                break
        except psycopg.Error as e:
            hello_refused = f"{e.sqlstate} {e}"
            break
        nodes[node] = take_all(x)
        if free_blocks(r) == 0:
            break

    def renew_all():
        for node in nodes:
            become(node)
            x.renew(held_by(r, node))
    keep = Repeat(renew_all, every=1.0) if hello_refused is None else None
    left = free_blocks(r)
    b = holder(make_cluster, r)
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    if keep:
        keep.stop()
    x.close()
    check(maker_a, maker_b)
    print(f"\n[reserve/one session] nodes {len(nodes)}, blocks {sum(nodes.values())}, free after"
          f" {left}, second hello: {hello_refused or 'accepted'}; B's first IDs after {took} s")
    assert hello_refused is not None or len(nodes) == 1, (
        f"one session of the lease role introduced {len(nodes)} nodes holding"
        f" {sum(nodes.values())} blocks ({left} free); B's first IDs after {took} s")
    assert took is not None


# (servers, blocks each wants, blocks the fleet gets): every block free
# beyond the reserve, and one of the reserve for each node still without.
@pytest.mark.parametrize("servers,want,expected", [(8, 2, 16), (30, 2, 58)])
def test_a_fleet_of_servers_gets_the_blocks_it_wants_beyond_the_reserve(make_cluster, servers,
                                                                         want, expected):
    """`servers` nodes (sessions standing in for servers' lease workers:
    the registry's rule is all that is measured) each want `want` blocks
    of the 64, acquiring in turns. Wanted: every node its first block, and
    the fleet every block beyond the reserve (8): 8 x 2 get all 16; 30 x 2
    get 56 before the reserve, and the last two nodes one each."""
    r = registry_server(make_cluster)
    lease_limits(r)
    xs = [Intruder(r, node=f"server{i}", user="postgres") for i in range(servers)]
    got = {x.node: 0 for x in xs}
    for _ in range(want):
        for x in xs:
            if got[x.node] < want:
                got[x.node] += len(x.acquire(want=want - got[x.node])["blocks"])
    for x in xs:
        x.close()
    leased = sum(got.values())
    short = [n for n, k in got.items() if k < want]
    print(f"\n[reserve/fleet {servers}x{want}] leased {leased} of 64; nodes short of {want}:"
          f" {len(short)}; without a block: {sum(1 for k in got.values() if k == 0)}")
    assert all(k >= 1 for k in got.values()), got
    assert leased == expected, got
