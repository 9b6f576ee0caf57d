//! Creating shared memory: the request and startup hooks, and the first
//! contents of the header, the slots, the holders and the backfill grants.
//! The decisions are made elsewhere (the layout and fleet by the load
//! phase, the recorded set-aside ids by `snowflake_core::backfill_ids`);
//! this file stores them. Lock order as in `mod.rs`: only
//! `AddinShmemInitLock`, held while the memory is created.

use super::{Backfill, Header, Holder, LeaseMode, Slot, Startup, HEADER, NO_LEASE, TRANCHE};
use crate::settings;
use pgrx::pg_sys;
use snowflake_core::backfill::Space;
use snowflake_core::backfill_ids;
use snowflake_core::generator::GeneratorState;
use snowflake_core::layout::Layout;
use std::mem::size_of;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8};

/// What the reservation knows when shared memory is first created: the
/// floor (Unix ms; `i64::MIN` when nothing was recorded) and the recorded
/// layout.
pub type StartupState = fn(&Layout) -> Startup;

/// This process's hook chain: written once by `init` in `_PG_init`, read
/// when PostgreSQL calls the hooks (per-process state: a parking_lot lock,
/// never held across a call into PostgreSQL).
struct Hooks {
    startup_state: Option<StartupState>,
    prev_request: pg_sys::shmem_request_hook_type,
    prev_startup: pg_sys::shmem_startup_hook_type,
}

static HOOKS: parking_lot::Mutex<Hooks> = parking_lot::const_mutex(Hooks {
    startup_state: None,
    prev_request: None,
    prev_startup: None,
});

/// Installs the shared-memory hooks. `startup_state` is called once, when
/// the memory is created. Called from `_PG_init` only while preloading.
pub fn init(startup_state: StartupState) {
    let mut hooks = HOOKS.lock();
    hooks.startup_state = Some(startup_state);
    // SAFETY: hooks are process-global pointers that PostgreSQL expects
    // extensions to chain in _PG_init; this runs once, in the postmaster.
    unsafe {
        hooks.prev_request = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        hooks.prev_startup = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

fn shmem_size() -> usize {
    let nslots = settings::layout().max_worker_id() as usize + 1;
    size_of::<Header>()
        + nslots * size_of::<Slot>()
        + nholders() as usize * size_of::<Holder>()
        + size_of::<Backfill>()
}

/// Backends that can hold a worker id (set before the shmem hooks run).
fn nholders() -> u32 {
    // SAFETY: MaxBackends is set before shared memory is requested.
    u32::try_from(unsafe { pg_sys::MaxBackends }).unwrap_or(0)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: chaining the previous hook, then requesting space and locks
    // during the shmem request phase, as PostgreSQL requires.
    let prev = HOOKS.lock().prev_request;
    unsafe {
        if let Some(prev) = prev {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(shmem_size());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 2);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: chaining the previous hook, as PostgreSQL requires.
    let prev = HOOKS.lock().prev_startup;
    unsafe {
        if let Some(prev) = prev {
            prev();
        }
    }
    let layout = *settings::layout();
    let mut found = false;
    // SAFETY: ShmemInitStruct under AddinShmemInitLock is the documented way
    // to create or attach an add-in's shared memory; the size matches the
    // request.
    let base = unsafe {
        pg_sys::LWLockAcquire(addin_shmem_init_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
        pg_sys::ShmemInitStruct(TRANCHE.as_ptr(), shmem_size(), &mut found)
    };
    let header = base as *mut Header;
    if !found {
        let read = HOOKS.lock().startup_state;
        let startup = match read {
            Some(read) => read(&layout),
            None => Startup {
                floor_ms: i64::MIN,
                layout,
                backfill_after_ms: i64::MIN,
                backfill_ids: String::new(),
                backfill_grants: Vec::new(),
            },
        };
        // SAFETY: we hold AddinShmemInitLock and nobody else can see the
        // memory yet; it is `shmem_size()` bytes, as requested.
        unsafe { create(header, &layout, &startup) };
    }
    // SAFETY: releasing the lock taken above.
    unsafe { pg_sys::LWLockRelease(addin_shmem_init_lock()) };
    HEADER.store(header, Release);
}

/// Writes the first contents of shared memory at `header`: the header,
/// then zeroed slots, holders and backfill, then what `startup` recorded.
///
/// # Safety
/// `header` points to `shmem_size()` fresh bytes that no other process can
/// see yet (AddinShmemInitLock is held), and the tranche has two locks.
unsafe fn create(header: *mut Header, layout: &Layout, startup: &Startup) {
    let nslots = layout.max_worker_id() + 1;
    let mode = if settings::leases_enabled() {
        LeaseMode::Undecided
    } else {
        LeaseMode::Local
    };
    // SAFETY: as the caller promises; all-zero bytes are a valid value for
    // every (atomic) field of the slots, holders and backfill.
    unsafe {
        let locks = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
        header.write(Header {
            lock: &mut (*locks).lock,
            reserve_lock: &mut (*locks.add(1)).lock,
            nslots,
            nholders: nholders(),
            release_counter: AtomicU64::new(0),
            signed_grants: super::SignedGrants::new(),
            changes: AtomicU64::new(0),
            reserved_until_ms: AtomicI64::new(startup.floor_ms),
            floor_ms: AtomicI64::new(startup.floor_ms),
            newest_tick: AtomicI64::new(-1),
            registry_pending: AtomicBool::new(settings::registry_worker_enabled()),
            layout_changed: AtomicBool::new(startup.layout != *layout),
            registry_table: AtomicU8::new(0),
            recorded_layout: startup.layout,
            // All zeros, then the mode.
            lease: std::mem::zeroed(),
        });
        (*header).lease.set_mode(mode, Relaxed);
        let first = header.add(1) as *mut Slot;
        std::ptr::write_bytes(first, 0, nslots as usize);
        let holders = first.add(nslots as usize) as *mut Holder;
        std::ptr::write_bytes(holders, 0, nholders() as usize);
        let backfill = holders.add(nholders() as usize) as *mut Backfill;
        std::ptr::write_bytes(backfill, 0, 1);
        init_backfill(&*backfill, layout, startup);
        let slots = std::slice::from_raw_parts(first, nslots as usize);
        init_slots(slots, layout, mode);
    }
}

/// The backfill grants the state file recorded, and which set-aside ids it
/// records from now on (`backfill_ids::at_start` decides).
fn init_backfill(backfill: &Backfill, layout: &Layout, startup: &Startup) {
    backfill.after_ms.store(startup.backfill_after_ms, Relaxed);
    for &(bucket, grants) in &startup.backfill_grants {
        if let Some(cell) = backfill.grants.get(bucket as usize) {
            backfill.used.store(true, Relaxed);
            cell.store(grants, Relaxed);
        }
    }
    let recorded = backfill_ids::at_start(
        backfill_ids::AtStart {
            recorded: &startup.backfill_ids,
            had_grants: !startup.backfill_grants.is_empty(),
            had_state: startup.floor_ms > i64::MIN,
        },
        settings::backfill_space().map(Space::ids),
        layout.max_worker_id(),
    );
    backfill.recorded_ids.set(&recorded.ids);
    backfill
        .newly_set_aside
        .store(recorded.newly_set_aside, Relaxed);
    backfill.floor_at_start_ms.store(startup.floor_ms, Relaxed);
    backfill.ids_changed.store(recorded.changed, Relaxed);
}

/// Every slot starts at a fresh generator's position, and may make IDs at
/// once only when worker ids are this server's own (leased ones wait for a
/// lease).
fn init_slots(slots: &[Slot], layout: &Layout, mode: LeaseMode) {
    let fresh = GeneratorState::new(layout).word(layout);
    let limit = match mode {
        LeaseMode::Local => i64::MAX,
        LeaseMode::Undecided | LeaseMode::Registry | LeaseMode::Citus => NO_LEASE,
    };
    for slot in slots {
        slot.position.store(fresh, Relaxed);
        slot.limit_tick.store(limit, Relaxed);
        slot.stop_ms.store(limit, Relaxed);
    }
}

/// PostgreSQL's `AddinShmemInitLock` (`&MainLWLockArray[21].lock`, a C macro
/// bindgen does not translate).
unsafe fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    // SAFETY: MainLWLockArray holds the individual LWLocks; index 21 is
    // AddinShmemInitLock in every supported major version.
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(21)).lock }
}
