//! Worker ids: each backend claims one on its first `snowflake_nextval()`
//! and keeps it until it exits. Several backends may share one worker id:
//! its generator position is one word in shared memory advanced by
//! compare-and-swap (see `generator` and `shmem`), so a backend alone on an
//! id is merely uncontended.
//!
//! Which id a claim takes: the free id (no session holds it) released
//! longest ago, so a freshly released id is reused last; when no id of the
//! range is free, the held id with the fewest sessions (ties: the one
//! claimed least recently, then the lowest). So IDs never run out: 53400
//! remains only when no id of the range can be taken at all (some other
//! code holding a claim lock in a conflicting mode; SQL cannot).
//!
//! A claim shows in two places:
//! - the slot's `sessions` count (and `holder_pid` .. of the most recent
//!   claim) in shared memory, set under the slot table's LWLock and undone
//!   by an exit callback; shared memory is reset if a backend crashes, so a
//!   claim can never outlive its holder;
//! - a session-level advisory lock in ShareLock mode on a server-wide key
//!   (database 0, classid [`ADVISORY_CLASSID`], objid = worker id, objsubid
//!   [`ADVISORY_OBJSUBID`]), so `pg_locks` shows every session holding each
//!   id, sharers included. SQL's `pg_advisory_*` functions cannot produce
//!   this key, so no role can forge or block a claim.
//!   `pg_advisory_unlock_all()` and `DISCARD ALL` (a pooler's reset) drop
//!   the lock, not the claim: the slot stays held until the backend exits,
//!   and a pre-commit callback takes the lock again when the transaction
//!   that dropped it commits (one lookup in the backend's local lock table
//!   per commit, nothing per ID).
//!
//! Release order at exit: the advisory lock first, then the slot's count.
use crate::clock::WallClock;
use crate::errors;
use crate::generator::{floor_word, unpack, Clock, GenError, GeneratorState};
use crate::gucs;
use crate::layout::Layout;
use crate::reservation;
use crate::shmem::{self, Header, Holder, Slot};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// `pg_locks.classid` of claim locks: "SNOW" in ASCII.
pub const ADVISORY_CLASSID: u32 = 0x534E_4F57;
/// `pg_locks.objsubid` of claim locks (SQL's advisory locks use 1 and 2).
pub const ADVISORY_OBJSUBID: u16 = 3;
/// Every session holding a worker id, alone or sharing it, holds its claim
/// lock in this mode (`pg_locks.mode` 'ShareLock').
const CLAIM_LOCK_MODE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;

/// This backend's claim.
struct Claim {
    worker_id: u32,
    slot: &'static Slot,
    /// This backend's entry, where it publishes its count of IDs.
    holder: Option<&'static Holder>,
    /// This backend's generator: its view of the slot's position, its clock
    /// observations and its counters.
    state: GeneratorState,
    /// `state`'s counters as last added to the slot's.
    published: GeneratorState,
    /// The reservation floor (Unix ms) this claim started above, until it
    /// issues its first ID.
    fresh_floor: Option<i64>,
    /// `state.clock_backward` when the last ID was issued.
    backward_at_issue: u64,
    /// The slot's `lease_epoch` when claimed.
    epoch: u64,
}

thread_local! {
    static CLAIM: RefCell<Option<Claim>> = const { RefCell::new(None) };
    /// The slot this backend holds, kept apart from `CLAIM` so that the exit
    /// callback can release it even while `CLAIM` is borrowed: a FATAL error
    /// (e.g. pg_terminate_backend while `generate` sleeps) exits without
    /// unwinding the frame that borrowed it.
    static HELD: Cell<Option<(u32, &'static Slot)>> = const { Cell::new(None) };
    /// The tick of the last ID made under a claim this backend gave up
    /// when its lease ended: later claims start above it.
    static MOVED_ABOVE: Cell<i64> = const { Cell::new(i64::MIN) };
}

impl Claim {
    /// Adds this backend's new counts to the slot's (for reports).
    #[inline]
    fn publish(&mut self) {
        self.slot
            .publish_counters(&self.state, &mut self.published, self.holder);
    }
}

/// The shared header, or the "not preloaded" error naming `function`.
pub fn require_shared(function: &str) -> &'static Header {
    match shmem::header() {
        Some(header) => header,
        None => errors::not_preloaded(function),
    }
}

/// Makes `n` IDs from this backend's worker id, claiming one first if
/// needed, and hands each to `emit`. Every ID is covered by the durable
/// reservation before this returns. `function` names the caller in errors.
#[inline]
pub fn generate(function: &str, n: usize, mut emit: impl FnMut(i64)) {
    let header = require_shared(function);
    let layout = gucs::layout();
    let max_drift_ms = gucs::max_drift_ms();
    CLAIM.with_borrow_mut(|held| {
        let mut claim = match held {
            Some(claim) => claim,
            None => held.insert(claim_worker(header, MOVED_ABOVE.get())),
        };
        let mut clock = WallClock {
            newest_tick: Some(&header.newest_tick),
        };
        // The lease bound (see `lease`): no ID above the slot's limit, and
        // none from a claim the lease worker has since re-leased.
        let (mut limit, epoch) = claim.slot.lease_view();
        let mut current = epoch == claim.epoch;
        let mut i = 0;
        while i < n {
            match claim.state.next_shared(
                layout,
                claim.worker_id,
                max_drift_ms,
                &mut clock,
                claim.slot,
            ) {
                Ok(_) if claim.state.last_tick > limit || !current => {
                    claim = move_to_another_id(header, held);
                    let (new_limit, epoch) = claim.slot.lease_view();
                    limit = new_limit;
                    current = epoch == claim.epoch;
                    continue;
                }
                Ok(id) => {
                    emit(id);
                    i += 1;
                }
                Err(e) => {
                    claim.publish();
                    claim.refused(e, layout, max_drift_ms, &mut clock);
                    continue;
                }
            }
            claim.fresh_floor = None;
        }
        claim.backward_at_issue = claim.state.clock_backward;
        claim.publish();
        reservation::reserve(
            header,
            layout.tick_start_unix_ms(claim.state.last_tick),
            layout,
        );
    });
}

/// This backend's claim's lease ended (expired, revoked or given again):
/// hands the worker id back and claims another usable one, whose IDs go on
/// above every ID this backend made (each backend's IDs increase, also
/// when the new claim fails and a later call claims again).
#[cold]
fn move_to_another_id<'a>(header: &'static Header, held: &'a mut Option<Claim>) -> &'a mut Claim {
    if let Some(mut old) = held.take() {
        old.publish();
        MOVED_ABOVE.set(MOVED_ABOVE.get().max(old.state.last_tick));
        if let Some((worker_id, slot)) = HELD.take() {
            release_slot(header, worker_id, slot);
        }
    }
    held.insert(claim_worker(header, MOVED_ABOVE.get()))
}

/// How long a claim that has issued nothing waits for the clock to pass
/// the reservation floor instead of failing, in ms. The floor is at most
/// `reservation::RESERVE_MS` ahead of the last ID made before a restart or
/// crash (plus any drift those IDs had), so this covers a restart with
/// `max_drift = 0` with room to spare, and is still short for a client.
const FLOOR_WAIT_MS: i64 = 1000;

impl Claim {
    /// The generator refused with `err`: waits when the only cause is the
    /// floor of a claim that has issued nothing and the wait is short
    /// (returns, to retry); otherwise raises the error naming the actual
    /// cause.
    #[cold]
    fn refused(
        &mut self,
        err: GenError,
        layout: &Layout,
        max_drift_ms: i64,
        clock: &mut WallClock,
    ) {
        let GenError::ClockBehind { behind, .. } = err else {
            errors::generator(err, layout, max_drift_ms)
        };
        let now_ms = crate::clock::unix_ms();
        let behind_ms = behind * layout.unit_ms;
        let own_lead_ms = layout.tick_start_unix_ms(self.state.last_tick) - now_ms;
        if let Some(floor_ms) = self.fresh_floor {
            if own_lead_ms > max_drift_ms {
                if own_lead_ms - max_drift_ms <= FLOOR_WAIT_MS {
                    // Wait until the clock is within max_drift of the floor.
                    clock.sleep_ms(own_lead_ms - max_drift_ms);
                    return;
                }
                errors::behind_floor(floor_ms, behind_ms, max_drift_ms)
            }
        }
        if own_lead_ms > max_drift_ms && self.state.clock_backward == self.backward_at_issue {
            // The clock did not go back since this worker's last ID: its
            // lead comes from borrowed ticks under a larger max_drift.
            errors::borrowed_lead(behind_ms, max_drift_ms)
        }
        if own_lead_ms <= max_drift_ms {
            errors::behind_server(behind_ms, max_drift_ms)
        }
        errors::generator(err, layout, max_drift_ms)
    }
}

/// The worker id this backend holds, if any.
pub fn my_worker_id() -> Option<u32> {
    CLAIM.with_borrow(|claim| claim.as_ref().map(|c| c.worker_id))
}

/// Claims a worker id whose IDs will all be above tick `above` (and above
/// every floor), waiting for the lease worker when leases are in use and
/// no leased id is usable yet.
fn claim_worker(header: &'static Header, above: i64) -> Claim {
    if header.layout_changed.load(Acquire) {
        errors::layout_changed(&header.recorded_layout.differences(gucs::layout()));
    }
    if header.registry_pending.load(Acquire) {
        wait_for_registry(header);
    }
    // Before anything is held, so that an error here cannot leak a slot.
    register_exit_callback();
    let mut waited_ms = 0;
    loop {
        if let Some(claim) = try_claim(header, above) {
            return claim;
        }
        wait_for_lease(header, &mut waited_ms);
    }
}

/// How long a claim waits for the lease worker to lease a usable block, in
/// ms, unless it already knows the registry is unreachable.
const LEASE_WAIT_MS: i64 = 30_000;
/// How long it waits when the registry is known to be unreachable.
const UNREACHABLE_WAIT_MS: i64 = 2_000;

/// No leased id is usable: wakes the lease worker and waits a little, or
/// raises 55000 naming the registry once waiting cannot help.
#[cold]
fn wait_for_lease(header: &Header, waited_ms: &mut i64) {
    // SAFETY: a plain read of PostgreSQL's recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::no_lease_on_standby();
    }
    let lease = &header.lease;
    let latch = lease.latch.load(Acquire);
    if !latch.is_null() {
        // SAFETY: the lease worker's process latch, in shared memory; it
        // clears the pointer before it exits, and setting a latch its
        // next owner did not expect only wakes that process once.
        unsafe { pg_sys::SetLatch(latch) };
    }
    let unreachable_since = lease.unreachable_since_ms.load(Acquire);
    let decided = lease.mode.load(Acquire) != shmem::MODE_UNDECIDED;
    // Known unreachable with nothing held: fail soon, not after 30 s (but
    // not at once either: the worker may be reconnecting this moment).
    let give_up = *waited_ms >= LEASE_WAIT_MS
        || (decided
            && unreachable_since != 0
            && lease.blocks_held.load(Acquire) == 0
            && *waited_ms >= UNREACHABLE_WAIT_MS);
    if !decided && *waited_ms >= UNREACHABLE_WAIT_MS {
        let problem = lease.problem.get();
        if !problem.is_empty() {
            errors::fleet_unknown(
                &problem,
                current_database_has_citus(),
                gucs::may_read_hidden_settings(),
            );
        }
    }
    if give_up {
        errors::no_lease(
            &lease.registry.get(),
            (unreachable_since != 0).then(|| crate::clock::unix_ms() - unreachable_since),
            lease.deadline_ms.load(Acquire),
            &lease.problem.get(),
            *waited_ms,
            gucs::may_read_hidden_settings(),
        );
    }
    crate::clock::wait_ms(10);
    *waited_ms += 10;
}

/// Whether this session's database has the citus extension (for the hint
/// of [`errors::fleet_unknown`]; on the error path only).
#[cold]
fn current_database_has_citus() -> Option<String> {
    // SAFETY: a syscache lookup by name, missing_ok; and the name of this
    // session's database, valid while it runs (NULL-checked).
    unsafe {
        let oid = pg_sys::get_extension_oid(c"citus".as_ptr(), true);
        if oid == pg_sys::InvalidOid {
            return None;
        }
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (!name.is_null()).then(|| {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        })
    }
}

/// One attempt at a claim; `None` when leases are in use and no leased id
/// is usable now.
fn try_claim(header: &'static Header, above: i64) -> Option<Claim> {
    let layout = gucs::layout();
    let (ranges, text) = gucs::worker_ranges();
    let slots = header.slots();
    let _guard = header.lock(true);
    let (worker_id, shared) = match pick_worker(slots, &ranges, layout) {
        Some(pick) => pick,
        None if header.lease.mode.load(Acquire) != shmem::MODE_LOCAL => return None,
        None => {
            let held = ranges
                .iter()
                .filter(|&id| slots[id as usize].sessions.load(Relaxed) > 0)
                .count() as u64;
            errors::workers_exhausted(&text, ranges.len(), held)
        }
    };
    let slot = &slots[worker_id as usize];
    // SAFETY: reading backend-global identifiers and the clock.
    let (pid, db, role, now) = unsafe {
        (
            pg_sys::MyProcPid,
            pg_sys::MyDatabaseId,
            pg_sys::GetSessionUserId(),
            pg_sys::GetCurrentTimestamp(),
        )
    };
    slot.sessions.fetch_add(1, Relaxed);
    if shared {
        slot.shared_claims.fetch_add(1, Relaxed);
    }
    slot.holder_pid.store(pid, Relaxed);
    slot.holder_db.store(db.to_u32(), Relaxed);
    slot.holder_role.store(role.to_u32(), Relaxed);
    slot.claimed_at.store(now, Relaxed);
    slot.claims.fetch_add(1, Relaxed);
    // SAFETY: application_name is PostgreSQL's GUC variable: NULL or a
    // NUL-terminated string.
    let app = unsafe {
        let p = pg_sys::application_name;
        if p.is_null() {
            &[][..]
        } else {
            std::ffi::CStr::from_ptr(p).to_bytes()
        }
    };
    slot.set_application_name(&app[..app.len().min(shmem::APPLICATION_NAME_LEN - 1)]);
    let holder = header.my_holder();
    if let Some(holder) = holder {
        holder.ids_issued.store(0, Relaxed);
        holder.worker_id.store(worker_id, Relaxed);
        holder.pid.store(pid, Relaxed);
    }
    header.changes.fetch_add(1, Relaxed);
    HELD.set(Some((worker_id, slot)));
    let layout = gucs::layout();
    // Start above every ID an earlier life of this data directory may have
    // issued (restart, crash, promotion, layout change). The position only
    // grows, so this is a fetch_max even while sharers issue IDs.
    let floor_ms = header.floor_ms.load(Acquire);
    let floor = floor_word(layout, layout.tick_at(floor_ms));
    let before = slot.position.fetch_max(floor, Relaxed);
    // Above this backend's own last ID when it moved from another id (the
    // lease's floor is already in the position: see `lease_worker`).
    let own = floor_word(layout, above.max(-1));
    let word = slot.position.fetch_max(own, Relaxed).max(own).max(floor);
    let mut state = GeneratorState::new(layout);
    state.set_word(layout, word);
    Some(Claim {
        worker_id,
        slot,
        holder,
        backward_at_issue: state.clock_backward,
        published: state,
        state,
        fresh_floor: (floor > before).then_some(floor_ms),
        epoch: slot.lease_epoch.load(Relaxed),
    })
}

/// The worker id a claim takes, and whether it is shared: the free id
/// released longest ago, else the held id with the fewest sessions (ties:
/// claimed least recently, then the lowest id). `None` only when the claim
/// lock of every id is held in a conflicting mode (SQL cannot take it).
/// Called with the slot table's lock held exclusive.
fn pick_worker(
    slots: &[Slot],
    ranges: &crate::ranges::WorkerRanges,
    layout: &Layout,
) -> Option<(u32, bool)> {
    // The ids this server may use now: the one place to filter candidates.
    // With leases, only ids of a leased block below its lease's limit.
    let usable = |id: &u32| {
        let slot = &slots[*id as usize];
        let (tick, _) = unpack(layout, slot.position.load(Relaxed));
        tick < slot.limit_tick.load(Relaxed)
    };
    let candidates = || ranges.iter().filter(usable);
    // Free ids first, the least recently released first; then held ids,
    // the fewest sessions first, then the least recently claimed.
    let order = |id: &u32| {
        let slot = &slots[*id as usize];
        match slot.sessions.load(Relaxed) {
            0 => (false, slot.release_order.load(Relaxed), 0, *id),
            n => (true, u64::from(n), slot.claimed_at.load(Relaxed), *id),
        }
    };
    // The best id in one pass. A holder releases its advisory lock before
    // it leaves the slot, sharers take it in ShareLock mode, and SQL cannot
    // take this key, so its lock is free to take; the sort of all ids is
    // only a fallback should some other C code hold one.
    let best = candidates().min_by_key(order)?;
    let pick = if try_advisory_lock(best) {
        best
    } else {
        let mut all: Vec<u32> = candidates().filter(|&id| id != best).collect();
        all.sort_unstable_by_key(order);
        all.into_iter().find(|&id| try_advisory_lock(id))?
    };
    Some((pick, slots[pick as usize].sessions.load(Relaxed) > 0))
}

/// How long a first claim after startup waits for the registry worker to
/// read the registry table's high-water marks, in ms. The worker reads them
/// within a second of startup on an idle server.
const REGISTRY_WAIT_MS: i64 = 30_000;

/// Waits until the registry worker has put the high-water marks of the
/// registry table in force (after `pg_upgrade` or a restore they may be the
/// only record of IDs made before). A hot standby does not wait: its worker
/// starts only at promotion, and replayed WAL gives it the primary's floor.
#[cold]
fn wait_for_registry(header: &Header) {
    let mut waited = 0;
    // SAFETY: a plain read of PostgreSQL's recovery state.
    while header.registry_pending.load(Acquire) && !unsafe { pg_sys::RecoveryInProgress() } {
        if waited >= REGISTRY_WAIT_MS {
            errors::registry_not_read(REGISTRY_WAIT_MS);
        }
        crate::clock::wait_ms(10);
        waited += 10;
    }
}

fn claim_locktag(worker_id: u32) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: 0, // no database: the key is server-wide
        locktag_field2: ADVISORY_CLASSID,
        locktag_field3: worker_id,
        locktag_field4: ADVISORY_OBJSUBID,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

fn try_advisory_lock(worker_id: u32) -> bool {
    let tag = claim_locktag(worker_id);
    // SAFETY: a session-level, non-waiting lock on a valid tag; the lock
    // manager releases it when the backend exits.
    let result = unsafe { pg_sys::LockAcquire(&tag, CLAIM_LOCK_MODE, true, true) };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Whether this backend holds the claim lock of `worker_id`.
fn holds_advisory_lock(worker_id: u32) -> bool {
    let tag = claim_locktag(worker_id);
    // SAFETY: a lookup in this backend's local lock table.
    unsafe {
        #[cfg(any(feature = "pg15", feature = "pg16"))]
        let held = pg_sys::LockHeldByMe(&tag, CLAIM_LOCK_MODE);
        #[cfg(not(any(feature = "pg15", feature = "pg16")))]
        let held = pg_sys::LockHeldByMe(&tag, CLAIM_LOCK_MODE, false);
        held
    }
}

fn release_advisory_lock(worker_id: u32) {
    if holds_advisory_lock(worker_id) {
        let tag = claim_locktag(worker_id);
        // SAFETY: releasing a session lock this backend holds.
        unsafe { pg_sys::LockRelease(&tag, CLAIM_LOCK_MODE, true) };
    }
}

fn register_exit_callback() {
    thread_local! {
        static REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !REGISTERED.get() {
        // SAFETY: registering #[pg_guard] callbacks with no argument.
        unsafe {
            pg_sys::before_shmem_exit(Some(release_at_exit), pg_sys::Datum::from(0));
            pg_sys::RegisterXactCallback(Some(retake_lock_at_commit), std::ptr::null_mut());
        }
        REGISTERED.set(true);
    }
}

/// Takes the claim lock again when the committing transaction dropped it
/// (`DISCARD ALL`, `pg_advisory_unlock_all()`), so that `pg_locks` shows
/// every holder. The slot stayed ours, and every holder takes the lock in
/// the same shared mode, so it is free to take.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn retake_lock_at_commit(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    if event != pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT {
        return;
    }
    if let Some((worker_id, _)) = HELD.get() {
        if !holds_advisory_lock(worker_id) {
            try_advisory_lock(worker_id);
        }
    }
}

/// Releases this backend's claim when it exits.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    let Some(header) = shmem::header() else {
        return;
    };
    let Some((worker_id, slot)) = HELD.take() else {
        return;
    };
    // Publish the newest state when we can. If CLAIM is still borrowed (a
    // FATAL error inside `generate`), the slot already covers every ID a
    // client received: `generate` publishes before it returns.
    let _ = CLAIM.try_with(|claim| {
        if let Ok(mut claim) = claim.try_borrow_mut() {
            if let Some(mut claim) = claim.take() {
                claim.publish();
            }
        }
    });
    release_slot(header, worker_id, slot);
}

/// Gives a worker id back (at exit, or when its lease ended).
fn release_slot(header: &Header, worker_id: u32, slot: &Slot) {
    // The advisory lock goes first: once the slot is free, a claim must
    // find the id's lock free (PostgreSQL would release it only later, in
    // its own exit callback).
    release_advisory_lock(worker_id);
    // A FATAL error does not unwind either, so the lock may still be ours.
    let _guard = (!header.lock_held_by_me()).then(|| header.lock(true));
    // SAFETY: reading backend-global identifiers and the clock.
    let (pid, now) = unsafe { (pg_sys::MyProcPid, pg_sys::GetCurrentTimestamp()) };
    if let Some(holder) = header.my_holder() {
        if holder.pid.load(Relaxed) != 0 {
            slot.ids_issued
                .fetch_add(holder.ids_issued.load(Relaxed), Relaxed);
            holder.ids_issued.store(0, Relaxed);
            holder.pid.store(0, Relaxed);
        }
    }
    let left = slot.sessions.load(Relaxed).saturating_sub(1);
    slot.sessions.store(left, Relaxed);
    if slot.holder_pid.load(Relaxed) == pid {
        // The row no longer names a holder (other sharers may remain).
        slot.holder_pid.store(0, Relaxed);
    }
    if left == 0 {
        let order = header.release_counter.fetch_add(1, Relaxed) + 1;
        slot.released_at.store(now, Relaxed);
        slot.release_order.store(order, Relaxed);
        slot.holder_pid.store(0, Relaxed);
    }
    header.changes.fetch_add(1, Relaxed);
}

/// One row of `snowflake_workers`.
pub struct WorkerRow {
    pub worker_id: u32,
    pub pid: Option<i32>,
    pub database_oid: Option<u32>,
    pub role_oid: Option<u32>,
    pub application_name: Option<String>,
    pub claimed_at: Option<i64>,
    pub released_at: Option<i64>,
    pub claims: u64,
    /// Sessions holding the id now.
    pub sessions: u32,
    /// Claims that shared the id because no id was free.
    pub shared_claims: u64,
    /// `None` (like `claimed_at` and `last_tick`) for a user without the
    /// privileges of the holder's role, superuser or pg_read_all_stats.
    pub ids_issued: Option<u64>,
    pub last_tick: Option<i64>,
    pub current_drift: i64,
    pub max_drift: i64,
    pub sequence_exhausted: u64,
    pub clock_backward: u64,
}

/// Every worker id that is held or was used since the server started.
pub fn worker_rows() -> Vec<WorkerRow> {
    let header = require_shared("snowflake_worker_status");
    let layout = gucs::layout();
    let now_tick = layout.tick_at(crate::clock::unix_ms());
    // Like pg_stat_activity: anyone sees current holders; who held an id
    // before is for superusers and pg_read_all_stats members.
    // SAFETY: catalog lookups for the current user.
    let see_past = unsafe {
        pg_sys::superuser()
            || pg_sys::has_privs_of_role(
                pg_sys::GetUserId(),
                pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS),
            )
    };
    let _guard = header.lock(false);
    let mut rows = Vec::new();
    for (id, slot) in header.slots().iter().enumerate() {
        let pid = slot.holder_pid.load(Relaxed);
        let sessions = slot.sessions.load(Relaxed);
        let claims = slot.claims.load(Relaxed);
        if sessions == 0 && claims == 0 {
            continue;
        }
        let held = sessions > 0;
        // The most recent claim: anyone sees it while its session holds
        // the id; once that session has left (even if others still share
        // the id), like any past claim, only the privileged.
        let named = (held && pid != 0) || see_past;
        // When and how much: for the holder's own role (and roles with its
        // privileges) too, as pg_stat_activity shows a session's query.
        let role = slot.holder_role.load(Relaxed);
        // SAFETY: a catalog lookup for the current user; an oid of a
        // dropped role is simply not a role the user has privileges of.
        let full = see_past
            || (named
                && unsafe {
                    pg_sys::has_privs_of_role(pg_sys::GetUserId(), pg_sys::Oid::from(role))
                });
        let (last_tick, _) = unpack(layout, slot.position.load(Relaxed));
        rows.push(WorkerRow {
            worker_id: id as u32,
            pid: (held && pid != 0).then_some(pid),
            database_oid: named.then(|| slot.holder_db.load(Relaxed)),
            role_oid: named.then_some(role),
            application_name: named.then(|| slot.application_name()),
            claimed_at: full.then(|| slot.claimed_at.load(Relaxed)),
            released_at: (!held && slot.release_order.load(Relaxed) > 0)
                .then(|| slot.released_at.load(Relaxed)),
            claims,
            sessions,
            shared_claims: slot.shared_claims.load(Relaxed),
            ids_issued: full.then(|| header.ids_issued(id)),
            last_tick: full.then_some(last_tick),
            current_drift: (last_tick - now_tick).max(0),
            max_drift: slot.max_drift.load(Relaxed),
            sequence_exhausted: slot.sequence_exhausted.load(Relaxed),
            clock_backward: slot.clock_backward.load(Relaxed),
        });
    }
    rows
}

/// How many ids of the configured range are held and free.
pub fn range_usage() -> (String, u64, u64) {
    let header = require_shared("snowflake_config");
    let (ranges, text) = gucs::worker_ranges();
    let _guard = header.lock(false);
    let slots = header.slots();
    let held = ranges
        .iter()
        .filter(|&id| slots[id as usize].sessions.load(Relaxed) > 0)
        .count() as u64;
    (text, ranges.len(), held)
}
