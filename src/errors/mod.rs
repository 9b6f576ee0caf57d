//! Every error the extension raises: one function each, with its SQLSTATE,
//! message, detail and hint, so wording stays consistent and testable.
//! `docs/reference/errors.md` lists each message with its SQLSTATE, and
//! `tests/docs/test_errors_doc.py` checks that the two agree.
//!
//! By concern, one file each; callers use the functions through the
//! re-exports below (`errors::no_lease`, not `errors::fleet::no_lease`):
//!
//! - this file: [`raise`], the one way an error is reported, and the errors
//!   of any SQL function (not preloaded, superusers only, old SQL objects,
//!   out of memory, a bug);
//! - `generate`: making IDs (batch size, clock behind, no worker id, ticks);
//! - `layout`: a layout that is invalid, unusable now, ending soon (a
//!   WARNING), changed, or cannot rise above the IDs issued;
//! - `decode`: parts and timestamps outside the layout or timestamptz;
//! - `state_file`: the data directory's `snowflake_id.state`;
//! - `settings`: `snowflake_id.*` settings at start and in check hooks,
//!   secrets never echoed;
//! - `public_id`: the key file and tokens of public IDs;
//! - `fleet`: leases from a registry or Citus;
//! - `backfill`: `snowflake_at()` and `snowflake_id.backfill_worker_ids`.

mod backfill;
mod decode;
mod fleet;
mod generate;
mod layout;
mod public_id;
mod settings;
mod state_file;

pub use backfill::{
    backfill_bucket_full, backfill_grant_not_replicated, backfill_grants_not_durable,
    backfill_ids_changed, backfill_ids_overlap, backfill_needs_registry, backfill_off,
    backfill_on_standby, backfill_registry_refused, backfill_registry_too_old,
    backfill_registry_unreachable, backfill_time, backfill_time_full, backfill_with_leases,
    bad_backfill_ids,
};
pub use decode::{
    beyond_timestamp_range, infinite_timestamp, part_out_of_range, timestamp_out_of_range,
};
pub use fleet::{
    fleet_unknown, invalid_lease_request, lease_call_in_transaction, no_lease, no_lease_on_standby,
    registry_databases_full, registry_refusal, REGISTRY_HIDDEN,
};
pub use generate::{
    bad_batch_size, behind_floor, behind_server, borrowed_lead, floor_in_this_tick, generator,
    registry_not_read, reservation_not_replicated, workers_exhausted,
};
pub use layout::{
    invalid_layout, layout_cannot_rise, layout_changed, layout_ends_soon, layout_unusable_now,
    tick_longer_than_drift,
};
pub use public_id::{bad_public_id, no_public_key, public_key_file, public_key_file_warning};
pub use settings::{
    also_refused, bad_registry_setting, bad_setting, bad_worker_ids, conninfo_secret_check_failed,
    conninfo_secret_setting, guc_check_detail, public_key_removed_check_failed,
    public_key_removed_setting, registry_check_failed, unknown_setting,
};
pub use state_file::{
    registry_candidates_file, registry_candidates_file_unreadable, registry_key_file,
    registry_key_file_unreadable, state_file, state_file_too_new, state_file_unreadable,
};

use pgrx::{PgLogLevel, PgSqlErrorCode};

#[track_caller]
fn raise(code: PgSqlErrorCode, message: String, detail: Option<String>, hint: Option<String>) -> ! {
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(code, message, "snowflake_id");
    if let Some(detail) = detail {
        report = report.set_detail(detail);
    }
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

/// 55000: the library was loaded on demand instead of preloaded.
#[track_caller]
pub fn not_preloaded(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake_id must be loaded via \"shared_preload_libraries\" to use {function}()"),
        Some("Generator state and worker claims live in shared memory, which can only be set up when the server starts.".into()),
        Some("Add snowflake_id to shared_preload_libraries in postgresql.conf and restart the server.".into()),
    )
}

/// 42501: a function reserved for superusers.
#[track_caller]
pub fn superuser_only(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("permission denied for function {function}"),
        Some("Only superusers may change how snowflake IDs are made.".into()),
        Some("Ask a superuser to run it.".into()),
    )
}

/// 55000: a function of an older version of the extension's SQL objects,
/// whose C code the installed library no longer has.
#[track_caller]
pub fn old_extension_version(function: &str, version: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}() of snowflake_id {version} is not supported by the installed library"),
        Some("The snowflake_id library was upgraded, but this database still has the SQL objects of the older version.".into()),
        Some("Run ALTER EXTENSION snowflake_id UPDATE in this database.".into()),
    )
}

/// 53200: an allocation failed.
#[track_caller]
pub fn out_of_memory(bytes: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        "out of memory".into(),
        Some(format!("Failed on request of size {bytes}.")),
        None,
    )
}

/// XX000: a bug.
#[track_caller]
pub fn internal(message: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        message.into(),
        None,
        Some("Please report this as a bug in snowflake_id.".into()),
    )
}
