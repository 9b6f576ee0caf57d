//! Backfill: `snowflake_at(ts)` makes an ID for a past time that never
//! equals another ID, from the worker ids set aside by
//! `snowflake_id.backfill_worker_ids` (the rules and the proof:
//! `snowflake_core::backfill`); `snowflake_backfill()` shows how much of
//! each stretch of time is used.

use super::api::{to_timestamptz, to_unix_ms};
use crate::claims;
use crate::durability::backfill::grant;
use crate::durability::reservation;
use crate::errors;
use crate::settings;
use crate::shmem::{self, LeaseMode};
use pgrx::prelude::*;
use snowflake_core::backfill::{tick_for, Open, Space, Take};
use snowflake_core::layout::{format_unix_ms, Layout};
use std::cell::RefCell;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

thread_local! {
    /// This backend's open stretches: the grants it holds and the IDs it
    /// made at each tick (bounded: `snowflake_core::backfill::MAX_TICKS`).
    /// Borrowed only for a lookup or an insert, never across a call that
    /// can raise an error.
    static OPEN: RefCell<Open> = RefCell::new(Open::new());
    /// With a registry: the fleet's floor its last answer gave (times at
    /// or before it are refused), `i64::MIN` before the first.
    static FLEET_AFTER_MS: std::cell::Cell<i64> = const { std::cell::Cell::new(i64::MIN) };
}

/// An ID that decodes to `ts` (the start of its tick) and equals no other
/// ID: not one of `snowflake_nextval()` (its worker id is set aside), nor
/// one of another `snowflake_at()` call, of any backend, before or after a
/// restart or a crash.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn snowflake_at(ts: TimestampWithTimeZone) -> i64 {
    let header = claims::require_shared("snowflake_at");
    let Some(space) = settings::backfill_space() else {
        errors::backfill_off()
    };
    // SAFETY: a plain read of PostgreSQL's recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::backfill_on_standby();
    }
    if header.layout_changed.load(Acquire) {
        errors::layout_changed(&header.recorded_layout.differences(settings::layout()));
    }
    claims::wait_for_registry(header);
    // With a registry or a Citus coordinator, grants come from it
    // (`backfill_fleet`).
    let fleet = match header.lease.mode(Acquire) {
        LeaseMode::Local => false,
        LeaseMode::Registry | LeaseMode::Citus => true,
        LeaseMode::Undecided => {
            errors::backfill_with_leases("a lease worker that has not started yet")
        }
    };
    let backfill = header.backfill();
    if !backfill.history_read.load(Acquire) {
        wait_for_history(header);
    }
    if backfill.ids_changed.load(Acquire) {
        errors::backfill_ids_changed(&backfill.recorded_ids.get(), &settings::backfill_ids_text());
    }
    let layout = settings::layout();
    let unix_ms = to_unix_ms(ts, layout);
    let after_ms = if fleet {
        backfill.after_ms.load(Acquire).max(FLEET_AFTER_MS.get())
    } else {
        backfill.after_ms.load(Acquire)
    };
    let tick = tick_for(
        layout,
        unix_ms,
        crate::clock::unix_ms(),
        settings::max_drift_ms(),
        after_ms,
    )
    .unwrap_or_else(|e| errors::backfill_time(&e.to_string()));
    // A time ahead of the reservation (up to max_drift ahead of the clock)
    // extends it, as a live ID would: a layout accepted later starts above
    // this ID too. Past times extend it to the clock, as a live ID would:
    // a server that made no live ID yet (a migration's target) then
    // writes its state file once per `RESERVE_MS`, not once per tick
    // an import climbs past the last reservation.
    let tick_end_ms = layout
        .tick_start_unix_ms(tick)
        .saturating_add(layout.unit_ms - 1);
    reservation::reserve(header, tick_end_ms.max(crate::clock::unix_ms()), layout);
    let (grant, index) = loop {
        match OPEN.with_borrow_mut(|open| open.take(space, tick)) {
            Take::Id { grant, index } => break (grant, index),
            Take::NeedGrant { bucket } => {
                let usable = usable_buckets(layout, after_ms);
                let buckets = OPEN.with_borrow(|open| open.to_take(bucket, usable));
                // Grants a restore just brought into this database's table
                // (its triggers off, say) count before any is taken; in a
                // fleet, the request to the registry carries them.
                raise_from_table(header, layout, &buckets);
                if backfill.ids_changed.load(Acquire) {
                    errors::backfill_ids_changed(
                        &backfill.recorded_ids.get(),
                        &settings::backfill_ids_text(),
                    );
                }
                if fleet {
                    take_from_registry(space, layout, &buckets, bucket, tick);
                    continue;
                }
                let limits: Vec<u32> = OPEN.with_borrow(|open| {
                    buckets
                        .iter()
                        .map(|&b| space.grant_limit(open.held(b)))
                        .collect()
                });
                let taken = grant(header, &buckets, &limits, true);
                OPEN.with_borrow_mut(|open| {
                    for (&b, g) in buckets.iter().zip(&taken) {
                        if let Some(g) = g {
                            open.add(b, *g);
                        }
                    }
                });
                // Checked before it is taken: a refusal takes nothing.
                if taken.first().copied().flatten().is_none() {
                    let handed_out = header
                        .backfill()
                        .grants
                        .get(bucket as usize)
                        .map_or(space.grants_per_bucket(), |n| n.load(Acquire));
                    refuse(space, layout, bucket, tick, handed_out);
                }
            }
        }
    };
    let Some((worker_id, sequence)) = space.grant_parts(grant, index) else {
        errors::internal("a backfill grant beyond the set-aside ids")
    };
    layout
        .compose(tick, worker_id, sequence)
        .unwrap_or_else(|e| errors::part_out_of_range(e))
}

/// Raises 54000 for an ID at `tick` whose stretch `bucket` gave no grant:
/// every grant handed out (a first grant), or all but the reserve (a
/// further one, for IDs sharing a time).
#[cold]
fn refuse(space: &Space, layout: &Layout, bucket: u32, tick: i64, handed_out: u32) -> ! {
    let (held, made) = OPEN.with_borrow(|open| (open.held(bucket), open.made_at(tick)));
    let capacity = space.grants_per_bucket();
    if held == 0 {
        let (start, end) = Space::bucket_span_ms(layout, bucket);
        errors::backfill_bucket_full(
            &format_unix_ms(start),
            &format_unix_ms(end),
            capacity,
            held,
            space.per_tick(),
        )
    }
    errors::backfill_time_full(
        &format_unix_ms(layout.tick_start_unix_ms(tick)),
        made,
        capacity.saturating_sub(handed_out),
        capacity,
        space.reserve(),
        space.per_tick(),
    )
}

/// Takes grants of `buckets` from the fleet's registry (durable on its
/// synchronous standbys before the answer is used) into this backend's
/// table; raises as a local grant would when the first, `bucket`, gets
/// none, and for `tick` at or before the fleet's floor.
fn take_from_registry(space: &Space, layout: &Layout, buckets: &[u32], bucket: u32, tick: i64) {
    let first: Vec<bool> =
        OPEN.with_borrow(|open| buckets.iter().map(|&b| open.held(b) == 0).collect());
    let reply = super::backfill_fleet::grant(buckets, &first);
    FLEET_AFTER_MS.set(FLEET_AFTER_MS.get().max(reply.after_ms));
    OPEN.with_borrow_mut(|open| {
        for (&b, g) in buckets.iter().zip(&reply.grants) {
            if let Some(g) = g {
                open.add(b, *g);
            }
        }
    });
    if reply.grants.first().copied().flatten().is_none() {
        refuse(space, layout, bucket, tick, reply.handed_out);
    }
    let tick_ms = layout.tick_start_unix_ms(tick);
    if tick_ms <= reply.after_ms {
        errors::backfill_time(
            &snowflake_core::backfill::TimeError::NotAfter {
                from_ms: reply.after_ms,
            }
            .to_string(),
        );
    }
}

/// Raises this server's grants from the rows of this database's
/// `snowflake_backfill_grants` for the times of `buckets` (the statement's
/// snapshot: rows a restore committed before it), as the registry worker
/// does at its passes: a restore whose triggers did not run (a
/// `--disable-triggers` data-only restore) counts before the next grant
/// of its stretches, not a pass later. Skipped where the table is missing
/// or unreadable to the calling role (an extension not yet updated).
fn raise_from_table(header: &shmem::Header, layout: &Layout, buckets: &[u32]) {
    let (Some(&lo), Some(&hi)) = (buckets.iter().min(), buckets.iter().max()) else {
        return;
    };
    let Some(schema) = super::extension_schema() else {
        return;
    };
    let table = format!("{schema}.snowflake_backfill_grants");
    let readable = Spi::get_one::<bool>(&format!(
        "SELECT coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('{}'), 'SELECT'), false)",
        table.replace('\'', "''")
    ));
    if !matches!(readable, Ok(Some(true))) {
        return;
    }
    let (from_ms, _) = Space::bucket_span_ms(layout, lo);
    let (_, to_ms) = Space::bucket_span_ms(layout, hi);
    let rows = Spi::connect(|client| {
        let table = client.select(
            &format!(
                "SELECT (extract(epoch FROM starts_at) * 1000)::int8, grants, worker_ids \
                   FROM {table} \
                  WHERE starts_at BETWEEN timestamptz 'epoch' + {from_ms} * interval '1 ms' \
                                      AND timestamptz 'epoch' + {to_ms} * interval '1 ms'"
            ),
            None,
            &[],
        )?;
        let mut rows = Vec::new();
        for row in table {
            if let (Some(start), Some(n)) = (row.get::<i64>(1)?, row.get::<i64>(2)?) {
                rows.push((start, n, row.get::<String>(3)?.unwrap_or_default()));
            }
        }
        Ok::<_, pgrx::spi::Error>(rows)
    });
    // A row that does not convert: the registry worker's pass reads the
    // table too, and logs it.
    let Ok(rows) = rows else {
        return;
    };
    for (start_ms, n, ids) in rows {
        crate::durability::backfill::raise_from_record(header, start_ms, n, &ids);
    }
}

/// The stretches a backfill ID can be made in now: from the epoch or after
/// `after_ms` up to `snowflake_id.max_drift` ahead of the clock.
fn usable_buckets(layout: &Layout, after_ms: i64) -> (u32, u32) {
    let first = layout.tick_at(after_ms.max(layout.epoch_ms)).max(0);
    let last = layout
        .tick_at(crate::clock::unix_ms().saturating_add(settings::max_drift_ms()))
        .clamp(0, layout.max_ticks());
    (
        Space::bucket_for(layout, first),
        Space::bucket_for(layout, last),
    )
}

/// How long a backfill waits for the registry worker's first pass, in ms.
const HISTORY_WAIT_MS: i64 = 30_000;

/// Waits until the registry worker has read the registry tables (grants
/// carried by pg_upgrade or a restore, the set-aside ids' live history),
/// or raises 55000 naming what it needs.
#[cold]
pub(super) fn wait_for_history(header: &shmem::Header) {
    let Some(database) = settings::registry_database() else {
        errors::backfill_needs_registry(None)
    };
    if !crate::clock::poll_until(HISTORY_WAIT_MS, || {
        header.backfill().history_read.load(Acquire)
    }) {
        errors::backfill_needs_registry(Some(&database));
    }
}

/// A time as `timestamptz`, or `infinity` beyond its range (a layout whose
/// time field outlasts it).
fn to_timestamptz_or_infinity(unix_ms: i64) -> TimestampWithTimeZone {
    const MAX_TIMESTAMPTZ_UNIX_MS: i64 = 9_224_318_015_999; // 294276-12-31 23:59:59.999 UTC
    if unix_ms > MAX_TIMESTAMPTZ_UNIX_MS {
        TimestampWithTimeZone::positive_infinity()
    } else {
        to_timestamptz(unix_ms)
    }
}

/// Each stretch of time with backfill grants: its times, the grants handed
/// out, how many it holds and how many are left, how many of them this
/// session holds, and the set-aside ids they are numbered across. Its C
/// symbol is not 0.7.0's, whose declaration had six columns: a tuple of
/// eight under that declaration would crash the backend.
#[pg_extern(volatile, parallel_restricted, name = "snowflake_backfill")]
#[allow(clippy::type_complexity)]
fn snowflake_backfill_stretches() -> TableIterator<
    'static,
    (
        name!(bucket, i32),
        name!(starts_at, TimestampWithTimeZone),
        name!(ends_at, TimestampWithTimeZone),
        name!(grants, i64),
        name!(capacity, i64),
        name!(grants_left, i64),
        name!(this_session, i64),
        name!(worker_ids, String),
    ),
> {
    let header = claims::require_shared("snowflake_backfill");
    let layout = settings::layout();
    let capacity = settings::backfill_space().map_or(0, |s| i64::from(s.grants_per_bucket()));
    let ids = header.backfill().recorded_ids.get();
    let rows: Vec<_> = header
        .backfill()
        .grants
        .iter()
        .enumerate()
        .filter_map(|(bucket, n)| {
            let n = n.load(Relaxed);
            (n > 0).then(|| {
                let (start, end) = Space::bucket_span_ms(layout, bucket as u32);
                let held = OPEN.with_borrow(|open| open.held(bucket as u32));
                (
                    bucket as i32,
                    to_timestamptz_or_infinity(start),
                    to_timestamptz_or_infinity(end),
                    i64::from(n),
                    capacity,
                    (capacity - i64::from(n)).max(0),
                    i64::try_from(held).unwrap_or(i64::MAX),
                    ids.clone(),
                )
            })
        })
        .collect();
    TableIterator::new(rows)
}

/// Raises this server's grants of the stretch of time that `starts_at`
/// falls in to at least `grants` (durably), numbered across the set-aside
/// ids `worker_ids` (empty: unknown): for grants another life of the
/// server handed out, carried by `snowflake_backfill_grants` (the restore
/// trigger calls it). Superusers only.
#[pg_extern(volatile, strict, parallel_unsafe)]
fn snowflake_backfill_raise(
    starts_at: TimestampWithTimeZone,
    grants: i64,
    worker_ids: default!(String, "''"),
) {
    // SAFETY: a plain catalog check of the current user.
    if !unsafe { pg_sys::superuser() } {
        errors::superuser_only("snowflake_backfill_raise");
    }
    let header = claims::require_shared("snowflake_backfill_raise");
    let layout = settings::layout();
    let start_ms = to_unix_ms(starts_at, layout);
    let tick = layout.tick_at(start_ms);
    if !(0..=layout.max_ticks()).contains(&tick) {
        errors::timestamp_out_of_range(start_ms, layout);
    }
    crate::durability::backfill::raise_from_record(header, start_ms, grants, worker_ids.trim());
}

/// The rows a dump of `snowflake_backfill_grants` carries (its
/// `pg_extension_config_dump` filter calls this): the table's rows as the
/// dump's snapshot sees them and, on a server that preloads the extension,
/// this server's grants now, one row per stretch with the higher count, in
/// every database: backfilled rows may be in any database, and a dump of
/// one carries their grants with them. Grants are counted in shared memory
/// before their first ID is made, so a dump carries the grants of every
/// row it carries, however recent, without waiting for the registry
/// worker's copy.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
fn snowflake_backfill_dump() -> TableIterator<
    'static,
    (
        name!(starts_at, TimestampWithTimeZone),
        name!(grants, i64),
        name!(worker_ids, String),
        name!(updated_at, TimestampWithTimeZone),
    ),
> {
    let Some(schema) = super::extension_schema() else {
        return TableIterator::new(Vec::new());
    };
    let live = shmem::header().is_some();
    let table = format!(
        "SELECT starts_at, grants, worker_ids, updated_at, 1 AS src FROM {schema}.snowflake_backfill_grants"
    );
    let query = if live {
        format!(
            "SELECT starts_at, pg_catalog.max(grants), \
                    (pg_catalog.array_agg(worker_ids ORDER BY src))[1], pg_catalog.max(updated_at) \
               FROM ({table} UNION ALL \
                     SELECT starts_at, grants, worker_ids, pg_catalog.now(), 0 \
                       FROM {schema}.snowflake_backfill()) g \
              GROUP BY starts_at ORDER BY starts_at"
        )
    } else {
        format!(
            "SELECT starts_at, grants, worker_ids, updated_at FROM ({table}) g ORDER BY starts_at"
        )
    };
    let rows = Spi::connect(|client| {
        let mut rows = Vec::new();
        for row in client.select(&query, None, &[])? {
            if let (Some(start), Some(n), Some(at)) = (
                row.get::<TimestampWithTimeZone>(1)?,
                row.get::<i64>(2)?,
                row.get::<TimestampWithTimeZone>(4)?,
            ) {
                rows.push((start, n, row.get::<String>(3)?.unwrap_or_default(), at));
            }
        }
        Ok::<_, pgrx::spi::Error>(rows)
    })
    .unwrap_or_else(|e| errors::internal(&format!("snowflake_backfill_dump: {e}")));
    TableIterator::new(rows)
}

pgrx::extension_sql_file!(
    "backfill.sql",
    name = "backfill",
    requires = [
        snowflake_at,
        snowflake_backfill_stretches,
        snowflake_backfill_raise,
        snowflake_backfill_dump
    ]
);

/// The C entry point of 0.7.0's `snowflake_backfill()` (six columns). A
/// database still on 0.7.0 (the new library installed, `ALTER EXTENSION
/// snowflake_id UPDATE` not yet run) gets a clear error; the update points
/// the function at [`snowflake_backfill_stretches`].
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_backfill_wrapper(
    _fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    errors::old_extension_version("snowflake_backfill", "0.7.0")
}

/// The call convention of [`snowflake_backfill_wrapper`] (PG_FUNCTION_INFO_V1).
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_snowflake_backfill_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}
