"""One server-wide clock rule (issue 10, defect 12) and errors that say what
actually happened (defect 4).

The server runs under libfaketime with its offset in a file the test
rewrites (``FAKETIME_TIMESTAMP_FILE`` + ``FAKETIME_NO_CACHE=1``); offsets
are seconds, e.g. ``-10`` or ``+0``. ``FAKETIME_DONT_FAKE_MONOTONIC=1``
keeps PostgreSQL's timeouts and latch waits on the real monotonic clock."""

from __future__ import annotations

import glob
import json
import os
import time

import psycopg
import pytest

from conftest import AS_ROOT, _pg_ids, wait_until

LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
pytestmark = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")

EPOCH_MS = 1_704_067_200_000  # classic: 2024-01-01T00:00:00Z


def ms_of(i: int) -> int:
    """Unix ms of a classic-layout ID."""
    return (i >> 22) + EPOCH_MS


class OffsetFile:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, "faketime.rc")
        self.set("+0")

    def env(self) -> dict:
        return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": self.path,
                "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_RESET": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, seconds) -> None:
        spec = seconds if isinstance(seconds, str) else f"{seconds:+.3f}"
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(spec + "\n")
        os.chmod(tmp, 0o644)
        if AS_ROOT:
            os.chown(tmp, *_pg_ids())
        os.rename(tmp, self.path)


def server_skew(conn) -> float:
    t0 = time.time()
    srv = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    return srv - (t0 + time.time()) / 2


def faked(make_cluster, **settings):
    c = make_cluster(start=False, settings=settings or None)
    clock = OffsetFile(c.dir)
    c.start(env=clock.env())
    c.create_extension()
    return c, clock


def batch(conn, n: int = 200) -> list[int]:
    return [r[0] for r in conn.execute(
        "INSERT INTO t SELECT FROM generate_series(1, %s) RETURNING id", (n,))]


# ----------------------------------------------------------- defect 12
def test_clock_step_back_of_10s_keeps_every_session_inserting(make_cluster):
    """Default settings. The clock steps back 10 s: sessions that already
    hold a worker id and sessions that claim one afterwards all keep
    inserting with no error, and no new ID is stamped below the newest ID
    time the server had issued before the step."""
    c, clock = faked(make_cluster)
    c.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_nextval())")
    old = [c.connect() for _ in range(3)]
    try:
        before = [i for conn in old for i in batch(conn)]
        newest_before = max(ms_of(i) for i in before)
        clock.set(-10)
        wait_until(lambda: server_skew(old[0]) < -9, what="the clock to step back")
        after = []
        for _ in range(5):
            for conn in old:
                after += batch(conn)
        with c.connect() as fresh1, c.connect() as fresh2:
            after += batch(fresh1) + batch(fresh2) + batch(fresh1)
        stamped = sorted(ms_of(i) for i in after)
        assert stamped[0] >= newest_before, (
            f"an ID stamped {newest_before - stamped[0]} ms below the server's "
            "newest ID time before the step")
        assert len(set(before + after)) == len(before) + len(after)
        assert c.scalar("SELECT count(*) FROM t") == len(before) + len(after)
    finally:
        for conn in old:
            conn.close()


# ------------------------------------------------------------ defect 4
def test_fresh_claim_waits_for_the_clock_to_pass_the_floor(make_cluster):
    """max_drift = 0 and a reservation floor just ahead of the clock (as
    after a crash: the state file reserves 250 ms beyond the last ID). A
    claim that has issued nothing waits for the clock to pass the floor
    instead of reporting a clock error, and its first ID is above it."""
    c, clock = faked(make_cluster, **{"snowflake_id.max_drift": "0"})
    earlier = c.scalar("SELECT snowflake_nextval()")
    c.stop()
    path = os.path.join(c.datadir, "snowflake_id.state")
    with open(path) as f:
        state = json.load(f)
    floor_ms = int(time.time() * 1000)
    state["reserved_until_ms"] = floor_ms
    with open(path, "w") as f:
        json.dump(state, f)
    c.start()
    with c.connect() as conn:
        # Put the server's clock 800 ms before the floor (less than the 1 s
        # a fresh claim waits), and check it is still well behind it.
        clock.set((floor_ms - 800) / 1000 - time.time())
        server_ms = time.time() * 1000 + server_skew(conn) * 1000
        assert server_ms - floor_ms < -200, server_ms - floor_ms
        started = time.monotonic()
        first = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
        waited = time.monotonic() - started
    assert ms_of(first) > floor_ms, (ms_of(first), floor_ms)
    assert first > earlier
    assert 0.05 < waited < 3, waited


def test_lowering_max_drift_names_borrowed_ticks_not_the_clock(make_cluster):
    """IDs ran about 3 s ahead of a correct clock by borrowing ticks
    (sonyflake: 256 IDs per 10 ms, so 100,000 IDs need 3.9 s of ticks);
    then max_drift is lowered to 0. The error says the IDs ran ahead by
    borrowing, not that the clock is behind."""
    c, clock = faked(make_cluster, **{"snowflake_id.layout": "sonyflake",
                                      "snowflake_id.max_drift": "3s"})
    with c.connect() as conn:
        conn.execute("SELECT count(*) FROM snowflake_nextvals(100000)")
        drift = c.scalar("SELECT current_drift_ms FROM snowflake_workers "
                         "WHERE pid IS NOT NULL")
        assert drift > 1500, drift
        conn.execute("ALTER SYSTEM SET snowflake_id.max_drift = 0")
        conn.execute("SELECT pg_reload_conf()")
        wait_until(lambda: conn.execute("SHOW snowflake_id.max_drift").fetchone()[0] == "0",
                   what="reload")
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
    e = ei.value
    assert e.sqlstate == "55000", str(e)
    msg = e.diag.message_primary
    assert "ahead of the system clock" in msg and "max_drift" in msg, msg
    assert "borrowing ticks" in (e.diag.message_detail or ""), e.diag.message_detail
    assert "NTP" not in (e.diag.message_hint or ""), e.diag.message_hint
