"""Public IDs: snowflake_to_public() / snowflake_from_public().

Real servers, one per case: round trips of 1,000,000 consecutive IDs per
preset layout and of each layout's extreme IDs; the tokens hide the IDs'
order and bits; every kind of bad token is 22P02; no key is 55000; key
rotation; and no role but the server's OS user can read the key. The keys
are in the file of snowflake_id.public_key_file (the file's own
checks and the server log are in tests/settings/test_secrets.py).
"""
from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import errors as pgerr

from harness import ClusterError
from helpers import keyed_cluster, reload_session, write_key_file

# The keys of core/src/public_id.rs's unit tests; their tags differ (tested there).
KEY_A = "000102030405060708090a0b0c0d0e0f"
KEY_B = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
# Same 5-bit tag as KEY_A (found by the unit test
# keys_with_same_tag_are_refused...): cannot be listed with KEY_A.
KEY_SAME_TAG_AS_A = "000102030405060708090a0b0c0d0e34"

# A key that is never configured: what the tests try to set in its place.
KEY_OTHER = "c0ffee00c0ffee00c0ffee00c0ffee00"

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
TOKEN_RE = {63: re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{13}$"),
            53: re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{11}$")}
PRESET_BITS = {"classic": 63, "sonyflake": 63, "js53": 53}


# --- the check character, as documented (to build tokens the server must refuse)
def gf32_mul(a: int, b: int) -> int:
    p = 0
    while b:
        if b & 1:
            p ^= a
        b >>= 1
        a <<= 1
        if a & 0x20:
            a ^= 0x25
    return p


WEIGHTS = []
_w = 2
for _ in range(14):
    WEIGHTS.append(_w)
    _w = gf32_mul(_w, 2)


def payload_sum(payload: str) -> int:
    s = 0
    for i, ch in enumerate(payload):
        s ^= gf32_mul(WEIGHTS[i], ALPHABET.index(ch))
    return s


def tag_of(token: str) -> int:
    """The key tag a valid token carries."""
    return payload_sum(token[:-1]) ^ ALPHABET.index(token[-1])


def with_check(payload: str, tag: int) -> str:
    return payload + ALPHABET[payload_sum(payload) ^ tag]


def token_value(token: str) -> int:
    v = 0
    for ch in token[:-1]:
        v = v << 5 | ALPHABET.index(ch)
    return v


def sqlstate_of(conn, query, *args) -> str | None:
    try:
        conn.execute(query, args or None).fetchall()
    except psycopg.Error as e:
        return e.sqlstate
    return None


def error_of(conn, query, *args) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, args or None).fetchall()
    return info.value


TRY_FROM_PUBLIC = """
CREATE FUNCTION try_from_public(t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN snowflake_from_public(t)::text;
EXCEPTION WHEN others THEN
    RETURN 'ERROR ' || SQLSTATE;
END $$;
"""


@pytest.fixture
def keyed(make_cluster):
    return keyed_cluster(make_cluster, KEY_A)


# ------------------------------------------------------------- round trips
@pytest.mark.parametrize("preset", ["classic", "sonyflake", "js53"])
def test_round_trip_a_million_ids_and_the_extremes(make_cluster, preset):
    # sonyflake makes 25,600 IDs a second per backend and js53 64,000: an
    # hour of borrowed ticks lets the million come at CPU speed.
    c = keyed_cluster(make_cluster, KEY_A, settings={"snowflake_id.layout": preset,
                                                     "snowflake_id.max_drift": "1h"})
    bits = PRESET_BITS[preset]
    with c.connect() as conn:
        n, ok, distinct, bad_shape, increasing = conn.execute("""
            WITH ids AS (SELECT id, row_number() OVER () AS i
                           FROM snowflake_nextvals(1000000) id),
                 t AS (SELECT id, i, snowflake_to_public(id) AS tok FROM ids)
            SELECT count(*),
                   count(*) FILTER (WHERE snowflake_from_public(tok) = id),
                   count(DISTINCT tok),
                   count(*) FILTER (WHERE tok !~ %s),
                   bool_and(id > coalesce(prev, -1))
              FROM (SELECT *, lag(id) OVER (ORDER BY i) AS prev FROM t) s
            """, (TOKEN_RE[bits].pattern,)).fetchone()
        assert (n, ok, distinct, bad_shape) == (1_000_000, 1_000_000, 1_000_000, 0)
        assert increasing  # consecutive IDs from one backend

        max_id, max_worker, max_seq = conn.execute(
            "SELECT max_id, max_worker_id, max_sequence FROM snowflake_layout()").fetchone()
        assert max_id == 2 ** bits - 1
        extremes = [0, 1, 2, max_id // 2, max_id - 1, max_id, max_worker, max_seq]
        rows = conn.execute(
            "SELECT id, snowflake_to_public(id), snowflake_from_public(snowflake_to_public(id))"
            " FROM unnest(%s::bigint[]) id", (extremes,)).fetchall()
        for id_, tok, back in rows:
            assert back == id_ and TOKEN_RE[bits].match(tok), (id_, tok)
        # Same ID, same key: same token, in another session too.
        again = c.scalar("SELECT snowflake_to_public(%s)", max_id)
        assert again == rows[5][1]
        # Beyond the layout is 22003, as for the decoders.
        for beyond in [-1, max_id + 1] if bits < 63 else [-1, -(2 ** 63)]:
            assert sqlstate_of(conn, "SELECT snowflake_to_public(%s)", beyond) == "22003"


# ------------------------------------------------------------------ hiding
def test_tokens_hide_order_and_bits(keyed):
    with keyed.connect() as conn:
        rows = conn.execute("""
            SELECT id, snowflake_to_public(id) FROM snowflake_nextvals(100000) id
            """).fetchall()
        ids = [r[0] for r in rows]
        assert ids == sorted(ids) and len(set(ids)) == 100_000
        # Spearman's rank correlation = Pearson's over the ranks.
        spearman = conn.execute("""
            WITH t AS (SELECT id, snowflake_to_public(id) AS tok
                         FROM unnest(%s::bigint[]) id),
                 r AS (SELECT rank() OVER (ORDER BY id) AS ri,
                              rank() OVER (ORDER BY tok COLLATE "C") AS rt FROM t)
            SELECT corr(ri, rt) FROM r
            """, (ids,)).fetchone()[0]
        # 1/sqrt(n) = 0.0032 for unrelated orders: +-0.01 is about 3 sigma.
        assert abs(spearman) <= 0.01, spearman

        values = [token_value(r[1]) for r in rows]
        flips = [bin(a ^ b).count("1") for a, b in zip(values, values[1:])]
        mean = sum(flips) / len(flips)
        # 63-bit values: a random pair differs in 31.5 bits, and the mean of
        # 99,999 pairs has a standard deviation of 0.013.
        assert 31.3 <= mean <= 31.7, mean
        # The raw IDs, by contrast, differ in very few bits.
        raw = sum(bin(a ^ b).count("1") for a, b in zip(ids, ids[1:])) / (len(ids) - 1)
        assert raw < 4, raw

        # Another key gives other tokens for the same IDs (all of them).
        write_key_file(keyed, KEY_B)
        first = rows[0][1]
        reload_session(conn)
        under_b = conn.execute("SELECT snowflake_to_public(id) FROM unnest(%s::bigint[]) id",
                               (ids[:10000],)).fetchall()
        assert all(b[0] != a[1] for a, b in zip(rows, under_b))
        assert tag_of(under_b[0][0]) != tag_of(first)


# --------------------------------------------------------------- bad input
def test_bad_tokens_are_22P02_never_a_wrong_id(make_cluster):
    c = keyed_cluster(make_cluster, KEY_A)
    with c.connect() as conn:
        conn.execute(TRY_FROM_PUBLIC)
        id_ = conn.execute("SELECT snowflake_nextval()").fetchone()[0]
        tok = conn.execute("SELECT snowflake_to_public(%s)", (id_,)).fetchone()[0]
        assert conn.execute("SELECT snowflake_from_public(%s)", (tok,)).fetchone()[0] == id_

        # NULL in, NULL out (STRICT).
        assert conn.execute("SELECT snowflake_from_public(NULL), snowflake_to_public(NULL)"
                            ).fetchone() == (None, None)

        # Lower case and Crockford's aliases (I, L -> 1, O -> 0) read the same.
        for variant in {tok.lower(), tok.replace("1", "I"), tok.replace("1", "l"),
                        tok.replace("0", "O"), tok.replace("0", "o")}:
            assert conn.execute("SELECT snowflake_from_public(%s)", (variant,)
                                ).fetchone()[0] == id_, variant

        bad = {
            "empty": "",
            "one short": tok[:-1],
            "one long": tok + "0",
            "far too long": tok * 1000,
            "U": tok[:4] + "U" + tok[5:],
            "hyphen": tok[:4] + "-" + tok[5:],
            "space inside": tok[:4] + " " + tok[5:],
            "leading space": " " + tok[1:],
            "trailing newline": tok[:-1] + "\n",
            "non-ASCII": tok[:4] + "é" + tok[6:],
            "asterisk": tok[:-1] + "*",
            "base64url char": tok[:3] + "_" + tok[4:],
        }
        for what, t in bad.items():
            e = error_of(conn, "SELECT snowflake_from_public(%s)", t)
            assert e.sqlstate == "22P02", (what, e)
            assert "invalid public ID" in e.diag.message_primary
            assert e.diag.message_hint and "14 characters" in e.diag.message_hint, what

        # Every single mistyped character and every swap of two characters.
        variants = []
        for pos in range(len(tok)):
            for ch in ALPHABET:
                if ch != tok[pos]:
                    variants.append(tok[:pos] + ch + tok[pos + 1:])
            for other in range(pos + 1, len(tok)):
                if tok[pos] != tok[other]:
                    s = list(tok)
                    s[pos], s[other] = s[other], s[pos]
                    variants.append("".join(s))
        results = conn.execute("SELECT try_from_public(v) FROM unnest(%s::text[]) v",
                               (variants,)).fetchall()
        assert len(variants) > 400
        assert {r[0] for r in results} == {"ERROR 22P02"}

        # A value wider than the layout, with a check character that matches.
        # Every first character above 7 (G to Z set the 65th bit, which
        # was once shifted out, making a second token for the same ID).
        for first in ALPHABET[8:]:
            wide = with_check(first + tok[1:-1], tag_of(tok))
            e = error_of(conn, "SELECT snowflake_from_public(%s)", wide)
            assert e.sqlstate == "22P02", (first, e)
            assert "wider than the layout" in e.diag.message_detail, (first, e)

        # A token made under another key (tags differ): rejected.
        write_key_file(c, KEY_B)
        reload_session(conn)
        e = error_of(conn, "SELECT snowflake_from_public(%s)", tok)
        assert e.sqlstate == "22P02" and "check character" in e.diag.message_detail
        assert "key this server does not hold" in e.diag.message_detail


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1", "SQL_ASCII"])
def test_bad_tokens_in_any_database_encoding_are_22P02(make_cluster, encoding):
    """Tokens are read as bytes: a character outside ASCII is a bad
    character (not an internal error, as when the text was converted to
    UTF-8 first), and lengths and positions count characters."""
    c = keyed_cluster(make_cluster, KEY_A)
    c.sql(f"CREATE DATABASE enc ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
          " TEMPLATE template0")
    c.create_extension(dbname="enc")
    with c.connect(dbname="enc") as conn:
        tok = conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0]
        if isinstance(tok, bytes):   # psycopg returns bytes in SQL_ASCII
            tok = tok.decode()
        # Literals, not parameters: psycopg sends str as bytea in SQL_ASCII.
        assert conn.execute(f"SELECT snowflake_from_public('{tok}')").fetchone()[0] == 12345
        # 'é' (E9 in LATIN1; in SQL_ASCII, a byte PostgreSQL does not check).
        literal = "convert_from('\\xe9', 'LATIN1')" if encoding != "SQL_ASCII" \
            else "convert_from('\\xff', 'SQL_ASCII')"
        for query, says in [
                (f"SELECT snowflake_from_public('{tok[:-1]}' || {literal})", "character 14"),
                (f"SELECT snowflake_from_public('{tok[:-2]}' || {literal} || 'A')",
                 "character 13"),
                (f"SELECT snowflake_from_public(repeat({literal}, 20))", "20 characters")]:
            e = error_of(conn, query)
            assert e.sqlstate == "22P02", (query, str(e))
            detail = e.diag.message_detail
            detail = detail.decode() if isinstance(detail, bytes) else detail
            assert says in detail, (query, detail)


def test_without_a_key_both_functions_are_55000(make_cluster):
    c = make_cluster(create_extension=True)
    with c.connect() as conn:
        for q in ("SELECT snowflake_to_public(1)",
                  "SELECT snowflake_from_public('00000000000000')"):
            e = error_of(conn, q)
            assert e.sqlstate == "55000", e
            assert "snowflake_id.public_key_file is not set" in e.diag.message_primary
            hint = e.diag.message_hint
            assert "snowflake_id.public_key_file" in hint and "0600" in hint
            assert "reload" in hint and "openssl rand -hex 16" in hint


def test_invalid_keys_are_refused_without_echoing_them(make_cluster):
    """A key file whose text is not a list of keys: every call fails with
    22023, naming the problem by the key's position, never its text; the
    postmaster warns on the reload. Fixed, the keys are in force again."""
    c = keyed_cluster(make_cluster, KEY_A)
    path = c.settings["snowflake_id.public_key_file"]
    tok = c.scalar("SELECT snowflake_to_public(12345)")
    bad_keys = {
        "31 digits": KEY_B[:31],
        "33 digits": KEY_B + "0",
        "not hex": KEY_B[:31] + "g",
        "uuid with hyphens": "f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f",
        "same tag as the first": f"{KEY_A}, {KEY_SAME_TAG_AS_A}",
        "twice": f"{KEY_B}\n{KEY_B}",
        "nine keys": ",".join([KEY_B] * 9),
        "no key": "# keys of public IDs\n",
    }
    with c.connect() as conn:
        for what, key in bad_keys.items():
            mark = c.log_mark()
            write_key_file(c, key + "\n")
            reload_session(conn)
            for q in ("SELECT snowflake_to_public(12345)",
                      f"SELECT snowflake_from_public('{tok}')"):
                e = error_of(conn, q)
                assert e.sqlstate == "22023", (what, e)
                text = " ".join(filter(None, [e.diag.message_primary, e.diag.message_detail,
                                              e.diag.message_hint]))
                assert f'public key file "{path}" does not hold valid keys' \
                    in e.diag.message_primary, (what, text)
                assert KEY_B[:16] not in text and KEY_A[:16] not in text, (what, text)
                assert "32 hex digits" in text, (what, text)
            c.wait_for_log(r"WARNING:  public key file .* does not hold valid keys", since=mark)
            log = c.log(since=mark)
            assert KEY_B[:16] not in log and KEY_A[:16] not in log, (what, log)
        write_key_file(c, f"{KEY_A}, {KEY_SAME_TAG_AS_A}")
        reload_session(conn)
        assert "same tag" in error_of(conn, "SELECT snowflake_to_public(1)").diag.message_primary
        # Fixed, without a restart: the same tokens as before.
        write_key_file(c, KEY_A)
        reload_session(conn)
        assert conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0] == tok


def test_rotation_keeps_old_tokens_resolving(keyed):
    with keyed.connect() as conn, keyed.connect() as other:
        ids = [r[0] for r in conn.execute("SELECT snowflake_nextvals(1000)").fetchall()]
        old = [r[0] for r in conn.execute(
            "SELECT snowflake_to_public(id) FROM unnest(%s::bigint[]) id", (ids,)).fetchall()]
        assert other.execute("SELECT snowflake_to_public(%s)", (ids[0],)).fetchone()[0] == old[0]

        # Step 1: the new key first, the old one after it.
        write_key_file(keyed, f"# rotated\n{KEY_B}\n{KEY_A}\n")
        reload_session(conn)
        new = [r[0] for r in conn.execute(
            "SELECT snowflake_to_public(id) FROM unnest(%s::bigint[]) id", (ids,)).fetchall()]
        assert all(a != b for a, b in zip(old, new))
        back_old = [r[0] for r in conn.execute(
            "SELECT snowflake_from_public(t) FROM unnest(%s::text[]) t", (old,)).fetchall()]
        back_new = [r[0] for r in conn.execute(
            "SELECT snowflake_from_public(t) FROM unnest(%s::text[]) t", (new,)).fetchall()]
        assert back_old == ids and back_new == ids
        # Another session, which had read the old file, has the new keys
        # after the reload too, without a restart.
        reload_session(other)
        assert other.execute("SELECT snowflake_to_public(%s)", (ids[0],)).fetchone()[0] == new[0]

        # Step 2: the old key removed; its tokens no longer resolve.
        write_key_file(keyed, KEY_B)
        reload_session(conn)
        assert sqlstate_of(conn, "SELECT snowflake_from_public(%s)", old[0]) == "22P02"
        assert conn.execute("SELECT snowflake_from_public(%s)", (new[0],)).fetchone()[0] == ids[0]


def test_works_without_preloading_and_in_parallel_workers(make_cluster):
    c = keyed_cluster(make_cluster, KEY_A, preload=False)
    ref = keyed_cluster(make_cluster, KEY_A)
    expected = ref.scalar("SELECT snowflake_to_public(123456789)")
    with c.connect() as conn:
        assert conn.execute("SELECT snowflake_to_public(123456789)").fetchone()[0] == expected
        assert conn.execute("SELECT snowflake_from_public(%s)", (expected,)).fetchone()[0] \
            == 123456789
        # Parallel workers read the leader's key file.
        conn.execute("CREATE TABLE t AS SELECT g::bigint AS id FROM generate_series(1, 100000) g")
        conn.execute("ANALYZE t")
        force = "debug_parallel_query" if conn.info.server_version >= 160000 \
            else "force_parallel_mode"
        conn.execute(f"SET {force} = on")
        conn.execute("SET parallel_setup_cost = 0")
        conn.execute("SET parallel_tuple_cost = 0")
        conn.execute("SET min_parallel_table_scan_size = 0")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT count(*) FROM t WHERE snowflake_from_public(snowflake_to_public(id)) = id"
        ).fetchall())
        assert "Gather" in plan, plan
        assert conn.execute(
            "SELECT count(*) FROM t WHERE snowflake_from_public(snowflake_to_public(id)) = id"
        ).fetchone()[0] == 100000


# --------------------------------------------------------------- privileges
def test_non_superuser_uses_the_functions_but_cannot_read_the_key(make_cluster):
    c = keyed_cluster(make_cluster, f"{KEY_A}\n{KEY_B}\n")
    path = c.settings["snowflake_id.public_key_file"]
    mark = c.log_mark()
    c.sql("CREATE ROLE alice LOGIN")
    c.sql("GRANT CREATE ON SCHEMA public TO alice")
    secrets = [KEY_A, KEY_B, KEY_A.upper(), KEY_B.upper(), KEY_A[:12], KEY_B[:12]]

    def leaks(text) -> bool:
        return any(s in str(text) for s in secrets)

    with c.connect(user="alice") as conn:
        tok = conn.execute("SELECT snowflake_to_public(42)").fetchone()[0]
        assert conn.execute("SELECT snowflake_from_public(%s)", (tok,)).fetchone()[0] == 42
        denied = [
            "SHOW snowflake_id.public_key_file",
            "SELECT current_setting('snowflake_id.public_key_file')",
            "SELECT current_setting('snowflake_id.public_key_file', true)",
            "SHOW snowflake_id.public_key",
            "SELECT * FROM pg_file_settings",
            f"SELECT pg_read_file('{path}')",
            f"SELECT pg_read_binary_file('{path}')",
            f"SELECT pg_stat_file('{path}')",
            "SELECT pg_read_file('postgresql.auto.conf')",
            "SELECT pg_read_file('postgresql.conf')",
            "SELECT pg_read_file('harness.conf')",
            f"CREATE TEMP TABLE k AS SELECT 1; COPY k FROM '{path}'",
            "SET snowflake_id.public_key_file = '/tmp/other'",
            "SELECT set_config('snowflake_id.public_key_file', '/tmp/other', false)",
            "ALTER SYSTEM SET snowflake_id.public_key_file = '/tmp/other'",
            "ALTER ROLE alice SET snowflake_id.public_key_file = '/tmp/other'",
            "SET snowflake_id.public_key = '" + KEY_OTHER + "'",
            "ALTER SYSTEM SET snowflake_id.public_key = '" + KEY_OTHER + "'",
            "COPY (SELECT 1) TO PROGRAM 'cat postgresql.conf'",
        ]
        for q in denied:
            try:
                rows = conn.execute(q).fetchall()
            except psycopg.Error as e:
                assert not leaks(e), (q, e)
                continue
            pytest.fail(f"{q} did not fail: {rows}")
        # Views every role can read show nothing of it.
        for q in ("SELECT * FROM pg_settings",
                  "SELECT * FROM pg_settings WHERE name LIKE 'snowflake_id.public%'",
                  "SELECT * FROM pg_db_role_setting",
                  "SELECT pg_catalog.pg_settings_get_flags('snowflake_id.public_key_file')",
                  "SELECT * FROM pg_stat_activity"):
            try:
                rows = conn.execute(q).fetchall()
            except pgerr.UndefinedFunction:  # pg_settings_get_flags is 15+
                continue
            assert not leaks(rows), q
        show_all = conn.execute("SHOW ALL").fetchall()
        assert not leaks(show_all)

    # A superuser sees the file's name through SQL, not the keys, and cannot
    # park a setting in pg_db_role_setting (sighup settings are refused there).
    with c.connect() as conn:
        assert conn.execute("SHOW snowflake_id.public_key_file").fetchone()[0] == path
        assert conn.execute("SHOW snowflake_id.public_key").fetchone()[0] == ""
        assert not leaks(conn.execute("SHOW ALL").fetchall())
        assert not leaks(conn.execute("SELECT * FROM pg_settings").fetchall())
        for q in ("ALTER DATABASE postgres SET snowflake_id.public_key_file = '/tmp/other'",
                  "ALTER ROLE alice SET snowflake_id.public_key_file = '/tmp/other'"):
            assert sqlstate_of(conn, q) == "55P02", q
        # A reload, errors and normal use: nothing of the key in the server log.
        reload_session(conn)
        sqlstate_of(conn, "SELECT snowflake_from_public('garbage')")
        conn.execute("SELECT snowflake_to_public(id) FROM snowflake_nextvals(10) id")
    c.restart()
    c.scalar("SELECT snowflake_to_public(1)")
    log = c.log(since=mark)
    assert not leaks(log), log


def test_without_any_preloading_no_role_reads_a_key(make_cluster):
    """Before 0.4.0, PostgreSQL kept a key in snowflake_id.public_key as a
    plain placeholder that every role could SHOW until the library loaded
    (the documentation of 0.3 warned). The setting now names a file: a role sees at most
    the file's name before the library loads, and never the keys."""
    for session_preload in (False, True):
        settings = {"session_preload_libraries": "snowflake_id"} if session_preload else {}
        c = keyed_cluster(make_cluster, KEY_A, settings=settings, preload=False)
        path = c.settings["snowflake_id.public_key_file"]
        c.sql("CREATE ROLE alice LOGIN")
        with c.connect(user="alice") as conn:
            state = sqlstate_of(conn, "SHOW snowflake_id.public_key_file")
            if session_preload:
                assert state == "42501"
            else:
                assert state is None
                assert conn.execute("SHOW snowflake_id.public_key_file").fetchone()[0] == path
            assert sqlstate_of(conn, f"SELECT pg_read_file('{path}')") == "42501"
            conn.execute("SELECT snowflake_to_public(1)")  # loads the library
            assert sqlstate_of(conn, "SHOW snowflake_id.public_key_file") == "42501"
            for q in ("SHOW ALL", "SELECT * FROM pg_settings"):
                assert KEY_A[:12] not in str(conn.execute(q).fetchall()), q
        c.stop()


def test_the_removed_public_key_setting_is_refused_without_showing_it(make_cluster):
    """snowflake_id.public_key (before 0.4.0) is refused wherever it is set:
    at start, on a reload and by ALTER SYSTEM, with a hint naming
    snowflake_id.public_key_file, and never echoing the value."""
    c = make_cluster(settings={"snowflake_id.public_key": KEY_A}, start=False)
    mark = c.log_mark()
    with pytest.raises(ClusterError):
        c.start(timeout=20)
    assert not c.is_running()
    log = c.log(since=mark)
    fatal = next(l for l in log.splitlines() if "FATAL:" in l)
    assert 'parameter "snowflake_id.public_key" is no longer supported' in fatal, log
    assert "snowflake_id.public_key_file" in log and "harness.conf" in log, log
    assert KEY_A[:12] not in log, log
    # Moved into a file, the server starts and makes the same tokens as
    # before (the token of 12345 under this key in docs/guides/public-ids.md).
    c.settings.pop("snowflake_id.public_key")
    c.configure(**{"snowflake_id.public_key_file": write_key_file(c, KEY_A)})
    c.start()
    c.create_extension()
    assert c.scalar("SELECT snowflake_to_public(12345)") == "5JSKRPW5Y4TSWA"
    # On a reload: refused in the log, the keys of the file stay in force.
    mark = c.log_mark()
    c.configure(**{"snowflake_id.public_key": KEY_B})
    c.reload()
    c.wait_for_log(r'parameter "snowflake_id.public_key" is no longer supported', since=mark)
    with c.connect() as conn:
        reload_session(conn)
        assert conn.execute("SELECT snowflake_to_public(12345)").fetchone()[0] == "5JSKRPW5Y4TSWA"
    c.settings.pop("snowflake_id.public_key")
    c.configure()
    # By ALTER SYSTEM: 22023 with the hint; the statement is not logged.
    with c.connect() as conn:
        e = error_of(conn, f"ALTER SYSTEM SET snowflake_id.public_key = '{KEY_OTHER}'")
        assert e.sqlstate == "22023", e
        text = " ".join(filter(None, [e.diag.message_primary, e.diag.message_detail,
                                      e.diag.message_hint]))
        assert "no longer supported" in e.diag.message_primary, text
        assert "snowflake_id.public_key_file" in e.diag.message_hint, text
        assert KEY_OTHER[:12] not in text, text
        conn.execute("ALTER SYSTEM RESET snowflake_id.public_key")  # the upgrade step
    log = c.log(since=mark)
    assert KEY_B[:12] not in log and KEY_A[:12] not in log, log
