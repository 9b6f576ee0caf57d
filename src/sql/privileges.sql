-- Functions that change how IDs are made: superusers only (GRANT to
-- delegate).
REVOKE EXECUTE ON FUNCTION snowflake_accept_layout() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION snowflake_advance_past(bigint) FROM PUBLIC;
