"""pgjdbc 42.5 (Debian's libpostgresql-jdbc-java) on JDK 17 against a real
server over TCP: a small Java program (tests/clients/java/, compiled with
javac per run) inserts rows keyed by the column default snowflake_nextval()
and reads the keys back with RETURNING, getGeneratedKeys() and a rewritten
batch, and prefetches IDs in blocks with snowflake_nextvals(1000) as Meituan
Leaf's segment mode does. docs/guides/java-rails.md quotes Orders.java,
SnowflakeIds.java and schema.sql. scripts/clients.sh
installs the clients, pinned, before the tests; when they are missing, the tests
fail with the reason."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from clients.support import HERE, doc_blocks, require_clients, module_server

JAVA_DIR = os.path.join(HERE, "java")
JAR = "/usr/share/java/postgresql.jar"
DOC = "docs/guides/java-rails.md"


def require_java() -> str:
    return require_clients("java")


@pytest.fixture(scope="module")
def classes():
    require_java()
    out = tempfile.mkdtemp(prefix="sfjdbc")
    try:
        proc = subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", out, "-cp", JAR,
                               *sorted(glob.glob(os.path.join(JAVA_DIR, "*.java")))],
                              capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"javac failed:\n{proc.stdout}{proc.stderr}"
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def server(request):
    require_java()
    for c in module_server(request, tcp=True):
        with open(os.path.join(JAVA_DIR, "schema.sql")) as f:
            c.sql(f.read())
        yield c


def run_java(server, classes, scenario: str) -> dict:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(server.port),
           "PGDATABASE": "postgres", "PGUSER": "postgres"}
    proc = subprocess.run(["java", "-cp", f"{classes}:{JAR}", "JdbcCheck", scenario],
                          env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"JdbcCheck {scenario} failed:\n{proc.stdout}{proc.stderr}"
    return json.loads(proc.stdout)


def strictly_increasing(ids: list[int]) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def test_returning_and_generated_keys_give_the_rows_key(server, classes):
    r = run_java(server, classes, "single")
    worker = r["worker_id"]
    assert isinstance(worker, int), r
    for item, key in (("returning", "returning_id"), ("generated key", "generated_key_id")):
        got = r[key]
        assert isinstance(got, int) and got > 2**40, r
        # The key the driver returned is the one the column default stored.
        assert server.sql("SELECT id FROM orders WHERE item = %s", item) == [(got,)]
        ts_ms, decoded_worker = server.sql(
            "SELECT (extract(epoch FROM ts) * 1000)::bigint, worker_id FROM snowflake_decode(%s)",
            got)[0]
        # Made now (between the Java program's clock readings, within a
        # second either side) by the session's worker id.
        assert r["before_ms"] - 1000 <= ts_ms <= r["after_ms"] + 1000, (r, ts_ms)
        assert decoded_worker == worker, (r, decoded_worker)
    assert r["generated_key_id"] > r["returning_id"]


def logged_inserts(server, mark: int) -> list[str]:
    """The INSERT statements the server logged since mark (log_statement = 'all')."""
    return [line for line in server.log(since=mark).splitlines()
            if re.search(r"LOG:  (execute \S+|statement): INSERT INTO orders", line)]


def check_keys_are_the_rows(server, way: str, r: dict) -> list[int]:
    ids = r["ids"]
    assert len(ids) == 10_000, len(ids)
    assert len(set(ids)) == 10_000
    # Each key is its own row's: the n-th key belongs to the n-th item.
    stored = dict(server.sql("SELECT item, id FROM orders WHERE item LIKE %s", f"{way} %"))
    assert len(stored) == 10_000
    assert [stored[f"{way} {i:05d}"] for i in range(10_000)] == ids
    assert server.sql("SELECT DISTINCT snowflake_worker_id(id) FROM orders WHERE item LIKE %s",
                      f"{way} %") == [(r["worker_id"],)]
    return ids


def test_batch_with_generated_keys_returns_every_key_in_order(server, classes):
    mark = server.log_mark()
    r = run_java(server, classes, "batch")
    ids = check_keys_are_the_rows(server, "batch", r)
    # Made in the order of the rows.
    assert strictly_increasing(ids)
    # pgjdbc 42.5 does not rewrite a batch that returns keys, whatever
    # reWriteBatchedInserts says: one INSERT ... RETURNING "id" per row
    # (pgjdbc issue 3683). If this changes, update docs/guides/java-rails.md.
    inserts = logged_inserts(server, mark)
    assert len(inserts) == 10_000, (len(inserts), inserts[:2])
    assert all(line.endswith("VALUES ($1)") for line in inserts), inserts[:2]


def test_insert_select_unnest_returns_every_key_in_one_statement(server, classes):
    mark = server.log_mark()
    r = run_java(server, classes, "unnest")
    ids = check_keys_are_the_rows(server, "unnest", r)
    assert strictly_increasing(ids)
    assert len(logged_inserts(server, mark)) == 1


def test_prefetched_keys_in_a_rewritten_batch(server, classes):
    mark = server.log_mark()
    r = run_java(server, classes, "prefetched")
    ids = check_keys_are_the_rows(server, "prefetched", r)
    # The client handed them out from blocks of its session, in order.
    assert strictly_increasing(ids)
    # Nothing to return: reWriteBatchedInserts sends multi-row INSERTs.
    inserts = logged_inserts(server, mark)
    assert 1 <= len(inserts) < 200, len(inserts)
    assert all(re.search(r"VALUES \(\$1, \$2\),\(\$3, \$4\)", line) for line in inserts), \
        inserts[:2]


def test_prefetched_blocks_are_distinct_across_sessions_and_threads(server, classes):
    r = run_java(server, classes, "prefetch")
    a, b = r["sessions"]
    assert len(a) == len(b) == 20_000
    # Each session's IDs rise, block after block.
    assert strictly_increasing(a) and strictly_increasing(b)
    assert len(set(a) | set(b)) == 40_000
    wa, wb = r["worker_ids"]
    assert isinstance(wa, int) and isinstance(wb, int) and wa != wb, r["worker_ids"]
    for ids, worker in ((a, wa), (b, wb)):
        assert server.scalar("SELECT count(*) FROM unnest(%s::bigint[]) AS id "
                             "WHERE snowflake_worker_id(id) <> %s", ids, worker) == 0
    # One allocator shared by four threads: every ID handed out once, and
    # each thread sees its IDs rise.
    threads = r["shared_threads"]
    assert [len(t) for t in threads] == [5_000] * 4
    assert all(strictly_increasing(t) for t in threads)
    shared = set().union(*map(set, threads))
    assert len(shared) == 20_000 and not shared & (set(a) | set(b))


def test_cost_per_id_prefetch_nextval_and_batched_default(server, classes):
    r = run_java(server, classes, "cost")
    assert r["duplicates"] == 0 and r["not_increasing"] == 0, r
    assert r["distinct_ids"] == r["prefetch_ids"] + r["nextval_ids"] + 3 * 10_000, r
    assert server.scalar("SELECT count(*) FROM orders WHERE item LIKE 'cost %%'") == 30_000
    # Printed for the docs, never asserted: timing depends on the machine.
    costs = {re.sub(r"_ns_per_(id|row)$", "", k): v for k, v in r.items()
             if k.endswith(("_ns_per_id", "_ns_per_row"))}
    print("\nper-ID cost (ns): " + ", ".join(f"{k} {v:,.0f}" for k, v in costs.items()),
          flush=True)


def test_doc_quotes_the_java_files():
    blocks = doc_blocks(DOC, "java")
    for name in ("Orders.java", "SnowflakeIds.java"):
        text = open(os.path.join(JAVA_DIR, name)).read().strip()
        assert text in blocks, f"{DOC} does not quote tests/clients/java/{name} verbatim"
    schema = open(os.path.join(JAVA_DIR, "schema.sql")).read().strip()
    assert schema in doc_blocks(DOC, "sql"), \
        f"{DOC} does not quote tests/clients/java/schema.sql verbatim"
    # The JPA mapping (documented, not run) keeps the database's key.
    assert any("@GeneratedValue(strategy = GenerationType.IDENTITY)" in b for b in blocks)
