-- snowflake_id 0.6.0 -> 0.7.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.6.0's install script is kept
-- in tests/upgrade/ for it).
--
-- A registry: snowflake_lease_durable(jsonb), which holders call after each
-- grant and use the grant only once it answers durable (on enough
-- synchronous standbys). Roles that may call the lease functions get
-- EXECUTE on it too.
--
-- A node's blocks belong to the registry session that leased or last
-- renewed them (snowflake_lease_blocks.holder_session, and
-- snowflake_lease_session()): a session that cannot name that one as its
-- previous (a copy that took over the node id) gets them only once their
-- lease and grace ran out. Rows leased before the update have no session:
-- any session of their node keeps them, and the next renewal records it.
-- The lease functions below are as src/sql/leases.sql defines them
-- (scripts/upgrade_functions.py prints them).
--
-- snowflake_config() gains the column lease_problem (what keeps the lease
-- worker from leasing, for roles that may read the registry setting): it
-- is dropped and made again, as generated.
-- Whether what this session committed is where a failover can reach it:
-- on enough synchronous standbys to satisfy synchronous_standby_names
-- (`FIRST n` or `ANY n`: n standbys whose sync_state is sync or quorum have
-- flushed it), waiting up to `wait_ms` (at most 5 s). A holder calls it
-- after every lease or renewal and uses the grant only when it answers
-- durable: a COMMIT whose wait for the standby was cancelled (a query
-- cancel; not statement_timeout, which is off by then) returned with only
-- a WARNING, and an old primary cut off from its standby after a
-- promotion can never make one durable. The position checked is this
-- server's flush position when the call begins, at or past the end of the
-- session's last commit. With no
-- synchronous standby named, the local flush is all there is: mode `local`
-- (or `asynchronous` when standbys stream: a failover to one of them loses
-- grants, and the registry's new incarnation is fenced). SECURITY DEFINER:
-- pg_stat_replication shows positions only to privileged roles.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    wait_ms bigint := least(greatest(coalesce((req->>'wait_ms')::bigint, 0), 0), 5000);
    names text := pg_catalog.current_setting('synchronous_standby_names');
    target pg_lsn := pg_catalog.pg_current_wal_flush_lsn();
    deadline timestamptz := pg_catalog.clock_timestamp() + wait_ms * interval '1 millisecond';
    needed int;
    flushed int;
    streaming int;
BEGIN
    IF pg_catalog.btrim(names) = '' THEN
        SELECT count(*) INTO streaming FROM pg_catalog.pg_stat_replication r WHERE r.state = 'streaming';
        RETURN jsonb_build_object('durable', true,
                                  'mode', CASE WHEN streaming > 0 THEN 'asynchronous' ELSE 'local' END,
                                  'needed', 0, 'flushed', 0, 'lsn', target::text);
    END IF;
    -- [FIRST] n (...) or ANY n (...); a plain list (or *) is FIRST 1.
    needed := coalesce((pg_catalog.regexp_match(names, '^\s*(?:(?:first|any)\s+)?(\d+)\s*\(', 'i'))[1]::int, 1);
    LOOP
        SELECT count(*) INTO flushed FROM pg_catalog.pg_stat_replication r
         WHERE r.sync_state IN ('sync', 'quorum') AND r.flush_lsn >= target;
        EXIT WHEN flushed >= needed OR pg_catalog.clock_timestamp() >= deadline;
        PERFORM pg_catalog.pg_sleep(0.005);
    END LOOP;
    RETURN jsonb_build_object('durable', flushed >= needed, 'mode', 'synchronous',
                              'needed', needed, 'flushed', flushed, 'lsn', target::text);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) IS
  'Called by a holder''s lease worker after each grant: whether this session''s commits are flushed on enough synchronous standbys (synchronous_standby_names) that a failover keeps them.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) FROM PUBLIC;
-- The roles that may renew (the lease role) may check their grants too.
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) TO %s',
                       r.role);
    END LOOP;
END
$grant$;

DROP FUNCTION snowflake_config();
CREATE  FUNCTION "snowflake_config"() RETURNS TABLE (
	"worker_ids" TEXT,  /* String */
	"worker_ids_total" bigint,  /* Option < i64 > */
	"worker_ids_held" bigint,  /* Option < i64 > */
	"worker_ids_free" bigint,  /* Option < i64 > */
	"my_worker_id" INT,  /* Option < i32 > */
	"max_drift_ms" bigint,  /* i64 */
	"mode" TEXT,  /* String */
	"registry" TEXT,  /* Option < String > */
	"blocks_held" INT,  /* Option < i32 > */
	"lease_deadline" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"registry_unreachable_since" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"node_id" TEXT,  /* Option < String > */
	"lease_problem" TEXT  /* Option < String > */
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_config_wrapper';
COMMENT ON FUNCTION snowflake_config() IS
  'Worker ids in force, held and free, this backend''s worker id, max_drift_ms, and where worker ids come from: mode (local, registry, citus), registry, blocks held, lease deadline, since when the registry is unreachable, node id, and what keeps the lease worker from leasing (lease_problem); worker_ids says "not preloaded" without shared_preload_libraries.';

ALTER TABLE snowflake_lease_blocks ADD COLUMN holder_session text;
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_session() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT s.pid || ':' || (extract(epoch FROM s.backend_start) * 1000000)::int8
      FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) s
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_session() IS
  'Used by the lease functions: this registry session as pid:start, the session a node''s blocks belong to.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_acquire(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    name text := req->>'name';
    lay text := req->>'layout';
    block_size int := (req->>'block_size')::int;
    max_worker_id int := (req->>'max_worker_id')::int;
    allowed int[] := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(req->'allowed')::int);
    want int := (req->>'want')::int;
    lease_ms bigint := (req->>'lease_ms')::bigint;
    grace_ms bigint := (req->>'grace_ms')::bigint;
    high_ms bigint := (req->>'high_ms')::bigint;
    g record;
    other text;
    granted jsonb;
BEGIN
    IF name IS NULL OR lay IS NULL OR block_size IS NULL OR max_worker_id IS NULL OR want IS NULL
       OR lease_ms IS NULL OR grace_ms IS NULL OR high_ms IS NULL OR block_size < 1 OR want < 1 THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'name, layout, block_size, max_worker_id, want, lease_ms, grace_ms and high_ms are required; block_size and want must be positive.';
    END IF;
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    -- New rows start at the last fence's floor: a registry that forgot
    -- rows may meet blocks that holders used under grants it lost.
    INSERT INTO @extschema@.snowflake_lease_blocks AS b (block, first_worker_id, last_worker_id, layout,
                                                         high_water_ms)
    SELECT a, a * block_size, least(a * block_size + block_size - 1, max_worker_id), lay,
           g.fence_floor_ms
      FROM unnest(allowed) a
     WHERE a >= 0 AND a * block_size <= max_worker_id
    ON CONFLICT DO NOTHING;
    SELECT b.layout INTO other FROM @extschema@.snowflake_lease_blocks b
     WHERE b.block = ANY (allowed) AND b.layout <> lay LIMIT 1;
    IF other IS NOT NULL THEN
        RAISE EXCEPTION 'this fleet''s leases were made under another layout'
            USING ERRCODE = '55000',
                  DETAIL = format('The registry''s blocks use %s; the server %s uses %s.', other, name, lay),
                  HINT = 'Every server of a fleet must use the same snowflake_id layout settings.';
    END IF;
    IF g.fenced_until IS NOT NULL THEN
        RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until, '{"blocks": []}');
    END IF;
    WITH picked AS (
        SELECT b.block FROM @extschema@.snowflake_lease_blocks b
         WHERE b.block = ANY (allowed)
           AND (b.holder_node IS NULL OR b.expires_at + b.grace < now())
         ORDER BY b.high_water_ms, b.block
         LIMIT want
           FOR UPDATE SKIP LOCKED
    ), old AS (
        SELECT b.block, b.high_water_ms FROM @extschema@.snowflake_lease_blocks b
         WHERE b.block IN (SELECT p.block FROM picked p)
    ), done AS (
        UPDATE @extschema@.snowflake_lease_blocks b
           SET holder_node = node, holder_name = name, leased_at = now(), renewed_at = now(),
               holder_session = snowflake_id_internal.snowflake_lease_session(),
               expires_at = now() + lease_ms * interval '1 millisecond',
               grace = grace_ms * interval '1 millisecond',
               high_water_ms = greatest(b.high_water_ms, high_ms), released_at = NULL,
               leases = b.leases + 1
          FROM old
         WHERE b.block = old.block
     RETURNING b.block, old.high_water_ms
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object('block', d.block, 'floor_ms', d.high_water_ms)
                              ORDER BY d.block), '[]')
      INTO granted FROM done d;
    PERFORM pg_try_advisory_lock(1936613751, b.block)
       FROM @extschema@.snowflake_lease_blocks b
      WHERE b.holder_node = node AND b.block = ANY (allowed) AND b.block <> ALL (g.locked)
        AND b.holder_session = snowflake_id_internal.snowflake_lease_session();
    RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until,
                                             jsonb_build_object('blocks', granted));
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) IS
  'Called by a holder''s lease worker: leases free or expired blocks of worker ids, least recently used first, and returns the floor each must start above; none while the registry is fenced.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_renew(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    lease_ms bigint := (req->>'lease_ms')::bigint;
    grace_ms bigint := (req->>'grace_ms')::bigint;
    high_ms bigint := (req->>'high_ms')::bigint;
    block_size int := (req->>'block_size')::int;
    max_worker_id int := (req->>'max_worker_id')::int;
    lay text := req->>'layout';
    known text := coalesce(req->>'incarnation', '');
    me text := snowflake_id_internal.snowflake_lease_session();
    previous text := coalesce(req->>'previous_session', '');
    g record;
    reassert boolean;
    blocks int[];
    kept jsonb;
BEGIN
    IF lease_ms IS NULL OR grace_ms IS NULL OR high_ms IS NULL OR jsonb_typeof(req->'blocks') <> 'array' THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'blocks, lease_ms, grace_ms and high_ms are required.';
    END IF;
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    reassert := g.fenced_until IS NOT NULL AND known <> '' AND known <> g.incarnation;
    blocks := ARRAY(SELECT DISTINCT a.block
                      FROM pg_catalog.jsonb_to_recordset(req->'blocks') AS a(block int, high_ms bigint)
                     WHERE a.block IS NOT NULL);
    IF reassert AND block_size > 0 AND lay IS NOT NULL THEN
        -- Rows the registry forgot altogether (an emptied table).
        INSERT INTO @extschema@.snowflake_lease_blocks AS b (block, first_worker_id, last_worker_id, layout,
                                                             high_water_ms)
        SELECT a, a * block_size, least(a * block_size + block_size - 1, max_worker_id), lay,
               g.fence_floor_ms
          FROM unnest(blocks) a
         WHERE a >= 0 AND a * block_size <= max_worker_id
        ON CONFLICT DO NOTHING;
    END IF;
    WITH asked AS (
        SELECT a.block, max(coalesce(a.high_ms, 0)) AS high_ms
          FROM pg_catalog.jsonb_to_recordset(req->'blocks') AS a(block int, high_ms bigint)
         GROUP BY a.block
    ), old AS (
        -- This node's blocks of this session or the one it names as its
        -- previous (NULL: leased before 0.7.0); another session's wait
        -- for their lease and grace to run out, then go by acquire.
        SELECT b.block, b.high_water_ms, a.high_ms AS asserted,
               b.holder_node = node AND (b.holder_session IS NULL
                                         OR b.holder_session IN (me, previous)) AS mine
          FROM @extschema@.snowflake_lease_blocks b
          JOIN asked a ON a.block = b.block
         WHERE (b.holder_node = node AND (b.holder_session IS NULL
                                          OR b.holder_session IN (me, previous)))
            OR (reassert AND (b.holder_node IS NULL OR b.expires_at + b.grace < now()))
           FOR UPDATE OF b
    ), done AS (
        UPDATE @extschema@.snowflake_lease_blocks b
           SET holder_node = node, holder_session = me,
               leased_at = CASE WHEN old.mine THEN b.leased_at ELSE now() END,
               leases = b.leases + CASE WHEN old.mine THEN 0 ELSE 1 END,
               released_at = NULL,
               renewed_at = now(), expires_at = now() + lease_ms * interval '1 millisecond',
               grace = grace_ms * interval '1 millisecond',
               high_water_ms = greatest(b.high_water_ms, high_ms,
                                        CASE WHEN old.mine THEN 0 ELSE old.asserted END)
          FROM old
         WHERE b.block = old.block
     RETURNING b.block, old.high_water_ms
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object('block', d.block, 'floor_ms', d.high_water_ms)
                              ORDER BY d.block), '[]')
      INTO kept FROM done d;
    -- After a reconnect the session locks are gone: take them again.
    PERFORM pg_try_advisory_lock(1936613751, b.block)
       FROM @extschema@.snowflake_lease_blocks b
      WHERE b.holder_node = node AND b.block = ANY (blocks) AND b.block <> ALL (g.locked)
        AND b.holder_session = me;
    -- Blocks handed to another holder: this session's lock is stale.
    PERFORM pg_advisory_unlock(1936613751, h)
       FROM unnest(g.locked) h
      WHERE h = ANY (blocks)
        AND NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_blocks b
                         WHERE b.block = h AND b.holder_node = node);
    RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until,
                                             jsonb_build_object('blocks', kept));
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) IS
  'Called by a holder''s lease worker: extends its leases and raises their marks (re-asserting them to a new incarnation while fenced); returns the blocks it still holds.';

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    blk int := (req->>'block')::int;
    high_ms bigint := (req->>'high_ms')::bigint;
    previous text := coalesce(req->>'previous_session', '');
    g record;
    done boolean;
BEGIN
    IF blk IS NULL OR high_ms IS NULL THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'block and high_ms are required.';
    END IF;
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    UPDATE @extschema@.snowflake_lease_blocks b
       SET holder_node = NULL, released_at = now(), expires_at = NULL, high_water_ms = high_ms
     WHERE b.block = blk AND b.holder_node = node
       AND (b.holder_session IS NULL
            OR b.holder_session IN (snowflake_id_internal.snowflake_lease_session(), previous));
    done := FOUND;
    PERFORM pg_advisory_unlock(1936613751, blk) WHERE blk = ANY (g.locked);
    RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until,
                                             jsonb_build_object('released', done));
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) IS
  'Called by a holder''s lease worker: returns an idle block, recording the time of the newest ID it issued there.';

REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_session() FROM PUBLIC;
