"""Bad input gets errors that say what is wrong, where it was raised.

* Every function of the extension that is not STRICT (its other arguments
  would otherwise meet a NULL with a misleading error) refuses a NULL
  argument with 22004 naming it; snowflake_lease_set_limits() is the one
  whose NULL means "unchanged".
* The layout-explicit decoders apply the server's layout rules: a time
  field that lasts less than ten years, refused by the server at start, is
  refused by them too.
* An error raised from Rust reports where it was raised (the caller of
  src/errors/), not the line of the helper that reports it.
"""
from __future__ import annotations

import pathlib

import pytest
from harness import ClusterError

from helpers import sql_error

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# The non-STRICT functions of the extension's schema, and each one's
# arguments that refuse NULL.
NULL_REFUSED = {
    "snowflake_convert_column": ["tbl", "col", "convert_type"],
    "snowflake_create_partitions": ["parent", "period", "count", "start_at"],
}
NULL_MEANS_UNCHANGED = {"snowflake_lease_set_limits"}


def test_every_non_strict_function_is_surveyed(cluster):
    names = {r[0] for r in cluster.sql("""
        SELECT p.proname FROM pg_proc p
          JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
          JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'
         WHERE NOT p.proisstrict AND p.prokind = 'f' AND p.pronargs > 0
           AND p.pronamespace = e.extnamespace""")}
    assert names == set(NULL_REFUSED) | NULL_MEANS_UNCHANGED


@pytest.mark.parametrize("function,args,null", [
    ("snowflake_convert_column", "{tbl}, {col}, {convert_type}", name)
    for name in NULL_REFUSED["snowflake_convert_column"]
] + [
    ("snowflake_create_partitions", "{parent}, {period}, {count}, {start_at}", name)
    for name in NULL_REFUSED["snowflake_create_partitions"]
])
def test_a_null_argument_is_22004_naming_it(cluster, function, args, null):
    values = {"tbl": "'ev'", "col": "'id'", "convert_type": "false", "parent": "'ev'",
              "period": "'1 month'", "count": "3", "start_at": "now()"}
    values[null] = "NULL"
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE ev (id bigint, at timestamptz) PARTITION BY RANGE (id)")
        e = sql_error(conn, f"SELECT * FROM {function}({args.format(**values)})")
        assert e.sqlstate == "22004", e
        assert e.diag.message_primary == f"{function}: argument {null} is null"
        assert e.diag.message_hint


def test_the_explicit_decoders_refuse_a_layout_the_server_refuses(make_cluster):
    # 53 bits with 10 worker and 12 sequence bits: 31 bits of milliseconds,
    # 24.8 days. The server refuses it at start...
    c = make_cluster(settings={"snowflake_id.total_bits": 53}, start=False)
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    assert "less than 10 years after the epoch" in c.log(since=mark)
    c.configure(**{"snowflake_id.total_bits": 63})
    c.start()
    c.create_extension()
    with c.connect() as conn:
        for query in ("SELECT snowflake_timestamp(9007199254740991, '2000-01-01', 1, 10, 12, 53)",
                      "SELECT snowflake_from_timestamp('2000-01-02', '2000-01-01', 1, 10, 12, 53)"):
            e = sql_error(conn, query)
            assert e.sqlstate == "22023", e
            assert "less than 10 years" in e.diag.message_primary
            assert "24 days" in e.diag.message_detail, e.diag.message_detail
        # The edge, as the server draws it: 39 bits of ms last 17 years,
        # 38 bits 8.7 years; 28 bits of seconds 8.5 years, 29 bits 17.
        ok = "SELECT snowflake_timestamp(1, '2000-01-01', %s, 10, 12, %s) IS NOT NULL"
        assert conn.execute(ok, (1, 61)).fetchone()[0]
        assert conn.execute(ok, (1000, 51)).fetchone()[0]
        assert sql_error(conn, ok, (1, 60)).sqlstate == "22023"
        assert sql_error(conn, ok, (1000, 50)).sqlstate == "22023"
        # The presets' layouts pass.
        for args in ((1, 10, 12, 63), (10, 16, 8, 63), (1, 6, 6, 53)):
            assert conn.execute("SELECT snowflake_timestamp(1, '2024-01-01', %s, %s, %s, %s)"
                                " IS NOT NULL", args).fetchone()[0]


@pytest.mark.parametrize("query", [
    "SELECT snowflake_compose(now(), 100000, 0)",
    "SELECT snowflake_timestamp(-1)",
    "SELECT snowflake_from_timestamp('infinity')",
    "SELECT count(*) FROM snowflake_nextvals(0)",
])
def test_an_error_reports_where_it_was_raised(cluster, query):
    with cluster.connect() as conn:
        e = sql_error(conn, query)
    file, line = e.diag.source_file, int(e.diag.source_line)
    assert file != "mod.rs" or line != 59, (file, line)
    # The line that called the error's function in src/, not src/errors/.
    sources = [p for p in SRC.rglob(file) if "errors" not in p.parts]
    assert sources, (file, line)
    assert any("errors::" in p.read_text().splitlines()[line - 1] for p in sources), (file, line)
