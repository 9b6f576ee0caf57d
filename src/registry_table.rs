//! The registry worker: a background worker that copies the worker-id slots
//! from shared memory into the table `snowflake_worker_registry` of the
//! database named by `snowflake_id.registry_database`, so that who held
//! each id, and how far its IDs went, survives restarts and can be read
//! with SQL.
//!
//! It writes in its own transactions, so a user's rollback never loses a
//! row, and it never blocks `snowflake_nextval()`: claims only bump a
//! counter that the worker polls once a second. It starts once recovery has
//! finished (standbys cannot write tables) and does nothing while the
//! database lacks the extension.

use crate::gucs;
use crate::shmem;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// How often the worker looks for changes.
const POLL: Duration = Duration::from_secs(1);
/// How often it refreshes counters and high-water times when no claim or
/// release happened.
const REFRESH: Duration = Duration::from_secs(10);

/// Registers the worker. Called from `_PG_init` while preloading.
pub fn init() {
    if gucs::registry_database().is_none() {
        return;
    }
    BackgroundWorkerBuilder::new("snowflake_id registry")
        .set_type("snowflake_id registry")
        .set_library("snowflake_id")
        .set_function("snowflake_id_registry_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(10)))
        .load();
}

const UPSERT: &str = r#"
INSERT INTO %s.snowflake_worker_registry AS r
       (worker_id, pid, database, role, application_name, claimed_at, released_at,
        claims, ids_issued, high_water, updated_at)
SELECT w.worker_id, w.pid, d.datname, o.rolname, w.application_name, w.claimed_at,
       w.released_at, w.claims, w.ids_issued, w.last_id_time, now()
  FROM %s.snowflake_worker_status() w
  LEFT JOIN pg_database d ON d.oid = w.database_oid
  LEFT JOIN pg_roles o ON o.oid = w.role_oid
ON CONFLICT (worker_id) DO UPDATE SET
       pid = EXCLUDED.pid, database = EXCLUDED.database, role = EXCLUDED.role,
       application_name = EXCLUDED.application_name, claimed_at = EXCLUDED.claimed_at,
       released_at = EXCLUDED.released_at, claims = EXCLUDED.claims,
       ids_issued = EXCLUDED.ids_issued,
       high_water = greatest(r.high_water, EXCLUDED.high_water), updated_at = now()
 WHERE (r.pid, r.claimed_at, r.released_at, r.ids_issued)
       IS DISTINCT FROM (EXCLUDED.pid, EXCLUDED.claimed_at, EXCLUDED.released_at, EXCLUDED.ids_issued)
"#;

/// Copies the slots into the table; returns false while the database has
/// no snowflake_id extension.
fn sync() -> bool {
    let schema = Spi::get_one::<String>(
        "SELECT quote_ident(n.nspname) FROM pg_extension e
           JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'snowflake_id'",
    );
    let Ok(Some(schema)) = schema else {
        return false;
    };
    if let Err(e) = Spi::run(&UPSERT.replace("%s", &schema)) {
        pgrx::warning!("snowflake_id registry: could not update snowflake_worker_registry: {e}");
    }
    true
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_id_registry_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let Some(database) = gucs::registry_database() else {
        return;
    };
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    let Some(header) = shmem::header() else {
        return;
    };
    let mut synced_changes = None;
    let mut synced_at = Instant::now();
    let mut missing_reported = false;
    while BackgroundWorker::wait_latch(Some(POLL)) {
        let changes = header.changes.load(Relaxed);
        if synced_changes == Some(changes) && synced_at.elapsed() < REFRESH {
            continue;
        }
        if BackgroundWorker::transaction(sync) {
            synced_changes = Some(changes);
            missing_reported = false;
        } else if !missing_reported {
            pgrx::log!(
                "snowflake_id registry: database \"{database}\" has no snowflake_id extension yet; \
                 the registry table is kept once CREATE EXTENSION snowflake_id runs there"
            );
            missing_reported = true;
        }
        synced_at = Instant::now();
    }
}
