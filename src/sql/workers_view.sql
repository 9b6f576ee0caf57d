-- snowflake_workers: one row per worker id in use or used, over
-- snowflake_worker_status() (src/sql/api.rs).
CREATE VIEW snowflake_workers AS
SELECT w.worker_id, w.pid, d.datname AS database, r.rolname AS role,
       coalesce(a.application_name, w.application_name) AS application_name,
       CASE WHEN v.full THEN w.claimed_at END AS claimed_at, w.released_at, w.claims,
       CASE WHEN v.full THEN w.ids_issued END AS ids_issued,
       CASE WHEN v.full THEN w.last_id_time END AS last_id_time,
       w.current_drift_ms, w.max_drift_ms, w.sequence_exhausted, w.clock_backward,
       w.sessions, w.shared_claims
  FROM snowflake_worker_status() w
  LEFT JOIN pg_catalog.pg_database d ON d.oid = w.database_oid
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = w.role_oid
  -- The holder's application name now (it may have changed since the claim).
  LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(coalesce(w.pid, 0)) a ON a.pid = w.pid
  -- Like pg_stat_activity: when and how much a session did is for its own
  -- role (and roles that have its privileges), superusers and
  -- pg_read_all_stats.
  CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
          OR (w.role_oid IS NOT NULL AND pg_catalog.pg_has_role(w.role_oid, 'USAGE')) AS full) v;
COMMENT ON VIEW snowflake_workers IS
  'Worker ids held now or used since the server started, with their generator counters.';
GRANT SELECT ON snowflake_workers TO PUBLIC;
