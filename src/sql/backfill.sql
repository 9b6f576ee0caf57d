-- snowflake_at() (src/sql/backfill.rs) consumes backfill grants, a durable
-- and finite resource of the server (snowflake_backfill() shows them):
-- superusers only, and the roles they GRANT EXECUTE to (a migration's).
REVOKE EXECUTE ON FUNCTION snowflake_at(timestamptz) FROM PUBLIC;
