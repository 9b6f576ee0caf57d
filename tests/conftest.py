"""pytest fixtures and hooks for the snowflake_id integration tests.

Each test gets throwaway PostgreSQL clusters built from the PostgreSQL of
PG_CONFIG (default /usr/lib/postgresql/15/bin/pg_config) and the snowflake_id
build installed into it (`cargo pgrx install`). The cluster harness itself,
shared with bench/bench.py, is tests/harness.py: tests import its names
(``Cluster``, ``wait_until``, ``ClusterError``, ``PG_BINDIR``...) from
``harness``, and the helpers several test folders share from ``helpers``
(tests/helpers.py). This directory is on sys.path (pytest's default
``prepend`` import mode puts the directory of this conftest.py there), so
``import harness`` and ``import helpers`` work from every test folder.

* ``cluster``       fixture: a started cluster with the library preloaded
                    and ``CREATE EXTENSION snowflake_id`` done in db postgres.
* ``make_cluster``  fixture: factory ``make_cluster(**kw)`` for special
                    configurations (preload=False, extra settings, env...,
                    or ``basebackup_from=primary`` for a physical standby).

Clusters are always stopped at the end of their test (fixture finalizer, with
an atexit ``-m immediate`` fallback). Their directory is removed when the test
passed and kept (path printed, log tail shown) when it failed.

Tests marked ``@pytest.mark.slow`` are skipped unless SNOWFLAKE_SLOW=1.

SNOWFLAKE_TESTS chooses the tests: ``all`` (the default), ``core`` (the
modules of CORE_MODULES: what depends on the PostgreSQL version, and the
basic guarantees), ``core+grants`` (the core subset, the registry's
limits and the grants durable on its standbys) or
``all-but-grants`` (every module but test_registry_limits and
test_durable_grants, which the 18 pass runs); the others are skipped, saying so. Tests marked
``@pytest.mark.not_core`` are left out of the core subsets: tests of a core
module whose code does not depend on the version (``all`` runs them). scripts/test.sh sets it per version
(tests_for_version in scripts/lib.sh), so that a run over every supported
version stays under 45 minutes on two cores (CONTRIBUTING.md, "What is
tested where").

Tests marked ``@pytest.mark.serial`` change the installation itself (the
package test installs and removes the Debian package): scripts/test.sh runs
them after the others of their version (``-m serial``); 15's, which install
into Debian's own PostgreSQL 15, alone, after every other test.

The tests are grouped by component, one folder each: claims/, clocks/,
durability/, fleet/, settings/, sql_api/, upgrade/, clients/, docs/ (and
test_harness.py, next to the harness it tests). Module names are unique
across the folders: CORE_MODULES and SPREAD_MODULES name modules.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from harness import EXTENSION_SO, PG_CONFIG, PG_MAJOR, Cluster, kept_dirs, stop_orphans


# The core subset: what depends on the PostgreSQL version (shared memory and
# its hooks, the custom WAL resource manager, background workers, settings,
# the SQL objects, pg_upgrade, the package) and the basic guarantees. The
# modules left out exercise the same code paths under more scenarios
# (clients, poolers, clocks, fleets, sharing, soak), and run in full on the
# other versions. Keyed by module name (the file's name without .py, unique
# across the folders).
CORE_MODULES = frozenset({
    # the harness's self-tests, next to tests/harness.py
    "test_harness",
    # sql_api/
    "test_sql_api",
    "test_regress",
    "test_backfill",
    # uuid_extract_timestamp() of the UUID guide exists from 17 on
    "test_from_uuid",
    # settings/
    "test_errors",
    "test_settings",
    "test_privileges",
    "test_secrets",
    # durability/
    "test_restarts",
    "test_reservation",
    # fleet/: the worker registry table and its worker, and the lease
    # worker's connection to its registry (libpq, loaded at run time).
    "test_registry",
    "test_registry_client",
    # upgrade/
    "test_extension_upgrade",
    "test_pg_upgrade",
    "test_package",
    "test_meta",
})

# What each SNOWFLAKE_TESTS selection runs: whether a module is in it. The
# fleet's tests exercise the registry's SQL and the lease worker, the same
# code on every version; the parts of them that depend on the version
# (background workers, shared memory, WAL) are in the core subset.
# scripts/test.sh runs each fleet module on 15 or 18 or both (the time
# budget: CONTRIBUTING.md, "What is tested where").
GRANTS_MODULES = frozenset({"test_registry_limits", "test_durable_grants"})
SELECTIONS = {
    "all": lambda module: True,
    "core": CORE_MODULES.__contains__,
    "core+grants": (CORE_MODULES | GRANTS_MODULES).__contains__,
    # 15 leaves to 18 what 18 runs anyway and no version changes (the time
    # budget).
    "all-but-grants": lambda module: module not in GRANTS_MODULES,
}


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # SIGTERM (e.g. a CI timeout) -> KeyboardInterrupt, so that fixture
    # finalizers / atexit still stop the clusters.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def pytest_sessionstart(session):
    stop_orphans()


# scripts/test.sh runs pytest on three workers (pytest-xdist, --dist
# loadgroup): most tests wait on servers rather than use a core. A module runs
# whole on one worker (its module-scoped fixtures install clients, build
# packages, start shared servers), except these, whose tests are independent
# and long, spread one by one.
SPREAD_MODULES = frozenset({
    "test_fencing", "test_citus", "test_leases", "test_several_servers",  # fleet/
    "test_durable_grants",  # fleet/
    "test_restarts", "test_standbys",  # durability/
    "test_registry_client", "test_registry_limits", "test_patroni",  # fleet/
    "test_adversarial_backfill_fleet",  # fleet/
    "test_clocks",  # clocks/
    "test_public_ids", "test_backfill",  # sql_api/
})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup schedules by module as SPREAD_MODULES says.

    pytest-xdist's loadgroup puts a test's xdist_group into its node id,
    which pytest 9 no longer lets a plugin change (xdist 3.8 sets
    ``item._nodeid``, which pytest 9 ignores): the groups are lost and a
    module's tests land on both workers (then a module-scoped server is made
    twice and tests that build on an earlier test's rows fail). This
    scheduler makes the same groups from the node ids themselves."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            module = os.path.splitext(os.path.basename(path))[0]
            return nodeid if module in SPREAD_MODULES else path

    return ModuleScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    selection = os.environ.get("SNOWFLAKE_TESTS", "all")
    if selection not in SELECTIONS:
        raise pytest.UsageError(f"SNOWFLAKE_TESTS={selection!r}: use one of "
                                + ", ".join(SELECTIONS))
    selected = SELECTIONS[selection]
    not_selected = pytest.mark.skip(
        reason=f"PostgreSQL {PG_MAJOR} runs the {selection} subset (SELECTIONS in "
               "tests/conftest.py, SNOWFLAKE_TESTS; CONTRIBUTING.md, \"What is tested "
               "where\"); SNOWFLAKE_TESTS=all runs it here")
    slow = pytest.mark.skip(reason="slow test: set SNOWFLAKE_SLOW=1 to run")
    for item in items:
        if not selected(item.module.__name__) or (
                selection.startswith("core") and "not_core" in item.keywords):
            item.add_marker(not_selected)
        elif "slow" in item.keywords and os.environ.get("SNOWFLAKE_SLOW") != "1":
            item.add_marker(slow)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def pytest_terminal_summary(terminalreporter):
    if kept_dirs:
        terminalreporter.write_line(
            "cluster dirs kept for failed tests: " + " ".join(kept_dirs))


def _test_failed(node) -> bool:
    """True if setup or the test itself failed, or the test never finished
    (interrupted): then its clusters' dirs are kept for inspection."""
    call = getattr(node, "rep_call", None)
    return call is None or call.failed


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def citus_installed():
    """Fails a Citus test (helpers.CITUS_MARKS) when Citus is not installed:
    scripts/lib.sh ensure_deps builds it before any test starts."""
    from helpers import CITUS_SO
    if not os.path.exists(CITUS_SO):
        pytest.fail(f"Citus is not installed for {PG_CONFIG}: scripts/lib.sh ensure_deps "
                    "builds it before the tests (from ../shared/citus)", pytrace=False)


@pytest.fixture
def make_cluster(request):
    """Factory: make_cluster(preload=True, settings=None, tcp=False,
    start=True, env=None, create_extension=False, basebackup_from=None)
    -> Cluster.

    All clusters made are stopped at the end of the test; their dirs are
    removed if the test passed, kept (and the log tail printed) if not."""
    made: list[Cluster] = []

    def factory(preload: bool = True, settings: dict | None = None,
                tcp: bool = False, start: bool = True, env: dict | None = None,
                create_extension: bool = False,
                basebackup_from: Cluster | None = None,
                bindir: str | None = None, initdb_args: tuple = ()) -> Cluster:
        if (preload or create_extension) and not os.path.exists(EXTENSION_SO):
            pytest.fail(f"{EXTENSION_SO} not found: install the extension "
                        "first (cargo pgrx install --release --pg-config "
                        f"{PG_CONFIG})")
        c = Cluster(preload=preload, settings=settings, tcp=tcp,
                    basebackup_from=basebackup_from, bindir=bindir,
                    initdb_args=initdb_args)
        made.append(c)
        if start:
            c.start(env=env)
            if create_extension:
                c.create_extension()
        return c

    yield factory

    failed = _test_failed(request.node)
    errors = []
    for c in made:
        if failed:
            tail = "\n".join(c.log().splitlines()[-60:])
            print(f"\n--- {c.dir}/server.log (tail) ---\n{tail}",
                  file=sys.stderr)
        try:
            c.destroy(keep=failed)
        except Exception as e:  # noqa: BLE001 - report after all are stopped
            errors.append(e)
    if failed:
        print("kept cluster dirs: " + " ".join(c.dir for c in made),
              file=sys.stderr)
    if errors:
        raise errors[0]


@pytest.fixture
def cluster(make_cluster) -> Cluster:
    """A started cluster, snowflake_id preloaded, extension created in db
    postgres."""
    return make_cluster(create_extension=True)
