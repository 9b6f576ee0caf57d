-- snowflake_id 0.4.0 -> 0.5.0 (ALTER EXTENSION snowflake_id UPDATE).
--
-- * snowflake_layout() gains years_left and ends_soon (the layout's end
--   within snowflake_id.layout_end_warning years): a new result type, so
--   the function is made again.
-- * The layout-explicit decoders get SQL-standard bodies (bound when
--   created, inlinable) and a form that takes total_bits (js53 IDs are
--   checked against 53 bits); the forms without it stay, for 63 bits.
--   snowflake_check_layout_args() gives way to snowflake_layout_shift(),
--   snowflake_layout_id() and snowflake_layout_ticks().
--
-- tests/upgrade/test_extension_upgrade.py checks that an updated database
-- has the same objects as a fresh install.

\echo Use "ALTER EXTENSION snowflake_id UPDATE TO '0.5.0'" to load this file. \quit

DROP FUNCTION snowflake_layout();
CREATE FUNCTION "snowflake_layout"() RETURNS TABLE (
	"preset" TEXT,  /* String */
	"epoch" timestamp with time zone,  /* TimestampWithTimeZone */
	"time_unit_ms" bigint,  /* i64 */
	"total_bits" INT,  /* i32 */
	"time_bits" INT,  /* i32 */
	"worker_bits" INT,  /* i32 */
	"sequence_bits" INT,  /* i32 */
	"max_worker_id" INT,  /* i32 */
	"max_sequence" INT,  /* i32 */
	"max_id" bigint,  /* i64 */
	"ends_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"years_left" double precision,  /* f64 */
	"ends_soon" bool  /* bool */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_layout_wrapper';

-- The layout-explicit decoders: IMMUTABLE, for generated columns, index
-- expressions and partition bounds. Their bodies are SQL-standard (RETURN):
-- parsed when created, so every name in them is bound then and no
-- search_path of a caller can change what they call; and simple enough for
-- the planner to inline. The checks that raise errors are three small
-- plpgsql functions each returns its (checked) argument from.

-- The bits below the time field of an explicit layout, after checking it
-- as the server checks its settings (22023 otherwise).
CREATE FUNCTION snowflake_layout_shift(time_unit_ms bigint, worker_bits int,
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
    RETURN worker_bits + sequence_bits;
END
$$;

-- id, when it is an ID of a layout of total_bits bits (22003 otherwise).
CREATE FUNCTION snowflake_layout_id(id bigint, total_bits int)
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
CREATE FUNCTION snowflake_layout_ticks(ticks numeric, time_bits int, ts timestamptz,
                                       epoch timestamptz)
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
        + ((snowflake_layout_id(id, total_bits)
            >> snowflake_layout_shift(time_unit_ms, worker_bits, sequence_bits, total_bits))
           * time_unit_ms) * interval '1 millisecond') AT TIME ZONE 'UTC';

CREATE FUNCTION snowflake_from_timestamp(ts timestamptz, epoch timestamptz, time_unit_ms bigint,
                                         worker_bits int, sequence_bits int, total_bits int)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_layout_ticks(
           floor(floor(extract(epoch FROM ts - epoch) * 1000) / greatest(time_unit_ms, 1)),
           total_bits - snowflake_layout_shift(time_unit_ms, worker_bits, sequence_bits, total_bits),
           ts, epoch)
       << snowflake_layout_shift(time_unit_ms, worker_bits, sequence_bits, total_bits);

-- The forms without total_bits (0.2.0 to 0.4.0): 63 bits, the whole bigint.
-- Replaced in place (same OIDs: generated columns, indexes and partition
-- bounds that use them stay valid).
CREATE OR REPLACE FUNCTION snowflake_timestamp(id bigint, epoch timestamptz, time_unit_ms bigint,
                                    worker_bits int, sequence_bits int)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_timestamp(id, epoch, time_unit_ms, worker_bits, sequence_bits, 63);

CREATE OR REPLACE FUNCTION snowflake_from_timestamp(ts timestamptz, epoch timestamptz, time_unit_ms bigint,
                                         worker_bits int, sequence_bits int)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN snowflake_from_timestamp(ts, epoch, time_unit_ms, worker_bits, sequence_bits, 63);

DROP FUNCTION snowflake_check_layout_args(bigint, int, int);

COMMENT ON FUNCTION snowflake_timestamp(bigint, timestamptz, bigint, int, int, int) IS
  'IMMUTABLE snowflake_timestamp(id) with the layout given explicitly (epoch, time_unit_ms, worker_bits, sequence_bits, total_bits as in snowflake_layout()); an SQL-standard body the planner can inline.';
COMMENT ON FUNCTION snowflake_from_timestamp(timestamptz, timestamptz, bigint, int, int, int) IS
  'IMMUTABLE snowflake_from_timestamp(ts) with the layout given explicitly (epoch, time_unit_ms, worker_bits, sequence_bits, total_bits as in snowflake_layout()); refuses times the layout cannot encode (22008).';
COMMENT ON FUNCTION snowflake_timestamp(bigint, timestamptz, bigint, int, int) IS
  'snowflake_timestamp(id, epoch, time_unit_ms, worker_bits, sequence_bits, 63): the explicit form for layouts of 63 bits.';
COMMENT ON FUNCTION snowflake_from_timestamp(timestamptz, timestamptz, bigint, int, int) IS
  'snowflake_from_timestamp(ts, epoch, time_unit_ms, worker_bits, sequence_bits, 63): the explicit form for layouts of 63 bits.';
COMMENT ON FUNCTION snowflake_layout_shift(bigint, int, int, int) IS
  'Checks an explicit layout and returns worker_bits + sequence_bits (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_layout_id(bigint, int) IS
  'Returns id when it is an ID of a layout of total_bits bits, 22003 otherwise (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_layout_ticks(numeric, int, timestamptz, timestamptz) IS
  'Returns ticks when a time field of time_bits bits holds it, 22008 otherwise (internal, for the IMMUTABLE decoders).';
COMMENT ON FUNCTION snowflake_layout() IS
  'The layout in use: preset, epoch, time unit, bits of each field, limits, when the time field runs out, the years left and whether that is within snowflake_id.layout_end_warning.';
