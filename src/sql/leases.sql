-- The registry side of fleet leases (see core/src/lease.rs for the rules and
-- the safety argument, core/src/holder.rs for the holder side, and
-- docs/design/fleet-fencing.md for incarnations and fences).
--
-- Any server with the extension created can be a fleet's registry: the
-- holders' lease workers connect to it and call the functions below. No
-- preloading is needed here; every rule that uses the registry's clock is
-- in these functions (now()), every rule that uses a holder's clock is in
-- the holder.
--
-- The tables and the view are in the extension's schema;
-- the functions are internal, in snowflake_id_internal
-- (src/sql/internal_schema.sql), where the holders find them through the
-- extension's membership (src/workers/lease_worker/connection.rs). Every
-- name in their bodies is schema-qualified, and their search_path is
-- pinned to pg_catalog, pg_temp.

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
    holder_session text,
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

-- The registry's incarnation: one row. A registry that may have forgotten
-- grants it confirmed (a new WAL timeline after promotion or PITR, its
-- WAL position below one a holder saw, the row gone because the lease
-- table was emptied or the extension made again, a restart with fsync
-- off) starts a new incarnation, and fences it when holders may be using
-- grants it no longer knows: no block is leased anew until every such
-- grant has run out (the longest lease time plus grace), and every
-- block's mark is raised above what such a grant allowed. Not dumped by
-- pg_dump: a restored copy starts a new incarnation.
CREATE TABLE snowflake_lease_registry (
    incarnation       text NOT NULL,
    timeline          int NOT NULL,
    postmaster_start  timestamptz NOT NULL,
    started_at        timestamptz NOT NULL,
    fenced_until      timestamptz,
    fence_floor_ms    bigint NOT NULL DEFAULT 0,
    max_lease_ms      bigint NOT NULL DEFAULT 0,
    max_grace_ms      bigint NOT NULL DEFAULT 0,
    max_ahead_ms      bigint NOT NULL DEFAULT 0,
    cause             text NOT NULL
);
CREATE UNIQUE INDEX snowflake_lease_registry_one_row ON snowflake_lease_registry ((true));
COMMENT ON TABLE snowflake_lease_registry IS
  'This registry''s incarnation: a new one, fenced, whenever it may have forgotten grants it confirmed (new timeline, restore, emptied lease table).';
REVOKE ALL ON snowflake_lease_registry FROM PUBLIC;

-- Emptying the lease table (DELETE, TRUNCATE) or restoring it forgets
-- grants: the next call starts a new incarnation.
-- The row stays (a tombstone with the largest lease time, grace and lead
-- seen): the registry starts a new incarnation at once, fenced for as long
-- as any grant it knew of could last, also when no holder is connected.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    now_ms bigint := (extract(epoch FROM now()) * 1000)::bigint;
    floor_ms bigint;
BEGIN
    UPDATE @extschema@.snowflake_lease_registry g
       SET incarnation = md5(gen_random_uuid()::text), started_at = now(),
           cause = format('rows of the lease table were %s',
                          CASE TG_OP WHEN 'INSERT' THEN 'restored' WHEN 'DELETE' THEN 'deleted'
                                     ELSE 'truncated' END),
           fenced_until = greatest(g.fenced_until,
                                   now() + (g.max_lease_ms + g.max_grace_ms) * interval '1 millisecond'),
           fence_floor_ms = greatest(g.fence_floor_ms, now_ms + g.max_ahead_ms + g.max_grace_ms)
    RETURNING g.fence_floor_ms INTO floor_ms;
    UPDATE @extschema@.snowflake_lease_blocks b
       SET high_water_ms = greatest(b.high_water_ms, floor_ms)
     WHERE floor_ms IS NOT NULL AND b.high_water_ms < floor_ms;
    RAISE LOG 'snowflake_id registry: the lease table was changed by % (%): new incarnation, fenced',
        TG_OP, TG_TABLE_NAME;
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_forget() IS
  'Trigger: rows of snowflake_lease_blocks deleted means grants forgotten; the next lease call starts a new, fenced incarnation.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_forget() FROM PUBLIC;
CREATE TRIGGER snowflake_lease_blocks_forget AFTER DELETE ON snowflake_lease_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();
CREATE TRIGGER snowflake_lease_blocks_truncate AFTER TRUNCATE ON snowflake_lease_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();
-- Rows that arrive leased come from a restore (pg_restore, COPY): the
-- registry's record is older than its holders'. (The lease functions
-- insert rows unleased.)
CREATE TRIGGER snowflake_lease_blocks_restored AFTER INSERT ON snowflake_lease_blocks
    FOR EACH ROW WHEN (NEW.holder_node IS NOT NULL) EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();

-- A holder introduces itself: takes the session lock of its node id.
-- false: another live session holds that node id (a copy of a data
-- directory whose original is running): the caller must take a new id.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_hello(node text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pg_try_advisory_lock(hashtextextended('snowflake_id node ' || node, 0))
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) IS
  'Called by a holder''s lease worker: takes the session lock of its node id; false when another live session holds it (a copied data directory).';

-- The start of every lease call: checks that this session holds the
-- node's lock (only the holder's own session renews or releases its
-- blocks), starts a new incarnation when the registry may have forgotten
-- grants, and returns it with the fence and the block locks this session
-- holds (one look at pg_locks: it briefly takes every lock partition).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_begin(req jsonb, OUT incarnation text,
                                                            OUT fenced_until timestamptz,
                                                            OUT locked int[], OUT fence_floor_ms bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    known text := coalesce(req->>'incarnation', '');
    seen pg_lsn := coalesce(req->>'lsn', '0/0')::pg_lsn;
    lease_ms bigint := coalesce((req->>'lease_ms')::bigint, 0);
    grace_ms bigint := coalesce((req->>'grace_ms')::bigint, 0);
    high_ms bigint := (req->>'high_ms')::bigint;
    key bigint;
    mydb oid := (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
    has_node boolean;
    tli int := ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int;
    now_ms bigint := (extract(epoch FROM now()) * 1000)::bigint;
    r @extschema@.snowflake_lease_registry;
    cause text;
    evidence boolean := false;
BEGIN
    IF node IS NULL THEN
        RAISE EXCEPTION 'lease request has no node' USING ERRCODE = '22023';
    END IF;
    IF current_setting('synchronous_commit') = 'off' THEN
        RAISE EXCEPTION 'lease sessions must commit synchronously'
            USING ERRCODE = '55000',
                  DETAIL = 'synchronous_commit is off in this session: a grant could be lost in a crash after the holder used it.',
                  HINT = 'Do not set synchronous_commit = off for the role the lease workers connect as (the lease worker asks for on).';
    END IF;
    key := hashtextextended('snowflake_id node ' || node, 0);
    SELECT coalesce(bool_or(l.objsubid = 1 AND l.classid = ((key >> 32) & 4294967295)::oid
                            AND l.objid = (key & 4294967295)::oid), false),
           coalesce(array_agg(l.objid::int) FILTER (WHERE l.objsubid = 2
                                                     AND l.classid = 1936613751::oid), '{}')
      INTO has_node, locked
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_catalog.pg_backend_pid()
       AND l.database = mydb;
    IF NOT has_node THEN
        RAISE EXCEPTION 'this session does not hold the lock of node %', node
            USING ERRCODE = '42501',
                  DETAIL = 'Only the registry session of the server that is this node (after snowflake_lease_hello) may lease, renew or release its blocks.',
                  HINT = 'Lease functions are called by the snowflake_id lease worker of each server; do not call them by hand.';
    END IF;
    -- No row lock: a new incarnation replaces the one row (two calls that
    -- both try fail one on the unique index; its holder retries).
    SELECT * INTO r FROM @extschema@.snowflake_lease_registry;
    IF NOT FOUND THEN
        cause := 'a registry with no incarnation (new, made again, lease table emptied or restored)';
        -- Holders may be using grants it forgot: the caller knew an older
        -- incarnation or holds block locks, leased rows (restored), or
        -- other live sessions holding block locks here.
        evidence := known <> '' OR cardinality(locked) > 0
                 OR EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_blocks b WHERE b.holder_node IS NOT NULL)
                 OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                             WHERE l.locktype = 'advisory' AND l.classid = 1936613751::oid
                               AND l.objsubid = 2 AND l.database = mydb
                               AND l.pid <> pg_catalog.pg_backend_pid());
    ELSIF r.timeline <> tli THEN
        cause := format('WAL timeline %s, was %s (promotion or point-in-time recovery)', tli, r.timeline);
        evidence := true;
    ELSIF seen > pg_current_wal_insert_lsn() THEN
        cause := format('a holder saw WAL position %s, above this server''s %s (the registry went back in time)',
                        seen, pg_current_wal_insert_lsn());
        evidence := true;
    ELSIF current_setting('fsync') = 'off' AND r.postmaster_start <> pg_postmaster_start_time() THEN
        cause := 'a restart with fsync off';
        evidence := true;
    ELSIF known <> '' AND known <> r.incarnation AND (r.fenced_until IS NULL OR r.fenced_until < now())
          AND now() < r.started_at + (greatest(r.max_lease_ms, lease_ms) + greatest(r.max_grace_ms, grace_ms))
                                     * interval '1 millisecond' THEN
        -- A holder of an older incarnation soon after this one began
        -- unfenced: it may be using a grant this one forgot.
        cause := format('node %s knew incarnation %s', node, known);
        evidence := true;
    END IF;
    IF cause IS NOT NULL THEN
        DELETE FROM @extschema@.snowflake_lease_registry;
        r.incarnation := md5(gen_random_uuid()::text);
        r.timeline := tli;
        r.postmaster_start := pg_postmaster_start_time();
        r.started_at := now();
        r.cause := cause;
        r.max_lease_ms := greatest(coalesce(r.max_lease_ms, 0), lease_ms);
        r.max_grace_ms := greatest(coalesce(r.max_grace_ms, 0), grace_ms);
        r.max_ahead_ms := greatest(coalesce(r.max_ahead_ms, 0), coalesce(high_ms - now_ms, 0));
        r.fence_floor_ms := coalesce(r.fence_floor_ms, 0);
        r.fenced_until := NULL;
        IF evidence THEN
            r.fenced_until := now() + (r.max_lease_ms + r.max_grace_ms) * interval '1 millisecond';
            r.fence_floor_ms := now_ms + r.max_ahead_ms + r.max_grace_ms;
            UPDATE @extschema@.snowflake_lease_blocks b
               SET high_water_ms = greatest(b.high_water_ms, r.fence_floor_ms);
            RAISE LOG 'snowflake_id registry: new incarnation % after %: no block is leased anew until %, and every block''s floor is raised to %',
                r.incarnation, cause, r.fenced_until, to_timestamp(r.fence_floor_ms / 1000.0);
        ELSE
            RAISE LOG 'snowflake_id registry: new incarnation % (%)', r.incarnation, cause;
        END IF;
        INSERT INTO @extschema@.snowflake_lease_registry SELECT r.*;
    ELSIF lease_ms > r.max_lease_ms OR grace_ms > r.max_grace_ms OR high_ms - now_ms > r.max_ahead_ms THEN
        -- A fence still running grows with what holders tell: it must
        -- outlast the longest lease any of them may hold.
        UPDATE @extschema@.snowflake_lease_registry g
           SET max_lease_ms = greatest(g.max_lease_ms, lease_ms),
               max_grace_ms = greatest(g.max_grace_ms, grace_ms),
               max_ahead_ms = greatest(g.max_ahead_ms, coalesce(high_ms - now_ms, 0)),
               fenced_until = CASE WHEN g.fenced_until > now()
                   THEN greatest(g.fenced_until, g.started_at
                        + (greatest(g.max_lease_ms, lease_ms) + greatest(g.max_grace_ms, grace_ms))
                          * interval '1 millisecond') END,
               fence_floor_ms = CASE WHEN g.fenced_until > now()
                   THEN greatest(g.fence_floor_ms, (extract(epoch FROM g.started_at) * 1000)::bigint
                        + greatest(g.max_ahead_ms, coalesce(high_ms - now_ms, 0))
                        + greatest(g.max_grace_ms, grace_ms))
                   ELSE g.fence_floor_ms END
        RETURNING * INTO r;
        IF r.fenced_until > now() THEN
            UPDATE @extschema@.snowflake_lease_blocks b
               SET high_water_ms = r.fence_floor_ms
             WHERE b.high_water_ms < r.fence_floor_ms;
        END IF;
    END IF;
    incarnation := r.incarnation;
    fence_floor_ms := r.fence_floor_ms;
    fenced_until := CASE WHEN r.fenced_until > now() THEN r.fenced_until END;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) IS
  'Used by the lease functions: checks the caller holds the node''s lock and returns the registry''s incarnation and fence, starting a new one when grants may have been forgotten.';

-- The calling registry session, as `pid:start` (backend start in Unix
-- microseconds): what a holder knows of its own earlier session. A node's
-- blocks stay with the session that leased or last renewed them, or one
-- that names it as its previous session (the same holder, reconnected). A
-- session that cannot name it (a copy of the holder's data directory that
-- took over its node id while the original is cut off, or the holder
-- restarted) gets them only once their lease and grace ran out, as a new
-- lease with the block's mark as its floor: as a ZooKeeper ephemeral node
-- outlives its session until the session timeout.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_session() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT s.pid || ':' || (extract(epoch FROM s.backend_start) * 1000000)::int8
      FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) s
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_session() IS
  'Used by the lease functions: this registry session as pid:start, the session a node''s blocks belong to.';

-- The reply every lease call ends with.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_reply(incarnation text, fenced_until timestamptz,
                                                            extra jsonb)
RETURNS jsonb
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT jsonb_build_object(
        'incarnation', incarnation,
        'lsn', pg_current_wal_insert_lsn()::text,
        'fenced_until_ms', (extract(epoch FROM fenced_until) * 1000)::bigint) || extra
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_reply(text, timestamptz, jsonb) IS
  'Used by the lease functions: the reply with the incarnation, WAL position and fence.';

-- Leases up to `want` free blocks among `allowed` (block numbers of
-- `block_size` ids each) to `node`: the least recently used first (the
-- lowest high-water mark), a free block, or one whose lease expired more
-- than its grace ago by this server's clock; none while fenced. Returns
-- each block with the floor its new holder must start above (the highest
-- ID time any earlier holder may have issued) and records the new
-- holder's own bound `high_ms`.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_acquire(req jsonb) RETURNS jsonb
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

-- Renews `node`'s leases of the blocks it names: a new expiry by this
-- server's clock and the holder's new bound. During a fence, a holder that
-- knew an older incarnation re-asserts its blocks: each one not leased to
-- another live holder is its again, with the greater of the marks. Returns
-- the blocks still leased to `node` with their marks before the renewal
-- (a block missing from the result was handed to another holder after its
-- lease expired, or was not re-asserted).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_renew(req jsonb) RETURNS jsonb
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

-- Gives a block back. The holder has stopped issuing from it and passes
-- the time of the newest ID it issued there (not below the block's floor
-- when it leased it), which becomes the next holder's floor.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
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

REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_reply(text, timestamptz, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_session() FROM PUBLIC;

-- A registry made with no holder alive starts its first incarnation here,
-- unfenced, so that a standby made from it has the row and its timeline
-- (its promotion is then a timeline change, fenced). Made again while
-- holders' sessions hold block locks (the extension dropped and created
-- again), no row: the first lease call fences.
INSERT INTO @extschema@.snowflake_lease_registry
       (incarnation, timeline, postmaster_start, started_at, cause)
SELECT md5(gen_random_uuid()::text),
       ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int,
       pg_postmaster_start_time(), now(), 'created'
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                    WHERE l.locktype = 'advisory' AND l.classid = 1936613751::oid AND l.objsubid = 2
                      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                         WHERE d.datname = pg_catalog.current_database()));
