//! The SQL API. Labels are chosen on purpose:
//! - the generators are VOLATILE and PARALLEL UNSAFE (they claim a worker id
//!   and change shared state);
//! - the decoders are STABLE (their answer depends on the layout settings,
//!   which can change at a restart), STRICT and PARALLEL SAFE, and touch
//!   neither the clock nor shared memory, so they work without preloading.

use crate::claims;
use crate::errors;
use crate::settings;
use crate::shmem::LeaseMode;
use pgrx::prelude::*;
use snowflake_core::layout::{Layout, PartError};
use std::sync::atomic::Ordering::Relaxed;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;
/// The largest batch `snowflake_nextvals()` makes.
pub const MAX_BATCH: i32 = 1_000_000;

pub(crate) fn to_timestamptz(unix_ms: i64) -> TimestampWithTimeZone {
    let micros = (unix_ms - PG_EPOCH_UNIX_MS).saturating_mul(1000);
    match TimestampWithTimeZone::try_from(micros) {
        Ok(ts) if micros != i64::MAX => ts,
        _ => errors::beyond_timestamp_range(unix_ms),
    }
}

pub(crate) fn to_unix_ms(ts: TimestampWithTimeZone, layout: &Layout) -> i64 {
    let micros: i64 = ts.into();
    if micros == i64::MIN || micros == i64::MAX {
        errors::infinite_timestamp(micros > 0, layout);
    }
    micros.div_euclid(1000) + PG_EPOCH_UNIX_MS
}

/// IDs per chunk of `snowflake_nextvals()`: its memory is bounded by this,
/// whatever `n` the caller asks for.
const CHUNK: usize = 4096;

/// A new ID from this backend's worker id: `snowflake_nextval()`.
///
/// A version-1 function of its own rather than `#[pg_extern]`'s wrapper:
/// most calls take an ID the claim already holds
/// ([`claims::next_held_id`]), which can neither raise an error nor panic,
/// so they run without pgrx's guard (catch_unwind, its thread check, the
/// memory context switch); everything else goes through
/// [`nextval_shared`], guarded. This frame holds nothing to drop while it
/// calls that (the fast path borrows nothing), so an ERROR
/// re-thrown from there may longjmp over it, as over pgrx's own wrappers.
/// The symbol and the SQL declaration are the ones `#[pg_extern]` made,
/// which every install and upgrade script names.
///
/// # Safety
///
/// Called by PostgreSQL's fmgr with a valid `fcinfo`, as declared below.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn snowflake_nextval_wrapper(
    _fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // `isnull` is left as fmgr's caller set it, false (as PG_RETURN_INT64
    // leaves it): every caller initializes it before the call.
    let id = match claims::next_held_id() {
        Some(id) => id,
        None => nextval_shared(),
    };
    pg_sys::Datum::from(id)
}

/// fmgr's version-1 record for [`snowflake_nextval_wrapper`].
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_snowflake_nextval_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// `snowflake_nextval()` through the position (a new tick, no ID held, no
/// claim yet), under pgrx's guard: a Rust panic or a PostgreSQL ERROR in
/// here reaches PostgreSQL as an ERROR.
#[cold]
#[inline(never)]
#[pg_guard]
extern "C-unwind" fn nextval_shared() -> i64 {
    claims::generate_one("snowflake_nextval")
}

extension_sql!(
    r#"CREATE  FUNCTION "snowflake_nextval"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_nextval_wrapper';
"#,
    name = "snowflake_nextval",
);

/// `n` new IDs at once (1 to 1,000,000), in increasing order.
///
/// Streamed: IDs are made in chunks of [`CHUNK`] as the set is read, each
/// chunk covered by the durable reservation before any of its IDs is
/// returned, so no allocation grows with `n` (a Rust allocation that fails
/// aborts the backend and restarts the server).
#[pg_extern(volatile, parallel_unsafe, strict)]
fn snowflake_nextvals(n: i32) -> SetOfIterator<'static, i64> {
    if !(1..=MAX_BATCH).contains(&n) {
        errors::bad_batch_size(n, MAX_BATCH);
    }
    SetOfIterator::new(Batch {
        left: n as usize,
        ids: Vec::new(),
        next: 0,
    })
}

/// The rest of a `snowflake_nextvals()` set.
struct Batch {
    /// IDs still to make.
    left: usize,
    /// The current chunk, and the position of the next ID to return in it.
    ids: Vec<i64>,
    next: usize,
}

impl Iterator for Batch {
    type Item = i64;

    fn next(&mut self) -> Option<i64> {
        if self.next == self.ids.len() {
            if self.left == 0 {
                return None;
            }
            let chunk = self.left.min(CHUNK);
            self.ids.clear();
            if self.ids.try_reserve_exact(chunk).is_err() {
                errors::out_of_memory(chunk * std::mem::size_of::<i64>());
            }
            let ids = &mut self.ids;
            claims::generate("snowflake_nextvals", chunk, |v| ids.push(v));
            self.left -= chunk;
            self.next = 0;
        }
        let id = self.ids.get(self.next).copied();
        self.next += 1;
        id
    }
}

/// The worker id part of an ID.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_worker_id(id: i64) -> i32 {
    let parts = settings::layout()
        .decode(id)
        .unwrap_or_else(|e| errors::part_out_of_range(e));
    parts.worker_id as i32
}

/// The sequence part of an ID.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_sequence(id: i64) -> i32 {
    let parts = settings::layout()
        .decode(id)
        .unwrap_or_else(|e| errors::part_out_of_range(e));
    parts.sequence as i32
}

/// The time an ID was made (the start of its tick).
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_timestamp(id: i64) -> TimestampWithTimeZone {
    let layout = settings::layout();
    let parts = layout
        .decode(id)
        .unwrap_or_else(|e| errors::part_out_of_range(e));
    to_timestamptz(layout.tick_start_unix_ms(parts.ticks))
}

/// The smallest ID that can be made at `ts` (worker and sequence zero):
/// `WHERE id >= snowflake_from_timestamp(now() - interval '1 day')`.
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_from_timestamp(ts: TimestampWithTimeZone) -> i64 {
    let layout = settings::layout();
    let unix_ms = to_unix_ms(ts, layout);
    layout
        .first_id_at(unix_ms)
        .unwrap_or_else(|_| errors::timestamp_out_of_range(unix_ms, layout))
}

/// Builds an ID from its parts (for tests and migrations).
#[pg_extern(stable, strict, parallel_safe)]
fn snowflake_compose(ts: TimestampWithTimeZone, worker_id: i32, sequence: i32) -> i64 {
    let layout = settings::layout();
    let unix_ms = to_unix_ms(ts, layout);
    let ticks = layout.tick_at(unix_ms);
    if !(0..=layout.max_ticks()).contains(&ticks) {
        errors::timestamp_out_of_range(unix_ms, layout);
    }
    let worker = u32::try_from(worker_id).unwrap_or_else(|_| {
        let max = layout.max_worker_id();
        errors::part_out_of_range(PartError::Worker {
            value: worker_id.into(),
            max,
        })
    });
    let sequence = u32::try_from(sequence).unwrap_or_else(|_| {
        let max = layout.max_sequence();
        errors::part_out_of_range(PartError::Sequence {
            value: sequence.into(),
            max,
        })
    });
    layout
        .compose(ticks, worker, sequence)
        .unwrap_or_else(|e| errors::part_out_of_range(e))
}

/// The layout in use.
#[pg_extern(stable, parallel_safe)]
#[allow(clippy::type_complexity)]
fn snowflake_layout() -> TableIterator<
    'static,
    (
        name!(preset, String),
        name!(epoch, TimestampWithTimeZone),
        name!(time_unit_ms, i64),
        name!(total_bits, i32),
        name!(time_bits, i32),
        name!(worker_bits, i32),
        name!(sequence_bits, i32),
        name!(max_worker_id, i32),
        name!(max_sequence, i32),
        name!(max_id, i64),
        name!(ends_at, TimestampWithTimeZone),
        name!(years_left, f64),
        name!(ends_soon, bool),
    ),
> {
    let l = settings::layout();
    let now = crate::clock::unix_ms();
    TableIterator::once((
        settings::preset_name().to_string(),
        to_timestamptz(l.epoch_ms),
        l.unit_ms,
        l.total_bits as i32,
        l.time_bits() as i32,
        l.worker_bits as i32,
        l.sequence_bits as i32,
        l.max_worker_id() as i32,
        l.max_sequence() as i32,
        l.max_id(),
        // A time field that outlasts timestamptz (year 294276) ends at infinity.
        TimestampWithTimeZone::try_from((l.end_unix_ms() - PG_EPOCH_UNIX_MS).saturating_mul(1000))
            .unwrap_or_else(|_| TimestampWithTimeZone::positive_infinity()),
        l.years_left(now),
        l.ended(now) || l.ends_within(now, settings::layout_end_warning_years()),
    ))
}

/// This server's worker-id configuration and how much of it is in use.
/// Parallel restricted: it reports this backend's own worker id.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
fn snowflake_config() -> TableIterator<
    'static,
    (
        name!(worker_ids, String),
        name!(worker_ids_total, Option<i64>),
        name!(worker_ids_held, Option<i64>),
        name!(worker_ids_free, Option<i64>),
        name!(my_worker_id, Option<i32>),
        name!(max_drift_ms, i64),
        name!(mode, String),
        name!(registry, Option<String>),
        name!(blocks_held, Option<i32>),
        name!(lease_deadline, Option<TimestampWithTimeZone>),
        name!(registry_unreachable_since, Option<TimestampWithTimeZone>),
        name!(node_id, Option<String>),
        name!(lease_problem, Option<String>),
    ),
> {
    let Some(header) = crate::shmem::header() else {
        // Without preloading there is nothing to count: say so in the row.
        return TableIterator::once((
            "not preloaded".to_string(),
            None,
            None,
            None,
            None,
            settings::max_drift_ms(),
            "not preloaded".to_string(),
            None,
            None,
            None,
            None,
            None,
            None,
        ));
    };
    let (text, total, held) = claims::range_usage();
    let lease = &header.lease;
    let mode = lease.mode(Relaxed);
    let leased = match mode {
        LeaseMode::Local => false,
        LeaseMode::Undecided | LeaseMode::Registry | LeaseMode::Citus => true,
    };
    let at = |unix_ms: i64| {
        (unix_ms > 0)
            .then(|| TimestampWithTimeZone::try_from((unix_ms - PG_EPOCH_UNIX_MS) * 1000).ok())
            .flatten()
    };
    // Like `SHOW snowflake_id.registry`: where the registry is and which
    // node id this server has there are for superusers and members of
    // pg_read_all_settings (a role that can reach the registry could hold
    // the node id's lock there and make this server take itself for a copy).
    // What keeps the lease worker from leasing names the registry too.
    let (registry, node_id, problem) = if settings::may_read_hidden_settings() {
        (
            lease.registry.get(),
            lease.node_id.get(),
            lease.problem.get(),
        )
    } else {
        (String::new(), String::new(), String::new())
    };
    TableIterator::once((
        if text.is_empty() {
            format!("0-{}", settings::layout().max_worker_id())
        } else {
            text
        },
        Some(total as i64),
        Some(held as i64),
        Some(total.saturating_sub(held) as i64),
        claims::my_worker_id().map(|w| w as i32),
        settings::max_drift_ms(),
        mode.name().to_string(),
        (!registry.is_empty()).then_some(registry),
        leased.then(|| lease.blocks_held.load(Relaxed) as i32),
        at(lease.deadline_ms.load(Relaxed)),
        at(lease.unreachable_since_ms.load(Relaxed)),
        (!node_id.is_empty()).then_some(node_id),
        (!problem.is_empty()).then_some(problem),
    ))
}

/// Every worker id held now or used since the server started (the
/// `snowflake_workers` view adds names).
#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)]
fn snowflake_worker_status() -> TableIterator<
    'static,
    (
        name!(worker_id, i32),
        name!(pid, Option<i32>),
        name!(database_oid, Option<pg_sys::Oid>),
        name!(role_oid, Option<pg_sys::Oid>),
        name!(application_name, Option<String>),
        name!(claimed_at, Option<TimestampWithTimeZone>),
        name!(released_at, Option<TimestampWithTimeZone>),
        name!(claims, i64),
        name!(ids_issued, Option<i64>),
        name!(last_id_time, Option<TimestampWithTimeZone>),
        name!(current_drift_ms, i64),
        name!(max_drift_ms, i64),
        name!(sequence_exhausted, i64),
        name!(clock_backward, i64),
        name!(sessions, i32),
        name!(shared_claims, i64),
    ),
> {
    let layout = settings::layout();
    let ts = |micros: i64| TimestampWithTimeZone::try_from(micros).ok();
    let rows = claims::worker_rows().into_iter().map(move |r| {
        (
            r.worker_id as i32,
            r.pid,
            r.database_oid.map(pg_sys::Oid::from),
            r.role_oid.map(pg_sys::Oid::from),
            r.application_name,
            r.claimed_at.and_then(ts),
            r.released_at.and_then(ts),
            r.claims as i64,
            r.ids_issued.map(|n| n as i64),
            r.last_tick
                .filter(|&t| t >= 0)
                .map(|t| to_timestamptz(layout.tick_start_unix_ms(t))),
            r.current_drift * layout.unit_ms,
            r.max_drift * layout.unit_ms,
            r.sequence_exhausted as i64,
            r.clock_backward as i64,
            r.sessions as i32,
            r.shared_claims as i64,
        )
    });
    TableIterator::new(rows.collect::<Vec<_>>())
}

/// Makes every ID this server makes from now on larger than `id` (any
/// worker id), for after restoring a dump of a database other than
/// `snowflake_id.registry_database`: `SELECT snowflake_advance_past(max(id))
/// FROM orders`. Durable across restarts. Returns the time from which new
/// IDs are stamped. Superusers only: a far-future ID would stop IDs being
/// made until the clock catches up.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn snowflake_advance_past(id: i64) -> TimestampWithTimeZone {
    // SAFETY: a plain catalog check of the current user.
    if !unsafe { pg_sys::superuser() } {
        errors::superuser_only("snowflake_advance_past");
    }
    let header = claims::require_shared("snowflake_advance_past");
    let layout = settings::layout();
    // A changed layout not yet accepted: `id` could be of either layout.
    if header
        .layout_changed
        .load(std::sync::atomic::Ordering::Acquire)
    {
        errors::layout_changed(&header.recorded_layout.differences(layout));
    }
    let parts = layout
        .decode(id)
        .unwrap_or_else(|e| errors::part_out_of_range(e));
    crate::durability::reservation::advance_past(
        header,
        layout.tick_start_unix_ms(parts.ticks),
        layout,
    );
    to_timestamptz(layout.tick_start_unix_ms(parts.ticks + 1))
}

/// The C entry point of 0.1.0's `snowflake_decode()`, which 0.2.0 replaced
/// by a SQL function returning one row. A database still on 0.1.0 (the new
/// library installed, `ALTER EXTENSION snowflake_id UPDATE` not yet run)
/// gets a clear error instead of "could not find function"; the update
/// drops that definition.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_decode_wrapper(
    _fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    errors::old_extension_version("snowflake_decode", "0.1.0")
}

/// The call convention of [`snowflake_decode_wrapper`] (PG_FUNCTION_INFO_V1).
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_snowflake_decode_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// Adopts the layout the server started with, after a change of the layout
/// settings made `snowflake_nextval()` refuse. New IDs start above every ID
/// the previous layout can have issued. Superusers only.
#[pg_extern(volatile, parallel_unsafe)]
fn snowflake_accept_layout() -> TableIterator<
    'static,
    (
        name!(changed, bool),
        name!(first_id, i64),
        name!(ids_resume_at, TimestampWithTimeZone),
    ),
> {
    // SAFETY: a plain catalog check of the current user.
    if !unsafe { pg_sys::superuser() } {
        errors::superuser_only("snowflake_accept_layout");
    }
    let header = claims::require_shared("snowflake_accept_layout");
    let layout = settings::layout();
    let changed = header
        .layout_changed
        .load(std::sync::atomic::Ordering::Acquire);
    let first = if changed {
        let latest_ms = crate::clock::unix_ms() + settings::max_drift_ms();
        match crate::durability::reservation::accept_layout(header, layout, latest_ms) {
            Ok(first) => first,
            Err(crate::durability::reservation::AcceptError::CannotRise) => {
                errors::layout_cannot_rise(None)
            }
            Err(crate::durability::reservation::AcceptError::NotUntil(ms)) => {
                errors::layout_cannot_rise(Some(ms))
            }
        }
    } else {
        // Nothing to adopt: report where IDs stand now.
        layout.tick_at(crate::clock::unix_ms()).max(0)
    };
    TableIterator::once((
        changed,
        layout.compose_unchecked(first.min(layout.max_ticks()), 0, 0),
        to_timestamptz(layout.tick_start_unix_ms(first)),
    ))
}

extension_sql_file!(
    "privileges.sql",
    name = "accept_layout_privileges",
    requires = [snowflake_accept_layout, snowflake_advance_past]
);

extension_sql_file!(
    "workers_view.sql",
    name = "snowflake_workers_view",
    requires = [snowflake_worker_status]
);
