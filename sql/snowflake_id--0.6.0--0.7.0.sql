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
-- snowflake_config() gains the column lease_problem (what keeps the lease
-- worker from leasing, for roles that may read the registry setting): it
-- is dropped and made again, as generated.
-- Whether what this session committed is where a failover can reach it:
-- on enough synchronous standbys to satisfy synchronous_standby_names
-- (`FIRST n` or `ANY n`: n standbys whose sync_state is sync or quorum have
-- flushed it), waiting up to `wait_ms` (at most 5 s). A holder calls it
-- after every lease or renewal and uses the grant only when it answers
-- durable: a COMMIT whose wait for the standby was cancelled (a query
-- cancel, a statement_timeout) returned with only a WARNING, and an old
-- primary cut off from its standby after a promotion can never make one
-- durable. The position checked is this server's flush position when the
-- call begins, at or past the end of the session's last commit. With no
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
