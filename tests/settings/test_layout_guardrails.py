"""Layout guardrails: a layout near its end warns and keeps making IDs, one
that ended makes none and says why, and a tick longer than
snowflake_id.max_drift does not stop IDs after a restart within the tick.

Epochs in the past put the classic layout's end (69.7 years after its
epoch) where each case needs it, with the real clock.
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from harness import ClusterError
from helpers import sql_error

UTC = dt.timezone.utc


def _warning_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "layout's time field" in line]


def test_a_layout_ending_within_the_warning_years_warns_and_keeps_making_ids(make_cluster):
    # 1960 + 69.7 years: the time field runs out in 2029, a few years away.
    c = make_cluster(settings={"snowflake_id.epoch": "1960-01-01"}, create_extension=True)
    lines = _warning_lines(c.log())
    assert len(lines) == 1 and "WARNING" in lines[0] and "runs out at 2029-" in lines[0], lines
    assert "HINT:  Plan a new layout" in c.log()
    with c.connect() as conn:
        years, soon, ends = conn.execute(
            "SELECT years_left, ends_soon, ends_at FROM snowflake_layout()").fetchone()
        assert 0 < years < 10 and soon is True
        assert ends.astimezone(UTC).year == 2029
        ids = [r[0] for r in conn.execute(
            "SELECT snowflake_nextval() FROM generate_series(1, 1000)").fetchall()]
        assert len(set(ids)) == 1000 and ids == sorted(ids)
        # The ID decodes to now.
        ts = conn.execute("SELECT snowflake_timestamp(%s)", (ids[-1],)).fetchone()[0]
        assert abs((dt.datetime.now(UTC) - ts).total_seconds()) < 60
    # Warning off: no line at start, ends_soon false; a reload applies it.
    c.stop()
    c.configure(**{"snowflake_id.layout_end_warning": 0})
    mark = c.log_mark()
    c.start()
    assert _warning_lines(c.log(since=mark)) == []
    assert c.scalar("SELECT ends_soon FROM snowflake_layout()") is False
    c.configure(**{"snowflake_id.layout_end_warning": 5})
    c.reload()
    assert c.scalar("SELECT ends_soon FROM snowflake_layout()") is True


def test_a_layout_that_ended_makes_no_ids_and_names_the_end(make_cluster):
    # 1950 + 69.7 years: ran out in 2019.
    c = make_cluster(settings={"snowflake_id.epoch": "1950-01-01"}, create_extension=True)
    lines = _warning_lines(c.log())
    assert len(lines) == 1 and "ran out at 2019-" in lines[0], lines
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_nextval()")
        assert e.sqlstate == "55000", str(e)
        assert "ran out at 2019-" in e.diag.message_primary, e.diag.message_primary
        assert "clock" not in e.diag.message_primary
        assert conn.execute("SELECT years_left < 0 AND ends_soon FROM snowflake_layout()"
                            ).fetchone()[0] is True
        # The decoders still work.
        assert conn.execute("SELECT snowflake_worker_id(4096)").fetchone()[0] == 1


def test_a_tick_longer_than_max_drift_is_refused_at_start(make_cluster):
    """A day per tick and the default max_drift (1 min): in 0.4.0 the server
    started, and after every restart refused IDs until the next day began,
    blaming the clock. Now it refuses to start, naming both settings."""
    c = make_cluster(settings={"snowflake_id.time_unit_ms": "1d"}, start=False)
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    line = next(l for l in log.splitlines() if "shorter than one tick" in l)
    assert "FATAL" in line and "max_drift (60000 ms)" in line and "(86400000 ms)" in line, line
    assert "HINT:  Set snowflake_id.max_drift to 0" in log, log
    # max_drift = 0: it starts (never ahead of the clock: after a restart
    # within the tick it waits for the next one), and says so, naming the
    # tick rather than the clock.
    c.configure(**{"snowflake_id.max_drift": 0})
    c.start()
    c.create_extension()
    assert c.scalar("SHOW snowflake_id.time_unit_ms") == "86400000"
    assert c.scalar("SELECT snowflake_nextval() > 0")
    c.stop()
    c.start()
    with c.connect() as conn:
        e = sql_error(conn, "SELECT snowflake_nextval()")
        assert e.sqlstate == "55000", str(e)
        assert "before the next tick begins" in e.diag.message_primary, str(e)
        assert "clock is" not in e.diag.message_primary
        assert "Wait for the next tick" in (e.diag.message_hint or "")
        # Parallel workers start on the built-in default (60000) before the
        # leader's value: the check hook must not refuse it there.
        conn.execute("CREATE TABLE big AS SELECT g FROM generate_series(1, 1000) g")
        force = conn.execute(  # renamed in PostgreSQL 16
            "SELECT name FROM pg_settings WHERE name IN "
            "('debug_parallel_query', 'force_parallel_mode')").fetchone()[0]
        conn.execute(f"SET {force} = on")
        assert conn.execute("SELECT count(*) FROM big").fetchone()[0] == 1000
        conn.execute(f"RESET {force}")
        # A reload cannot set a drift shorter than the tick either.
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("ALTER SYSTEM SET snowflake_id.max_drift = '1min'")
        assert "at least one tick of the layout (86400000 ms)" in str(ei.value.diag.message_detail)


def test_a_restart_within_a_tick_as_long_as_max_drift_goes_on_at_once(make_cluster):
    """A minute per tick and max_drift 1 min: after a restart within the
    tick, the first IDs take the next tick at once (one tick of lead)."""
    c = make_cluster(settings={"snowflake_id.time_unit_ms": "1min",
                               "snowflake_id.max_drift": "1min"}, create_extension=True)
    with c.connect() as conn:
        before = [r[0] for r in conn.execute(
            "SELECT snowflake_nextval() FROM generate_series(1, 10)").fetchall()]
    c.stop(mode="immediate")
    c.start()
    with c.connect() as conn:
        after = [r[0] for r in conn.execute(
            "SELECT snowflake_nextval() FROM generate_series(1, 10)").fetchall()]
        assert min(after) > max(before), (before, after)
        lead = conn.execute("SELECT extract(epoch FROM snowflake_timestamp(%s) - now())",
                            (after[-1],)).fetchone()[0]
        assert lead <= 60, lead

