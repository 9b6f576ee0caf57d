-- snowflake_id 0.7.0 -> 0.8.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.7.0's install script is kept
-- in tests/upgrade/ for it).
--
-- One section per concern, in this order; each section says what it
-- changes and why.

-- == The registry's decisions in the Rust core (issue 42) ==

-- == Getting it, switching to it and watching it (issue 43) ==

-- snowflake_health(): one row per check (src/sql/health.rs), for pg_monitor.
CREATE FUNCTION "snowflake_health"() RETURNS TABLE (
	"name" TEXT,
	"status" TEXT,
	"value" TEXT,
	"threshold" TEXT,
	"action" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_health_wrapper';
REVOKE EXECUTE ON FUNCTION snowflake_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION snowflake_health() TO pg_monitor;
COMMENT ON FUNCTION snowflake_health() IS
  'One row per health check (layout, leases, registry, worker ids, reservation, backfill, registry table): status ok, warn or critical, the value, the threshold and what to do.';

-- == Backfill at migration scale (issue 44) ==
