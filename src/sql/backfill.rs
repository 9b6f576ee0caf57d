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
use snowflake_core::layout::format_unix_ms;
use std::cell::RefCell;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

thread_local! {
    /// This backend's open stretches: the grants it holds and the IDs it
    /// made at each tick (bounded: `snowflake_core::backfill::MAX_TICKS`).
    /// Borrowed only for a lookup or an insert, never across a call that
    /// can raise an error.
    static OPEN: RefCell<Open> = RefCell::new(Open::new());
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
    match header.lease.mode(Acquire) {
        LeaseMode::Local => {}
        LeaseMode::Undecided | LeaseMode::Registry | LeaseMode::Citus => {
            errors::backfill_with_leases();
        }
    }
    let backfill = header.backfill();
    if !backfill.history_read.load(Acquire) {
        wait_for_history(header);
    }
    if backfill.ids_changed.load(Acquire) {
        errors::backfill_ids_changed(&backfill.recorded_ids.get(), &settings::backfill_ids_text());
    }
    let layout = settings::layout();
    let unix_ms = to_unix_ms(ts, layout);
    let tick = tick_for(
        layout,
        unix_ms,
        crate::clock::unix_ms(),
        settings::max_drift_ms(),
        backfill.after_ms.load(Acquire),
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
                let usable = usable_buckets(layout, backfill.after_ms.load(Acquire));
                let buckets = OPEN.with_borrow(|open| open.to_take(bucket, usable));
                let taken = grant(header, &buckets, space.grants_per_bucket());
                OPEN.with_borrow_mut(|open| {
                    for (&b, g) in buckets.iter().zip(&taken) {
                        if let Some(g) = g {
                            open.add(b, *g);
                        }
                    }
                });
                // Checked before it is taken: a full stretch takes nothing.
                if taken.first().copied().flatten().is_none() {
                    let (start, end) = Space::bucket_span_ms(layout, bucket);
                    errors::backfill_bucket_full(
                        &format_unix_ms(start),
                        &format_unix_ms(end),
                        space.grants_per_bucket(),
                        OPEN.with_borrow(|open| open.held(bucket)),
                        space.per_tick(),
                    )
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

/// The stretches a backfill ID can be made in now: from the epoch or after
/// `after_ms` up to `snowflake_id.max_drift` ahead of the clock.
fn usable_buckets(layout: &snowflake_core::layout::Layout, after_ms: i64) -> (u32, u32) {
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
fn wait_for_history(header: &shmem::Header) {
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
/// session holds, and the set-aside ids they are numbered across.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
fn snowflake_backfill() -> TableIterator<
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

pgrx::extension_sql_file!(
    "backfill.sql",
    name = "backfill",
    requires = [snowflake_at, snowflake_backfill, snowflake_backfill_raise]
);
