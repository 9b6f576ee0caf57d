-- SQL-language parts of the API (included last by src/sql/tools.rs):
-- snowflake_decode() as one composite row, decoders that take the layout
-- explicitly (IMMUTABLE, for tools that require it), converting a key column,
-- calendar partitions, and a COMMENT on every function, view and table.
-- Everything here runs with the caller's privileges (SECURITY INVOKER), and
-- every plpgsql function with search_path = pg_catalog, pg_temp: a function
-- or operator another role created in a schema on the caller's search_path
-- is never what they call (it would run with the caller's privileges, and
-- could make an IMMUTABLE function's answer depend on the caller).
-- @extschema@ is the extension's schema (the extension is not relocatable).

-- One row, not a set: (snowflake_decode(id)).* and
-- count(DISTINCT (snowflake_decode(id)).worker_id) work anywhere.
CREATE FUNCTION snowflake_decode(id bigint, OUT ts timestamptz, OUT worker_id int, OUT sequence int)
RETURNS record
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$
SELECT @extschema@.snowflake_timestamp(id), @extschema@.snowflake_worker_id(id),
       @extschema@.snowflake_sequence(id)
$$;

-- The layout-explicit decoders: IMMUTABLE, for generated columns, index
-- expressions and partition bounds. Their bodies are SQL-standard (RETURN):
-- parsed when created, so every name in them is bound then and no
-- search_path of a caller can change what they call; and simple enough for
-- the planner to inline. The checks that raise errors are three small
-- plpgsql functions each returns its (checked) argument from, in
-- snowflake_id_internal (src/sql/internal_schema.sql): internal, so a role
-- needs EXECUTE on them but no USAGE on their schema (the bodies name them
-- by OID).

-- The bits below the time field of an explicit layout, after checking it
-- as the server checks its settings (22023 otherwise): the ranges, the bits
-- adding up, and a time field that lasts at least ten years (of 365.25
-- days) from the epoch (core/src/layout.rs, Layout::from_settings).
CREATE FUNCTION snowflake_id_internal.snowflake_layout_shift(time_unit_ms bigint, worker_bits int,
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

-- id, when it is an ID of a layout of total_bits bits (22003 otherwise).
CREATE FUNCTION snowflake_id_internal.snowflake_layout_id(id bigint, total_bits int)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- (A total_bits no layout has is snowflake_layout_shift's 22023.)
    IF id < 0 OR (total_bits BETWEEN 2 AND 62 AND id >= (1::bigint << total_bits)) THEN
        RAISE EXCEPTION 'snowflake ID out of range: % is not an ID of a layout of % bits', id, total_bits
            USING ERRCODE = '22003',
                  HINT = 'IDs are non-negative bigints made by snowflake_nextval(); pass the total_bits snowflake_layout() shows.';
    END IF;
    RETURN id;
END
$$;

-- ticks, when the time field of time_bits bits holds it (22008 otherwise).
CREATE FUNCTION snowflake_id_internal.snowflake_layout_ticks(ticks numeric, time_bits int,
                                                             ts timestamptz, epoch timestamptz)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ticks < 0 THEN
        RAISE EXCEPTION 'timestamp % is outside the range of snowflake IDs', ts
            USING ERRCODE = '22008', DETAIL = format('It is before the epoch %s.', epoch),
                  HINT = 'Use a timestamp within the layout''s range; see snowflake_layout().';
    END IF;
    IF ticks >= 2::numeric ^ time_bits THEN
        RAISE EXCEPTION 'timestamp % is outside the range of snowflake IDs', ts
            USING ERRCODE = '22008', DETAIL = 'It is after the last time this layout can encode.',
                  HINT = 'Use a timestamp within the layout''s range; see snowflake_layout().';
    END IF;
    RETURN ticks::bigint;
END
$$;

CREATE FUNCTION snowflake_timestamp(id bigint, epoch timestamptz, time_unit_ms bigint,
                                    worker_bits int, sequence_bits int, total_bits int)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ((epoch AT TIME ZONE 'UTC')
        + ((snowflake_id_internal.snowflake_layout_id(id, total_bits)
            >> snowflake_id_internal.snowflake_layout_shift(time_unit_ms, worker_bits,
                                                            sequence_bits, total_bits))
           * time_unit_ms) * interval '1 millisecond') AT TIME ZONE 'UTC';

CREATE FUNCTION snowflake_from_timestamp(ts timestamptz, epoch timestamptz, time_unit_ms bigint,
                                         worker_bits int, sequence_bits int, total_bits int)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_id_internal.snowflake_layout_ticks(
           floor(floor(extract(epoch FROM ts - epoch) * 1000) / greatest(time_unit_ms, 1)),
           total_bits - snowflake_id_internal.snowflake_layout_shift(time_unit_ms, worker_bits,
                                                                     sequence_bits, total_bits),
           ts, epoch)
       << snowflake_id_internal.snowflake_layout_shift(time_unit_ms, worker_bits,
                                                       sequence_bits, total_bits);

-- The forms without total_bits (0.2.0 to 0.4.0): 63 bits, the whole bigint.
CREATE FUNCTION snowflake_timestamp(id bigint, epoch timestamptz, time_unit_ms bigint,
                                    worker_bits int, sequence_bits int)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_timestamp(id, epoch, time_unit_ms, worker_bits, sequence_bits, 63);

CREATE FUNCTION snowflake_from_timestamp(ts timestamptz, epoch timestamptz, time_unit_ms bigint,
                                         worker_bits int, sequence_bits int)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_from_timestamp(ts, epoch, time_unit_ms, worker_bits, sequence_bits, 63);

-- Switches a key column to snowflake IDs, in the caller's transaction.
CREATE FUNCTION snowflake_convert_column(tbl regclass, col name, convert_type boolean DEFAULT false)
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

-- Keeps calendar partitions of a table partitioned by RANGE on a bigint
-- snowflake ID column: the partition of start_at's period and the next
-- ones, count in all, named parent_pYYYY_MM (month), parent_pYYYY (year),
-- parent_pYYYY_MM_DD (day) or parent_pIYYY_wIW (ISO week), bounds in UTC.
-- Idempotent: partitions that exist are reported with created = false.
CREATE FUNCTION snowflake_create_partitions(parent regclass, period interval DEFAULT '1 month',
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

COMMENT ON FUNCTION snowflake_nextval() IS
  'A new snowflake ID from this backend''s worker id (claims one on first use).';
COMMENT ON FUNCTION snowflake_nextvals(int) IS
  'n new snowflake IDs (1 to 1,000,000), increasing.';
COMMENT ON FUNCTION snowflake_decode(bigint) IS
  'The parts of a snowflake ID as one row: ts, worker_id, sequence.';
COMMENT ON FUNCTION snowflake_timestamp(bigint) IS
  'When a snowflake ID was made (start of its tick), with the server''s layout.';
COMMENT ON FUNCTION snowflake_worker_id(bigint) IS
  'The worker id part of a snowflake ID.';
COMMENT ON FUNCTION snowflake_sequence(bigint) IS
  'The sequence part of a snowflake ID.';
COMMENT ON FUNCTION snowflake_from_timestamp(timestamptz) IS
  'The smallest snowflake ID that can be made at ts, for range queries and partition bounds.';
COMMENT ON FUNCTION snowflake_compose(timestamptz, int, int) IS
  'A snowflake ID from its parts (tests, migrations).';
COMMENT ON FUNCTION snowflake_timestamp(bigint, timestamptz, bigint, int, int, int) IS
  'IMMUTABLE snowflake_timestamp(id) with the layout given explicitly (epoch, time_unit_ms, worker_bits, sequence_bits, total_bits as in snowflake_layout()); an SQL-standard body the planner can inline.';
COMMENT ON FUNCTION snowflake_from_timestamp(timestamptz, timestamptz, bigint, int, int, int) IS
  'IMMUTABLE snowflake_from_timestamp(ts) with the layout given explicitly (epoch, time_unit_ms, worker_bits, sequence_bits, total_bits as in snowflake_layout()); refuses times the layout cannot encode (22008).';
COMMENT ON FUNCTION snowflake_timestamp(bigint, timestamptz, bigint, int, int) IS
  'snowflake_timestamp(id, epoch, time_unit_ms, worker_bits, sequence_bits, 63): the explicit form for layouts of 63 bits.';
COMMENT ON FUNCTION snowflake_from_timestamp(timestamptz, timestamptz, bigint, int, int) IS
  'snowflake_from_timestamp(ts, epoch, time_unit_ms, worker_bits, sequence_bits, 63): the explicit form for layouts of 63 bits.';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_layout_shift(bigint, int, int, int) IS
  'Checks an explicit layout and returns worker_bits + sequence_bits (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_layout_id(bigint, int) IS
  'Returns id when it is an ID of a layout of total_bits bits, 22003 otherwise (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_id_internal.snowflake_layout_ticks(numeric, int, timestamptz, timestamptz) IS
  'Returns ticks when a time field of time_bits bits holds it, 22008 otherwise (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_layout() IS
  'The layout in use: preset, epoch, time unit, bits of each field, limits, when the time field runs out, the years left and whether that is within snowflake_id.layout_end_warning.';
COMMENT ON FUNCTION snowflake_config() IS
  'Worker ids in force, held and free, this backend''s worker id, max_drift_ms, and where worker ids come from: mode (local, registry, citus), registry, blocks held, lease deadline, since when the registry is unreachable, node id, and what keeps the lease worker from leasing (lease_problem); worker_ids says "not preloaded" without shared_preload_libraries.';
COMMENT ON FUNCTION snowflake_worker_status() IS
  'The rows behind the snowflake_workers view (oids instead of names).';
COMMENT ON FUNCTION snowflake_accept_layout() IS
  'Adopts a changed layout: new IDs start above every ID the old layout can have issued. Superusers only.';
COMMENT ON FUNCTION snowflake_convert_column(regclass, name, boolean) IS
  'Switches a key column to DEFAULT snowflake_nextval() in one transaction: checks type and values, drops identity and the serial sequence, reports each step.';
COMMENT ON FUNCTION snowflake_create_partitions(regclass, interval, int, timestamptz) IS
  'Creates calendar partitions (day, week, month, year; UTC) of a table partitioned by range on its snowflake ID, named parent_pYYYY_MM etc.; idempotent.';
COMMENT ON FUNCTION snowflake_advance_past(bigint) IS
  'Makes every new ID of this server larger than id (after restoring a dump of another database); superusers only.';
COMMENT ON FUNCTION snowflake_to_public(bigint) IS
  'The public ID of an ID: a keyed, reversible 14-character (12 for js53) token that reveals neither time, volume nor worker; needs the keys of snowflake_id.public_key_file.';
COMMENT ON FUNCTION snowflake_from_public(text) IS
  'The ID of a public ID made with any key of snowflake_id.public_key_file; malformed tokens and tokens of other keys are 22P02. Look rows up with WHERE id = snowflake_from_public($1).';
