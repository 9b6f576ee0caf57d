//! Background workers, and the libpq client the lease worker talks through.
//!
//! - `registry_worker` the workers that keep the registry table of worker-id
//!   ranges, and its DDL
//! - `registry_backfill` the registry worker's part in backfill: grants into
//!   `snowflake_backfill_grants` and back, the set-aside ids' live history
//! - `lease_worker`    the worker that leases worker-id blocks from a
//!   registry server (the holder state machine is `snowflake_core::holder`)
//! - `registry_client` the lease worker's connection: libpq loaded at run
//!   time, non-blocking, waiting on the latch, each call bounded
//!
//! [`pin_search_path`] is what every worker does first.

pub mod lease_worker;
pub mod registry_backfill;
pub mod registry_client;
pub mod registry_worker;

use pgrx::pg_sys;

/// Makes this process resolve unqualified names in `pg_catalog` only:
/// the background workers run SQL as the bootstrap superuser, so a
/// function or operator another role created in a schema on the default
/// `search_path` must never be what they call. Like autovacuum's.
pub fn pin_search_path() {
    // SAFETY: valid C strings; PostgreSQL copies them. Setting search_path
    // needs no transaction (it only invalidates the cached path).
    unsafe {
        pg_sys::SetConfigOption(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// The registry worker's commits wait for no standby: its tables are
/// copies of what the state file and WAL already hold (for dumps and
/// `pg_upgrade`), and a commit waiting for a synchronous standby that is
/// down would keep the worker from ever seeing SIGTERM (its handler is
/// pgrx's flag, which `SyncRepWaitForLSN` does not read): a fast
/// shutdown would wait for it until `pg_ctl` gave up.
pub fn commit_locally() {
    // SAFETY: valid C strings; PostgreSQL copies them. The assign hook of
    // synchronous_commit only sets a variable: no transaction needed.
    unsafe {
        pg_sys::SetConfigOption(
            c"synchronous_commit".as_ptr(),
            c"local".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// The report of an error caught with `PgTryBuilder` in a worker (which
/// then aborts its transaction, logs and goes on).
pub(crate) fn caught_report(
    e: &pg_sys::panic::CaughtError,
) -> &pg_sys::panic::ErrorReportWithLevel {
    match e {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r)
        | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => r,
    }
}

/// [`caught_report`]'s message.
pub(crate) fn caught_message(e: &pg_sys::panic::CaughtError) -> String {
    caught_report(e).message().to_string()
}
