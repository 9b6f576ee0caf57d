"""Secrets: no password or key in a setting, a message or the
server log, on real servers.

- snowflake_id.registry holding a password is refused (at start, by ALTER
  SYSTEM), with a hint naming passfile and without echoing it;
- a failed snowflake_nextval() names the registry only to superusers and
  members of pg_read_all_settings, as snowflake_config() does;
- the keys of public IDs come from snowflake_id.public_key_file, checked as
  PostgreSQL checks ssl_key_file (owner, mode), reread on reload, and never
  written to the log, at any log level, through rotations and bad files.

The public-ID functions themselves are in tests/sql_api/test_public_ids.py.
"""
from __future__ import annotations

import os
import re
import shutil

import psycopg
import pytest

from harness import AS_ROOT, ClusterError, free_port, pg_ids, wait_until
from helpers import keyed_cluster, reload_session, write_key_file

KEY_A = "000102030405060708090a0b0c0d0e0f"
KEY_B = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
KEY_C = "5ca1ab1e5ca1ab1e0ddba11c0ffee000"
KEYS = [KEY_A, KEY_B, KEY_C]

PASSWORD = "Sekr3t-Pw-for-the-registry"


def error_of(conn, query, *args) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, args or None).fetchall()
    return info.value


def text_of(e: psycopg.Error) -> str:
    d = e.diag
    return " | ".join(filter(None, [d.message_primary, d.message_detail, d.message_hint,
                                    d.context]))


def key_traces(key: str) -> list[str]:
    """What of a key must not be in a text: the key in either case, and
    any 12 hex digits of it (a part of a key is a leak too)."""
    traces = {key, key.upper()}
    for i in range(0, len(key) - 11, 4):
        traces |= {key[i:i + 12], key[i:i + 12].upper()}
    return sorted(traces)


def leaked_keys(text: str, keys=KEYS) -> list[str]:
    return [t for k in keys for t in key_traces(k) if t in text]


def make_roles(c) -> None:
    """alice: an ordinary role; mon: a member of pg_monitor (and so of
    pg_read_all_settings and pg_read_all_stats)."""
    c.sql("CREATE ROLE alice LOGIN")
    c.sql("CREATE ROLE mon LOGIN IN ROLE pg_monitor")


# ------------------------------------------------------------ the registry
REGISTRIES_WITH_PASSWORDS = {
    "keyword": f"host=127.0.0.1 port=5432 dbname=postgres user=app password={PASSWORD}",
    "quoted keyword": f"host=127.0.0.1 dbname=postgres password = '{PASSWORD} x'",
    "URI": f"postgresql://app:{PASSWORD}@127.0.0.1:5432/postgres",
    "URI parameter": f"postgresql://app@127.0.0.1/postgres?sslmode=disable&password={PASSWORD}",
    "sslpassword": f"host=127.0.0.1 dbname=postgres sslpassword={PASSWORD}",
}


def test_a_password_in_the_registry_setting_refuses_the_start_without_showing_it(
        make_cluster):
    c = make_cluster(start=False)
    for what, registry in REGISTRIES_WITH_PASSWORDS.items():
        c.configure(**{"snowflake_id.registry": registry})
        mark = c.log_mark()
        with pytest.raises(ClusterError):
            c.start(timeout=20)
        assert not c.is_running()
        log = c.log(since=mark)
        fatal = next(l for l in log.splitlines() if "FATAL:" in l)
        assert 'invalid value for parameter "snowflake_id.registry"' in fatal, (what, log)
        assert "holds a password" in fatal and "harness.conf" in log, (what, log)
        hint = next(l for l in log.splitlines() if "HINT:" in l and "passfile" in l
                    or "HINT:" in l and "sslkey" in l)
        assert ("passfile" in hint) != (what == "sslpassword"), (what, hint)
        assert PASSWORD not in log and PASSWORD[:8] not in log, (what, log)

    # Without the password (libpq reads it from a passfile), it starts.
    c.configure(**{"snowflake_id.registry":
                   f"host=127.0.0.1 port={free_port()} dbname=postgres"
                   f" passfile={c.dir}/pgpass connect_timeout=2"})
    c.start()
    mark = c.log_mark()
    with c.connect() as conn:
        for what, registry in REGISTRIES_WITH_PASSWORDS.items():
            e = error_of(conn, "ALTER SYSTEM SET snowflake_id.registry = "
                         + "'" + registry.replace("'", "''") + "'")
            assert e.sqlstate == "22023", (what, e)
            assert "holds a password" in e.diag.message_primary, (what, text_of(e))
            assert PASSWORD not in text_of(e), (what, text_of(e))
            if what != "sslpassword":
                assert "passfile" in e.diag.message_hint, (what, text_of(e))
        # The Citus coordinator's options are a connection string too.
        e = error_of(conn, "ALTER SYSTEM SET snowflake_id.registry_options = "
                     f"'user=snowflake_lease sslmode=require password={PASSWORD}'")
        assert e.sqlstate == "22023" and "holds a password" in e.diag.message_primary, e
        assert "passfile" in e.diag.message_hint and PASSWORD not in text_of(e), text_of(e)
        # Nothing was written to postgresql.auto.conf.
        auto = conn.execute("SELECT pg_read_file('postgresql.auto.conf')").fetchone()[0]
        assert PASSWORD not in auto and "snowflake_id.registry" not in auto
    # The refused statements are not in the log either (PostgreSQL logs a
    # failed statement's text by default: log_min_error_statement).
    log = c.log(since=mark)
    assert 'invalid value for parameter "snowflake_id.registry"' in log
    assert PASSWORD not in log and PASSWORD[:8] not in log, log


def test_the_registry_is_named_in_errors_only_to_roles_that_may_read_it(make_cluster):
    """An unreachable registry: snowflake_nextval() fails with 55000. For a
    superuser and a pg_monitor member (pg_read_all_settings) the error
    names the registry, as SHOW and snowflake_config() do; for an ordinary
    role it names neither the host, the port nor the database, nor holds
    the lease worker's last problem (which names them), and still says
    what is wrong and what to check."""
    port = free_port()
    registry = f"host=127.0.0.1 port={port} dbname=fleet_registry_db connect_timeout=2"
    c = make_cluster(settings={"snowflake_id.registry": registry,
                               "snowflake_id.lease_time": "6s"})
    c.create_extension()
    make_roles(c)
    traces = [str(port), "127.0.0.1", "fleet_registry_db"]
    wait_until(lambda: c.scalar("SELECT registry_unreachable_since IS NOT NULL"
                                " FROM snowflake_config()"),
               timeout=60, what="the registry to be known unreachable")
    for user, privileged in (("postgres", True), ("mon", True), ("alice", False)):
        with c.connect(user=user) as conn:
            e = error_of(conn, "SELECT snowflake_nextval()")
            assert e.sqlstate == "55000", (user, e)
            text = text_of(e)
            assert "no worker id is leased" in e.diag.message_primary, (user, text)
            assert "snowflake_id.registry" in e.diag.message_hint, (user, text)
            shown = conn.execute("SELECT registry FROM snowflake_config()").fetchone()[0]
            if privileged:
                assert "fleet_registry_db" in e.diag.message_primary, (user, text)
                assert "fleet_registry_db" in shown, (user, shown)
                assert conn.execute("SHOW snowflake_id.registry").fetchone()[0] == registry
            else:
                assert not [t for t in traces if t in text], (user, text)
                assert "hidden" in e.diag.message_primary, (user, text)
                assert "Last problem" not in text, (user, text)
                assert shown is None
                assert error_of(conn, "SHOW snowflake_id.registry").sqlstate == "42501"
                rows = str(conn.execute("SELECT * FROM pg_settings"
                                        " WHERE name LIKE 'snowflake_id.%'").fetchall())
                assert not [t for t in traces if t in rows], (user, rows)


# ------------------------------------------------------- the public key file
def test_the_key_file_must_be_the_server_users_alone(make_cluster):
    """As PostgreSQL checks ssl_key_file: a file that others may read
    refuses the start, naming the file and the permissions it needs; after
    a reload, each call fails (42501, 58P01, 22023) until the file is fixed,
    and the postmaster warns at once. Never an internal error, never a key
    in a message, the file's name only to roles that may read the setting."""
    c = make_cluster(start=False)
    path = write_key_file(c, KEY_A + "\n", mode=0o644)
    c.configure(**{"snowflake_id.public_key_file": path})
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    log = c.log(since=mark)
    fatal = next(l for l in log.splitlines() if "FATAL:" in l)
    assert f'public key file "{path}" has group or world access' in fatal, log
    assert "0600" in log and "mode 0644" in log, log
    assert not leaked_keys(log), log

    os.chmod(path, 0o600)
    c.start()
    c.create_extension()
    make_roles(c)
    tok = c.scalar("SELECT snowflake_to_public(12345)")
    assert tok == "5JSKRPW5Y4TSWA"  # docs/guides/public-ids.md's token under KEY_A

    def broken(make_broken, sqlstate: str, says: str) -> None:
        mark = c.log_mark()
        make_broken()
        for user in ("postgres", "mon", "alice"):
            with c.connect(user=user) as conn:
                for q in ("SELECT snowflake_to_public(1)",
                          f"SELECT snowflake_from_public('{tok}')"):
                    e = error_of(conn, q)
                    assert e.sqlstate == sqlstate, (user, says, e)
                    text = text_of(e)
                    assert says in text, (user, says, text)
                    assert e.diag.message_hint, (user, says, text)
                    assert not leaked_keys(text), (user, text)
                    assert (path in text) == (user != "alice"), (user, text)
        c.wait_for_log(r"WARNING:  .*" + re.escape(says), since=mark)
        assert not leaked_keys(c.log(since=mark))

    def chmod(mode):
        def f():
            os.chmod(path, mode)
            c.reload()
        return f

    broken(chmod(0o640), "42501", "has group or world access")
    broken(chmod(0o604), "42501", "has group or world access")

    def remove():
        os.rename(path, path + ".away")
        c.reload()
    broken(remove, "58P01", "No such file or directory")
    os.rename(path + ".away", path)

    def bad_content():
        write_key_file(c, KEY_B[:30] + "\n" + KEY_A + "\n")
        c.reload()
    broken(bad_content, "22023", "key 1 has 30 characters")

    def directory():
        os.rename(path, path + ".away")
        os.mkdir(path)
        c.reload()
    broken(directory, "22023", "is not a regular file")
    os.rmdir(path)
    os.rename(path + ".away", path)
    write_key_file(c, KEY_A + "\n")

    if AS_ROOT:
        uid, gid = pg_ids()

        def other_owner():
            # Owned by nobody; the server reads it through its group.
            os.chown(path, 65534, gid)
            os.chmod(path, 0o640)
            c.reload()
        broken(other_owner, "42501", "must be owned by the database server's OS user or root")
        os.chmod(path, 0o600)

        def root_only():
            os.chown(path, 0, 0)  # root may own it, but then postgres cannot read it
            c.reload()
        broken(root_only, "42501", "Permission denied")
        os.chown(path, uid, gid)

    # Fixed: the next call reads it again, even without a reload.
    with c.connect(user="alice") as conn:
        assert conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0] == tok
    assert "PANIC" not in c.log() and "XX000" not in c.log()


def test_a_relative_key_file_is_in_the_data_directory(make_cluster):
    c = make_cluster(start=False)
    path = write_key_file(c, KEY_A)
    shutil.move(path, os.path.join(c.datadir, "snowflake_public_keys"))
    c.configure(**{"snowflake_id.public_key_file": "snowflake_public_keys"})
    c.start()
    c.create_extension()
    assert c.scalar("SELECT snowflake_to_public(12345)") == "5JSKRPW5Y4TSWA"


def test_rotations_through_the_file_leave_no_key_in_the_log(make_cluster):
    """Keys rotated through the file and reloads, with every message
    logged (DEBUG5, every statement, every error's statement) and bad files
    in between: not one log line holds any part of a key."""
    c = keyed_cluster(make_cluster, KEY_A, settings={
        "log_min_messages": "debug5",
        "log_min_error_statement": "debug5",
        "log_statement": "all",
        "log_connections": True,
    })
    make_roles(c)
    rotations = [
        f"{KEY_A}\n",
        f"{KEY_B}\n{KEY_A}\n",     # the new key first, the old one still read
        f"# keys\n{KEY_B}\n",      # the old key gone
        f"{KEY_C}, {KEY_B}\n",
        f"{KEY_C}\n{KEY_C[:31]}\n",  # a bad key: refused, and not logged
        f"{KEY_C}\n",
    ]
    ids = list(range(1, 2001, 97))
    with c.connect() as su, c.connect(user="mon") as mon, c.connect(user="alice") as alice:
        for i, text in enumerate(rotations):
            write_key_file(c, text)
            reload_session(su, mon, alice)
            for conn in (su, mon, alice):
                try:
                    toks = [r[0] for r in conn.execute(
                        "SELECT snowflake_to_public(id) FROM unnest(%s::bigint[]) id",
                        (ids,)).fetchall()]
                    back = [r[0] for r in conn.execute(
                        "SELECT snowflake_from_public(t) FROM unnest(%s::text[]) t",
                        (toks,)).fetchall()]
                    assert back == ids
                except psycopg.errors.InvalidParameterValue as e:
                    assert i == 4, (i, e)  # only the bad file
                    assert not leaked_keys(text_of(e))
                for q in ("SHOW ALL", "SELECT * FROM pg_settings",
                          "SELECT * FROM pg_stat_activity"):
                    assert not leaked_keys(str(conn.execute(q).fetchall())), q
        # Parallel workers read the file too; their log lines as well.
        su.execute("SET parallel_setup_cost = 0")
        su.execute("SET min_parallel_table_scan_size = 0")
        force = "debug_parallel_query" if su.info.server_version >= 160000 \
            else "force_parallel_mode"
        su.execute(f"SET {force} = on")
        su.execute("SELECT snowflake_to_public(g) FROM generate_series(1, 1000) g").fetchall()
    c.restart()
    c.scalar("SELECT snowflake_to_public(1)")
    log = c.log()
    assert "DEBUG" in log and "snowflake_to_public" in log  # everything was logged
    leaks = leaked_keys(log)
    assert not leaks, [l for l in log.splitlines() if any(t in l for t in leaks)][:5]


def test_monitoring_and_ordinary_roles_read_no_key_or_password_anywhere(make_cluster):
    """pg_monitor reads settings, statistics and the activity of others:
    none of it holds a key or a password, and it cannot read the key file."""
    c = keyed_cluster(make_cluster, f"{KEY_A}\n{KEY_B}\n", settings={
        "snowflake_id.registry":
            f"host=127.0.0.1 port={free_port()} dbname=postgres connect_timeout=2"})
    path = c.settings["snowflake_id.public_key_file"]
    make_roles(c)
    with c.connect() as su:
        # A superuser trying the old ways: refused, and nothing remains.
        error_of(su, f"ALTER SYSTEM SET snowflake_id.public_key = '{KEY_C}'")
        error_of(su, "ALTER SYSTEM SET snowflake_id.registry = "
                 f"'host=127.0.0.1 dbname=postgres password={PASSWORD}'")
        su.execute("SELECT snowflake_to_public(1)")
    secrets = [PASSWORD, PASSWORD[:8]]
    for user in ("mon", "alice"):
        with c.connect(user=user) as conn:
            for q in ("SHOW ALL", "SELECT * FROM pg_settings",
                      "SELECT * FROM pg_stat_activity",
                      "SELECT * FROM snowflake_config()",
                      "SELECT * FROM pg_db_role_setting"):
                rows = str(conn.execute(q).fetchall())
                assert not leaked_keys(rows) and not [s for s in secrets if s in rows], (user, q)
            for name in ("snowflake_id.registry", "snowflake_id.public_key_file",
                         "snowflake_id.public_key"):
                try:
                    value = str(conn.execute(f"SELECT current_setting('{name}')").fetchone())
                except psycopg.errors.InsufficientPrivilege:
                    assert user == "alice"
                    continue
                assert not leaked_keys(value) and PASSWORD not in value, (user, name)
            for q in (f"SELECT pg_read_file('{path}')",
                      "SELECT pg_read_file('postgresql.auto.conf')",
                      f"COPY (SELECT 1) TO PROGRAM 'cat {path}'"):
                e = error_of(conn, q)
                assert e.sqlstate == "42501", (user, q, e)
                assert not leaked_keys(text_of(e)), (user, q)
    log = c.log()
    assert not leaked_keys(log) and PASSWORD not in log, log
