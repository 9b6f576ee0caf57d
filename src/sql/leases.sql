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
    -- The mark when its holder leased it (or re-asserted it to a new
    -- incarnation): the floor that holder's IDs are above. A release never
    -- lowers the mark below it (0.7.0).
    floor_ms       bigint NOT NULL DEFAULT 0,
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
-- grant has run out (the longest lease time plus grace the fleet's limits
-- allow), and every block's mark is raised above what such a grant
-- allowed. max_lease_ms, max_grace_ms and max_ahead_ms are the largest
-- lease time, grace and lead of a mark over the registry's clock that
-- holders asked for: shown for choosing the limits, no longer what fences
-- rest on (0.7.0: a failover may lose them with the grants). Not dumped by
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
    cause             text NOT NULL,
    -- The incarnation this one continues without a fence (0.7.0): a
    -- promoted synchronous standby that had every durable grant of it
    -- (snowflake_lease_promotion_proven). Its holders are not evidence.
    previous_incarnation text
);
CREATE UNIQUE INDEX snowflake_lease_registry_one_row ON snowflake_lease_registry ((true));
COMMENT ON TABLE snowflake_lease_registry IS
  'This registry''s incarnation: a new one, fenced, whenever it may have forgotten grants it confirmed (new timeline, restore, emptied lease table).';
REVOKE ALL ON snowflake_lease_registry FROM PUBLIC;

-- The registry's failover candidates (0.7.0): one row, written by
-- snowflake_lease_durable. `members` are the application names of the
-- synchronous (or quorum) standbys that flushed every grant reported
-- durable since they were added, and stay members until `valid_until`
-- (about 30 s ahead, moved on while they keep up). A member that is gone
-- or behind holds every durable report back until 15 s past valid_until
-- (a margin for the standbys' clocks), and only then is dropped. So a
-- standby promoted before the valid_until of the last row it has, and
-- named in it, has every grant any holder used: its new incarnation
-- needs no fence (snowflake_lease_promotion_proven). The standby knows
-- its name from snowflake_id.registry_standby_name, which must be the
-- application_name it streams with. Not dumped: a restored copy has no
-- row, and fences.
CREATE TABLE snowflake_lease_standbys (
    members      text[] NOT NULL,
    valid_until  timestamptz NOT NULL,
    timeline     int NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE UNIQUE INDEX snowflake_lease_standbys_one_row ON snowflake_lease_standbys ((true));
COMMENT ON TABLE snowflake_lease_standbys IS
  'The registry''s synchronous standbys that have every grant reported durable until valid_until: one of them promoted before then starts a new incarnation without a fence.';
REVOKE ALL ON snowflake_lease_standbys FROM PUBLIC;

-- The fleet's limits (0.7.0): no lease request may exceed them, and fences
-- rest on them. Every lease function refuses a request beyond them
-- (snowflake_lease_check: 54000, or 22023 for a value no holder sends),
-- so every grant this registry ever confirmed is within the limits in
-- force when it was made. A new incarnation that may have forgotten
-- grants is then fenced for max_lease_ms + max_grace_ms (every such grant
-- has run out at its holder by then), and raises every block's mark to
-- its clock + max_ahead_ms + max_grace_ms (above every mark such a grant
-- allowed): the fence never rests on what the registry saw of requests,
-- which a failover may have lost with the grants.
--
-- The defaults follow the holders' own settings (src/settings/define.rs,
-- core/src/lease.rs):
--   max_lease_ms 600000 (10 min): the default snowflake_id.lease_time. Not
--     its maximum (1 day): this is also how long every fenced failover
--     leases nothing anew, and a day of that is no default. A fleet whose
--     holders lease longer raises it, and its fences grow with it.
--   max_grace_ms 120000: the grace a holder asks for with that lease time
--     (lease::Timing::new: max(lease / 5, 1 s)).
--   max_ahead_ms 720000: how far a mark may lead this registry's clock. A
--     holder asks for marks of its clock + lease_time + max_drift: 600000
--     + 60000 (the default snowflake_id.max_drift) + 60000 for a holder's
--     clock ahead of the registry's. Not the settings' maxima (1 day +
--     1 h): after a fence a block is used only once its floor (raised by
--     this much) is within a holder's max_drift of its clock.
--   max_blocks_per_node 8: the default snowflake_id.max_blocks (its
--     maximum is the fleet's 64 blocks: one node could take them all).
-- Each has a range (snowflake_lease_limits_changed): max_lease_ms 2000 to
-- 86400000 (snowflake_id.lease_time's range), max_grace_ms 1000 (a
-- holder's least grace) to 86400000, max_ahead_ms 0 to 172800000 (the
-- longest lease time and max_drift, and most of a day for clocks),
-- max_blocks_per_node 1 to 64; so that no fence or floor computed from
-- them leaves bigint's or timestamptz's range.
--
-- Zero or one row, changed by snowflake_lease_set_limits() (or INSERT and
-- UPDATE by the owner, checked alike): without one the defaults are in
-- force. No row at creation, so that pg_dump, which dumps the row, can
-- restore it into a new CREATE EXTENSION. A limit lowered keeps bounding
-- fences (previous_*) until every grant made under the higher one has run
-- out, and its marks are behind the registry's clock (previous_until).
CREATE TABLE snowflake_lease_limits (
    max_lease_ms          bigint NOT NULL,
    max_grace_ms          bigint NOT NULL,
    max_ahead_ms          bigint NOT NULL,
    max_blocks_per_node   int NOT NULL,
    previous_max_lease_ms bigint,
    previous_max_grace_ms bigint,
    previous_max_ahead_ms bigint,
    previous_until        timestamptz,
    changed_at            timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX snowflake_lease_limits_one_row ON snowflake_lease_limits ((true));
COMMENT ON TABLE snowflake_lease_limits IS
  'The fleet''s limits, which no lease request may exceed and on which fences rest (no row: the defaults); change them with snowflake_lease_set_limits().';
REVOKE ALL ON snowflake_lease_limits FROM PUBLIC;
-- The DBA's choice travels with pg_dump of the registry's database.
SELECT pg_catalog.pg_extension_config_dump('snowflake_lease_limits', '');

-- The limits in force: the row's, or the defaults, each kept in its range
-- (a row written with its trigger disabled cannot push a fence out of
-- range), and what fences use: a limit, or the higher one it replaced
-- while grants made under that may still run (until previous_until).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_limits_in_force(
    OUT max_lease_ms bigint, OUT max_grace_ms bigint, OUT max_ahead_ms bigint,
    OUT max_blocks_per_node int, OUT fence_lease_ms bigint, OUT fence_grace_ms bigint,
    OUT fence_ahead_ms bigint, OUT previous_until timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT v.lease, v.grace, v.ahead, v.blocks,
           greatest(v.lease, p.lease), greatest(v.grace, p.grace), greatest(v.ahead, p.ahead), p.until
      FROM (SELECT 1) one
      LEFT JOIN @extschema@.snowflake_lease_limits l ON true
     CROSS JOIN LATERAL (
           SELECT least(greatest(coalesce(l.max_lease_ms, 600000), 2000), 86400000),
                  least(greatest(coalesce(l.max_grace_ms, 120000), 1000), 86400000),
                  least(greatest(coalesce(l.max_ahead_ms, 720000), 0), 172800000),
                  least(greatest(coalesce(l.max_blocks_per_node, 8), 1), 64)::int
           ) v(lease, grace, ahead, blocks)
      LEFT JOIN LATERAL (
           SELECT least(coalesce(l.previous_max_lease_ms, 0), 86400000),
                  least(coalesce(l.previous_max_grace_ms, 0), 86400000),
                  least(coalesce(l.previous_max_ahead_ms, 0), 172800000),
                  l.previous_until
            WHERE l.previous_until > now()
           ) p(lease, grace, ahead, until) ON true
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_limits_in_force() IS
  'Used by the lease functions: the registry''s limits in force (snowflake_lease_limits, or the defaults), and the larger ones fences still use after a limit was lowered.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_limits_in_force() FROM PUBLIC;

-- Checks a change of the limits (INSERT or UPDATE of the one row) and
-- keeps a lowered limit bounding fences: grants made under the higher one
-- may run until the registry's clock passes the change + that lease time
-- + grace, and their marks may lead it by up to that lead; until then
-- fences use the higher values (previous_*). Only when such a grant may
-- exist: a block leased and not past its expiry and grace, a mark ahead
-- of the clock, or a fence running. (A failover that loses the change
-- loses every grant after it too, WAL being replayed in order; the higher
-- values matter when rows are forgotten otherwise: the lease table
-- emptied.) A registry whose limits are set before its first holder
-- fences by them at once. The row is not deleted: the defaults are set
-- like any other values.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    was record;
    bad text;
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'the registry''s lease limits are changed, not deleted'
            USING ERRCODE = '55000',
                  HINT = 'Set them with snowflake_lease_set_limits(); the defaults are max_lease_ms 600000, max_grace_ms 120000, max_ahead_ms 720000, max_blocks_per_node 8.';
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
        END;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'invalid lease limit: %', bad
            USING ERRCODE = '22023',
                  HINT = 'Pass each limit within its range (max_lease_ms 2000 to 86400000, max_grace_ms 1000 to 86400000, max_ahead_ms 0 to 172800000, max_blocks_per_node 1 to 64), or NULL to keep it.';
    END IF;
    -- Before this change (a BEFORE trigger's query does not see its row).
    SELECT * INTO was FROM snowflake_id_internal.snowflake_lease_limits_in_force();
    NEW.changed_at := now();
    IF (NEW.max_lease_ms < was.max_lease_ms OR NEW.max_grace_ms < was.max_grace_ms
        OR NEW.max_ahead_ms < was.max_ahead_ms)
       AND (EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_blocks b
                     WHERE (b.holder_node IS NOT NULL AND b.expires_at + b.grace > now())
                        OR b.high_water_ms > extract(epoch FROM now()) * 1000)
            OR EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_registry g WHERE g.fenced_until > now())) THEN
        NEW.previous_max_lease_ms := was.fence_lease_ms;
        NEW.previous_max_grace_ms := was.fence_grace_ms;
        NEW.previous_max_ahead_ms := was.fence_ahead_ms;
        NEW.previous_until := greatest(was.previous_until,
            now() + (greatest(was.fence_lease_ms, was.fence_ahead_ms) + was.fence_grace_ms)
                    * interval '1 millisecond');
        RAISE NOTICE 'fences use the higher limits until %: grants made under them may still run',
            NEW.previous_until;
    ELSE
        NEW.previous_max_lease_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_lease_ms END;
        NEW.previous_max_grace_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_grace_ms END;
        NEW.previous_max_ahead_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_ahead_ms END;
        NEW.previous_until := was.previous_until;
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
    RAISE LOG 'snowflake_id registry: lease limits set by role %: max_lease_ms %, max_grace_ms %, max_ahead_ms %, max_blocks_per_node %',
        session_user, NEW.max_lease_ms, NEW.max_grace_ms, NEW.max_ahead_ms, NEW.max_blocks_per_node;
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() IS
  'Trigger: checks a change of snowflake_lease_limits, keeps a lowered limit bounding fences while grants made under the higher one may run, and refuses a DELETE or TRUNCATE.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() FROM PUBLIC;
CREATE TRIGGER snowflake_lease_limits_changed BEFORE INSERT OR UPDATE OR DELETE ON snowflake_lease_limits
    FOR EACH ROW EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed();
CREATE TRIGGER snowflake_lease_limits_truncate BEFORE TRUNCATE ON snowflake_lease_limits
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed();

-- The DBA's way to change the limits: each argument given replaces that
-- limit (NULL: unchanged); with none, nothing changes. Returns the limits
-- in force, one row each: `value` is what requests are checked against,
-- `fence_value` what fences use (higher, after a lowered limit, until
-- `fence_value_until`). For the extension's owner and superusers: EXECUTE
-- is revoked from PUBLIC, and it runs with the caller's rights on the
-- table (revoked from PUBLIC too).
CREATE FUNCTION snowflake_lease_set_limits(max_lease_ms bigint DEFAULT NULL,
                                           max_grace_ms bigint DEFAULT NULL,
                                           max_ahead_ms bigint DEFAULT NULL,
                                           max_blocks_per_node int DEFAULT NULL)
RETURNS TABLE (name text, value bigint, fence_value bigint, fence_value_until timestamptz)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    UPDATE @extschema@.snowflake_lease_limits l
       SET max_lease_ms = coalesce($1, l.max_lease_ms), max_grace_ms = coalesce($2, l.max_grace_ms),
           max_ahead_ms = coalesce($3, l.max_ahead_ms),
           max_blocks_per_node = coalesce($4, l.max_blocks_per_node)
     WHERE num_nonnulls($1, $2, $3, $4) > 0;
    -- The first change: from the defaults.
    INSERT INTO @extschema@.snowflake_lease_limits
           (max_lease_ms, max_grace_ms, max_ahead_ms, max_blocks_per_node)
    SELECT coalesce($1, f.max_lease_ms), coalesce($2, f.max_grace_ms),
           coalesce($3, f.max_ahead_ms), coalesce($4, f.max_blocks_per_node)
      FROM snowflake_id_internal.snowflake_lease_limits_in_force() f
     WHERE num_nonnulls($1, $2, $3, $4) > 0
       AND NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_limits);
    SELECT x.name, x.value, x.fence_value, CASE WHEN x.value < x.fence_value THEN f.previous_until END
      FROM snowflake_id_internal.snowflake_lease_limits_in_force() f
     CROSS JOIN LATERAL (VALUES ('max_lease_ms', f.max_lease_ms, f.fence_lease_ms),
                                ('max_grace_ms', f.max_grace_ms, f.fence_grace_ms),
                                ('max_ahead_ms', f.max_ahead_ms, f.fence_ahead_ms),
                                ('max_blocks_per_node', f.max_blocks_per_node::bigint,
                                 f.max_blocks_per_node::bigint)) x(name, value, fence_value)
$fn$;
COMMENT ON FUNCTION snowflake_lease_set_limits(bigint, bigint, bigint, int) IS
  'On a registry: changes the fleet''s limits (each argument given; none: no change) and returns those in force. No lease request may exceed them; fences rest on them.';
REVOKE EXECUTE ON FUNCTION snowflake_lease_set_limits(bigint, bigint, bigint, int) FROM PUBLIC;

-- Emptying the lease table (DELETE, TRUNCATE) or restoring it forgets
-- grants: the next call starts a new incarnation.
-- The row stays (a tombstone): the registry starts a new incarnation at
-- once, fenced for as long as any grant within the fleet's limits could
-- last, also when no holder is connected.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    now_ms bigint := (extract(epoch FROM now()) * 1000)::bigint;
    lim record;
    new_floor bigint;
BEGIN
    -- The limits bound every grant the registry confirmed (they are in
    -- range: no sum below leaves bigint's).
    SELECT * INTO lim FROM snowflake_id_internal.snowflake_lease_limits_in_force();
    UPDATE @extschema@.snowflake_lease_registry g
       SET incarnation = md5(gen_random_uuid()::text), started_at = now(),
           cause = format('rows of the lease table were %s',
                          CASE TG_OP WHEN 'INSERT' THEN 'restored' WHEN 'DELETE' THEN 'deleted'
                                     ELSE 'truncated' END),
           fenced_until = now() + (lim.fence_lease_ms + lim.fence_grace_ms) * interval '1 millisecond',
           fence_floor_ms = now_ms + lim.fence_ahead_ms + lim.fence_grace_ms
    RETURNING g.fence_floor_ms INTO new_floor;
    UPDATE @extschema@.snowflake_lease_blocks b
       SET high_water_ms = greatest(b.high_water_ms, new_floor)
     WHERE new_floor IS NOT NULL AND b.high_water_ms < new_floor;
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
-- One node per session (0.7.0): a session holding another node's lock is
-- refused (54000), so that max_blocks_per_node bounds what one session
-- can lease (a lease worker keeps one session, under one node id).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_hello(node text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    key bigint := hashtextextended('snowflake_id node ' || node, 0);
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                  AND l.pid = pg_catalog.pg_backend_pid()
                  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                     WHERE d.datname = pg_catalog.current_database())
                  AND NOT (l.classid = ((key >> 32) & 4294967295)::oid
                           AND l.objid = (key & 4294967295)::oid)) THEN
        RAISE LOG 'snowflake_id registry: refused node % (role %, %): the session is another node already',
            node, session_user, coalesce('client ' || inet_client_addr()::text, 'local connection');
        RAISE EXCEPTION 'lease request of node % refused: this session is another node already', node
            USING ERRCODE = '54000',
                  HINT = 'A lease worker introduces one node per session; max_blocks_per_node bounds each node.';
    END IF;
    RETURN pg_try_advisory_lock(key);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) IS
  'Called by a holder''s lease worker: takes the session lock of its node id; false when another live session holds it (a copied data directory). One node per session.';

-- Refuses a lease request beyond the fleet's limits (snowflake_lease_limits)
-- before anything changes: a lease time, grace or mark a holder within
-- them never asks for (54000, the limit named, with which setting of the
-- holder to lower or which limit to raise), more blocks for one node than
-- max_blocks_per_node (54000), or a value no holder sends at all: a block
-- outside the 64 of a layout, a negative lease time, grace or mark, a
-- block size or largest worker id of no layout (22023). Numbers are
-- compared as numeric, so no value is out of bigint's range here. Each
-- refusal is logged with the node, the session's role and address.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_check(req jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    now_ms numeric := trunc(extract(epoch FROM now()) * 1000);
    lease_ms numeric := (req->>'lease_ms')::numeric;
    grace_ms numeric := (req->>'grace_ms')::numeric;
    high_ms numeric := (req->>'high_ms')::numeric;
    want numeric := (req->>'want')::numeric;
    block_size numeric := (req->>'block_size')::numeric;
    max_worker_id numeric := (req->>'max_worker_id')::numeric;
    lim record;
    named numeric[];
    marks numeric[];
    bad numeric;
    held int := 0;
    problem text;
    hint text;
    code text := '54000';
BEGIN
    SELECT * INTO lim FROM snowflake_id_internal.snowflake_lease_limits_in_force();
    -- Every block the request names, and every mark.
    named := ARRAY(SELECT (req->>'block')::numeric WHERE req ? 'block'
                   UNION ALL
                   SELECT a::numeric FROM pg_catalog.jsonb_array_elements_text(
                       CASE WHEN pg_catalog.jsonb_typeof(req->'allowed') = 'array' THEN req->'allowed' END) a
                   UNION ALL
                   SELECT (a->>'block')::numeric FROM pg_catalog.jsonb_array_elements(
                       CASE WHEN pg_catalog.jsonb_typeof(req->'blocks') = 'array' THEN req->'blocks' END) a);
    marks := ARRAY(SELECT m FROM (SELECT high_ms
                                  UNION ALL
                                  SELECT (a->>'high_ms')::numeric FROM pg_catalog.jsonb_array_elements(
                                      CASE WHEN pg_catalog.jsonb_typeof(req->'blocks') = 'array'
                                           THEN req->'blocks' END) a) x(m)
                    WHERE m IS NOT NULL);
    IF req ? 'want' THEN
        -- Blocks this node holds now (an expired one is no longer used).
        SELECT count(*) INTO held FROM @extschema@.snowflake_lease_blocks b
         WHERE b.holder_node = node AND b.expires_at > now();
    END IF;
    SELECT min(x) INTO bad FROM unnest(named) x WHERE x NOT BETWEEN 0 AND 63 OR x <> trunc(x);
    IF bad IS NOT NULL THEN
        code := '22023';
        problem := format('block %s is none of a layout''s 64 blocks (0 to 63)', bad);
    ELSIF block_size NOT BETWEEN 1 AND 1024 OR max_worker_id NOT BETWEEN 0 AND 65535 THEN
        code := '22023';
        problem := format('block_size %s and max_worker_id %s are no layout''s (1 to 1024, 0 to 65535)',
                          block_size, max_worker_id);
    ELSIF lease_ms <= 0 OR grace_ms < 0 OR want < 1 THEN
        code := '22023';
        problem := format('lease_ms must be positive, grace_ms not negative and want at least 1 (lease_ms %s, grace_ms %s, want %s)',
                          lease_ms, grace_ms, coalesce(want::text, 'none'));
    ELSIF (SELECT min(m) FROM unnest(marks) m) < 0 THEN
        code := '22023';
        problem := format('a mark (high_ms) of %s is before 1970', (SELECT min(m) FROM unnest(marks) m));
    ELSIF lease_ms > lim.max_lease_ms THEN
        problem := format('lease_ms %s is above the registry''s limit max_lease_ms = %s',
                          lease_ms, lim.max_lease_ms);
        hint := format('lease_ms is the holder''s snowflake_id.lease_time: lower it on that server to at most %s ms, or raise the limit on the registry with snowflake_lease_set_limits(max_lease_ms => ...).',
                       lim.max_lease_ms);
    ELSIF grace_ms > lim.max_grace_ms THEN
        problem := format('grace_ms %s is above the registry''s limit max_grace_ms = %s',
                          grace_ms, lim.max_grace_ms);
        hint := format('A holder asks for a grace of a fifth of its snowflake_id.lease_time (at least 1 s): lower snowflake_id.lease_time on that server to at most %s ms, or raise the limit on the registry with snowflake_lease_set_limits(max_grace_ms => ...).',
                       lim.max_grace_ms * 5);
    ELSIF (SELECT max(m) FROM unnest(marks) m) - now_ms > lim.max_ahead_ms THEN
        problem := format('a mark (high_ms) %s ms ahead of the registry''s clock is above its limit max_ahead_ms = %s',
                          (SELECT max(m) FROM unnest(marks) m) - now_ms, lim.max_ahead_ms);
        hint := 'A holder asks for marks of its clock + snowflake_id.lease_time + snowflake_id.max_drift: lower those on that server, check that its clock is not ahead of the registry''s, or raise the limit on the registry with snowflake_lease_set_limits(max_ahead_ms => ...).';
    ELSIF want > lim.max_blocks_per_node OR held >= lim.max_blocks_per_node THEN
        -- (A renewal keeps what the node holds; a re-assertion takes no
        -- more than it may hold: snowflake_lease_renew.)
        problem := CASE
            WHEN want > lim.max_blocks_per_node THEN
                format('want %s is above the registry''s limit max_blocks_per_node = %s', want, lim.max_blocks_per_node)
            ELSE format('the node holds %s blocks already: the registry''s limit max_blocks_per_node is %s', held,
                        lim.max_blocks_per_node)
            END;
        hint := format('Lower snowflake_id.max_blocks on that server to at most %s, or raise the limit on the registry with snowflake_lease_set_limits(max_blocks_per_node => ...).',
                       lim.max_blocks_per_node);
    END IF;
    IF problem IS NOT NULL THEN
        RAISE LOG 'snowflake_id registry: refused a lease request of node % (role %, %): %',
            node, session_user, coalesce('client ' || inet_client_addr()::text, 'local connection'), problem;
        RAISE EXCEPTION 'lease request of node % refused: %', node, problem
            USING ERRCODE = code, HINT = coalesce(hint, 'The snowflake_id lease worker never sends such a request: who called the lease functions by hand?');
    END IF;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_check(jsonb) IS
  'Used by the lease functions: refuses (and logs) a request beyond the fleet''s limits (snowflake_lease_limits) or with values no holder sends.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_check(jsonb) FROM PUBLIC;

-- Whether this server, just promoted from timeline old_tli to tli, has
-- every grant a holder used (0.7.0): it was a member of the registry's
-- failover candidates (snowflake_lease_standbys, by its
-- snowflake_id.registry_standby_name) in the last row it received, that
-- row is still valid (its old primary reports nothing durable without it
-- before valid_until plus a margin), and its timeline history says a
-- promotion ended recovery (not a recovery target: a point-in-time
-- recovery stops before grants it then lacks). NULL when any of that
-- cannot be shown (the file unreadable, no name set): the caller fences.
-- Returns what was shown, for the registry's log.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_promotion_proven(old_tli int, tli int)
RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- From the configuration files only: a session could SET it (a
    -- placeholder where the library is not loaded).
    me text := coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                          WHERE f.name = 'snowflake_id.registry_standby_name' AND f.error IS NULL
                          ORDER BY f.seqno DESC LIMIT 1), '');
    w @extschema@.snowflake_lease_standbys;
    history text;
    last text[];
BEGIN
    IF me = '' OR pg_catalog.current_setting('fsync') = 'off' THEN
        -- (With fsync off, a crash may have lost WAL this server reported
        -- flushed, and kept an older row that names it.)
        RETURN NULL;
    END IF;
    SELECT * INTO w FROM @extschema@.snowflake_lease_standbys;
    IF NOT FOUND OR w.timeline <> old_tli OR NOT me = ANY (w.members) OR now() >= w.valid_until THEN
        RETURN NULL;
    END IF;
    BEGIN
        history := pg_catalog.pg_read_file(format('pg_wal/%s.history', lpad(upper(to_hex(tli)), 8, '0')));
    EXCEPTION WHEN OTHERS THEN
        RAISE LOG 'snowflake_id registry: cannot read the history of timeline % (%): fencing', tli, SQLERRM;
        RETURN NULL;
    END;
    -- Its last line: parent timeline, switch point, reason.
    last := string_to_array((SELECT l FROM unnest(string_to_array(btrim(history, E'\n'), E'\n'))
                                   WITH ORDINALITY AS h(l, n) ORDER BY n DESC LIMIT 1), E'\t');
    IF cardinality(last) < 3 OR last[1] <> old_tli::text OR last[3] <> 'no recovery target specified' THEN
        RETURN NULL;
    END IF;
    RETURN format('standby %s promoted at %s, a failover candidate until %s: it has every durable grant',
                  me, last[2], w.valid_until);
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_promotion_proven(int, int) IS
  'Used by the lease functions: whether this promoted server was a synchronous standby with every grant reported durable (NULL: not shown; the new incarnation fences).';

-- The start of every lease call: checks that this session holds the
-- node's lock (only the holder's own session renews or releases its
-- blocks) and that the request is within the fleet's limits
-- (snowflake_lease_check), starts a new incarnation when the registry may
-- have forgotten grants, and returns it with the fence and the block locks
-- this session holds (one look at pg_locks: it briefly takes every lock
-- partition).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_begin(req jsonb, OUT incarnation text,
                                                            OUT fenced_until timestamptz,
                                                            OUT locked int[], OUT fence_floor_ms bigint)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    known text := coalesce(req->>'incarnation', '');
    seen pg_lsn := coalesce(req->>'lsn', '0/0')::pg_lsn;
    lease_ms bigint;
    grace_ms bigint;
    high_ms bigint;
    key bigint;
    mydb oid := (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
    has_node boolean;
    tli int := ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int;
    now_ms bigint := (extract(epoch FROM now()) * 1000)::bigint;
    lim record;
    r @extschema@.snowflake_lease_registry;
    cause text;
    proven text;
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
    -- Nothing beyond the limits goes further: every value below is in range.
    PERFORM snowflake_id_internal.snowflake_lease_check(req);
    lease_ms := coalesce((req->>'lease_ms')::bigint, 0);
    grace_ms := coalesce((req->>'grace_ms')::bigint, 0);
    high_ms := (req->>'high_ms')::bigint;
    -- What fences rest on: every grant this registry confirmed was within
    -- the limits in force then (fence_*: the limits, or higher ones they
    -- replaced while grants made under those may still run).
    SELECT * INTO lim FROM snowflake_id_internal.snowflake_lease_limits_in_force();
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
        proven := snowflake_id_internal.snowflake_lease_promotion_proven(r.timeline, tli);
        evidence := proven IS NULL;
        IF proven IS NOT NULL THEN
            cause := cause || ': ' || proven;
        END IF;
    ELSIF seen > pg_current_wal_insert_lsn() AND known IS DISTINCT FROM r.previous_incarnation THEN
        -- (A holder of the incarnation a proven promotion continued may
        -- have seen a position of the old timeline past the promotion:
        -- a grant that never became durable, which it did not use.)
        cause := format('a holder saw WAL position %s, above this server''s %s (the registry went back in time)',
                        seen, pg_current_wal_insert_lsn());
        evidence := true;
    ELSIF current_setting('fsync') = 'off' AND r.postmaster_start <> pg_postmaster_start_time() THEN
        cause := 'a restart with fsync off';
        evidence := true;
    ELSIF known <> '' AND known <> r.incarnation AND known IS DISTINCT FROM r.previous_incarnation
          AND (r.fenced_until IS NULL OR r.fenced_until < now())
          AND now() < r.started_at + (lim.fence_lease_ms + lim.fence_grace_ms) * interval '1 millisecond' THEN
        -- A holder of an older incarnation soon after this one began
        -- unfenced: it may be using a grant this one forgot.
        cause := format('node %s knew incarnation %s', node, known);
        evidence := true;
    END IF;
    IF cause IS NOT NULL THEN
        DELETE FROM @extschema@.snowflake_lease_registry;
        r.previous_incarnation := CASE WHEN proven IS NOT NULL THEN r.incarnation END;
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
            -- Every grant it may have forgotten has run out at its holder
            -- by then, and allowed no mark above this floor. The limits are
            -- in range: no sum here leaves bigint's.
            r.fenced_until := now() + (lim.fence_lease_ms + lim.fence_grace_ms) * interval '1 millisecond';
            r.fence_floor_ms := now_ms + lim.fence_ahead_ms + lim.fence_grace_ms;
            UPDATE @extschema@.snowflake_lease_blocks b
               SET high_water_ms = greatest(b.high_water_ms, r.fence_floor_ms);
            RAISE LOG 'snowflake_id registry: new incarnation % after %: no block is leased anew until %, and every block''s floor is raised to %',
                r.incarnation, cause, r.fenced_until, to_timestamp(r.fence_floor_ms / 1000.0);
        ELSE
            RAISE LOG 'snowflake_id registry: new incarnation % (%)', r.incarnation, cause;
        END IF;
        INSERT INTO @extschema@.snowflake_lease_registry SELECT r.*;
    ELSIF lease_ms > r.max_lease_ms OR grace_ms > r.max_grace_ms OR high_ms - now_ms > r.max_ahead_ms THEN
        -- What holders ask for, shown for choosing the limits.
        UPDATE @extschema@.snowflake_lease_registry g
           SET max_lease_ms = greatest(g.max_lease_ms, lease_ms),
               max_grace_ms = greatest(g.max_grace_ms, grace_ms),
               max_ahead_ms = greatest(g.max_ahead_ms, coalesce(high_ms - now_ms, 0))
        RETURNING * INTO r;
    END IF;
    incarnation := r.incarnation;
    fence_floor_ms := r.fence_floor_ms;
    fenced_until := CASE WHEN r.fenced_until > now() THEN r.fenced_until END;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) IS
  'Used by the lease functions: checks the caller holds the node''s lock and the request is within the fleet''s limits, and returns the registry''s incarnation and fence, starting a new one when grants may have been forgotten.';

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
-- than its grace ago by this server's clock; none while fenced, and no
-- more than the node may still hold (max_blocks_per_node). Returns each
-- block with the floor its new holder must start above (the highest ID
-- time any earlier holder may have issued), records it (floor_ms) and the
-- new holder's own bound `high_ms`.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_acquire(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    name text := req->>'name';
    lay text := req->>'layout';
    block_size int;
    max_worker_id int;
    allowed int[];
    want int;
    lease_ms bigint;
    grace_ms bigint;
    high_ms bigint;
    room int;
    g record;
    other text;
    granted jsonb;
BEGIN
    IF name IS NULL OR lay IS NULL OR pg_catalog.jsonb_typeof(req->'allowed') IS DISTINCT FROM 'array'
       OR EXISTS (SELECT 1 FROM unnest(ARRAY['block_size', 'max_worker_id', 'want', 'lease_ms',
                                             'grace_ms', 'high_ms']) k
                   WHERE pg_catalog.jsonb_typeof(req->k) IS DISTINCT FROM 'number') THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'name, layout, allowed (an array), block_size, max_worker_id, want, lease_ms, grace_ms and high_ms (numbers) are required.';
    END IF;
    -- Checks the request against the limits before anything is cast.
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    block_size := (req->>'block_size')::int;
    max_worker_id := (req->>'max_worker_id')::int;
    allowed := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(req->'allowed')::int);
    want := (req->>'want')::int;
    lease_ms := (req->>'lease_ms')::bigint;
    grace_ms := (req->>'grace_ms')::bigint;
    high_ms := (req->>'high_ms')::bigint;
    -- No more than the node may still hold (it holds fewer than the limit,
    -- or begin refused): a holder asks for one block at a time.
    SELECT l.max_blocks_per_node - (SELECT count(*) FROM @extschema@.snowflake_lease_blocks b
                                     WHERE b.holder_node = node AND b.expires_at > now())
      INTO room FROM snowflake_id_internal.snowflake_lease_limits_in_force() l;
    IF want > room THEN
        RAISE LOG 'snowflake_id registry: node % asked for % blocks; it may hold % more (max_blocks_per_node)',
            node, want, room;
        want := greatest(room, 0);
    END IF;
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
               high_water_ms = greatest(b.high_water_ms, high_ms), floor_ms = old.high_water_ms,
               released_at = NULL, leases = b.leases + 1
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
  'Called by a holder''s lease worker: leases free or expired blocks of worker ids, least recently used first, up to max_blocks_per_node, and returns the floor each must start above; none while the registry is fenced.';

-- Renews `node`'s leases of the blocks it names: a new expiry by this
-- server's clock and the holder's new bound. During a fence, a holder that
-- knew an older incarnation re-asserts its blocks: each one not leased to
-- another live holder is its again, with the greater of the marks (and the
-- mark before as its floor_ms), as long as the node holds no more than
-- max_blocks_per_node. Returns
-- the blocks still leased to `node` with their marks before the renewal
-- (a block missing from the result was handed to another holder after its
-- lease expired, or was not re-asserted).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_renew(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    lease_ms bigint;
    grace_ms bigint;
    high_ms bigint;
    block_size int;
    max_worker_id int;
    lay text := req->>'layout';
    known text := coalesce(req->>'incarnation', '');
    me text := snowflake_id_internal.snowflake_lease_session();
    previous text := coalesce(req->>'previous_session', '');
    g record;
    reassert boolean;
    blocks int[];
    taken int[] := '{}';
    room int;
    kept jsonb;
BEGIN
    IF pg_catalog.jsonb_typeof(req->'blocks') IS DISTINCT FROM 'array'
       OR EXISTS (SELECT 1 FROM unnest(ARRAY['lease_ms', 'grace_ms', 'high_ms']) k
                   WHERE pg_catalog.jsonb_typeof(req->k) IS DISTINCT FROM 'number') THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'blocks (an array), lease_ms, grace_ms and high_ms (numbers) are required.';
    END IF;
    -- Checks the request against the limits before anything is cast.
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    lease_ms := (req->>'lease_ms')::bigint;
    grace_ms := (req->>'grace_ms')::bigint;
    high_ms := (req->>'high_ms')::bigint;
    block_size := (req->>'block_size')::int;
    max_worker_id := (req->>'max_worker_id')::int;
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
    IF reassert THEN
        -- A re-assertion takes no more blocks than the node may still hold
        -- (max_blocks_per_node); its own blocks it renews in any case.
        SELECT l.max_blocks_per_node - (SELECT count(*) FROM @extschema@.snowflake_lease_blocks b
                                         WHERE b.holder_node = node AND b.expires_at > now())
          INTO room FROM snowflake_id_internal.snowflake_lease_limits_in_force() l;
        taken := ARRAY(SELECT b.block FROM @extschema@.snowflake_lease_blocks b
                        WHERE b.block = ANY (blocks) AND b.holder_node IS DISTINCT FROM node
                          AND (b.holder_node IS NULL OR b.expires_at + b.grace < now())
                        ORDER BY b.block);
        IF cardinality(taken) > greatest(room, 0) THEN
            RAISE LOG 'snowflake_id registry: node % re-asserted % blocks it does not hold; it may hold % more (max_blocks_per_node)',
                node, cardinality(taken), greatest(room, 0);
            taken := taken[1:greatest(room, 0)];
        END IF;
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
            OR (b.block = ANY (taken) AND (b.holder_node IS NULL OR b.expires_at + b.grace < now()))
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
                                        CASE WHEN old.mine THEN 0 ELSE old.asserted END),
               floor_ms = CASE WHEN old.mine THEN b.floor_ms ELSE old.high_water_ms END
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
-- when it leased it), which becomes the next holder's floor. Never below
-- that floor as the registry recorded it (floor_ms): a mark passed lower
-- (0) would let the next holder start below IDs made before.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    node text := req->>'node';
    blk int;
    high_ms bigint;
    previous text := coalesce(req->>'previous_session', '');
    g record;
    done boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(ARRAY['block', 'high_ms']) k
                WHERE pg_catalog.jsonb_typeof(req->k) IS DISTINCT FROM 'number') THEN
        RAISE EXCEPTION 'invalid lease request' USING ERRCODE = '22023',
            DETAIL = 'block and high_ms (numbers) are required.';
    END IF;
    -- Checks the request against the limits before anything is cast.
    SELECT * INTO g FROM snowflake_id_internal.snowflake_lease_begin(req);
    blk := (req->>'block')::int;
    high_ms := (req->>'high_ms')::bigint;
    UPDATE @extschema@.snowflake_lease_blocks b
       SET holder_node = NULL, released_at = now(), expires_at = NULL,
           high_water_ms = greatest(b.floor_ms, high_ms)
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
  'Called by a holder''s lease worker: returns an idle block, recording the time of the newest ID it issued there (never below the floor it leased the block with).';

-- The failover candidates among `members` that have not flushed `target`:
-- no physical standby streams under that name, more than one does (a
-- name is a candidate's only while it is unique), or the one that does is
-- behind. Logical WAL senders (a subscription, pg_recvlogical), which
-- have a database, never stand for a candidate.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_standbys_behind(members text[], target pg_lsn)
RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(array_agg(m ORDER BY m), '{}')
      FROM unnest(members) m
     WHERE (SELECT count(*) <> 1 OR bool_or(r.flush_lsn IS NULL OR r.flush_lsn < target)
              FROM pg_catalog.pg_stat_replication r
              JOIN pg_catalog.pg_stat_activity a ON a.pid = r.pid AND a.datid IS NULL
             WHERE r.application_name = m)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_standbys_behind(text[], pg_lsn) IS
  'Used by the lease functions: the failover candidates that have not flushed a WAL position.';

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
    -- From the configuration files only: a session could SET it (a
    -- placeholder where the library is not loaded).
    me text := coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                          WHERE f.name = 'snowflake_id.registry_standby_name' AND f.error IS NULL
                          ORDER BY f.seqno DESC LIMIT 1), '');
    target pg_lsn := pg_catalog.pg_current_wal_flush_lsn();
    deadline timestamptz := pg_catalog.clock_timestamp() + wait_ms * interval '1 millisecond';
    tli int := ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int;
    -- How long a failover candidate stays one without keeping up, and the
    -- margin for the clocks of the registry's servers.
    ttl interval := interval '30 seconds';
    margin interval := interval '15 seconds';
    mode text := 'synchronous';
    needed int := 0;
    flushed int := 0;
    w @extschema@.snowflake_lease_standbys;
    members text[];
    behind text[];
    keep text[];
    durable boolean;
BEGIN
    IF pg_catalog.btrim(names) = '' THEN
        mode := CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_stat_replication r WHERE r.state = 'streaming')
                     THEN 'asynchronous' ELSE 'local' END;
    ELSE
        -- [FIRST] n (...) or ANY n (...); a plain list (or *) is FIRST 1.
        needed := coalesce((pg_catalog.regexp_match(names, '^\s*(?:(?:first|any)\s+)?(\d+)\s*\(', 'i'))[1]::int, 1);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_registry g WHERE g.timeline = tli) THEN
        -- Promoted, and no lease call began its incarnation yet.
        RETURN jsonb_build_object('durable', false, 'mode', mode, 'needed', needed, 'flushed', 0,
                                  'lsn', target::text, 'behind', '[]'::jsonb);
    END IF;
    -- The failover candidates must have it too (this server is none).
    SELECT * INTO w FROM @extschema@.snowflake_lease_standbys;
    members := array(SELECT m FROM unnest(coalesce(w.members, '{}')) m WHERE m <> me);
    LOOP
        SELECT count(*) INTO flushed FROM pg_catalog.pg_stat_replication r
         WHERE r.sync_state IN ('sync', 'quorum') AND r.flush_lsn >= target;
        behind := snowflake_id_internal.snowflake_lease_standbys_behind(members, target);
        EXIT WHEN (flushed >= needed AND cardinality(behind) = 0) OR pg_catalog.clock_timestamp() >= deadline;
        PERFORM pg_catalog.pg_sleep(0.005);
    END LOOP;
    durable := flushed >= needed;
    -- The row is read and changed under its lock, FOR UPDATE from the
    -- start: that waits for a session that is writing the row, so that a
    -- candidate it adds (in WAL before this grant) is seen, and a drop is
    -- never decided from a row another session has just moved on (the row
    -- is only ever updated in place, so a session that waited for the lock
    -- reads the row the other wrote). A read FOR SHARE upgraded to FOR
    -- UPDATE when the row had to change deadlocked two calls that both had
    -- to. Nothing here waits for a standby: this function's own writes
    -- commit locally.
    -- The row lock makes this a transaction that writes: its commit
    -- waits for no standby.
    PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    IF durable THEN
        SELECT * INTO w FROM @extschema@.snowflake_lease_standbys FOR UPDATE;
        IF NOT FOUND THEN
            -- Deleted by hand: made again, with no candidate; ask again.
            INSERT INTO @extschema@.snowflake_lease_standbys (members, valid_until, timeline, updated_at)
            VALUES ('{}', '-infinity', tli, pg_catalog.now()) ON CONFLICT DO NOTHING;
            durable := false;
        ELSE
            members := array(SELECT m FROM unnest(w.members) m WHERE m <> me);
            behind := snowflake_id_internal.snowflake_lease_standbys_behind(members, target);
            IF cardinality(behind) > 0 AND pg_catalog.now() <= w.valid_until + margin THEN
                -- A candidate that may be promoted without a fence lacks it.
                durable := false;
            END IF;
        END IF;
    END IF;
    IF durable THEN
        -- Candidates: the members that kept up, and every synchronous
        -- standby that has it (added: a row it receives names it, and it
        -- has everything before that row).
        keep := array(SELECT DISTINCT m FROM (
                          SELECT m FROM unnest(members) m WHERE NOT m = ANY (behind)
                          UNION ALL
                          SELECT r.application_name FROM pg_catalog.pg_stat_replication r
                           WHERE r.sync_state IN ('sync', 'quorum') AND r.flush_lsn >= target
                             AND r.application_name <> me AND r.application_name <> ''
                             AND cardinality(snowflake_id_internal.snowflake_lease_standbys_behind(
                                                 ARRAY[r.application_name::text], target)) = 0) c(m)
                      ORDER BY m);
        IF NOT (cardinality(behind) = 0 AND w.timeline = tli AND keep IS NOT DISTINCT FROM w.members
                AND w.valid_until >= pg_catalog.now() + ttl - interval '5 seconds') THEN
            -- Not waited for: a row that no candidate received changes
            -- nothing they may conclude (each keeps the older row it has).
            UPDATE @extschema@.snowflake_lease_standbys
               SET members = keep, timeline = tli,
                   -- Never earlier than a candidate may have read (a call
                   -- whose transaction began long ago has an old now()).
                   valid_until = greatest(valid_until, pg_catalog.now() + ttl),
                   updated_at = pg_catalog.now();
            IF cardinality(behind) > 0 THEN
                RAISE LOG 'snowflake_id registry: standby % dropped from the failover candidates (a candidate until %, and behind since)',
                    array_to_string(behind, ', '), w.valid_until;
            END IF;
        END IF;
    END IF;
    RETURN jsonb_build_object('durable', durable, 'mode', mode, 'needed', needed, 'flushed', flushed,
                              'lsn', target::text, 'behind', to_jsonb(coalesce(behind, '{}')));
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) IS
  'Called by a holder''s lease worker after each grant: whether this session''s commits are flushed on enough synchronous standbys (synchronous_standby_names), and on every failover candidate (snowflake_lease_standbys), that a failover keeps them.';

REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_reply(text, timestamptz, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_session() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_promotion_proven(int, int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_standbys_behind(text[], pg_lsn) FROM PUBLIC;

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

-- The failover candidates' one row (snowflake_lease_durable updates it in
-- place): none yet.
INSERT INTO @extschema@.snowflake_lease_standbys (members, valid_until, timeline, updated_at)
SELECT '{}', '-infinity',
       ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int, now();
