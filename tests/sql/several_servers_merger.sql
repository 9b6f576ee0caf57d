-- Run once on the merger M, with one connection string per writer:
--   psql -v ON_ERROR_STOP=1 -d app \
--        -v conninfo_a='host=a.example dbname=app user=replicator' \
--        -v conninfo_b='host=b.example dbname=app user=replicator' \
--        -v conninfo_c='host=c.example dbname=app user=replicator' \
--        -f several_servers_merger.sql
-- The user needs the REPLICATION attribute (or superuser) on the writers.
-- M does not make IDs: its id column needs no default, and M needs neither
-- the extension nor wal_level = logical.
CREATE TABLE events (
    id         bigint PRIMARY KEY,
    origin     text NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE SUBSCRIPTION events_from_a CONNECTION :'conninfo_a' PUBLICATION events_pub;
CREATE SUBSCRIPTION events_from_b CONNECTION :'conninfo_b' PUBLICATION events_pub;
CREATE SUBSCRIPTION events_from_c CONNECTION :'conninfo_c' PUBLICATION events_pub;
