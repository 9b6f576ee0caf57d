//! snowflake_id: time-ordered, unique 64-bit IDs generated inside PostgreSQL.
//!
//! Where things are:
//! - `layout`     the bit layout of an ID (pure)
//! - `generator`  the clock and sequence rules (pure, injected clock)
//! - `ranges`     worker id range parsing (pure)
//! - `gucs`       the `snowflake_id.*` settings
//! - `conninfo`   finding a password in a connection string (pure)
//! - `key_file`   reading and checking the public key file (pure)
//! - `shmem`      shared-memory structures, hooks, lock guard (locking
//!   rules and lock order at the top)
//! - `reservation` the state file, the floor and WAL replay: no ID repeats
//! - `wal`        WAL records of the reservation (a leaf `reservation` calls)
//! - `claims`     worker id claims, one per backend, and the hot path
//! - `registry_client` the lease worker's libpq connection: non-blocking, on the latch, bounded
//! - `registry_worker` the background workers that keep the registry table, and its DDL
//! - `lease`      fleet leases of worker-id blocks: the rules and the safety argument (pure)
//! - `holder`     the holder side of leases as a state machine over a registry client (pure)
//! - `lease_worker` the background worker that leases from the registry; `leases.sql` the registry's side
//! - `api`        the SQL functions and views
//! - `public_id`  the keyed, reversible text form of IDs (pure)
//! - `public_sql` `snowflake_to_public()` / `snowflake_from_public()`
//! - `sql_tools`  SQL-language functions (decode row, convert, partitions) and COMMENTs
//! - `errors`     every error raised, with SQLSTATE, detail and hint
#![forbid(unsafe_op_in_unsafe_fn)]

mod api;
mod claims;
mod clock;
mod conninfo;
mod errors;
pub mod generator;
mod gucs;
pub mod holder;
mod key_file;
pub mod layout;
pub mod lease;
mod lease_worker;
pub mod public_id;
mod public_sql;
pub mod ranges;
mod registry_client;
mod registry_worker;
mod reservation;
mod shmem;
mod sql_tools;
mod wal;

use pgrx::prelude::*;

::pgrx::pg_module_magic!(name, version);

/// Registers the settings; when preloaded, also the shared memory. Without
/// preloading, `CREATE EXTENSION` and the decoders still work and the
/// generators fail with SQLSTATE 55000 and a hint.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    no_rust_backtraces();
    // SAFETY: reading a flag PostgreSQL sets while loading preload libraries.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    gucs::init(preloading);
    if preloading {
        shmem::init(reservation::read_at_startup);
        reservation::init();
        registry_worker::init();
        lease_worker::init();
    }
}

/// Keeps Rust backtraces out of error reports. pgrx's panic hook captures
/// one whenever a PostgreSQL error (a cancel, a statement_timeout) passes
/// through Rust code, and appends it to the error's DETAIL when
/// `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` is set in the server's
/// environment; clients must see PostgreSQL's own message only. The
/// standard library decides once per process, from the environment, on its
/// first capture: make that first capture here, with captures switched off,
/// then restore the environment for everything else the server runs.
fn no_rust_backtraces() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    // SAFETY (set_var/remove_var): _PG_init runs in the postmaster or a
    // backend, both single-threaded, so nothing reads the environment
    // concurrently.
    std::env::set_var(VAR, "0");
    let _ = std::backtrace::Backtrace::capture();
    match saved {
        Some(value) => std::env::set_var(VAR, value),
        None => std::env::remove_var(VAR),
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;
#[cfg(test)]
mod proptests;

/// Settings for the `cargo pgrx test` server.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'snowflake_id'"]
    }
}
