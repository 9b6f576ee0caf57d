"""Switching a UUID key to snowflake IDs (docs/guides/from-uuid.md): the
guide's ```sql blocks, run in order on a real server while another session
keeps inserting rows (the steps are online), give every row a unique
bigint key that sorts as its UUIDv7 did, to the millisecond, and decodes
to the UUID's time; on PostgreSQL 18 and later, the guide's uuidv7_time()
agrees with uuid_extract_timestamp() (17's reads version 1 UUIDs only).
"""
from __future__ import annotations

import pathlib
import re
import textwrap
import threading

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "from-uuid.md"

# A UUIDv7 of now, as the guide's example makes them.
INSERT_V7 = """
INSERT INTO tickets (id, subject)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 4, 15))::uuid,
       'written during the switch'
"""


def guide_blocks() -> list[str]:
    return [textwrap.dedent(m.group(2)) for m in re.finditer(
        r"^([ \t]*)```sql\n(.*?)^\1```[ \t]*$", GUIDE.read_text(), flags=re.S | re.M)]


class Writer:
    """Inserts rows into tickets until stopped; counts them."""

    def __init__(self, cluster):
        self.conn = cluster.connect()
        self.stopping = threading.Event()
        self.written = 0
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            try:
                self.conn.execute(INSERT_V7)
                self.written += 1
            except psycopg.Error as e:
                self.errors.append(e)
                return

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join(60)
        self.conn.close()
        assert not self.errors, self.errors
        return self.written


def test_the_guide_switches_a_uuidv7_key_online(make_cluster):
    c = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"},
                     create_extension=True)
    blocks = guide_blocks()
    assert len(blocks) == 8, [b[:40] for b in blocks]
    uuid_fn, table, add, backfill, index, not_null, swap, check = blocks
    with c.connect() as conn:
        conn.execute(uuid_fn)
        conn.execute(table)
        before = conn.execute("SELECT count(*) FROM tickets").fetchone()[0]
        writer = Writer(c)
        conn.execute(add)
        while conn.execute(backfill).rowcount > 0:
            pass
        conn.execute(index)
        conn.execute(not_null)
        written = writer.stop()
        assert written > 0
        # Rows the writer added between the two statements of step 1 (if
        # any) lack their ID until a backfill batch more.
        assert conn.execute("SELECT count(*) FROM tickets WHERE new_id IS NULL").fetchone()[0] == 0
        order = conn.execute("""
            SELECT count(*) FILTER (WHERE a.new_id > b.new_id)
              FROM (SELECT id, new_id, row_number() OVER (ORDER BY uuidv7_time(id), new_id) AS n
                      FROM tickets WHERE subject LIKE 'ticket %') AS a
              JOIN (SELECT id, new_id, row_number() OVER (ORDER BY uuidv7_time(id), new_id) AS n
                      FROM tickets WHERE subject LIKE 'ticket %') AS b ON b.n = a.n + 1
             WHERE uuidv7_time(a.id) < uuidv7_time(b.id)""").fetchone()[0]
        assert order == 0
        conn.execute(swap)
        decodes, unique = conn.execute(
            check.replace("FROM tickets", "FROM tickets WHERE subject LIKE 'ticket %'")).fetchone()
        assert decodes and unique
        assert conn.execute("SELECT count(*), count(DISTINCT id), count(DISTINCT uuid)"
                            " FROM tickets").fetchone() == (before + written,) * 3
        key = conn.execute("""
            SELECT a.attname, format_type(a.atttypid, NULL)
              FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
                                                 AND a.attnum = i.indkey[0]
             WHERE i.indrelid = 'tickets'::regclass AND i.indisprimary""").fetchone()
        assert key == ("id", "bigint")
        # New rows get snowflake IDs above every backfilled one.
        new = conn.execute("INSERT INTO tickets (uuid, subject) VALUES (gen_random_uuid(), 'new')"
                           " RETURNING id").fetchone()[0]
        assert new > conn.execute("SELECT max(id) FROM tickets WHERE subject <> 'new'").fetchone()[0]
        if 170000 <= conn.info.server_version < 180000:
            # 17's uuid_extract_timestamp() knows version 1 only.
            assert conn.execute("SELECT count(uuid_extract_timestamp(uuid)) FROM tickets"
                                " WHERE subject <> 'new'").fetchone()[0] == 0
        if conn.info.server_version >= 180000:
            assert conn.execute("SELECT bool_and(uuid_extract_timestamp(uuid) = uuidv7_time(uuid))"
                                " FROM tickets WHERE subject <> 'new'").fetchone()[0]
