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
-- pg_upgrade carries them: the worker reads the table when the server
-- starts. A dump of any database carries the table's rows and this
-- server's grants at the time of the dump (snowflake_backfill_dump(),
-- the filter below), so that it never lacks the grants of a row it
-- carries. Rows a restore inserts raise this server's grants (the triggers
-- below), and snowflake_at() reads this database's rows of a stretch before
-- it takes a grant there (a restore without triggers). Keyed by the
-- stretch's first time, which does not depend on the layout's bits.
CREATE TABLE snowflake_backfill_grants (
    starts_at  timestamptz PRIMARY KEY,
    grants     bigint NOT NULL,
    worker_ids text NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE snowflake_backfill_grants IS
  'Backfill grants handed out per stretch of time (snowflake_backfill()); kept by the snowflake_id registry worker in the database named by snowflake_id.registry_database.';
-- Readable by all (snowflake_backfill() shows the same; snowflake_at() of
-- any role reads it). Rows may be inserted by the database's owner, whose
-- pg_restore of the database must carry them (no superuser needed): they
-- only raise the server's grants, never lower them. The registry worker
-- alone updates them.
REVOKE ALL ON snowflake_backfill_grants FROM PUBLIC;
GRANT SELECT ON snowflake_backfill_grants TO PUBLIC;
GRANT INSERT ON snowflake_backfill_grants TO pg_database_owner;
-- pg_dump reads the table's data with this filter appended to its SELECT
-- of the table's columns: the table's own rows are replaced by those of
-- snowflake_backfill_dump() (the same columns).
SELECT pg_catalog.pg_extension_config_dump('snowflake_backfill_grants',
  'WHERE false UNION ALL SELECT * FROM @extschema@.snowflake_backfill_dump()');

-- Rows a restore brings back raise this server's grants of their stretch:
-- grants the old server handed out are not handed out again. The registry
-- worker's own upserts skip the triggers. Both trigger functions run as
-- the extension's owner (a superuser), so that the database owner's
-- restore raises the grants too (only INSERT is granted: a trigger function
-- cannot be called but as a trigger).
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_restored() RETURNS trigger
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
COMMENT ON FUNCTION snowflake_id_internal.snowflake_backfill_merge() IS
  'Trigger on snowflake_backfill_grants: a restored row replaces the row of the same stretch, keeping the higher count.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_merge() FROM PUBLIC;
CREATE TRIGGER snowflake_backfill_merge
    BEFORE INSERT ON snowflake_backfill_grants
    FOR EACH ROW EXECUTE FUNCTION snowflake_id_internal.snowflake_backfill_merge();

COMMENT ON FUNCTION snowflake_at(timestamptz) IS
  'An ID that decodes to the given past time and equals no other ID, from the worker ids set aside by snowflake_id.backfill_worker_ids (backfill; EXECUTE granted by a superuser).';
COMMENT ON FUNCTION snowflake_backfill() IS
  'Backfill grants of each stretch of time: its first and last time, grants handed out, grants it holds, grants left, grants this session holds.';
COMMENT ON FUNCTION snowflake_backfill_raise(timestamptz, bigint, text) IS
  'Raises this server''s backfill grants of the stretch of time containing the given time (restored snowflake_backfill_grants rows); superusers only.';
COMMENT ON FUNCTION snowflake_backfill_dump() IS
  'The rows a dump of snowflake_backfill_grants carries: the table''s rows and this server''s backfill grants now.';
