//! snowflake_id: time-ordered, unique 64-bit IDs generated inside PostgreSQL.
//!
//! This crate is the glue between PostgreSQL and the pure rules of
//! `snowflake_core` (core/: the ID layout, the clock and sequence rules,
//! worker-id ranges, lease rules and the lease holder, public IDs). Where
//! things are:
//! - `settings/`   the `snowflake_id.*` settings: the load phase (one
//!   validated `Config`), check hooks, typed getters
//! - `shmem/`      shared-memory structures and hooks (the locking rules and
//!   lock order are at the top of `shmem/mod.rs`)
//! - `claims/`     worker-id claims, one per backend, and the hot path
//! - `durability/` the state file, the floor and WAL replay (`reservation`),
//!   and the WAL records they write (`wal`): no ID repeats after a crash
//! - `workers/`    background workers: `registry_worker` keeps the registry
//!   table; `lease_worker` leases blocks from a registry server over
//!   `registry_client` (libpq, non-blocking, on the latch)
//! - `sql/`        the SQL API: `api` (generators, decoders, views),
//!   `public_ids`, `tools` (SQL-language functions), `leases.sql` (the
//!   registry's side of the lease protocol)
//! - `clock`       the wall clock
//! - `errors`      every error raised, with SQLSTATE, detail and hint
//!
//! Per-process state is a `static` behind a `parking_lot` lock (const-built,
//! never poisoned when a PostgreSQL error unwinds through it), never
//! `static mut`. Three exceptions, each for a reason: values written once
//! while loading and then borrowed for the life of the process are
//! `OnceLock`s (the configuration the load phase decided, libpq's symbols);
//! a flag a signal handler sets is an atomic (a lock is not
//! async-signal-safe); and the claim of the hot path stays in a `RefCell`
//! in a plain static (`claims::BackendLocal`: a backend runs its SQL on one
//! thread; no atomic instruction per ID, no `__tls_get_addr` call as a
//! `thread_local!` costs in a dlopen'd library, and a FATAL exit that skips
//! unwinding leaves it borrowed, which the exit callback sees with
//! `try_borrow_mut`, where a held lock would deadlock it).
//! Shared memory uses PostgreSQL's LWLocks, spinlocks and atomics only
//! (`shmem/`); the address of shared memory, set when this process
//! attaches and read for every ID, is an `AtomicPtr`.
//!
//! Lints (`unsafe_op_in_unsafe_fn` forbidden, no `unwrap`/`expect` outside
//! tests): `[workspace.lints]` in Cargo.toml, for both crates.

mod claims;
mod clock;
mod durability;
mod errors;
mod settings;
mod shmem;
mod sql;
mod workers;

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
    settings::load(preloading, claims::max_drift_changed);
    if preloading {
        settings::warn_if_layout_ends_soon();
        shmem::init(durability::reservation::read_at_startup);
        durability::backfill::init();
        durability::reservation::init();
        workers::registry_worker::init();
        workers::lease_worker::init();
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
