-- snowflake_nextval() and snowflake_nextvals(n).
\set SHOW_CONTEXT never
-- A positive ID, made by this backend's worker id, at about the current time.
SELECT snowflake_nextval() > 0 AS positive;
SELECT d.worker_id = c.my_worker_id AS my_worker_id,
       abs(extract(epoch FROM d.ts - clock_timestamp())) < 2 AS about_now
  FROM snowflake_decode(snowflake_nextval()) d, snowflake_config() c;
-- The smallest ID of the transaction start is not above a new ID, and a new
-- ID is at most max_drift (1 s) ahead of the clock.
SELECT snowflake_from_timestamp(now()) <= snowflake_nextval() AS after_txn_start,
       snowflake_nextval() < snowflake_from_timestamp(clock_timestamp() + interval '2 s')
         AS within_drift;
-- IDs of one backend strictly increase.
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids,
       bool_and(prev IS NULL OR id > prev) AS increasing
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev
          FROM (SELECT n, snowflake_nextval() AS id
                  FROM generate_series(1, 10000) n) s) x;
-- A claim writes no table: IDs can be made in a read-only transaction.
BEGIN TRANSACTION READ ONLY;
SELECT snowflake_nextval() > 0 AS in_read_only_transaction;
COMMIT;
-- Batches: 1 to 1,000,000 IDs, in increasing order.
SELECT count(*) FROM snowflake_nextvals(1);
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids,
       bool_and(prev IS NULL OR id > prev) AS increasing
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev
          FROM snowflake_nextvals(1000) WITH ORDINALITY AS b(id, n)) x;
SELECT count(*) FROM snowflake_nextvals(1000000);
-- A batch continues above the IDs made before it.
SELECT snowflake_nextval() AS single \gset
SELECT min(id) > :single AS batch_above_single FROM snowflake_nextvals(10) id;
SELECT max(id) AS batch_max FROM snowflake_nextvals(10) id \gset
SELECT snowflake_nextval() > :batch_max AS single_above_batch;
-- Bad batch sizes: 22023, nothing made.
SELECT count(*) FROM snowflake_nextvals(1000001);
\echo :SQLSTATE
SELECT count(*) FROM snowflake_nextvals(2147483647);
\echo :SQLSTATE
-- (Too small: the message only; the hint is checked in test_regress.py.)
\set VERBOSITY terse
SELECT count(*) FROM snowflake_nextvals(0);
\echo :SQLSTATE
SELECT count(*) FROM snowflake_nextvals(-1);
\echo :SQLSTATE
SELECT count(*) FROM snowflake_nextvals(-2147483648);
\echo :SQLSTATE
\set VERBOSITY default
-- Not an int: PostgreSQL's own errors.
SELECT count(*) FROM snowflake_nextvals(2147483648);
\echo :SQLSTATE
SELECT count(*) FROM snowflake_nextvals('ten');
\echo :SQLSTATE
-- STRICT: a NULL batch size makes no IDs and no error.
SELECT count(*) FROM snowflake_nextvals(NULL);
-- The session still works after all those errors.
SELECT snowflake_nextval() > 0 AS still_working;
