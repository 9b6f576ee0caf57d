//! snowflake_id: time-ordered, unique 64-bit IDs generated inside PostgreSQL.
//!
//! Where things are:
//! - `layout`     the bit layout of an ID (pure)
//! - `generator`  the clock and sequence rules (pure, injected clock)
//! - `ranges`     worker id range parsing (pure)
//! - `gucs`       the `snowflake_id.*` settings
//! - `shmem`      shared memory and the state file (locking rules at the top)
//! - `wal`        WAL-logging of the reservation, for standbys and recovery
//! - `registry`   worker id claims, one per backend
//! - `registry_table` the background worker that keeps the registry table
//! - `api`        the SQL functions and views
//! - `sql_tools`  SQL-language functions (decode row, convert, partitions) and COMMENTs
//! - `errors`     every error raised, with SQLSTATE, detail and hint
#![forbid(unsafe_op_in_unsafe_fn)]

mod api;
mod clock;
mod errors;
pub mod generator;
mod gucs;
pub mod layout;
pub mod ranges;
mod registry;
mod registry_table;
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
    // SAFETY: reading a flag PostgreSQL sets while loading preload libraries.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    gucs::init(preloading);
    if preloading {
        shmem::init();
        wal::init();
        registry_table::init();
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
