//! The claim locks (session-level advisory locks on a key SQL cannot make)
//! and the callbacks that keep and release a claim: the lock taken again at
//! commit after `pg_advisory_unlock_all()`, and the release at exit.

use crate::shmem::{self, Header, Slot};
use pgrx::pg_sys;
use std::sync::atomic::Ordering::Relaxed;

use super::{CLAIM, HELD};
/// `pg_locks.classid` of claim locks: "SNOW" in ASCII.
pub const ADVISORY_CLASSID: u32 = 0x534E_4F57;
/// `pg_locks.objsubid` of claim locks (SQL's advisory locks use 1 and 2).
pub const ADVISORY_OBJSUBID: u16 = 3;
/// Every session holding a worker id, alone or sharing it, holds its claim
/// lock in this mode (`pg_locks.mode` 'ShareLock').
const CLAIM_LOCK_MODE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;

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

pub(super) fn try_advisory_lock(worker_id: u32) -> bool {
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

pub(super) fn register_exit_callback() {
    static REGISTERED: parking_lot::Mutex<bool> = parking_lot::const_mutex(false);
    let mut registered = REGISTERED.lock();
    if !*registered {
        // SAFETY: registering #[pg_guard] callbacks with no argument.
        unsafe {
            pg_sys::before_shmem_exit(Some(release_at_exit), pg_sys::Datum::from(0));
            pg_sys::RegisterXactCallback(Some(retake_lock_at_commit), std::ptr::null_mut());
        }
        *registered = true;
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
    if let Ok(mut claim) = CLAIM.0.try_borrow_mut() {
        if let Some(mut claim) = claim.take() {
            claim.take_window();
            claim.publish();
        }
    }
    release_slot(header, worker_id, slot);
}

/// Gives a worker id back (at exit, or when its lease ended).
pub(super) fn release_slot(header: &Header, worker_id: u32, slot: &Slot) {
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
