-- After all the bad input: the server is alive and nothing is corrupted.
\set SHOW_CONTEXT never
SELECT 1 AS alive;
SELECT worker_ids, worker_ids_total, worker_ids_held + worker_ids_free AS held_plus_free,
       max_drift_ms
  FROM snowflake_config();
SELECT preset, time_unit_ms, total_bits, worker_bits, sequence_bits FROM snowflake_layout();
SELECT name, setting FROM pg_settings
 WHERE name IN ('snowflake_id.layout', 'snowflake_id.epoch', 'snowflake_id.time_unit_ms',
                'snowflake_id.total_bits', 'snowflake_id.worker_bits',
                'snowflake_id.sequence_bits', 'snowflake_id.worker_ids',
                'snowflake_id.max_drift')
 ORDER BY name;
-- IDs are still made, unique and increasing, and decode to now.
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids,
       bool_and(prev IS NULL OR id > prev) AS increasing,
       bool_and(abs(extract(epoch FROM snowflake_timestamp(id) - clock_timestamp())) < 2) AS about_now
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev
          FROM snowflake_nextvals(1000) WITH ORDINALITY AS b(id, n)) x;
-- Every worker id seen is inside the layout; no id is held twice.
SELECT count(*) = count(DISTINCT worker_id) AS one_row_each,
       bool_and(worker_id BETWEEN 0 AND 1023) AS in_layout,
       count(pid) = count(DISTINCT pid) AS one_id_per_backend
  FROM snowflake_workers;
DROP EXTENSION snowflake_id;
