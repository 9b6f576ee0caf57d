//! The registry worker: background workers that copy the worker-id slots
//! from shared memory into the table `snowflake_worker_registry` of the
//! database named by `snowflake_id.registry_database`, so that who held
//! each id, and how far its IDs went, survives restarts and can be read
//! with SQL. The table's DDL is here too, next to the upsert that must
//! match it.
//!
//! Two processes:
//! - the *launcher* (registered at start, connected to no database) checks
//!   that the database exists. While it does not, it logs one error and
//!   checks again with a growing pause (or at once on a reload), instead of
//!   failing every few seconds; once it does, it starts
//! - the *sync* worker (a dynamic worker connected to that database), which
//!   keeps the table. It writes in its own transactions, so a user's
//!   rollback never loses a row; a failed write is logged and retried, never
//!   fatal; and it never blocks `snowflake_nextval()`: claims only bump a
//!   counter that it polls once a second. When it exits (the database was
//!   dropped, say), the launcher checks and starts it again.
//!
//! Both start once recovery has finished (standbys cannot write tables),
//! reload the configuration on SIGHUP, and neither starts in binary-upgrade
//! mode (`pg_upgrade` needs the new cluster to itself).

use crate::settings;
use crate::shmem;
use crate::sql;
use crate::workers::{caught_message, registry_backfill};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, BgWorkerStartTime,
    DynamicBackgroundWorker, SignalWakeFlags,
};
use pgrx::prelude::*;
use pgrx::{PgLogLevel, PgSqlErrorCode, PgTryBuilder};
use snowflake_core::health::RegistryTable;
use std::ffi::CStr;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::time::{Duration, Instant};

/// How often the sync worker looks for changes, and the launcher at its
/// sync worker.
const POLL: Duration = Duration::from_secs(1);
/// How often it refreshes counters and high-water times when no claim or
/// release happened.
const REFRESH: Duration = Duration::from_secs(10);
/// The launcher's first and longest pause while the database is missing.
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

const LAUNCHER: &str = "snowflake_id registry launcher";
const SYNC: &str = "snowflake_id registry";

/// Copies every slot into the table (the extension's schema is on the
/// search_path, after pg_catalog).
const UPSERT: &str = r#"
INSERT INTO snowflake_worker_registry AS r
       (worker_id, pid, database, role, application_name, claimed_at, released_at,
        claims, ids_issued, high_water, updated_at)
SELECT w.worker_id, w.pid, d.datname, o.rolname, w.application_name, w.claimed_at,
       w.released_at, w.claims, w.ids_issued, w.last_id_time, now()
  FROM snowflake_worker_status() w
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

/// Registers the launcher. Called from `_PG_init` while preloading.
pub fn init() {
    if !settings::registry_worker_enabled() {
        return;
    }
    BackgroundWorkerBuilder::new(LAUNCHER)
        .set_type(LAUNCHER)
        .set_library("snowflake_id")
        .set_function("snowflake_id_registry_launcher")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(10)))
        .load();
}

/// Reloads the configuration if a SIGHUP arrived.
fn reload_on_sighup() {
    if BackgroundWorker::sighup_received() {
        reload_config();
    }
}

fn reload_config() {
    // SAFETY: a plain call, as PostgreSQL's own processes make on SIGHUP.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// Whether a database of that name exists. Read from the shared catalog
/// pg_database with a plain scan: the launcher is connected to no database,
/// so neither the syscache nor pg_database's indexes are available.
fn database_exists(name: &str) -> bool {
    BackgroundWorker::transaction(|| {
        let mut found = false;
        // SAFETY: a catalog scan inside a transaction, as PostgreSQL's
        // autovacuum launcher makes it; each tuple is a pg_database row.
        unsafe {
            let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
            let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, lock);
            let scan = pg_sys::systable_beginscan(
                rel,
                pg_sys::InvalidOid,
                false,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            );
            loop {
                let tuple = pg_sys::systable_getnext(scan);
                if tuple.is_null() {
                    break;
                }
                let row = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
                let datname = CStr::from_ptr((*row).datname.data.as_ptr());
                if datname.to_bytes() == name.as_bytes() {
                    found = true;
                    break;
                }
            }
            pg_sys::systable_endscan(scan);
            pg_sys::table_close(rel, lock);
        }
        found
    })
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_id_registry_launcher(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    crate::workers::pin_search_path();
    let mut backoff = FIRST_BACKOFF;
    let mut missing_reported = false;
    loop {
        reload_on_sighup();
        let Some(database) = settings::registry_database() else {
            return;
        };
        if !database_exists(&database) {
            // No registry table to read: claims need not wait for it.
            registry_read(None);
            found(RegistryTable::NoDatabase);
            if !missing_reported {
                pg_sys::panic::ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_INVALID_CATALOG_NAME,
                    format!("snowflake_id registry: database \"{database}\" does not exist"),
                    "snowflake_id",
                )
                .set_detail("snowflake_id.registry_database names the database whose snowflake_worker_registry table the registry worker keeps; until it exists no registry is kept (IDs are made as usual).")
                .set_hint("Create the database and run CREATE EXTENSION snowflake_id in it, or set snowflake_id.registry_database to an existing database (or to '' for no registry worker) and restart. The worker checks again every few minutes, and at once on a reload.")
                .report(PgLogLevel::WARNING);
                missing_reported = true;
            }
            if !BackgroundWorker::wait_latch(Some(backoff)) {
                return;
            }
            // A reload (SIGHUP sets the latch) checks again at once.
            if BackgroundWorker::sighup_received() {
                reload_config();
            } else {
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            continue;
        }
        if missing_reported {
            pgrx::log!("snowflake_id registry: database \"{database}\" exists now");
            missing_reported = false;
        }
        backoff = FIRST_BACKOFF;
        let worker = BackgroundWorkerBuilder::new(SYNC)
            .set_type(SYNC)
            .set_library("snowflake_id")
            .set_function("snowflake_id_registry_main")
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(None)
            // SAFETY: reading this process's pid.
            .set_notify_pid(unsafe { pg_sys::MyProcPid })
            .load_dynamic();
        let Ok(worker) = worker else {
            registry_read(None);
            pgrx::warning!(
                "snowflake_id registry: could not start the registry worker: no free background worker slot (raise max_worker_processes)"
            );
            if !BackgroundWorker::wait_latch(Some(MAX_BACKOFF)) {
                return;
            }
            continue;
        };
        if !watch(&worker) {
            let _ = worker.terminate();
            return;
        }
    }
}

/// Waits while the sync worker runs; false when this launcher must exit.
fn watch(worker: &DynamicBackgroundWorker) -> bool {
    loop {
        if !BackgroundWorker::wait_latch(Some(POLL)) {
            return false;
        }
        reload_on_sighup();
        match worker.pid() {
            Ok(_) | Err(BackgroundWorkerStatus::NotYetStarted) => {}
            Err(BackgroundWorkerStatus::PostmasterDied) => return false,
            Err(_) => {
                // Stopped: check the database again before a new start.
                return BackgroundWorker::wait_latch(Some(FIRST_BACKOFF));
            }
        }
    }
}

/// What a sync pass found.
enum Sync {
    Done,
    NoExtension,
    Failed,
}

/// Copies the slots into the table, in a transaction of its own. A failed
/// write (a changed table, a lock timeout...) is logged and rolled back;
/// the next pass tries again.
fn sync_once() -> Sync {
    PgTryBuilder::new(|| BackgroundWorker::transaction(sync))
        .catch_others(|e| {
            let message = caught_message(&e);
            // SAFETY: back to a clean state after an error, as PostgreSQL's
            // own background processes do.
            unsafe { pg_sys::AbortOutOfAnyTransaction() };
            pgrx::warning!(
                "snowflake_id registry: could not update snowflake_worker_registry: {message}"
            );
            Sync::Failed
        })
        .execute()
}

fn sync() -> Sync {
    let Some(schema) = sql::extension_schema() else {
        return Sync::NoExtension;
    };
    // The worker's own rows skip the table's triggers (this transaction
    // only): they merge restored rows and raise the floor from them, which
    // for this server's own marks is nothing to do. Names resolve in
    // pg_catalog first, then in the extension's schema.
    if let Err(e) = Spi::run(&format!(
        "SET LOCAL session_replication_role = replica; \
         SET LOCAL search_path = pg_catalog, {schema}, pg_temp"
    )) {
        pgrx::warning!("snowflake_id registry: could not update snowflake_worker_registry: {e}");
        return Sync::Failed;
    }
    // Backfill: grants into the table and back, the set-aside ids' live
    // history (`registry_backfill`).
    let result = Spi::run(UPSERT).and_then(|()| match shmem::header() {
        Some(header) => registry_backfill::pass(header).map(|_| ()),
        None => Ok(()),
    });
    match result {
        Ok(()) => {
            pgrx::debug1!("snowflake_id registry: snowflake_worker_registry is up to date");
            Sync::Done
        }
        Err(e) => {
            pgrx::warning!(
                "snowflake_id registry: could not update snowflake_worker_registry: {e}"
            );
            Sync::Failed
        }
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_id_registry_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let Some(database) = settings::registry_database() else {
        return;
    };
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    crate::workers::pin_search_path();
    crate::workers::commit_locally();
    let Some(header) = shmem::header() else {
        return;
    };
    if header.registry_pending.load(Relaxed) {
        registry_read(read_high_water_once());
    }
    let mut synced_changes = None;
    let mut synced_at = Instant::now();
    let mut missing_reported = false;
    while BackgroundWorker::wait_latch(Some(POLL)) {
        reload_on_sighup();
        let changes = activity(header);
        if synced_changes == Some(changes) && synced_at.elapsed() < REFRESH {
            continue;
        }
        match sync_once() {
            Sync::Done => {
                synced_changes = Some(changes);
                missing_reported = false;
                found(RegistryTable::Kept);
            }
            // Try again after REFRESH (or the next claim), not every POLL.
            Sync::Failed => synced_changes = Some(changes),
            Sync::NoExtension if !missing_reported => {
                found(RegistryTable::NoExtension);
                pg_sys::panic::ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                    format!("snowflake_id registry: database \"{database}\" has no snowflake_id extension: IDs after pg_upgrade or a restore rest on the clock alone"),
                    "snowflake_id",
                )
                .set_detail("Its table snowflake_worker_registry keeps new IDs above the IDs made before pg_upgrade or a dump and restore; until the extension is created there no such table is kept.")
                .set_hint(format!("Run CREATE EXTENSION snowflake_id in database \"{database}\", or set snowflake_id.registry_database to a database that has it and restart. The registry worker keeps the table once the extension is there; snowflake_health() shows it as registry_table."))
                .report(PgLogLevel::WARNING);
                missing_reported = true;
            }
            Sync::NoExtension => found(RegistryTable::NoExtension),
        }
        synced_at = Instant::now();
    }
    // Shutting down (SIGTERM): one last copy, so that the table's
    // high-water marks cover the IDs made since the last pass. pg_upgrade
    // and a dump taken after a clean shutdown then carry every ID's time.
    if matches!(sync_once(), Sync::Failed) {
        pgrx::log!(
            "snowflake_id registry: no final update of snowflake_worker_registry at shutdown"
        );
    }
}

/// Records what the registry worker found of its table, for
/// `snowflake_health()`.
fn found(table: RegistryTable) {
    if let Some(header) = shmem::header() {
        header.set_registry_table(table);
    }
}

/// What has happened to the slots: claims and releases, and IDs made. The
/// table is copied when it changes (at most once a POLL), so its
/// high-water marks lag the IDs made by about a second.
fn activity(header: &shmem::Header) -> u64 {
    let changes = header
        .changes
        .load(Relaxed)
        .wrapping_add(header.backfill().changes.load(Relaxed));
    let slots = header.slots().iter().fold(changes, |sum, slot| {
        sum.wrapping_add(slot.ids_issued.load(Relaxed))
    });
    header.holders().iter().fold(slots, |sum, holder| {
        sum.wrapping_add(holder.ids_issued.load(Relaxed))
    })
}

/// Lets claims go once the registry's high-water marks are in force (or
/// there are none to read), logging what was found.
fn registry_read(high_water_ms: Option<i64>) {
    let Some(header) = shmem::header() else {
        return;
    };
    if let Some(ms) = high_water_ms {
        let layout = settings::layout();
        crate::durability::reservation::advance_past(header, ms, layout);
        pgrx::log!(
            "snowflake_id registry: new IDs start above the registry's high-water mark {}",
            snowflake_core::layout::format_unix_ms(ms)
        );
    }
    header.registry_pending.store(false, Release);
}

/// The newest high-water mark (Unix ms) in the registry table, read once at
/// startup: after pg_upgrade it may be the only record of the IDs made by
/// the old cluster. `None` when there is no table or no mark; a failed
/// read is logged (claims then rely on the state file and WAL alone).
fn read_high_water_once() -> Option<i64> {
    PgTryBuilder::new(|| {
        BackgroundWorker::transaction(|| {
            let schema = sql::extension_schema()?;
            Spi::get_one::<i64>(&format!(
                "SELECT (extract(epoch FROM max(high_water)) * 1000)::int8
                   FROM {schema}.snowflake_worker_registry"
            ))
            .ok()
            .flatten()
        })
    })
    .catch_others(|e| {
        // SAFETY: back to a clean state after an error, as in sync_once.
        unsafe { pg_sys::AbortOutOfAnyTransaction() };
        pgrx::warning!(
            "snowflake_id registry: could not read the high-water marks of snowflake_worker_registry: {}",
            caught_message(&e)
        );
        None
    })
    .execute()
}
