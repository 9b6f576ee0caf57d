-- snowflake_id regression suite: bad input and edge cases of every public
-- function, the snowflake_workers view and every setting.
--
-- Conventions of these files:
-- * Nothing printed depends on the time or on earlier runs: IDs and
--   timestamps made now are shown as booleans or counts only. Timestamps
--   printed are fixed ones, in pg_regress's time zone (PST8PDT).
-- * After a statement that must fail, \echo :SQLSTATE shows its SQLSTATE.
\set SHOW_CONTEXT never
CREATE EXTENSION snowflake_id;
-- The release is stated once (Cargo.toml, which the control file takes):
-- the installed version is the build's default.
SELECT e.extname, e.extversion = a.default_version AS is_default_version
  FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
 WHERE e.extname = 'snowflake_id';
-- The documented functions and their labels (docs/reference/functions.md): the
-- generators are VOLATILE and PARALLEL UNSAFE; the decoders are STABLE,
-- STRICT and PARALLEL SAFE.
SELECT p.oid::regprocedure AS function, p.provolatile AS volatility,
       p.proparallel AS parallel, p.proisstrict AS strict
  FROM pg_proc p
 WHERE p.proname IN ('snowflake_nextval', 'snowflake_nextvals', 'snowflake_decode',
                     'snowflake_timestamp', 'snowflake_from_timestamp',
                     'snowflake_compose', 'snowflake_layout', 'snowflake_config',
                     'snowflake_accept_layout', 'snowflake_to_public',
                     'snowflake_from_public')
 ORDER BY p.proname, p.oid::regprocedure::text COLLATE "C";
-- Executable by PUBLIC, except snowflake_accept_layout() (superusers only)
-- and the registry's lease functions (the lease workers' role only) and
-- limits (snowflake_lease_set_limits(): the owner only). The
-- internal functions are in snowflake_id_internal, where PUBLIC has no
-- USAGE (docs/reference/functions.md, "Internal objects").
SELECT p.proname, p.pronamespace::regnamespace AS schema,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p
 WHERE p.proname LIKE 'snowflake\_%' AND p.proname <> 'snowflake_worker_status'
 ORDER BY p.proname;
SELECT n.nspname, has_schema_privilege('public', n.oid, 'USAGE') AS public_usage,
       has_schema_privilege('public', n.oid, 'CREATE') AS public_create,
       obj_description(n.oid, 'pg_namespace') IS NOT NULL AS commented
  FROM pg_namespace n WHERE n.nspname = 'snowflake_id_internal';
SELECT viewname FROM pg_views WHERE viewname = 'snowflake_workers';
