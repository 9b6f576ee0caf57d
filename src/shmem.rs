//! Shared memory: one slot of generator state per worker id, and the
//! reservation that makes IDs safe across restarts.
//!
//! Layout: a [`Header`] followed by `2^worker_bits` [`Slot`]s, sized when the
//! server starts (the layout settings are postmaster settings).
//!
//! Locking rules (read these before touching the structures):
//! - `Header::lock`, the LWLock of tranche "snowflake_id", guards the *claim*
//!   fields of every slot (`holder_pid` .. `release_order`) and
//!   `Header::release_counter`: taken exclusive to claim or release a worker
//!   id, shared to list the slots.
//! - A slot's *generator* fields are written only by the backend that holds
//!   the slot's claim, with relaxed atomic stores and no lock; others read
//!   them only to report. When a claim changes hands the LWLock release and
//!   acquire order the old holder's last writes before the new holder reads.
//! - `Header::reserve_lock` (a second LWLock of the tranche) serialises
//!   extending the reservation. `reserved_until` only grows, and only after
//!   the state file holding the new value is durable; the hot path reads it
//!   without a lock.
//! - Every field is an atomic, so concurrent readers never see undefined
//!   behaviour, only (for reports) a value that is a moment old.

use crate::generator::GeneratorState;
use crate::gucs;
use crate::layout::Layout;
use pgrx::pg_sys;
use serde::{Deserialize, Serialize};
use std::mem::size_of;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering::*,
};

/// Bytes kept of a holder's application_name (PostgreSQL's NAMEDATALEN).
pub const APPLICATION_NAME_LEN: usize = 64;
/// Name of the LWLock tranche (visible in pg_stat_activity.wait_event).
const TRANCHE: &std::ffi::CStr = c"snowflake_id";
/// How far beyond the newest ID the state file reserves time, in ms: the
/// state file is written at most once per this interval per server.
pub const RESERVE_MS: i64 = 250;
/// The state file, relative to the data directory (the server's cwd).
pub const STATE_FILE: &str = "snowflake_id.state";

#[repr(C)]
pub struct Header {
    lock: *mut pg_sys::LWLock,
    reserve_lock: *mut pg_sys::LWLock,
    nslots: u32,
    /// Bumped on every release; slots remember theirs to pick the least
    /// recently released free id first.
    pub release_counter: AtomicU64,
    /// Bumped on every claim and release, so the registry worker knows when
    /// to copy the slots into the registry table.
    pub changes: AtomicU64,
    /// Unix ms up to which IDs may be issued: persisted in the state file.
    pub reserved_until_ms: AtomicI64,
    /// Unix ms at or below which IDs may already have been issued by an
    /// earlier life of this data directory (the state file at startup, WAL
    /// replay from a primary, an accepted layout change). Every claim starts
    /// its generator above it.
    pub floor_ms: AtomicI64,
    /// The layout recorded in the state file differs from the one in use.
    pub layout_changed: AtomicBool,
    /// The layout recorded in the state file at startup.
    pub recorded_layout: Layout,
}

/// The shared state of one worker id.
#[repr(C)]
pub struct Slot {
    // Claim fields: under Header::lock.
    pub holder_pid: AtomicI32,
    pub holder_db: AtomicU32,
    pub holder_role: AtomicU32,
    pub claimed_at: AtomicI64,
    pub released_at: AtomicI64,
    pub release_order: AtomicU64,
    pub claims: AtomicU64,
    /// The holder's application_name, NUL-padded (NAMEDATALEN bytes).
    pub application_name: [AtomicU8; APPLICATION_NAME_LEN],
    // Generator fields: written by the holder only.
    pub last_tick: AtomicI64,
    pub sequence: AtomicU32,
    pub last_seen: AtomicI64,
    pub ids_issued: AtomicU64,
    pub sequence_exhausted: AtomicU64,
    pub clock_backward: AtomicU64,
    pub max_drift: AtomicI64,
}

impl Slot {
    pub fn set_application_name(&self, name: &[u8]) {
        for (i, byte) in self.application_name.iter().enumerate() {
            byte.store(name.get(i).copied().unwrap_or(0), Relaxed);
        }
    }

    pub fn application_name(&self) -> String {
        let bytes: Vec<u8> = self
            .application_name
            .iter()
            .map(|b| b.load(Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The format version written into the state file.
const STATE_FILE_VERSION: u32 = 1;

/// What the state file holds.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct StateFile {
    version: u32,
    layout: Layout,
    /// Unix ms up to which IDs may have been issued.
    reserved_until_ms: i64,
}

static HEADER: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());

/// The shared header, or `None` when the library was not preloaded.
pub fn header() -> Option<&'static Header> {
    let ptr = HEADER.load(Acquire);
    // SAFETY: set once in the startup hook to memory that lives as long as
    // the server; every field is an atomic or written before publication.
    unsafe { ptr.as_ref() }
}

impl Header {
    pub fn slots(&self) -> &[Slot] {
        // SAFETY: the startup hook allocated nslots slots right after the
        // header and initialised them.
        unsafe {
            let first = (self as *const Header).add(1) as *const Slot;
            std::slice::from_raw_parts(first, self.nslots as usize)
        }
    }

    /// Whether this backend holds the slot table's lock.
    pub fn lock_held_by_me(&self) -> bool {
        // SAFETY: a lookup in this backend's own list of held LWLocks.
        unsafe { pg_sys::LWLockHeldByMe(self.lock) }
    }

    pub fn lock(&self, exclusive: bool) -> LockGuard {
        let mode = if exclusive {
            pg_sys::LWLockMode::LW_EXCLUSIVE
        } else {
            pg_sys::LWLockMode::LW_SHARED
        };
        LockGuard::acquire(self.lock, mode)
    }

    /// Takes the reservation lock (exclusive).
    fn reserve_lock(&self) -> LockGuard {
        LockGuard::acquire(self.reserve_lock, pg_sys::LWLockMode::LW_EXCLUSIVE)
    }

    /// Makes sure the state file reserves at least up to `unix_ms`, writing
    /// it (durably) when needed. Cheap when already reserved.
    #[inline]
    pub fn reserve(&self, unix_ms: i64, layout: &Layout) {
        if unix_ms > self.reserved_until_ms.load(Acquire) {
            self.extend_reservation(unix_ms, layout);
        }
    }

    #[cold]
    fn extend_reservation(&self, unix_ms: i64, layout: &Layout) {
        let _guard = self.reserve_lock();
        if unix_ms <= self.reserved_until_ms.load(Acquire) {
            return;
        }
        let until = unix_ms + RESERVE_MS;
        write_state_file(layout, until);
        crate::wal::log_reservation(until);
        self.reserved_until_ms.store(until, Release);
    }

    /// Raises the floor and the reservation to `until_ms` (WAL replay of a
    /// primary's reservation), writing the state file when it grows.
    pub fn replay_reservation(&self, until_ms: i64) {
        let _guard = self.reserve_lock();
        self.floor_ms.fetch_max(until_ms, AcqRel);
        if until_ms > self.reserved_until_ms.load(Acquire) {
            let layout = if self.layout_changed.load(Acquire) {
                self.recorded_layout
            } else {
                *gucs::layout()
            };
            write_state_file(&layout, until_ms);
            self.reserved_until_ms.store(until_ms, Release);
        }
    }
}

/// Releases an LWLock when dropped (also when an error unwinds).
pub struct LockGuard(*mut pg_sys::LWLock);

impl LockGuard {
    fn acquire(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type) -> LockGuard {
        // SAFETY: only called with our tranche's locks, which live in
        // shared memory for the life of the server.
        unsafe { pg_sys::LWLockAcquire(lock, mode) };
        LockGuard(lock)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // SAFETY: we acquired this lock and have not released it. If an
        // error is being raised, PostgreSQL's LWLockReleaseAll may run later
        // and finds nothing to release.
        unsafe {
            if pg_sys::LWLockHeldByMe(self.0) {
                pg_sys::LWLockRelease(self.0)
            }
        }
    }
}

/// Installs the shared-memory hooks. Called from `_PG_init` only while
/// preloading.
pub fn init() {
    // SAFETY: hooks are process-global pointers that PostgreSQL expects
    // extensions to chain in _PG_init; this runs once, in the postmaster.
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

fn shmem_size() -> usize {
    let nslots = gucs::layout().max_worker_id() as usize + 1;
    size_of::<Header>() + nslots * size_of::<Slot>()
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: chaining the previous hook, then requesting space and locks
    // during the shmem request phase, as PostgreSQL requires.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(shmem_size());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 2);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: chaining the previous hook, as PostgreSQL requires.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            prev();
        }
    }
    let layout = *gucs::layout();
    let nslots = layout.max_worker_id() + 1;
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
        let (floor_ms, recorded) = read_state_file(&layout);
        // SAFETY: we hold AddinShmemInitLock and nobody else can see the
        // memory yet; the tranche was requested with two locks.
        unsafe {
            let locks = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
            header.write(Header {
                lock: &mut (*locks).lock,
                reserve_lock: &mut (*locks.add(1)).lock,
                nslots,
                release_counter: AtomicU64::new(0),
                changes: AtomicU64::new(0),
                reserved_until_ms: AtomicI64::new(floor_ms),
                floor_ms: AtomicI64::new(floor_ms),
                layout_changed: AtomicBool::new(recorded != layout),
                recorded_layout: recorded,
            });
            // All-zero bytes are a valid value for every (atomic) field.
            let first = header.add(1) as *mut Slot;
            std::ptr::write_bytes(first, 0, nslots as usize);
            let fresh = GeneratorState::new(&layout);
            for i in 0..nslots as usize {
                let slot = &*first.add(i);
                slot.last_tick.store(fresh.last_tick, Relaxed);
                slot.sequence.store(fresh.sequence, Relaxed);
                slot.last_seen.store(fresh.last_seen, Relaxed);
            }
        }
    }
    // SAFETY: releasing the lock taken above.
    unsafe { pg_sys::LWLockRelease(addin_shmem_init_lock()) };
    HEADER.store(header, Release);
}

/// PostgreSQL's `AddinShmemInitLock` (`&MainLWLockArray[21].lock`, a C macro
/// bindgen does not translate).
unsafe fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    // SAFETY: MainLWLockArray holds the individual LWLocks; index 21 is
    // AddinShmemInitLock in every supported major version.
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(21)).lock }
}

/// Reads the state file at server start: returns the reservation floor
/// (Unix ms; `i64::MIN` when there is no file) and the recorded layout
/// (`layout` itself when nothing is recorded).
fn read_state_file(layout: &Layout) -> (i64, Layout) {
    match std::fs::read_to_string(STATE_FILE) {
        Ok(text) => match serde_json::from_str::<StateFile>(&text) {
            Ok(state) => (state.reserved_until_ms, state.layout),
            // Without the file we cannot know how far IDs went, or which
            // layout made them: refuse rather than guess.
            Err(e) => crate::errors::state_file_unreadable(STATE_FILE, &e.to_string()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (i64::MIN, *layout),
        Err(e) => crate::errors::state_file("read", STATE_FILE, e),
    }
}

/// Writes the state file durably (temporary file, fsync, rename, fsync of
/// the directory).
fn write_state_file(layout: &Layout, reserved_until_ms: i64) {
    use std::io::Write;
    let state = StateFile {
        version: STATE_FILE_VERSION,
        layout: *layout,
        reserved_until_ms,
    };
    let tmp = format!("{STATE_FILE}.tmp");
    let text = match serde_json::to_string(&state) {
        Ok(text) => text,
        Err(e) => crate::errors::internal(&format!("could not encode the state file: {e}")),
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, STATE_FILE)?;
        std::fs::File::open(".")?.sync_all()
    })();
    if let Err(e) = result {
        crate::errors::state_file("write", STATE_FILE, e);
    }
}

/// Adopts `layout` after the server started with a layout other than the
/// recorded one: claims start above every ID the old layout can have
/// issued, and the state file records the new layout. Returns the first
/// tick new IDs may use. Nothing changes when `layout` cannot get above the
/// old IDs, or only after `latest_ms` (the generator could not issue until
/// then). No claim exists yet: claims are refused until the layout is
/// accepted.
pub fn accept_layout(header: &Header, layout: &Layout, latest_ms: i64) -> Result<i64, AcceptError> {
    let _guard = header.reserve_lock();
    let until = header.reserved_until_ms.load(Acquire);
    let first = layout
        .first_tick_above(&header.recorded_layout, until)
        .ok_or(AcceptError::CannotRise)?
        .max(layout.tick_at(until) + 1);
    if layout.tick_start_unix_ms(first) > latest_ms {
        return Err(AcceptError::NotUntil(layout.tick_start_unix_ms(first)));
    }
    // Every ID at or below the tick before `first` counts as issued.
    let floor_ms = layout.tick_start_unix_ms(first) - 1;
    let until = until.max(floor_ms);
    write_state_file(layout, until);
    header.floor_ms.fetch_max(floor_ms, AcqRel);
    header.reserved_until_ms.store(until, Release);
    header.layout_changed.store(false, Release);
    Ok(first)
}

/// Why a layout cannot be adopted.
pub enum AcceptError {
    /// No ID of the new layout is above the old IDs.
    CannotRise,
    /// New IDs would only get above the old ones at this Unix ms.
    NotUntil(i64),
}
