-- snowflake_id 0.7.0 -> 0.8.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install (0.7.0's install script is kept
-- in tests/upgrade/ for it).
--
-- One section per concern, in this order; each section says what it
-- changes and why.

-- == The registry's decisions in the Rust core (issue 42) ==

-- == Getting it, switching to it and watching it (issue 43) ==

-- snowflake_health(): one row per check (src/sql/health.rs), for pg_monitor.
CREATE FUNCTION "snowflake_health"() RETURNS TABLE (
	"name" TEXT,
	"status" TEXT,
	"value" TEXT,
	"threshold" TEXT,
	"action" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_health_wrapper';
REVOKE EXECUTE ON FUNCTION snowflake_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION snowflake_health() TO pg_monitor;
COMMENT ON FUNCTION snowflake_health() IS
  'One row per health check (layout, leases, registry, worker ids, reservation, backfill, registry table): status ok, warn or critical, the value, the threshold and what to do.';

-- The explicit-layout decoders apply the server's rule that a time field
-- lasts at least ten years; snowflake_convert_column() recognises pgEdge
-- snowflake's default, locks the table before reading its largest value,
-- waits out values up to a second ahead and no longer hints at setting
-- only the default; it and snowflake_create_partitions() refuse NULL
-- arguments with 22004; the lease limits' trigger gives a hint. Same
-- signatures: replaced in place (src/sql/tools.sql, src/sql/leases.sql).

CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_layout_shift(time_unit_ms bigint, worker_bits int,
                                                             sequence_bits int, total_bits int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF time_unit_ms < 1 OR time_unit_ms > 86400000 OR worker_bits < 0 OR worker_bits > 16
       OR sequence_bits < 1 OR sequence_bits > 30 OR total_bits < 2 OR total_bits > 63
       OR worker_bits + sequence_bits >= total_bits THEN
        RAISE EXCEPTION 'invalid explicit snowflake layout: time_unit_ms %, worker_bits %, sequence_bits %, total_bits %',
                        time_unit_ms, worker_bits, sequence_bits, total_bits
            USING ERRCODE = '22023',
                  HINT = 'Pass the values snowflake_layout() shows: time_unit_ms 1 to 86400000, worker_bits 0 to 16, sequence_bits 1 to 30, total_bits 2 to 63 with at least one time bit.';
    END IF;
    -- The last millisecond of the time field, from the epoch: the server's
    -- end_unix_ms() minus the epoch, against ten years.
    IF (2::numeric ^ (total_bits - worker_bits - sequence_bits)) * time_unit_ms - 1 < 315576000000 THEN
        RAISE EXCEPTION 'invalid explicit snowflake layout: its time field lasts less than 10 years from the epoch'
            USING ERRCODE = '22023',
                  DETAIL = format('%s time bits of %s ms last %s days; the server refuses such a layout at start.',
                                  total_bits - worker_bits - sequence_bits, time_unit_ms,
                                  floor((2::numeric ^ (total_bits - worker_bits - sequence_bits)) * time_unit_ms / 86400000)),
                  HINT = 'Pass the values snowflake_layout() shows.';
    END IF;
    RETURN worker_bits + sequence_bits;
END
$$;

CREATE OR REPLACE FUNCTION snowflake_convert_column(tbl regclass, col name, convert_type boolean DEFAULT false)
RETURNS TABLE (step text, detail text)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
    a record;
    views text;
    fks text;
    seq regclass;
    max_id bigint;
    first_id bigint;
    others int;
    pgedge boolean;
    pgedge_layout boolean;
    hint text;
    l record;
    max_ts timestamptz;
    wait_ms double precision;
BEGIN
    IF tbl IS NULL OR col IS NULL OR convert_type IS NULL THEN
        RAISE EXCEPTION 'snowflake_convert_column: argument % is null',
                        CASE WHEN tbl IS NULL THEN 'tbl' WHEN col IS NULL THEN 'col' ELSE 'convert_type' END
            USING ERRCODE = '22004', HINT = 'Pass the table, the name of its key column and, optionally, convert_type true or false.';
    END IF;
    SELECT c.relkind, c.relowner INTO r FROM pg_catalog.pg_class c WHERE c.oid = tbl;
    IF r.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '"%" is not a table', tbl
            USING ERRCODE = '42809',
                  HINT = 'Convert the key column of a table (plain or partitioned).';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, r.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', tbl
            USING ERRCODE = '42501',
                  HINT = 'Run it as the table''s owner or a member of the owning role, as ALTER TABLE requires.';
    END IF;
    SELECT att.attnum, att.atttypid, att.attidentity, att.attgenerated,
           pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS def, d.oid AS def_oid
      INTO a
      FROM pg_catalog.pg_attribute att
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = att.attrelid AND d.adnum = att.attnum
     WHERE att.attrelid = tbl AND att.attname = col AND att.attnum > 0 AND NOT att.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of table % does not exist', col, tbl
            USING ERRCODE = '42703', HINT = 'Name an existing column of the table.';
    END IF;
    IF a.attgenerated <> '' THEN
        RAISE EXCEPTION 'column "%" of table % is a generated column', col, tbl
            USING ERRCODE = '42P16', HINT = 'Convert a plain key column; a generated column has no default to switch.';
    END IF;
    IF a.def IS NOT NULL AND a.def LIKE '%snowflake_nextval()%' THEN
        step := 'nothing to do';
        detail := format('column %s of %s already defaults to %s', col, tbl, a.def);
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Foreign keys that hold copies of this column must be able to hold snowflake IDs too.
    SELECT string_agg(format('%s.%I (%s)', con.conrelid::regclass, ref.attname,
                             pg_catalog.format_type(ref.atttypid, NULL)), ', ')
      INTO fks
      FROM pg_catalog.pg_constraint con
      CROSS JOIN LATERAL unnest(con.confkey, con.conkey) AS k(target, source)
      JOIN pg_catalog.pg_attribute ref ON ref.attrelid = con.conrelid AND ref.attnum = k.source
     WHERE con.contype = 'f' AND con.confrelid = tbl AND k.target = a.attnum
       AND ref.atttypid <> 'bigint'::regtype;
    IF fks IS NOT NULL THEN
        RAISE EXCEPTION 'foreign keys referencing %.% are not bigint: %', tbl, col, fks
            USING ERRCODE = '42804',
                  DETAIL = 'Snowflake IDs do not fit in integer or smallint: rows referencing new IDs would fail with 22003.',
                  HINT = 'ALTER TABLE ... ALTER COLUMN ... TYPE bigint on those columns first, then convert this one.';
    END IF;

    IF a.atttypid IN ('integer'::regtype, 'smallint'::regtype) THEN
        SELECT string_agg(DISTINCT v.oid::regclass::text, ', ')
          INTO views
          FROM pg_catalog.pg_depend dep
          JOIN pg_catalog.pg_rewrite rw ON rw.oid = dep.objid
          JOIN pg_catalog.pg_class v ON v.oid = rw.ev_class
         WHERE dep.classid = 'pg_catalog.pg_rewrite'::regclass
           AND dep.refclassid = 'pg_catalog.pg_class'::regclass
           AND dep.refobjid = tbl AND dep.refobjsubid = a.attnum AND v.oid <> tbl;
        IF NOT convert_type THEN
            RAISE EXCEPTION 'column "%" of table % is %, too small for snowflake IDs', col, tbl,
                            pg_catalog.format_type(a.atttypid, NULL)
                USING ERRCODE = '42804',
                      DETAIL = 'Snowflake IDs are larger than any integer: every insert would fail with 22003 (integer out of range).',
                      HINT = format('Call snowflake_convert_column(%L, %L, convert_type => true) to run ALTER TABLE %s ALTER COLUMN %I TYPE bigint first (it rewrites the table and its indexes under an ACCESS EXCLUSIVE lock), or run that yourself.',
                                    tbl::text, col, tbl, col);
        END IF;
        IF views IS NOT NULL THEN
            RAISE EXCEPTION 'cannot change the type of column "%" of table %: views depend on it', col, tbl
                USING ERRCODE = '0A000',
                      DETAIL = format('Dependent views: %s.', views),
                      HINT = 'In one transaction: drop those views, call this function again, and create the views again. PostgreSQL cannot change the type of a column a view uses.';
        END IF;
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', tbl, col);
        step := 'changed type';
        detail := format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint (was %s): snowflake IDs do not fit in it',
                         tbl, col, pg_catalog.format_type(a.atttypid, NULL));
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    ELSIF a.atttypid <> 'bigint'::regtype THEN
        RAISE EXCEPTION 'column "%" of table % is %, not an integer column', col, tbl,
                        pg_catalog.format_type(a.atttypid, NULL)
            USING ERRCODE = '42804',
                  HINT = 'Snowflake IDs are bigint: convert a bigint, integer or smallint key column.';
    END IF;

    -- A default calling pgEdge snowflake's snowflake.nextval() (found by
    -- what it depends on: pg_get_expr omits the schema when it is on the
    -- search_path).
    SELECT EXISTS (SELECT FROM pg_catalog.pg_depend dep
                     JOIN pg_catalog.pg_proc f ON f.oid = dep.refobjid
                     JOIN pg_catalog.pg_namespace n ON n.oid = f.pronamespace
                    WHERE dep.classid = 'pg_catalog.pg_attrdef'::regclass AND dep.objid = a.def_oid
                      AND dep.refclassid = 'pg_catalog.pg_proc'::regclass
                      AND f.proname = 'nextval' AND n.nspname = 'snowflake')
      INTO pgedge;
    IF pgedge THEN
        SELECT * INTO l FROM @extschema@.snowflake_layout();
        step := 'recognised pgEdge snowflake';
        pgedge_layout := l.epoch = '2023-01-01 00:00:00+00' AND l.time_unit_ms = 1
                         AND l.total_bits = 63 AND l.worker_bits = 10 AND l.sequence_bits = 12;
        IF pgedge_layout THEN
            detail := format('%s feeds the column; the layout in force (%s) is pgEdge''s: its IDs decode to their time, node (worker_id) and count (sequence)',
                             a.def, l.preset);
        ELSE
            detail := format('%s feeds the column; the layout in force (%s) is not pgEdge''s, so its IDs do not decode to their time (snowflake_id.layout = pgedge does)',
                             a.def, l.preset);
        END IF;
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    END IF;

    -- No row can be added between reading the largest value and the switch.
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', tbl);
    EXECUTE format('SELECT max(%I) FROM %s', col, tbl) INTO max_id;
    first_id := @extschema@.snowflake_from_timestamp(clock_timestamp());
    IF max_id >= first_id THEN
        -- Values of this layout's current tick or up to a second ahead of
        -- the clock (another generator's last IDs: pgEdge's can run a few
        -- milliseconds ahead): wait until new IDs start above them.
        BEGIN
            max_ts := @extschema@.snowflake_timestamp(max_id);
        EXCEPTION WHEN numeric_value_out_of_range THEN
            max_ts := NULL;
        END;
        SELECT * INTO l FROM @extschema@.snowflake_layout();
        wait_ms := extract(epoch FROM max_ts - clock_timestamp()) * 1000 + l.time_unit_ms;
        IF wait_ms <= 1000 THEN
            PERFORM pg_catalog.pg_sleep(wait_ms / 1000.0);
            WHILE @extschema@.snowflake_from_timestamp(clock_timestamp()) <= max_id LOOP
                PERFORM pg_catalog.pg_sleep(0.001);
            END LOOP;
            first_id := @extschema@.snowflake_from_timestamp(clock_timestamp());
            step := 'waited';
            detail := format('max(%I) = %s is of %s: new IDs start after that', col, max_id, max_ts);
            RAISE NOTICE '%: %', step, detail;
            RETURN NEXT;
        ELSE
            IF pgedge AND NOT pgedge_layout THEN
                hint := 'These are pgEdge snowflake IDs: set snowflake_id.layout = pgedge (and no snowflake_id.epoch) in postgresql.conf, restart, and call this function again; see the guide "Switching from pgEdge snowflake".';
            ELSIF pgedge THEN
                hint := 'pgEdge made these IDs ahead of this server''s clock: check the clocks, and call this function again after the time the detail gives.';
            ELSE
                hint := 'If these are IDs of another snowflake generator, set snowflake_id''s layout settings to its layout, restart, and call this function again; if they are IDs of this layout made ahead of the clock, call it again after the time the detail gives. Setting only the column''s default would not keep new IDs above them.';
            END IF;
            RAISE EXCEPTION 'existing values of %.% reach %, not below the first snowflake ID of now (%)',
                            tbl, col, max_id, first_id
                USING ERRCODE = '22003',
                      DETAIL = format('Under the layout in force, %s decodes to %s: new IDs would sort below existing rows and could collide with them.', max_id, coalesce(max_ts::text, 'no time (it is not an ID of this layout)')),
                      HINT = hint;
        END IF;
    END IF;
    step := 'checked values';
    detail := format('max(%I) = %s, below %s, the first snowflake ID of now', col,
                     coalesce(max_id::text, 'NULL (no rows)'), first_id);
    RAISE NOTICE '%: %', step, detail;
    RETURN NEXT;

    seq := pg_catalog.pg_get_serial_sequence(tbl::text, col)::regclass;
    IF a.attidentity IN ('a', 'd') THEN
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', tbl, col);
        step := 'dropped identity';
        detail := format('GENERATED %s AS IDENTITY removed, and with it its sequence %s',
                         CASE a.attidentity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END, seq);
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
        seq := NULL;
    END IF;

    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT @extschema@.snowflake_nextval()', tbl, col);
    step := 'set default';
    detail := format('%s.%I DEFAULT snowflake_nextval() (was %s)', tbl, col,
                     coalesce(CASE WHEN a.attidentity IN ('a', 'd') THEN 'an identity' END, a.def, 'no default'));
    RAISE NOTICE '%: %', step, detail;
    RETURN NEXT;

    IF seq IS NOT NULL THEN
        -- An owned (serial) sequence: dropped, so that code still calling
        -- currval()/lastval() for this table fails instead of reading a stale value.
        SELECT count(*) INTO others
          FROM pg_catalog.pg_depend dep
         WHERE dep.refclassid = 'pg_catalog.pg_class'::regclass AND dep.refobjid = seq
           AND dep.classid = 'pg_catalog.pg_attrdef'::regclass;
        IF others = 0 THEN
            -- Named before it goes (a dropped regclass shows as its oid).
            detail := format('%s, which fed the old default (currval() and lastval() on it now fail instead of returning stale values; use INSERT ... RETURNING)', seq);
            EXECUTE format('DROP SEQUENCE %s', seq);
            step := 'dropped sequence';
        ELSE
            step := 'kept sequence';
            detail := format('%s: %s other column default(s) still use it', seq, others);
        END IF;
        RAISE NOTICE '%: %', step, detail;
        RETURN NEXT;
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION snowflake_create_partitions(parent regclass, period interval DEFAULT '1 month',
                                            count int DEFAULT 3, start_at timestamptz DEFAULT now())
RETURNS TABLE (partition_name regclass, created boolean, from_time timestamptz, to_time timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p record;
    months int := extract(year FROM period) * 12 + extract(month FROM period);
    days int := extract(day FROM period);
    unit text;
    fmt text;
    base timestamp;
    lo timestamp;
    pname text;
    existing oid;
BEGIN
    IF parent IS NULL OR period IS NULL OR count IS NULL OR start_at IS NULL THEN
        RAISE EXCEPTION 'snowflake_create_partitions: argument % is null',
                        CASE WHEN parent IS NULL THEN 'parent' WHEN period IS NULL THEN 'period'
                             WHEN count IS NULL THEN 'count' ELSE 'start_at' END
            USING ERRCODE = '22004', HINT = 'Pass a value, or leave the argument out for its default (period 1 month, count 3, start_at now()).';
    END IF;
    SELECT pt.partstrat, pt.partnatts, pt.partattrs[0] AS attnum, c.relname, c.relnamespace,
           n.nspname, att.atttypid
      INTO p
      FROM pg_catalog.pg_partitioned_table pt
      JOIN pg_catalog.pg_class c ON c.oid = pt.partrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_catalog.pg_attribute att ON att.attrelid = pt.partrelid AND att.attnum = pt.partattrs[0]
     WHERE pt.partrelid = parent;
    IF NOT FOUND OR p.partstrat <> 'r' OR p.partnatts <> 1 OR p.atttypid IS DISTINCT FROM 'bigint'::regtype THEN
        RAISE EXCEPTION 'table % is not partitioned by range on one bigint column', parent
            USING ERRCODE = '42809',
                  HINT = 'Create it with PARTITION BY RANGE (id), id being its bigint snowflake ID column.';
    END IF;
    IF period - make_interval(months => months, days => days) <> interval '0' THEN
        months := -1;
    END IF;
    IF months = 0 AND days = 1 THEN unit := 'day'; fmt := 'YYYY_MM_DD';
    ELSIF months = 0 AND days = 7 THEN unit := 'week'; fmt := 'IYYY_"w"IW';
    ELSIF months = 1 AND days = 0 THEN unit := 'month'; fmt := 'YYYY_MM';
    ELSIF months = 12 AND days = 0 THEN unit := 'year'; fmt := 'YYYY';
    ELSE
        RAISE EXCEPTION 'unsupported partition period %', period
            USING ERRCODE = '22023', HINT = 'Use 1 day, 1 week, 1 month or 1 year.';
    END IF;
    IF count < 1 OR count > 1000 THEN
        RAISE EXCEPTION 'partition count % is out of range', count
            USING ERRCODE = '22023', HINT = 'Ask for 1 to 1000 partitions.';
    END IF;

    base := date_trunc(unit, start_at AT TIME ZONE 'UTC');
    FOR i IN 0 .. count - 1 LOOP
        lo := base + i * period;
        pname := to_char(lo, fmt);
        pname := left(p.relname, 63 - 2 - length(pname)) || '_p' || pname;
        from_time := lo AT TIME ZONE 'UTC';
        to_time := (lo + period) AT TIME ZONE 'UTC';
        SELECT c.oid INTO existing FROM pg_catalog.pg_class c
         WHERE c.relnamespace = p.relnamespace AND c.relname = pname;
        IF existing IS NULL THEN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%s) TO (%s)',
                           p.nspname, pname, parent,
                           @extschema@.snowflake_from_timestamp(from_time),
                           @extschema@.snowflake_from_timestamp(to_time));
            created := true;
        ELSIF EXISTS (SELECT FROM pg_catalog.pg_inherits i
                       WHERE i.inhrelid = existing AND i.inhparent = parent) THEN
            created := false;
        ELSE
            RAISE EXCEPTION 'relation %.% exists and is not a partition of %', p.nspname, pname, parent
                USING ERRCODE = '42P07',
                      HINT = 'Rename or attach that table, then call this function again.';
        END IF;
        partition_name := format('%I.%I', p.nspname, pname)::regclass;
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- The lease limits' trigger: the 22023 of a limit out of range gets a
-- HINT (src/sql/leases.sql).
CREATE OR REPLACE FUNCTION snowflake_id_internal.snowflake_lease_limits_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    was record;
    bad text;
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'the registry''s lease limits are changed, not deleted'
            USING ERRCODE = '55000',
                  HINT = 'Set them with snowflake_lease_set_limits(); the defaults are max_lease_ms 600000, max_grace_ms 120000, max_ahead_ms 720000, max_blocks_per_node 8.';
    END IF;
    bad := CASE
        WHEN NEW.max_lease_ms IS NULL OR NEW.max_lease_ms NOT BETWEEN 2000 AND 86400000 THEN
            format('max_lease_ms must be from 2000 to 86400000 (the range of snowflake_id.lease_time), not %s', NEW.max_lease_ms)
        WHEN NEW.max_grace_ms IS NULL OR NEW.max_grace_ms NOT BETWEEN 1000 AND 86400000 THEN
            format('max_grace_ms must be from 1000 to 86400000, not %s', NEW.max_grace_ms)
        WHEN NEW.max_ahead_ms IS NULL OR NEW.max_ahead_ms NOT BETWEEN 0 AND 172800000 THEN
            format('max_ahead_ms must be from 0 to 172800000, not %s', NEW.max_ahead_ms)
        WHEN NEW.max_blocks_per_node IS NULL OR NEW.max_blocks_per_node NOT BETWEEN 1 AND 64 THEN
            format('max_blocks_per_node must be from 1 to 64, not %s', NEW.max_blocks_per_node)
        END;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'invalid lease limit: %', bad
            USING ERRCODE = '22023',
                  HINT = 'Pass each limit within its range (max_lease_ms 2000 to 86400000, max_grace_ms 1000 to 86400000, max_ahead_ms 0 to 172800000, max_blocks_per_node 1 to 64), or NULL to keep it.';
    END IF;
    -- Before this change (a BEFORE trigger's query does not see its row).
    SELECT * INTO was FROM snowflake_id_internal.snowflake_lease_limits_in_force();
    NEW.changed_at := now();
    IF (NEW.max_lease_ms < was.max_lease_ms OR NEW.max_grace_ms < was.max_grace_ms
        OR NEW.max_ahead_ms < was.max_ahead_ms)
       AND (EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_blocks b
                     WHERE (b.holder_node IS NOT NULL AND b.expires_at + b.grace > now())
                        OR b.high_water_ms > extract(epoch FROM now()) * 1000)
            OR EXISTS (SELECT 1 FROM @extschema@.snowflake_lease_registry g WHERE g.fenced_until > now())) THEN
        NEW.previous_max_lease_ms := was.fence_lease_ms;
        NEW.previous_max_grace_ms := was.fence_grace_ms;
        NEW.previous_max_ahead_ms := was.fence_ahead_ms;
        NEW.previous_until := greatest(was.previous_until,
            now() + (greatest(was.fence_lease_ms, was.fence_ahead_ms) + was.fence_grace_ms)
                    * interval '1 millisecond');
        RAISE NOTICE 'fences use the higher limits until %: grants made under them may still run',
            NEW.previous_until;
    ELSE
        NEW.previous_max_lease_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_lease_ms END;
        NEW.previous_max_grace_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_grace_ms END;
        NEW.previous_max_ahead_ms := CASE WHEN was.previous_until IS NOT NULL THEN was.fence_ahead_ms END;
        NEW.previous_until := was.previous_until;
    END IF;
    -- A holder whose lease_time is max_lease_ms asks for more than these.
    IF NEW.max_grace_ms < greatest(NEW.max_lease_ms / 5, 1000) THEN
        RAISE NOTICE 'a holder with snowflake_id.lease_time = % ms asks for a grace of % ms, above max_grace_ms: it is refused',
            NEW.max_lease_ms, greatest(NEW.max_lease_ms / 5, 1000);
    END IF;
    IF NEW.max_ahead_ms < NEW.max_lease_ms + 60000 THEN
        RAISE NOTICE 'a holder with snowflake_id.lease_time = % ms and the default snowflake_id.max_drift (60 s) asks for marks % ms ahead, above max_ahead_ms: it is refused',
            NEW.max_lease_ms, NEW.max_lease_ms + 60000;
    END IF;
    RAISE LOG 'snowflake_id registry: lease limits set by role %: max_lease_ms %, max_grace_ms %, max_ahead_ms %, max_blocks_per_node %',
        session_user, NEW.max_lease_ms, NEW.max_grace_ms, NEW.max_ahead_ms, NEW.max_blocks_per_node;
    RETURN NEW;
END
$fn$;

-- == Backfill at migration scale (issue 44) ==
-- Backfill takes one grant per stretch of time and session, in any order
-- of times (snowflake_core::backfill). Grants keep their numbering, so the
-- grants 0.7.0 handed out (shared memory, the state file, WAL and
-- snowflake_backfill_grants, all unchanged) stay handed out as they are.
-- snowflake_backfill() shows what is left of each stretch and what this
-- session holds: two more columns, and parallel restricted (a session's own
-- grants are not a parallel worker's).
DROP FUNCTION snowflake_backfill();
CREATE FUNCTION snowflake_backfill() RETURNS TABLE (
	"bucket" INT,
	"starts_at" timestamp with time zone,
	"ends_at" timestamp with time zone,
	"grants" bigint,
	"capacity" bigint,
	"grants_left" bigint,
	"this_session" bigint,
	"worker_ids" TEXT
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_backfill_wrapper';
COMMENT ON FUNCTION snowflake_backfill() IS
  'Backfill grants of each stretch of time: its first and last time, grants handed out, grants it holds, grants left, grants this session holds.';
