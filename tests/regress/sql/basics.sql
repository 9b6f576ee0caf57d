-- The basic promises, on every supported version: a column default fills
-- distinct, increasing IDs; a fresh ID decodes to now, this backend's
-- worker id and a sequence in range; a million IDs in one statement are
-- distinct and strictly increasing; the functions carry the labels they
-- should; the claim shows in pg_locks and snowflake_workers.
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), item text);
INSERT INTO orders (item) SELECT 'item ' || g FROM generate_series(1, 1000) g;
SELECT count(DISTINCT id) AS distinct_ids FROM orders;
-- Rows were inserted in item order, so IDs increase with it.
SELECT count(*) AS out_of_order
  FROM (SELECT id, lag(id) OVER (ORDER BY substr(item, 6)::int) AS prev FROM orders) s
 WHERE id <= prev;
DROP TABLE orders;
-- A fresh ID decodes to now (within a second), this backend's worker id and
-- a sequence in range; snowflake_timestamp agrees with snowflake_decode.
CREATE TEMP TABLE d AS SELECT snowflake_nextval() AS id;
SELECT abs(extract(epoch FROM clock_timestamp() - x.ts)) < 1 AS decodes_to_now,
       x.worker_id = (SELECT my_worker_id FROM snowflake_config()) AS my_worker,
       x.sequence BETWEEN 0 AND (SELECT max_sequence FROM snowflake_layout()) AS sequence_in_range,
       snowflake_timestamp(d.id) = x.ts AS timestamp_agrees
  FROM d, snowflake_decode(d.id) x;
-- A million IDs in one statement.
CREATE TEMP TABLE m AS SELECT g, snowflake_nextval() AS id FROM generate_series(1, 1000000) g;
SELECT count(DISTINCT id) AS distinct_ids FROM m;
SELECT count(*) AS out_of_order
  FROM (SELECT id, lag(id) OVER (ORDER BY g) AS prev FROM m) s
 WHERE id <= prev;
-- Labels: the generators are volatile and parallel unsafe; the decoders
-- stable (the layout can change at a restart), parallel safe and strict.
SELECT proname, provolatile, proparallel, proisstrict
  FROM pg_proc
 WHERE proname IN ('snowflake_nextval', 'snowflake_nextvals', 'snowflake_decode',
                   'snowflake_timestamp', 'snowflake_from_timestamp', 'snowflake_compose')
   AND pronargs = CASE proname WHEN 'snowflake_nextval' THEN 0
                               WHEN 'snowflake_compose' THEN 3 ELSE 1 END
 ORDER BY proname;
-- The claim: one ShareLock on the server-wide key (database 0, classid
-- "SNOW", objid = worker id, objsubid 3), and a row of snowflake_workers.
SELECT count(*) AS claim_locks
  FROM pg_locks
 WHERE locktype = 'advisory' AND database = 0 AND classid = 1397641047
   AND objid = (SELECT my_worker_id FROM snowflake_config()) AND objsubid = 3
   AND pid = pg_backend_pid() AND granted AND mode = 'ShareLock';
SELECT pid = pg_backend_pid() AS mine, ids_issued >= 1001001 AS counted,
       database = current_database() AS this_database, sessions, shared_claims
  FROM snowflake_workers
 WHERE worker_id = (SELECT my_worker_id FROM snowflake_config());
