-- snowflake_id 0.7.0 -> 0.8.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.7.0's install script is kept
-- in tests/upgrade/ for it).
--
-- One section per concern, in this order; each section says what it
-- changes and why.

-- == The registry's decisions in the Rust core (issue 42) ==

-- The registry's rules are in the extension's Rust core
-- (core/src/registry/): the lease functions gather the facts of a call in
-- one query (snowflake_lease_facts), pass them to snowflake_lease_decide
-- (src/sql/leases.rs) and apply the writes it returns
-- (snowflake_lease_call); snowflake_lease_durable waits in PL/pgSQL and
-- decides through snowflake_lease_durable_progress and _decide. Every
-- reply carries a token (snowflake_lease_sign) under the registry's key
-- (token_key: set here, kept from one incarnation to the next); what a
-- request says it saw counts only with a token that verifies, or from a
-- node that holds blocks here (a holder before 0.8.0 sends none). The
-- fleet's layout is fixed by the DBA (snowflake_lease_limits.layout,
-- snowflake_lease_set_limits(layout => ...)), not by a request. The last
-- reserve_blocks free blocks go only to servers that hold none (the lease
-- role's sessions under made-up node ids held 63 of 64 on 0.7.0). A lease
-- call inside a transaction block is refused (snowflake_lease_autocommit):
-- its locks would last as long as its session kept the transaction open.
-- One node per session (snowflake_lease_hello) is decided in the Rust core
-- too (snowflake_lease_hello_decide), and a node's lock is bound to the
-- login role: another role's session on its key is no copy of the server. Each block records the login role
-- of the session that leased or renewed it (holder_role: a 0.7.0 row gets
-- its connected holder's here, or it at its next renewal), and max_blocks_per_role (NULL, no bound, unless
-- the DBA sets it) bounds what the sessions of one role hold: with a login
-- role per server, a leaked credential takes one server's share.
-- The functions whose rules moved are dropped; the others are replaced. The
-- lease role keeps its grants: the functions it calls keep their names
-- and signatures, and the new ones are called by them only.

ALTER TABLE snowflake_lease_registry
    ADD COLUMN token_key text NOT NULL DEFAULT '',
    ADD COLUMN new_key boolean NOT NULL DEFAULT false,
    ADD COLUMN grants bigint NOT NULL DEFAULT 0,
    ADD COLUMN history text[] NOT NULL DEFAULT '{}',
    ADD COLUMN database_oid oid;
ALTER TABLE snowflake_lease_limits ADD COLUMN layout text,
    ADD COLUMN unsigned_evidence boolean NOT NULL DEFAULT false,
    ADD COLUMN reserve_blocks int NOT NULL DEFAULT 8,
    ADD COLUMN max_blocks_per_role int;
ALTER TABLE snowflake_lease_blocks ADD COLUMN holder_role text;
-- The role of each block's holder whose session is connected now: a
-- block passes to a session naming the previous one only under the role
-- it records (another role named a holder's live session and took its
-- block before its first renewal here); a block whose holder is away
-- records none until it renews in its own session.
UPDATE snowflake_lease_blocks b SET holder_role = s.usename
  FROM pg_catalog.pg_stat_activity s
 WHERE b.holder_session = s.pid || ':' || (extract(epoch FROM s.backend_start) * 1000000)::int8;
-- A row from 0.6.0 records no session: the session holding its node's
-- lock (0.6.0's hello took it, and leased only in a session holding it)
-- is its holder's. Not the one holding the block's lock: 0.6.0 leased on
-- when that was taken, and any role may take it (another role's session
-- holding it was recorded, and took the block). A row with none passes
-- to no session naming its node, only once its lease and grace ran out.
UPDATE snowflake_lease_blocks b
   SET holder_session = s.pid || ':' || (extract(epoch FROM s.backend_start) * 1000000)::int8,
       holder_role = s.usename
  FROM pg_catalog.pg_locks l
  JOIN pg_catalog.pg_stat_activity s ON s.pid = l.pid
 WHERE b.holder_session IS NULL AND b.holder_node IS NOT NULL
   AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND ((l.classid::int8 << 32) | l.objid::int8)
       = hashtextextended('snowflake_id node ' || b.holder_node, 0)
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database());
-- Holders of 0.7.0 send no token: what they say they saw keeps counting
-- (from nodes that hold blocks) until the DBA clears unsigned_evidence,
-- once every holder runs 0.8.0.
UPDATE snowflake_lease_limits SET unsigned_evidence = true;
INSERT INTO snowflake_lease_limits (max_lease_ms, max_grace_ms, max_ahead_ms, max_blocks_per_node,
                                    unsigned_evidence)
SELECT 600000, 120000, 720000, 8, true
 WHERE NOT EXISTS (SELECT 1 FROM snowflake_lease_limits)
   AND EXISTS (SELECT 1 FROM snowflake_lease_blocks);

DROP FUNCTION snowflake_id_internal.snowflake_lease_check(jsonb);
DROP FUNCTION snowflake_id_internal.snowflake_lease_promotion_proven(int, int);
DROP FUNCTION snowflake_id_internal.snowflake_lease_standbys_behind(text[], pg_lsn);
DROP FUNCTION snowflake_id_internal.snowflake_lease_reply(text, timestamptz, jsonb);
DROP FUNCTION snowflake_lease_set_limits(bigint, bigint, bigint, int);

-- The rules (src/sql/leases.rs).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_decide(call text, request text, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_decide_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_limits_decide(new jsonb, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_limits_decide_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_forget_decide(how text, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_forget_decide_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable_progress(facts jsonb)
RETURNS jsonb IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_durable_progress_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable_decide(facts jsonb)
RETURNS jsonb IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_durable_decide_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_sign(key text, incarnation text, lsn pg_lsn, grants bigint)
RETURNS text VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_sign_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_data_key()
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_data_key_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_kept()
RETURNS jsonb VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_kept_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_keep(candidates jsonb)
RETURNS void VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_keep_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_anew(timeline int, now_ms bigint)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_anew_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_autocommit()
RETURNS void VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_autocommit_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_hello_decide(facts jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_hello_decide_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_lease_node_keys(node text, role text)
RETURNS bigint[] VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_node_keys_wrapper';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_decide(text, text, jsonb, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_forget_decide(text, jsonb, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_limits_decide(jsonb, jsonb, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable_progress(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable_decide(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_sign(text, text, pg_lsn, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_data_key() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_kept() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_keep(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_anew(integer, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_autocommit() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_hello_decide(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_node_keys(text, text) FROM PUBLIC;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_hello_decide(jsonb) IS
  'Used by snowflake_lease_hello: one node per session (core/src/registry/hello.rs), refused with 54000; the slot of the node''s keys to take (null when a session of its role holds one) and the sessions of other roles to end.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_node_keys(text, text) IS
  'Used by the lease functions: a node''s advisory-lock keys for a login role, under the data directory''s key and this postmaster''s start.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_decide(text, text, jsonb, jsonb) IS
  'Used by the lease functions: the registry''s rules (core/src/registry) decide a lease call from its request and the facts gathered, and return the rows to write.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_limits_decide(jsonb, jsonb, jsonb) IS
  'Used by the limits'' trigger: the registry''s rules (core/src/registry/limits.rs) keep a lowered limit bounding fences while grants made under the higher one may run.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_forget_decide(text, jsonb, jsonb) IS
  'Used by the lease table''s triggers: the registry''s rules (core/src/registry) for rows deleted, truncated or restored: a new, fenced incarnation.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_durable_progress(jsonb) IS
  'Used by snowflake_lease_durable while it waits: the synchronous standbys that flushed, and the failover candidates behind.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_durable_decide(jsonb) IS
  'Used by snowflake_lease_durable: whether a grant is durable, and the failover candidates'' row after it.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_sign(text, text, pg_lsn, bigint) IS
  'Used by the lease functions: the registry''s token for an incarnation, WAL position and grant count.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_data_key() IS
  'Used when the registry''s row is made: the data directory''s token key (snowflake_id.key), made when missing.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_kept() IS
  'Used by snowflake_lease_durable: the last failover candidates'' row this data directory wrote (snowflake_id.candidates.<database OID>), or NULL.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_keep(jsonb) IS
  'Used by snowflake_lease_durable: keeps the failover candidates'' row it writes in the data directory (snowflake_id.candidates.<database OID>), durably.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_anew(integer, bigint) IS
  'Used when the failover candidates'' row is made: the members of the last one this data directory wrote, or every standby that may be synchronous (*).';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_autocommit() IS
  'Used by the lease functions: refuses a lease call inside a transaction block, which would hold the registry''s locks while its session waits.';
-- The key of this registry's tokens (no token was issued before): the
-- data directory's, which DROP EXTENSION leaves.
UPDATE snowflake_lease_registry
   SET token_key = snowflake_id_internal.snowflake_lease_data_key()->>'key';

-- What they read, and the calls (as src/sql/leases.sql has them).
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_block_class() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT 1936613751
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_block_class() IS
  'Used by the lease functions: the class of the advisory lock a holder''s session holds on each of its blocks.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_timeline() RETURNS int
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_timeline() IS
  'Used by the lease functions: the WAL timeline this server writes.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_ms(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN pg_catalog.isfinite(t) THEN floor(extract(epoch FROM t) * 1000)::bigint
                WHEN extract(epoch FROM t) < 0 THEN -9223372036854775808
                ELSE 9223372036854775807 END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_ms(timestamptz) IS
  'Used by the lease functions: a time as Unix ms (-infinity and infinity as the least and greatest bigint).';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_time(ms bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE ms WHEN -9223372036854775808 THEN '-infinity'::timestamptz
                   WHEN 9223372036854775807 THEN 'infinity'::timestamptz
                   ELSE pg_catalog.to_timestamp(ms / 1000.0) END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_time(bigint) IS
  'Used by the lease functions: Unix ms as a time (the least and greatest bigint as -infinity and infinity).';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_standby_name() RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                      WHERE f.name = 'snowflake_id.registry_standby_name' AND f.error IS NULL
                      ORDER BY f.seqno DESC LIMIT 1), '')
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_standby_name() IS
  'Used by the lease functions: snowflake_id.registry_standby_name as the configuration files set it.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_history(tli int) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    history text;
    last text[];
BEGIN
    BEGIN
        history := pg_catalog.pg_read_file(format('pg_wal/%s.history', lpad(upper(to_hex(tli)), 8, '0')));
    EXCEPTION WHEN OTHERS THEN
        RAISE LOG 'snowflake_id registry: cannot read the history of timeline % (%): fencing', tli, SQLERRM;
        RETURN NULL;
    END;
    last := string_to_array((SELECT l FROM unnest(string_to_array(btrim(history, E'\n'), E'\n'))
                                   WITH ORDINALITY AS h(l, n) ORDER BY n DESC LIMIT 1), E'\t');
    IF cardinality(last) < 3 OR last[1] !~ '^[0-9]{1,9}$' THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_array(last[1]::bigint, last[2], last[3]);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_history(int) IS
  'Used by the lease functions: the last line of a timeline''s history file (parent, switch point, reason), or NULL.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_candidates_json(members text[], valid_until timestamptz,
                                                                      timeline int, updated_at timestamptz)
RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT jsonb_build_object('members', to_jsonb(members),
                              'valid_until_ms', snowflake_id_internal.snowflake_lease_ms(valid_until),
                              'timeline', timeline,
                              'updated_at_ms', snowflake_id_internal.snowflake_lease_ms(updated_at))
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_json(text[], timestamptz, int, timestamptz) IS
  'Used by the lease functions: the failover candidates'' row as jsonb, times in Unix ms.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_facts(node text) RETURNS jsonb
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    WITH here AS (
        SELECT snowflake_id_internal.snowflake_lease_timeline() AS tli,
               snowflake_id_internal.snowflake_lease_node_keys(node, session_user) AS keys,
               -- The node's key before 0.8.0: a session introduced before
               -- the registry's update. No role's key gives more: any role
               -- may introduce any node under its own.
               hashtextextended('snowflake_id node ' || node, 0) AS legacy,
               snowflake_id_internal.snowflake_lease_block_class()::oid AS class,
               (SELECT d.oid FROM pg_catalog.pg_database d
                 WHERE d.datname = pg_catalog.current_database()) AS db
    ), locks AS (
        SELECT coalesce(bool_or(l.granted AND l.pid = pg_catalog.pg_backend_pid() AND l.objsubid = 1
                                AND ((l.classid::int8 << 32) | l.objid::int8) = ANY (h.keys || h.legacy)), false) AS node_locked,
               coalesce(jsonb_agg(l.objid::int ORDER BY l.objid)
                            FILTER (WHERE l.granted AND l.pid = pg_catalog.pg_backend_pid()
                                      AND l.objsubid = 2 AND l.classid = h.class), '[]') AS locked,
               coalesce(bool_or(l.pid <> pg_catalog.pg_backend_pid() AND l.objsubid = 2
                                AND l.classid = h.class), false) AS others
          FROM here h
          LEFT JOIN pg_catalog.pg_locks l ON l.locktype = 'advisory' AND l.database = h.db
         GROUP BY h.keys, h.legacy, h.class
    ), reg AS (
        SELECT g.* FROM @extschema@.snowflake_lease_registry g LIMIT 1
    )
    SELECT jsonb_build_object(
        'server', jsonb_build_object(
            'now_ms', snowflake_id_internal.snowflake_lease_ms(pg_catalog.now()),
            'timeline', h.tli,
            'insert_lsn', pg_catalog.pg_current_wal_insert_lsn() - '0/0'::pg_lsn,
            'session', snowflake_id_internal.snowflake_lease_session(),
            'postmaster_start_ms', snowflake_id_internal.snowflake_lease_ms(pg_catalog.pg_postmaster_start_time()),
            'database_oid', h.db::bigint,
            'fsync_off', pg_catalog.current_setting('fsync') = 'off',
            'synchronous_commit_off', pg_catalog.current_setting('synchronous_commit') = 'off',
            'node_locked', k.node_locked,
            'locked', k.locked,
            'others_lock_blocks', k.others,
            -- Read only after a timeline change (a promotion to prove).
            'proof', CASE WHEN (SELECT r.timeline FROM reg r) <> h.tli THEN jsonb_build_object(
                'standby_name', snowflake_id_internal.snowflake_lease_standby_name(),
                'candidates', (SELECT snowflake_id_internal.snowflake_lease_candidates_json(
                                          w.members, w.valid_until, w.timeline, w.updated_at)
                                 FROM @extschema@.snowflake_lease_standbys w LIMIT 1),
                'history', snowflake_id_internal.snowflake_lease_history(h.tli)) ELSE '{}' END,
            'fresh_incarnation', md5(gen_random_uuid()::text),
            'fresh_key', md5(gen_random_uuid()::text),
            'role', session_user,
            'client', coalesce('client ' || inet_client_addr()::text, 'local connection')),
        'rows', jsonb_build_object(
            'registry', (SELECT jsonb_build_object(
                'incarnation', r.incarnation, 'timeline', r.timeline,
                'postmaster_start_ms', snowflake_id_internal.snowflake_lease_ms(r.postmaster_start),
                'started_at_ms', snowflake_id_internal.snowflake_lease_ms(r.started_at),
                'fenced_until_ms', snowflake_id_internal.snowflake_lease_ms(r.fenced_until),
                'fence_floor_ms', r.fence_floor_ms, 'max_lease_ms', r.max_lease_ms,
                'max_grace_ms', r.max_grace_ms, 'max_ahead_ms', r.max_ahead_ms, 'cause', r.cause,
                'previous_incarnation', r.previous_incarnation, 'token_key', r.token_key,
                'new_key', r.new_key, 'grants', r.grants, 'history', to_jsonb(r.history),
                'database_oid', r.database_oid::bigint) FROM reg r),
            'blocks', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'block', b.block, 'first_worker_id', b.first_worker_id,
                'last_worker_id', b.last_worker_id, 'layout', b.layout,
                'holder_node', b.holder_node, 'holder_name', b.holder_name,
                'leased_at_ms', snowflake_id_internal.snowflake_lease_ms(b.leased_at),
                'renewed_at_ms', snowflake_id_internal.snowflake_lease_ms(b.renewed_at),
                'expires_at_ms', snowflake_id_internal.snowflake_lease_ms(b.expires_at),
                'grace_ms', floor(extract(epoch FROM b.grace) * 1000)::bigint,
                'high_water_ms', b.high_water_ms,
                'released_at_ms', snowflake_id_internal.snowflake_lease_ms(b.released_at),
                'leases', b.leases, 'floor_ms', b.floor_ms, 'holder_session', b.holder_session,
                'holder_role', b.holder_role)
                ORDER BY b.block), '[]')
                FROM @extschema@.snowflake_lease_blocks b),
            'limits', (SELECT jsonb_build_object(
                'max_lease_ms', l.max_lease_ms, 'max_grace_ms', l.max_grace_ms,
                'max_ahead_ms', l.max_ahead_ms, 'max_blocks_per_node', l.max_blocks_per_node,
                'previous_max_lease_ms', l.previous_max_lease_ms,
                'previous_max_grace_ms', l.previous_max_grace_ms,
                'previous_max_ahead_ms', l.previous_max_ahead_ms,
                'previous_until_ms', snowflake_id_internal.snowflake_lease_ms(l.previous_until),
                'layout', l.layout, 'unsigned_evidence', l.unsigned_evidence,
                'reserve_blocks', l.reserve_blocks, 'max_blocks_per_role', l.max_blocks_per_role)
                FROM @extschema@.snowflake_lease_limits l LIMIT 1)))
      FROM here h, locks k
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_facts(text) IS
  'Used by the lease functions: the facts of a lease call (this server and session, the registry''s rows) as the rules in the extension take them.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_lock_registry() RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    -- A table lock the lease role cannot take: not an advisory one (any
    -- role may take those), and in a mode no statement takes before its
    -- rights are checked. A statement prepared on the table (PREPARE, a
    -- function body, a rule) keeps ROW EXCLUSIVE on it to the end of its
    -- transaction without any right on it, and that conflicts with SHARE ROW
    -- EXCLUSIVE; SHARE UPDATE EXCLUSIVE conflicts with neither it nor ROW
    -- SHARE, but with itself. The registry's other writers (the triggers)
    -- take it too.
    LOCK TABLE @extschema@.snowflake_lease_registry IN SHARE UPDATE EXCLUSIVE MODE
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_lock_registry() IS
  'Used by the lease functions: the transaction lock under which lease calls are decided one at a time.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_reply(answer jsonb, key text, extra jsonb)
RETURNS jsonb
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT jsonb_build_object(
        'incarnation', answer->>'incarnation',
        'lsn', p::text,
        'grants', coalesce((answer->>'grants')::bigint, 0),
        'token', snowflake_id_internal.snowflake_lease_sign(coalesce(key, ''), answer->>'incarnation', p,
                                                            coalesce((answer->>'grants')::bigint, 0)),
        'fenced_until_ms', answer->'fenced_until_ms') || extra
      FROM pg_catalog.pg_current_wal_insert_lsn() p
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_reply(jsonb, text, jsonb) IS
  'Used by the lease functions: the reply with the incarnation, WAL position, token and fence.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_apply(w jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    line text;
BEGIN
    IF jsonb_typeof(w->'registry') = 'object' THEN
        DELETE FROM @extschema@.snowflake_lease_registry;
        INSERT INTO @extschema@.snowflake_lease_registry
               (incarnation, timeline, postmaster_start, started_at, fenced_until, fence_floor_ms,
                max_lease_ms, max_grace_ms, max_ahead_ms, cause, previous_incarnation, token_key, new_key,
                grants, history, database_oid)
        SELECT r.incarnation, r.timeline, snowflake_id_internal.snowflake_lease_time(r.postmaster_start_ms),
               snowflake_id_internal.snowflake_lease_time(r.started_at_ms),
               snowflake_id_internal.snowflake_lease_time(r.fenced_until_ms), r.fence_floor_ms,
               r.max_lease_ms, r.max_grace_ms, r.max_ahead_ms, r.cause, r.previous_incarnation,
               r.token_key, r.new_key, r.grants, coalesce(r.history, '{}'), r.database_oid::oid
          FROM jsonb_to_record(w->'registry') AS r(
               incarnation text, timeline int, postmaster_start_ms bigint, started_at_ms bigint,
               fenced_until_ms bigint, fence_floor_ms bigint, max_lease_ms bigint, max_grace_ms bigint,
               max_ahead_ms bigint, cause text, previous_incarnation text, token_key text, new_key boolean,
               grants bigint, history text[], database_oid bigint);
    END IF;
    IF jsonb_array_length(w->'blocks') > 0 THEN
        -- New rows arrive unleased (a leased row inserted is a restore:
        -- snowflake_lease_blocks_restored), then every row is written.
        INSERT INTO @extschema@.snowflake_lease_blocks (block, first_worker_id, last_worker_id, layout,
                                                        high_water_ms)
        SELECT b.block, b.first_worker_id, b.last_worker_id, b.layout, b.high_water_ms
          FROM jsonb_to_recordset(w->'blocks') AS b(block int, first_worker_id int, last_worker_id int,
                                                  layout text, high_water_ms bigint)
        ON CONFLICT DO NOTHING;
        UPDATE @extschema@.snowflake_lease_blocks t
           SET first_worker_id = b.first_worker_id, last_worker_id = b.last_worker_id,
               layout = b.layout, holder_node = b.holder_node, holder_name = b.holder_name,
               leased_at = snowflake_id_internal.snowflake_lease_time(b.leased_at_ms),
               renewed_at = snowflake_id_internal.snowflake_lease_time(b.renewed_at_ms),
               expires_at = snowflake_id_internal.snowflake_lease_time(b.expires_at_ms),
               grace = b.grace_ms * interval '1 millisecond', high_water_ms = b.high_water_ms,
               released_at = snowflake_id_internal.snowflake_lease_time(b.released_at_ms),
               leases = b.leases, floor_ms = b.floor_ms, holder_session = b.holder_session,
               holder_role = b.holder_role
          FROM jsonb_to_recordset(w->'blocks') AS b(
               block int, first_worker_id int, last_worker_id int, layout text, holder_node text,
               holder_name text, leased_at_ms bigint, renewed_at_ms bigint, expires_at_ms bigint,
               grace_ms bigint, high_water_ms bigint, released_at_ms bigint, leases bigint,
               floor_ms bigint, holder_session text, holder_role text)
         WHERE t.block = b.block;
    END IF;
    PERFORM pg_catalog.pg_try_advisory_lock(snowflake_id_internal.snowflake_lease_block_class(), b::int)
       FROM jsonb_array_elements_text(w->'lock') b;
    PERFORM pg_catalog.pg_advisory_unlock(snowflake_id_internal.snowflake_lease_block_class(), b::int)
       FROM jsonb_array_elements_text(w->'unlock') b;
    FOR line IN SELECT jsonb_array_elements_text(w->'log') LOOP
        RAISE LOG 'snowflake_id registry: %', line;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_apply(jsonb) IS
  'Used by the lease functions and triggers: writes the rows, locks and log lines the rules in the extension decided.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_call(call text, req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- Its text's size: pg_column_size() would count a compressed value.
    size int := pg_catalog.octet_length(req::text);
    facts jsonb;
    decided jsonb;
BEGIN
    PERFORM snowflake_id_internal.snowflake_lease_autocommit();
    IF size > 65536 THEN
        RAISE LOG 'snowflake_id registry: refused a lease request of % bytes (role %, %)',
            size, session_user, coalesce('client ' || inet_client_addr()::text, 'local connection');
        RAISE EXCEPTION 'lease request of % bytes refused: the limit is 65536', size
            USING ERRCODE = '54000',
                  HINT = 'The snowflake_id lease worker never sends such a request: who called the lease functions by hand?';
    END IF;
    PERFORM snowflake_id_internal.snowflake_lease_lock_registry();
    facts := snowflake_id_internal.snowflake_lease_facts(coalesce(req->>'node', ''));
    decided := snowflake_id_internal.snowflake_lease_decide(call, req::text, facts->'server', facts->'rows');
    PERFORM snowflake_id_internal.snowflake_lease_apply(decided->'writes');
    RETURN snowflake_id_internal.snowflake_lease_reply(
        decided->'answer', (SELECT g.token_key FROM @extschema@.snowflake_lease_registry g LIMIT 1),
        CASE call WHEN 'release' THEN jsonb_build_object('released', coalesce(decided->'answer'->'released', 'false'))
                  ELSE jsonb_build_object('blocks', decided->'answer'->'blocks') END);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_call(text, jsonb) IS
  'Used by the lease functions: one lease call, gathered, decided by the rules in the extension, written and answered.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_standbys_now() RETURNS jsonb
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'application_name', r.application_name, 'sync_state', r.sync_state,
               'flush_lsn', r.flush_lsn - '0/0'::pg_lsn,
               'physical', EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                                    WHERE a.pid = r.pid AND a.datid IS NULL),
               'streaming', r.state = 'streaming',
               'reply_time_ms', snowflake_id_internal.snowflake_lease_ms(r.reply_time))), '[]')
      FROM pg_catalog.pg_stat_replication r
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_standbys_now() IS
  'Used by the lease functions: this server''s WAL senders as the durability rules take them.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    facts jsonb;
    decided jsonb;
    bad text;
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'the registry''s lease limits are changed, not deleted'
            USING ERRCODE = '55000',
                  HINT = 'Set them with snowflake_lease_set_limits(); the defaults are max_lease_ms 600000, max_grace_ms 120000, max_ahead_ms 720000, max_blocks_per_node 8, reserve_blocks 8, max_blocks_per_role none.';
    END IF;
    bad := CASE
        WHEN NEW.max_lease_ms IS NULL OR NEW.max_lease_ms NOT BETWEEN 2000 AND 86400000 THEN
            format('max_lease_ms must be from 2000 to 86400000 (the range of snowflake_id.lease_time), not %s', NEW.max_lease_ms)
        WHEN NEW.max_grace_ms IS NULL OR NEW.max_grace_ms NOT BETWEEN 1000 AND 86400000 THEN
            format('max_grace_ms must be from 1000 to 86400000, not %s', NEW.max_grace_ms)
        WHEN NEW.max_ahead_ms IS NULL OR NEW.max_ahead_ms NOT BETWEEN 0 AND 172800000 THEN
            format('max_ahead_ms must be from 0 to 172800000, not %s', NEW.max_ahead_ms)
        WHEN NEW.max_blocks_per_node IS NULL OR NEW.max_blocks_per_node NOT BETWEEN 1 AND 64 THEN
            format('max_blocks_per_node must be from 1 to 64, not %s', NEW.max_blocks_per_node)
        WHEN NEW.reserve_blocks IS NULL OR NEW.reserve_blocks NOT BETWEEN 0 AND 63 THEN
            format('reserve_blocks must be from 0 to 63, not %s', NEW.reserve_blocks)
        WHEN NEW.max_blocks_per_role NOT BETWEEN 1 AND 64 THEN
            format('max_blocks_per_role must be from 1 to 64, or NULL for no bound, not %s', NEW.max_blocks_per_role)
        END;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'invalid lease limit: %', bad
            USING ERRCODE = '22023',
                  HINT = 'Pass each limit within its range (max_lease_ms 2000 to 86400000, max_grace_ms 1000 to 86400000, max_ahead_ms 0 to 172800000, max_blocks_per_node 1 to 64, reserve_blocks 0 to 63, max_blocks_per_role 1 to 64 or 0 for no bound), or NULL to keep it.';
    END IF;
    NEW.changed_at := now();
    -- The rows as they stand (a BEFORE trigger's query does not see its
    -- row): core/src/registry/limits.rs, changed.
    facts := snowflake_id_internal.snowflake_lease_facts('');
    decided := snowflake_id_internal.snowflake_lease_limits_decide(
        jsonb_build_object('max_lease_ms', NEW.max_lease_ms, 'max_grace_ms', NEW.max_grace_ms,
                           'max_ahead_ms', NEW.max_ahead_ms,
                           'max_blocks_per_node', NEW.max_blocks_per_node),
        facts->'server', facts->'rows');
    NEW.previous_max_lease_ms := (decided->'row'->>'previous_max_lease_ms')::bigint;
    NEW.previous_max_grace_ms := (decided->'row'->>'previous_max_grace_ms')::bigint;
    NEW.previous_max_ahead_ms := (decided->'row'->>'previous_max_ahead_ms')::bigint;
    NEW.previous_until := snowflake_id_internal.snowflake_lease_time(
        (decided->'row'->>'previous_until_ms')::bigint);
    IF (decided->>'kept')::boolean THEN
        RAISE NOTICE 'fences use the higher limits until %: grants made under them may still run',
            NEW.previous_until;
    END IF;
    -- A holder whose lease_time is max_lease_ms asks for more than these.
    IF NEW.max_grace_ms < greatest(NEW.max_lease_ms / 5, 1000) THEN
        RAISE NOTICE 'a holder with snowflake_id.lease_time = % ms asks for a grace of % ms, above max_grace_ms: it is refused',
            NEW.max_lease_ms, greatest(NEW.max_lease_ms / 5, 1000);
    END IF;
    IF NEW.max_ahead_ms < NEW.max_lease_ms + 60000 THEN
        RAISE NOTICE 'a holder with snowflake_id.lease_time = % ms and the default snowflake_id.max_drift (60 s) asks for marks % ms ahead, above max_ahead_ms: it is refused',
            NEW.max_lease_ms, NEW.max_lease_ms + 60000;
    END IF;
    IF NEW.layout = '' THEN
        RAISE EXCEPTION 'invalid lease limit: layout must not be empty' USING ERRCODE = '22023',
            HINT = 'Give the layout the fleet''s holders send (the layout of the rows of snowflake_lease_blocks), or NULL for none fixed.';
    END IF;
    RAISE LOG 'snowflake_id registry: lease limits set by role %: max_lease_ms %, max_grace_ms %, max_ahead_ms %, max_blocks_per_node %, reserve_blocks %, max_blocks_per_role %, layout %',
        session_user, NEW.max_lease_ms, NEW.max_grace_ms, NEW.max_ahead_ms, NEW.max_blocks_per_node,
        NEW.reserve_blocks, coalesce(NEW.max_blocks_per_role::text, '(no bound)'),
        coalesce(NEW.layout, '(not fixed)');
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() IS
  'Trigger: checks a change of snowflake_lease_limits, keeps a lowered limit bounding fences while grants made under the higher one may run, and refuses a DELETE or TRUNCATE.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_begin(req jsonb, OUT incarnation text,
                                                            OUT fenced_until timestamptz,
                                                            OUT locked int[], OUT fence_floor_ms bigint)
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT g.incarnation, CASE WHEN g.fenced_until > pg_catalog.now() THEN g.fenced_until END,
           ARRAY(SELECT l.objid::int FROM pg_catalog.pg_locks l
                  WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_catalog.pg_backend_pid()
                    AND l.objsubid = 2
                    AND l.classid = snowflake_id_internal.snowflake_lease_block_class()::oid
                  ORDER BY l.objid),
           coalesce(g.fence_floor_ms, 0)
      FROM (SELECT 1) one
      LEFT JOIN @extschema@.snowflake_lease_registry g ON true
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) IS
  'The registry''s incarnation and fence as they stand, and this session''s block locks; holders find the lease functions by it.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_acquire(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('acquire', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) IS
  'Called by a holder''s lease worker: leases free or expired blocks of worker ids, least recently used first, up to max_blocks_per_node and keeping reserve_blocks free for servers that hold none, and returns the floor each must start above; none while the registry is fenced.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_renew(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('renew', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) IS
  'Called by a holder''s lease worker: extends its leases and raises their marks (re-asserting them to a new incarnation while fenced); returns the blocks it still holds.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('release', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) IS
  'Called by a holder''s lease worker: returns an idle block, recording the time of the newest ID it issued there (never below the floor it leased the block with).';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_durable(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    wait_ms bigint := least(greatest(coalesce((req->>'wait_ms')::bigint, 0), 0), 5000);
    deadline timestamptz := pg_catalog.clock_timestamp() + wait_ms * interval '1 millisecond';
    tli int := snowflake_id_internal.snowflake_lease_timeline();
    facts jsonb;
    p jsonb;
    d jsonb;
    line text;
BEGIN
    PERFORM snowflake_id_internal.snowflake_lease_autocommit();
    facts := jsonb_build_object(
        'synchronous_standby_names', pg_catalog.current_setting('synchronous_standby_names'),
        'me', snowflake_id_internal.snowflake_lease_standby_name(),
        'target', pg_catalog.pg_current_wal_flush_lsn() - '0/0'::pg_lsn,
        'timeline', tli,
        'incarnation_here', EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_registry g
                                     WHERE g.timeline = tli),
        'candidates', (SELECT snowflake_id_internal.snowflake_lease_candidates_json(
                                  w.members, w.valid_until, w.timeline, w.updated_at)
                         FROM @extschema@.snowflake_lease_standbys w LIMIT 1),
        -- Read only when the row is to be made anew: a damaged file then
        -- refuses that, not every check.
        'kept', CASE WHEN NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_standbys)
                     THEN snowflake_id_internal.snowflake_lease_candidates_kept() END);
    LOOP
        facts := facts || jsonb_build_object(
            'now_ms', snowflake_id_internal.snowflake_lease_ms(pg_catalog.clock_timestamp()),
            'standbys', snowflake_id_internal.snowflake_lease_standbys_now());
        p := snowflake_id_internal.snowflake_lease_durable_progress(facts);
        EXIT WHEN (p->>'done')::boolean OR NOT (facts->>'incarnation_here')::boolean
               OR pg_catalog.clock_timestamp() >= deadline;
        PERFORM pg_catalog.pg_sleep(0.005);
    END LOOP;
    -- The row lock makes this a transaction that writes: its commit waits
    -- for no standby.
    PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    IF (p->>'enough')::boolean AND (facts->>'incarnation_here')::boolean THEN
        facts := facts || jsonb_build_object(
            'candidates', (SELECT snowflake_id_internal.snowflake_lease_candidates_json(
                                      w.members, w.valid_until, w.timeline, w.updated_at)
                             FROM @extschema@.snowflake_lease_standbys w LIMIT 1 FOR UPDATE),
            'now_ms', snowflake_id_internal.snowflake_lease_ms(pg_catalog.clock_timestamp()),
            'standbys', snowflake_id_internal.snowflake_lease_standbys_now());
    END IF;
    d := snowflake_id_internal.snowflake_lease_durable_decide(facts);
    IF jsonb_typeof(d->'write') = 'object' THEN
        -- Kept in the data directory first, for a row made anew
        -- (durability/registry_candidates.rs).
        PERFORM snowflake_id_internal.snowflake_lease_candidates_keep(d->'write');
        -- Not waited for: a row that no candidate received changes nothing
        -- they may conclude (each keeps the older row it has).
        UPDATE @extschema@.snowflake_lease_standbys
           SET members = ARRAY(SELECT jsonb_array_elements_text(d->'write'->'members')),
               valid_until = snowflake_id_internal.snowflake_lease_time((d->'write'->>'valid_until_ms')::bigint),
               timeline = (d->'write'->>'timeline')::int,
               updated_at = snowflake_id_internal.snowflake_lease_time((d->'write'->>'updated_at_ms')::bigint);
        IF NOT FOUND THEN
            -- Deleted by hand: made again.
            INSERT INTO @extschema@.snowflake_lease_standbys (members, valid_until, timeline, updated_at)
            SELECT ARRAY(SELECT jsonb_array_elements_text(d->'write'->'members')),
                   snowflake_id_internal.snowflake_lease_time((d->'write'->>'valid_until_ms')::bigint),
                   (d->'write'->>'timeline')::int,
                   snowflake_id_internal.snowflake_lease_time((d->'write'->>'updated_at_ms')::bigint)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    FOR line IN SELECT jsonb_array_elements_text(d->'log') LOOP
        RAISE LOG 'snowflake_id registry: %', line;
    END LOOP;
    RETURN d->'reply';
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) IS
  'Called by a holder''s lease worker after each grant: whether this session''s commits are flushed on enough synchronous standbys (synchronous_standby_names), and on every failover candidate (snowflake_lease_standbys), that a failover keeps them.';

REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_block_class() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_timeline() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_ms(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_time(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_standby_name() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_history(int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_json(text[], timestamptz, int, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_facts(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_lock_registry() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_reply(jsonb, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_call(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_apply(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_standbys_now() FROM PUBLIC;

CREATE FUNCTION snowflake_lease_set_limits(max_lease_ms bigint DEFAULT NULL,
                                           max_grace_ms bigint DEFAULT NULL,
                                           max_ahead_ms bigint DEFAULT NULL,
                                           max_blocks_per_node int DEFAULT NULL,
                                           layout text DEFAULT NULL,
                                           reserve_blocks int DEFAULT NULL,
                                           max_blocks_per_role int DEFAULT NULL)
RETURNS TABLE (name text, value bigint, fence_value bigint, fence_value_until timestamptz)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    UPDATE @extschema@.snowflake_lease_limits l
       SET max_lease_ms = coalesce($1, l.max_lease_ms), max_grace_ms = coalesce($2, l.max_grace_ms),
           max_ahead_ms = coalesce($3, l.max_ahead_ms),
           max_blocks_per_node = coalesce($4, l.max_blocks_per_node),
           layout = coalesce($5, l.layout), reserve_blocks = coalesce($6, l.reserve_blocks),
           max_blocks_per_role = CASE WHEN $7 IS NULL THEN l.max_blocks_per_role ELSE nullif($7, 0) END
     WHERE num_nonnulls($1, $2, $3, $4, $5, $6, $7) > 0;
    -- The first change: from the defaults.
    INSERT INTO @extschema@.snowflake_lease_limits
           (max_lease_ms, max_grace_ms, max_ahead_ms, max_blocks_per_node, layout, reserve_blocks,
            max_blocks_per_role)
    SELECT coalesce($1, f.max_lease_ms), coalesce($2, f.max_grace_ms),
           coalesce($3, f.max_ahead_ms), coalesce($4, f.max_blocks_per_node), $5, coalesce($6, 8),
           nullif($7, 0)
      FROM snowflake_id_internal.snowflake_lease_limits_in_force() f
     WHERE num_nonnulls($1, $2, $3, $4, $5, $6, $7) > 0
       AND NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_limits);
    SELECT x.name, x.value, x.fence_value, CASE WHEN x.value < x.fence_value THEN f.previous_until END
      FROM snowflake_id_internal.snowflake_lease_limits_in_force() f
     CROSS JOIN LATERAL (SELECT least(greatest(coalesce(l.reserve_blocks, 8), 0), 63)::bigint,
                                CASE WHEN l.max_blocks_per_role IS NOT NULL
                                     THEN least(greatest(l.max_blocks_per_role, 1), 64)::bigint END
                           FROM (SELECT 1) one
                           LEFT JOIN @extschema@.snowflake_lease_limits l ON true) r(blocks, role_blocks)
     CROSS JOIN LATERAL (VALUES ('max_lease_ms', f.max_lease_ms, f.fence_lease_ms),
                                ('max_grace_ms', f.max_grace_ms, f.fence_grace_ms),
                                ('max_ahead_ms', f.max_ahead_ms, f.fence_ahead_ms),
                                ('max_blocks_per_node', f.max_blocks_per_node::bigint,
                                 f.max_blocks_per_node::bigint),
                                ('reserve_blocks', r.blocks, r.blocks),
                                ('max_blocks_per_role', r.role_blocks, r.role_blocks))
                         x(name, value, fence_value)
$fn$;
COMMENT ON FUNCTION snowflake_lease_set_limits(bigint, bigint, bigint, int, text, int, int) IS
  'On a registry: changes the fleet''s limits (each argument given; none: no change) and fixes its layout, and returns the limits in force. No lease request may exceed them; fences rest on them.';
REVOKE EXECUTE ON FUNCTION snowflake_lease_set_limits(bigint, bigint, bigint, int, text, int, int) FROM PUBLIC;

CREATE OR REPLACE VIEW snowflake_leases AS
SELECT b.block, b.first_worker_id, b.last_worker_id, b.holder_node, b.holder_name,
       b.leased_at, b.renewed_at, b.expires_at,
       CASE WHEN b.high_water_ms > 0
            THEN to_timestamp(b.high_water_ms / 1000.0) END AS floor,
       b.holder_node IS NOT NULL AS leased,
       k.pid IS NOT NULL AS live,
       k.pid AS registry_pid,
       b.released_at, b.leases, b.holder_role
  FROM snowflake_lease_blocks b
  LEFT JOIN LATERAL (SELECT l.pid FROM pg_catalog.pg_locks l
                      WHERE l.locktype = 'advisory' AND l.granted
                        AND l.classid = 1936613751::oid AND l.objid = b.block::oid
                        AND l.objsubid = 2 LIMIT 1) k ON true;

-- One node per session also when the session released its node's lock,
-- decided in the Rust core. A node's lock keys are bound to the login role
-- and the postmaster (snowflake_lease_node_keys): a session of another
-- role holding one is ended or passed over, never taken for a copy of the
-- server, and a node has a key more than prepared transactions can hold.
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_hello(node text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    keys bigint[];
    answer jsonb;
    squatter jsonb;
    took boolean := false;
BEGIN
    PERFORM snowflake_id_internal.snowflake_lease_autocommit();
    -- Before the registry's lock: refused (54000) for a node id past
    -- hello::MAX_NODE_BYTES, which would hold it while hashed.
    keys := snowflake_id_internal.snowflake_lease_node_keys(node, session_user);
    PERFORM snowflake_id_internal.snowflake_lease_lock_registry();
    answer := snowflake_id_internal.snowflake_lease_hello_decide(jsonb_build_object(
        'node', node,
        'pid', pg_catalog.pg_backend_pid(),
        'role', session_user,
        'keys', cardinality(keys),
        'other_node_locked', EXISTS (
            SELECT 1 FROM pg_catalog.pg_locks l
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.pid = pg_catalog.pg_backend_pid()
               AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                  WHERE d.datname = pg_catalog.current_database())
               AND NOT ((l.classid::int8 << 32) | l.objid::int8) = ANY (keys)),
        'blocks', (SELECT coalesce(jsonb_agg(jsonb_build_object('block', b.block,
                                                                'holder_node', b.holder_node)
                                             ORDER BY b.block), '[]')
                     FROM @extschema@.snowflake_lease_blocks b
                    WHERE b.holder_session = snowflake_id_internal.snowflake_lease_session()),
        -- Held or awaited, by a session (its role; endable as
        -- pg_terminate_backend would let this function's owner, and not a
        -- superuser's) or a prepared transaction (no pid); slot null: the
        -- node's key before 0.8.0.
        'locks', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                             'slot', k.n - 1, 'pid', l.pid, 'role', s.usename,
                             'endable', NOT coalesce(r.rolsuper, true)
                                 AND (pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')
                                      OR pg_catalog.pg_has_role(current_user, 'pg_signal_backend', 'USAGE')),
                             'granted', l.granted)), '[]')
                    FROM pg_catalog.pg_locks l
                    JOIN (SELECT u.key, u.n FROM unnest(keys) WITH ORDINALITY u(key, n)
                          UNION ALL
                          SELECT hashtextextended('snowflake_id node ' || node, 0), NULL) k
                      ON k.key = ((l.classid::int8 << 32) | l.objid::int8)
                    LEFT JOIN pg_catalog.pg_stat_activity s ON s.pid = l.pid
                    LEFT JOIN pg_catalog.pg_roles r ON r.rolname = s.usename
                   WHERE l.locktype = 'advisory' AND l.objsubid = 1
                     AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                        WHERE d.datname = pg_catalog.current_database())),
        'client', coalesce('client ' || inet_client_addr()::text, 'local connection')));
    -- A key free when looked at is taken before any squatter is ended: a
    -- session waiting behind an ended one (on a lock of its own, which
    -- is no node key) would take it while pg_terminate_backend waits.
    IF answer->'slot' <> 'null' THEN
        took := pg_catalog.pg_try_advisory_lock(keys[(answer->>'slot')::int + 1]);
    END IF;
    -- Sessions that took the keys with pg_advisory_lock (no lease
    -- function does): ended, so that none can gather a node's keys while
    -- its server reconnects.
    FOR squatter IN SELECT * FROM jsonb_array_elements(answer->'end') LOOP
        BEGIN
            IF pg_catalog.pg_terminate_backend((squatter->>'pid')::int, 2000) THEN
                RAISE LOG 'snowflake_id registry: ended session % of role %, which held or waited for a lock of node % of role % (pg_advisory_lock)',
                    squatter->>'pid', squatter->>'role', node, session_user;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
    IF answer->'slot' = 'null' THEN
        RETURN false;
    END IF;
    -- Under the registry's lock no hello takes a key; only a
    -- pg_advisory_lock since the look above, or a squatter not ended, can
    -- hold it now.
    IF NOT took AND NOT pg_catalog.pg_try_advisory_lock(keys[(answer->>'slot')::int + 1]) THEN
        RAISE EXCEPTION 'node % cannot take its lock: a session took the key just now', node
            USING ERRCODE = '55P03',
                  HINT = 'The lease worker tries again; a session that takes advisory locks in the registry''s database is not a lease worker''s.';
    END IF;
    RETURN true;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) IS
  'Called by a holder''s lease worker: takes a session lock of its node id, bound to its login role; false when another live session of that role holds one (a copied data directory). One node per session.';


-- The registry's lock in a mode no statement takes before its rights are
-- checked (a statement prepared on snowflake_lease_registry kept ROW
-- EXCLUSIVE on it and stopped every lease call); the trigger that starts a
-- new incarnation takes it too, after any lease call in progress.
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    facts jsonb;
    removed bigint;
BEGIN
    -- How many rows the statement removed, where known: a DELETE's
    -- transition table; for a TRUNCATE, which fires this before it empties
    -- the table (locked ACCESS EXCLUSIVE: every writer has ended), the rows
    -- there, counted only under READ COMMITTED, where this query sees every
    -- committed row (a transaction snapshot might not).
    IF TG_OP = 'DELETE' THEN
        removed := (SELECT count(*) FROM gone);
    ELSIF TG_OP = 'TRUNCATE'
          AND pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        removed := (SELECT count(*) FROM @extschema@.snowflake_lease_blocks);
    END IF;
    -- After any lease call in progress, which would write over this row.
    PERFORM snowflake_id_internal.snowflake_lease_lock_registry();
    facts := snowflake_id_internal.snowflake_lease_facts('');
    -- core/src/registry/mod.rs, forgotten.
    PERFORM snowflake_id_internal.snowflake_lease_apply(
        snowflake_id_internal.snowflake_lease_forget_decide(
            CASE TG_OP WHEN 'INSERT' THEN 'restored' WHEN 'DELETE' THEN 'deleted' ELSE 'truncated' END,
            facts->'server' || jsonb_build_object('removed', removed), facts->'rows'));
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_forget() IS
  'Trigger: rows of snowflake_lease_blocks deleted means grants forgotten; the next lease call starts a new, fenced incarnation.';
-- A DELETE that deleted no row forgets nothing: the trigger sees the rows
-- it deleted.
DROP TRIGGER snowflake_lease_blocks_forget ON @extschema@.snowflake_lease_blocks;
CREATE TRIGGER snowflake_lease_blocks_forget AFTER DELETE ON @extschema@.snowflake_lease_blocks
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();
-- Before the TRUNCATE, which has emptied the table after: it looks.
DROP TRIGGER snowflake_lease_blocks_truncate ON @extschema@.snowflake_lease_blocks;
CREATE TRIGGER snowflake_lease_blocks_truncate BEFORE TRUNCATE ON @extschema@.snowflake_lease_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();

-- == Getting it, switching to it and watching it (issue 43) ==

-- snowflake_health(): one row per check (src/sql/health.rs), for pg_monitor.
CREATE FUNCTION "snowflake_health"() RETURNS TABLE (
	"name" TEXT,
	"status" TEXT,
	"value" TEXT,
	"threshold" TEXT,
	"action" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_health_wrapper';
REVOKE EXECUTE ON FUNCTION snowflake_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION snowflake_health() TO pg_monitor;
COMMENT ON FUNCTION snowflake_health() IS
  'One row per health check (layout, leases, registry, worker ids, reservation, backfill, registry table): status ok, warn or critical, the value, the threshold and what to do.';

-- The explicit-layout decoders apply the server's rule that a time field
-- lasts at least ten years; snowflake_convert_column() recognises pgEdge
-- snowflake's default, locks the table before reading its largest value,
-- waits out values up to a second ahead and no longer hints at setting
-- only the default; it and snowflake_create_partitions() refuse NULL
-- arguments with 22004; the lease limits' trigger gives a hint. Same
-- signatures: replaced in place (src/sql/tools.sql, src/sql/leases.sql).

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_layout_shift(time_unit_ms bigint, worker_bits int,
                                                             sequence_bits int, total_bits int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF time_unit_ms < 1 OR time_unit_ms > 86400000 OR worker_bits < 0 OR worker_bits > 16
       OR sequence_bits < 1 OR sequence_bits > 30 OR total_bits < 2 OR total_bits > 63
       OR worker_bits + sequence_bits >= total_bits THEN
        RAISE EXCEPTION 'invalid explicit snowflake layout: time_unit_ms %, worker_bits %, sequence_bits %, total_bits %',
                        time_unit_ms, worker_bits, sequence_bits, total_bits
            USING ERRCODE = '22023',
                  HINT = 'Pass the values snowflake_layout() shows: time_unit_ms 1 to 86400000, worker_bits 0 to 16, sequence_bits 1 to 30, total_bits 2 to 63 with at least one time bit.';
    END IF;
    -- The last millisecond of the time field, from the epoch: the server's
    -- end_unix_ms() minus the epoch, against ten years.
    IF (2::numeric ^ (total_bits - worker_bits - sequence_bits)) * time_unit_ms - 1 < 315576000000 THEN
        RAISE EXCEPTION 'invalid explicit snowflake layout: its time field lasts less than 10 years from the epoch'
            USING ERRCODE = '22023',
                  DETAIL = format('%s time bits of %s ms last %s days; the server refuses such a layout at start.',
                                  total_bits - worker_bits - sequence_bits, time_unit_ms,
                                  floor((2::numeric ^ (total_bits - worker_bits - sequence_bits)) * time_unit_ms / 86400000)),
                  HINT = 'Pass the values snowflake_layout() shows.';
    END IF;
    RETURN worker_bits + sequence_bits;
END
$$;

CREATE OR REPLACE FUNCTION snowflake_convert_column(tbl regclass, col name, convert_type boolean DEFAULT false)
RETURNS TABLE (step text, detail text)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
    a record;
    views text;
    fks text;
    seq regclass;
    max_id bigint;
    first_id bigint;
    others int;
    pgedge boolean;
    pgedge_layout boolean;
    hint text;
    l record;
    max_ts timestamptz;
    wait_ms double precision;
BEGIN
    IF tbl IS NULL OR col IS NULL OR convert_type IS NULL THEN
        RAISE EXCEPTION 'snowflake_convert_column: argument % is null',
                        CASE WHEN tbl IS NULL THEN 'tbl' WHEN col IS NULL THEN 'col' ELSE 'convert_type' END
            USING ERRCODE = '22004', HINT = 'Pass the table, the name of its key column and, optionally, convert_type true or false.';
    END IF;
    SELECT c.relkind, c.relowner INTO r FROM pg_catalog.pg_class c WHERE c.oid = tbl;
    IF r.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '"%" is not a table', tbl
            USING ERRCODE = '42809',
                  HINT = 'Convert the key column of a table (plain or partitioned).';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, r.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', tbl
            USING ERRCODE = '42501',
                  HINT = 'Run it as the table''s owner or a member of the owning role, as ALTER TABLE requires.';
    END IF;
    SELECT att.attnum, att.atttypid, att.attidentity, att.attgenerated,
           pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS def, d.oid AS def_oid
      INTO a
      FROM pg_catalog.pg_attribute att
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = att.attrelid AND d.adnum = att.attnum
     WHERE att.attrelid = tbl AND att.attname = col AND att.attnum > 0 AND NOT att.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of table % does not exist', col, tbl
            USING ERRCODE = '42703', HINT = 'Name an existing column of the table.';
    END IF;
    IF a.attgenerated <> '' THEN
        RAISE EXCEPTION 'column "%" of table % is a generated column', col, tbl
            USING ERRCODE = '42P16', HINT = 'Convert a plain key column; a generated column has no default to switch.';
    END IF;
    IF a.def IS NOT NULL AND a.def LIKE '%snowflake_nextval()%' THEN
        step := 'nothing to do';
        detail := format('column %s of %s already defaults to %s', col, tbl, a.def);
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Foreign keys that hold copies of this column must be able to hold snowflake IDs too.
    SELECT string_agg(format('%s.%I (%s)', con.conrelid::regclass, ref.attname,
                             pg_catalog.format_type(ref.atttypid, NULL)), ', ')
      INTO fks
      FROM pg_catalog.pg_constraint con
      CROSS JOIN LATERAL unnest(con.confkey, con.conkey) AS k(target, source)
      JOIN pg_catalog.pg_attribute ref ON ref.attrelid = con.conrelid AND ref.attnum = k.source
     WHERE con.contype = 'f' AND con.confrelid = tbl AND k.target = a.attnum
       AND ref.atttypid <> 'bigint'::regtype;
    IF fks IS NOT NULL THEN
        RAISE EXCEPTION 'foreign keys referencing %.% are not bigint: %', tbl, col, fks
            USING ERRCODE = '42804',
                  DETAIL = 'Snowflake IDs do not fit in integer or smallint: rows referencing new IDs would fail with 22003.',
                  HINT = 'ALTER TABLE ... ALTER COLUMN ... TYPE bigint on those columns first, then convert this one.';
    END IF;

    IF a.atttypid IN ('integer'::regtype, 'smallint'::regtype) THEN
        SELECT string_agg(DISTINCT v.oid::regclass::text, ', ')
          INTO views
          FROM pg_catalog.pg_depend dep
          JOIN pg_catalog.pg_rewrite rw ON rw.oid = dep.objid
          JOIN pg_catalog.pg_class v ON v.oid = rw.ev_class
         WHERE dep.classid = 'pg_catalog.pg_rewrite'::regclass
           AND dep.refclassid = 'pg_catalog.pg_class'::regclass
           AND dep.refobjid = tbl AND dep.refobjsubid = a.attnum AND v.oid <> tbl;
        IF NOT convert_type THEN
            RAISE EXCEPTION 'column "%" of table % is %, too small for snowflake IDs', col, tbl,
                            pg_catalog.format_type(a.atttypid, NULL)
                USING ERRCODE = '42804',
                      DETAIL = 'Snowflake IDs are larger than any integer: every insert would fail with 22003 (integer out of range).',
                      HINT = format('Call snowflake_convert_column(%L, %L, convert_type => true) to run ALTER TABLE %s ALTER COLUMN %I TYPE bigint first (it rewrites the table and its indexes under an ACCESS EXCLUSIVE lock), or run that yourself.',
                                    tbl::text, col, tbl, col);
        END IF;
        IF views IS NOT NULL THEN
            RAISE EXCEPTION 'cannot change the type of column "%" of table %: views depend on it', col, tbl
                USING ERRCODE = '0A000',
                      DETAIL = format('Dependent views: %s.', views),
                      HINT = 'In one transaction: drop those views, call this function again, and create the views again. PostgreSQL cannot change the type of a column a view uses.';
        END IF;
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', tbl, col);
        step := 'changed type';
        detail := format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint (was %s): snowflake IDs do not fit in it',
                         tbl, col, pg_catalog.format_type(a.atttypid, NULL));
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    ELSIF a.atttypid <> 'bigint'::regtype THEN
        RAISE EXCEPTION 'column "%" of table % is %, not an integer column', col, tbl,
                        pg_catalog.format_type(a.atttypid, NULL)
            USING ERRCODE = '42804',
                  HINT = 'Snowflake IDs are bigint: convert a bigint, integer or smallint key column.';
    END IF;

    -- A default calling pgEdge snowflake's snowflake.nextval() (found by
    -- what it depends on: pg_get_expr omits the schema when it is on the
    -- search_path).
    SELECT EXISTS (SELECT FROM pg_catalog.pg_depend dep
                     JOIN pg_catalog.pg_proc f ON f.oid = dep.refobjid
                     JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
                    WHERE dep.classid = 'pg_catalog.pg_attrdef'::regclass AND dep.objid = a.def_oid
                      AND dep.refclassid = 'pg_catalog.pg_proc'::regclass
                      AND f.proname = 'nextval' AND n.nspname = 'snowflake')
      INTO pgedge;
    IF pgedge THEN
        SELECT * INTO l FROM @extschema@.snowflake_layout();
        step := 'recognised pgEdge snowflake';
        pgedge_layout := l.epoch = '2023-01-01 00:00:00+00' AND l.time_unit_ms = 1
                         AND l.total_bits = 63 AND l.worker_bits = 10 AND l.sequence_bits = 12;
        IF pgedge_layout THEN
            detail := format('%s feeds the column; the layout in force (%s) is pgEdge''s: its IDs decode to their time, node (worker_id) and count (sequence)',
                             a.def, l.preset);
        ELSE
            detail := format('%s feeds the column; the layout in force (%s) is not pgEdge''s, so its IDs do not decode to their time (snowflake_id.layout = pgedge does)',
                             a.def, l.preset);
        END IF;
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    END IF;

    -- No row can be added between reading the largest value and the switch.
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', tbl);
    EXECUTE format('SELECT max(%I) FROM %s', col, tbl) INTO max_id;
    first_id := @extschema@.snowflake_from_timestamp(clock_timestamp());
    IF max_id >= first_id THEN
        -- Values of this layout's current tick or up to a second ahead of
        -- the clock (another generator's last IDs: pgEdge's can run a few
        -- milliseconds ahead): wait until new IDs start above them.
        BEGIN
            max_ts := @extschema@.snowflake_timestamp(max_id);
        EXCEPTION WHEN numeric_value_out_of_range THEN
            max_ts := NULL;
        END;
        SELECT * INTO l FROM @extschema@.snowflake_layout();
        wait_ms := extract(epoch FROM max_ts - clock_timestamp()) * 1000 + l.time_unit_ms;
        IF wait_ms <= 1000 THEN
            PERFORM pg_catalog.pg_sleep(wait_ms / 1000.0);
            WHILE @extschema@.snowflake_from_timestamp(clock_timestamp()) <= max_id LOOP
                PERFORM pg_catalog.pg_sleep(0.001);
            END LOOP;
            first_id := @extschema@.snowflake_from_timestamp(clock_timestamp());
            step := 'waited';
            detail := format('max(%I) = %s is of %s: new IDs start after that', col, max_id, max_ts);
            RAISE NOTICE '%: %', step, detail;
            RETURN NEXT;
        ELSE
            IF pgedge AND NOT pgedge_layout THEN
                hint := 'These are pgEdge snowflake IDs: set snowflake_id.layout = pgedge (and no snowflake_id.epoch) in postgresql.conf, restart, and call this function again; see the guide "Switching from pgEdge snowflake".';
            ELSIF pgedge THEN
                hint := 'pgEdge made these IDs ahead of this server''s clock: check the clocks, and call this function again after the time the detail gives.';
            ELSE
                hint := 'If these are IDs of another snowflake generator, set snowflake_id''s layout settings to its layout, restart, and call this function again; if they are IDs of this layout made ahead of the clock, call it again after the time the detail gives. Setting only the column''s default would not keep new IDs above them.';
            END IF;
            RAISE EXCEPTION 'existing values of %.% reach %, not below the first snowflake ID of now (%)',
                            tbl, col, max_id, first_id
                USING ERRCODE = '22003',
                      DETAIL = format('Under the layout in force, %s decodes to %s: new IDs would sort below existing rows and could collide with them.', max_id, coalesce(max_ts::text, 'no time (it is not an ID of this layout)')),
                      HINT = hint;
        END IF;
    END IF;
    step := 'checked values';
    detail := format('max(%I) = %s, below %s, the first snowflake ID of now', col,
                     coalesce(max_id::text, 'NULL (no rows)'), first_id);
    RAISE NOTICE '%: %', step, detail;
    RETURN NEXT;

    seq := pg_catalog.pg_get_serial_sequence(tbl::text, col)::regclass;
    IF a.attidentity IN ('a', 'd') THEN
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', tbl, col);
        step := 'dropped identity';
        detail := format('GENERATED %s AS IDENTITY removed, and with it its sequence %s',
                         CASE a.attidentity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END, seq);
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
        seq := NULL;
    END IF;

    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT @extschema@.snowflake_nextval()', tbl, col);
    step := 'set default';
    detail := format('%s.%I DEFAULT snowflake_nextval() (was %s)', tbl, col,
                     coalesce(CASE WHEN a.attidentity IN ('a', 'd') THEN 'an identity' END, a.def, 'no default'));
    RAISE NOTICE '%: %', step, detail;
    RETURN NEXT;

    IF seq IS NOT NULL THEN
        -- An owned (serial) sequence: dropped, so that code still calling
        -- currval()/lastval() for this table fails instead of reading a stale value.
        SELECT count(*) INTO others
          FROM pg_catalog.pg_depend dep
         WHERE dep.refclassid = 'pg_catalog.pg_class'::regclass AND dep.refobjid = seq
           AND dep.classid = 'pg_catalog.pg_attrdef'::regclass;
        IF others = 0 THEN
            -- Named before it goes (a dropped regclass shows as its oid).
            detail := format('%s, which fed the old default (currval() and lastval() on it now fail instead of returning stale values; use INSERT ... RETURNING)', seq);
            EXECUTE format('DROP SEQUENCE %s', seq);
            step := 'dropped sequence';
        ELSE
            step := 'kept sequence';
            detail := format('%s: %s other column default(s) still use it', seq, others);
        END IF;
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION snowflake_create_partitions(parent regclass, period interval DEFAULT '1 month',
                                            count int DEFAULT 3, start_at timestamptz DEFAULT now())
RETURNS TABLE (partition_name regclass, created boolean, from_time timestamptz, to_time timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p record;
    months int := extract(year FROM period) * 12 + extract(month FROM period);
    days int := extract(day FROM period);
    unit text;
    fmt text;
    base timestamp;
    lo timestamp;
    pname text;
    existing oid;
BEGIN
    IF parent IS NULL OR period IS NULL OR count IS NULL OR start_at IS NULL THEN
        RAISE EXCEPTION 'snowflake_create_partitions: argument % is null',
                        CASE WHEN parent IS NULL THEN 'parent' WHEN period IS NULL THEN 'period'
                             WHEN count IS NULL THEN 'count' ELSE 'start_at' END
            USING ERRCODE = '22004', HINT = 'Pass a value, or leave the argument out for its default (period 1 month, count 3, start_at now()).';
    END IF;
    SELECT pt.partstrat, pt.partnatts, pt.partattrs[0] AS attnum, c.relname, c.relnamespace,
           n.nspname, att.atttypid
      INTO p
      FROM pg_catalog.pg_partitioned_table pt
      JOIN pg_catalog.pg_class c ON c.oid = pt.partrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_catalog.pg_attribute att ON att.attrelid = pt.partrelid AND att.attnum = pt.partattrs[0]
     WHERE pt.partrelid = parent;
    IF NOT FOUND OR p.partstrat <> 'r' OR p.partnatts <> 1 OR p.atttypid IS DISTINCT FROM 'bigint'::regtype THEN
        RAISE EXCEPTION 'table % is not partitioned by range on one bigint column', parent
            USING ERRCODE = '42809',
                  HINT = 'Create it with PARTITION BY RANGE (id), id being its bigint snowflake ID column.';
    END IF;
    IF period - make_interval(months => months, days => days) <> interval '0' THEN
        months := -1;
    END IF;
    IF months = 0 AND days = 1 THEN unit := 'day'; fmt := 'YYYY_MM_DD';
    ELSIF months = 0 AND days = 7 THEN unit := 'week'; fmt := 'IYYY_"w"IW';
    ELSIF months = 1 AND days = 0 THEN unit := 'month'; fmt := 'YYYY_MM';
    ELSIF months = 12 AND days = 0 THEN unit := 'year'; fmt := 'YYYY';
    ELSE
        RAISE EXCEPTION 'unsupported partition period %', period
            USING ERRCODE = '22023', HINT = 'Use 1 day, 1 week, 1 month or 1 year.';
    END IF;
    IF count < 1 OR count > 1000 THEN
        RAISE EXCEPTION 'partition count % is out of range', count
            USING ERRCODE = '22023', HINT = 'Ask for 1 to 1000 partitions.';
    END IF;

    base := date_trunc(unit, start_at AT TIME ZONE 'UTC');
    FOR i IN 0 .. count - 1 LOOP
        lo := base + i * period;
        pname := to_char(lo, fmt);
        pname := left(p.relname, 63 - 2 - length(pname)) || '_p' || pname;
        from_time := lo AT TIME ZONE 'UTC';
        to_time := (lo + period) AT TIME ZONE 'UTC';
        SELECT c.oid INTO existing FROM pg_catalog.pg_class c
         WHERE c.relnamespace = p.relnamespace AND c.relname = pname;
        IF existing IS NULL THEN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%s) TO (%s)',
                           p.nspname, pname, parent,
                           @extschema@.snowflake_from_timestamp(from_time),
                           @extschema@.snowflake_from_timestamp(to_time));
            created := true;
        ELSIF EXISTS (SELECT FROM pg_catalog.pg_inherits i
                       WHERE i.inhrelid = existing AND i.inhparent = parent) THEN
            created := false;
        ELSE
            RAISE EXCEPTION 'relation %.% exists and is not a partition of %', p.nspname, pname, parent
                USING ERRCODE = '42P07',
                      HINT = 'Rename or attach that table, then call this function again.';
        END IF;
        partition_name := format('%I.%I', p.nspname, pname)::regclass;
        RETURN NEXT;
    END LOOP;
END
$fn$;


-- == Backfill at migration scale (issue 44) ==
-- Backfill takes one grant per stretch of time and session, in any order
-- of times (snowflake_core::backfill). Grants keep their numbering, so the
-- grants 0.7.0 handed out (shared memory, the state file, WAL and
-- snowflake_backfill_grants, all unchanged) stay handed out as they are.
-- snowflake_backfill() shows what is left of each stretch and what this
-- session holds: two more columns, and parallel restricted (a session's own
-- grants are not a parallel worker's); a C symbol of its own (0.7.0's
-- raises 55000 until this update has run).
DROP FUNCTION snowflake_backfill();
CREATE FUNCTION snowflake_backfill() RETURNS TABLE (
	"bucket" INT,
	"starts_at" timestamp with time zone,
	"ends_at" timestamp with time zone,
	"grants" bigint,
	"capacity" bigint,
	"grants_left" bigint,
	"this_session" bigint,
	"worker_ids" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_backfill_stretches_wrapper';
COMMENT ON FUNCTION snowflake_backfill() IS
  'Backfill grants of each stretch of time: its first and last time, grants handed out, grants it holds, grants left, grants this session holds.';

-- A dump carries the grants of every row it carries, a restore by the
-- database's owner raises them, and snowflake_at() reads a stretch's
-- restored rows before it takes a grant there (src/sql/backfill.sql).
GRANT SELECT ON snowflake_backfill_grants TO PUBLIC;
GRANT INSERT ON snowflake_backfill_grants TO pg_database_owner;
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_backfill_restored() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT starts_at, max(grants) AS grants, max(worker_ids) AS worker_ids
               FROM new_rows GROUP BY starts_at LOOP
        BEGIN
            PERFORM @extschema@.snowflake_backfill_raise(r.starts_at, r.grants, r.worker_ids);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'snowflake_id: restored backfill grants of the time from % were not raised: %', r.starts_at, SQLERRM
                USING HINT = 'Restore into a server that preloads snowflake_id, or run snowflake_backfill_raise() for the rows of snowflake_backfill_grants as a superuser.';
        END;
    END LOOP;
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_backfill_merge() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n bigint;
BEGIN
    DELETE FROM @extschema@.snowflake_backfill_grants WHERE starts_at = NEW.starts_at
    RETURNING grants INTO n;
    IF FOUND THEN
        NEW.grants := greatest(NEW.grants, n);
    END IF;
    RETURN NEW;
END
$fn$;
CREATE FUNCTION snowflake_backfill_dump() RETURNS TABLE (
	"starts_at" timestamp with time zone,
	"grants" bigint,
	"worker_ids" TEXT,
	"updated_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_backfill_dump_wrapper';
COMMENT ON FUNCTION snowflake_backfill_dump() IS
  'The rows a dump of snowflake_backfill_grants carries: the table''s rows and this server''s backfill grants now.';
SELECT pg_catalog.pg_extension_config_dump('snowflake_backfill_grants',
  'WHERE false UNION ALL SELECT * FROM @extschema@.snowflake_backfill_dump()');

-- Backfill in a fleet (issue 44): a holder leasing from a registry takes
-- backfill grants from it (src/sql/backfill_fleet.sql).
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_grant_take(request text, facts jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_backfill_grant_take_wrapper';
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_grant(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- Its text's size: pg_column_size() would count a compressed value.
    size int := pg_catalog.octet_length(req::text);
    reply jsonb;
BEGIN
    PERFORM snowflake_id_internal.snowflake_lease_autocommit();
    IF size > 65536 THEN
        RAISE LOG 'snowflake_id registry: refused a backfill grant request of % bytes (role %, %)',
            size, session_user, coalesce('client ' || inet_client_addr()::text, 'local connection');
        RAISE EXCEPTION 'backfill grant request of % bytes refused: the limit is 65536', size
            USING ERRCODE = '54000',
                  HINT = 'snowflake_at() never sends such a request: who called snowflake_backfill_grant by hand?';
    END IF;
    reply := snowflake_id_internal.snowflake_backfill_grant_take(req::text, jsonb_build_object(
        'now_ms', snowflake_id_internal.snowflake_lease_ms(pg_catalog.now()),
        'role', session_user,
        'client', coalesce('client ' || inet_client_addr()::text, 'local connection'),
        'blocks', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'block', b.block, 'first_worker_id', b.first_worker_id,
                       'last_worker_id', b.last_worker_id, 'layout', b.layout,
                       'holder_node', b.holder_node,
                       'expires_at_ms', snowflake_id_internal.snowflake_lease_ms(b.expires_at),
                       'grace_ms', floor(extract(epoch FROM b.grace) * 1000)::bigint,
                       'high_water_ms', b.high_water_ms)), '[]')
                     FROM @extschema@.snowflake_lease_blocks b)));
    RETURN reply || jsonb_build_object('lsn', pg_catalog.pg_current_wal_flush_lsn()::text);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb) IS
  'Called by a holder''s snowflake_at(): hands out backfill grants of the fleet''s set-aside worker ids, durable in this server''s WAL before the reply.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_grant_take(text, jsonb) FROM PUBLIC;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_backfill_grant_take(text, jsonb) IS
  'Used by snowflake_backfill_grant: the registry''s rules (core/src/registry/backfill.rs) decide a backfill grant call, and this server''s backfill counters hand it out.';
-- The roles that may renew (the lease role) may take backfill grants too,
-- as a fresh install's GRANT (docs/operations/fleet.md) lets them.
DO $grant$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.grantee::regrole::text AS role
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(p.proacl) a
              WHERE p.oid = 'snowflake_id_internal.snowflake_lease_renew(jsonb)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
                AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb) TO %s',
                       r.role);
    END LOOP;
END
$grant$;
