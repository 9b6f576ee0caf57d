"""Restarts: crashes never repeat IDs, a clock set back after a restart,
an unreadable state file, and pg_dump/pg_restore.

Classic layout unless a test says otherwise."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import psycopg
import pytest

from harness import ClusterError, wait_until
from helpers import (assert_strictly_increasing, faketime_env,
                     generate, ms_of, my_worker_id, needs_faketime,
                     run_client, sql_error, worker_of)


# ------------------------------------------------------ 4. crash restarts
# Four sequence values per millisecond and a 30 s drift bound: 40,000 IDs from
# one connection run about 10 s ahead of the clock, so after a quick restart
# only the reservation (state file, or WAL replayed in crash recovery) keeps
# new IDs above the old ones.
DRIFT_LAYOUT = {"snowflake_id.sequence_bits": 2, "snowflake_id.max_drift": "30s",
                "snowflake_id.worker_ids": "0-3"}


def _generate_per_worker(c, n_conns: int, n: int, sequence_bits: int = 12,
                         batch: bool = True) -> dict[int, list[int]]:
    """n IDs from each of n_conns connections, all holding their worker id
    at the same time (so each id is used once): {worker id: IDs in order}.
    batch: one snowflake_nextvals(n) call, else n snowflake_nextval() calls."""
    out = {}
    conns = [c.connect() for _ in range(n_conns)]
    try:
        for conn in conns:  # claim all first
            conn.execute("SELECT snowflake_nextval()")
        for conn in conns:
            if batch:
                ids = [r[0] for r in conn.execute("SELECT snowflake_nextvals(%s)", (n,))]
            else:
                ids = generate(conn, n)
            w = my_worker_id(conn)
            assert {worker_of(i, sequence_bits) for i in ids} == {w}
            assert_strictly_increasing(ids, f"worker {w}")
            out[w] = ids
    finally:
        for conn in conns:
            conn.close()
    return out


@pytest.mark.parametrize("crash", ["immediate_stop", "backend_sigkill", "clean_stop"])
def test_crash_restart_never_repeats_ids(make_cluster, crash):
    c = make_cluster(settings=DRIFT_LAYOUT, create_extension=True)
    old = _generate_per_worker(c, 4, 40_000, sequence_bits=2)
    assert sorted(old) == [0, 1, 2, 3]
    newest_ms = max(ms_of(max(ids), sequence_bits=2) for ids in old.values())
    ahead = newest_ms - time.time() * 1000
    assert ahead > 3000, f"the IDs should run well ahead of the clock ({ahead} ms)"

    state_path = os.path.join(c.datadir, "snowflake_id.state")
    assert os.path.isfile(state_path), os.listdir(c.datadir)
    with open(state_path) as f:
        state = json.load(f)
    assert state["reserved_until_ms"] >= newest_ms, (state, newest_ms)
    assert state["layout"]["sequence_bits"] == 2, state

    if crash in ("immediate_stop", "clean_stop"):
        # After a clean stop there is no WAL to replay: the state file alone
        # must hold the reservation.
        c.stop(mode="immediate" if crash == "immediate_stop" else "fast")
        c.start()
    else:
        mark = c.log_mark()
        with c.connect() as victim:
            victim.execute("SELECT snowflake_nextval()")
            pid = victim.info.backend_pid
            os.kill(pid, signal.SIGKILL)
        c.wait_for_log(r"all server processes terminated; reinitializing", since=mark)
        wait_until(lambda: _accepts_connections(c), what="server to come back")

    new = _generate_per_worker(c, 4, 2_000, sequence_bits=2)
    assert sorted(new) == sorted(old), "the same worker ids were not reused"
    for w, ids in new.items():
        assert min(ids) > max(old[w]), (
            f"worker {w}: new ID {min(ids)} not above old {max(old[w])}")
    everything = [i for ids in (*old.values(), *new.values()) for i in ids]
    assert len(set(everything)) == len(everything)


def _accepts_connections(c) -> bool:
    try:
        return c.scalar("SELECT 1") == 1
    except psycopg.OperationalError:
        return False


# -------------------------------------- 5. clock set back after a restart
def _ids_then_restart_behind(make_cluster, max_drift: str, behind_s: int):
    c = make_cluster(settings={"snowflake_id.worker_ids": "0-3",
                               "snowflake_id.max_drift": max_drift},
                     create_extension=True)
    old = _generate_per_worker(c, 4, 5_000, batch=False)
    c.stop(mode="immediate")
    c.start(env=faketime_env(f"-{behind_s}s"))
    skew = c.scalar("SELECT extract(epoch FROM clock_timestamp())::float8") - time.time()
    assert -behind_s - 2 < skew < -behind_s + 2, f"server clock not set back: skew {skew}s"
    return c, old


@needs_faketime
def test_clock_behind_after_restart_borrows_within_max_drift(make_cluster):
    c, old = _ids_then_restart_behind(make_cluster, max_drift="10s", behind_s=5)
    new = _generate_per_worker(c, 4, 5_000, batch=False)
    assert sorted(new) == sorted(old)
    for w, ids in new.items():
        assert min(ids) > max(old[w]), w
    everything = [i for ids in (*old.values(), *new.values()) for i in ids]
    assert len(set(everything)) == len(everything)
    drift = c.sql("SELECT worker_id, max_drift_ms FROM snowflake_workers "
                  "ORDER BY worker_id")
    assert [r[0] for r in drift] == [0, 1, 2, 3]
    # The IDs ran ahead of the (set back) clock, within the bound.
    assert all(0 < r[1] <= 10_000 for r in drift), drift


@needs_faketime
def test_clock_behind_after_restart_beyond_max_drift_is_refused(make_cluster):
    c, old = _ids_then_restart_behind(make_cluster, max_drift="1s", behind_s=8)
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_nextval()")
        assert e.sqlstate == "55000", str(e)
        m = re.search(r"system clock is (\d+) ms behind", e.diag.message_primary)
        assert m, e.diag.message_primary
        assert 1000 < int(m.group(1)) < 12_000, m.group(0)
        assert "1000 ms" in (e.diag.message_detail or ""), str(e)
        hint = e.diag.message_hint or ""
        assert "clock" in hint and "snowflake_id.max_drift" in hint, hint
        # Same for a batch; and nothing was issued.
        assert sql_error(conn, "SELECT snowflake_nextvals(5)").sqlstate == "55000"
        w = my_worker_id(conn)
        issued = c.scalar("SELECT ids_issued FROM snowflake_workers "
                          "WHERE worker_id = %s", w)
        assert issued == 0, issued

        # The documented remedy: raise the bound and reload.
        c.configure(**{"snowflake_id.max_drift": "10s"})
        c.reload()
        wait_until(lambda: conn.execute(
            "SELECT max_drift_ms FROM snowflake_config()").fetchone()[0] == 10_000,
            what="max_drift reload")
        ids = generate(conn, 1000)
    assert_strictly_increasing(ids)
    assert min(ids) > max(old[w])
    assert not set(ids) & {i for v in old.values() for i in v}


# --------------------------------------------------- 9. pg_dump/pg_restore
def test_dump_and_restore_into_a_new_database(make_cluster):
    c = make_cluster()
    c.create_db("src")
    c.create_extension(dbname="src")
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), v int)",
          dbname="src")
    c.sql("INSERT INTO t (v) SELECT g FROM generate_series(1, 1000) g", dbname="src")
    src_max = c.scalar("SELECT max(id) FROM t", dbname="src")

    dump = os.path.join(c.dir, "src.dump")
    run_client(c, "pg_dump", "-Fc", "-f", dump, "-d", "src")
    c.create_db("dst")
    run_client(c, "pg_restore", "--exit-on-error", "-d", "dst", dump)

    assert c.scalar("SELECT count(*) FROM pg_extension WHERE extname = 'snowflake_id'",
                    dbname="dst") == 1
    n, restored_max = c.sql("SELECT count(*), max(id) FROM t", dbname="dst")[0]
    assert (n, restored_max) == (1000, src_max)
    default = c.scalar("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef "
                       "WHERE adrelid = 't'::regclass", dbname="dst")
    assert "snowflake_nextval()" in default, default
    c.sql("INSERT INTO t (v) SELECT g FROM generate_series(1001, 1100) g", dbname="dst")
    new = [r[0] for r in c.sql("SELECT id FROM t WHERE v > 1000", dbname="dst")]
    assert len(new) == 100 and min(new) > restored_max
    assert c.scalar("SELECT count(DISTINCT id) FROM t", dbname="dst") == 1100


def test_unreadable_state_file_refuses_to_start(make_cluster):
    c = make_cluster(create_extension=True)
    c.scalar("SELECT snowflake_nextval()")
    c.stop()
    state = os.path.join(c.datadir, "snowflake_id.state")
    with open(state, "w") as f:
        f.write("{not json")
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    assert 'snowflake_id state file "snowflake_id.state" is unreadable' in log, log[-2000:]
    assert "Restore the file from a backup" in log, log[-2000:]
    # The documented way out: move the file away (the clock is fine here).
    os.rename(state, state + ".broken")
    c.start()
    assert c.scalar("SELECT snowflake_nextval()") > 0
