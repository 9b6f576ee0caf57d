//! Shared memory: the structures and the lock guard; `startup` holds the
//! hooks that create it. No policy lives here: the reservation (state file,
//! WAL, floor) is in `reservation`, the claims in `claims`, the start-up
//! decisions in the load phase (`settings`) and `snowflake_core`.
//!
//! Layout: a [`Header`] followed by `2^worker_bits` [`Slot`]s, one
//! [`Holder`] per backend (`MaxBackends`) and the [`Backfill`] grants, sized
//! when the server starts (the layout settings are postmaster settings).
//!
//! Locking rules (read these before touching the structures):
//! - `Header::lock`, the first LWLock of tranche "snowflake_id", guards the
//!   *claim* fields of every slot (`holder_pid` .. `release_order`) and
//!   `Header::release_counter`: taken exclusive to claim or release a worker
//!   id, shared to list the slots.
//! - A slot's `position` (tick and sequence of the worker id's last ID, one
//!   word, see `generator::pack`) is shared by every session holding the
//!   id: read relaxed and advanced only by compare-and-swap, so it only
//!   grows (a session alone on the id may take sequence numbers of the
//!   tick ahead of its last ID with it, see `claims`); a claim raises it to
//!   the floor with `fetch_max`. Its counters
//!   (`ids_issued` ..) are sums of what each holder publishes (`fetch_add`,
//!   `fetch_max` for `max_drift`), no lock. Others read them only to report.
//! - A [`Holder`] entry's `pid` and `worker_id` change under `Header::lock`
//!   (exclusive); its `ids_issued` is stored by its own backend alone, and
//!   moved into the slot's under `Header::lock` when that backend exits.
//! - `Header::reserve_lock` (the second LWLock) serialises changing the
//!   reservation (`reserved_until_ms`, the state file, the layout flags).
//!   `reserved_until_ms` only grows, and only after the state file holding
//!   the new value is durable; the hot path reads it without a lock.
//!   Backends extending the reservation take it only conditionally and
//!   otherwise sleep on their latch, so none waits uninterruptibly while
//!   another fsyncs. `floor_ms` only grows (`fetch_max`, no lock).
//! - `Header::newest_tick` is the server-wide newest ID tick: raised with
//!   `fetch_max` only when a backend moves to a new tick, read relaxed, no
//!   lock (see `generator`, rule 6).
//! - `Header::registry_pending` is set at startup and only ever cleared
//!   (Release), by the registry worker once the floor it read is in force;
//!   claims read it (Acquire) before they start a generator.
//! - `Header::lease` is written by the lease worker only (see
//!   `lease_worker`); backends read it. A slot's `limit_tick`, `stop_ms`
//!   and `lease_epoch` are written by the lease worker under `lock`
//!   (exclusive) when it activates or revokes a block (`Slot::set_lease`:
//!   epoch and stop, then limit with Release), and the stop and the limit
//!   are raised without the lock on renewals (`fetch_max`, the limit
//!   last); the hot path reads the limit with Acquire, then the stop and
//!   the epoch (`Slot::lease_view`).
//! - [`Backfill`]'s grant counters and its other fields change only under
//!   `Header::reserve_lock`, together with the state file that makes them
//!   durable (see `durability::backfill`); WAL replay raises a counter with
//!   `fetch_max` (the startup process alone). Reports read them relaxed.
//! - Every field is an atomic, so concurrent readers never see undefined
//!   behaviour, only (for reports) a value that is a moment old.
//!
//! Lock order: a backend never holds both LWLocks at once. Should that ever
//! be needed, take `lock` first, then `reserve_lock`. `AddinShmemInitLock`
//! is taken only in the startup hook, before either exists.

mod startup;

pub use startup::init;

use pgrx::pg_sys;
use snowflake_core::generator::GeneratorState;
use snowflake_core::health::RegistryTable;
use snowflake_core::layout::Layout;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering,
    Ordering::*,
};

/// Bytes kept of a holder's application_name (PostgreSQL's NAMEDATALEN).
pub const APPLICATION_NAME_LEN: usize = 64;
/// Name of the LWLock tranche (visible in pg_stat_activity.wait_event).
const TRANCHE: &std::ffi::CStr = c"snowflake_id";

#[repr(C)]
pub struct Header {
    lock: *mut pg_sys::LWLock,
    reserve_lock: *mut pg_sys::LWLock,
    nslots: u32,
    nholders: u32,
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
    /// The tick of the newest ID issued on this server (any worker id).
    pub newest_tick: AtomicI64,
    /// Set at startup while the registry worker has yet to read the
    /// high-water marks of the registry table (carried over by pg_upgrade
    /// or a restore): claims wait for it (see `claims`), so no ID is made
    /// before every floor the server can find is in force.
    pub registry_pending: AtomicBool,
    /// The layout recorded in the state file differs from the one in use.
    pub layout_changed: AtomicBool,
    /// What the registry worker last found of its table
    /// (`registry_table()`, `set_registry_table()`): for `snowflake_health()`.
    registry_table: AtomicU8,
    /// The layout recorded in the state file at startup.
    pub recorded_layout: Layout,
    /// Fleet leases: mode, registry, blocks held (see `lease_worker`).
    pub lease: LeaseState,
    /// On a registry: the highest grant count it signed a token for since
    /// the postmaster started, per database
    /// (`snowflake_core::registry::Server::signed_grants`).
    pub signed_grants: SignedGrants,
}

/// How many registry databases of one cluster keep their own signed count
/// from one postmaster start (`errors::registry_databases_full`).
pub const SIGNED_DATABASES: usize = 64;

/// The highest grant count signed in each registry database, and the
/// highest a committed lease call left in its row: a slot per database
/// OID, claimed by compare-and-swap from 0 (no lock), never given back
/// until the postmaster restarts. A database that finds no slot signs
/// nothing (its lease call is refused): a count it signed must be known,
/// or a reply whose call rolled back would read as a grant this registry
/// forgot.
pub struct SignedGrants {
    slots: [SignedSlot; SIGNED_DATABASES],
}

struct SignedSlot {
    oid: AtomicU32,
    signed: AtomicI64,
    left: AtomicI64,
}

impl SignedGrants {
    pub(crate) fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| SignedSlot {
                oid: AtomicU32::new(0),
                signed: AtomicI64::new(0),
                left: AtomicI64::new(0),
            }),
        }
    }

    /// Database `db`'s slot, claimed when it has none; `None` when every
    /// slot is another database's.
    fn slot(&self, db: u32) -> Option<&SignedSlot> {
        self.slots.iter().find(
            |slot| match slot.oid.compare_exchange(0, db, AcqRel, Acquire) {
                Ok(_) => true,
                Err(current) => current == db,
            },
        )
    }

    /// Records `grants` signed in database `db`; false when every slot is
    /// another database's (nothing recorded: it must not sign).
    #[must_use]
    pub fn record(&self, db: u32, grants: i64) -> bool {
        self.slot(db)
            .map(|slot| slot.signed.fetch_max(grants, AcqRel))
            .is_some()
    }

    /// The highest grant count signed in database `db` since the postmaster
    /// started (0: none; a database with no slot signed none).
    pub fn get(&self, db: u32) -> i64 {
        self.find(db).map_or(0, |slot| slot.signed.load(Acquire))
    }

    /// Records `grants` as the count a committed lease call left in
    /// database `db`'s row (after its commit).
    pub fn left(&self, db: u32, grants: i64) {
        if let Some(slot) = self.slot(db) {
            slot.left.fetch_max(grants, AcqRel);
        }
    }

    /// The highest count a committed lease call left in database `db`'s
    /// row since the postmaster started
    /// (`snowflake_core::registry::Server::row_grants_seen`).
    pub fn left_in(&self, db: u32) -> i64 {
        self.find(db).map_or(0, |slot| slot.left.load(Acquire))
    }

    fn find(&self, db: u32) -> Option<&SignedSlot> {
        self.slots.iter().find(|slot| slot.oid.load(Acquire) == db)
    }
}

#[cfg(test)]
mod signed_grants_tests {
    use super::{SignedGrants, SIGNED_DATABASES};

    #[test]
    fn each_database_keeps_its_own_count_and_one_past_the_slots_signs_nothing() {
        let s = SignedGrants::new();
        for db in 1..=SIGNED_DATABASES as u32 {
            assert!(s.record(db, i64::from(db) * 10));
        }
        assert!(s.record(3, 5), "a database keeps its slot");
        assert_eq!(s.get(3), 30, "the count only rises");
        assert!(s.record(3, 31));
        assert_eq!(s.get(3), 31);
        let past = SIGNED_DATABASES as u32 + 1;
        assert!(!s.record(past, 7), "no slot left");
        assert_eq!(s.get(past), 0);
        s.left(past, 9);
        assert_eq!(s.left_in(past), 0);
        // What calls left in the row, apart from what was signed.
        s.left(3, 12);
        s.left(3, 11);
        assert_eq!((s.get(3), s.left_in(3)), (31, 12));
    }
}

/// Where this server's worker ids come from, as [`LeaseState::mode`] holds
/// it (one byte: [`LeaseState::mode`] and [`LeaseState::set_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LeaseMode {
    /// Its own `snowflake_id.worker_ids`: no leases.
    Local = 0,
    /// Not known yet: the lease worker is reading Citus's metadata.
    Undecided = 1,
    /// Leased from `snowflake_id.registry`.
    Registry = 2,
    /// Leased from the Citus coordinator.
    Citus = 3,
}

impl LeaseMode {
    /// The mode as `snowflake_config()` reports it.
    pub fn name(self) -> &'static str {
        match self {
            LeaseMode::Local => "local",
            LeaseMode::Undecided => "starting",
            LeaseMode::Registry => "registry",
            LeaseMode::Citus => "citus",
        }
    }
}

impl From<LeaseMode> for u8 {
    fn from(mode: LeaseMode) -> u8 {
        mode as u8
    }
}

impl TryFrom<u8> for LeaseMode {
    /// The byte that is no mode.
    type Error = u8;

    fn try_from(byte: u8) -> Result<Self, u8> {
        match byte {
            0 => Ok(LeaseMode::Local),
            1 => Ok(LeaseMode::Undecided),
            2 => Ok(LeaseMode::Registry),
            3 => Ok(LeaseMode::Citus),
            other => Err(other),
        }
    }
}

// The modes a lease file's target records, as the byte the file keeps
// (`lease_worker::file`); shared memory is read and written as `LeaseMode`.
pub const MODE_REGISTRY: u8 = LeaseMode::Registry as u8;
pub const MODE_CITUS: u8 = LeaseMode::Citus as u8;

/// A slot's `limit_tick` (and `stop_ms`) when it may not be used (no
/// lease).
pub const NO_LEASE: i64 = -1;

/// A slot's lease as a backend reads it ([`Slot::lease_view`]).
#[derive(Clone, Copy)]
pub struct LeaseView {
    /// No ID above this tick.
    pub limit: i64,
    /// No ID once the clock reads this Unix ms.
    pub stop_ms: i64,
    /// The lease's epoch: a claim made under another must claim again.
    pub epoch: u64,
}

impl LeaseView {
    /// Whether an ID of `tick`, made when the clock reads `now_ms`, is
    /// within the lease.
    #[inline(always)]
    pub fn admits(&self, tick: i64, now_ms: i64) -> bool {
        tick <= self.limit && now_ms < self.stop_ms
    }
}

/// What the lease worker publishes for backends and reports.
#[repr(C)]
pub struct LeaseState {
    pub mode: AtomicU8,
    /// Unix ms since which the registry has been unreachable (0: it is not).
    pub unreachable_since_ms: AtomicI64,
    /// Blocks held and usable now.
    pub blocks_held: AtomicU32,
    /// The earliest deadline of a held block, as Unix ms (0: none).
    pub deadline_ms: AtomicI64,
    /// Bumped whenever the lease worker changes a slot's lease.
    pub changes: AtomicU64,
    /// The lease worker's latch, set by claims that find no usable id.
    pub latch: AtomicPtr<pg_sys::Latch>,
    /// The registry, for messages (host, port, database; no password).
    pub registry: ShmText<160>,
    /// This data directory's node id.
    pub node_id: ShmText<40>,
    /// The connection string of the Citus coordinator leased from (built
    /// from Citus's metadata and `snowflake_id.registry_options`, which
    /// refuses passwords), for backfill's grant calls; empty otherwise.
    pub coordinator: ShmText<1024>,
    /// The last problem with the registry, for messages: room for the
    /// longest (what is wrong, the registry's address of up to 159 bytes,
    /// and what to do, as `problems::not_durable_text` writes it; 256
    /// bytes cut the setting to change from the durability problems).
    pub problem: ShmText<1024>,
}

impl LeaseState {
    /// The mode in force. Only modes are ever stored; a byte that is none
    /// would read as `Undecided`, under which no worker id is used.
    #[inline]
    pub fn mode(&self, order: Ordering) -> LeaseMode {
        LeaseMode::try_from(self.mode.load(order)).unwrap_or(LeaseMode::Undecided)
    }

    pub fn set_mode(&self, mode: LeaseMode, order: Ordering) {
        self.mode.store(mode.into(), order);
    }
}

/// A short text in shared memory: NUL-padded bytes, each an atomic, so a
/// reader sees at worst a mix of an old and a new value.
#[repr(C)]
pub struct ShmText<const N: usize>([AtomicU8; N]);

impl<const N: usize> ShmText<N> {
    /// Stores `text`, cut to `N - 1` bytes (at a character boundary).
    pub fn set(&self, text: &str) {
        let mut end = text.len().min(N - 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.set_bytes(&text.as_bytes()[..end]);
    }

    /// Stores `bytes` as they are, NUL-padded (cut to `N` bytes).
    pub fn set_bytes(&self, bytes: &[u8]) {
        for (i, byte) in self.0.iter().enumerate() {
            byte.store(bytes.get(i).copied().unwrap_or(0), Relaxed);
        }
    }

    /// The bytes up to the first NUL, as text (invalid UTF-8 replaced).
    pub fn get(&self) -> String {
        let bytes: Vec<u8> = self
            .0
            .iter()
            .map(|b| b.load(Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The shared state of one worker id.
#[repr(C)]
pub struct Slot {
    // Claim fields: under Header::lock.
    /// The session that claimed the id most recently, while it holds it (0
    /// otherwise); its database, role, claim time and application_name
    /// follow.
    pub holder_pid: AtomicI32,
    pub holder_db: AtomicU32,
    pub holder_role: AtomicU32,
    pub claimed_at: AtomicI64,
    pub released_at: AtomicI64,
    pub release_order: AtomicU64,
    pub claims: AtomicU64,
    /// Sessions holding the id now: free when 0.
    pub sessions: AtomicU32,
    /// Claims that found no free id and shared this one.
    pub shared_claims: AtomicU64,
    /// The holder's application_name, NUL-padded (NAMEDATALEN bytes).
    pub application_name: ShmText<APPLICATION_NAME_LEN>,
    // Generator fields: see the locking rules.
    /// The position of the last ID (`generator::pack`), or up to
    /// `claims::AHEAD` sequence numbers of its tick beyond it; -1 before any.
    pub position: AtomicI64,
    pub ids_issued: AtomicU64,
    pub sequence_exhausted: AtomicU64,
    pub clock_backward: AtomicU64,
    pub max_drift: AtomicI64,
    // Lease fields: written by the lease worker (see the header).
    /// The highest tick an ID of this worker id may have ([`NO_LEASE`]:
    /// none; `i64::MAX` without leases).
    pub limit_tick: AtomicI64,
    /// The Unix ms (this server's clock) from which no session makes an ID
    /// of this worker id: its block's deadline (`lease::stop_ms`;
    /// `i64::MAX` without leases). The limit bounds the IDs' times, which
    /// may be ahead of the clock; this bounds when they are made, also
    /// while the lease worker cannot revoke the block.
    pub stop_ms: AtomicI64,
    /// Bumped each time the lease worker gives this id a new lease; a
    /// claim made under another epoch must claim again.
    pub lease_epoch: AtomicU64,
}

impl Slot {
    /// The lease worker gives this id a new limit and stop (see
    /// `lease_worker`): the epoch and the stop first, then the limit with
    /// Release, so that a backend that reads the new limit
    /// ([`Slot::lease_view`]) also reads the new epoch and stop. Called
    /// under `lock` (exclusive).
    pub fn set_lease(&self, limit: i64, stop_ms: i64) {
        self.lease_epoch.fetch_add(1, Relaxed);
        self.stop_ms.store(stop_ms, Relaxed);
        self.limit_tick.store(limit, Release);
    }

    /// A renewal raises the limit and the stop (no lock): the stop first,
    /// so that a backend that reads the new limit reads the new stop.
    pub fn raise_lease(&self, limit: i64, stop_ms: i64) {
        self.stop_ms.fetch_max(stop_ms, Relaxed);
        self.limit_tick.fetch_max(limit, AcqRel);
    }

    /// The limit, the stop and the epoch, as the hot path reads them: a
    /// limit of a newer lease always comes with that lease's epoch and
    /// stop. (The other mismatch, an older limit with a newer epoch, only
    /// makes the backend claim again.)
    #[inline]
    pub fn lease_view(&self) -> LeaseView {
        let limit = self.limit_tick.load(Acquire);
        LeaseView {
            limit,
            stop_ms: self.stop_ms.load(Relaxed),
            epoch: self.lease_epoch.load(Relaxed),
        }
    }

    /// Adds a generator's counters since `published` to the slot's (but
    /// `ids_issued` only when `holder` is `None`: else it is stored in this
    /// backend's entry), and records them as published.
    #[inline]
    pub fn publish_counters(
        &self,
        state: &GeneratorState,
        published: &mut GeneratorState,
        holder: Option<&Holder>,
    ) {
        // Plain subtractions: a generator's counters only grow.
        match holder {
            Some(holder) => holder.ids_issued.store(state.ids_issued, Relaxed),
            None => {
                self.ids_issued
                    .fetch_add(state.ids_issued - published.ids_issued, Relaxed);
            }
        }
        if state.sequence_exhausted != published.sequence_exhausted {
            self.sequence_exhausted.fetch_add(
                state.sequence_exhausted - published.sequence_exhausted,
                Relaxed,
            );
        }
        if state.clock_backward != published.clock_backward {
            self.clock_backward
                .fetch_add(state.clock_backward - published.clock_backward, Relaxed);
        }
        if state.max_drift > published.max_drift {
            self.max_drift.fetch_max(state.max_drift, Relaxed);
        }
        *published = *state;
    }

    pub fn set_application_name(&self, name: &[u8]) {
        self.application_name.set_bytes(name);
    }

    pub fn application_name(&self) -> String {
        self.application_name.get()
    }
}

/// Backfill grants (see `snowflake_core::backfill`): per bucket, how many
/// grants were handed out.
#[repr(C)]
pub struct Backfill {
    /// No backfill ID at or before this Unix ms: an accepted layout change,
    /// or live IDs the set-aside ids made before they were set aside
    /// (`i64::MIN`: none).
    pub after_ms: AtomicI64,
    /// The registry worker has read the registry tables (the set-aside
    /// ids' live history, grants carried by pg_upgrade or a restore):
    /// backfill is refused until then.
    pub history_read: AtomicBool,
    /// The set-aside ids the grants were handed out for, as recorded in the
    /// state file (what the state file keeps writing).
    pub recorded_ids: ShmText<256>,
    /// Ids were set aside since the state file was written (it existed):
    /// their live IDs, if any, precede this start. Until the registry
    /// worker has decided what that refuses, the state file keeps its old
    /// list of ids, so that a restart decides again.
    pub newly_set_aside: AtomicBool,
    /// The state file's reservation at this start: above every ID made
    /// before it.
    pub floor_at_start_ms: AtomicI64,
    /// `snowflake_id.backfill_worker_ids` does not continue the recorded
    /// ids: backfill is refused until it does again.
    pub ids_changed: AtomicBool,
    /// WAL replay raised a counter the state file does not hold yet.
    pub replayed: AtomicBool,
    /// Bumped on every grant, for the registry worker.
    pub changes: AtomicU64,
    /// Some counter is above 0 (set before a counter is raised): until
    /// then, writing the state file skips reading the counters.
    pub used: AtomicBool,
    pub grants: [AtomicU32; BACKFILL_BUCKETS],
}

/// Buckets of backfill grants.
pub const BACKFILL_BUCKETS: usize = snowflake_core::backfill::BUCKETS as usize;

/// What the state file held at startup.
pub struct Startup {
    /// Unix ms up to which IDs may have been issued (`i64::MIN`: no file).
    pub floor_ms: i64,
    /// The layout that made them.
    pub layout: Layout,
    pub backfill_after_ms: i64,
    pub backfill_ids: String,
    /// `(bucket, grants)` of the buckets with grants.
    pub backfill_grants: Vec<(u32, u32)>,
}

/// What one backend publishes about its claim, in its own entry (indexed by
/// its process number): written by that backend alone, with relaxed
/// stores, so the hot path needs no atomic read-modify-write for it. At
/// exit its count moves into the slot's `ids_issued`, under
/// `Header::lock`; a report adds the live entries of a slot to the slot's.
#[repr(C)]
pub struct Holder {
    /// The backend's pid while it holds a worker id, else 0 (under
    /// `Header::lock`).
    pub pid: AtomicI32,
    /// The worker id it holds (when `pid` is not 0).
    pub worker_id: AtomicU32,
    /// IDs it has made on that worker id.
    pub ids_issued: AtomicU64,
}

/// The slot's position as the generator's shared position word.
impl snowflake_core::generator::SharedPosition for Slot {
    #[inline]
    fn load(&self) -> i64 {
        self.position.load(Relaxed)
    }
    #[inline]
    fn compare_exchange(&self, current: i64, new: i64) -> bool {
        self.position
            .compare_exchange(current, new, Relaxed, Relaxed)
            .is_ok()
    }
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
    /// What the registry worker last found of the registry table.
    pub fn registry_table(&self) -> RegistryTable {
        match self.registry_table.load(Relaxed) {
            1 => RegistryTable::NoDatabase,
            2 => RegistryTable::NoExtension,
            3 => RegistryTable::Kept,
            _ => RegistryTable::Unchecked,
        }
    }

    pub fn set_registry_table(&self, found: RegistryTable) {
        let byte = match found {
            RegistryTable::Unchecked | RegistryTable::Off => 0,
            RegistryTable::NoDatabase => 1,
            RegistryTable::NoExtension => 2,
            RegistryTable::Kept => 3,
        };
        self.registry_table.store(byte, Relaxed);
    }

    pub fn slots(&self) -> &[Slot] {
        // SAFETY: the startup hook allocated nslots slots right after the
        // header and initialised them.
        unsafe {
            let first = (self as *const Header).add(1) as *const Slot;
            std::slice::from_raw_parts(first, self.nslots as usize)
        }
    }

    /// One [`Holder`] entry per backend, after the slots.
    pub fn holders(&self) -> &[Holder] {
        // SAFETY: the startup hook allocated nholders zeroed entries right
        // after the slots.
        unsafe {
            let first = self.slots().as_ptr().add(self.nslots as usize) as *const Holder;
            std::slice::from_raw_parts(first, self.nholders as usize)
        }
    }

    /// The backfill grants, after the holders.
    pub fn backfill(&self) -> &Backfill {
        // SAFETY: the startup hook allocated the backfill grants right after
        // the holders (aligned: every structure before it has 8-byte
        // alignment and a size that is a multiple of 8) and zeroed them.
        unsafe {
            let first = self.holders().as_ptr().add(self.nholders as usize) as *const Backfill;
            &*first
        }
    }

    /// This backend's [`Holder`] entry (`None` for a process without a
    /// backend slot, which then publishes to the slot directly).
    pub fn my_holder(&self) -> Option<&Holder> {
        // SAFETY: reading this process's own number.
        #[cfg(any(feature = "pg15", feature = "pg16"))]
        let index = unsafe { pg_sys::MyBackendId } - 1;
        // SAFETY: as above.
        #[cfg(not(any(feature = "pg15", feature = "pg16")))]
        let index = unsafe { pg_sys::MyProcNumber };
        usize::try_from(index)
            .ok()
            .and_then(|i| self.holders().get(i))
    }

    /// IDs made on worker id `id`: the slot's count (sessions that left)
    /// plus its live holders'.
    pub fn ids_issued(&self, id: usize) -> u64 {
        let live: u64 = self
            .holders()
            .iter()
            .filter(|h| h.pid.load(Relaxed) != 0 && h.worker_id.load(Relaxed) as usize == id)
            .map(|h| h.ids_issued.load(Relaxed))
            .sum();
        self.slots()
            .get(id)
            .map_or(0, |s| s.ids_issued.load(Relaxed))
            + live
    }

    /// Whether this backend holds the slot table's lock.
    pub fn lock_held_by_me(&self) -> bool {
        // SAFETY: a lookup in this backend's own list of held LWLocks.
        unsafe { pg_sys::LWLockHeldByMe(self.lock) }
    }

    /// Takes the slot table's lock.
    pub fn lock(&self, exclusive: bool) -> LockGuard {
        let mode = if exclusive {
            pg_sys::LWLockMode::LW_EXCLUSIVE
        } else {
            pg_sys::LWLockMode::LW_SHARED
        };
        LockGuard::acquire(self.lock, mode)
    }

    /// Takes the reservation lock (exclusive).
    pub fn reserve_lock(&self) -> LockGuard {
        LockGuard::acquire(self.reserve_lock, pg_sys::LWLockMode::LW_EXCLUSIVE)
    }

    /// Takes the reservation lock (exclusive) if it is free now.
    pub fn try_reserve_lock(&self) -> Option<LockGuard> {
        // SAFETY: our tranche's lock, in shared memory for the server's life.
        let got = unsafe {
            pg_sys::LWLockConditionalAcquire(self.reserve_lock, pg_sys::LWLockMode::LW_EXCLUSIVE)
        };
        got.then_some(LockGuard(self.reserve_lock))
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

#[cfg(test)]
mod tests {
    use super::*;
    use snowflake_core::generator::SharedPosition;

    fn zeroed_slot() -> Slot {
        // SAFETY: every field is an atomic integer, for which zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn lease_modes_round_trip_through_their_byte() {
        for mode in [
            LeaseMode::Local,
            LeaseMode::Undecided,
            LeaseMode::Registry,
            LeaseMode::Citus,
        ] {
            assert_eq!(LeaseMode::try_from(u8::from(mode)), Ok(mode));
        }
        assert_eq!(LeaseMode::try_from(4), Err(4));
        // SAFETY: every field is an atomic or a pointer, for which zero is
        // valid.
        let lease: LeaseState = unsafe { std::mem::zeroed() };
        assert_eq!(lease.mode(Relaxed), LeaseMode::Local);
        lease.set_mode(LeaseMode::Citus, Relaxed);
        assert_eq!(lease.mode(Relaxed), LeaseMode::Citus);
        assert_eq!(lease.mode.load(Relaxed), MODE_CITUS);
        lease.mode.store(200, Relaxed);
        assert_eq!(lease.mode(Relaxed), LeaseMode::Undecided);
        assert_eq!(LeaseMode::Undecided.name(), "starting");
    }

    #[test]
    fn counters_add_up_what_each_sharer_publishes() {
        let Ok(l) = snowflake_core::layout::PRESETS[0]
            .layout(snowflake_core::layout::DEFAULT_EPOCH_MS, 1_790_000_000_000)
        else {
            panic!("the classic layout is valid");
        };
        let slot = zeroed_slot();
        let mut a = GeneratorState::new(&l);
        let mut b = GeneratorState::new(&l);
        let (mut pa, mut pb) = (a, b);
        a.ids_issued = 5;
        a.max_drift = 7;
        a.clock_backward = 1;
        b.ids_issued = 3;
        b.max_drift = 2;
        b.sequence_exhausted = 4;
        slot.publish_counters(&a, &mut pa, None);
        slot.publish_counters(&b, &mut pb, None);
        a.ids_issued = 6;
        slot.publish_counters(&a, &mut pa, None);
        slot.publish_counters(&a, &mut pa, None);
        assert_eq!(slot.ids_issued.load(Relaxed), 9);
        assert_eq!(slot.max_drift.load(Relaxed), 7);
        assert_eq!(slot.clock_backward.load(Relaxed), 1);
        assert_eq!(slot.sequence_exhausted.load(Relaxed), 4);
    }

    #[test]
    fn position_moves_only_from_the_word_read() {
        let slot = zeroed_slot();
        slot.position.store(-1, Relaxed);
        assert!(!slot.compare_exchange(5, 6));
        assert!(slot.compare_exchange(-1, 6));
        assert_eq!(slot.load(), 6);
    }
}
