/*
 * bench_floor.c -- the floor under snowflake_nextval() in bench case 1.
 *
 * Two version-1 C functions that do the least any time-ordered ID needs,
 * without any of snowflake_id's guarantees, so that case 1 can show how
 * much of snowflake_nextval()'s cost is the clock read and the function
 * call that every such generator pays:
 *
 *   bench_clock_ms()   one clock_gettime(CLOCK_REALTIME), as Unix ms
 *                      (what snowflake_nextval() reads per call)
 *   bench_clock_seq()  the same, plus a per-backend sequence within the
 *                      millisecond, packed as (ms << 22) | sequence: a
 *                      "snowflake" with no worker id, no sharing, no
 *                      drift bound and no reservation; it repeats IDs
 *                      once 4,096 are asked for in one millisecond.
 *
 * Built by bench/servers.py into the benchmark's private PostgreSQL tree
 * only (never installed, never part of the extension).
 */
#include "postgres.h"
#include "fmgr.h"

#include <time.h>

PG_MODULE_MAGIC;

static inline int64
clock_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

PG_FUNCTION_INFO_V1(bench_clock_ms);
Datum
bench_clock_ms(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(clock_ms());
}

static int64 last_ms;
static int64 sequence;

PG_FUNCTION_INFO_V1(bench_clock_seq);
Datum
bench_clock_seq(PG_FUNCTION_ARGS)
{
	int64		ms = clock_ms();

	if (ms > last_ms)
	{
		last_ms = ms;
		sequence = 0;
	}
	else
		sequence = (sequence + 1) & 4095;
	PG_RETURN_INT64((last_ms << 22) | sequence);
}
