"""node-postgres (npm `pg`, pinned by tests/clients/js/package-lock.json;
Node from Debian) against real servers with the classic and js53 layouts:
exact round trips as strings, the Number-parsing pitfall, JSON built in
SQL, and BigInt parsers. tests/clients/js/ids.js is quoted by docs/guides/clients.md."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from clients.support import JS_DIR, doc_blocks, require_clients, module_server


def run_node(server) -> dict:
    require_clients()
    env = {**os.environ, "PGHOST": server.dir, "PGPORT": str(server.port),
           "PGUSER": "postgres", "PGDATABASE": "postgres"}
    proc = subprocess.run(["node", "roundtrip.js"], cwd=JS_DIR, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def classic(request):
    require_clients()
    yield from module_server(request)


@pytest.fixture(scope="module")
def js53(request):
    require_clients()
    yield from module_server(request, settings={"snowflake_id.layout": "js53"})


def test_classic_ids_are_exact_only_as_strings(classic):
    r = run_node(classic)
    assert r["returned_type"] == "string" and r["string_roundtrip"]
    assert r["json_doc_exact"] and isinstance(r["json_doc"]["id"], str)
    assert r["count"] == 2000 and r["strings_exact"] == 2000
    # Most classic IDs change when parsed as Number ...
    assert r["changed_by_number"] > 1500, r
    # ... and a lookup by such a value finds ANOTHER row, or none.
    assert r["number_lookup_wrong_row"] > 0, r
    assert r["number_lookup_wrong_row"] + r["number_lookup_missing"] > 150, r
    # json_build_object('id', id) loses precision whatever the driver does.
    assert r["json_number_changed"] > 1500, r
    # BigInt is exact, but JSON.stringify cannot serialize it.
    assert r["bigint_exact"] == 2001
    assert r["bigint_json"].startswith("TypeError"), r["bigint_json"]


def test_js53_ids_survive_number(js53):
    r = run_node(js53)
    assert int(r["max_id"]) <= int(r["max_safe"])
    assert r["changed_by_number"] == 0
    assert r["number_lookup_wrong_row"] == 0 and r["number_lookup_missing"] == 0
    assert r["json_number_changed"] == 0
    assert r["strings_exact"] == 2000


def test_readme_quotes_ids_js():
    text = open(os.path.join(JS_DIR, "ids.js")).read().strip()
    blocks = doc_blocks("docs/guides/clients.md", "js")
    assert text in blocks, "docs/guides/clients.md does not quote tests/clients/js/ids.js verbatim"
