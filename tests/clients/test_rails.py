"""ActiveRecord 6.1 standalone (Debian's ruby-activerecord, with ruby-pg)
against real servers over TCP, with the classic and js53 layouts:
tests/clients/rails/app.rb (quoted by docs/guides/java-rails.md) has a
migration whose primary key defaults to snowflake_nextval(), the models, and
the JSON recipe for JavaScript clients; tests/clients/rails/check.rb runs it
and reports. JSON is read back by node (as a browser would).
scripts/clients.sh installs the clients, pinned, before the tests; when they
are missing, the tests fail with the reason."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from clients.support import HERE, doc_blocks, require_clients, module_server

RAILS_DIR = os.path.join(HERE, "rails")
DOC = "docs/guides/java-rails.md"
DB = "rails"


def require_rails() -> str:
    return require_clients("rails")


def run_ruby(server, scenario: str) -> dict:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(server.port),
           "PGDATABASE": DB, "PGUSER": "postgres"}
    proc = subprocess.run(["ruby", "check.rb", scenario], cwd=RAILS_DIR, env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"check.rb {scenario} failed:\n{proc.stdout}{proc.stderr}"
    return json.loads(proc.stdout)


# What JavaScript makes of the JSON: each object's id as typeof and String().
READ_IDS = ("const a = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
            "process.stdout.write(JSON.stringify(a.map(o => [typeof o.id, String(o.id)])));")


def ids_in_javascript(text: str) -> list[list[str]]:
    proc = subprocess.run(["node", "-e", READ_IDS], input=text, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def migrated_server(request, settings=None):
    require_rails()
    for c in module_server(request, settings=settings, tcp=True):
        c.create_db(DB)  # without the extension: the migration creates it
        c.migration = run_ruby(c, "migrate")
        yield c


@pytest.fixture(scope="module")
def classic(request):
    yield from migrated_server(request)


@pytest.fixture(scope="module")
def js53(request):
    yield from migrated_server(request, settings={"snowflake_id.layout": "js53"})


def test_migration_defaults_the_key_to_snowflake_nextval(classic):
    sql = classic.migration["sql"]
    assert 'CREATE EXTENSION IF NOT EXISTS "snowflake_id"' in sql, sql
    create = [s for s in sql if s.startswith('CREATE TABLE "orders"')]
    assert len(create) == 1, sql
    assert '("id" bigint DEFAULT snowflake_nextval() NOT NULL PRIMARY KEY,' in create[0], create
    assert classic.sql("SELECT data_type, column_default FROM information_schema.columns "
                       "WHERE table_name = 'orders' AND column_name = 'id'",
                       dbname=DB) == [("bigint", "snowflake_nextval()")]
    # A bigint key, not a bigserial: no sequence was made.
    assert classic.scalar("SELECT count(*) FROM pg_class WHERE relkind = 'S'", dbname=DB) == 0
    # schema.rb (which loads test databases) keeps the default.
    assert ('create_table "orders", id: :bigint, default: -> { "snowflake_nextval()" }'
            in classic.migration["schema_rb"]), classic.migration["schema_rb"]


def test_create_sets_the_id_from_returning(classic):
    r = run_ruby(classic, "create")
    got = r["id"]
    assert r["id_class"] == "Integer" and got > 2**40, r
    # One INSERT, which returned the key.
    assert len(r["inserts"]) == 1 and r["inserts"][0].endswith('RETURNING "id"'), r["inserts"]
    assert classic.sql("SELECT id FROM orders WHERE item = 'tea'", dbname=DB) == [(got,)]
    assert r["found_item"] == "tea"
    ts_ms, worker = classic.sql(
        "SELECT (extract(epoch FROM ts) * 1000)::bigint, worker_id FROM snowflake_decode(%s)",
        got, dbname=DB)[0]
    assert r["before_ms"] - 1000 <= ts_ms <= r["after_ms"] + 1000, (r, ts_ms)
    assert isinstance(r["worker_id"], int) and worker == r["worker_id"]
    assert r["second_id"] > got
    assert classic.sql("SELECT id FROM orders WHERE item = 'coffee'",
                       dbname=DB) == [(r["second_id"],)]


def test_insert_all_returning_gives_every_key(classic):
    r = run_ruby(classic, "insert_all")
    returned = r["returned"]
    assert r["inserts"] == 1
    assert len(returned) == 500
    ids = [i for i, _ in returned]
    assert len(set(ids)) == 500 and all(a < b for a, b in zip(ids, ids[1:]))
    assert [item for _, item in returned] == [f"bulk {i:03d}" for i in range(500)]
    stored = dict(classic.sql("SELECT item, id FROM orders WHERE item LIKE 'bulk %%'", dbname=DB))
    assert {item: i for i, item in returned} == stored


def test_classic_layout_json_needs_string_ids(classic):
    r = run_ruby(classic, "json")
    db_ids = r["db_ids"]
    assert len(db_ids) == 200 and all(int(i) >= 2**53 for i in db_ids)
    # Plain to_json: JSON numbers, which JavaScript rounds.
    plain = ids_in_javascript(r["plain_json"])
    assert [t for t, _ in plain] == ["number"] * 200
    changed = sum(js != db for (_, js), db in zip(plain, db_ids))
    assert changed > 150, changed
    # The recipe's two ways: strings, exact.
    for key in ("api_json", "string_id_json"):
        assert ids_in_javascript(r[key]) == [["string", i] for i in db_ids], key
    assert r["as_json_id_class"] == "String"
    assert r["string_id_created"] == r["string_id_db"] and isinstance(r["string_id_created"], str)
    assert r["string_id_found"] == "string id"


def test_js53_layout_json_numbers_are_exact(js53):
    assert js53.scalar("SELECT max_id FROM snowflake_layout()", dbname=DB) < 2**53
    r = run_ruby(js53, "json")
    db_ids = r["db_ids"]
    assert len(db_ids) == 200 and all(int(i) < 2**53 for i in db_ids), db_ids[-1]
    # Plain to_json: JSON numbers that JavaScript reads exactly.
    assert ids_in_javascript(r["plain_json"]) == [["number", i] for i in db_ids]
    create = run_ruby(js53, "create")
    assert create["id"] < 2**53
    assert ids_in_javascript(json.dumps([{"id": create["id"]}])) == \
        [["number", str(create["id"])]]


def test_doc_quotes_the_rails_recipe():
    text = open(os.path.join(RAILS_DIR, "app.rb")).read().strip()
    assert text in doc_blocks(DOC, "ruby"), \
        f"{DOC} does not quote tests/clients/rails/app.rb verbatim"
