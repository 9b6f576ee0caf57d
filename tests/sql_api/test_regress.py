"""The pg_regress suite in tests/regress (bad input and edge cases of every
public function, the snowflake_workers view and every setting), run against
a real preloaded server started by the harness, plus the known-bug checks
that the suite's expected files must not record.

Layout of tests/regress (the pg_regress convention):
  schedule           the tests, in order
  sql/<name>.sql     readable SQL, echoed into the output
  expected/<name>.out the expected output, reviewed line by line
  expected/<name>_1.out  pg_regress's alternative for the same test, where
                     PostgreSQL versions word an error differently (gucs_1:
                     PostgreSQL 18 shows units in a range error, and reports
                     a name under a reserved prefix as 42602)

To regenerate the expected files after a deliberate change, run with
SNOWFLAKE_REGRESS_UPDATE=1, then read every changed line of the new files
before committing them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import psycopg
import pytest

from harness import PG_BINDIR, Cluster, pg_config

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESS_DIR = os.path.join(os.path.dirname(HERE), "regress")
SCHEDULE = os.path.join(REGRESS_DIR, "schedule")
PG_REGRESS = os.path.join(pg_config("--pkglibdir"),
                          "pgxs/src/test/regress/pg_regress")
DBNAME = "snowflake_regress"
# Files that need a contrib extension, which not every PostgreSQL
# installation ships (the PostgreSQL 16 wheel has none): they run in a
# pg_regress run of their own, between setup and sanity, skipped with the
# reason where the extension is missing.
NEEDS = {"gucs": "dblink"}


def scheduled_tests() -> list[str]:
    names = []
    with open(SCHEDULE) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("test:"):
                names.extend(line[len("test:"):].split())
    return names


@pytest.fixture(scope="module")
def server(request):
    """One preloaded server for the suite and the bug checks."""
    failed_before = request.session.testsfailed
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        keep = request.session.testsfailed > failed_before
        if keep:
            print(f"\nkept {c.dir}", flush=True)
        c.destroy(keep=keep)


def test_schedule_lists_every_sql_file():
    names = scheduled_tests()
    files = sorted(f[:-4] for f in os.listdir(os.path.join(REGRESS_DIR, "sql"))
                   if f.endswith(".sql"))
    assert sorted(names) == files
    assert names[0] == "setup" and names[-1] == "sanity"
    for n in names:
        assert os.path.exists(os.path.join(REGRESS_DIR, "expected", f"{n}.out")), n


@pytest.mark.timeout(300)
@pytest.mark.parametrize("needs", [None, "dblink"])
def test_pg_regress_suite(server, tmp_path, needs):
    if needs and not server.scalar(
            "SELECT count(*) FROM pg_available_extensions WHERE name = %s", needs):
        pytest.skip(f"{', '.join(n for n, e in NEEDS.items() if e == needs)}.sql needs "
                    f"{needs}, which this PostgreSQL installation does not ship")
    names = [n for n in scheduled_tests()
             if n in ("setup", "sanity") or NEEDS.get(n) == needs]
    schedule = tmp_path / "schedule"
    schedule.write_text("".join(f"test: {n}\n" for n in names))
    dbname = f"{DBNAME}_{needs or 'core'}"
    server.create_db(dbname)
    outdir = tmp_path / "out"
    outdir.mkdir()
    cmd = [PG_REGRESS, "--use-existing", f"--bindir={PG_BINDIR}",
           f"--host={server.dir}", f"--port={server.port}", "--user=postgres",
           f"--inputdir={REGRESS_DIR}", f"--outputdir={outdir}",
           f"--dbname={dbname}", f"--schedule={schedule}"]
    proc = subprocess.run(cmd, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=240)
    if os.environ.get("SNOWFLAKE_REGRESS_UPDATE") == "1":
        for name in names:
            src = outdir / "results" / f"{name}.out"
            if src.exists():
                shutil.copy(src, os.path.join(REGRESS_DIR, "expected", f"{name}.out"))
    if proc.returncode != 0:
        diffs = outdir / "regression.diffs"
        text = diffs.read_text() if diffs.exists() else "(no regression.diffs)"
        pytest.fail(f"pg_regress failed (exit {proc.returncode}):\n{proc.stdout}\n"
                    f"{proc.stderr}\n--- regression.diffs ---\n{text}", pytrace=False)
    # The server survived the bad input, and logged nothing worse than the
    # ERRORs the suite provoked.
    assert server.scalar("SELECT 1") == 1
    bad = [ln for ln in server.log().splitlines() if "FATAL:" in ln or "PANIC:" in ln]
    assert bad == [], bad[:5]


def error_of(server, query, *args) -> psycopg.Error:
    with server.connect() as conn:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute(query, args or None)
    return ei.value


# ------------------------------------------------- messages and validation
# Checks of messages, hints and ALTER SYSTEM validation that were bugs once
# (the expected files show only the SQLSTATE for these statements).


@pytest.mark.parametrize("worker, sequence, field, value", [
    (-1, 0, "worker id", "-1"),
    (0, -1, "sequence", "-1"),
    (-2147483648, 0, "worker id", "-2147483648"),
])
def test_compose_negative_part_message_names_the_value(server, worker, sequence,
                                                        field, value):
    server.sql("CREATE EXTENSION IF NOT EXISTS snowflake_id")
    e = error_of(server, "SELECT snowflake_compose('2026-01-01 00:00:00+00', %s, %s)",
                 worker, sequence)
    assert e.sqlstate == "22003"
    msg = e.diag.message_primary
    assert "4294967295" not in msg, msg
    assert f"{field} {value} " in msg, msg


@pytest.mark.parametrize("func", ["snowflake_from_timestamp(%s)",
                                  "snowflake_compose(%s, 0, 0)"])
@pytest.mark.parametrize("ts", ["infinity", "-infinity"])
def test_infinite_timestamp_message(server, func, ts):
    server.sql("CREATE EXTENSION IF NOT EXISTS snowflake_id")
    e = error_of(server, f"SELECT {func % '%s::timestamptz'}", ts)
    assert e.sqlstate == "22008"
    msg = e.diag.message_primary
    assert "292278994" not in msg and "292275055" not in msg, msg
    assert f"timestamp {ts} " in msg or f"timestamp '{ts}' " in msg, msg


@pytest.mark.parametrize("setting, value", [
    ("time_unit_ms", "0"),
    ("sequence_bits", "0"),
    ("total_bits", "0"),
    ("epoch", "'garbage'"),
    ("epoch", "'2024-13-45'"),
])
def test_alter_system_rejects_invalid_layout_values(server, setting, value):
    name = f"snowflake_id.{setting}"
    try:
        e = error_of(server, f"ALTER SYSTEM SET {name} = {value}")
        assert e.sqlstate == "22023", (e.sqlstate, str(e))
    finally:
        # Never leave a value that would stop the server from starting.
        server.sql(f"ALTER SYSTEM RESET {name}")


@pytest.mark.parametrize("n", [0, -1, -2147483648])
def test_batch_size_below_one_hint(server, n):
    server.sql("CREATE EXTENSION IF NOT EXISTS snowflake_id")
    e = error_of(server, "SELECT count(*) FROM snowflake_nextvals(%s)", n)
    assert e.sqlstate == "22023"
    assert e.diag.message_primary == f"snowflake_nextvals() batch size {n} is out of range"
    hint = e.diag.message_hint or ""
    assert "fewer" not in hint, hint
