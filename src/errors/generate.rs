//! Errors of making IDs (`snowflake_nextval()`, `snowflake_nextvals()`):
//! the batch size, the generator's clock and layout errors, no worker id to
//! claim, and the clock behind a reservation, a tick, a lead or the server.

use super::{internal, raise};
use pgrx::PgSqlErrorCode;
use snowflake_core::generator::GenError;
use snowflake_core::layout::{format_unix_ms, Layout};

/// 22023: a batch size outside 1..max.
#[track_caller]
pub fn bad_batch_size(n: i32, max: i32) -> ! {
    let hint = if n < 1 {
        "Ask for at least 1 ID."
    } else {
        "Ask for fewer IDs per call and call again."
    };
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_nextvals() batch size {n} is out of range"),
        Some(format!("A batch holds 1 to {max} IDs.")),
        Some(hint.into()),
    )
}

/// The generator could not make an ID now.
#[track_caller]
pub fn generator(err: GenError, layout: &Layout, max_drift_ms: i64) -> ! {
    match err {
        GenError::ClockBehind { behind, .. } => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "system clock is {} ms behind the last snowflake ID issued by this worker",
                behind * layout.unit_ms
            ),
            Some(format!(
                "snowflake_id.max_drift is {max_drift_ms} ms; issuing more IDs now would either repeat earlier IDs or run further ahead of the clock."
            )),
            Some("Fix the system clock (check NTP), wait until it catches up, or raise snowflake_id.max_drift and reload.".into()),
        ),
        GenError::Interrupted => internal("snowflake_id: an interrupted clock wait was reported as an error"),
        GenError::LayoutExhausted { .. } => raise(
            PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            format!(
                "the time field of the snowflake ID layout ran out at {}",
                format_unix_ms(layout.end_unix_ms())
            ),
            None,
            Some("Configure a layout with more time bits, a coarser time unit or a later epoch, restart, and as a superuser run SELECT snowflake_accept_layout(): new IDs then start above every ID issued before.".into()),
        ),
    }
}

/// 53400: no worker id of this server's range can be claimed, not even
/// shared. A held id is shared when none is free, so this happens only when
/// the claim lock of every id is held in a conflicting mode by code other
/// than this extension (SQL's advisory-lock functions cannot take it).
#[track_caller]
pub fn workers_exhausted(ranges: &str, count: u64, held: u64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "no snowflake worker id of this server can be claimed ({count} in its range, {held} held)"
        ),
        Some(format!(
            "snowflake_id.worker_ids = '{ranges}'. A held worker id is shared when none is free; the claim lock of every id (pg_locks: locktype advisory, database 0, classid 1397641047, objsubid 3) is held in a mode that excludes sharing, which only code outside snowflake_id can do."
        )),
        Some("Find the sessions holding those locks in pg_locks and end them, or widen snowflake_id.worker_ids.".into()),
    )
}

/// 55000: a claim that has issued nothing starts above the reservation
/// floor (IDs of an earlier life of this data directory), and the clock is
/// further behind it than max_drift plus a short wait.
#[track_caller]
pub fn behind_floor(floor_ms: i64, behind_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "system clock is {behind_ms} ms behind the snowflake IDs reserved before this server's last restart, crash or promotion"
        ),
        Some(format!(
            "IDs up to {} may already have been issued (snowflake_id.state, or WAL replayed from a primary); new IDs start above them so that none repeats. snowflake_id.max_drift is {max_drift_ms} ms.",
            format_unix_ms(floor_ms)
        )),
        Some(format!(
            "Check the system clock (NTP): it is behind the time of IDs made before. Otherwise wait until {}, or raise snowflake_id.max_drift and reload.",
            format_unix_ms(floor_ms)
        )),
    )
}

/// 55000: IDs of the current tick may have been issued (before this
/// server's last restart), and `max_drift = 0` allows no lead: the next
/// tick (at `next`, Unix ms) must begin.
#[track_caller]
pub fn floor_in_this_tick(
    next: i64,
    layout: &Layout,
    max_drift_ms: i64,
    drift_can_cover: bool,
) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "no snowflake ID can be made before the next tick begins at {}",
            format_unix_ms(next)
        ),
        Some(format!(
            "IDs of the current tick (the layout's tick is {} ms) may have been issued already (before this server's last restart, crash or promotion, or as the registry's high-water mark says), and snowflake_id.max_drift is {max_drift_ms} ms, so no ID may be ahead of the clock.",
            layout.unit_ms
        )),
        Some(if drift_can_cover {
            format!("Set snowflake_id.max_drift to at least {} ms and reload (one tick of lead is then allowed), or wait for the next tick.", layout.unit_ms)
        } else {
            "Wait for the next tick, or use a time unit of at most 1h (snowflake_id.max_drift can then cover one tick).".into()
        }),
    )
}

/// 55000: this worker's last ID is ahead of the clock by borrowed ticks
/// (sequence used up) and max_drift is now smaller than that lead.
#[track_caller]
pub fn borrowed_lead(ahead_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "the last snowflake ID issued by this worker is {ahead_ms} ms ahead of the system clock, more than snowflake_id.max_drift ({max_drift_ms} ms)"
        ),
        Some("The clock did not go back: the IDs ran ahead of it by borrowing ticks when the per-tick sequence was used up, under a larger snowflake_id.max_drift than the one in force now.".into()),
        Some(format!(
            "Wait about {} ms for the clock to catch up, or raise snowflake_id.max_drift and reload. The clock needs no fixing.",
            ahead_ms - max_drift_ms
        )),
    )
}

/// 55000: the clock is behind the newest ID of this server (another
/// backend's) by more than max_drift.
#[track_caller]
pub fn behind_server(behind_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "system clock is {behind_ms} ms behind the newest snowflake ID issued on this server"
        ),
        Some(format!(
            "No new ID is stamped below the server's newest ID time. snowflake_id.max_drift is {max_drift_ms} ms."
        )),
        Some("Fix the system clock (check NTP), wait until it catches up, or raise snowflake_id.max_drift and reload.".into()),
    )
}

/// 55000: the registry worker has not read the registry table's
/// high-water marks yet, so a first claim cannot know the floor.
#[track_caller]
pub fn registry_not_read(waited_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "the snowflake_id registry worker has not read the registry's high-water marks after {waited_ms} ms"
        ),
        Some("After pg_upgrade or a restore, the snowflake_worker_registry table of snowflake_id.registry_database may be the only record of IDs made before; no ID is made until they are in force.".into()),
        Some("Check the server log for \"snowflake_id registry\" messages (a missing database, no free background worker slot). To run without the registry, set snowflake_id.registry_database = '' and restart.".into()),
    )
}

/// 57014: the wait for the synchronous standbys to flush a new reservation
/// was cancelled (a cancel, `statement_timeout`, a termination): IDs under
/// it are not handed out.
#[track_caller]
pub fn reservation_not_replicated() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
        "the snowflake ID reservation was not confirmed by the synchronous standbys: the wait was cancelled".into(),
        Some("IDs are handed out only once the reservation that covers them is flushed on the standbys synchronous_standby_names names, so that a promoted standby cannot repeat them. No ID was returned.".into()),
        Some("Check that the synchronous standbys are connected (pg_stat_replication), then retry; or remove them from synchronous_standby_names.".into()),
    )
}
