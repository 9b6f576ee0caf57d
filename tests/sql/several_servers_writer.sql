-- Run on every writer (A, B, C ...), in the database that holds the table:
--   psql -v ON_ERROR_STOP=1 -d app -f several_servers_writer.sql
-- Each writer's postgresql.conf has, before its start:
--   shared_preload_libraries = 'snowflake_id'
--   snowflake_id.worker_ids  = '0-340'      -- B: '341-681', C: '682-1023'
--   wal_level = logical
CREATE EXTENSION IF NOT EXISTS snowflake_id;

CREATE TABLE events (
    id         bigint PRIMARY KEY DEFAULT snowflake_nextval(),
    origin     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE PUBLICATION events_pub FOR TABLE events;
