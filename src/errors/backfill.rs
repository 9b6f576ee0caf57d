//! Errors of backfill (`snowflake_at()`) and of its setting
//! `snowflake_id.backfill_worker_ids`.

use super::raise;
use pgrx::PgSqlErrorCode;

/// 22023: `snowflake_id.backfill_worker_ids` does not parse for this layout.
#[track_caller]
pub fn bad_backfill_ids(detail: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.backfill_worker_ids\"".into(),
        Some(detail.into()),
        Some("Write the set-aside worker ids as a list of ids and ranges, e.g. 1023 or 1020-1023, and restart the server.".into()),
    )
}

/// 22023 at start: ids set aside for backfill are also live ids.
#[track_caller]
pub fn backfill_ids_overlap(backfill: &str, live: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_id.backfill_worker_ids ({backfill}) and snowflake_id.worker_ids ({live}) overlap"),
        Some("A backfill ID could then equal a live ID of the same time.".into()),
        Some("Take the set-aside ids out of snowflake_id.worker_ids (or leave it empty: every id but the set-aside ones), and restart the server.".into()),
    )
}

/// 55000: no worker ids are set aside for backfill.
#[track_caller]
pub fn backfill_off() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "no worker ids are set aside for backfill IDs".into(),
        Some("snowflake_at() makes IDs for past times from worker ids that live IDs never use, so that they cannot equal any other ID.".into()),
        Some("Set snowflake_id.backfill_worker_ids to worker ids no server uses for live IDs and no other server sets aside (e.g. the highest: '1023' under the classic layout), and restart the server.".into()),
    )
}

/// 55000: backfill before this server knows its registry or coordinator.
#[track_caller]
pub fn backfill_with_leases(mode: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake_at() cannot make IDs while this server's worker ids come from {mode}"),
        Some("Backfill grants of a fleet come from its registry (snowflake_id.registry) or Citus coordinator, which this server does not know yet.".into()),
        Some("Wait for the lease worker to find it (snowflake_config() shows the registry), and run the statement again.".into()),
    )
}

/// 08006: the registry did not answer a backfill grant call.
#[track_caller]
pub fn backfill_registry_unreachable(registry: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        format!("snowflake_at() could not get backfill grants from the registry {registry}: {problem}"),
        Some("In a fleet, backfill grants come from the registry, durable on its synchronous standbys before an ID is made with them.".into()),
        Some("Check that the registry is up and reachable with snowflake_id.registry's connection string; the statement may be run again (grants already taken are kept by this session).".into()),
    )
}

/// 55000: the registry's extension has no backfill grant function.
#[track_caller]
pub fn backfill_registry_too_old(registry: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the registry {registry} hands out no backfill grants"),
        Some("Its snowflake_id extension predates 0.8.0, or the connecting role may not use snowflake_id_internal.snowflake_backfill_grant(jsonb).".into()),
        Some("Run ALTER EXTENSION snowflake_id UPDATE on the registry, and GRANT EXECUTE ON FUNCTION snowflake_id_internal.snowflake_backfill_grant(jsonb) to the lease role.".into()),
    )
}

/// 55000: the registry refused a backfill grant call.
#[track_caller]
pub fn backfill_registry_refused(registry: &str, message: &str, hint: Option<String>) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the registry {registry} refused backfill grants: {message}"),
        Some("In a fleet, backfill grants come from the registry.".into()),
        Some(
            hint.unwrap_or_else(|| "See the registry's log (snowflake_id registry lines).".into()),
        ),
    )
}

/// 55000: backfill grants not durable on the registry's standbys in time.
#[track_caller]
pub fn backfill_grants_not_durable(registry: &str, detail: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("backfill grants from the registry {registry} were not durable on its synchronous standbys in time"),
        Some(format!("A grant is used only once a failover of the registry keeps it, as leases are: {detail}.")),
        Some("Check the registry's synchronous standbys (pg_stat_replication there); run the statement again once they keep up.".into()),
    )
}

/// 55000: backfill on a hot standby.
#[track_caller]
pub fn backfill_on_standby() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "snowflake_at() cannot make IDs during recovery".into(),
        Some("Backfill grants are made durable in WAL, which a standby cannot write; its primary hands out the same grants.".into()),
        Some("Call snowflake_at() on the primary.".into()),
    )
}

/// 55000: the set-aside ids no longer continue the ones grants were made
/// for.
#[track_caller]
pub fn backfill_ids_changed(recorded: &str, configured: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake_id.backfill_worker_ids ({}) does not start with the ids backfill IDs were made from ({recorded})",
            if configured.is_empty() { "empty" } else { configured }
        ),
        Some("Backfill grants are numbered across the set-aside ids in order; with other ids, a new grant could repeat an old one's worker id and sequence.".into()),
        Some(format!("Set snowflake_id.backfill_worker_ids back to {recorded} (ids may be added at the end) and restart the server.")),
    )
}

/// 22008: a time no backfill ID can have.
#[track_caller]
pub fn backfill_time(problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        format!("no backfill ID can be made for this time: {problem}"),
        None,
        Some("Backfill times must be within the layout's time range (snowflake_layout()), after any layout change of this server, and no further ahead of the clock than snowflake_id.max_drift.".into()),
    )
}

/// 54000: every grant of a bucket is handed out; raised before taking one.
#[track_caller]
pub fn backfill_bucket_full(start: &str, end: &str, grants: u32, held: usize, per_tick: u32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("the backfill space for times from {start} to {end} is used up"),
        Some(format!("This session needed one more grant of that stretch of time; all {grants} are handed out, {held} of them to this session. A session takes one grant per stretch, one more per {per_tick} IDs of one time, and new ones after each {} distinct times and in each new session.", snowflake_core::backfill::MAX_TICKS)),
        Some("Add worker ids that no server ever used for live IDs at the end of snowflake_id.backfill_worker_ids and restart the server; import in fewer, longer sessions (a session keeps its grants across statements).".into()),
    )
}

/// 54000: a further grant of a stretch (IDs sharing a time) would take
/// the grants kept for other sessions' first grants; none was taken.
#[track_caller]
pub fn backfill_time_full(
    time: &str,
    made: u32,
    left: u32,
    capacity: u32,
    reserve: u32,
    per_tick: u32,
) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("this session needed more than {made} backfill IDs at {time}, more than its stretch of time lets one session make"),
        Some(format!("Each {per_tick} IDs of one time take another grant of its stretch; {left} of the stretch's {capacity} grants are left, and a further grant of a session never takes the last {reserve} of them (other sessions' first grants). No grant was taken for this ID.")),
        Some(format!("Spread the rows over more times (one session makes at most {} IDs of one time), or add worker ids that no server ever used for live IDs at the end of snowflake_id.backfill_worker_ids and restart the server.", capacity.saturating_sub(reserve).saturating_mul(per_tick))),
    )
}

/// 55000: backfill without the registry tables read.
#[track_caller]
pub fn backfill_needs_registry(database: Option<&str>) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        match database {
            None => "snowflake_at() needs the registry worker, and snowflake_id.registry_database is empty".into(),
            Some(db) => format!("the snowflake_id registry worker has not read the registry tables of database \"{db}\" yet"),
        },
        Some("Backfill reads snowflake_worker_registry (whether the set-aside worker ids made live IDs) and snowflake_backfill_grants (grants carried by pg_upgrade or a restore) before its first ID.".into()),
        Some("Set snowflake_id.registry_database to a database with CREATE EXTENSION snowflake_id (default postgres) and restart; run ALTER EXTENSION snowflake_id UPDATE there if it is older than 0.6.0; the log's snowflake_id registry lines say more.".into()),
    )
}

/// 57014: the wait for the synchronous standbys to flush a backfill grant
/// was cancelled: the grant is not used (nor handed out again).
#[track_caller]
pub fn backfill_grant_not_replicated() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
        "the snowflake backfill grant was not confirmed by the synchronous standbys: the wait was cancelled".into(),
        Some("Backfill IDs are made only under grants flushed on the standbys synchronous_standby_names names, so that a promoted standby cannot hand the grant out again. No ID was returned; the grant is not used.".into()),
        Some("Check that the synchronous standbys are connected (pg_stat_replication), then retry; or remove them from synchronous_standby_names.".into()),
    )
}
