"""Every ```sql block of README.md runs, in order, against a real server.

The documentation cannot rot: a snippet that stops working fails the suite.
Blocks fenced with another info string (```ini, ```bash, ```text) are not SQL
and are not run here.
"""
import pathlib
import re

from conftest import wait_until
from helpers import write_key_file

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
# The key file of the README's public IDs, and the example key it shows
# (the README's ```bash block writes a random one there).
README_KEY_FILE = "/etc/postgresql/snowflake_public_keys"
README_KEY = "000102030405060708090a0b0c0d0e0f"


def sql_blocks():
    text = README.read_text()
    return re.findall(r"^```sql\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_sql_snippets():
    # The README documents the API with runnable examples; losing them
    # (e.g. by changing the fence) would silently disable the test below.
    assert len(sql_blocks()) >= 8


def test_every_readme_sql_snippet_runs(cluster):
    key_file = write_key_file(cluster, README_KEY + "\n")
    with cluster.connect() as conn:
        for i, block in enumerate(sql_blocks()):
            block = block.replace(README_KEY_FILE, key_file)
            loaded = conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
            try:
                conn.execute(block)
            except Exception as e:  # noqa: BLE001 - report which block failed
                raise AssertionError(f"README sql block {i + 1} failed: {e}\n{block}") from e
            if "pg_reload_conf()" in block:
                # The next block reads the reloaded settings, as a user's
                # next statement would: wait until this backend has them.
                wait_until(lambda: conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
                           > loaded, what="the reload to reach this session")
        # The snippets leave evidence that they did what they say.
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 2
        assert conn.execute(
            "SELECT bool_and(id > 1000000) FROM legacy WHERE note = 'new row'"
        ).fetchone()[0]
        # The public ID the README shows for 12345 under its example key.
        assert conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0] == "5JSKRPW5Y4TSWA"
        # The row went to this month's partition, made by snowflake_create_partitions().
        assert conn.execute(
            "SELECT tableoid::regclass::text FROM events"
        ).fetchone()[0] == "events_p" + conn.execute(
            "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM')").fetchone()[0]
        assert conn.execute(
            "SELECT count(*) FROM legacy2 WHERE id IS NOT NULL").fetchone()[0] == 0
