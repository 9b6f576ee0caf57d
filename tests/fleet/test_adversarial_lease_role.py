"""Adversarial: a hostile lease role (issue 42, attack 1).

A role with exactly the rights docs/operations/fleet.md grants the lease
role (USAGE on snowflake_id_internal, EXECUTE on the five lease functions,
CONNECTION LIMIT 20) sends what that role may send: forged positions,
incarnations and tokens, replayed tokens, releases with mark 0, renewals
of blocks others hold, requests far too large, too deeply nested, numbers
out of range, a made-up layout, and it may take advisory locks and open
sessions. Real holders make IDs meanwhile.

Safety (every test): no ID made by two servers. Liveness (the tests that
say so): the attack does not fence the registry, and a new server still
makes IDs. Errors: a specific SQLSTATE (22023, 54000, 55000, 42501), never
an internal error (XX000) or a crash.

Lease times of 6 s (fleet_helpers.LEASE), the registry's limits set to
match (a fence lasts 7.2 s), unless a test says otherwise."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from harness import wait_until
from helpers import Maker
from fleet_helpers import (duplicates, first_ids_within, grant_lease_role, holder, Intruder,
                          lease_limits, registry_server, registry_state, Repeat)


def now_ms() -> int:
    return int(time.time() * 1000)


def fleet(make_cluster, limits: bool = True):
    """A registry with the lease role, and holder A making IDs."""
    r = registry_server(make_cluster)
    if limits:
        lease_limits(r)
    grant_lease_role(r)
    a = holder(make_cluster, r)
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    return r, a, maker_a


def no_duplicates(**makers) -> None:
    made = {name: m.stop() for name, m in makers.items()}
    problems = duplicates(made)
    assert not problems, "; ".join(problems)
    print(" / ".join(f"{n} made {len(v)} IDs" for n, v in made.items()))


# ------------------------------------------------------ forged evidence
@pytest.mark.parametrize("token", ["none", "forged", "replayed"])
def test_a_forged_position_from_a_node_holding_a_block_does_not_fence(make_cluster, token):
    """The intruder leases one block within the limits (so its node holds
    blocks here), then renews it saying it saw WAL position
    FFFFFFFF/FFFFFFFF. none: with no token (as a 0.7.0 holder sends);
    forged: 32 hex digits the registry never made; replayed: the token of
    its last reply (valid for that reply's position only). Repeated every
    second for 20 s while a new server B starts. Wanted: the registry's
    incarnation unchanged and not fenced, B making IDs, no ID made by two
    servers."""
    r, a, maker_a = fleet(make_cluster)
    x = Intruder(r)
    first = x.acquire()
    block = first["blocks"][0]["block"]
    before = registry_state(r)
    assert not before[1]
    tokens = {"none": "", "forged": "0123456789abcdef" * 2, "replayed": first["token"]}

    def forge():
        x.renew([block], lsn="FFFFFFFF/FFFFFFFF", incarnation=registry_state(r)[0],
                token=tokens[token])

    forge()
    after_one = registry_state(r)
    attack = Repeat(forge, every=1.0)
    b = holder(make_cluster, r)
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    attack.stop()
    x.close()
    no_duplicates(A=maker_a, B=maker_b)
    print(f"[forged position, token {token}] after one: {after_one};"
          f" B's first IDs after {took} s; {attack.count} forged renewals,"
          f" errors {[(e.sqlstate, str(e)) for e in attack.errors[:2]]}")
    assert after_one[0] == before[0] and not after_one[1], \
        f"one forged renewal started a new incarnation: {after_one}"
    assert took is not None, "the new server B made no ID within 20 s of forged renewals"


@pytest.mark.parametrize("token", ["none", "garbage"])
def test_an_incarnation_the_registry_never_issued_does_not_fence_a_new_registry(make_cluster, token):
    """A registry whose extension was dropped and created again (the
    default limits: a fence would last 12 min). The intruder, holding no
    block, asks for one naming an incarnation the registry never issued,
    with no token (none) or 32 hex digits the registry never made
    (garbage). Wanted: no new incarnation, no fence, and a new server B
    makes IDs. The token key is the data directory's (snowflake_id.key),
    which DROP EXTENSION leaves: before it was, the garbage token fenced
    the registry made again once (a strict xfail, seen failing)."""
    r = registry_server(make_cluster)
    r.sql("DROP EXTENSION snowflake_id CASCADE")
    r.sql("CREATE EXTENSION snowflake_id")
    grant_lease_role(r)
    before = registry_state(r)
    x = Intruder(r)
    reply = x.acquire(incarnation="never-issued-by-this-registry",
                      token="" if token == "none" else "0123456789abcdef" * 2, lsn="0/0",
                      lease_ms=600_000, grace_ms=120_000, high_ms=now_ms() + 660_000)
    x.close()
    after = registry_state(r)
    b = holder(make_cluster, r, **{"snowflake_id.lease_time": "10min"})
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    no_duplicates(B=maker_b)
    print(f"[never-issued incarnation, token {token}] reply {reply}; registry {after}; B's first IDs after {took} s")
    assert after[0] == before[0] and not after[1], \
        f"a request naming a made-up incarnation started a new one: {after}"
    assert took is not None, "the new server B made no ID within 20 s"


def test_a_new_data_directory_is_fenced_once_by_a_token_it_cannot_verify(make_cluster):
    """A registry in a new data directory (its key file made by CREATE
    EXTENSION) cannot tell a token of the registry the fleet used before
    (a fleet moved to it, whose holders may hold that registry's blocks)
    from a forged one: the first request naming another incarnation with
    a token fences it, by design (docs/operations/fleet.md); a second one
    does not fence again."""
    r = registry_server(make_cluster)
    grant_lease_role(r)
    before = registry_state(r)
    states = []
    for _ in range(2):
        x = Intruder(r)
        x.acquire(incarnation="never-issued-by-this-registry", token="0123456789abcdef" * 2,
                  lsn="0/0", lease_ms=6000, grace_ms=1200, high_ms=now_ms() + 7000)
        x.close()
        states.append(registry_state(r))
    print(f"[new data directory] {before} -> {states}")
    assert states[0][0] != before[0] and states[0][1], states
    assert states[1][0] == states[0][0], states


# --------------------------------------------------- malformed requests
def nested(depth: int) -> str:
    return json.dumps({"node": "intruder", "blocks": [], "lease_ms": 6000, "grace_ms": 1200,
                       "high_ms": now_ms()})[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"


def renew_text(**over) -> str:
    req = {"node": "intruder", "incarnation": "", "lsn": "0/0", "blocks": [],
           "lease_ms": 6000, "grace_ms": 1200, "high_ms": now_ms() + 60_000, **over}
    return json.dumps(req)


MALFORMED = {
    # name: (function, request text, SQLSTATEs accepted)
    "nested_200": ("renew", lambda: nested(200), {"22023", "54000"}),
    "nested_5000": ("renew", lambda: nested(5000), {"22023", "54000", "54001"}),
    "huge_4mb": ("renew", lambda: renew_text(blocks=[{"block": 0, "high_ms": 0}] * 150_000),
                 {"54000"}),
    "high_ms_1e30": ("renew", lambda: renew_text(high_ms=1e30), {"22023", "54000"}),
    "high_ms_2_63": ("renew", lambda: renew_text(high_ms=2**63), {"22023", "54000"}),
    "high_ms_fraction": ("renew", lambda: renew_text(high_ms=now_ms() + 0.5), {"22023"}),
    "high_ms_string": ("renew", lambda: renew_text(high_ms="soon"), {"22023"}),
    "lease_ms_negative": ("renew", lambda: renew_text(lease_ms=-1), {"22023"}),
    "block_2_40": ("renew", lambda: renew_text(blocks=[{"block": 2**40, "high_ms": 0}]), {"22023"}),
    "block_negative": ("release", lambda: json.dumps({"node": "intruder", "block": -1, "high_ms": 0}),
                       {"22023"}),
    "want_1e10": ("acquire", lambda: json.dumps({
        "node": "intruder", "name": "x", "layout": "classic", "block_size": 16,
        "max_worker_id": 1023, "allowed": [0], "want": 10_000_000_000, "lease_ms": 6000,
        "grace_ms": 1200, "high_ms": now_ms()}), {"54000", "22023"}),
    "not_an_object": ("renew", lambda: "[1, 2, 3]", {"22023"}),
    "node_not_text": ("renew", lambda: renew_text(node=["intruder"]), {"22023", "42501"}),
    "lsn_garbage": ("renew", lambda: renew_text(lsn="not/an/lsn", token="zz"),
                    None),   # served: an unparsable position is no evidence
    "block_size_0": ("renew", lambda: renew_text(block_size=0, max_worker_id=1023,
                                                 layout="classic"), None),
    "other_node": ("renew", lambda: renew_text(node="someone-else"), {"42501"}),
    # 0.8.0 in main: holders carry a signed count of grants; this branch has
    # none, and ignores the key.
    "grants_huge": ("renew", lambda: renew_text(grants=10**30, token="ab" * 16), None),
}


def test_a_malformed_request_is_refused_with_a_specific_sqlstate(make_cluster):
    """Each malformed request, one session each, to one registry: refused
    with one of its SQLSTATEs (or served, where nothing in it is
    evidence), never with an internal error; after each, the registry
    keeps its incarnation, unfenced, and A makes IDs."""
    r, a, maker_a = fleet(make_cluster)
    before = registry_state(r)
    problems = []
    for kind in sorted(MALFORMED):
        fn, text, accepted = MALFORMED[kind]
        x = Intruder(r)
        err = None
        try:
            x.raw(fn, text())
        except psycopg.Error as e:
            err = e
        x.close()
        made = len(maker_a.made)
        wait_until(lambda: len(maker_a.made) > made + 1000, timeout=30,
                   what=f"A making IDs after {kind}")
        after = registry_state(r)
        print(f"[{kind}] {err.sqlstate + ' ' + str(err).splitlines()[0] if err else 'served'}")
        if after[0] != before[0] or after[1]:
            problems.append(f"{kind}: the registry moved to {after}")
            before = after
        if accepted is None:
            if err is not None and err.sqlstate not in {"22023", "54000"}:
                problems.append(f"{kind}: {err.sqlstate} {err}")
        elif err is None:
            problems.append(f"{kind}: served")
        elif err.sqlstate not in accepted:
            problems.append(f"{kind}: {err.sqlstate}: {err}")
    no_duplicates(A=maker_a)
    assert not problems, "; ".join(problems)


def test_a_request_larger_than_the_limit_is_refused_also_when_it_arrives_compressed(make_cluster):
    """The registry refuses requests above 65536 bytes (54000). A lease role
    may create a temporary table (TEMP is PUBLIC's by default) and pass a
    4 MB request from it: stored compressed, pg_column_size() counts its
    compressed size. Wanted: refused with 54000 all the same."""
    r, a, maker_a = fleet(make_cluster)
    x = Intruder(r)
    x.conn.execute("CREATE TEMP TABLE req (j jsonb)")
    x.conn.execute("INSERT INTO req VALUES (%s::jsonb)",
                   (renew_text(pad="a" * 4_000_000),))
    size = x.conn.execute("SELECT pg_column_size(j) FROM req").fetchone()[0]
    err = None
    t0 = time.monotonic()
    try:
        x.conn.execute(f"SELECT {x.schema}.snowflake_lease_renew(j) FROM req").fetchone()
    except psycopg.Error as e:
        err = e
    took = time.monotonic() - t0
    x.close()
    no_duplicates(A=maker_a)
    print(f"[compressed 4 MB request] stored as {size} bytes;"
          f" {'refused ' + err.sqlstate + ' ' + str(err) if err else 'served'} in {took:.2f} s")
    assert err is not None and err.sqlstate == "54000", \
        f"a 4 MB request stored as {size} bytes was {'refused ' + err.sqlstate if err else 'served'}"


# ------------------------------------------------------ blocks and marks
def test_releases_with_mark_0_and_renewals_of_others_blocks_repeat_nothing(make_cluster):
    """The intruder renews every block (A's among them), releases its own
    with mark 0, leases it again and releases it with mark 0, over and
    over, while A and a new server B make IDs: A keeps its blocks, no ID is
    made by two servers."""
    r, a, maker_a = fleet(make_cluster)
    a_blocks = {b for (b,) in r.sql("SELECT block FROM snowflake_lease_blocks"
                                    " WHERE holder_node IS NOT NULL")}
    x = Intruder(r)
    stolen: list[int] = []

    def churn():
        got = x.renew(list(range(64)))["blocks"]
        stolen.extend(b["block"] for b in got if b["block"] in a_blocks)
        for b in x.acquire(want=2)["blocks"]:
            x.call("release", block=b["block"], high_ms=0)

    attack = Repeat(churn, every=0.2)
    b = holder(make_cluster, r)
    maker_b = Maker(b, statement_timeout="30s")
    wait_until(lambda: maker_b.made, timeout=60, what="B's first IDs")
    time.sleep(15)
    attack.stop()
    x.close()
    no_duplicates(A=maker_a, B=maker_b)
    print(f"[release 0 / renew others] {attack.count} rounds, errors"
          f" {[(e.sqlstate, str(e)) for e in attack.errors[:2]]}")
    assert not stolen, f"the intruder renewed A's blocks {sorted(set(stolen))}"


def test_sessions_of_the_lease_role_within_its_connection_limit_leave_blocks_for_new_servers(
        make_cluster):
    """Eight sessions of the lease role (its documented CONNECTION LIMIT is
    20), each a node leasing max_blocks_per_node (8) blocks one at a time,
    while A holds its own (0.7.0: they held 63 of 64). Wanted: the last
    reserve_blocks (8, the default) free blocks go only to nodes that hold
    none, one each, so the intruders hold no more than 64 - 8 + 1 (the
    last intruder's first block) and a new server B still leases a
    block."""
    r, a, maker_a = fleet(make_cluster)
    xs = [Intruder(r, node=f"intruder{i}") for i in range(8)]
    taken = 0
    for x in xs:
        for _ in range(8):
            try:
                taken += len(x.acquire()["blocks"])
            except psycopg.Error as e:
                assert e.sqlstate == "54000", f"{e.sqlstate} {e}"
                break
    keep = Repeat(lambda: [x.renew([b for (b,) in r.sql(
        "SELECT block FROM snowflake_lease_blocks WHERE holder_node = %s", x.node)]) for x in xs],
        every=1.0)
    b = holder(make_cluster, r)
    maker_b = Maker(b, statement_timeout="30s")
    took = first_ids_within(maker_b, 20.0)
    keep.stop()
    for x in xs:
        x.close()
    no_duplicates(A=maker_a, B=maker_b)
    print(f"[drain] the lease role's 8 sessions hold {taken} blocks; B's first IDs after {took} s")
    assert taken <= 64 - 8 + 1, f"the lease role's 8 sessions hold {taken} blocks"
    assert took is not None, f"the lease role's 8 sessions hold {taken} of 64 blocks: B made no ID"


# ----------------------------------------------------------------- locks
@pytest.mark.parametrize("how", [pytest.param("advisory_lock", marks=pytest.mark.slow),
                                 "open_transaction_acquire",
                                 pytest.param("open_transaction_durable", marks=pytest.mark.slow)])
def test_the_lease_role_taking_the_registry_lock_does_not_stop_the_fleet(make_cluster, how):
    """The registry decides lease calls one at a time under an advisory
    transaction lock whose key is in leases.sql (1936613750, 0), and
    snowflake_lease_durable reads the candidates' row FOR UPDATE. The
    intruder holds them for 20 s (over three lease times): advisory_lock,
    with pg_advisory_lock() (any role that may connect may); or one lease
    call in a transaction it leaves open (BEGIN; acquire or durable; no
    COMMIT). Wanted: A goes on making IDs (its renewals are not held up by
    the lease role); a lease call inside a transaction block is refused
    with 25001 (0.7.0 served it, and A stopped after about 11 s)."""
    r, a, maker_a = fleet(make_cluster)
    x = Intruder(r)
    if how == "advisory_lock":
        x.conn.execute("SELECT pg_advisory_lock(1936613750, 0)")
    else:
        x.conn.execute("BEGIN")
        with pytest.raises(psycopg.Error) as refused:
            if how == "open_transaction_acquire":
                x.acquire()
            else:
                x.raw("durable", '{"wait_ms": 0}')
        assert refused.value.sqlstate == "25001", f"{refused.value.sqlstate} {refused.value}"
    t0 = time.monotonic()
    stopped_at = None
    while time.monotonic() - t0 < 20:
        if maker_a.refusals and stopped_at is None:
            stopped_at = time.monotonic() - t0
        time.sleep(0.2)
    x.conn.execute("ROLLBACK" if how != "advisory_lock" else "SELECT pg_advisory_unlock_all()")
    x.close()
    made = len(maker_a.made)
    wait_until(lambda: len(maker_a.made) > made, timeout=60, what="A making IDs again")
    refusals = maker_a.refusals[:]
    no_duplicates(A=maker_a)
    print(f"[registry lock, {how}] A refused from {stopped_at} s after the lock;"
          f" {len(refusals)} refusals, first: {refusals[0].sqlstate + ' ' + str(refusals[0]) if refusals else None}")
    assert stopped_at is None, f"A stopped making IDs {stopped_at:.1f} s after the lease role took the lock"


def test_the_lease_role_ending_the_holders_sessions_does_not_stop_the_fleet(make_cluster):
    """Holders connect as the lease role (as docs/operations/fleet.md sets
    them up); a role may end its own sessions (pg_terminate_backend, which
    the lease worker itself uses on its earlier session). The intruder ends
    every other session of the role every 0.3 s for 20 s. Wanted: A goes
    on making IDs."""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    a = holder(make_cluster, r, **{"snowflake_id.registry": r.conninfo(user="snowflake_lease")})
    maker_a = Maker(a, statement_timeout="30s")
    wait_until(lambda: maker_a.made, timeout=60, what="A's first IDs")
    x = Intruder(r)
    ended = [0]

    def end_them():
        ended[0] += x.conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE usename = current_user AND pid <> pg_backend_pid()").fetchone()[0]

    t0 = time.monotonic()
    attack = Repeat(end_them, every=0.3)
    stopped_at = None
    while time.monotonic() - t0 < 20:
        if maker_a.refusals and stopped_at is None:
            stopped_at = time.monotonic() - t0
        time.sleep(0.2)
    attack.stop()
    x.close()
    made = len(maker_a.made)
    wait_until(lambda: len(maker_a.made) > made, timeout=60, what="A making IDs again")
    refusals = maker_a.refusals[:]
    no_duplicates(A=maker_a)
    print(f"[terminate] {ended[0]} sessions ended; A refused from {stopped_at} s;"
          f" first: {refusals[0].sqlstate + ' ' + str(refusals[0]) if refusals else None}")
    assert stopped_at is None, f"A stopped making IDs {stopped_at:.1f} s into the attack"
