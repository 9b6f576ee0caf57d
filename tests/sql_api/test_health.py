"""snowflake_health(): one row per check on real servers (the decisions
are snowflake_core::health's, tested there), who may call it and see the
lease problem, the WARNING at start when the registry database has no
extension, and Debian's prometheus-postgres-exporter scraping it with the
queries file of docs/operations/postgres_exporter.yaml."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request

import psycopg
import pytest

from harness import free_port, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUERIES = os.path.join(REPO, "docs", "operations", "postgres_exporter.yaml")
EXPORTER = "prometheus-postgres-exporter"
CHECKS = ["layout_years_left", "lease_deadline_margin", "lease_problem",
          "registry_unreachable", "worker_ids_in_use", "reservation_ahead",
          "backfill_space", "registry_table"]


def health(c, dbname: str = "postgres", user: str = "postgres") -> dict:
    with c.connect(dbname=dbname, user=user) as conn:
        rows = conn.execute(
            "SELECT name, status, value, threshold, action FROM snowflake_health()").fetchall()
    return {r[0]: r[1:] for r in rows}


def unreachable_registry() -> str:
    """A registry address on loopback where nothing listens."""
    return f"host=127.0.0.1 port={free_port()} dbname=postgres user=postgres connect_timeout=2"


def test_a_healthy_server_is_ok_on_every_check(cluster):
    wait_until(lambda: health(cluster)["registry_table"][0] == "ok", timeout=30,
               what="the registry worker's first pass")
    h = health(cluster)
    assert list(h) == CHECKS
    for name, (status, value, threshold, action) in h.items():
        assert status == "ok", (name, status, value)
        assert value and threshold and action, name
    assert h["lease_deadline_margin"][1] == "no leases"
    assert h["worker_ids_in_use"][1].startswith("0 of "), h["worker_ids_in_use"]
    with cluster.connect() as conn:
        conn.execute("SELECT snowflake_nextval()")
        assert health(cluster)["worker_ids_in_use"][1].startswith("1 of ")


def test_the_extension_missing_in_the_registry_database_is_a_warning_and_critical(make_cluster):
    """The registry table keeps IDs above old ones across pg_upgrade and a
    restore; without the extension in snowflake_id.registry_database the
    server says so at start with a WARNING (a LOG line before 0.8.0) and
    snowflake_health() reports it critical until CREATE EXTENSION there."""
    c = make_cluster()
    c.wait_for_log(r"WARNING:  snowflake_id registry: database \"postgres\" has no "
                   r"snowflake_id extension", timeout=30)
    assert "HINT:  Run CREATE EXTENSION snowflake_id in database \"postgres\"" in c.log()
    c.create_db("app")
    c.create_extension("app")
    status, value, _, action = health(c, dbname="app")["registry_table"]
    assert (status, value) == ("critical", "extension missing")
    assert "CREATE EXTENSION snowflake_id" in action
    c.create_extension("postgres")
    wait_until(lambda: health(c, dbname="app")["registry_table"][0] == "ok", timeout=30,
               what="registry_table ok once the extension is there")


def test_registry_database_off_is_a_warning(make_cluster):
    c = make_cluster(settings={"snowflake_id.registry_database": ""}, create_extension=True)
    assert health(c)["registry_table"][:2] == (
        "warn", "off (snowflake_id.registry_database is empty)")


def test_a_holder_without_its_registry_is_critical_and_hides_the_address(make_cluster):
    c = make_cluster(settings={"snowflake_id.registry": unreachable_registry(),
                               "snowflake_id.lease_time": "6s"},
                     create_extension=True)
    wait_until(lambda: health(c)["registry_unreachable"][0] != "ok", timeout=30,
               what="the unreachable registry noticed")
    h = health(c)
    assert h["lease_deadline_margin"][:2] == ("critical", "no block held")
    # A holder's capacity: snowflake_id.max_blocks (8) blocks of 16 ids.
    assert h["worker_ids_in_use"][:2] == ("ok", "0 of 128")
    wait_until(lambda: health(c)["lease_problem"][0] == "critical", timeout=30,
               what="the lease problem reported")
    assert "127.0.0.1" in health(c)["lease_problem"][1]
    # Privileges: pg_monitor members call it and, holding
    # pg_read_all_settings through it, see the problem; a role that was
    # only granted EXECUTE sees that there is one, not the registry's address.
    c.sql("CREATE ROLE plain LOGIN")
    c.sql("CREATE ROLE monitor LOGIN IN ROLE pg_monitor")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        health(c, user="plain")
    assert "127.0.0.1" in health(c, user="monitor")["lease_problem"][1]
    c.sql("GRANT EXECUTE ON FUNCTION snowflake_health() TO plain")
    status, value, _, _ = health(c, user="plain")["lease_problem"]
    assert status == "critical"
    assert "127.0.0.1" not in value and "hidden" in value, value
    wait_until(lambda: health(c)["registry_unreachable"][0] == "critical", timeout=30,
               what="unreachable for half the lease time")


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for m in re.finditer(r'^snowflake_health_status\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        found[labels["check"]] = float(m.group(2))
    return found


def run_exporter(c, dbname: str):
    exe = shutil.which(EXPORTER)
    if exe is None:
        pytest.fail(f"{EXPORTER} is not installed (scripts/lib.sh DEB_PACKAGES)")
    port = free_port()
    env = {**os.environ,
           "DATA_SOURCE_NAME": f"postgresql://monitor@127.0.0.1:{c.port}/{dbname}?sslmode=disable"}
    proc = subprocess.Popen(
        [exe, f"--web.listen-address=127.0.0.1:{port}", f"--extend.query-path={QUERIES}",
         "--disable-default-metrics", "--disable-settings-metrics"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


@pytest.mark.parametrize("registry", ["none", "unreachable"])
def test_prometheus_postgres_exporter_scrapes_the_checks(make_cluster, registry):
    """Debian's exporter with the documented queries file, over loopback
    as a pg_monitor member: one gauge per check, all 0 on a healthy
    server; on a holder whose registry is unreachable the lease deadline
    margin turns 2 (critical)."""
    settings = {} if registry == "none" else {
        "snowflake_id.registry": unreachable_registry(), "snowflake_id.lease_time": "6s"}
    c = make_cluster(settings=settings, tcp=True, create_extension=True)
    c.sql("CREATE ROLE monitor LOGIN IN ROLE pg_monitor")
    proc, port = run_exporter(c, "postgres")
    try:
        def complete():
            try:
                complete.found = scrape(port)
            except OSError:
                return False
            return set(complete.found) == set(CHECKS)
        wait_until(complete, timeout=60, what="every check scraped")
        if registry == "none":
            wait_until(lambda: scrape(port) == dict.fromkeys(CHECKS, 0.0), timeout=30,
                       what="every check 0 (ok)")
        else:
            assert complete.found["lease_deadline_margin"] == 2.0, complete.found
            wait_until(lambda: scrape(port)["lease_problem"] == 2.0, timeout=30,
                       what="lease_problem 2 (critical)")
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
