-- snowflake_id 0.2.0 -> 0.3.0
--
-- New: fleet leases. On a registry server: the table snowflake_lease_blocks
-- (dumped with its database), the view snowflake_leases, and the functions
-- the lease workers call (snowflake_lease_hello/acquire/renew/release, not
-- for PUBLIC). Changed: snowflake_config() gains the columns mode, registry,
-- blocks_held, lease_deadline, registry_unreachable_since and node_id, so it
-- is dropped and created again (a view of yours that uses it must be
-- dropped first). snowflake_worker_status() and the snowflake_workers view
-- gain the columns sessions and shared_claims (worker ids are shared when
-- none is free), so they are dropped and made again too.
--
-- Made from the generated 0.2.0 and 0.3.0 install scripts (see sql/README.md);
-- tests/upgrade/test_extension_upgrade.py checks that an updated database has the
-- same objects as a fresh CREATE EXTENSION.

\echo Use "ALTER EXTENSION snowflake_id UPDATE TO '0.3.0'" to load this file. \quit

DROP FUNCTION snowflake_config();
DROP VIEW snowflake_workers;
DROP FUNCTION snowflake_worker_status();

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
	"node_id" TEXT  /* Option < String > */
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_config_wrapper';
COMMENT ON FUNCTION snowflake_config() IS
  'Worker ids in force, held and free, this backend''s worker id, max_drift_ms, and where worker ids come from: mode (local, registry, citus), registry, blocks held, lease deadline, since when the registry is unreachable, node id; worker_ids says "not preloaded" without shared_preload_libraries.';

-- Shared worker ids: sessions and shared_claims.
CREATE  FUNCTION "snowflake_worker_status"() RETURNS TABLE (
	"worker_id" INT,  /* i32 */
	"pid" INT,  /* Option < i32 > */
	"database_oid" oid,  /* Option < pg_sys :: Oid > */
	"role_oid" oid,  /* Option < pg_sys :: Oid > */
	"application_name" TEXT,  /* Option < String > */
	"claimed_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"released_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"claims" bigint,  /* i64 */
	"ids_issued" bigint,  /* i64 */
	"last_id_time" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"current_drift_ms" bigint,  /* i64 */
	"max_drift_ms" bigint,  /* i64 */
	"sequence_exhausted" bigint,  /* i64 */
	"clock_backward" bigint,  /* i64 */
	"sessions" INT,  /* i32 */
	"shared_claims" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_worker_status_wrapper';
COMMENT ON FUNCTION snowflake_worker_status() IS
  'The rows behind the snowflake_workers view (oids instead of names).';

CREATE VIEW snowflake_workers AS
SELECT w.worker_id, w.pid, d.datname AS database, r.rolname AS role,
       coalesce(a.application_name, w.application_name) AS application_name,
       CASE WHEN v.full THEN w.claimed_at END AS claimed_at, w.released_at, w.claims,
       CASE WHEN v.full THEN w.ids_issued END AS ids_issued,
       CASE WHEN v.full THEN w.last_id_time END AS last_id_time,
       w.current_drift_ms, w.max_drift_ms, w.sequence_exhausted, w.clock_backward,
       w.sessions, w.shared_claims
  FROM snowflake_worker_status() w
  LEFT JOIN pg_catalog.pg_database d ON d.oid = w.database_oid
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = w.role_oid
  -- The holder's application name now (it may have changed since the claim).
  LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(coalesce(w.pid, 0)) a ON a.pid = w.pid
  -- Like pg_stat_activity: when and how much a session did is for its own
  -- role (and roles that have its privileges), superusers and
  -- pg_read_all_stats.
  CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
          OR (w.role_oid IS NOT NULL AND pg_catalog.pg_has_role(w.role_oid, 'USAGE')) AS full) v;
COMMENT ON VIEW snowflake_workers IS
  'Worker ids held now or used since the server started, with their generator counters.';
GRANT SELECT ON snowflake_workers TO PUBLIC;

-- Fleet leases: the registry's side (src/leases.sql).
CREATE TABLE snowflake_lease_blocks (
    block          int PRIMARY KEY,
    first_worker_id int NOT NULL,
    last_worker_id int NOT NULL,
    layout         text NOT NULL,
    holder_node    text,
    holder_name    text,
    leased_at      timestamptz,
    renewed_at     timestamptz,
    expires_at     timestamptz,
    grace          interval NOT NULL DEFAULT '0',
    high_water_ms  bigint NOT NULL DEFAULT 0,
    released_at    timestamptz,
    leases         bigint NOT NULL DEFAULT 0,
    CHECK (first_worker_id <= last_worker_id)
);
COMMENT ON TABLE snowflake_lease_blocks IS
  'Blocks of worker ids leased to the servers of a fleet (snowflake_id.registry names this database): holder, expiry by this server''s clock, and the highest ID time any holder may have issued.';
REVOKE ALL ON snowflake_lease_blocks FROM PUBLIC;
-- The marks are what keeps IDs apart across hand-overs: the table travels
-- with pg_dump of the registry's database.
SELECT pg_catalog.pg_extension_config_dump('snowflake_lease_blocks', '');

-- Every lease, with whether the holder's registry session is alive: each
-- holder keeps a session-level advisory lock (class 1936613751, the block
-- number) here, gone when its session ends.
CREATE VIEW snowflake_leases AS
SELECT b.block, b.first_worker_id, b.last_worker_id, b.holder_node, b.holder_name,
       b.leased_at, b.renewed_at, b.expires_at,
       CASE WHEN b.high_water_ms > 0
            THEN to_timestamp(b.high_water_ms / 1000.0) END AS floor,
       b.holder_node IS NOT NULL AS leased,
       EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted
                  AND l.classid = 1936613751::oid AND l.objid = b.block::oid
                  AND l.objsubid = 2) AS live,
       (SELECT l.pid FROM pg_catalog.pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted
           AND l.classid = 1936613751::oid AND l.objid = b.block::oid
           AND l.objsubid = 2 LIMIT 1) AS registry_pid,
       b.released_at, b.leases
  FROM snowflake_lease_blocks b;
COMMENT ON VIEW snowflake_leases IS
  'Every block of worker ids known to this registry: holder (name and node id), leased at, expires at (registry clock), floor (new holders start above it), and whether the holder''s session is live.';
REVOKE ALL ON snowflake_leases FROM PUBLIC;

-- The block locks a holder's registry session holds (class 1936613751,
-- objsubid 2: two-key advisory locks). Session-level advisory locks
-- stack: taken twice, one unlock leaves them held. So the lease functions
-- take a block's lock only when this session does not hold it yet, and
-- drop it completely, so that `snowflake_leases.live` stays true.
CREATE FUNCTION snowflake_lease_locks_held() RETURNS SETOF int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT l.objid::int FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_catalog.pg_backend_pid()
       AND l.classid = 1936613751::oid AND l.objsubid = 2
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                          WHERE d.datname = pg_catalog.current_database())
$fn$;
COMMENT ON FUNCTION snowflake_lease_locks_held() IS
  'Used by the lease functions: the blocks whose lock this registry session holds.';

-- A holder introduces itself: takes the session lock of its node id.
-- false: another live session holds that node id (a copy of a data
-- directory whose original is running): the caller must take a new id.
CREATE FUNCTION snowflake_lease_hello(node text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pg_try_advisory_lock(hashtextextended('snowflake_id node ' || node, 0))
$fn$;
COMMENT ON FUNCTION snowflake_lease_hello(text) IS
  'Called by a holder''s lease worker: takes the session lock of its node id; false when another live session holds it (a copied data directory).';

-- Leases up to `want` free blocks among `allowed` (block numbers of
-- `block_size` ids each) to `node`: the least recently used first (the
-- lowest high-water mark), a free block, or one whose lease expired more
-- than its grace ago by this server's clock. Returns each block with the
-- floor its new holder must start above (the highest ID time any earlier
-- holder may have issued) and records the new holder's own bound `high_ms`.
CREATE FUNCTION snowflake_lease_acquire(node text, name text, layout text, block_size int,
                                        max_worker_id int, allowed int[], want int,
                                        lease_ms bigint, grace_ms bigint, high_ms bigint)
RETURNS TABLE (block int, first_worker_id int, last_worker_id int, floor_ms bigint)
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    other text;
BEGIN
    IF block_size < 1 OR want < 1 THEN
        RAISE EXCEPTION 'snowflake_lease_acquire: block_size and want must be positive';
    END IF;
    INSERT INTO @extschema@.snowflake_lease_blocks AS b (block, first_worker_id, last_worker_id, layout)
    SELECT a, a * block_size, least(a * block_size + block_size - 1, max_worker_id), layout
      FROM unnest(allowed) a
     WHERE a >= 0 AND a * block_size <= max_worker_id
    ON CONFLICT DO NOTHING;
    SELECT b.layout INTO other FROM @extschema@.snowflake_lease_blocks b
     WHERE b.block = ANY (allowed) AND b.layout <> snowflake_lease_acquire.layout LIMIT 1;
    IF other IS NOT NULL THEN
        RAISE EXCEPTION 'snowflake_id: this fleet''s leases were made under another layout'
            USING ERRCODE = '55000',
                  DETAIL = format('The registry''s blocks use %s; the server %s uses %s.', other, name, layout),
                  HINT = 'Every server of a fleet must use the same snowflake_id layout settings.';
    END IF;
    RETURN QUERY
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
    )
    UPDATE @extschema@.snowflake_lease_blocks b
       SET holder_node = node, holder_name = name, leased_at = now(), renewed_at = now(),
           expires_at = now() + lease_ms * interval '1 millisecond',
           grace = grace_ms * interval '1 millisecond',
           high_water_ms = greatest(b.high_water_ms, high_ms), released_at = NULL,
           leases = b.leases + 1
      FROM old
     WHERE b.block = old.block
 RETURNING b.block, b.first_worker_id, b.last_worker_id, old.high_water_ms;
    PERFORM pg_try_advisory_lock(1936613751, b.block)
       FROM @extschema@.snowflake_lease_blocks b
      WHERE b.holder_node = node AND b.block = ANY (allowed)
        AND b.block NOT IN (SELECT h FROM @extschema@.snowflake_lease_locks_held() h);
END
$fn$;
COMMENT ON FUNCTION snowflake_lease_acquire(text, text, text, int, int, int[], int, bigint, bigint, bigint) IS
  'Called by a holder''s lease worker: leases free or expired blocks of worker ids, least recently used first, and returns the floor each must start above.';

-- Renews `node`'s leases of `blocks`: a new expiry by this server's clock
-- and the holder's new bound. Returns the blocks still leased to `node`
-- with their marks before the renewal (a block missing from the result
-- was handed to another holder after its lease expired).
CREATE FUNCTION snowflake_lease_renew(node text, blocks int[], lease_ms bigint, grace_ms bigint,
                                      high_ms bigint)
RETURNS TABLE (block int, floor_ms bigint)
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- One look at pg_locks per renewal (it briefly takes every lock
    -- partition of the registry).
    locked int[] := ARRAY(SELECT h FROM @extschema@.snowflake_lease_locks_held() h);
BEGIN
    RETURN QUERY
    WITH old AS (
        SELECT b.block, b.high_water_ms FROM @extschema@.snowflake_lease_blocks b
         WHERE b.block = ANY (blocks) AND b.holder_node = node
           FOR UPDATE
    )
    UPDATE @extschema@.snowflake_lease_blocks b
       SET renewed_at = now(), expires_at = now() + lease_ms * interval '1 millisecond',
           grace = grace_ms * interval '1 millisecond',
           high_water_ms = greatest(b.high_water_ms, high_ms)
      FROM old
     WHERE b.block = old.block
 RETURNING b.block, old.high_water_ms;
    -- After a reconnect the session locks are gone: take them again.
    PERFORM pg_try_advisory_lock(1936613751, b.block)
       FROM @extschema@.snowflake_lease_blocks b
      WHERE b.holder_node = node AND b.block = ANY (blocks) AND b.block <> ALL (locked);
    -- Blocks handed to another holder: this session's lock is stale.
    PERFORM pg_advisory_unlock(1936613751, h)
       FROM unnest(locked) h
      WHERE h = ANY (blocks)
        AND NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_blocks b
                         WHERE b.block = h AND b.holder_node = node);
END
$fn$;
COMMENT ON FUNCTION snowflake_lease_renew(text, int[], bigint, bigint, bigint) IS
  'Called by a holder''s lease worker: extends its leases and raises their marks; returns the blocks it still holds.';

-- Gives a block back. The holder has stopped issuing from it and passes
-- the time of the newest ID it issued there (not below the block's floor
-- when it leased it), which becomes the next holder's floor.
CREATE FUNCTION snowflake_lease_release(node text, blk int, high_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    done boolean;
BEGIN
    UPDATE @extschema@.snowflake_lease_blocks b
       SET holder_node = NULL, released_at = now(), expires_at = NULL, high_water_ms = high_ms
     WHERE b.block = blk AND b.holder_node = node;
    done := FOUND;
    PERFORM pg_advisory_unlock(1936613751, h)
       FROM @extschema@.snowflake_lease_locks_held() h WHERE h = blk;
    RETURN done;
END
$fn$;
COMMENT ON FUNCTION snowflake_lease_release(text, int, bigint) IS
  'Called by a holder''s lease worker: returns an idle block, recording the time of the newest ID it issued there.';

REVOKE EXECUTE ON FUNCTION snowflake_lease_locks_held() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_lease_hello(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_lease_acquire(text, text, text, int, int, int[], int, bigint, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_lease_renew(text, int[], bigint, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_lease_release(text, int, bigint) FROM PUBLIC;
