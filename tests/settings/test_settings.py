"""The configuration is what the server runs on, and the clock never stops
the server.

* A value PostgreSQL rejects for any ``snowflake_id.*`` setting, and any
  ``snowflake_id.*`` name the library does not define, refuses the start
  with a FATAL naming the setting, the value and what is accepted: PostgreSQL
  itself would only warn and run on the default (another layout, or every
  worker id). Checked for postgresql.conf and for ALTER SYSTEM.
* A clock before the epoch (or a layout whose time field has run out) does
  not stop the server: it starts, decodes, and snowflake_nextval() refuses
  with 55000 naming the reason.
"""

from __future__ import annotations

import glob
import os

import psycopg
import pytest

from harness import PG_MAJOR, ClusterError

# (setting, bad value, a fragment of what is accepted, in the log)
BAD_VALUES = [
    ("snowflake_id.layout", "js-53", "classic, sonyflake, js53 or pgedge"),
    ("snowflake_id.layout", "", "classic, sonyflake, js53 or pgedge"),
    ("snowflake_id.epoch", "yesterday", "UTC date"),
    ("snowflake_id.time_unit_ms", "abc", "1 to 86400000"),
    ("snowflake_id.time_unit_ms", "0", "at least 1"),
    ("snowflake_id.total_bits", "64", "2 to 63"),
    ("snowflake_id.worker_bits", "17", "0 to 16"),
    ("snowflake_id.worker_bits", "ten", "0 to 16"),
    ("snowflake_id.sequence_bits", "0", "at least 1"),
    ("snowflake_id.sequence_bits", "1.5e9", "1 to "),
    ("snowflake_id.worker_ids", "0-3x", "0-511"),
    ("snowflake_id.worker_ids", "0-5000", "0-511"),
    ("snowflake_id.max_drift", "2h", "0 to 3600000"),
    ("snowflake_id.max_drift", "soon", "0 to 3600000"),
    ("snowflake_id.standby_clock_skew", "2h", "0 to 3600000"),
    ("snowflake_id.standby_clock_skew", "-1", "0 to 3600000"),
]
# snowflake_id.registry_database accepts any name; a missing database is
# the registry worker's business (tests/fleet/test_registry.py).


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _refused(c, name: str, value: str, accepted: str) -> None:
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    assert not c.is_running()
    log = c.log(since=mark)
    fatal = [l for l in log.splitlines() if "FATAL:" in l]
    assert fatal, (name, value, log)
    # The FATAL and its DETAIL name the setting, the value and what is
    # accepted (the worker_ids and layout check hooks word it their way).
    report = log[log.index(fatal[0]):]
    assert name in report and f'"{value}"' in report, (name, value, report)
    assert accepted in report, (name, value, accepted, report)


def _alter_system(c, name: str, value: str | None) -> None:
    """ALTER SYSTEM SET name = value (RESET when value is None) on a server
    that does not load the library. PostgreSQL 15 and 16 refuse names they
    do not know there (42704) where 18 takes them as placeholders; there, the
    same line is written into postgresql.auto.conf, as ALTER SYSTEM would."""
    stmt = (f"ALTER SYSTEM RESET {name}" if value is None
            else f"ALTER SYSTEM SET {name} = " + _literal(value))
    try:
        c.sql(stmt)
        return
    except psycopg.errors.UndefinedObject:
        assert PG_MAJOR < 18, f"{stmt} refused on PostgreSQL {PG_MAJOR}"
    path = os.path.join(c.datadir, "postgresql.auto.conf")
    with open(path) as f:
        lines = [ln for ln in f if not ln.startswith(f"{name} =")]
    if value is not None:
        lines.append(f"{name} = {_literal(value)}\n")
    with open(path, "w") as f:
        f.writelines(lines)


@pytest.mark.parametrize("how", ["postgresql.conf", "ALTER SYSTEM"])
def test_invalid_values_refuse_to_start(make_cluster, how):
    c = make_cluster(preload=how == "postgresql.conf", start=False)
    for name, value, accepted in BAD_VALUES:
        if how == "postgresql.conf":
            c.configure(**{name: value})
        else:
            # Not preloaded, the names are placeholders and ALTER SYSTEM
            # takes any value: the mistake surfaces at the next start.
            c.preload = False
            c.configure()
            c.start()
            _alter_system(c, name, value)
            c.stop()
            c.preload = True
            c.configure()
        _refused(c, name, value, accepted)
        if how == "postgresql.conf":
            c.settings.pop(name)
            c.configure()
        else:
            c.preload = False
            c.configure()
            c.start()
            _alter_system(c, name, None)
            c.stop()
            c.preload = True
            c.configure()
    # Fixed, the same cluster starts and makes IDs.
    c.start()
    c.create_extension()
    assert c.scalar("SELECT snowflake_nextval()") > 0


@pytest.mark.parametrize("how", ["postgresql.conf", "ALTER SYSTEM"])
def test_unknown_names_refuse_to_start(make_cluster, how):
    c = make_cluster(preload=how == "postgresql.conf", start=False)
    if how == "postgresql.conf":
        c.configure(**{"snowflake_id.worker_id": "0-3"})
    else:
        c.start()
        _alter_system(c, "snowflake_id.worker_id", "0-3")
        c.stop()
        c.preload = True
        c.configure()
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    line = next(l for l in log.splitlines() if "FATAL:" in l)
    assert 'unrecognized configuration parameter "snowflake_id.worker_id"' in line, log
    # The hint lists the names that exist.
    assert "snowflake_id.worker_ids" in log.split("HINT:", 1)[1], log
    where = "postgresql.auto.conf" if how == "ALTER SYSTEM" else "harness.conf"
    assert where in log, log


def test_valid_values_with_units_and_case_start(make_cluster):
    c = make_cluster(settings={"snowflake_id.layout": "JS53",
                               "snowflake_id.max_drift": "2s",
                               "snowflake_id.worker_ids": "0-3"},
                     create_extension=True)
    assert c.scalar("SELECT preset FROM snowflake_layout()") == "js53"
    assert c.scalar("SELECT max_drift_ms FROM snowflake_config()") == 2000
    assert c.scalar("SELECT worker_ids FROM snowflake_config()") == "0-3"


def test_standby_clock_skew_is_a_reloadable_duration(make_cluster):
    """snowflake_id.standby_clock_skew: 1 s by default, a duration in ms,
    changed by a reload (not by a session), an invalid reload ignored."""
    c = make_cluster(create_extension=True)
    row = c.sql("SELECT setting, unit, boot_val, min_val, max_val, context "
                "FROM pg_settings WHERE name = 'snowflake_id.standby_clock_skew'")
    assert row == [("1000", "ms", "1000", "0", "3600000", "sighup")], row
    with pytest.raises(psycopg.errors.CantChangeRuntimeParam):
        c.sql("SET snowflake_id.standby_clock_skew = '5s'")
    c.configure(**{"snowflake_id.standby_clock_skew": "250ms"})
    c.reload()
    assert c.scalar("SHOW snowflake_id.standby_clock_skew") == "250ms"
    c.configure(**{"snowflake_id.standby_clock_skew": "2h"})
    mark = c.log_mark()
    c.reload()
    c.wait_for_log(r"snowflake_id\.standby_clock_skew", since=mark)
    assert c.scalar("SHOW snowflake_id.standby_clock_skew") == "250ms"


LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_clock_before_the_epoch_starts_but_makes_no_ids(make_cluster):
    # About 3 years back: before the default epoch (2024-01-01).
    env = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "-1200d",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    c = make_cluster(env=env, create_extension=True)
    assert c.scalar("SELECT now() < '2024-01-01'::timestamptz")
    with c.connect() as conn:
        # The decoders work.
        ts = conn.execute("SELECT snowflake_timestamp(4194304000)").fetchone()[0]
        assert ts.year == 2024
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
        assert ei.value.sqlstate == "55000"
        assert "is in the future" in ei.value.diag.message_primary
        assert ei.value.diag.message_hint
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextvals(3)")
        assert ei.value.sqlstate == "55000"
    # Once the clock is right, the same server makes IDs.
    c.restart(env={})
    assert c.scalar("SELECT snowflake_nextval()") > 0


def test_epoch_in_the_future_starts_but_makes_no_ids(make_cluster):
    c = make_cluster(settings={"snowflake_id.epoch": "2999-01-01"},
                     create_extension=True)
    assert c.scalar("SELECT epoch FROM snowflake_layout()").year == 2999
    with c.connect() as conn:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT snowflake_nextval()")
        assert ei.value.sqlstate == "55000"
        assert "the epoch (2999-01-01" in ei.value.diag.message_primary


def test_every_problem_is_named_at_once(make_cluster):
    """Several bad settings: the start is refused with the first one's
    FATAL, after a WARNING naming the others and where each was set (no
    values: one of them is a connection string with a password). Before
    0.7.0 only the first was named, one start at a time."""
    c = make_cluster(start=False)
    c.configure(**{
        "snowflake_id.max_drift": "soon",
        "snowflake_id.registry": "host=/tmp password=hunter2",
        "snowflake_id.worker_id": "0-3",
    })
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    assert "hunter2" not in log, log
    warning = next(l for l in log.splitlines() if "also refuses" in l)
    assert "snowflake_id.max_drift (file" in warning, log
    assert "snowflake_id.worker_id (file" in warning, log
    assert "harness.conf" in warning, log
    # The first problem in the order of the checks: the registry's password.
    fatal = next(l for l in log.splitlines() if "FATAL:" in l)
    assert "snowflake_id.registry" in fatal and "password" in fatal, log
    assert log.index(warning) < log.index(fatal), log
    # Fixed one by one, each start names what is left, until it starts.
    c.settings.pop("snowflake_id.registry")
    c.configure()
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    fatal = next(l for l in log.splitlines() if "FATAL:" in l)
    assert 'invalid value for parameter "snowflake_id.max_drift"' in fatal, log
    assert "also refuses snowflake_id.worker_id (" in log, log
    c.settings.pop("snowflake_id.max_drift")
    c.settings.pop("snowflake_id.worker_id")
    c.configure()
    c.start()
    c.create_extension()
    assert c.scalar("SELECT snowflake_nextval()") > 0
