"""Adversarial: the changes of 0.8.0's last day, on real servers.

1. A holder's own counts in its backfill grant requests (`held`,
   core/src/registry/backfill.rs): made-up counts of the lease role
   (malformed: refused whole; at capacity: what a call costs), a holder's
   dump restored on another holder of the same fleet, rows restored
   without triggers on a holder whose registry worker has not passed yet,
   a holder killed between the registry's grant and its own count.
2. The registry's token key file (src/durability/registry_key.rs):
   garbage, unreadable, missing on a promoted standby; what the lease
   role can read of it.
3. 0.7.0's SQL declarations under this library (before ALTER EXTENSION
   UPDATE): every C function of 0.7.0 called, none crashes the backend.

Each test asserts that its attack happened; strict xfails are open
problems, their reasons the numbers seen on PostgreSQL 15."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import time

import psycopg
import pytest

from fleet_helpers import (duplicates, grant_lease_role, holder, hosts, Intruder, lease_limits,
                           named_standby, registry_server, registry_state, resume)
from harness import wait_until
from helpers import old_release, run_client, sql_error

UTC = dt.timezone.utc
IDS = "1008-1023"
SET_ASIDE = {"snowflake_id.backfill_worker_ids": IDS}
CAPACITY = 64 * 16  # grants per stretch: 64 per set-aside id (classic)
START = dt.datetime(2024, 5, 1, tzinfo=UTC)
TIMES = [START + dt.timedelta(minutes=97 * i, milliseconds=i % 5) for i in range(300)]
KEY_FILE = "snowflake_id.key"


def _try(c, query):
    try:
        return c.scalar(query)
    except psycopg.Error:
        return None


def _live(c) -> None:
    wait_until(lambda: _try(c, "SELECT snowflake_nextval()") is not None, timeout=90,
               what="a lease")


def _backfill(conn, times) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) WITH ORDINALITY u(t, n)"
        " ORDER BY n", (times,)).fetchall()]


def _grants(c) -> dict:
    return dict(c.sql("SELECT bucket, grants FROM snowflake_backfill()"))


def _total(c) -> int:
    return c.scalar("SELECT coalesce(sum(grants), 0) FROM snowflake_backfill()")


def _no_duplicates(made: dict[str, list[int]]) -> None:
    problems = duplicates(made)
    assert not problems, "; ".join(problems)


def _registry_worker(c) -> int:
    return c.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'snowflake_id registry'")


def _postmaster(c) -> int:
    with open(os.path.join(c.datadir, "postmaster.pid")) as f:
        return int(f.readline())


def _no_crash(c, since: int, postmaster: int) -> None:
    log = c.log(since)
    assert not re.search(r"terminated by signal|server process .* was terminated", log), log[-3000:]
    assert _postmaster(c) == postmaster
    assert c.scalar("SELECT 1") == 1


def _grant_fn(r) -> str:
    schema = r.scalar("SELECT n.nspname FROM pg_proc p JOIN pg_namespace n"
                      " ON n.oid = p.pronamespace WHERE p.proname = 'snowflake_backfill_grant'")
    r.sql(f"GRANT EXECUTE ON FUNCTION {schema}.snowflake_backfill_grant(jsonb) TO snowflake_lease")
    return f"SELECT {schema}.snowflake_backfill_grant(%s::jsonb)::text"


def _bucket(r, t) -> int:
    return r.scalar("SELECT bucket FROM snowflake_backfill() WHERE %s BETWEEN starts_at"
                    " AND ends_at", t)


# -------------------------------------------- 1. the holder's own counts (held)
def test_made_up_held_counts_are_refused_whole_with_22023(make_cluster):
    """The lease role sends `held` negative, above a stretch's capacity,
    of another length than `buckets`, fractional, null, text, huge: each
    refused with 22023 naming `held`, and no counter of the registry moved
    (not even of a well-formed value before the bad one). A well-formed
    `held` below the registry's count changes nothing (stale), one above
    it raises the counter to it and the grant comes above."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    grant_lease_role(r)
    call = _grant_fn(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    with a.connect() as conn:
        _backfill(conn, TIMES[:50])
    layout = r.scalar("SELECT DISTINCT layout FROM snowflake_lease_blocks")
    b0, b1 = _bucket(r, TIMES[0]), _bucket(r, TIMES[0]) + 40
    base = {"node": "x", "name": "x", "layout": layout, "ids": IDS, "buckets": [b0, b1],
            "first": [True, True]}
    before = _grants(r)
    conn = r.connect(user="snowflake_lease")
    try:
        cases = [[5, -1], [5, CAPACITY + 1], [5], [5, 0, 0], [5, 1.5], [5, None], [5, "3"],
                 [5, 1e30], [5, 2**63], "5", {"a": 1}]
        for held in cases:
            e = sql_error(conn, call, (json.dumps({**base, "held": held}),))
            assert e.sqlstate == "22023", (held, e.sqlstate, str(e))
        assert _grants(r) == before, "a refused request moved the registry's counters"
        # Stale: below the registry's count.
        reply = json.loads(conn.execute(call, (json.dumps({**base, "held": [1, 0]}),))
                           .fetchone()[0])
        g_stale = reply["grants"][0]
        assert g_stale is not None and g_stale >= before[b0], (reply, before[b0])
        # Inflated: well above it.
        reply = json.loads(conn.execute(call, (json.dumps({**base, "held": [700, 900]}),))
                           .fetchone()[0])
    finally:
        conn.close()
    after = _grants(r)
    assert reply["grants"] == [700, 900], reply
    assert after[b0] == 701 and after[b1] == 901, after
    print(f"\n[held refused] {len(cases)} malformed refused 22023; stale grant {g_stale},"
          f" inflated raised to {after[b0]}, {after[b1]}")


def test_held_at_capacity_for_256_stretches_uses_them_up_in_one_call(make_cluster):
    """The documented cost of `held` (docs/guides/backfill.md, in a fleet:
    the lease role can use up a stretch): one call of the lease role with
    256 stretches at capacity. Measured: the registry's counters of all
    256 at capacity, no grant in the reply, a holder then refused 54000 in
    those stretches and served in others. The raise is written once per
    stretch (state file with fsync, WAL flush)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    grant_lease_role(r)
    call = _grant_fn(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    layout = r.scalar("SELECT DISTINCT layout FROM snowflake_lease_blocks")
    with a.connect() as conn:
        _backfill(conn, TIMES[:1])
    first = _bucket(r, TIMES[0])
    buckets = list(range(first, first + 256))
    req = {"node": "x", "name": "x", "layout": layout, "ids": IDS, "buckets": buckets,
           "first": [True] * 256, "held": [CAPACITY] * 256}
    lsn0 = r.scalar("SELECT pg_current_wal_lsn()")
    took = time.monotonic()
    with r.connect(user="snowflake_lease") as conn:
        reply = json.loads(conn.execute(call, (json.dumps(req),)).fetchone()[0])
    took = time.monotonic() - took
    wal = r.scalar("SELECT pg_current_wal_lsn() - %s::pg_lsn", lsn0)
    assert reply["grants"] == [None] * 256, reply["grants"][:5]
    g = _grants(r)
    assert all(g.get(b) == CAPACITY for b in buckets), {b: g.get(b) for b in buckets[:5]}
    # Stretch `first` is TIMES[0]'s; the 256 reach about 400 days on.
    inside = START + dt.timedelta(days=100)
    outside = START + dt.timedelta(days=1.56 * 256 + 100)
    with a.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at(%s)", (inside,))
        assert e.sqlstate == "54000", str(e)
    with a.connect() as conn:
        assert conn.execute("SELECT snowflake_at(%s)", (outside,)).fetchone()[0] > 0
    print(f"\n[held at capacity] 256 stretches used up in one call of {took:.2f} s,"
          f" {wal} bytes of WAL; holder refused: {e.diag.message_primary}")


def test_a_holders_dump_restored_on_another_holder_of_the_fleet(make_cluster):
    """Holder A imports 300 rows (its own counters count the fleet's
    grants it used); its dump is restored on holder B of the same fleet
    (B's counters raised by the restore's triggers, B's requests then
    carry them). A, B and the registry import the same times again: no ID
    repeats; B's counts are at least A's."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    a.sql("CREATE TABLE posts (id bigint PRIMARY KEY, created_at timestamptz)")
    a.sql("INSERT INTO posts SELECT snowflake_at(t), t FROM unnest(%s::timestamptz[]) t", TIMES)
    path = os.path.join(a.dir, "holder.dump")
    run_client(a, "pg_dump", "-Fc", "-f", path, "-d", "postgres")
    b.create_db("restored")
    b.sql("CREATE EXTENSION snowflake_id", dbname="restored")
    run_client(b, "pg_restore", "--exit-on-error", "-d", "restored", path)
    made = {"restored": [row[0] for row in b.sql("SELECT id FROM posts", dbname="restored")]}
    assert len(made["restored"]) == 300
    ga, gb = _grants(a), _grants(b)
    assert ga and all(gb.get(k, 0) >= v for k, v in ga.items()), (ga, gb)
    for name, c in (("B", b), ("A", a), ("R", r)):
        with c.connect() as conn:
            made[name] = _backfill(conn, TIMES)
    _no_duplicates(made)


def test_rows_restored_without_triggers_on_a_holder_count_before_its_next_grant(make_cluster):
    """Server N backfilled 300 rows alone (hand-set ranges, the fleet's
    set-aside ids); its dump is restored on holder H into a database the
    registry worker does not keep, data with --disable-triggers (a
    superuser's data-only restore): nothing raises H's counters at once.
    Backfill there of the same times (docs/guides/backfill.md, dumps and
    restores: snowflake_at() reads the restored rows of a stretch before
    it takes a grant there; in a fleet, H's request carries its counts):
    no restored ID made again."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    n = make_cluster(settings={"snowflake_id.worker_ids": "0-15", **SET_ASIDE})
    n.create_extension()
    n.sql("CREATE TABLE posts (id bigint PRIMARY KEY, created_at timestamptz)")
    n.sql("INSERT INTO posts SELECT snowflake_at(t), t FROM unnest(%s::timestamptz[]) t", TIMES)
    path = os.path.join(n.dir, "alone.dump")
    run_client(n, "pg_dump", "-Fc", "-f", path, "-d", "postgres")
    used = _total(n)
    h = holder(make_cluster, r, **SET_ASIDE)
    _live(h)
    h.create_db("other")
    run_client(h, "pg_restore", "--exit-on-error", "--schema-only", "-d", "other", path)
    run_client(h, "pg_restore", "--exit-on-error", "--data-only", "--disable-triggers",
               "-d", "other", path)
    in_table = h.scalar("SELECT sum(grants) FROM snowflake_backfill_grants", dbname="other")
    assert in_table == used and _total(h) == 0, (in_table, used, _total(h))
    made = {"restored": [row[0] for row in h.sql("SELECT id FROM posts", dbname="other")]}
    with h.connect(dbname="other") as conn:
        made["H"] = _backfill(conn, TIMES)
    problems = duplicates(made)
    print(f"\n[restored without triggers on a holder] N used {used} grants; {problems}")
    assert not problems, "; ".join(problems)
