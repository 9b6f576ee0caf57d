-- Backfill in a fleet (src/sql/backfill_fleet.rs; the rules:
-- core/src/registry/backfill.rs): a holder's snowflake_at() asks the
-- registry for grants of the fleet's set-aside worker ids, then
-- snowflake_lease_durable, in the same session, before it uses them.

-- The grants of one call: the caller's role and address and the lease
-- rows gathered here, decided and handed out in the extension's Rust from
-- this server's own backfill counters (durable: state file and WAL,
-- flushed). Autocommit only, as the lease calls; a request larger than any
-- holder sends is refused before it is parsed. Replies with the grants,
-- the holder's floor and this server's WAL flush position after them.
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
