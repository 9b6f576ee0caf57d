"""Switching a table from pgEdge snowflake (docs/guides/from-pgedge.md):
its IDs decode under the ``pgedge`` layout to what pgEdge's own functions
say, ``snowflake_convert_column()`` recognises the ``snowflake.nextval()``
default and keeps every new ID above every old one, and no hint of it
leads to a collision.

Where pgEdge's ``snowflake`` extension 2.6 is installed in the PostgreSQL
under test (``pg_available_extensions``), the tests use it. The project
neither ships nor builds it: where it is missing, they use
``PGEDGE_REIMPLEMENTATION`` below instead, and say so in the test's name
(``[reimplementation]``) and output.
"""
from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

from helpers import sql_error

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "from-pgedge.md"
PGEDGE_EPOCH_MS = 1_672_531_200_000
NODE = 3

# NOT pgEdge's code: an independent reimplementation, for servers without
# pgEdge's extension, of what pgEdge snowflake 2.6 documents and does: an ID
# is (milliseconds since 2023-01-01 UTC) << 22 | node << 12 | count, the
# count restarting at 0 each millisecond and borrowing the next millisecond
# after 4095; get_epoch() is Unix seconds (numeric, 3 decimals); format()
# is {"ts", "count", "id" (the node)}. Per sequence, in a table.
PGEDGE_REIMPLEMENTATION = f"""
CREATE SCHEMA snowflake;
CREATE TABLE snowflake.last_values (seq regclass PRIMARY KEY, last_value bigint NOT NULL);
CREATE FUNCTION snowflake.nextval(seq regclass) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - {PGEDGE_EPOCH_MS};
    last bigint;
    ms bigint;
    count int;
BEGIN
    INSERT INTO snowflake.last_values VALUES (seq, 0) ON CONFLICT DO NOTHING;
    SELECT l.last_value INTO last FROM snowflake.last_values l WHERE l.seq = nextval.seq FOR UPDATE;
    ms := last >> 22;
    count := last & 4095;
    IF now_ms > ms THEN
        ms := now_ms;
        count := 0;
    ELSE
        count := count + 1;
        IF count > 4095 THEN
            count := 0;
            ms := ms + 1;
        END IF;
    END IF;
    last := (ms << 22) | ({NODE} << 12) | count;
    UPDATE snowflake.last_values l SET last_value = last WHERE l.seq = nextval.seq;
    RETURN last;
END
$$;
CREATE FUNCTION snowflake.get_epoch(bigint) RETURNS numeric LANGUAGE sql
    RETURN round((($1 >> 22) + {PGEDGE_EPOCH_MS})::numeric / 1000, 3);
CREATE FUNCTION snowflake.get_count(bigint) RETURNS int LANGUAGE sql RETURN ($1 & 4095)::int;
CREATE FUNCTION snowflake.get_node(bigint) RETURNS int LANGUAGE sql RETURN (($1 >> 12) & 1023)::int;
CREATE FUNCTION snowflake.format(bigint) RETURNS jsonb LANGUAGE sql
    RETURN jsonb_build_object('ts', to_timestamp(snowflake.get_epoch($1))::text,
                              'count', snowflake.get_count($1), 'id', snowflake.get_node($1));
"""


def pgedge_installed(conn) -> bool:
    return conn.execute("SELECT EXISTS (SELECT FROM pg_available_extension_versions"
                        " WHERE name = 'snowflake' AND version = '2.6.0')").fetchone()[0]


def guide_blocks() -> list[str]:
    """The guide's ```sql-pgedge blocks (run under the pgedge layout)."""
    text = GUIDE.read_text()
    return [textwrap.dedent(m.group(2)) for m in re.finditer(
        r"^([ \t]*)```sql-pgedge\n(.*?)^\1```[ \t]*$", text, flags=re.S | re.M)]


@pytest.fixture(params=["pgEdge 2.6", "reimplementation"])
def pgedge(request):
    """How pgEdge snowflake is provided: the real extension (skipped where
    it is not installed) or the reimplementation."""
    return request.param


def make_pgedge_table(conn, which: str) -> None:
    """orders(id, note), its id filled by pgEdge's snowflake.nextval(), as
    pgEdge's convert_sequence_to_snowflake() leaves a bigserial."""
    conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text)")
    if which == "pgEdge 2.6":
        if not pgedge_installed(conn):
            pytest.skip("pgEdge snowflake 2.6.0 is not installed in this PostgreSQL "
                        "(the reimplementation variant runs instead)")
        conn.execute("CREATE EXTENSION snowflake VERSION '2.6.0'")
        conn.execute(f"SET snowflake.node = {NODE}")
        conn.execute("SELECT snowflake.convert_sequence_to_snowflake('orders_id_seq')")
    else:
        print("pgEdge snowflake: the test's reimplementation of its packing, not pgEdge's code")
        conn.execute(PGEDGE_REIMPLEMENTATION)
        conn.execute("ALTER TABLE orders ALTER id SET DEFAULT snowflake.nextval('orders_id_seq')")
    default = conn.execute("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef"
                           " WHERE adrelid = 'orders'::regclass").fetchone()[0]
    assert "nextval" in default and "snowflake" in default, default


def fill(conn, rows: int) -> None:
    # Several statements, some milliseconds apart, some many rows at once.
    for k in range(rows // 100):
        conn.execute("INSERT INTO orders (note) SELECT 'pgEdge' FROM generate_series(1, 100)")
        if k % 5 == 0:
            conn.execute("SELECT pg_sleep(0.003)")


def test_pgedge_ids_decode_and_new_ids_continue_above(make_cluster, pgedge):
    c = make_cluster(settings={"snowflake_id.layout": "pgedge"}, create_extension=True)
    with c.connect() as conn:
        assert conn.execute("SHOW snowflake_id.epoch").fetchone()[0] == "2023-01-01"
        make_pgedge_table(conn, pgedge)
        fill(conn, 2000)
        old = conn.execute("SELECT count(*), max(id) FROM orders").fetchone()
        assert old[0] == 2000
        # Every old ID decodes to what pgEdge's own functions say.
        mismatched = conn.execute("""
            SELECT id, snowflake.format(id),
                   (SELECT jsonb_build_object('ts', d.ts::text, 'count', d.sequence, 'id', d.worker_id)
                      FROM snowflake_decode(id) AS d)
              FROM orders
             WHERE snowflake.get_epoch(id) <> extract(epoch FROM snowflake_timestamp(id))
                OR snowflake.get_node(id) <> snowflake_worker_id(id)
                OR snowflake.get_count(id) <> snowflake_sequence(id)
                OR snowflake.format(id) <> (SELECT jsonb_build_object('ts', d.ts::text,
                                                   'count', d.sequence, 'id', d.worker_id)
                                              FROM snowflake_decode(id) AS d)
             LIMIT 5""").fetchall()
        assert not mismatched, mismatched
        assert conn.execute("SELECT bool_and(snowflake_worker_id(id) = %s"
                            " AND snowflake_timestamp(id) <= now()) FROM orders",
                            (NODE,)).fetchone()[0]

        blocks = guide_blocks()
        assert len(blocks) == 4, blocks
        # The switch, as the guide does it.
        steps = conn.execute(blocks[0]).fetchall()
        names = [s for s, _ in steps]
        assert names[0] == "recognised pgEdge snowflake", steps
        assert "is pgEdge's" in steps[0][1], steps
        assert "set default" in names and "dropped sequence" in names, steps
        conn.execute("INSERT INTO orders (note) SELECT 'snowflake_id' FROM generate_series(1, 2000)")
        for _ in range(20):
            conn.execute("INSERT INTO orders (note) VALUES ('snowflake_id')")
        rows, distinct, above = conn.execute(blocks[1]).fetchone()
        assert (rows, distinct, above) == (4020, 4020, True)
        assert conn.execute(blocks[2]).fetchall() == [(NODE,)]
        conn.execute(blocks[3])
        assert conn.execute("SELECT count(*), min(id) > %s FROM orders WHERE note = 'snowflake_id'",
                            (old[1],)).fetchone() == (2021, True)
        if pgedge == "pgEdge 2.6":
            # No default uses pgEdge's extension any more.
            conn.execute("DROP EXTENSION snowflake")


def test_ids_just_ahead_of_the_clock_are_waited_out(make_cluster, pgedge):
    # pgEdge borrows milliseconds (and skips 30 after a crash): its newest
    # IDs can be ahead of the clock when the switch runs.
    c = make_cluster(settings={"snowflake_id.layout": "pgedge"}, create_extension=True)
    with c.connect() as conn:
        make_pgedge_table(conn, pgedge)
        fill(conn, 100)
        ahead = conn.execute(
            "INSERT INTO orders (id, note) VALUES (((floor(extract(epoch FROM clock_timestamp())"
            " * 1000)::bigint + 400 - %s) << 22) | (%s << 12) | 4095, 'pgEdge') RETURNING id",
            (PGEDGE_EPOCH_MS, NODE)).fetchone()[0]
        steps = conn.execute("SELECT * FROM snowflake_convert_column('orders', 'id')").fetchall()
        assert "waited" in [s for s, _ in steps], steps
        new = conn.execute("INSERT INTO orders (note) SELECT 'snowflake_id'"
                           " FROM generate_series(1, 100) RETURNING id").fetchall()
        assert min(i for (i,) in new) > ahead


def test_another_layout_refuses_pgedge_ids_with_a_hint_that_keeps_them_apart(make_cluster,
                                                                              pgedge):
    # Under classic (from 2024-01-01), pgEdge's IDs of now decode a year
    # ahead: setting only the default would make new IDs below them.
    c = make_cluster(create_extension=True)
    with c.connect() as conn:
        make_pgedge_table(conn, pgedge)
        fill(conn, 100)
        e = sql_error(conn, "SELECT * FROM snowflake_convert_column('orders', 'id')")
        assert e.sqlstate == "22003", e
        assert "snowflake_id.layout = pgedge" in e.diag.message_hint, e.diag.message_hint
        assert "only set its default" not in e.diag.message_hint
        assert "collide" in e.diag.message_detail
        default = conn.execute("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef"
                               " WHERE adrelid = 'orders'::regclass").fetchone()[0]
        assert "snowflake.nextval" in default or "nextval(" in default, default
        assert "snowflake_nextval" not in default


def test_values_ahead_of_new_ids_are_refused_without_a_colliding_hint(cluster):
    # Values of another generator, far above where new IDs start: the hint
    # may not say to set only the default (new IDs would sort below them).
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE other (id bigint PRIMARY KEY)")
        conn.execute("INSERT INTO other VALUES (snowflake_from_timestamp(now() + interval '1 year'))")
        e = sql_error(conn, "SELECT * FROM snowflake_convert_column('other', 'id')")
        assert e.sqlstate == "22003", e
        assert "only set its default" not in e.diag.message_hint
        assert "layout" in e.diag.message_hint
        assert conn.execute("SELECT count(*) FROM pg_attrdef"
                            " WHERE adrelid = 'other'::regclass").fetchone()[0] == 0


def test_the_reimplementation_packs_as_pgedge_does(make_cluster):
    # Where the real extension is installed, the reimplementation must agree
    # with it on how an ID is packed and read.
    c = make_cluster(create_extension=False)
    with c.connect() as conn:
        if not pgedge_installed(conn):
            pytest.skip("pgEdge snowflake 2.6.0 is not installed: nothing to compare with")
        conn.execute("CREATE EXTENSION snowflake VERSION '2.6.0'")
        conn.execute(f"SET snowflake.node = {NODE}")
        real = conn.execute("SELECT snowflake.nextval()").fetchone()[0]
        parts = conn.execute("SELECT snowflake.get_epoch(%s), snowflake.get_node(%s),"
                             " snowflake.get_count(%s), snowflake.format(%s)",
                             (real, real, real, real)).fetchone()
        conn.execute("DROP EXTENSION snowflake")
        conn.execute("DROP SCHEMA snowflake")
        conn.execute(PGEDGE_REIMPLEMENTATION)
        mine = conn.execute("SELECT snowflake.get_epoch(%s), snowflake.get_node(%s),"
                            " snowflake.get_count(%s), snowflake.format(%s)",
                            (real, real, real, real)).fetchone()
        assert mine == parts
        conn.execute("CREATE SEQUENCE s")
        made = conn.execute("SELECT snowflake.nextval('s')").fetchone()[0]
        assert (made >> 12) & 1023 == NODE and made > real



def test_pgedge_ids_far_ahead_of_the_clock_are_refused_naming_the_clocks(make_cluster):
    # Under the pgedge layout, pgEdge IDs more than a second ahead (a node
    # whose clock is ahead): refused, and the hint does not send the DBA
    # to a layout already in force.
    c = make_cluster(settings={"snowflake_id.layout": "pgedge"}, create_extension=True)
    with c.connect() as conn:
        make_pgedge_table(conn, "reimplementation")
        conn.execute(
            "INSERT INTO orders (id, note) VALUES (((floor(extract(epoch FROM clock_timestamp())"
            " * 1000)::bigint + 600000 - %s) << 22) | (%s << 12), 'pgEdge')",
            (PGEDGE_EPOCH_MS, NODE))
        e = sql_error(conn, "SELECT * FROM snowflake_convert_column('orders', 'id')")
        assert e.sqlstate == "22003", e
        assert "check the clocks" in e.diag.message_hint, e.diag.message_hint
        assert "snowflake_id.layout = pgedge" not in e.diag.message_hint


@pytest.mark.parametrize("settings,shown,epoch", [
    ({}, "2024-01-01", "2024-01-01 00:00:00+00"),
    ({"snowflake_id.layout": "pgedge"}, "2023-01-01", "2023-01-01 00:00:00+00"),
    ({"snowflake_id.layout": "pgedge", "snowflake_id.epoch": "2022-06-01 12:00:00"},
     "2022-06-01 12:00:00", "2022-06-01 12:00:00+00"),
])
def test_the_epoch_comes_from_the_preset_unless_set(make_cluster, settings, shown, epoch):
    c = make_cluster(settings=settings, create_extension=True)
    with c.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        assert conn.execute("SHOW snowflake_id.epoch").fetchone()[0] == shown
        assert conn.execute("SELECT epoch = %s::timestamptz FROM snowflake_layout()",
                            (epoch,)).fetchone()[0]
        assert conn.execute("SELECT boot_val FROM pg_settings"
                            " WHERE name = 'snowflake_id.epoch'").fetchone()[0] == ""
