-- snowflake_worker_registry: who held each worker id and when, and the
-- time of the last ID made under it; kept by the registry worker
-- (src/workers/registry_worker.rs). Dumped with the database
-- (pg_extension_config_dump): restoring the dump into another database
-- copies the rows too.
CREATE TABLE snowflake_worker_registry (
    worker_id        int PRIMARY KEY,
    pid              int,
    database         name,
    role             name,
    application_name text,
    claimed_at       timestamptz,
    released_at      timestamptz,
    claims           bigint NOT NULL DEFAULT 0,
    ids_issued       bigint NOT NULL DEFAULT 0,
    high_water       timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE snowflake_worker_registry IS
  'Who held each worker id and when, and the time of the last ID made under it; kept by the snowflake_id registry worker in the database named by snowflake_id.registry_database.';
REVOKE ALL ON snowflake_worker_registry FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('snowflake_worker_registry', '');

-- Rows a restore brings back (pg_restore, COPY, INSERT) carry the
-- high-water marks of the server they came from: every later ID of this
-- server goes above them at once, with no manual step. The registry
-- worker's own upserts go through here too (a no-op: their marks are this
-- server's own). pg_upgrade copies the table's files instead of inserting:
-- the worker reads the table when the server starts (`read_high_water`).
CREATE FUNCTION snowflake_id_internal.snowflake_registry_high_water() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    hw timestamptz;
BEGIN
    SELECT max(high_water) INTO hw FROM new_rows;
    IF hw IS NOT NULL THEN
        BEGIN
            PERFORM @extschema@.snowflake_advance_past(@extschema@.snowflake_from_timestamp(hw));
        EXCEPTION WHEN others THEN
            RAISE WARNING 'snowflake_id: new IDs of this server may not be above the restored registry''s high-water mark %: %', hw, SQLERRM
                USING HINT = 'Run SELECT snowflake_advance_past(max(id)) on the restored tables as a superuser, in a server that preloads snowflake_id.';
        END;
    END IF;
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_registry_high_water() IS
  'Trigger on snowflake_worker_registry: restored rows raise this server''s floor above their high-water marks.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_registry_high_water() FROM PUBLIC;
CREATE TRIGGER snowflake_registry_high_water
    AFTER INSERT ON snowflake_worker_registry
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION snowflake_id_internal.snowflake_registry_high_water();
-- A restored row whose worker id this server's registry worker has
-- already recorded replaces that row, keeping the higher mark, instead of
-- failing the restore's COPY on the primary key (and then raising nothing).
-- The worker's next update writes its live values back.
CREATE FUNCTION snowflake_id_internal.snowflake_registry_merge() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    hw timestamptz;
BEGIN
    DELETE FROM @extschema@.snowflake_worker_registry WHERE worker_id = NEW.worker_id
    RETURNING high_water INTO hw;
    IF FOUND THEN
        NEW.high_water := greatest(NEW.high_water, hw);
    END IF;
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION snowflake_id_internal.snowflake_registry_merge() IS
  'Trigger on snowflake_worker_registry: a restored row replaces the row of the same worker id, keeping the higher high-water mark.';
REVOKE EXECUTE ON FUNCTION snowflake_id_internal.snowflake_registry_merge() FROM PUBLIC;
CREATE TRIGGER snowflake_registry_merge
    BEFORE INSERT ON snowflake_worker_registry
    FOR EACH ROW EXECUTE FUNCTION snowflake_id_internal.snowflake_registry_merge();
