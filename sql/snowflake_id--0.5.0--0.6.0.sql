-- snowflake_id 0.5.0 -> 0.6.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.5.0's install script is kept
-- in tests/upgrade/ for it).

\echo Use "ALTER EXTENSION snowflake_id UPDATE TO '0.6.0'" to load this file. \quit

-- ===================================================================
-- Internal objects move to the schema snowflake_id_internal (issue 23)
-- ===================================================================
-- The internal functions leave the extension's (the user's) schema for a
-- schema of the extension's own (src/sql/internal_schema.sql): the
-- registry's lease protocol (snowflake_lease_hello, _begin, _reply,
-- _acquire, _renew, _release), the trigger functions
-- (snowflake_lease_forget, snowflake_registry_high_water,
-- snowflake_registry_merge) and the explicit-layout decoders' checks
-- (snowflake_layout_shift, _id, _ticks). Names, privileges and comments
-- stay. Every user-facing name stays where it is.
--
-- ALTER ... SET SCHEMA, not DROP and CREATE: the functions keep their
-- OIDs, so the triggers that run them, and the SQL-standard bodies of the
-- explicit-layout snowflake_timestamp(...) and snowflake_from_timestamp(...)
-- (which name the checks by OID) stay as they are, and with them every
-- index, generated column and partition bound that uses those decoders.
--
-- Lease holders find the functions through the extension's membership
-- from 0.6.0 on; a 0.5.0 holder looks for them in the extension's schema
-- and stops finding them: restart the holders on the 0.6.0 library first,
-- then update the registry (docs/operations/upgrading.md).

CREATE SCHEMA snowflake_id_internal;
COMMENT ON SCHEMA snowflake_id_internal IS
  'Internal objects of the snowflake_id extension (lease protocol, trigger functions, decoder checks): not an API; they may change in any release.';
REVOKE ALL ON SCHEMA snowflake_id_internal FROM PUBLIC;

ALTER FUNCTION snowflake_lease_hello(text) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_begin(jsonb) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_reply(text, timestamptz, jsonb) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_acquire(jsonb) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_renew(jsonb) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_release(jsonb) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_lease_forget() SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_registry_high_water() SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_registry_merge() SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_layout_shift(bigint, int, int, int) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_layout_id(bigint, int) SET SCHEMA snowflake_id_internal;
ALTER FUNCTION snowflake_layout_ticks(numeric, int, timestamptz, timestamptz) SET SCHEMA snowflake_id_internal;

-- The plpgsql bodies that call snowflake_lease_begin() and
-- snowflake_lease_reply() name them by schema, as text resolved when they
-- run: replaced (same signatures, so same OIDs, privileges and comments)
-- by 0.6.0's, which name snowflake_id_internal. The other moved bodies
-- name only the extension's tables and user-facing functions, which stay.
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
      WHERE b.holder_node = node AND b.block = ANY (allowed) AND b.block <> ALL (g.locked);
    RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until,
                                             jsonb_build_object('blocks', granted));
END
$fn$;

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
        SELECT b.block, b.high_water_ms, a.high_ms AS asserted, b.holder_node = node AS mine
          FROM @extschema@.snowflake_lease_blocks b
          JOIN asked a ON a.block = b.block
         WHERE b.holder_node = node
            OR (reassert AND (b.holder_node IS NULL OR b.expires_at + b.grace < now()))
           FOR UPDATE OF b
    ), done AS (
        UPDATE @extschema@.snowflake_lease_blocks b
           SET holder_node = node,
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
      WHERE b.holder_node = node AND b.block = ANY (blocks) AND b.block <> ALL (g.locked);
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

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    blk int := (req->>'block')::int;
    high_ms bigint := (req->>'high_ms')::bigint;
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
     WHERE b.block = blk AND b.holder_node = node;
    done := FOUND;
    PERFORM pg_advisory_unlock(1936613751, blk) WHERE blk = ANY (g.locked);
    RETURN snowflake_id_internal.snowflake_lease_reply(g.incarnation, g.fenced_until,
                                             jsonb_build_object('released', done));
END
$fn$;

-- A role that was granted EXECUTE on the lease functions (the role the
-- lease workers connect as, when it is not a superuser) needs USAGE on
-- their new schema to call them: granted here, so that the fleet keeps
-- its leases through the update. (A fresh install grants it to no one:
-- docs/operations/fleet.md.)
DO $do$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole AS role
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.pronamespace = 'snowflake_id_internal'::pg_catalog.regnamespace
           AND p.proname LIKE 'snowflake\_lease\_%'
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA snowflake_id_internal TO %s', r.role);
        -- A WARNING: an extension script shows nothing below it.
        RAISE WARNING 'granted USAGE on schema snowflake_id_internal to %, which may execute the lease functions', r.role
            USING HINT = 'pg_dump does not dump this grant (it is the extension''s own): grant it again after restoring this database elsewhere.';
    END LOOP;
END
$do$;

-- ===================================================================
-- End of: internal objects move to snowflake_id_internal
-- ===================================================================

-- ===================================================================
-- Backfill: snowflake_at(ts), IDs for past times (issue 24)
-- ===================================================================
-- New in 0.6.0 (src/sql/backfill.rs, src/sql/backfill.sql): the
-- functions, the table the registry worker keeps the grants in, and its
-- restore triggers, as a fresh install makes them.

CREATE  FUNCTION "snowflake_at"(
	"ts" timestamp with time zone /* TimestampWithTimeZone */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_at_wrapper';

CREATE  FUNCTION "snowflake_backfill"() RETURNS TABLE (
	"bucket" INT,  /* i32 */
	"starts_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"ends_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"grants" bigint,  /* i64 */
	"capacity" bigint,  /* i64 */
	"worker_ids" TEXT  /* String */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_backfill_wrapper';

CREATE  FUNCTION "snowflake_backfill_raise"(
	"starts_at" timestamp with time zone, /* TimestampWithTimeZone */
	"grants" bigint, /* i64 */
	"worker_ids" TEXT DEFAULT '' /* String */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_backfill_raise_wrapper';

-- snowflake_at() (src/sql/backfill.rs) consumes backfill grants, a durable
-- and finite resource of the server (snowflake_backfill() shows them):
-- superusers only, and the roles they GRANT EXECUTE to (a migration's).
REVOKE EXECUTE ON FUNCTION snowflake_at(timestamptz) FROM PUBLIC;
-- Raising grants changes the server's durable state: superusers only (it
-- also checks), like snowflake_advance_past().
REVOKE EXECUTE ON FUNCTION snowflake_backfill_raise(timestamptz, bigint, text) FROM PUBLIC;

-- snowflake_backfill_grants: the grants of each stretch of time, copied from
-- shared memory by the registry worker (src/workers/registry_worker.rs) in
-- snowflake_id.registry_database, like snowflake_worker_registry, so that
-- pg_upgrade and a dump carry them: the worker reads the table when the
-- server starts, and rows a restore inserts raise this server's grants.
-- Keyed by the stretch's first time, which does not depend on the layout's
-- bits.
CREATE TABLE snowflake_backfill_grants (
    starts_at  timestamptz PRIMARY KEY,
    grants     bigint NOT NULL,
    worker_ids text NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE snowflake_backfill_grants IS
  'Backfill grants handed out per stretch of time (snowflake_backfill()); kept by the snowflake_id registry worker in the database named by snowflake_id.registry_database.';
REVOKE ALL ON snowflake_backfill_grants FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('snowflake_backfill_grants', '');

-- Rows a restore brings back raise this server's grants of their stretch:
-- grants the old server handed out are not handed out again. The registry
-- worker's own upserts skip the triggers.
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_restored() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT starts_at, max(grants) AS grants, max(worker_ids) AS worker_ids
               FROM new_rows GROUP BY starts_at LOOP
        BEGIN
            PERFORM @extschema@.snowflake_backfill_raise(r.starts_at, r.grants, r.worker_ids);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'snowflake_id: restored backfill grants of the time from % were not raised: %', r.starts_at, SQLERRM
                USING HINT = 'Restore as a superuser, into a server that preloads snowflake_id, or run snowflake_backfill_raise() for the rows of snowflake_backfill_grants.';
        END;
    END LOOP;
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_backfill_restored() IS
  'Trigger on snowflake_backfill_grants: restored rows raise this server''s backfill grants.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_restored() FROM PUBLIC;
CREATE TRIGGER snowflake_backfill_restored
    AFTER INSERT ON snowflake_backfill_grants
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_backfill_restored();
-- A restored row for a stretch already recorded replaces it, keeping the
-- higher count, instead of failing the restore's COPY on the primary key.
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_merge() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
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
COMMENT ON FUNCTION snowflake_id_internal.snowflake_backfill_merge() IS
  'Trigger on snowflake_backfill_grants: a restored row replaces the row of the same stretch, keeping the higher count.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_merge() FROM PUBLIC;
CREATE TRIGGER snowflake_backfill_merge
    BEFORE INSERT ON snowflake_backfill_grants
    FOR EACH ROW EXECUTE FUNCTION snowflake_id_internal.snowflake_backfill_merge();

COMMENT ON FUNCTION snowflake_at(timestamptz) IS
  'An ID that decodes to the given past time and equals no other ID, from the worker ids set aside by snowflake_id.backfill_worker_ids (backfill; EXECUTE granted by a superuser).';
COMMENT ON FUNCTION snowflake_backfill() IS
  'Backfill grants of each stretch of time: its first and last time, grants handed out, grants it holds.';
COMMENT ON FUNCTION snowflake_backfill_raise(timestamptz, bigint, text) IS
  'Raises this server''s backfill grants of the stretch of time containing the given time (restored snowflake_backfill_grants rows); superusers only.';

-- ===================================================================
-- End of: backfill
-- ===================================================================
