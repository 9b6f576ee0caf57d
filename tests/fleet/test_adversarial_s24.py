"""Adversarial (session 24): the registry rules since session 23 (3ace481
a token names the database that signed it, Cause::SignedElsewhere; 4b45386
and 8aa49d0 a GrantsBack or SignedElsewhere fence sets the row's grant
count to the count it answered; f1c108e and 266f5f2 the 64 signed-count
slots, TRUNCATE, the forget trigger's count), attacked on real PostgreSQL
15 servers.

1. The database a token names, and the signed count's slot, are the
   database's OID: a copy of the registry's database put back under the
   original's OID (CREATE DATABASE ... TEMPLATE ... OID, PostgreSQL 15)
   has the row and the OID the holders' tokens name, and the signed count
   of the original.
2. Tokens of database A replayed into database B of the same cluster,
   B's row made again (the data directory's key is both databases').
3. A hostile lease role sending any jsonb it may send: grant counts too
   large, negative, not numbers; tokens of every shape.
4. An unprivileged role and pg_monitor against every function of the
   lease schema and every lease table.
5. A fence that raised the count, then: a crash and a failover to the
   synchronous standby; a restore in place; a stall of the registry's
   postmaster or of a backend in the middle of the fence.

The registry's log is checked after each: no panic, no crash, no token
key, no token. Lease times of 6 s (fleet_helpers.LEASE), the registry's
limits set to match (a fence lasts 7.2 s). Strict xfails are open bugs,
their reasons the numbers measured on PostgreSQL 15."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import psycopg
import pytest

from harness import wait_until
from helpers import apart_problems, Maker, ms_of, worker_of
from fleet_helpers import renew_req, seen_of, stacked_ghost
from fleet_helpers import (a_holds_b_waits, CONTESTED, duplicates, grant_lease_role, holder,
                           Intruder, lease_limits, lease_schema, lease_worker, named_standby,
                           now_ms, registry_server, require_sync,
                           restore_in_place, resume, sessions_gone, swap_registry)


def row_of(r, dbname: str = "postgres") -> tuple:
    """(incarnation, fenced now, cause, grants, database_oid)."""
    rows = r.sql("SELECT incarnation, coalesce(fenced_until > now(), false), cause,"
                 " to_jsonb(g)->'grants', to_jsonb(g)->'database_oid'"
                 " FROM snowflake_lease_registry g", dbname=dbname)
    return rows[0] if rows else (None, False, None, 0, None)


def log_problems(r, since: int = 0, tokens: tuple[str, ...] = ()) -> list[str]:
    """What the registry's log should never hold: a panic or a crash, an
    internal error, the data directory's token key, a token."""
    text = r.log(since)
    problems = [line for line in text.splitlines()
                if re.search(r"PANIC|panicked|internal error|terminated by signal|XX000", line)]
    key_file = os.path.join(r.datadir, "snowflake_id.key")
    key = open(key_file).read().strip() if os.path.exists(key_file) else ""
    if key and key in text:
        problems.append("the token key is in the log")
    problems += [f"token {t[:8]}... is in the log" for t in tokens if t and t in text]
    return problems


def oid_of(r, db: str) -> int:
    return r.scalar("SELECT oid::bigint FROM pg_database WHERE datname = %s", db)


def same_block_problems(made: dict[str, list[int]], block_size: int = 16) -> list[str]:
    """Milliseconds in which two servers both made IDs of one block."""
    used: dict[str, dict[int, set[int]]] = {}
    for name, got in made.items():
        for i in got:
            used.setdefault(name, {}).setdefault(worker_of(i) // block_size, set()).add(ms_of(i))
    problems = []
    names = list(used)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for blk in sorted(used[a].keys() & used[b].keys()):
                both = used[a][blk] & used[b][blk]
                if both:
                    problems.append(f"block {blk} used by both {a} and {b} in {len(both)} ms"
                                    f" ({min(both)} to {max(both)})")
    return problems


# ------------------------- 1. a copy put back under the registry's own OID
def copy_put_back(r, block: int, x_node: str, keep_oid: bool) -> dict:
    """The registry `fleet` of R copied (CREATE DATABASE snap TEMPLATE
    fleet, sessions ended), the lease role's node `x_node` leasing `block`
    in fleet and renewing it 20 times after the copy (grants the copy
    never made), then fleet dropped and the copy put back as fleet, under
    fleet's OID or a new one. Returns the rows and the node's last reply."""
    sessions_gone(r, "fleet")
    r.sql("CREATE DATABASE snap TEMPLATE fleet")
    copied = row_of(r, "snap")
    x = Intruder(r, node=x_node, dbname="fleet")
    got = x.acquire(allowed=[block])
    assert got["blocks"], got
    for _ in range(20):
        got = x.renew([block])
    x.close()
    orig = row_of(r, "fleet")
    oid = oid_of(r, "fleet")
    sessions_gone(r, "fleet")
    r.sql("DROP DATABASE fleet")
    r.sql("CREATE DATABASE fleet TEMPLATE snap" + (f" OID {oid}" if keep_oid else ""))
    return {"copied": copied, "orig": orig, "oid": oid, "new_oid": oid_of(r, "fleet"),
            "reply": got}


# Measured on PostgreSQL 15 before the row's count was checked against the
# one calls left (keep_oid): the copy put back under fleet's OID began no
# incarnation (grants 21 in the node's reply, 0 in the copy's row, the
# postmaster's signed count for that OID 21, not below it; the token names
# the same OID, so not SignedElsewhere; the copy's row names it, so not
# DatabaseCopied); the control with a new OID is fenced (DatabaseCopied).
@pytest.mark.parametrize("keep_oid", [False, True])
def test_a_copy_put_back_under_the_registrys_own_oid_is_fenced(make_cluster, keep_oid):
    """The registry is the database `fleet` of R. The lease role's node
    leases a block there; the DBA copies fleet (CREATE DATABASE snap
    TEMPLATE fleet); the node renews 20 times in fleet (grants the copy
    never made). The DBA then puts the copy back: DROP DATABASE fleet,
    CREATE DATABASE fleet TEMPLATE snap, giving it fleet's own OID
    (PostgreSQL 15's CREATE DATABASE ... OID, any OID from 16384 for a
    role that may create databases), or not (the control). The node
    presents its last reply. Wanted: a fenced incarnation either way (the
    copy forgot 20 grants, and no restart happened); the log clean."""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    r.create_extension("fleet")
    lease_limits(r, dbname="fleet")
    grant_lease_role(r, dbname="fleet")
    mark = r.log_mark()
    block = 1
    got = copy_put_back(r, block, "x", keep_oid)
    before = row_of(r, "fleet")
    y = Intruder(r, node="x", dbname="fleet")
    y.renew([block], **seen_of(got["reply"]))
    after = row_of(r, "fleet")
    y.close()
    problems = log_problems(r, mark, (got["reply"]["token"],))
    print(f"\n[copy put back, OID {'kept' if keep_oid else 'new'}] fleet OID {got['oid']},"
          f" put back as {got['new_oid']}; copy {got['copied'][:4]}; original after 20"
          f" renewals {got['orig'][:4]}; node's reply grants {got['reply']['grants']};"
          f" put back {before[:4]} -> after the node's call {after[:4]}; log {problems}")
    assert (got["new_oid"] == got["oid"]) == keep_oid
    assert not problems, problems
    assert after[0] != before[0] and after[1], f"not fenced: {before[:4]} -> {after[:4]}"


# ------------------------------ 3. a hostile lease role sending any jsonb
# What a refusal of a request may be: invalid (22023), too large (54000),
# not this session's node (42501), not now (55000), or an out-of-range
# number refused by PostgreSQL's own casts (22003) or a bad value (22P02).
REFUSALS = {"22023", "54000", "42501", "55000", "22003", "22P02", "53400"}


def hostile_requests(x: Intruder, genuine: dict, oid: int) -> dict[str, tuple[str, str]]:
    """(function, request text) by name: grant counts too large, negative
    or not numbers next to a genuine token; tokens of every shape; odd
    positions, incarnations, nesting, sizes."""
    now = now_ms()
    base = {"node": x.node, "name": "intruder", "layout": x.layout, "block_size": 16,
            "max_worker_id": 1023, "allowed": [9], "want": 1, "lease_ms": 6000,
            "grace_ms": 1200, "high_ms": now + 66_000}
    seen = seen_of(genuine)
    tok = seen["token"]
    out: dict[str, tuple[str, str]] = {}

    def acq(name: str, **over):
        out[name] = ("acquire", json.dumps({**base, **seen, **over}))
    for g in (2**63 - 1, -(2**63), 2**63, 2**64 + 7, -1, 0, 1.5, 1e308, "5", None, True, [],
              {}):
        acq(f"grants {g!r}", grants=g)
    acq("grants as text beyond bigint", grants="99999999999999999999")
    for name, t in {
        "token upper case": tok.upper(),
        "token naming another OID": tok[:32] + f"{oid + 1:08x}",
        "token naming OID 0": tok[:32] + "00000000",
        "token naming OID ffffffff": tok[:32] + "ffffffff",
        "token naming a negative OID": tok[:32] + "-0000005",
        "token 32 digits": tok[:32],
        "token with a digit more": tok + "0",
        "token not ascii": "é" * 20,
        "token half not ascii": tok[:31] + "é" + "0" * 8,
        "token 60000 chars": "0" * 60_000,
        "token a number": 5,
        "token null": None,
    }.items():
        acq(name, token=t)
    acq("lsn past every position", lsn="FFFFFFFF/FFFFFFFF")
    acq("lsn negative", lsn="-1/0")
    acq("lsn a number", lsn=5)
    acq("incarnation with newlines and %", incarnation="x\nLOG:  forged %s %% \\", token=tok)
    acq("incarnation of NULs", incarnation="\\u0000")
    acq("earlier 2000 entries", earlier=[seen] * 300)
    acq("earlier too large", earlier=[seen] * 1000)
    acq("earlier with huge counts", earlier=[{**seen, "grants": 2**63 - 1}] * 4)
    nested: dict = {}
    for _ in range(200):
        nested = {"incarnation": "n", "earlier": [nested]}
    acq("earlier nested 200 deep", earlier=[nested])
    acq("another node", node="someone-else")
    acq("allowed out of range", allowed=[-1, 2**31, 2**40, 2**63 - 1])
    acq("want negative", want=-5)
    acq("want huge", want=2**62)
    acq("block_size 0", block_size=0)
    acq("block_size negative", block_size=-16)
    acq("max_worker_id huge", max_worker_id=2**62)
    acq("lease_ms huge", lease_ms=2**63 - 1)
    acq("lease_ms negative", lease_ms=-6000)
    acq("grace_ms negative", grace_ms=-1)
    acq("high_ms max", high_ms=2**63 - 1)
    acq("high_ms min", high_ms=-(2**63))
    out["renew blocks huge"] = ("renew", json.dumps(
        {**renew_req(x, 2**31 + 5), **seen, "blocks": [{"block": 2**40, "high_ms": 2**63 - 1}]}))
    out["renew 5000 blocks"] = ("renew", json.dumps(
        {**renew_req(x, 9), **seen, "blocks": [{"block": 9, "high_ms": now}] * 2000}))
    out["release block huge"] = ("release", json.dumps(
        {"node": x.node, "block": 2**40, "high_ms": 2**63 - 1, **seen}))
    out["release block negative"] = ("release", json.dumps(
        {"node": x.node, "block": -1, "high_ms": -(2**63), **seen}))
    for name, body in {"null": None, "array": [], "string": "x", "number": 5,
                       "empty": {}}.items():
        for fn in ("acquire", "renew", "release", "durable"):
            out[f"{fn} {name}"] = (fn, json.dumps(body))
    for w in (1e30, -5, "x", 2**63, None):
        out[f"durable wait_ms {w!r}"] = ("durable", json.dumps({"wait_ms": w}))
    return out


@pytest.mark.slow  # held when written; CI budget
def test_the_lease_role_sending_any_jsonb_crashes_nothing_and_fences_nothing(make_cluster):
    """The lease role's node leases a block (a genuine reply with its
    token), then sends every request of hostile_requests: grant counts of
    2^63 - 1, -2^63, past bigint, fractions, strings, null; tokens in upper
    case, naming another OID, 0 or ffffffff, cut short, too long, not
    ASCII, not strings; positions past every one; incarnations with
    newlines; earlier lists too long or nested 200 deep; out-of-range
    blocks, counts, times; bodies that are not objects. Wanted: each
    answered or refused with a documented SQLSTATE (never XX000, never a
    lost connection), the registry's incarnation unchanged (no request
    fences it: none carries a token it can verify for what it says), the
    row's grant count not raised past the genuine count, the server
    answering after, and no panic, key or token in the log. (One fenced
    incarnation is documented, core/src/registry/begin.rs: a row made
    with a key made then believes an older incarnation named without a
    token, once, soon after it was made: measured, the request naming
    incarnation 'x\\nLOG:  forged ...' began it; its cause, newline and
    all, is the row's, and the log shows it tab-indented.)"""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    x = Intruder(r)
    genuine = x.acquire(allowed=[9])
    assert genuine["blocks"], genuine
    before = row_of(r)
    mark = r.log_mark()
    outcomes: dict[str, str] = {}
    bad: dict[str, str] = {}
    changed: list[str] = []
    last = before[0]
    name_before = ""
    for name, (fn, text) in hostile_requests(x, genuine, 5).items():
        now = row_of(r)[0]
        if now != last:
            changed.append(name_before)
            last = now
        name_before = name
        try:
            got = x.raw(fn, text)
            outcomes[name] = "answered" if isinstance(got, dict) else f"answered {got!r}"
        except psycopg.Error as e:
            if x.conn.closed or e.sqlstate is None:
                bad[name] = f"connection lost: {e}"
                x = Intruder(r, node=f"x{len(bad)}")
                continue
            outcomes[name] = e.sqlstate
            if e.sqlstate not in REFUSALS:
                bad[name] = f"{e.sqlstate} {e}"
    after = row_of(r)
    if after[0] != last:
        changed.append(name_before)
    x.close()
    answering = r.scalar("SELECT 1")
    problems = log_problems(r, mark, (genuine["token"],))
    refused = {}
    for name, o in outcomes.items():
        refused.setdefault(o, []).append(name)
    print(f"\n[any jsonb] {len(outcomes)} requests: "
          + "; ".join(f"{o}: {len(n)}" for o, n in sorted(refused.items()))
          + f"; not allowed: {bad}; row {before[:4]} -> {after[:4]}; new incarnations after"
          f" {changed}; log {problems}")
    print("answered: " + ", ".join(refused.get("answered", [])))
    assert not bad, bad
    assert len(changed) <= 1, changed
    assert after[3] <= genuine["grants"] + 5, (genuine["grants"], after)
    assert answering == 1
    assert not problems, problems


# ----------------------- 4. an unprivileged role and pg_monitor, every function
ARG_VALUES = {"text": "'x'", "jsonb": "'{}'::jsonb", "integer": "0", "bigint": "0",
              "pg_lsn": "'0/0'::pg_lsn", "timestamp with time zone": "now()",
              "text[]": "'{}'::text[]", "boolean": "false", "interval": "'1s'::interval"}


@pytest.mark.slow  # held when written; CI budget
@pytest.mark.parametrize("who", ["nobody", "monitor"])
def test_an_unprivileged_role_and_pg_monitor_call_no_lease_function(make_cluster, who):
    """A registry with the lease role's node holding a block. A login role
    with no right (`nobody`), or a member of pg_monitor (`monitor`),
    calls every function of the lease functions' schema (each with
    non-NULL arguments of its types: a STRICT function given a NULL is
    folded away before any right is checked), every snowflake_lease_*
    function of the extension's schema, and reads, writes and locks every
    snowflake_lease_* table and view. Wanted: each refused with 42501
    (trigger functions may instead be refused as such, 0A000), the
    registry's row unchanged, nothing of a token or key shown by
    pg_stat_activity, no token or key in the log."""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    x = Intruder(r)
    genuine = x.acquire(allowed=[3])
    assert genuine["blocks"]
    r.sql(f"CREATE ROLE {who} LOGIN" + (" IN ROLE pg_monitor" if who == "monitor" else ""))
    internal = lease_schema(r)
    ext = r.scalar("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                   " ON n.oid = e.extnamespace WHERE e.extname = 'snowflake_id'")
    funcs = r.sql("SELECT n.nspname, p.proname, p.prokind::text,"
                  " coalesce(array_agg(format_type(t.t, NULL) ORDER BY t.n)"
                  "  FILTER (WHERE t.t IS NOT NULL), '{}'), p.prorettype = 'trigger'::regtype"
                  " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                  " LEFT JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY t(t, n) ON true"
                  " WHERE n.nspname = %s OR (n.nspname = %s AND p.proname LIKE 'snowflake_lease%%')"
                  " GROUP BY n.nspname, p.proname, p.prokind, p.oid, p.prorettype", internal, ext)
    tables = [(t, k, col) for (t, k, col) in r.sql(
        "SELECT c.relname, c.relkind::text, (SELECT a.attname::text FROM pg_attribute a"
        " WHERE a.attrelid = c.oid AND a.attnum = 1) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE 'snowflake_lease%%'"
        " AND c.relkind IN ('r', 'v')", ext)]
    queries = {}
    for schema, name, kind, args, trigger in funcs:
        vals = ", ".join(ARG_VALUES.get(a, f"NULL::{a}") for a in args)
        q = f"CALL {schema}.{name}({vals})" if kind == "p" else \
            f"SELECT {schema}.{name}({vals})"
        queries[f"{name}({', '.join(args)})"] = (q, "0A000" if trigger else None)
    for t, kind, col in tables:
        queries[f"SELECT {t}"] = (f"SELECT * FROM {ext}.{t}", None)
        queries[f"LOCK {t}"] = (f"DO $$ BEGIN LOCK TABLE {ext}.{t} IN ACCESS SHARE MODE; END $$",
                                None)
        if kind == "r":
            queries[f"DELETE {t}"] = (f"DELETE FROM {ext}.{t}", None)
            queries[f"UPDATE {t}"] = (f"UPDATE {ext}.{t} SET {col} = {col}", None)
            queries[f"TRUNCATE {t}"] = (f"TRUNCATE {ext}.{t}", None)
    before = row_of(r)
    mark = r.log_mark()
    allowed = {}
    with r.connect(user=who) as conn:
        for what, (q, also) in queries.items():
            try:
                conn.execute(q).fetchall()
                allowed[what] = "ALLOWED"
            except psycopg.ProgrammingError as e:
                if e.sqlstate not in ("42501", also) and "no results" not in str(e):
                    allowed[what] = f"{e.sqlstate} {e}"
            except psycopg.Error as e:
                if e.sqlstate not in ("42501", also):
                    allowed[what] = f"{e.sqlstate} {e}"
        shown = [row[0] for row in conn.execute(
            "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid()").fetchall()]
    after = row_of(r)
    x.close()
    leaked = [q for q in shown if genuine["token"] in (q or "")]
    problems = log_problems(r, mark, (genuine["token"],))
    print(f"\n[{who}] {len(queries)} calls and statements ({len(funcs)} functions,"
          f" {len(tables)} tables and views); not refused: {allowed}; row {before[:2]} ->"
          f" {after[:2]}; log {problems}")
    assert len(funcs) > 30 and len(tables) >= 4, (len(funcs), tables)
    assert not allowed, allowed
    assert not leaked, leaked
    assert after == before, (before, after)
    assert not problems, problems


# ---------------- 1b. a copy put back under the original OID, real holders
# Measured on PostgreSQL 15.20 before the row's count was checked against
# the one calls left: the copy (count 58) put back under fleet's OID 16384
# after the original counted 73 began no incarnation; the other servers'
# renewals took its count to 79, the holders took its answers again, B
# leased block 0 while A used its grant from the original: 70,786 IDs made
# by both, worker id 0, 4,728 ms in common.
@pytest.mark.slow
def test_a_copy_put_back_under_the_registrys_own_oid_keeps_holders_apart(make_cluster):
    """The registry is the database `fleet` of R; A holds block 0 (worker
    id 0), B wants it. With both lease workers stopped and their sessions
    ended, the DBA copies fleet (CREATE DATABASE snap TEMPLATE fleet);
    fleet serves on for 10 s (A renews: grants the copy never made, and
    A's lease in the copy runs out). Then, with both workers stopped, the
    DBA drops fleet (WITH (FORCE)) and puts the copy back under fleet's
    OID (CREATE DATABASE fleet TEMPLATE snap OID ...); the fleet's other
    servers renew there (the lease role's node stands for them), passing
    the count the holders saw (a holder refuses a reply whose count is
    below the one it saw: with no other server, the fleet waits); B's
    worker resumes at once, A's later (fleet_helpers.swap_registry). Wanted: a fenced
    incarnation (or B kept from block 0 until A's grant ran out), and A
    and B apart."""
    r = make_cluster(settings={"fsync": True})
    r.create_db("fleet")
    r.create_extension("fleet")
    lease_limits(r, dbname="fleet")
    grant_lease_role(r, dbname="fleet")
    s = {**CONTESTED, "snowflake_id.worker_ids": "0",
         "snowflake_id.registry": r.conninfo(dbname="fleet")}
    a, maker_a, b, maker_b = a_holds_b_waits(make_cluster, r, s)
    time.sleep(3)
    workers = [lease_worker(a), lease_worker(b)]
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        sessions_gone(r, "fleet")
        r.sql("CREATE DATABASE snap TEMPLATE fleet")
    finally:
        resume(workers)
    copied = row_of(r, "snap")
    time.sleep(10)
    oid = oid_of(r, "fleet")
    swapped = {}

    def swap():
        swapped["orig"] = row_of(r, "fleet")
        r.sql("DROP DATABASE fleet WITH (FORCE)")
        r.sql(f"CREATE DATABASE fleet TEMPLATE snap OID {oid}")
        swapped["ms"] = now_ms()
        # The fleet's other servers renew on: the lease role's node stands
        # for them, its honest renewals passing the count the holders saw.
        busy = Intruder(r, node="busy", dbname="fleet")
        got = busy.acquire(allowed=[40])
        # (None while the put-back copy is fenced.)
        blocks = [b["block"] for b in got["blocks"]]
        for _ in range(swapped["orig"][3] - copied[3] + 5 if blocks else 0):
            got = busy.renew(blocks)
        swapped["pumped"] = got["grants"]
        busy.close()
    after, made_all, problems = swap_registry(a, maker_a, b, maker_b, swap,
                                              lambda: row_of(r, "fleet"))
    problems += apart_problems("A", made_all["A"], "B", made_all["B"])
    problems += same_block_problems(made_all)
    print(f"\n[copy put back under OID {oid}, real holders] copy {copied[:4]}; original"
          f" {swapped['orig'][:4]}; the copy's count after the other servers' renewals"
          f" {swapped['pumped']}; put back -> {after[:4]}; A made {len(made_all['A'])}, B"
          f" {len(made_all['B'])}; {problems}")
    assert oid_of(r, "fleet") == oid
    assert not problems, "; ".join(problems)


# ------------------- 2. tokens of database A replayed into B, B's row made again
@pytest.mark.slow  # held when written; CI budget
def test_a_token_of_another_database_replayed_after_the_row_was_made_again(make_cluster):
    """Registry databases `a` and `b` of one cluster, a lease role each
    (lease_a, lease_b: the documented one lease role per registry
    database). lease_a may not call b's lease functions. lease_a's node
    leases in a (a token a signed, under the data directory's key). B's
    row is made again (DROP EXTENSION, CREATE EXTENSION: the key kept, so
    a's tokens verify under b's row). b's node presents a's reply 10 times
    over 5 s (a fleet moved from a to b). Wanted: one fenced incarnation
    (Cause::SignedElsewhere, naming a's OID), the grants counted (no
    fence at each call), and its count at least a's; a second reply of a
    (a new incarnation of a) fences once more, not at each call. Measured
    too, outside the assumptions: one role with the rights of both
    databases sending each database the other's last reply, 6 rounds."""
    r = make_cluster(settings={"fsync": True})
    for db in ("a", "b"):
        r.create_db(db)
        r.create_extension(db)
        lease_limits(r, dbname=db)
        grant_lease_role(r, name=f"lease_{db}", dbname=db)
    with r.connect(user="lease_a", dbname="b") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT {lease_schema(r, 'b')}.snowflake_lease_hello('n')")
    xa = Intruder(r, node="na", user="lease_a", dbname="a")
    ga = xa.acquire(allowed=[1])
    for _ in range(30):
        ga = xa.renew([ga["blocks"][0]["block"]])
    sessions_gone(r, "b")
    r.sql("DROP EXTENSION snowflake_id CASCADE", dbname="b")
    r.create_extension("b")
    lease_limits(r, dbname="b")
    grant_lease_role(r, name="lease_b", dbname="b")
    made_again = row_of(r, "b")
    mark = r.log_mark()
    xb = Intruder(r, node="nb", user="lease_b", dbname="b")
    seen = set()
    rows = []
    for _ in range(10):
        xb.acquire(allowed=[2], **seen_of(ga))
        rows.append(row_of(r, "b"))
        seen.add(rows[-1][0])
        time.sleep(0.5)
    first = len(seen - {made_again[0]})
    # A new incarnation of a (its lease table's row deleted: a fence), its reply.
    r.sql("DELETE FROM snowflake_lease_blocks WHERE block = 1", dbname="a")
    ga2 = xa.acquire(allowed=[3])
    before2 = row_of(r, "b")
    seen2 = set()
    for _ in range(6):
        xb.acquire(allowed=[2], **seen_of(ga2))
        seen2.add(row_of(r, "b")[0])
        time.sleep(0.5)
    second = len(seen2 - {before2[0]})
    xa.close()
    xb.close()
    # Outside the assumptions: one role for both.
    grant_lease_role(r, name="lease_ab", dbname="a")
    grant_lease_role(r, name="lease_ab", dbname="b")
    pa = Intruder(r, node="pa", user="lease_ab", dbname="a")
    pb = Intruder(r, node="pb", user="lease_ab", dbname="b")
    last_a, last_b = pa.acquire(allowed=[5]), pb.acquire(allowed=[5])
    pong = {"a": {row_of(r, "a")[0]}, "b": {row_of(r, "b")[0]}}
    for _ in range(6):
        last_b = pb.acquire(allowed=[6], **seen_of(last_a))
        last_a = pa.acquire(allowed=[6], **seen_of(last_b))
        pong["a"].add(row_of(r, "a")[0])
        pong["b"].add(row_of(r, "b")[0])
    pa.close()
    pb.close()
    problems = log_problems(r, mark, (ga["token"], ga2["token"]))
    print(f"\n[a's token into b, b made again] a's reply grants {ga['grants']}; b made again"
          f" {made_again[:4]}; 10 presentations -> {first} new incarnations, last"
          f" {rows[-1][:4]}; a's next incarnation's reply 6 times -> {second}; one role for"
          f" both, 6 rounds each way: {len(pong['a']) - 1} incarnations of a,"
          f" {len(pong['b']) - 1} of b; log {problems}")
    assert first == 1, rows
    assert "database OID" in rows[0][2] and rows[0][1], rows[0]
    assert rows[-1][3] >= ga["grants"], (rows[-1], ga["grants"])
    assert second <= 1, second
    assert not problems, problems


# ----------------------------- 5. a fence that raised the count, then ...
def raise_the_count(r, x: Intruder, block: int) -> tuple[dict, tuple]:
    """A stacked reply of the lease role's node `x` (hundreds of grants,
    rolled back), the registry restarted (its signed count 0), the reply
    presented by another node: a GrantsBack fence setting the row's
    count to the reply's (4b45386). Returns (the ghost, the row after)."""
    ghost = seen_of(stacked_ghost(x, block))
    x.close()
    r.restart()
    y = Intruder(r, node="raiser")
    y.acquire(allowed=[block + 1], **ghost)
    y.close()
    return ghost, row_of(r)


@pytest.mark.slow  # held when written; CI budget
def test_a_restore_in_place_after_the_count_was_raised(make_cluster):
    """The registry R; a snapshot of its data directory taken (stopped,
    copied, started); the lease role's node leases a block and keeps a
    stacked reply (hundreds of grants, rolled back); R restarts; the reply
    presented fences and raises the row's count to it. The fence over,
    the node leases and renews 20 times (genuine grants above the raised
    count). R is restored in place from the snapshot (count 0). The node
    presents its last genuine reply, then the ghost, then the genuine
    reply again, each 5 times. Wanted: one fenced incarnation (the
    genuine grants were forgotten), none for the ghost (its count is at or
    below the fence's) and none again; no panic, key or token in the log."""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    r.stop()
    aside = r.dir + "/snapshot"
    os.system(f"cp -a {r.datadir} {aside}")
    r.start()
    x = Intruder(r)
    block = x.acquire(allowed=[20])["blocks"][0]["block"]
    ghost, raised = raise_the_count(r, x, block)
    wait_until(lambda: not row_of(r)[1], timeout=30, what="the raise's fence over")
    x = Intruder(r, node="x2")
    got = x.acquire(allowed=[30])
    for _ in range(20):
        got = x.renew([got["blocks"][0]["block"]])
    genuine = seen_of(got)
    x.close()
    restore_in_place(r, aside)
    mark = r.log_mark()
    restored = row_of(r)
    y = Intruder(r, node="y")
    states = []
    for seen in [genuine] * 5 + [ghost] * 5 + [genuine] * 5:
        y.acquire(allowed=[40], **seen)
        states.append(row_of(r))
        time.sleep(0.3)
    y.close()
    incarnations = [s[0] for s in states]
    new = len(set(incarnations) - {restored[0]})
    problems = log_problems(r, mark, (genuine["token"], ghost["token"]))
    print(f"\n[restore in place after the raise] ghost {ghost['grants']} grants; raised"
          f" {raised[:4]}; genuine {genuine['grants']}; restored {restored[:4]}; after the"
          f" genuine replies {states[4][:4]}, the ghost {states[9][:4]}, genuine again"
          f" {states[14][:4]}: {new} new incarnations; log {problems}")
    assert raised[1] and raised[3] >= ghost["grants"], raised
    assert states[0][1] and states[0][0] != restored[0], states[0]
    assert new == 1, incarnations
    assert not problems, problems


def candidates(r) -> list[str]:
    rows = r.sql("SELECT members FROM snowflake_lease_standbys WHERE valid_until > now()")
    return rows[0][0] if rows else []


def hosts_of(*servers) -> str:
    return (f"host={','.join(s.dir for s in servers)}"
            f" port={','.join(str(s.port) for s in servers)} dbname=postgres user=postgres"
            " target_session_attrs=read-write")


@pytest.mark.slow
def test_a_crash_and_failover_in_the_middle_of_a_fence_that_raised_the_count(make_cluster):
    """The registry P with a synchronous standby s1 (its failover
    candidate); holder B makes IDs (registry: P, then s1). The lease
    role's node keeps a stacked reply; P restarts; the reply fences and
    raises the row's count (replicated synchronously). 1 s into that
    fence P crashes (`-m immediate`) and s1 is promoted. The node
    presents the ghost on s1 10 times over 5 s; new server C starts
    against s1. Wanted: s1's row has the raised count; besides the
    promotion's own incarnation at most one fenced one from the ghost
    (measured: the proven promotion continues the fenced incarnation
    unfenced, 6 s before its fence would end; the ghost's older
    incarnation then fences once, OlderIncarnation: the documented cost
    of a restart, test_adversarial_s19); B makes IDs again within 30 s of the
    promotion and C within 45 s of its start; no ID made twice; s1's log
    clean."""
    p = make_cluster(tcp=True, settings={"fsync": True})
    p.create_extension()
    lease_limits(p)
    grant_lease_role(p)
    s1 = named_standby(make_cluster, p, "s1", "s1")
    require_sync(p, "s1", "s1")
    b = holder(make_cluster, p, **{"snowflake_id.registry": hosts_of(p, s1)})
    maker_b = Maker(b, statement_timeout="30s")
    wait_until(lambda: maker_b.made, timeout=60, what="B's first IDs")
    wait_until(lambda: candidates(p) == ["s1"], timeout=60, what="s1 a candidate")
    x = Intruder(p)
    block = x.acquire(allowed=[50])["blocks"][0]["block"]
    ghost, raised = raise_the_count(p, x, block)
    time.sleep(1)
    p.stop(mode="immediate")
    s1.promote()
    promoted_at = time.monotonic()
    replicated = row_of(s1)
    mark = s1.log_mark()
    y = Intruder(s1, node="y")
    states = []
    for _ in range(10):
        y.acquire(allowed=[52], **ghost)
        states.append(row_of(s1))
        time.sleep(0.5)
    y.close()
    made_b = len(maker_b.made)
    wait_until(lambda: len(maker_b.made) > made_b, timeout=60, what="B's IDs after")
    b_back = time.monotonic() - promoted_at
    c = holder(make_cluster, s1)
    c_start = time.monotonic()
    maker_c = Maker(c, statement_timeout="30s")
    wait_until(lambda: maker_c.made, timeout=90, what="C's first IDs")
    c_first = maker_c.first_at - c_start
    made = {"B": maker_b.stop(), "C": maker_c.stop()}
    problems = duplicates(made) + log_problems(s1, mark, (ghost["token"],))
    new = len({s[0] for s in states} - {replicated[0]})
    print(f"\n[failover in a fence that raised the count] ghost {ghost['grants']}; raised on P"
          f" {raised[:4]}; on s1 before any call {replicated[:4]}; ghost 10 times -> {new} new"
          f" incarnations, first {states[0][:4]}, last {states[-1][:4]}; B's IDs again"
          f" {b_back:.1f} s after the promotion; C's first {c_first:.1f} s after its start;"
          f" {problems}")
    assert raised[1] and raised[3] >= ghost["grants"], raised
    assert replicated[3] >= ghost["grants"], replicated
    assert new <= 2, states
    assert b_back < 30 and c_first < 45, (b_back, c_first)
    assert not problems, problems


@pytest.mark.slow
@pytest.mark.parametrize("stalled", ["postmaster", "backend"])
def test_a_registry_stalled_in_the_middle_of_a_fence(make_cluster, stalled):
    """The registry R; holder A makes IDs from block 0, B waits for it.
    The lease role's node keeps a stacked reply (hundreds of grants,
    rolled back); R restarts (its signed count 0). The node's session, in
    a DO block, presents the reply (a GrantsBack fence raising the count)
    and sleeps 1 s under the registry's lock; in that second R's
    postmaster (`postmaster`) or that
    backend (`backend`, holding the registry's lock) is stopped with
    SIGSTOP for 25 s, then continued. Wanted: A and B never both make IDs
    of block 0 (no ID made twice); the fleet makes IDs again within 85 s
    of the fence's start (the fence raises every block's floor 71.2 s
    ahead, max_ahead_ms + max_grace_ms, which a holder with 1 s of
    max_drift waits out: the fence's own cost, measured 70 s with the
    postmaster stopped, not the stop's); the server answers; no panic,
    key or lease token in R's log. (The DO block's own text, with the
    reply it presents, is in the log as the CONTEXT of the lease call's
    log lines: a holder sends its request as a parameter, not shown.)"""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    s = {**CONTESTED, "snowflake_id.worker_ids": "0"}
    a, maker_a, b, maker_b = a_holds_b_waits(make_cluster, r, s)
    x = Intruder(r)
    blk = x.acquire(allowed=[50])["blocks"][0]["block"]
    ghost = seen_of(stacked_ghost(x, blk))
    x.close()
    r.restart()
    wait_until(lambda: maker_a.last_at and time.monotonic() - maker_a.last_at < 1,
               timeout=60, what="A making IDs after the restart")
    mark = r.log_mark()
    y = Intruder(r, node="y")
    pid = y.conn.info.backend_pid
    postmaster = int(open(os.path.join(r.datadir, "postmaster.pid")).readline())
    target = postmaster if stalled == "postmaster" else pid
    errors: list[str] = []

    def fence():
        req = json.dumps(renew_req(y, 51, **ghost))
        try:
            y.conn.execute(f"""DO $do$ BEGIN
                PERFORM {y.schema}.snowflake_lease_acquire($j${json.dumps(
                    {"name": "y", "block_size": 16, "max_worker_id": 1023, "allowed": [51],
                     "want": 1, "lease_ms": 6000, "grace_ms": 1200, "high_ms": now_ms() + 66_000,
                     **json.loads(req)})}$j$::jsonb);
                PERFORM pg_sleep(1);
                END $do$""")
        except psycopg.Error as e:
            errors.append(f"{e.sqlstate} {e}")
    t = threading.Thread(target=fence, daemon=True)
    t.start()
    fence_at = time.monotonic()
    time.sleep(0.5)
    os.kill(target, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        time.sleep(25)
    finally:
        os.kill(target, signal.SIGCONT)
    resumed = time.monotonic()
    t.join(timeout=30)
    made_a, made_b = len(maker_a.made), len(maker_b.made)
    try:
        wait_until(lambda: len(maker_a.made) > made_a or len(maker_b.made) > made_b,
                   timeout=90, what="the fleet's IDs after SIGCONT")
        back = time.monotonic() - resumed
    except AssertionError:
        back = None
    time.sleep(5)
    last_ids = max(maker_a.last_at or 0, maker_b.last_at or 0)
    made = {"A": maker_a.stop(), "B": maker_b.stop()}
    answering = r.scalar("SELECT 1")
    problems = duplicates(made) + same_block_problems(made)
    logged = log_problems(r, mark)
    print(f"\n[{stalled} stopped in a fence] the DO block: {errors or 'committed'}; stopped"
          f" {resumed - stopped_at:.1f} s; the fleet's IDs again {back} s after SIGCONT,"
          f" {back and back + resumed - fence_at} s after the fence began (last"
          f" {last_ids - resumed:.1f} s after it); row {row_of(r)[:4]}; A made"
          f" {len(made['A'])}, B {len(made['B'])}; {problems}; log {logged}")
    assert not problems, problems
    assert back is not None and back + resumed - fence_at < 85, back
    assert answering == 1
    assert not logged, logged
