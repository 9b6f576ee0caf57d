-- snowflake_decode(id) and snowflake_timestamp(id), classic layout:
-- 41 bits of ms since 2024-01-01 00:00 UTC, 10 worker bits, 12 sequence bits.
\set SHOW_CONTEXT never
-- STRICT: NULL in, NULL (no row for the set-returning decode) out.
SELECT * FROM snowflake_decode(NULL);
SELECT snowflake_timestamp(NULL) IS NULL AS is_null;
-- Zero is the first ID: the epoch, worker 0, sequence 0.
SELECT * FROM snowflake_decode(0);
SELECT snowflake_timestamp(0);
-- The fields: 4194303 = worker 1023, sequence 4095 at tick 0;
-- 4194304 = tick 1 (one millisecond later).
SELECT * FROM snowflake_decode(4194303);
SELECT * FROM snowflake_decode(4194304);
SELECT * FROM snowflake_decode((123::bigint << 22) | (45 << 12) | 678);
-- The largest bigint is the last ID of the classic layout (63 bits).
SELECT * FROM snowflake_decode(9223372036854775807);
SELECT snowflake_timestamp(9223372036854775807) = ends_at AS at_layout_end FROM snowflake_layout();
-- Negative IDs: 22003.
SELECT * FROM snowflake_decode(-1);
\echo :SQLSTATE
SELECT * FROM snowflake_decode(-9223372036854775808);
\echo :SQLSTATE
SELECT snowflake_timestamp(-1);
\echo :SQLSTATE
SELECT snowflake_timestamp(-9223372036854775808);
\echo :SQLSTATE
-- Not a bigint: PostgreSQL's own errors.
SELECT snowflake_timestamp('9223372036854775808');
\echo :SQLSTATE
SELECT snowflake_timestamp('abc');
\echo :SQLSTATE
-- An ID made now decodes to now, and both decoders agree.
SELECT abs(extract(epoch FROM d.ts - clock_timestamp())) < 2 AS about_now,
       snowflake_timestamp(x.id) = d.ts AS decoders_agree
  FROM (SELECT snowflake_nextval() AS id) x, snowflake_decode(x.id) d;
