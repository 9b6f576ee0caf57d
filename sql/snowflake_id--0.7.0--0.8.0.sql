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

-- == Backfill at migration scale (issue 44) ==
-- Backfill takes one grant per stretch of time and session, in any order
-- of times (snowflake_core::backfill). Grants keep their numbering, so the
-- grants 0.7.0 handed out (shared memory, the state file, WAL and
-- snowflake_backfill_grants, all unchanged) stay handed out as they are.
-- snowflake_backfill() shows what is left of each stretch and what this
-- session holds: two more columns, and parallel restricted (a session's own
-- grants are not a parallel worker's).
DROP FUNCTION snowflake_backfill();
CREATE FUNCTION snowflake_backfill() RETURNS TABLE (
	"bucket" INT,
	"starts_at" timestamp with time zone,
	"ends_at" timestamp with time zone,
	"grants" bigint,
	"capacity" bigint,
	"grants_left" bigint,
	"this_session" bigint,
	"worker_ids" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_backfill_wrapper';
COMMENT ON FUNCTION snowflake_backfill() IS
  'Backfill grants of each stretch of time: its first and last time, grants handed out, grants it holds, grants left, grants this session holds.';
