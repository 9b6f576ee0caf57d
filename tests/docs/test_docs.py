"""Every ```sql block of README.md and docs/**/*.md runs against a real server.

The documentation cannot rot: a snippet that stops working fails the suite.

* Each Markdown file runs in a fresh database of its own (one cluster, with
  the library preloaded and the extension created in that database), its
  ```sql blocks in order: a block may depend on the blocks before it in the
  same file, never on another file. Blocks indented inside a list item run
  too.
* Blocks fenced with another info string are not SQL, or not meant to run
  on a single server, and are not run here: ```ini, ```bash, ```text,
  ```python, ```js, and ```psql (psql scripts with meta-commands or
  variables; the pg_partman recipe and the replication files are run by
  tests/clients/test_partman.py and tests/fleet/test_several_servers.py). Blocks that need
  a registry of several servers, Citus or logical replication are fenced as
  ```ini, ```psql, ```text or ```sql-fleet for that reason. The ```sql-pgedge
  blocks of docs/guides/from-pgedge.md need the pgedge layout and a table
  pgEdge filled: tests/sql_api/test_from_pgedge.py runs them.
* The key file of the public-ID examples is replaced by one the test writes
  with the example key, and a block that reloads the configuration waits
  until the session has the reloaded settings.
* docs/reference/ names every member of the extension (functions, views,
  tables, types, the internal schema) and every setting, as the server
  lists them; the internal objects (schema snowflake_id_internal) in the
  section "Internal objects (snowflake_id_internal)" of functions.md, which
  says they are not an API.
"""
import pathlib
import re
import textwrap

from harness import wait_until
from helpers import write_key_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
# The key file of the public-ID examples, and the example key they show
# (their ```bash block writes a random one there).
EXAMPLE_KEY_FILE = "/etc/postgresql/snowflake_public_keys"
EXAMPLE_KEY = "000102030405060708090a0b0c0d0e0f"

SQL_BLOCK = re.compile(r"^([ \t]*)```sql\n(.*?)^\1```[ \t]*$", flags=re.S | re.M)


def doc_files():
    return [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))


def sql_blocks(path):
    return [textwrap.dedent(m.group(2)) for m in SQL_BLOCK.finditer(path.read_text())]


def test_docs_have_sql_snippets():
    # The docs document the API with runnable examples; losing them (e.g. by
    # changing the fence) would silently disable the test below.
    counts = {p.relative_to(ROOT).as_posix(): len(sql_blocks(p)) for p in doc_files()}
    assert sum(counts.values()) >= 15, counts
    for name in ("README.md", "docs/guides/decoding.md", "docs/guides/converting.md",
                 "docs/guides/partitions.md", "docs/guides/public-ids.md"):
        assert counts.get(name, 0) >= 1, (name, counts)


def run_file(cluster, path, key_file):
    dbname = "doc_" + re.sub(r"\W", "_", path.relative_to(ROOT).as_posix().lower())
    cluster.sql(f'CREATE DATABASE "{dbname}"')
    cluster.create_extension(dbname=dbname)
    conn = cluster.connect(dbname=dbname)
    for i, block in enumerate(sql_blocks(path)):
        block = block.replace(EXAMPLE_KEY_FILE, key_file)
        loaded = conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
        try:
            conn.execute(block)
        except Exception as e:  # noqa: BLE001 - report which block failed
            conn.close()
            raise AssertionError(
                f"{path.relative_to(ROOT)}: sql block {i + 1} failed: {e}\n{block}") from e
        if "pg_reload_conf()" in block:
            # The next block reads the reloaded settings, as a user's next
            # statement would: wait until this backend has them.
            wait_until(lambda: conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
                       > loaded, what="the reload to reach this session")
    return conn


def test_every_doc_sql_snippet_runs(make_cluster):
    # The backfill guide's import needs ids set aside.
    cluster = make_cluster(settings={"snowflake_id.backfill_worker_ids": "1023"},
                           create_extension=True)
    key_file = write_key_file(cluster, EXAMPLE_KEY + "\n")
    conns = {}
    try:
        for path in doc_files():
            if sql_blocks(path):
                conns[path.relative_to(ROOT).as_posix()] = run_file(cluster, path, key_file)

        # The snippets leave evidence that they did what they say.
        conn = conns["README.md"]
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 2

        conn = conns["docs/guides/converting.md"]
        assert conn.execute(
            "SELECT bool_and(id > 1000000) FROM legacy WHERE note = 'new row'"
        ).fetchone()[0]
        assert conn.execute(
            "SELECT count(*) FROM legacy2 WHERE id IS NOT NULL").fetchone()[0] == 0

        # The public ID the docs show for 12345 under their example key.
        conn = conns["docs/guides/public-ids.md"]
        assert conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0] == "5JSKRPW5Y4TSWA"

        # Imported rows decode to their own times, with distinct backfill IDs.
        conn = conns["docs/guides/backfill.md"]
        assert conn.execute(
            "SELECT count(DISTINCT id) = 3 AND bool_and(snowflake_worker_id(id) = 1023)"
            " AND bool_and(snowflake_timestamp(id) = date_trunc('milliseconds', created_at))"
            " FROM posts").fetchone()[0]

        # The row went to this month's partition, made by snowflake_create_partitions().
        conn = conns["docs/guides/partitions.md"]
        assert conn.execute(
            "SELECT tableoid::regclass::text FROM events"
        ).fetchone()[0] == "events_p" + conn.execute(
            "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM')").fetchone()[0]
    finally:
        for conn in conns.values():
            conn.close()


def test_reference_names_every_object_and_setting(cluster):
    """Every member of the extension and every snowflake_id.* setting, as
    the server lists them, is named somewhere in docs/reference/."""
    text = "\n".join(p.read_text() for p in sorted(REFERENCE.rglob("*.md")))
    with cluster.connect() as conn:
        members = [r[0] for r in conn.execute("""
            SELECT coalesce(p.proname, c.relname, t.typname, n.nspname)
              FROM pg_depend d
              JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'
              LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
              LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
              LEFT JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
              LEFT JOIN pg_namespace n ON d.classid = 'pg_namespace'::regclass
                                      AND n.oid = d.objid
             WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
               -- the row and array types of the extension's tables and views
               -- (members on PostgreSQL 18) are documented with them
               AND (t.oid IS NULL OR (t.typelem = 0 AND t.typrelid = 0))
            """).fetchall()]
        settings = [r[0] for r in conn.execute(
            "SELECT name FROM pg_settings WHERE name LIKE 'snowflake_id.%'").fetchall()]
        # Hidden from pg_settings (GUC_NO_SHOW_ALL), but documented too.
        settings.append("snowflake_id.public_key")
    assert None not in members, "an extension member of an unexpected kind"
    assert len(members) >= 30 and len(settings) >= 14, (members, settings)
    missing = [n for n in members + settings
               if not re.search(r"(?<![\w.])" + re.escape(n) + r"(?![\w])", text)]
    assert not missing, f"not named in docs/reference/: {missing}"


    # The internal objects are documented as such, in their own section.
    with cluster.connect() as conn:
        internal = [r[0] for r in conn.execute("""
            SELECT p.proname
              FROM pg_depend d
              JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake_id'
              JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
             WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
               AND p.pronamespace = 'snowflake_id_internal'::regnamespace
            """).fetchall()]
    assert len(internal) >= 12, internal
    functions = (REFERENCE / "functions.md").read_text()
    heading = "## Internal objects (snowflake_id_internal)"
    assert heading in functions
    section = functions.split(heading, 1)[1].split("\n## ", 1)[0]
    assert "Not an API" in section
    missing = [n for n in internal if f"`{n}(" not in section]
    assert not missing, f"not in the section {heading!r}: {missing}"


def _anchors(path: pathlib.Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", path.read_text(), flags=re.M)}


def test_relative_links_resolve():
    """Every relative link of README.md, CONTRIBUTING.md, CHANGELOG.md,
    bench/README.md, sql/README.md and docs/ names a file that exists, and
    a heading of it when it names one: moving a section cannot leave a dead
    link behind."""
    files = [ROOT / n for n in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md",
                                "bench/README.md", "sql/README.md")]
    files += sorted(DOCS.rglob("*.md"))
    dead = []
    for f in files:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = (f.parent / path).resolve() if path else f
            if not target.exists():
                dead.append(f"{f.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                dead.append(f"{f.relative_to(ROOT)}: {link} (no such heading)")
    assert not dead, "dead links:\n" + "\n".join(dead)
