-- snowflake_id_internal: the extension's internal objects, in a schema of
-- their own (created here, first in the script, so it is a member of the
-- extension: CREATE EXTENSION makes it, DROP EXTENSION drops it, pg_dump
-- leaves it to CREATE EXTENSION). Nothing in it is an API: the registry's
-- lease protocol (called by the holders' lease workers), trigger functions
-- and the checks the explicit-layout decoders call. The user-facing objects
-- stay in the extension's schema.
--
-- No USAGE for PUBLIC: an ordinary role cannot call anything here by name.
-- It needs none for what it may do: a trigger runs its function, and the
-- SQL-standard decoders call the checks, by OID, without a name lookup
-- (EXECUTE on a function is checked, USAGE on its schema is not). The role
-- the lease workers connect as needs USAGE here and EXECUTE on the
-- snowflake_lease_* functions (docs/operations/fleet.md).
-- The REVOKE: default privileges on schemas (ALTER DEFAULT PRIVILEGES ...
-- ON SCHEMAS) of the role that creates the extension would otherwise
-- reach this schema too.
CREATE SCHEMA snowflake_id_internal;
COMMENT ON SCHEMA snowflake_id_internal IS
  'Internal objects of the snowflake_id extension (lease protocol, trigger functions, decoder checks): not an API; they may change in any release.';
REVOKE ALL ON SCHEMA snowflake_id_internal FROM PUBLIC;
