-- snowflake_from_timestamp(ts) and snowflake_compose(ts, worker_id, sequence).
\set SHOW_CONTEXT never
-- STRICT: any NULL argument gives NULL.
SELECT snowflake_from_timestamp(NULL) IS NULL AS is_null;
SELECT snowflake_compose(NULL, 0, 0) IS NULL AS null_ts,
       snowflake_compose('2024-06-01 00:00:00+00', NULL, 0) IS NULL AS null_worker,
       snowflake_compose('2024-06-01 00:00:00+00', 0, NULL) IS NULL AS null_sequence;
-- The epoch is the first ID; the first millisecond after it is 1 << 22.
SELECT snowflake_from_timestamp('2024-01-01 00:00:00+00');
SELECT snowflake_from_timestamp('2024-01-01 00:00:00.000999+00');
SELECT snowflake_from_timestamp('2024-01-01 00:00:00.001+00');
-- The smallest ID at a time has worker 0 and sequence 0, and decodes back.
SELECT * FROM snowflake_decode(snowflake_from_timestamp('2025-06-15 12:34:56.789+00'));
-- The last millisecond of the layout is still in range.
SELECT snowflake_from_timestamp(ends_at) = max_id - 4194303 AS last_tick,
       snowflake_from_timestamp(ends_at + interval '999 microseconds') = max_id - 4194303
         AS same_ms
  FROM snowflake_layout();
-- Before the epoch or after the end of the layout: 22008.
SELECT snowflake_from_timestamp('2023-12-31 23:59:59.999999+00');
\echo :SQLSTATE
SELECT snowflake_from_timestamp('2000-01-01 00:00:00+00');
\echo :SQLSTATE
SELECT snowflake_from_timestamp('4713-01-01 00:00:00+00 BC');
\echo :SQLSTATE
SELECT snowflake_from_timestamp(ends_at + interval '1 ms') FROM snowflake_layout();
\echo :SQLSTATE
SELECT snowflake_from_timestamp('2200-01-01 00:00:00+00');
\echo :SQLSTATE
-- Infinite timestamps: 22008 as well. (Only the SQLSTATE is shown here: the
-- message is checked in test_regress.py.)
\set VERBOSITY sqlstate
SELECT snowflake_from_timestamp('infinity');
SELECT snowflake_from_timestamp('-infinity');
\set VERBOSITY default
-- Not a timestamp: PostgreSQL's own error.
SELECT snowflake_from_timestamp('yesterday-ish');
\echo :SQLSTATE
-- Composing: the parts go where snowflake_decode finds them.
SELECT snowflake_compose('2024-01-01 00:00:00+00', 0, 0);
SELECT snowflake_compose('2024-01-01 00:00:00+00', 1023, 4095);
SELECT snowflake_compose('2024-01-01 00:00:00.001+00', 0, 0);
SELECT * FROM snowflake_decode(snowflake_compose('2026-01-01 00:00:00+00', 7, 42));
SELECT snowflake_compose(ends_at, 1023, 4095) = max_id AS last_id FROM snowflake_layout();
-- A part outside the layout: 22003.
SELECT snowflake_compose('2026-01-01 00:00:00+00', 1024, 0);
\echo :SQLSTATE
SELECT snowflake_compose('2026-01-01 00:00:00+00', 0, 4096);
\echo :SQLSTATE
SELECT snowflake_compose('2026-01-01 00:00:00+00', 2147483647, 0);
\echo :SQLSTATE
SELECT snowflake_compose('2026-01-01 00:00:00+00', 0, 2147483647);
\echo :SQLSTATE
-- Negative parts: 22003 as well. (Only the SQLSTATE is shown here: the
-- message is checked in test_regress.py.)
\set VERBOSITY sqlstate
SELECT snowflake_compose('2026-01-01 00:00:00+00', -1, 0);
SELECT snowflake_compose('2026-01-01 00:00:00+00', 0, -1);
SELECT snowflake_compose('2026-01-01 00:00:00+00', -2147483648, -2147483648);
\set VERBOSITY default
-- A time outside the layout: 22008, whatever the other parts.
SELECT snowflake_compose('2000-01-01 00:00:00+00', 0, 0);
\echo :SQLSTATE
SELECT snowflake_compose('2200-01-01 00:00:00+00', 0, 0);
\echo :SQLSTATE
\set VERBOSITY sqlstate
SELECT snowflake_compose('infinity', 0, 0);
SELECT snowflake_compose('-infinity', 0, 0);
\set VERBOSITY default
