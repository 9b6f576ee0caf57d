"""Backfill in a fleet (docs/guides/backfill.md, "In a fleet"): holders
leasing from a registry make snowflake_at() IDs from grants the registry
hands out of the fleet's set-aside worker ids (the same
snowflake_id.backfill_worker_ids everywhere), durable on its synchronous
standbys before use; the registry never leases a block holding one of
those ids. The rules are in core/src/registry/backfill.rs."""

from __future__ import annotations

import datetime as dt
import random
import threading

import psycopg

from fleet_helpers import (duplicates, holder, hosts, lease_limits, leases, named_standby,
                           registry_server, require_sync)
from harness import wait_until
from helpers import sql_error

UTC = dt.timezone.utc
# Block 63 of 16 ids: set aside whole, no live id is lost.
IDS = "1008-1023"
SET_ASIDE = {"snowflake_id.backfill_worker_ids": IDS}
START = dt.datetime(2024, 5, 1, tzinfo=UTC)
# Times over about 80 days (about 53 stretches), several on one
# millisecond.
TIMES = [START + dt.timedelta(minutes=97 * i, milliseconds=i % 5) for i in range(1200)]


def _live(c) -> None:
    """Waits until holder `c` makes live IDs (it holds a lease)."""
    wait_until(lambda: _try(c, "SELECT snowflake_nextval()") is not None, timeout=60,
               what="a lease")


def _try(c, query):
    try:
        return c.scalar(query)
    except psycopg.Error:
        return None


def _backfill(conn, times) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT snowflake_at(t) FROM unnest(%s::timestamptz[]) WITH ORDINALITY u(t, n) ORDER BY n",
        (times,)).fetchall()]


def _check_decoded(c, ids, times) -> None:
    rows = c.sql("SELECT ts, worker_id FROM unnest(%s::bigint[]) WITH ORDINALITY u(id, n),"
                 " snowflake_decode(id) ORDER BY n", ids)
    for (ts, worker), want in zip(rows, times):
        assert ts == want.replace(microsecond=want.microsecond // 1000 * 1000), (ts, want)
        assert 1008 <= worker <= 1023, worker


def _grants(c) -> dict:
    return dict(c.sql("SELECT bucket, grants FROM snowflake_backfill()"))


def test_two_holders_backfilling_the_same_times_at_once_never_make_the_same_id(make_cluster):
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    b = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    _live(b)
    made: dict[str, list[int]] = {}
    orders: dict[str, list] = {}
    errors: list[BaseException] = []

    def work(name, c, session, seed):
        times = TIMES[:]
        random.Random(seed).shuffle(times)
        try:
            with c.connect() as conn:
                got = _backfill(conn, times)
            made[f"{name}{session}"] = got
            orders[f"{name}{session}"] = times
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(name, c, n, seed))
               for seed, (name, c, n) in enumerate(
                   [("A", a, 1), ("B", b, 1), ("A", a, 2), ("B", b, 2)])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for key, ids in made.items():
        _check_decoded(a, ids, orders[key])
    # Live IDs of both holders are never of a set-aside id.
    for c in (a, b):
        live = [row[0] for row in c.sql(
            "SELECT w FROM generate_series(1, 300), snowflake_decode(snowflake_nextval()) d(t, w, s)")]
        assert all(w < 1008 for w in live), sorted(set(live))
        made[f"live {c.port}"] = [row[0] for row in c.sql(
            "SELECT snowflake_nextval() FROM generate_series(1, 300)")]
    problems = duplicates(made)
    assert not problems, "; ".join(problems)
    # The registry counted them: each stretch imported into has a grant of
    # each of the four sessions.
    counted = r.sql("SELECT DISTINCT b.bucket, b.grants FROM snowflake_backfill() b,"
                    " unnest(%s::timestamptz[]) t WHERE t BETWEEN b.starts_at AND b.ends_at",
                    TIMES)
    assert len(counted) >= 50 and min(n for _, n in counted) >= 4, counted
    # Block 63 (ids 1008-1023) is never leased, however many blocks are asked.
    assert all(block != 63 for block, *_ in leases(r)), leases(r)


def test_a_holder_whose_set_aside_ids_differ_from_the_registrys_is_refused_naming_both(
        make_cluster):
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    c = holder(make_cluster, r, **{"snowflake_id.backfill_worker_ids": "1020-1023"})
    _live(c)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    assert e.sqlstate == "55000", str(e)
    message = e.diag.message_primary
    assert "'1020-1023'" in message and f"'{IDS}'" in message, message
    assert "snowflake_id registry: node" in r.log() and "1020-1023" in r.log()


def test_a_registry_failover_in_the_middle_of_two_imports_repeats_no_grant(make_cluster):
    """The registry P with its synchronous standby s1 (a failover
    candidate); holders A and B import the same times in loops of new
    sessions; P stops, s1 is promoted: the imports fail clearly while no
    registry answers, then go on against s1, whose counters came by WAL.
    No ID is made twice, and s1 hands out no grant P had handed out."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s)})
    b = holder(make_cluster, p, **{**SET_ASIDE, "snowflake_id.registry": hosts(p, s)})
    _live(a)
    _live(b)
    made: dict[str, list[int]] = {"A": [], "B": []}
    failures: dict[str, list[str]] = {"A": [], "B": []}
    stop = threading.Event()
    rounds = {"A": 0, "B": 0}

    def work(name, c, seed):
        rng = random.Random(seed)
        while not stop.is_set():
            times = rng.sample(TIMES, 200)
            try:
                with c.connect() as conn:
                    made[name] += _backfill(conn, times)
                rounds[name] += 1
            except psycopg.Error as e:
                failures[name].append(f"{e.sqlstate}: {e.diag.message_primary}")
                stop.wait(0.2)

    threads = [threading.Thread(target=work, args=(n, c, i))
               for i, (n, c) in enumerate([("A", a), ("B", b)])]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: min(rounds.values()) >= 3, timeout=120, what="imports on P")
        # The grants P handed out so far, once s1 has replayed them (the
        # ones after, unreplayed, no holder used).
        with p.connect() as conn:
            before = dict(conn.execute("SELECT bucket, grants FROM snowflake_backfill()").fetchall())
            lsn = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        wait_until(lambda: s.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn),
                   timeout=60, what="s1 replaying P's grants")
        p.stop(mode="immediate")
        s.promote()
        at_failover = dict(rounds)
        wait_until(lambda: all(rounds[n] >= at_failover[n] + 3 for n in rounds), timeout=180,
                   what="imports going on against the promoted s1")
    finally:
        stop.set()
        for t in threads:
            t.join()
    after = _grants(s)
    # s1 continued every stretch above what P had handed out.
    for bucket, n in before.items():
        assert after.get(bucket, 0) >= n, (bucket, n, after.get(bucket))
    problems = duplicates(made)
    assert not problems, "; ".join(problems)
    # A failure while no registry answered names the registry.
    for line in failures["A"] + failures["B"]:
        assert "registry" in line or "snowflake_at" in line, line
    print(f"\n[failover] rounds {rounds}, failures {sum(map(len, failures.values()))},"
          f" IDs {sum(map(len, made.values()))}")


def test_grants_not_durable_on_the_registrys_synchronous_standby_are_not_used(make_cluster):
    """The registry P's synchronous standby s1 is stopped: P hands out
    grants (in its WAL, flushed) that s1 does not have, so the holder does
    not use them: snowflake_at() fails (55000) once the registry has not
    said they are durable for 30 s, and no ID is made."""
    p = make_cluster(tcp=True, settings={"fsync": True, **SET_ASIDE})
    p.create_extension()
    lease_limits(p)
    s = named_standby(make_cluster, p, "s1", "s1", **SET_ASIDE)
    require_sync(p, "FIRST 1 (s1)", "s1")
    a = holder(make_cluster, p, **SET_ASIDE)
    _live(a)
    s.stop(mode="immediate")
    with a.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    assert e.sqlstate == "55000", str(e)
    assert "were not durable on its synchronous standbys" in e.diag.message_primary, \
        e.diag.message_primary
    assert "0 of 1 synchronous standbys" in e.diag.message_detail, e.diag.message_detail
    # P handed them out all the same: they are lost, never used.
    assert p.scalar("SELECT sum(grants) FROM snowflake_backfill()") >= 1


def test_the_registry_never_leases_a_block_holding_a_set_aside_id(make_cluster):
    """X holds block 62 (ids 992-1007); Y, whose live ids are 1000-1023
    (blocks 62 and 63, no backfill of its own), gets no block while X
    holds 62: block 63 holds the registry's set-aside ids. Once X stops,
    Y gets 62, and makes no ID of a set-aside id."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    x = holder(make_cluster, r, **{"snowflake_id.worker_ids": "992-1007"})
    _live(x)
    y = holder(make_cluster, r, **{"snowflake_id.worker_ids": "1000-1023"})
    x.stop()
    _live(y)
    with y.connect() as conn:
        got = [row[0] for row in conn.execute(
            "SELECT d.worker_id FROM generate_series(1, 2000),"
            " snowflake_decode(snowflake_nextval()) d").fetchall()]
    assert set(got) <= set(range(1000, 1008)), sorted(set(got))
    assert [block for block, *_ in leases(r)] == [62], leases(r)
    assert r.scalar("SELECT count(*) FROM snowflake_lease_blocks WHERE block = 63") == 0


def test_a_registry_without_backfill_grants_is_named(make_cluster):
    """A registry whose extension has no snowflake_backfill_grant (before
    0.8.0; here the function is dropped from it) refuses clearly."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    r.sql("ALTER EXTENSION snowflake_id DROP FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb)")
    r.sql("DROP FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb)")
    c = holder(make_cluster, r, **SET_ASIDE)
    _live(c)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    assert e.sqlstate == "55000", str(e)
    assert "hands out no backfill grants" in e.diag.message_primary, e.diag.message_primary
    assert "ALTER EXTENSION snowflake_id UPDATE" in e.diag.message_hint


def test_backfill_on_the_registry_itself_shares_the_fleets_counters(make_cluster):
    """The registry server's own snowflake_at() takes from the counters it
    hands out to holders: the same times on both never repeat an ID."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    with r.connect() as conn:
        on_registry = _backfill(conn, TIMES[:300])
    with a.connect() as conn:
        on_holder = _backfill(conn, TIMES[:300])
    problems = duplicates({"registry": on_registry, "holder": on_holder})
    assert not problems, "; ".join(problems)


def test_a_role_that_may_not_read_the_registry_setting_is_not_shown_its_address(make_cluster):
    """The registry stopped: snowflake_at() fails (08006). A role granted
    EXECUTE on it only sees neither the registry's address nor libpq's
    problem (which names it), as for snowflake_nextval()'s errors; a
    superuser sees both. Before, every role saw them (the third
    adversarial helper of session 18)."""
    r = registry_server(make_cluster, **SET_ASIDE)
    lease_limits(r)
    a = holder(make_cluster, r, **SET_ASIDE)
    _live(a)
    a.sql("CREATE ROLE importer LOGIN")
    a.sql("GRANT EXECUTE ON FUNCTION snowflake_at(timestamptz) TO importer")
    r.stop()
    with a.connect(user="importer") as conn:
        hidden = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    with a.connect() as conn:
        shown = sql_error(conn, "SELECT snowflake_at('2024-06-01')")
    assert hidden.sqlstate == shown.sqlstate == "08006", (str(hidden), str(shown))
    assert str(r.port) not in hidden.diag.message_primary, hidden.diag.message_primary
    assert "address hidden" in hidden.diag.message_primary, hidden.diag.message_primary
    assert str(r.port) in shown.diag.message_primary, shown.diag.message_primary
