-- The snowflake_id.* settings: SET, ALTER SYSTEM and reloads.
\set SHOW_CONTEXT never
-- Reads a setting through a new connection until it has the expected value
-- (a reload reaches new backends once the postmaster has read the files;
-- this backend then applies it before its next statement).
CREATE EXTENSION dblink;
CREATE FUNCTION wait_for_setting(setting text, expected text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  conn text := format('dbname=%s host=%s port=%s user=%s', current_database(),
                      current_setting('unix_socket_directories'),
                      current_setting('port'), current_user);
  v text;
BEGIN
  FOR i IN 1 .. 200 LOOP
    SELECT s INTO v FROM dblink(conn, format('SHOW %I', setting)) AS t(s text);
    EXIT WHEN v = expected;
    PERFORM pg_sleep(0.05);
  END LOOP;
  RETURN v;
END $$;
SELECT name, setting, unit, context, min_val, max_val, enumvals, boot_val
  FROM pg_settings
 WHERE name IN ('snowflake_id.layout', 'snowflake_id.epoch', 'snowflake_id.time_unit_ms',
                'snowflake_id.total_bits', 'snowflake_id.worker_bits',
                'snowflake_id.sequence_bits', 'snowflake_id.worker_ids',
                'snowflake_id.max_drift')
 ORDER BY name;
--
-- SET: the layout settings need a restart, worker_ids and max_drift a
-- reload, so SET refuses them all (55P02), whatever the value.
--
SET snowflake_id.max_drift = -1;
\echo :SQLSTATE
SET snowflake_id.max_drift = '2s';
\echo :SQLSTATE
SELECT set_config('snowflake_id.max_drift', '5', false);
\echo :SQLSTATE
RESET snowflake_id.max_drift;
\echo :SQLSTATE
SET snowflake_id.worker_ids = '0-1';
\echo :SQLSTATE
SET snowflake_id.worker_ids = 'abc';
\echo :SQLSTATE
SET snowflake_id.layout = 'x';
\echo :SQLSTATE
SET snowflake_id.layout = 'js53';
\echo :SQLSTATE
SET snowflake_id.epoch = '2020-01-01';
\echo :SQLSTATE
SET snowflake_id.time_unit_ms = 0;
\echo :SQLSTATE
SET snowflake_id.worker_bits = 99;
\echo :SQLSTATE
-- The prefix is reserved: a typo is an error (42602), not a new setting.
SET snowflake_id.workers = '0-1';
\echo :SQLSTATE
SET snowflake_id.foo = 1;
\echo :SQLSTATE
SELECT set_config('snowflake_id.foo', '5', false);
\echo :SQLSTATE
SELECT current_setting('snowflake_id.foo');
\echo :SQLSTATE
SELECT current_setting('snowflake_id.foo', true) IS NULL AS missing;
--
-- ALTER SYSTEM validates the value before writing postgresql.auto.conf.
--
-- worker_ids: malformed, beyond the layout, empty or overlapping ranges: 22023.
ALTER SYSTEM SET snowflake_id.worker_ids = 'abc';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '-1';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '0-';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '0-1-2';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = ',';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '0-1024';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '1024';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '99999999999';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '5-3';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '0-10,5-20';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_ids = '3,3';
\echo :SQLSTATE
-- max_drift: 0 to 1h.
ALTER SYSTEM SET snowflake_id.max_drift = '2h';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.max_drift = 3600001;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.max_drift = -1;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.max_drift = 'soon';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.max_drift = '1 fortnight';
\echo :SQLSTATE
-- Layout settings: outside their limits, or not a preset.
ALTER SYSTEM SET snowflake_id.layout = 'x';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.layout = '';
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.time_unit_ms = 86400001;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.time_unit_ms = -2;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.total_bits = 64;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.worker_bits = 17;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.sequence_bits = 31;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.sequence_bits = 'many';
\echo :SQLSTATE
-- Unknown names under the reserved prefix.
ALTER SYSTEM SET snowflake_id.foo = 1;
\echo :SQLSTATE
ALTER SYSTEM SET snowflake_id.workers = '0-1';
\echo :SQLSTATE
-- Nothing was written.
SELECT count(*) FROM pg_file_settings WHERE name LIKE 'snowflake\_id.%';
--
-- Valid values, applied by a reload.
--
ALTER SYSTEM SET snowflake_id.max_drift = '1.5s';
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.max_drift', '1500ms');
SHOW snowflake_id.max_drift;
SELECT max_drift_ms FROM snowflake_config();
-- max_drift = 0 is valid: the generator waits for the clock instead of
-- borrowing a tick.
ALTER SYSTEM SET snowflake_id.max_drift = 0;
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.max_drift', '0');
SELECT max_drift_ms FROM snowflake_config();
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids FROM snowflake_nextvals(20000) id;
SELECT current_drift_ms, max_drift_ms FROM snowflake_workers WHERE pid = pg_backend_pid();
ALTER SYSTEM SET snowflake_id.max_drift = '1h';
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.max_drift', '1h');
-- Spaces around the ranges are allowed; SHOW keeps the text as written.
ALTER SYSTEM SET snowflake_id.worker_ids = ' 0 - 3 , 7 ';
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.worker_ids', ' 0 - 3 , 7 ');
SELECT worker_ids_total FROM snowflake_config();
-- A one-id range: a second backend finds it held and shares it (no
-- 53400). This backend claimed its worker id (a low one) before the reload
-- and keeps it.
ALTER SYSTEM SET snowflake_id.worker_ids = '1023';
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.worker_ids', '1023');
SELECT worker_ids, worker_ids_total FROM snowflake_config();
SELECT dblink_connect('holder', format('dbname=%s host=%s port=%s', current_database(),
       current_setting('unix_socket_directories'), current_setting('port')));
SELECT * FROM dblink('holder', 'SELECT snowflake_nextval() > 0') AS t(made bool);
SELECT * FROM dblink('holder', 'SELECT my_worker_id FROM snowflake_config()') AS t(worker_id int);
SELECT dblink_connect('second', format('dbname=%s host=%s port=%s', current_database(),
       current_setting('unix_socket_directories'), current_setting('port')));
SELECT * FROM dblink('second', 'SELECT snowflake_nextval() > 0') AS t(made bool);
SELECT * FROM dblink('second', 'SELECT my_worker_id FROM snowflake_config()') AS t(worker_id int);
SELECT worker_ids_held, worker_ids_free FROM snowflake_config();
SELECT sessions, shared_claims FROM snowflake_workers WHERE worker_id = 1023;
SELECT snowflake_nextval() > 0 AS own_claim_kept;
SELECT dblink_disconnect('holder');
SELECT dblink_disconnect('second');
-- A layout setting written by ALTER SYSTEM is valid but needs a restart:
-- a reload (seen applying max_drift) leaves the layout in use alone.
ALTER SYSTEM SET snowflake_id.layout = 'js53';
ALTER SYSTEM SET snowflake_id.max_drift = '2s';
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.max_drift', '2s');
SHOW snowflake_id.max_drift;
SELECT name, setting, applied, error FROM pg_file_settings WHERE name = 'snowflake_id.layout';
SHOW snowflake_id.layout;
SELECT preset, total_bits FROM snowflake_layout();
SELECT snowflake_nextval() > (1::bigint << 53) AS still_classic_ids;
-- Back to the defaults.
ALTER SYSTEM RESET ALL;
SELECT pg_reload_conf();
SELECT wait_for_setting('snowflake_id.worker_ids', '');
SELECT wait_for_setting('snowflake_id.max_drift', '1min');
SELECT count(*) FROM pg_file_settings WHERE name LIKE 'snowflake\_id.%';
SELECT worker_ids, worker_ids_total, max_drift_ms FROM snowflake_config();
DROP FUNCTION wait_for_setting(text, text);
DROP EXTENSION dblink;
