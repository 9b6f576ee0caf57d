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
import threading
import time

import psycopg
import pytest

from fleet_helpers import (duplicates, grant_lease_role, holder, hosts, Intruder, lease_limits,
                           named_standby, registry_server, registry_state, require_sync)
from fleet_helpers import backfill_ids as _backfill
from fleet_helpers import grants_by_stretch as _grants
from fleet_helpers import total_grants as _total
from fleet_helpers import try_scalar as _try
from fleet_helpers import wait_live as _live
from harness import wait_until
from helpers import old_release, run_client, sql_error

UTC = dt.timezone.utc
IDS = "1008-1023"
SET_ASIDE = {"snowflake_id.backfill_worker_ids": IDS}
CAPACITY = 64 * 16  # grants per stretch: 64 per set-aside id (classic)
START = dt.datetime(2024, 5, 1, tzinfo=UTC)
TIMES = [START + dt.timedelta(minutes=97 * i, milliseconds=i % 5) for i in range(300)]
KEY_FILE = "snowflake_id.key"


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


# ------------------------------------------------- 2. the registry's key file
def _key_path(r) -> str:
    return os.path.join(r.datadir, KEY_FILE)


def _renewed(r, a) -> None:
    """Waits until holder `a`'s lease is renewed (its expiry moves)."""
    first = r.scalar("SELECT max(expires_at) FROM snowflake_leases WHERE leased")
    wait_until(lambda: (r.scalar("SELECT max(expires_at) FROM snowflake_leases WHERE leased")
                        or first) > first, timeout=30, what="a renewal")
    assert _try(a, "SELECT snowflake_nextval()") is not None


def test_a_garbage_key_file_refuses_a_new_row_clearly_and_nothing_else(make_cluster):
    """The registry's snowflake_id.key overwritten with garbage (then
    emptied) while holder A holds a block: renewals go on (the key is read
    only when the registry's row is made); CREATE EXTENSION in another
    database, and DROP/CREATE in the registry's with no holder, are
    refused XX001 naming the file with a hint, the backend and server
    live. The file put back: CREATE EXTENSION keeps the key (new_key
    false), and A's token still counts."""
    r = registry_server(make_cluster)
    lease_limits(r)
    path = _key_path(r)
    with open(path) as f:
        key = f.read().strip()
    assert re.fullmatch(r"[0-9a-f]{32}", key), key
    assert r.sql("SELECT token_key, new_key FROM snowflake_lease_registry") == [(key, True)]
    a = holder(make_cluster, r)
    _live(a)
    pm, mark = _postmaster(r), r.log_mark()
    r.create_db("app")
    seen = {}
    for name, text in (("garbage", "not a key at all\n"), ("empty", ""),
                       ("33 digits", key + "0")):
        with open(path, "w") as f:
            f.write(text)
        _renewed(r, a)
        with r.connect(dbname="app") as conn:
            e = sql_error(conn, "CREATE EXTENSION snowflake_id")
        assert e.sqlstate == "XX001", (name, e.sqlstate, str(e))
        assert KEY_FILE in e.diag.message_primary and "Restore the file" in e.diag.message_hint
        seen[name] = e.diag.message_primary
    a.stop()
    wait_until(lambda: r.scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                " AND objsubid = 2") == 0, timeout=30, what="A's locks gone")
    r.sql("DROP EXTENSION snowflake_id CASCADE")
    r.sql("DROP ROLE IF EXISTS snowflake_lease")
    e = sql_error(r.connect(), "CREATE EXTENSION snowflake_id")
    assert e.sqlstate == "XX001", str(e)
    _no_crash(r, mark, pm)
    with open(path, "w") as f:
        f.write(key.upper() + "\n")
    r.sql("CREATE EXTENSION snowflake_id")
    assert r.sql("SELECT token_key, new_key FROM snowflake_lease_registry") == [(key, False)]
    lease_limits(r)
    # A forged token naming a made-up incarnation: no evidence, no fence.
    grant_lease_role(r)
    x = Intruder(r)
    x.acquire(incarnation="never-issued", token="0123456789abcdef" * 2)
    x.close()
    made_again = registry_state(r)
    assert not made_again[1], made_again
    # A's token of the incarnation before DROP verifies under the kept
    # key: evidence that the registry forgot A's blocks (DROP did).
    a.start()
    _live(a)
    after = registry_state(r)
    assert after[0] != made_again[0] and "knew incarnation" in after[2], (made_again, after)
    print(f"\n[garbage key] {seen}; after A's token: {after}")


@pytest.mark.parametrize("how", ["mode 000", "a directory"])
def test_an_unreadable_key_file_refuses_create_extension_with_58030(make_cluster, how):
    """snowflake_id.key unreadable to the server (mode 000; a directory in
    its place): CREATE EXTENSION in a new database is refused 58030 naming
    the file, with a hint; no crash. Put right: it works again and keeps
    the key."""
    r = registry_server(make_cluster)
    path = _key_path(r)
    with open(path) as f:
        key = f.read().strip()
    pm, mark = _postmaster(r), r.log_mark()
    if how == "mode 000":
        os.chmod(path, 0)
    else:
        os.rename(path, path + ".saved")
        os.mkdir(path)
    r.create_db("app")
    with r.connect(dbname="app") as conn:
        e = sql_error(conn, "CREATE EXTENSION snowflake_id")
    assert e.sqlstate == "58030", (e.sqlstate, str(e))
    assert KEY_FILE in e.diag.message_primary and e.diag.message_hint, str(e)
    _no_crash(r, mark, pm)
    if how == "mode 000":
        os.chmod(path, 0o600)
    else:
        os.rmdir(path)
        os.rename(path + ".saved", path)
    r.sql("CREATE EXTENSION snowflake_id", dbname="app")
    assert r.sql("SELECT token_key, new_key FROM snowflake_lease_registry",
                 dbname="app") == [(key, False)]
    print(f"\n[unreadable key, {how}] {e.diag.message_primary}")


def test_the_lease_role_cannot_read_the_key(make_cluster):
    """As the lease role (with the documented rights and EXECUTE on
    snowflake_backfill_grant): pg_read_file, pg_read_binary_file,
    pg_stat_file, pg_ls_dir, COPY FROM the file, lo_import, the
    registry's table, snowflake_lease_data_key() and snowflake_lease_sign
    are refused 42501; the key is in no reply to its calls and in no
    table or view it may read."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    grant_lease_role(r)
    call = _grant_fn(r)
    with open(_key_path(r)) as f:
        key = f.read().strip()
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    with a.connect() as conn:
        _backfill(conn, TIMES[:10])
    refused = {}
    with r.connect(user="snowflake_lease") as conn:
        conn.execute("CREATE TEMP TABLE k (t text)")
        for q in (f"SELECT pg_read_file('{KEY_FILE}')",
                  f"SELECT pg_read_binary_file('{KEY_FILE}')",
                  f"SELECT pg_stat_file('{KEY_FILE}')",
                  "SELECT pg_ls_dir('.')",
                  f"COPY k FROM '{_key_path(r)}'",
                  f"SELECT lo_import('{_key_path(r)}')",
                  "SELECT token_key FROM snowflake_lease_registry",
                  "SELECT snowflake_id_internal.snowflake_lease_data_key()",
                  "SELECT snowflake_id_internal.snowflake_lease_sign('k', 'i', '0/0', 0)"):
            e = sql_error(conn, q)
            refused[q.split("(")[0]] = e.sqlstate
            assert e.sqlstate == "42501", (q, e.sqlstate, str(e))
        x = Intruder(r)
        replies = [json.dumps(x.acquire())]
        layout = x.layout
        x.close()
        replies.append(conn.execute(call, (json.dumps(
            {"node": "x", "name": "x", "layout": layout, "ids": IDS,
             "buckets": [_bucket(r, TIMES[0])], "first": [True]}),)).fetchone()[0])
        readable = conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'v', 'm', 'p') AND n.nspname NOT IN"
            " ('pg_catalog', 'information_schema', 'pg_toast')"
            " AND n.nspname NOT LIKE 'pg_temp%%'"
            " AND has_table_privilege(c.oid, 'SELECT')").fetchall()
        leaked = [t for (t,) in readable if conn.execute(
            f"SELECT count(*) FROM {t} x WHERE x::text LIKE %s", (f"%{key}%",)).fetchone()[0]]
    assert all(key not in reply for reply in replies), replies
    assert not leaked, leaked
    print(f"\n[lease role and the key] refused: {refused}; readable relations:"
          f" {[t for (t,) in readable]}")


def test_a_promoted_standby_without_the_key_file_goes_on(make_cluster):
    """Registry P's standby s1 (a base backup: it has P's key file) loses
    its key file; P stops, s1 is promoted. The holder, whose connection
    string names both, goes on from s1 (its token verifies with the key
    in the registry's row, which s1 replayed); no ID repeats. The key file
    is made again only when a row is made: DROP/CREATE EXTENSION on s1
    with no holder then starts with a new key (new_key true)."""
    p = make_cluster(tcp=True, settings={"fsync": True})
    p.create_extension()
    lease_limits(p)
    with open(_key_path(p)) as f:
        key = f.read().strip()
    s = named_standby(make_cluster, p, "s1", "s1")
    with open(_key_path(s)) as f:
        assert f.read().strip() == key
    os.remove(_key_path(s))
    a = holder(make_cluster, p, **{"snowflake_id.registry": hosts(p, s)})
    _live(a)
    wait_until(lambda: s.scalar("SELECT count(*) FROM snowflake_lease_blocks") > 0, timeout=30,
               what="s1 replaying A's lease")
    made = {"A on P": [row[0] for row in a.sql("SELECT snowflake_nextvals(1000)")]}
    incarnation = registry_state(p)[0]
    p.stop(mode="fast")
    s.promote()
    wait_until(lambda: s.scalar("SELECT count(*) FROM snowflake_leases WHERE leased"
                                " AND expires_at > now() + interval '3 s'") > 0,
               timeout=60, what="A renewing on s1")
    _live(a)
    made["A on s1"] = [row[0] for row in a.sql("SELECT snowflake_nextvals(1000)")]
    after = registry_state(s)
    assert not os.path.exists(_key_path(s))
    assert s.scalar("SELECT token_key FROM snowflake_lease_registry") == key
    _no_duplicates(made)
    a.stop()
    wait_until(lambda: s.scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                " AND objsubid = 2") == 0, timeout=30, what="A's locks gone")
    s.sql("DROP EXTENSION snowflake_id CASCADE")
    s.sql("CREATE EXTENSION snowflake_id")
    row = s.sql("SELECT token_key, new_key FROM snowflake_lease_registry")[0]
    with open(_key_path(s)) as f:
        assert f.read().strip() == row[0]
    assert row[0] != key and row[1] is True, row
    print(f"\n[standby without key] incarnation {incarnation} -> {after}")


# ------------------------------- 3. 0.7.0's declarations under this library
# Each C function of tests/upgrade/snowflake_id--0.7.0.sql, called as 0.7.0
# declares it ({id}: an ID made there).
CALLS_070 = [
    "SELECT snowflake_nextval()",
    "SELECT * FROM snowflake_nextvals(3)",
    "SELECT * FROM snowflake_accept_layout()",
    "SELECT snowflake_advance_past({id})",
    "SELECT snowflake_at('2024-06-01 12:00+00')",
    "SELECT * FROM snowflake_backfill()",
    "SELECT snowflake_backfill_raise('2024-06-01 12:00+00', 3)",
    "SELECT snowflake_backfill_raise('2024-06-01 12:00+00', 3, '1023')",
    "SELECT snowflake_compose(now(), 5, 1)",
    "SELECT * FROM snowflake_config()",
    "SELECT snowflake_from_public(snowflake_to_public({id}))",
    "SELECT snowflake_from_timestamp(now())",
    "SELECT * FROM snowflake_layout()",
    "SELECT snowflake_sequence({id}), snowflake_timestamp({id}), snowflake_worker_id({id})",
    "SELECT * FROM snowflake_worker_status()",
]


def test_every_c_function_of_0_7_0_under_this_library_crashes_no_backend(make_cluster):
    """A server with this library, a backfill grant and a live claim; a
    second database with `CREATE EXTENSION snowflake_id VERSION '0.7.0'`
    (ALTER EXTENSION UPDATE not run). Every C function 0.7.0 declares is
    called there, each in its own session: each answers or raises an
    error, no backend is lost, the postmaster is the same. The symbols
    whose declaration differs from this version's (by argument or result)
    are listed: only snowflake_backfill()'s, which raises 55000."""
    c = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"},
                     create_extension=True)
    assert c.scalar("SELECT snowflake_at('2024-06-01 12:00+00')") > 0
    pm, mark = _postmaster(c), c.log_mark()
    decl = ("SELECT p.prosrc, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
            " FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'"
            " JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'"
            " JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'c'")
    new = {row[0]: row[1:] for row in c.sql(decl)}
    with old_release("0.7.0"):
        c.create_db("from070")
        c.sql("CREATE EXTENSION snowflake_id VERSION '0.7.0'", dbname="from070")
    old = {row[0]: row[1:] for row in c.sql(decl, dbname="from070")}
    assert len(old) == 17, sorted(old)
    differ = sorted(s for s, d in old.items() if new.get(s) != d)
    an_id = c.scalar("SELECT snowflake_nextval()", dbname="from070")
    outcomes = {}
    for q in CALLS_070:
        q = q.format(id=an_id)
        with c.connect(dbname="from070") as conn:
            try:
                conn.execute(q).fetchall()
                outcomes[q] = "ok"
            except psycopg.Error as e:
                # No SQLSTATE: the server closed the connection.
                outcomes[q] = e.sqlstate or f"LOST: {e}"
    lost = {q: o for q, o in outcomes.items() if o.startswith("LOST")}
    print(f"\n[0.7.0 under this library] differ: {differ}; outcomes: {outcomes}")
    assert not lost, lost
    _no_crash(c, mark, pm)
    assert outcomes["SELECT * FROM snowflake_backfill()"] == "55000"
    assert differ == ["snowflake_backfill_wrapper"], {s: (old[s], new.get(s)) for s in differ}
    assert c.scalar("SELECT count(*) FROM pg_stat_activity"
                    " WHERE backend_type = 'snowflake_id registry'") == 1


def test_a_registry_database_on_0_7_0_under_this_library_refuses_backfill_until_updated(
        make_cluster):
    """The registry worker's database itself on 0.7.0 (the library
    updated, ALTER EXTENSION UPDATE not run), backfill ids set aside, a
    grant taken while it was updated: the worker's passes skip backfill
    (no crash loop: the same postmaster, one registry worker, for several
    passes); snowflake_at() and snowflake_backfill() refuse without
    crashing; after the update both work and the grants go on above the
    earlier one."""
    c = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"},
                     create_extension=True)
    first = c.scalar("SELECT snowflake_at('2024-06-01 12:00+00')")
    c.sql("DROP EXTENSION snowflake_id CASCADE")
    with old_release("0.7.0"):
        c.sql("CREATE EXTENSION snowflake_id VERSION '0.7.0'")
    c.restart()
    pm, mark = _postmaster(c), c.log_mark()
    worker = _registry_worker(c)
    with c.connect() as conn:
        conn.execute("SET statement_timeout = '4s'")
        e = sql_error(conn, "SELECT snowflake_at('2024-06-01 12:00+00')")
        assert e.sqlstate in ("55000", "57014"), (e.sqlstate, str(e))
        e2 = sql_error(conn, "SELECT * FROM snowflake_backfill()")
        assert e2.sqlstate == "55000", str(e2)
    assert _registry_worker(c) == worker
    _no_crash(c, mark, pm)
    c.sql("ALTER EXTENSION snowflake_id UPDATE")
    again = c.scalar("SELECT snowflake_at('2024-06-01 12:00+00')")
    assert again != first
    assert c.scalar("SELECT grants FROM snowflake_backfill() WHERE"
                    " '2024-06-01 12:00+00' BETWEEN starts_at AND ends_at") == 2
    print(f"\n[registry database on 0.7.0] snowflake_at: {e.sqlstate} {e.diag.message_primary}")


# ------------------------------------------------ 1b. holders' own histories
def _carry(server, registry) -> None:
    """The documented step before a server that backfilled alone joins a
    fleet (docs/guides/backfill.md, in a fleet): its grants raised on the
    registry, as a superuser there."""
    for starts_at, grants, ids in server.sql(
            "SELECT starts_at, grants, worker_ids FROM snowflake_backfill()"):
        registry.sql("SELECT snowflake_backfill_raise(%s, %s, %s)", starts_at, grants, ids)


@pytest.mark.parametrize("carried", [True, False])
def test_two_servers_with_their_own_histories_join_the_fleet(make_cluster, carried):
    """A and B backfilled alone with the fleet's set-aside ids, into
    different stretches (A the first 100 times, B the last 100: no grant
    of theirs shared); both then lease from registry R. A, B and R import
    all 300 times, in that order. carried: their grants were raised on R
    first, as documented: no ID repeats an earlier one, and R's counters
    of the stretches imported are above both. Not carried (outside the
    assumptions): a holder's own counts reach R only in its own requests,
    and A, importing first, makes B's IDs again (100 on PostgreSQL 15)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    alone = {"snowflake_id.worker_ids": "0-15", **SET_ASIDE}
    a = make_cluster(settings=alone)
    b = make_cluster(settings={**alone, "snowflake_id.worker_ids": "16-31"})
    made = {}
    for name, c, times in (("A alone", a, TIMES[:100]), ("B alone", b, TIMES[200:])):
        c.create_extension()
        with c.connect() as conn:
            made[name] = _backfill(conn, times)
        with c.connect() as conn:
            made[name + " 2"] = _backfill(conn, times)
    ga, gb = _grants(a), _grants(b)
    assert ga and gb and not set(ga) & set(gb), (ga, gb)
    if carried:
        _carry(a, r)
        _carry(b, r)
    for c in (a, b):
        c.configure(**{"snowflake_id.worker_ids": "", "snowflake_id.registry": r.conninfo(),
                       "snowflake_id.lease_time": "6s"})
        c.restart()
    _live(a)
    _live(b)
    for name, c in (("A", a), ("B", b), ("R", r)):
        with c.connect() as conn:
            made[name] = _backfill(conn, TIMES)
    if not carried:
        problems = duplicates(made)
        assert problems and all("B alone" in x for x in problems), problems
        return
    g = _grants(r)
    used = {k for (k,) in r.sql("SELECT DISTINCT bucket FROM snowflake_backfill(),"
                                " unnest(%s::timestamptz[]) t WHERE t BETWEEN starts_at"
                                " AND ends_at", TIMES)}
    assert all(g[k] > v for k, v in {**ga, **gb}.items() if k in used), (g, ga, gb)
    _no_duplicates(made)


@pytest.mark.parametrize("carried", [True, False])
def test_a_server_that_backfilled_alone_joins_and_another_holder_imports_first(make_cluster,
                                                                            carried):
    """A backfills alone (hand-set ranges, the fleet's set-aside ids),
    then leases from registry R with the same ids. Holder B imports the
    same times before A asks R for anything. carried: A's grants were
    raised on R first, as documented: B's IDs never equal A's. Not carried
    (outside the assumptions): A's own counts reach R only in A's own
    requests, and B makes A's IDs again (200 on PostgreSQL 15)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = make_cluster(settings={"snowflake_id.worker_ids": "0-15", **SET_ASIDE})
    a.create_extension()
    made = {}
    with a.connect() as conn:
        made["A alone"] = _backfill(conn, TIMES[:100])
    with a.connect() as conn:
        made["A alone 2"] = _backfill(conn, TIMES[:100])
    if carried:
        _carry(a, r)
    a.configure(**{"snowflake_id.worker_ids": "", "snowflake_id.registry": r.conninfo(),
                   "snowflake_id.lease_time": "6s"})
    a.restart()
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    assert a.scalar("SELECT mode FROM snowflake_config()") == "registry"
    assert _total(a) > 0
    with b.connect() as conn:
        made["B"] = _backfill(conn, TIMES[:100])
    with b.connect() as conn:
        made["B 2"] = _backfill(conn, TIMES[:100])
    problems = duplicates(made)
    print(f"\n[alone, joined, another first, carried {carried}] {problems}")
    if carried:
        assert not problems, "; ".join(problems)
    else:
        assert problems and all("A alone" in x for x in problems), problems


def test_a_holder_killed_between_the_grant_and_its_own_count(make_cluster):
    """Registry P's synchronous standby stops: holder A's call has its
    grants handed out (P's counters moved) and waits for their durability;
    A is killed (immediate stop) in that wait, before it counts them.
    The standby back, A started again: its own counts are below P's (the
    grants it never used), its requests carry those stale counts, and P
    hands out above its own. A and B import the same times: no ID
    repeats."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **SET_ASIDE)
    b = holder(make_cluster, p, **SET_ASIDE)
    _live(a)
    _live(b)
    made = {}
    with a.connect() as conn:
        made["A first"] = _backfill(conn, TIMES[:50])
    s.stop(mode="immediate")
    before = _total(p)
    conn = a.connect()
    failure: list[BaseException] = []

    def run():
        try:
            conn.execute("SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) t", (TIMES,))
        except BaseException as e:  # noqa: BLE001 - the server is killed
            failure.append(e)
    t = threading.Thread(target=run)
    t.start()
    try:
        wait_until(lambda: _total(p) > before, timeout=30, what="P handing out the grants")
        time.sleep(1)
        a.stop(mode="immediate")
        t.join(30)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001, S110 (the server is gone)
            pass
    assert failure, "the call returned although its grants were not durable"
    handed_out = _grants(p)
    s.start()
    wait_until(lambda: p.scalar("SELECT count(*) FROM pg_stat_replication"
                                " WHERE sync_state = 'sync'") == 1,
               timeout=60, what="s1 synchronous again")
    a.start()
    _live(a)
    own = _grants(a)
    stale = [k for k, v in handed_out.items() if own.get(k, 0) < v]
    assert stale, (own, handed_out)
    for name, c in (("A", a), ("B", b)):
        with c.connect() as conn2:
            made[name] = _backfill(conn2, TIMES)
    after = _grants(p)
    assert all(after[k] > handed_out[k] for k in stale[:5]), (after, handed_out)
    _no_duplicates(made)
    print(f"\n[killed before its count] {len(stale)} stretches where A's count is below P's")


def test_forged_tokens_after_drop_create_with_holders_holding_blocks(make_cluster):
    """Holder A holds a block; the registry's extension is dropped and
    created again (A's sessions hold their block locks: no row is made,
    the first lease call makes it and fences, by design). The lease role
    then sends, again and again, requests naming a made-up incarnation
    with a forged token: they start no incarnation after the first call's
    (the key file was kept: new_key false), and A goes on making IDs."""
    r = registry_server(make_cluster)
    lease_limits(r)
    grant_lease_role(r)
    with open(_key_path(r)) as f:
        key = f.read().strip()
    a = holder(make_cluster, r)
    _live(a)
    made = {"A before": [row[0] for row in a.sql("SELECT snowflake_nextvals(500)")]}
    r.sql("DROP EXTENSION snowflake_id CASCADE")
    r.sql("DROP ROLE snowflake_lease")
    r.sql("CREATE EXTENSION snowflake_id")
    lease_limits(r)
    assert r.scalar("SELECT count(*) FROM snowflake_lease_registry") == 0
    grant_lease_role(r)
    forged = {"incarnation": "never-issued", "token": "0123456789abcdef" * 2}
    x = Intruder(r)
    x.acquire(**forged)
    first = registry_state(r)
    row = r.sql("SELECT token_key, new_key FROM snowflake_lease_registry")[0]
    incarnations = set()
    for _ in range(10):
        x.acquire(**forged)
        incarnations.add(registry_state(r)[0])
        time.sleep(0.3)
    x.close()
    _live(a)
    made["A after"] = [row[0] for row in a.sql("SELECT snowflake_nextvals(500)")]
    _no_duplicates(made)
    assert row == (key, False), row
    assert incarnations == {first[0]}, (first, incarnations)
    print(f"\n[forged after drop/create, holders holding] first call: {first};"
          f" 10 forged calls after: {len(incarnations)} incarnation")
