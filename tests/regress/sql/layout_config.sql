-- snowflake_layout(), snowflake_config(), snowflake_accept_layout() and the
-- snowflake_workers view, for a superuser and for an ordinary role.
\set SHOW_CONTEXT never
-- The classic layout (the default), as docs/reference/layout.md documents it.
SELECT preset, epoch, time_unit_ms, total_bits, time_bits, worker_bits, sequence_bits,
       max_worker_id, max_sequence, max_id, ends_at,
       years_left BETWEEN 60 AND 70 AS decades_left, ends_soon
  FROM snowflake_layout();
SELECT to_char(ends_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS lasts_until FROM snowflake_layout();
-- A fresh session holds no worker id; the whole layout is the range.
SELECT worker_ids, worker_ids_total, worker_ids_held + worker_ids_free = worker_ids_total AS adds_up,
       my_worker_id IS NULL AS no_claim_yet, max_drift_ms
  FROM snowflake_config();
-- The first ID claims one.
SELECT snowflake_nextval() > 0 AS made;
SELECT my_worker_id BETWEEN 0 AND 1023 AS claimed, worker_ids_held >= 1 AS counted
  FROM snowflake_config();
-- The view shows this backend's claim and its counters.
SELECT worker_id = (SELECT my_worker_id FROM snowflake_config()) AS my_worker_id,
       database = current_database() AS database, role = session_user AS role,
       claimed_at <= clock_timestamp() AS claimed_at, released_at IS NULL AS not_released,
       claims >= 1 AS claims, ids_issued >= 1 AS ids_issued,
       last_id_time <= clock_timestamp() + interval '1 s' AS last_id_time,
       current_drift_ms BETWEEN 0 AND 1000 AS current_drift,
       max_drift_ms BETWEEN 0 AND 1000 AS max_drift,
       sequence_exhausted >= 0 AS sequence_exhausted, clock_backward >= 0 AS clock_backward
  FROM snowflake_workers WHERE pid = pg_backend_pid();
SELECT application_name FROM snowflake_workers WHERE pid = pg_backend_pid();
-- Earlier test sessions have exited: their worker ids are past claims,
-- shown to a superuser with who held them.
SELECT count(*) > 0 AS has_past_claims,
       bool_and(database IS NOT NULL AND role IS NOT NULL AND released_at IS NOT NULL)
         AS holders_shown
  FROM snowflake_workers WHERE pid IS NULL;
-- One row per worker id, and only ids of the layout.
SELECT count(*) = count(DISTINCT worker_id) AS one_row_each,
       bool_and(worker_id BETWEEN 0 AND 1023) AS in_layout
  FROM snowflake_workers;
SELECT count(*) FROM snowflake_workers WHERE worker_id < 0 OR worker_id IS NULL;
-- Adopting the layout on a server whose layout did not change does nothing.
SELECT changed, first_id <= snowflake_nextval() AS first_id_not_ahead,
       ids_resume_at <= clock_timestamp() AS resume_not_ahead
  FROM snowflake_accept_layout();
-- An ordinary role makes IDs and reads the view, but may not adopt a
-- layout or change settings: 42501.
CREATE ROLE regress_snowflake_user;
SET ROLE regress_snowflake_user;
SELECT snowflake_nextval() > 0 AS made;
SELECT count(*) >= 1 AS sees_own_claim FROM snowflake_workers WHERE pid = pg_backend_pid();
-- Past holders are shown only to superusers and pg_read_all_stats members:
-- the rows are there, who held them is not.
SELECT count(*) > 0 AS has_past_claims,
       bool_and(database IS NULL AND role IS NULL AND application_name IS NULL)
         AS holders_hidden
  FROM snowflake_workers WHERE pid IS NULL;
SELECT * FROM snowflake_accept_layout();
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.max_drift = '2s';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '0-1';
\echo :SQLSTATE
SELECT * FROM snowflake_decode(0);
RESET ROLE;
DROP ROLE regress_snowflake_user;
