"""Adversarial: the lease role against the fleet's blocks: the reserve
(reserve_blocks, default 8) and the per-role limit (max_blocks_per_role,
core/src/registry/blocks.rs), and a legitimate fleet.

docs/operations/fleet.md gives each server a login role of its own,
members of the lease role group, with max_blocks_per_role at the per-node
limit, so that a leaked credential of one server takes at most that
server's share; and says a session introduces one node only
(snowflake_lease_hello refuses a second). The attacks: every session a
leaked server role may open, each a node taking what it may; the same
with one role shared by every server (outside the assumptions: nothing
tells its sessions from new servers'); one session that gives up its
node's lock (pg_advisory_unlock, open to every role) and introduces
another node, again and again. A new server B must still make IDs where
the assumptions hold. And the reserve must not keep a fleet of servers
from the blocks they want while more than the reserve is free.

Lease times of 6 s (fleet_helpers.LEASE), the registry's limits set to
match."""

from __future__ import annotations


import psycopg
import pytest

from harness import wait_until
from helpers import Maker
from fleet_helpers import (duplicates, first_ids_within, grant_lease_role, grant_server_roles,
                          holder, Intruder, lease_limits, registry_server, Repeat)


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


def test_a_leaked_credential_of_one_server_leaves_a_new_server_blocks(make_cluster):
    """The documented configuration: a login role per server, members of
    the lease role group, max_blocks_per_role at max_blocks_per_node (8).
    Server A leases as its own role. Server X's credential leaked: 20
    sessions of it (its CONNECTION LIMIT raised to 20 here, so that the
    per-role limit alone is what holds), each a made-up node taking all it
    may, renewing every second; then a new server B under its own role.
    Wanted: X's sessions hold at most 8 blocks together, and B makes IDs
    (0.7.0 and the shared role: they held every block A left, and B made
    none)."""
    r = registry_server(make_cluster)
    lease_limits(r)
    roles = grant_server_roles(r, ["a", "b", "x"])
    r.sql(f"ALTER ROLE {roles['x']} CONNECTION LIMIT 20")
    a = holder(make_cluster, r, **{"snowflake_id.registry": r.conninfo(user=roles["a"])})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    xs = [Intruder(r, node=f"intruder{i}", user=roles["x"]) for i in range(20)]
    taken = [take_all(x) for x in xs]
    keep = Repeat(lambda: [x.renew(held_by(r, x.node)) for x in xs], every=1.0)
    left = free_blocks(r)
    b = holder(make_cluster, r, **{"snowflake_id.registry": r.conninfo(user=roles["b"])})
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    keep.stop()
    by_role = dict(r.sql("SELECT holder_role, count(*) FROM snowflake_leases WHERE leased"
                         " GROUP BY holder_role"))
    for x in xs:
        x.close()
    check(maker_a, maker_b)
    print(f"\n[reserve/leaked server role, 20 sessions] taken per session {taken} (sum"
          f" {sum(taken)}), free after: {left}; B's first IDs after {took} s; by role {by_role}")
    assert sum(taken) <= 8, f"one server's role took {sum(taken)} blocks: {taken}"
    assert by_role.get(roles["x"], 0) <= 8, by_role
    assert took is not None, (f"a leaked server role holds {sum(taken)} blocks ({left} free):"
                              " B made no ID in 20 s")


@pytest.mark.slow
def test_the_shared_lease_roles_sessions_take_every_block_outside_the_assumptions(
        make_cluster):
    """Outside the assumptions (docs/operations/fleet.md): one lease role
    shared by every server, its documented CONNECTION LIMIT 20, the default
    limits (no max_blocks_per_role: one role for the whole fleet cannot be
    bounded per role). Its 20 sessions, each a made-up node taking all it
    may and renewing every second, hold every block A leaves (seven take
    8 each down to the reserve, then one each from it), and a new server B
    makes no ID within 20 s: nothing tells their sessions from new
    servers'. This is what the docs say happens."""
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
    print(f"\n[reserve/shared role, 20 sessions] taken per session {taken} (sum {sum(taken)}),"
          f" free after: {left}; B's first IDs after {took} s")
    assert left == 0, f"{left} blocks left free"
    assert took is None, f"B made IDs after {took} s"


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
        # Its node's lock: its advisory lock of one bigint key.
        x.conn.execute("SELECT pg_advisory_unlock((l.classid::int8 << 32) | l.objid::int8)"
                       " FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1"
                       " AND l.pid = pg_backend_pid()")
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
