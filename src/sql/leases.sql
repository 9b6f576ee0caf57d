-- The registry side of fleet leases (see core/src/registry/ for its rules,
-- core/src/lease.rs for the safety argument, core/src/holder.rs for the
-- holder side, and docs/design/fleet-fencing.md for incarnations and
-- fences).
--
-- Any server with the extension created can be a fleet's registry: the
-- holders' lease workers connect to it and call the functions below. No
-- preloading is needed here; every rule that uses the registry's clock
-- reads it here (now()) and is decided in the extension's Rust
-- (snowflake_lease_decide), every rule that uses a holder's clock is in
-- the holder.
--
-- The tables and the view are in the extension's schema;
-- the functions are internal, in snowflake_id_internal
-- (src/sql/internal_schema.sql), where the holders find them through the
-- extension's membership (src/workers/lease_worker/connection.rs). Every
-- name in their bodies is schema-qualified, and their search_path is
-- pinned to pg_catalog, pg_temp.

-- The rules are in the extension's Rust core (core/src/registry/): every
-- lease function takes the registry's lock, gathers the facts of its call
-- in one query (snowflake_lease_facts), passes them to
-- snowflake_lease_decide, and applies the writes it returns
-- (snowflake_lease_call). The functions below name what the rules read.

-- The class of the registry's session-level advisory locks of blocks:
-- each holder's registry session holds (this class, the block number)
-- while it holds the block, gone when its session ends.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_block_class() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT 1936613751
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_block_class() IS
  'Used by the lease functions: the class of the advisory lock a holder''s session holds on each of its blocks.';

-- The WAL timeline this server writes (the first 8 hex digits of the
-- current WAL file's name).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_timeline() RETURNS int
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_timeline() IS
  'Used by the lease functions: the WAL timeline this server writes.';

-- Times as the rules take them: Unix ms (bigint), -infinity and infinity
-- as the least and greatest bigint; and back.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_ms(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN pg_catalog.isfinite(t) THEN floor(extract(epoch FROM t) * 1000)::bigint
                WHEN extract(epoch FROM t) < 0 THEN -9223372036854775808
                ELSE 9223372036854775807 END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_ms(timestamptz) IS
  'Used by the lease functions: a time as Unix ms (-infinity and infinity as the least and greatest bigint).';

CREATE FUNCTION snowflake_id_internal.snowflake_lease_time(ms bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE ms WHEN -9223372036854775808 THEN '-infinity'::timestamptz
                   WHEN 9223372036854775807 THEN 'infinity'::timestamptz
                   ELSE pg_catalog.to_timestamp(ms / 1000.0) END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_time(bigint) IS
  'Used by the lease functions: Unix ms as a time (the least and greatest bigint as -infinity and infinity).';

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
    -- The login role (session_user) of the session that leased or last
    -- renewed it (0.8.0): max_blocks_per_role bounds each role's blocks.
    holder_role    text,
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

-- Every lease, with whether the holder's registry session is alive: each
-- holder keeps a session-level advisory lock here on each of its blocks
-- (snowflake_lease_block_class(), the block number), gone when its session
-- ends. (The class is written here, not called: a role that may read the
-- view need not have EXECUTE on the internal functions.)
CREATE VIEW snowflake_leases AS
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
    previous_incarnation text,
    -- The key of the registry's tokens (32 hex digits,
    -- snowflake_lease_sign): every reply carries a token for its
    -- incarnation and WAL position, and what a request says it saw counts
    -- only with a token that verifies. Kept from one incarnation to the
    -- next; new_key: made with this row (the row was gone), so that tokens
    -- of older incarnations cannot verify (core/src/registry/token.rs).
    token_key         text NOT NULL DEFAULT '',
    new_key           boolean NOT NULL DEFAULT false,
    -- Calls that granted, over every incarnation (0.8.0): replies carry
    -- it, signed; a holder that saw more shows the registry was restored
    -- to an earlier state however far its WAL has moved since.
    grants            bigint NOT NULL DEFAULT 0,
    -- The incarnations this row descends from, oldest first, at most 16
    -- (0.8.0): a holder's signed incarnation that is none of them, soon
    -- after the postmaster started, shows a registry restored to before it.
    history           text[] NOT NULL DEFAULT '{}',
    -- The database the row was written in (0.8.0; NULL: not yet known): a
    -- row in another is a copy of the database put in the registry's place
    -- (CREATE DATABASE ... TEMPLATE, then a rename), which forgot what was
    -- granted since the copy and which no restart or WAL position shows.
    database_oid      oid
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
    changed_at            timestamptz NOT NULL DEFAULT now(),
    -- The fleet's layout (the `layout` its holders send), fixed by the DBA:
    -- block rows are made and kept under it only. NULL: the layout of the
    -- rows there are, or of the first holder's request.
    layout                text,
    -- What a request without a token (a holder before 0.8.0) says it saw
    -- counts, from a node holding blocks: the update from 0.7.0 sets it,
    -- the DBA clears it once every holder runs 0.8.0 (while on, the lease
    -- role can fence the fleet with such requests).
    unsigned_evidence     boolean NOT NULL DEFAULT false,
    -- Free blocks kept for servers that hold none: a node holding blocks
    -- leases another only while more than this many stay free (0 to 63;
    -- core/src/registry/blocks.rs: acquire).
    reserve_blocks        int NOT NULL DEFAULT 8,
    -- The blocks the sessions of one login role may hold together, their
    -- leases running (1 to 64; NULL: no bound): with a
    -- login role per server, a leaked credential takes one server's share
    -- (core/src/registry/blocks.rs).
    max_blocks_per_role   int
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
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() FROM PUBLIC;
CREATE TRIGGER snowflake_lease_limits_changed BEFORE INSERT OR UPDATE OR DELETE ON snowflake_lease_limits
    FOR EACH ROW EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed();
CREATE TRIGGER snowflake_lease_limits_truncate BEFORE TRUNCATE ON snowflake_lease_limits
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed();

-- The DBA's way to change the limits: each argument given replaces that
-- limit (NULL: unchanged); with none, nothing changes. `layout` fixes the
-- fleet's layout (the layout its holders send, as the rows of
-- snowflake_lease_blocks show it): block rows are then made and kept under
-- it only, whatever layout a request names. `reserve_blocks`: the free
-- blocks kept for servers that hold none. `max_blocks_per_role`: the
-- blocks the sessions of one login role may hold (0: no bound). Returns
-- the limits in force, one row each: `value` is what requests are checked
-- against (NULL: no bound), `fence_value` what fences use (higher, after
-- a lowered limit, until `fence_value_until`); the layout is in
-- snowflake_lease_limits. For the extension's owner and superusers:
-- EXECUTE is revoked from PUBLIC, and it runs with the caller's rights on
-- the table (revoked from PUBLIC too).
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

-- Emptying the lease table (DELETE, TRUNCATE) or restoring it forgets
-- grants: the next call starts a new incarnation.
-- The row stays (a tombstone): the registry starts a new incarnation at
-- once, fenced for as long as any grant within the fleet's limits could
-- last, also when no holder is connected.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_forget() RETURNS trigger
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
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_forget() FROM PUBLIC;
CREATE TRIGGER snowflake_lease_blocks_forget AFTER DELETE ON snowflake_lease_blocks
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();
-- Before the TRUNCATE, which has emptied the table after.
CREATE TRIGGER snowflake_lease_blocks_truncate BEFORE TRUNCATE ON snowflake_lease_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();
-- Rows that arrive leased come from a restore (pg_restore, COPY): the
-- registry's record is older than its holders'. (The lease functions
-- insert rows unleased.)
CREATE TRIGGER snowflake_lease_blocks_restored AFTER INSERT ON snowflake_lease_blocks
    FOR EACH ROW WHEN (NEW.holder_node IS NOT NULL) EXECUTE FUNCTION snowflake_id_internal.snowflake_lease_forget();

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

-- A holder introduces itself: takes a session lock of its node id.
-- false: another live session of its login role holds one (a copy of a
-- data directory whose original is running): the caller must take a new
-- id. A node's lock keys are bound to the role and to this postmaster
-- (snowflake_lease_node_keys): any role may take any advisory lock, so
-- sessions of another role holding or waiting for one are ended and keys
-- they or prepared transactions hold passed over, never taken for a copy.
-- One node per session: a session holding another node's lock, or blocks
-- leased under another node (its lock released with pg_advisory_unlock,
-- which any role may call), is refused (54000), so that
-- max_blocks_per_node bounds what one session can lease. Decided by
-- snowflake_lease_hello_decide (core/src/registry/hello.rs); this gathers
-- the facts and applies the answer. Under the registry's lock, so that
-- two sessions of one role never take two keys of a node; refused in a
-- transaction block, which would keep that lock. SECURITY DEFINER: it
-- reads the blocks' sessions and the keys' holders, which the lease role
-- may not.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_hello(node text) RETURNS boolean
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

-- This server's snowflake_id.registry_standby_name, from the configuration
-- files only: a session could SET it (a placeholder where the library is
-- not loaded). '' for none.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_standby_name() RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f
                      WHERE f.name = 'snowflake_id.registry_standby_name' AND f.error IS NULL
                      ORDER BY f.seqno DESC LIMIT 1), '')
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_standby_name() IS
  'Used by the lease functions: snowflake_id.registry_standby_name as the configuration files set it.';

-- The last line of timeline tli's history file, [parent timeline, switch
-- point, reason]; NULL when it cannot be read (logged: the caller fences).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_history(tli int) RETURNS jsonb
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

-- The failover candidates' row as the rules take it.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_json(members text[], valid_until timestamptz,
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

-- The facts of a lease call of `node`, in one query: `server` (this
-- server and session: its clock, timeline, WAL position, session,
-- postmaster start, fsync, synchronous_commit, the node's lock, the block
-- locks of this session and whether others hold any, and after a timeline
-- change what proves a promotion; fresh names for a new incarnation and a
-- new token key; the session's login role, which block rows record and
-- max_blocks_per_role bounds, and its address for the log) and `rows`
-- (the registry's row, every block row, the limits' row), as the rules in
-- core/src/registry take them (times in Unix ms, WAL positions as numbers).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_facts(node text) RETURNS jsonb
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

-- The registry's lock: lease calls are decided one at a time, each on the
-- rows the last one wrote (held to the end of the transaction).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_lock_registry() RETURNS void
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

-- The reply every lease call ends with: the answer's incarnation and
-- fence, this server's WAL position after the call's writes and the
-- registry's token for the two (under `key`), and `extra`.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_reply(answer jsonb, key text, extra jsonb)
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

-- Writes what the rules decided (core/src/registry/mod.rs, Writes): the
-- registry's row replaced, block rows replaced or added, block locks taken
-- or given up, log lines. Under the registry's lock.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_apply(w jsonb) RETURNS void
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

-- One lease call (`acquire`, `renew`, `release`): under the registry's
-- lock, gathers its facts, has the rules decide (a refusal is raised
-- there, and logged with the node, the session's role and address), writes
-- what they return (rows replaced or added, block locks taken or given
-- up), logs their lines and replies. A request larger than any holder
-- sends is refused before it is parsed.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_call(call text, req jsonb) RETURNS jsonb
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

-- The registry's incarnation, its fence, the block locks this session
-- holds and the last fence's floor, as they stand (no call is decided
-- here). Holders find the lease functions' schema by this function.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_begin(req jsonb, OUT incarnation text,
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

-- Leases up to `want` free blocks among `allowed` to `node`, least
-- recently used first; none while fenced, none beyond
-- max_blocks_per_node, none of the last reserve_blocks free ones but a
-- node's first, rows made under the fleet's layout only
-- (core/src/registry/blocks.rs: acquire).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_acquire(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('acquire', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) IS
  'Called by a holder''s lease worker: leases free or expired blocks of worker ids, least recently used first, up to max_blocks_per_node and keeping reserve_blocks free for servers that hold none, and returns the floor each must start above; none while the registry is fenced.';

-- Renews `node`'s leases of the blocks it names, re-asserting them to a
-- new, fenced incarnation (core/src/registry/blocks.rs: renew).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_renew(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('renew', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) IS
  'Called by a holder''s lease worker: extends its leases and raises their marks (re-asserting them to a new incarnation while fenced); returns the blocks it still holds.';

-- Gives a block back, recording the newest ID time its holder issued
-- there, never below its floor (core/src/registry/blocks.rs: release).
CREATE FUNCTION snowflake_id_internal.snowflake_lease_release(req jsonb) RETURNS jsonb
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT snowflake_id_internal.snowflake_lease_call('release', req)
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) IS
  'Called by a holder''s lease worker: returns an idle block, recording the time of the newest ID it issued there (never below the floor it leased the block with).';

-- This server's WAL senders as the durability rules take them: name,
-- sync_state, flush position, whether physical (a logical sender, which
-- has a database, never stands for a failover candidate), streaming, and
-- the standby's clock at its last reply.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_standbys_now() RETURNS jsonb
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

-- Whether what this session committed is where a failover can reach it:
-- on enough synchronous standbys to satisfy synchronous_standby_names, and
-- on every failover candidate (core/src/registry/durable.rs), waiting up
-- to `wait_ms` (at most 5 s). A holder calls it after every lease or
-- renewal and uses the grant only when it answers durable. The position
-- checked is this server's flush position when the call begins, at or
-- past the end of the session's last commit. The candidates' row is then
-- read and changed under its lock (FOR UPDATE, which waits for a session
-- writing it, so that a candidate it adds is seen and a drop is never
-- decided from a row another session just moved on), and written with
-- synchronous_commit = local: nothing here waits for a standby.
-- SECURITY DEFINER: pg_stat_replication shows positions only to
-- privileged roles.
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable(req jsonb) RETURNS jsonb
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
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_hello(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_session() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_standby_name() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_history(int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_json(text[], timestamptz, int, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_facts(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_lock_registry() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_reply(jsonb, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_call(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_apply(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_begin(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_acquire(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_renew(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_release(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_standbys_now() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_lease_durable(jsonb) FROM PUBLIC;
-- The rules (src/sql/leases.rs), called by the functions above only.
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
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_data_key() IS
  'Used when the registry''s row is made: the data directory''s token key (snowflake_id.key), made when missing.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_kept() IS
  'Used by snowflake_lease_durable: the last failover candidates'' row this data directory wrote (snowflake_id.candidates.<database OID>), or NULL.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_keep(jsonb) IS
  'Used by snowflake_lease_durable: keeps the failover candidates'' row it writes in the data directory (snowflake_id.candidates.<database OID>), durably.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_candidates_anew(integer, bigint) IS
  'Used when the failover candidates'' row is made: the members of the last one this data directory wrote, or every standby that may be synchronous (*).';
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
COMMENT ON FUNCTION snowflake_id_internal.snowflake_lease_autocommit() IS
  'Used by the lease functions: refuses a lease call inside a transaction block, which would hold the registry''s locks while its session waits.';

-- A registry made with no holder alive starts its first incarnation here,
-- unfenced, with the data directory's token key (kept by DROP EXTENSION:
-- src/durability/registry_key.rs), so that a standby made from it has the
-- row and its timeline (its promotion is then a timeline change, fenced).
-- Made again while holders' sessions hold block locks (the extension
-- dropped and created again), no row: the first lease call fences.
-- Its grant count goes on from the one lease calls left in this
-- database since the postmaster started (the extension dropped and made
-- again): a copy from before has less (core/src/registry/begin.rs).
INSERT INTO @extschema@.snowflake_lease_registry
       (incarnation, timeline, postmaster_start, started_at, cause, token_key, new_key, database_oid,
        grants)
SELECT md5(gen_random_uuid()::text), snowflake_id_internal.snowflake_lease_timeline(),
       pg_postmaster_start_time(), now(), 'created', k->>'key', NOT (k->>'kept')::boolean,
       (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()),
       coalesce((k->>'grants')::bigint, 0)
  FROM snowflake_id_internal.snowflake_lease_data_key() k
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                    WHERE l.locktype = 'advisory' AND l.objsubid = 2
                      AND l.classid = snowflake_id_internal.snowflake_lease_block_class()::oid
                      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                         WHERE d.datname = pg_catalog.current_database()));

-- The failover candidates' one row (snowflake_lease_durable updates it in
-- place): the members of the last row this data directory wrote, until
-- its valid_until, which a standby cut off before may still hold; with
-- none, every standby that may be synchronous ('*') for 30 s
-- (core/src/registry/durable.rs, made_anew).
INSERT INTO @extschema@.snowflake_lease_standbys (members, valid_until, timeline, updated_at)
SELECT ARRAY(SELECT jsonb_array_elements_text(a->'members')),
       snowflake_id_internal.snowflake_lease_time((a->>'valid_until_ms')::bigint),
       (a->>'timeline')::int, now()
  FROM snowflake_id_internal.snowflake_lease_candidates_anew(
           snowflake_id_internal.snowflake_lease_timeline(),
           snowflake_id_internal.snowflake_lease_ms(now())) a;
