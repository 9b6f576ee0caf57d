-- What adopters need: snowflake_decode() as one row, scalar
-- decoders, IMMUTABLE decoders with an explicit layout, a COMMENT on every
-- object, snowflake_convert_column() and snowflake_create_partitions().
\set SHOW_CONTEXT never
SET client_min_messages = warning;
-- snowflake_decode() returns one row, not a set: STRICT gives one row of
-- NULLs for NULL, and it works in RETURNING and inside aggregates.
SELECT p.proretset AS returns_set FROM pg_proc p WHERE p.proname = 'snowflake_decode';
SELECT * FROM snowflake_decode(NULL);
SELECT (snowflake_decode((123::bigint << 22) | (45 << 12) | 678)).*;
CREATE TABLE adopt_orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), item text);
INSERT INTO adopt_orders (item) VALUES ('coffee') RETURNING (snowflake_decode(id)).worker_id =
  (SELECT my_worker_id FROM snowflake_config()) AS my_worker;
INSERT INTO adopt_orders (item) SELECT 'item ' || g FROM generate_series(1, 100) g;
SELECT count(DISTINCT (snowflake_decode(id)).worker_id) AS workers FROM adopt_orders;
-- The scalar decoders agree with the row.
SELECT snowflake_worker_id((123::bigint << 22) | (45 << 12) | 678) AS worker_id,
       snowflake_sequence((123::bigint << 22) | (45 << 12) | 678) AS sequence;
SELECT bool_and(snowflake_worker_id(id) = (snowflake_decode(id)).worker_id
            AND snowflake_sequence(id) = (snowflake_decode(id)).sequence) AS agree
  FROM adopt_orders;
SELECT snowflake_worker_id(NULL) IS NULL AS strict_worker, snowflake_sequence(NULL) IS NULL AS strict_sequence;
SELECT snowflake_worker_id(-1);
\echo :SQLSTATE
SELECT snowflake_sequence(-1);
\echo :SQLSTATE
-- IMMUTABLE decoders with the layout given explicitly agree with the
-- server's layout, for IDs made now and for partition bounds.
SELECT p.oid::regprocedure AS function, p.provolatile AS volatility
  FROM pg_proc p
 WHERE p.proname IN ('snowflake_timestamp', 'snowflake_from_timestamp') AND p.pronargs = 5
 ORDER BY 1::text;
SELECT bool_and(snowflake_timestamp(o.id, l.epoch, l.time_unit_ms, l.worker_bits, l.sequence_bits)
                = snowflake_timestamp(o.id)) AS timestamps_agree
  FROM adopt_orders o, snowflake_layout() l;
SELECT snowflake_from_timestamp(t, l.epoch, l.time_unit_ms, l.worker_bits, l.sequence_bits)
       = snowflake_from_timestamp(t) AS bounds_agree
  FROM snowflake_layout() l,
       (VALUES (timestamptz '2026-11-01 00:00:00+00'), ('2025-02-28 13:14:15.678+00')) v(t);
SELECT snowflake_timestamp(-1, '2024-01-01+00', 1, 10, 12);
\echo :SQLSTATE
SELECT snowflake_timestamp(1, '2024-01-01+00', 0, 10, 12);
\echo :SQLSTATE
SELECT snowflake_from_timestamp('2023-12-31 23:59:59+00', '2024-01-01+00', 1, 10, 12);
\echo :SQLSTATE
-- The forms with total_bits: the same answers with 63, and under js53's
-- 53 bits a time past the layout's end (22008) and an ID wider than 53
-- bits (22003) are refused instead of giving a wider ID.
SELECT snowflake_timestamp(o.id, l.epoch, l.time_unit_ms, l.worker_bits, l.sequence_bits, l.total_bits)
       = snowflake_timestamp(o.id) AS six_argument_form_agrees
  FROM adopt_orders o, snowflake_layout() l LIMIT 1;
SELECT snowflake_from_timestamp('2100-01-01+00', '2024-01-01+00', 1, 6, 6, 53);
\echo :SQLSTATE
SELECT snowflake_from_timestamp('2100-01-01+00', '2024-01-01+00', 1, 6, 6, 63) >= (1::bigint << 53)
       AS wider_than_53_bits_under_63;
SELECT snowflake_from_timestamp('2026-01-01+00', '2024-01-01+00', 1, 6, 6, 53) < (1::bigint << 53)
       AS within_53_bits;
SELECT snowflake_timestamp(1::bigint << 53, '2024-01-01+00', 1, 6, 6, 53);
\echo :SQLSTATE
SELECT snowflake_timestamp(1, '2024-01-01+00', 1, 10, 12, 22);
\echo :SQLSTATE
-- SQL-standard bodies: bound when created (no search_path of the caller
-- matters, none is set) and inlined by the planner.
SELECT p.oid::regprocedure AS function, p.prosqlbody IS NOT NULL AS sql_standard_body,
       p.proconfig IS NULL AS no_set_clause
  FROM pg_proc p
 WHERE p.proname IN ('snowflake_timestamp', 'snowflake_from_timestamp') AND p.pronargs >= 5
 ORDER BY 1::text;
EXPLAIN (VERBOSE, COSTS OFF)
SELECT snowflake_timestamp(id, '2024-01-01+00', 1, 10, 12, 63) FROM adopt_orders;
-- Every function, view and table of the extension has a description, so
-- \df+ snowflake_* and \dv+ describe them.
SELECT pg_describe_object(d.classid, d.objid, 0) AS undescribed
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'snowflake_id')
   AND d.deptype = 'e'
   AND d.classid IN ('pg_proc'::regclass, 'pg_class'::regclass)
   AND obj_description(d.objid, d.classid::regclass::name) IS NULL
   AND NOT (d.classid = 'pg_class'::regclass
            AND (SELECT relkind FROM pg_class WHERE oid = d.objid) NOT IN ('r', 'v'))
 ORDER BY 1;
SELECT count(*) >= 18 AS described
  FROM pg_depend d
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'snowflake_id')
   AND d.deptype = 'e' AND obj_description(d.objid, d.classid::regclass::name) IS NOT NULL;

-- snowflake_convert_column(): bigserial. The sequence goes, the default is
-- switched, existing rows stay, new rows get snowflake IDs.
CREATE TABLE conv_bigserial (id bigserial PRIMARY KEY, note text);
INSERT INTO conv_bigserial (note) VALUES ('old 1'), ('old 2');
SELECT step FROM snowflake_convert_column('conv_bigserial', 'id');
SELECT pg_get_expr(adbin, adrelid) AS new_default FROM pg_attrdef WHERE adrelid = 'conv_bigserial'::regclass;
SELECT to_regclass('conv_bigserial_id_seq') IS NULL AS sequence_dropped;
INSERT INTO conv_bigserial (note) VALUES ('new') RETURNING id > 1000000 AS snowflake_id;
SELECT note FROM conv_bigserial ORDER BY id;
-- Converting again does nothing.
SELECT step FROM snowflake_convert_column('conv_bigserial', 'id');
-- serial (integer): refused with the fix in the hint, then done on request.
CREATE TABLE conv_serial (id serial PRIMARY KEY, note text);
INSERT INTO conv_serial (note) VALUES ('old');
SELECT step FROM snowflake_convert_column('conv_serial', 'id');
\echo :SQLSTATE
SELECT step FROM snowflake_convert_column('conv_serial', 'id', convert_type => true);
SELECT format_type(atttypid, NULL) AS type FROM pg_attribute
 WHERE attrelid = 'conv_serial'::regclass AND attname = 'id';
INSERT INTO conv_serial (note) VALUES ('new') RETURNING id > 1000000 AS snowflake_id;
-- Identity ALWAYS and BY DEFAULT: identity and its sequence dropped.
CREATE TABLE conv_always (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text);
INSERT INTO conv_always (note) VALUES ('old');
SELECT step FROM snowflake_convert_column('conv_always', 'id');
SELECT attidentity = '' AS no_identity FROM pg_attribute
 WHERE attrelid = 'conv_always'::regclass AND attname = 'id';
INSERT INTO conv_always (note) VALUES ('new') RETURNING id > 1000000 AS snowflake_id;
CREATE TABLE conv_bydefault (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text);
INSERT INTO conv_bydefault (note) VALUES ('old');
SELECT step FROM snowflake_convert_column('conv_bydefault', 'id', convert_type => true);
SELECT count(*) AS sequences_left FROM pg_class WHERE relkind = 'S' AND relname LIKE 'conv\_%';
INSERT INTO conv_bydefault (note) VALUES ('new') RETURNING id > 1000000 AS snowflake_id;
-- A view on a bigint column stays; on an integer column the type cannot
-- change under it: 0A000, naming the view, and nothing changed.
CREATE TABLE conv_viewed (id bigserial PRIMARY KEY, note text);
CREATE VIEW conv_viewed_v AS SELECT id, note FROM conv_viewed;
SELECT step FROM snowflake_convert_column('conv_viewed', 'id');
INSERT INTO conv_viewed (note) VALUES ('new');
SELECT count(*) AS through_view FROM conv_viewed_v WHERE id > 1000000;
CREATE TABLE conv_viewed4 (id serial PRIMARY KEY, note text);
CREATE VIEW conv_viewed4_v AS SELECT id FROM conv_viewed4;
SELECT step FROM snowflake_convert_column('conv_viewed4', 'id', convert_type => true);
\echo :SQLSTATE
SELECT pg_get_expr(adbin, adrelid) AS unchanged_default FROM pg_attrdef WHERE adrelid = 'conv_viewed4'::regclass;
-- What it cannot do: 42703, 42804, 42809, 22003, 42501.
SELECT step FROM snowflake_convert_column('conv_serial', 'nope');
\echo :SQLSTATE
SELECT step FROM snowflake_convert_column('conv_serial', 'note');
\echo :SQLSTATE
SELECT step FROM snowflake_convert_column('conv_viewed_v', 'id');
\echo :SQLSTATE
CREATE TABLE conv_big (id bigint PRIMARY KEY);
INSERT INTO conv_big VALUES (snowflake_from_timestamp(now() + interval '1 day'));
-- (its message shows IDs of now: only the SQLSTATE is shown)
\set VERBOSITY sqlstate
SELECT step FROM snowflake_convert_column('conv_big', 'id');
\set VERBOSITY default
CREATE TABLE conv_parent (id bigserial PRIMARY KEY);
CREATE TABLE conv_child (parent_id int REFERENCES conv_parent);
SELECT step FROM snowflake_convert_column('conv_parent', 'id');
\echo :SQLSTATE
CREATE ROLE regress_snowflake_other;
SET ROLE regress_snowflake_other;
SELECT step FROM snowflake_convert_column('conv_big', 'id');
\echo :SQLSTATE
RESET ROLE;
DROP ROLE regress_snowflake_other;

-- snowflake_create_partitions(): calendar partitions with readable names,
-- idempotent, rows routed by the time in their ID.
CREATE TABLE adopt_events (id bigint NOT NULL DEFAULT snowflake_nextval(), payload text)
    PARTITION BY RANGE (id);
SELECT partition_name, created, from_time AT TIME ZONE 'UTC' AS from_utc, to_time AT TIME ZONE 'UTC' AS to_utc
  FROM snowflake_create_partitions('adopt_events', '1 month', 3, '2026-11-23 19:00:00+00');
SELECT partition_name, created
  FROM snowflake_create_partitions('adopt_events', '1 month', 4, '2026-11-01 00:00:00+00');
INSERT INTO adopt_events (id, payload)
VALUES (snowflake_compose('2026-11-30 23:59:59.999+00', 1, 0), 'last ms of November'),
       (snowflake_compose('2026-12-01 00:00:00+00', 1, 0), 'first ms of December');
SELECT tableoid::regclass AS partition, payload FROM adopt_events ORDER BY id;
SELECT partition_name FROM snowflake_create_partitions('adopt_events', '1 day', 2, '2027-03-01 00:00:00+00');
SELECT partition_name FROM snowflake_create_partitions('adopt_events', '1 year', 1, '2030-06-01 00:00:00+00');
SELECT partition_name FROM snowflake_create_partitions('adopt_events', '1 week', 1, '2033-03-09 00:00:00+00');
SELECT * FROM snowflake_create_partitions('adopt_events', '2 months', 1);
\echo :SQLSTATE
SELECT * FROM snowflake_create_partitions('adopt_events', '1 month', 0);
\echo :SQLSTATE
SELECT * FROM snowflake_create_partitions('adopt_orders', '1 month', 1);
\echo :SQLSTATE
CREATE TABLE adopt_events_p2032_01 (id bigint);
SELECT * FROM snowflake_create_partitions('adopt_events', '1 month', 1, '2032-01-15 00:00:00+00');
\echo :SQLSTATE
DROP TABLE adopt_events, adopt_events_p2032_01, adopt_orders, conv_bigserial, conv_serial, conv_always,
  conv_bydefault, conv_viewed CASCADE;
DROP TABLE conv_viewed4, conv_big, conv_child, conv_parent CASCADE;
