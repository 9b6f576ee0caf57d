//! Worker ids: each backend claims one on its first `snowflake_nextval()`
//! and keeps it until it exits. Several backends may share one worker id:
//! its generator position is one word in shared memory advanced by
//! compare-and-swap (see `generator` and `shmem`), so a backend alone on an
//! id is merely uncontended. A backend alone on its id takes up to [`AHEAD`]
//! sequence numbers of the tick ahead with each compare-and-swap and makes
//! those IDs without touching the word (`GeneratorState::next_held`, on
//! the hot path through its held window, `snowflake_core::held`, kept in
//! [`FAST`]); a session that starts sharing the id meanwhile continues
//! above them. No held ID is made before the reservation covers its tick.
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
//!
//! Files: this one is the hot path (`generate`) and the claim it keeps;
//! `pick` chooses and takes a worker id (and waits for leases or the
//! registry); `locks` holds the claim locks and the callbacks that keep and
//! release them; `report` reads the slots for `snowflake_workers`.

mod locks;
mod pick;
mod report;

use locks::release_slot;
use pick::claim_worker;
pub use report::{range_usage, worker_rows};

use crate::clock::WallClock;
use crate::durability::reservation;
use crate::errors;
use crate::settings;
use crate::shmem::{self, Header, Holder, Slot};
use snowflake_core::clock_behind::{self, Cause};
use snowflake_core::generator::{Clock, GenError, GeneratorState, SharedPosition};
use snowflake_core::held::{HeldCursor, HeldWindow};
use snowflake_core::layout::Layout;
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::Relaxed;

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
    /// The last sequence number of `state.last_tick` that the slot's
    /// position holds for this claim beyond its last ID (see
    /// `GeneratorState::next_ahead`): the IDs up to it are made without
    /// touching the position. 0: none (reset whenever the generator's state
    /// changes otherwise).
    held: u32,
    /// The ID of `state.last_tick` with sequence number 0 (valid while
    /// `held` is not 0).
    id_base: i64,
    /// The layout (a postmaster setting).
    layout: &'static Layout,
}

/// A backend's own state in a plain static. PostgreSQL runs a backend's
/// SQL on one thread (pgrx refuses calls from any other), and only SQL
/// functions and the backend's exit callback reach these; a
/// `thread_local!` would cost a call to `__tls_get_addr` on every access
/// (PostgreSQL loads the library with dlopen: general-dynamic TLS).
struct BackendLocal<T>(T);

// SAFETY: only the backend's main thread runs the code that uses it (see
// above); nothing in the extension starts threads that touch it.
unsafe impl<T> Sync for BackendLocal<T> {}

/// This backend's claim.
static CLAIM: BackendLocal<RefCell<Option<Claim>>> = BackendLocal(RefCell::new(None));

/// The held window of this backend's claim (`snowflake_core::held`) and
/// what [`next_held_id`] needs besides, in plain cells beside `CLAIM`: the
/// hot path pays no borrow flag and no `Option` of the claim, and does no
/// tick arithmetic. IDs made through the window are in the window, not in
/// the claim's state, until [`Claim::take_window`] folds them in, which
/// everything that reads or changes the claim does first (`make_ids`, the
/// exit callback); `make_ids` opens it again when it returns.
struct Fast {
    window: Cell<HeldWindow>,
    /// The window's cursor, field by field (a `Cell` of the whole struct
    /// would copy its padding too, on every ID).
    lo_ms: Cell<i64>,
    sequence: Cell<u32>,
    /// The claim's slot (its lease bound) and its holder entry (where the
    /// count is published): `Some` while the window is open (`None`: no
    /// reading is admitted, whatever `window` says).
    refs: Cell<Option<(&'static Slot, &'static Holder)>>,
    /// The claim's lease epoch.
    epoch: Cell<u64>,
}

impl Fast {
    #[inline(always)]
    fn cursor(&self) -> HeldCursor {
        HeldCursor {
            lo_ms: self.lo_ms.get(),
            sequence: self.sequence.get(),
        }
    }

    #[inline(always)]
    fn set_cursor(&self, cursor: HeldCursor) {
        self.lo_ms.set(cursor.lo_ms);
        self.sequence.set(cursor.sequence);
    }
}

/// This backend's held window.
static FAST: BackendLocal<Fast> = BackendLocal(Fast {
    window: Cell::new(HeldWindow::CLOSED),
    lo_ms: Cell::new(i64::MAX),
    sequence: Cell::new(0),
    refs: Cell::new(None),
    epoch: Cell::new(0),
});

/// `snowflake_id.max_drift` changed in this process (its assign hook, via
/// `settings::load`): the held window admits readings by the old bound, so
/// it admits none from now on; the next ID goes the long way, which folds
/// it and opens one by the new bound. (The hot path does not read the
/// setting.)
pub fn max_drift_changed() {
    let fast = &FAST.0;
    fast.window.set(fast.window.get().shut());
}

/// Sequence numbers a claim takes ahead when it is alone on its worker id
/// (see `Claim::held`): the IDs of a tick then cost one compare-and-swap
/// (and one call through the guarded path) per this many plus one, not one
/// each. A session that starts sharing the id meanwhile continues above
/// them in the same tick (they are at most 1/16 of a classic tick's
/// sequence), and a claim takes none while the id is shared. 63 cost
/// about 16 instructions per ID on that path (bench/profile-hotpath.md).
const AHEAD: u32 = 255;

thread_local! {
    /// The slot this backend holds, kept apart from `CLAIM` so that the exit
    /// callback can release it even while `CLAIM` is borrowed: a FATAL error
    /// (e.g. pg_terminate_backend while a claim waits for a lease) exits
    /// without unwinding the frame that borrowed it.
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

    /// The next ID from the sequence numbers this claim holds in its
    /// worker id's position (`held`), for the clock reading `now_ms`;
    /// `None` when it holds none for that reading. The lease bound is the
    /// caller's to check. Cannot raise an error or panic.
    #[inline(always)]
    fn held_id(&mut self, now_ms: i64, max_drift_ms: i64) -> Option<i64> {
        let sequence = self.state.next_held(
            self.layout.clock_tick(now_ms),
            self.held,
            self.layout.whole_ticks(max_drift_ms),
        )?;
        Some(self.id_base | i64::from(sequence))
    }

    /// Folds the IDs made through the held window ([`FAST`]) into the
    /// state and closes the window: first thing before anything reads or
    /// changes the claim.
    #[inline]
    fn take_window(&mut self) {
        let fast = &FAST.0;
        if fast.refs.take().is_some() {
            fast.window
                .get()
                .fold(&fast.cursor(), &mut self.state, self.layout);
        }
    }

    /// Opens the held window on the sequence numbers this claim holds
    /// (`held`), when it has a holder entry to publish its count in. (The
    /// lease bound is [`next_held_id`]'s to check, on every ID.)
    #[inline]
    fn open_window(&self, max_drift_ms: i64) {
        let Some(holder) = self.holder else {
            return;
        };
        if let Some((window, cursor)) = HeldWindow::open(
            &self.state,
            self.layout,
            self.held,
            max_drift_ms,
            self.id_base,
        ) {
            let fast = &FAST.0;
            fast.window.set(window);
            fast.set_cursor(cursor);
            fast.epoch.set(self.epoch);
            fast.refs.set(Some((self.slot, holder)));
        }
    }

    /// [`Claim::publish`] after held IDs only: they changed nothing but the
    /// count. With a `holder` entry the count is stored there whole (the
    /// slot's sum is not involved, so `published` needs no update).
    #[inline(always)]
    fn publish_count(&mut self) {
        if let Some(holder) = self.holder {
            holder.ids_issued.store(self.state.ids_issued, Relaxed);
        } else {
            self.publish();
        }
    }
}

/// Waits, like a first claim, until the registry worker has put the
/// registry table's records in force (after `pg_upgrade` or a restore).
pub fn wait_for_registry(header: &Header) {
    if header
        .registry_pending
        .load(std::sync::atomic::Ordering::Acquire)
    {
        pick::wait_for_registry(header);
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
///
/// A cancel, timeout or terminate while the generator waits for the clock
/// does not raise inside the wait: the generator returns, and the
/// interrupt is handled once `CLAIM` is no longer borrowed
/// ([`resume_after_interrupt`]), so that its ERROR unwinds no frame of the
/// generator (see docs/design/unwind-on-cancel.md).
#[inline]
pub fn generate(function: &str, n: usize, mut emit: impl FnMut(i64)) {
    let header = require_shared(function);
    let layout = settings::layout();
    let max_drift_ms = settings::max_drift_ms();
    let made = make_ids(
        &mut CLAIM.0.borrow_mut(),
        header,
        layout,
        max_drift_ms,
        0,
        n,
        &mut emit,
    );
    if made < n {
        resume_after_interrupt(header, layout, max_drift_ms, made, n, emit);
    }
}

/// One ID for `snowflake_nextval()` from the sequence numbers this
/// backend's claim already holds in its worker id's position, through the
/// claim's held window ([`FAST`]): no compare-and-swap, no lock, no
/// reservation to extend (the tick is the last ID's), and nothing that can
/// raise an error or panic (no PostgreSQL call, no allocation, no
/// arithmetic that can panic; not even a setting: a change of
/// `snowflake_id.max_drift` shuts the window), so its caller
/// needs no error guard. `None` when the window does not admit the clock's
/// reading (or there is no claim yet): then [`generate_one`].
///
/// The clock is read first: nothing else is live across that call (fewer
/// registers to save). The lease bound is checked against the window's
/// tick, not against the clock, as `make_ids` does.
#[inline(always)]
pub fn next_held_id() -> Option<i64> {
    let now_ms = crate::clock::try_unix_ms()?;
    let fast = &FAST.0;
    let (slot, holder) = fast.refs.get()?;
    let window = fast.window.get();
    let mut cursor = fast.cursor();
    let id = window.next(&mut cursor, now_ms)?;
    // The lease bound as `make_ids` reads it: the limit, then the stop
    // and the epoch. (The drift bound is the window's:
    // `max_drift_changed` shuts it.)
    let lease = slot.lease_view();
    if !lease.admits(window.last_tick, now_ms) || lease.epoch != fast.epoch.get() {
        return None;
    }
    fast.set_cursor(cursor);
    holder.ids_issued.store(window.ids_issued(&cursor), Relaxed);
    Some(id)
}

/// [`generate`] of one ID, when [`next_held_id`] had none.
#[inline(always)]
pub fn generate_one(function: &str) -> i64 {
    let header = require_shared(function);
    let layout = settings::layout();
    let max_drift_ms = settings::max_drift_ms();
    let mut id = 0;
    let made = make_ids(
        &mut CLAIM.0.borrow_mut(),
        header,
        layout,
        max_drift_ms,
        0,
        1,
        &mut |v| id = v,
    );
    if made < 1 {
        resume_after_interrupt(header, layout, max_drift_ms, made, 1, |v| id = v);
    }
    id
}

/// A cancel, timeout or terminate came while the generator waited for the
/// clock: handles it here, where `CLAIM` is no longer borrowed, so that
/// its ERROR (or FATAL) unwinds no frame of the generator; then goes on
/// making IDs as long as the interrupt raised nothing. Out of the hot path.
#[cold]
#[inline(never)]
fn resume_after_interrupt(
    header: &'static Header,
    layout: &Layout,
    max_drift_ms: i64,
    mut made: usize,
    n: usize,
    mut emit: impl FnMut(i64),
) {
    while made < n {
        crate::clock::handle_interrupts();
        made = make_ids(
            &mut CLAIM.0.borrow_mut(),
            header,
            layout,
            max_drift_ms,
            made,
            n,
            &mut emit,
        );
    }
}

/// Makes IDs on the claim in `held` (claiming one first if needed), the
/// `made`th to the `n`th, until all are made or a wait for the clock is
/// interrupted (the interrupt not handled yet). Returns how many are made
/// then (`n` unless interrupted), every one covered by the reservation.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn make_ids(
    held: &mut Option<Claim>,
    header: &'static Header,
    layout: &Layout,
    max_drift_ms: i64,
    made: usize,
    n: usize,
    emit: &mut impl FnMut(i64),
) -> usize {
    let mut i = made;
    let mut claim = match held {
        Some(claim) => {
            claim.take_window();
            claim
        }
        None => held.insert(claim_worker(header, MOVED_ABOVE.get())),
    };
    let mut clock = WallClock {
        newest_tick: Some(&header.newest_tick),
        interrupted: false,
    };
    // The lease bound (see `lease`): no ID above the slot's limit, none
    // once the clock reaches its stop (the block's deadline), and none
    // from a claim the lease worker has since re-leased.
    let mut lease = claim.slot.lease_view();
    let mut current = lease.epoch == claim.epoch;
    // Whether an ID went through the position (a new tick, or the tick's
    // held sequence numbers used up): only then can the counters other than
    // the count, and the reservation, need anything.
    let mut through_word = false;
    while i < n {
        // The word, then the clock (see `next_ahead`), read once for both
        // paths.
        let word = claim.slot.load();
        let now_ms = clock.now_ms();
        if now_ms >= lease.stop_ms || !current {
            // Read again: a renewal may have moved the stop since.
            lease = claim.slot.lease_view();
            current = lease.epoch == claim.epoch;
            if now_ms >= lease.stop_ms || !current {
                // The block's deadline came (or it changed hands): nothing
                // more from this id.
                claim = move_to_another_id(header, held);
                lease = claim.slot.lease_view();
                current = lease.epoch == claim.epoch;
                continue;
            }
        }
        if claim.state.last_tick <= lease.limit {
            if let Some(id) = claim.held_id(now_ms, max_drift_ms) {
                emit(id);
                i += 1;
                continue;
            }
        }
        through_word = true;
        // Take sequence numbers ahead only while alone on the id.
        let ahead = if claim.slot.sessions.load(Relaxed) <= 1 {
            AHEAD
        } else {
            0
        };
        let made = claim.state.next_ahead(
            layout,
            claim.worker_id,
            max_drift_ms,
            &mut clock,
            claim.slot,
            Some((word, now_ms)),
            ahead,
        );
        claim.held = 0;
        match made {
            Ok(_) if claim.state.last_tick > lease.limit => {
                claim = move_to_another_id(header, held);
                lease = claim.slot.lease_view();
                current = lease.epoch == claim.epoch;
                continue;
            }
            Ok((id, held_to)) => {
                claim.held = held_to;
                claim.id_base = id - i64::from(claim.state.sequence);
                emit(id);
                i += 1;
            }
            // Nothing issued; the caller handles the interrupt.
            Err(GenError::Interrupted) => break,
            Err(e) => {
                claim.publish();
                if claim.refused(e, layout, max_drift_ms) {
                    break;
                }
                continue;
            }
        }
        claim.fresh_floor = None;
    }
    if i > made {
        if through_word {
            claim.backward_at_issue = claim.state.clock_backward;
            claim.publish();
            // No held ID of this tick before the reservation covers it:
            // should the extension raise an error, the next call goes
            // through the position (and extends) instead.
            let held = std::mem::take(&mut claim.held);
            reservation::reserve(
                header,
                layout.tick_start_unix_ms(claim.state.last_tick),
                layout,
            );
            claim.held = held;
        } else {
            // Only held IDs, of a tick already reserved, with no counter
            // but the count changed.
            claim.publish_count();
        }
    }
    claim.open_window(max_drift_ms);
    i
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
/// `max_drift = 0` with room to spare (a standby promoted with a clock a
/// little behind the primary's) for ticks up to 250 ms (with ticks of 1 s
/// the floor may be the next tick's start: up to 2 s), and is still short
/// for a client.
pub(crate) const FLOOR_WAIT_MS: i64 = 2000;

impl Claim {
    /// The generator refused with `err`: waits when the only cause is the
    /// floor of a claim that has issued nothing and the wait is short
    /// (returns, to retry: true when a cancel or timeout interrupted the
    /// wait, for the caller to handle once `CLAIM` is no longer borrowed);
    /// otherwise raises the error naming the actual cause.
    #[cold]
    fn refused(&mut self, err: GenError, layout: &Layout, max_drift_ms: i64) -> bool {
        let GenError::ClockBehind { behind, .. } = err else {
            errors::generator(err, layout, max_drift_ms)
        };
        let now_ms = crate::clock::unix_ms();
        let behind_ms = behind * layout.unit_ms;
        let refused = clock_behind::Refused {
            behind_ms,
            behind_ticks: behind,
            now_ms,
            next_tick_ms: layout.tick_start_unix_ms(layout.tick_at(now_ms) + 1),
            last_tick_ms: layout.tick_start_unix_ms(self.state.last_tick),
            unit_ms: layout.unit_ms,
            max_drift_ms,
            // Still at the floor's tick: nothing was issued above it on
            // this id (on a refusal the state holds the shared word).
            fresh_floor_ms: self
                .fresh_floor
                .filter(|&f| self.state.last_tick <= layout.tick_at(f)),
            clock_went_back: self.state.clock_backward != self.backward_at_issue,
        };
        match clock_behind::cause(&refused, FLOOR_WAIT_MS) {
            Cause::FloorInThisTick { next_tick_ms } => errors::floor_in_this_tick(
                next_tick_ms,
                layout,
                max_drift_ms,
                settings::drift_can_cover(layout.unit_ms),
            ),
            Cause::WaitForFloor { wait_ms } => crate::clock::wait_ms_uninterrupted(wait_ms),
            Cause::BehindFloor { floor_ms } => {
                errors::behind_floor(floor_ms, behind_ms, max_drift_ms)
            }
            Cause::BorrowedLead => errors::borrowed_lead(behind_ms, max_drift_ms),
            Cause::BehindServer => errors::behind_server(behind_ms, max_drift_ms),
            Cause::Other => errors::generator(err, layout, max_drift_ms),
        }
    }
}

/// The worker id this backend holds, if any.
pub fn my_worker_id() -> Option<u32> {
    CLAIM.0.borrow().as_ref().map(|c| c.worker_id)
}
