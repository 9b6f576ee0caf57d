//! How long a lease call may keep the registry's locks.
//!
//! Lease calls are decided one at a time: each takes the registry's table
//! lock (`snowflake_lease_lock_registry`, or the candidates' row lock in
//! `snowflake_lease_durable`), and its transaction keeps it until it ends.
//! A holder's call is one statement that ends within milliseconds of its
//! decision. The lease role could otherwise keep the locks as long as it
//! likes without a transaction block (refused, `snowflake_lease_autocommit`):
//! a lease call and `pg_sleep()` in one statement, a `DO` block, or an
//! extended-protocol pipeline left unsynced after the call. Meanwhile every
//! holder's call waits on the lock and is refused at its own
//! `lock_timeout` (5 s), and the fleet stops making IDs.
//!
//! The rule: from its decision on, a lease call's transaction has
//! [`HOLD_MS`] to end; a session past it is ended (`FATAL`, 57P01), which
//! releases its locks, and a LOG line names its role and client. Ending
//! the session rather than cancelling the statement: a cancel can be caught
//! (an `EXCEPTION WHEN query_canceled` block) and is ignored while the
//! session waits for the client's next message; neither is true of a
//! session's end. `HOLD_MS` is below a holder's `lock_timeout`, so a
//! holder's call behind such a session still gets the lock.
//!
//! The timer is disarmed before the commit (`PreCommit`): a commit waiting
//! for synchronous standbys is not cut short by it; the call's commit waits
//! for their flush only ([`commit_on_flush`]).
//!
//! PostgreSQL's `utils/timeout.h` is not in pgrx's bindings; its three
//! functions used here are declared below, with the signatures PostgreSQL
//! 15 to 19 share.

use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

/// How long, after its decision, a lease call's transaction may last, ms.
pub const HOLD_MS: c_int = 2000;

/// Any `TimeoutId` at or above `USER_TIMEOUT` asks `RegisterTimeout` for a
/// free user timeout (its value differs between versions; every version's
/// is far below this).
const ANY_USER_TIMEOUT: c_int = 1000;

// Called through `pg_sys::ffi::pg_guard_ffi_boundary`: an error raised in
// them becomes a Rust panic that pgrx turns back into the error.
unsafe extern "C-unwind" {
    fn RegisterTimeout(id: c_int, handler: Option<unsafe extern "C-unwind" fn()>) -> c_int;
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
}

thread_local! {
    /// This backend's timeout, once registered.
    static TIMEOUT: Cell<Option<c_int>> = const { Cell::new(None) };
    /// Whether the timer runs in this transaction.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Set by the timer's handler, read when the transaction aborts.
static FIRED: AtomicBool = AtomicBool::new(false);

/// The timer's handler, run in the signal handler: only flags, as
/// PostgreSQL's own handlers do.
unsafe extern "C-unwind" fn held_too_long() {
    FIRED.store(true, Ordering::SeqCst);
    // SAFETY: what die() does for SIGTERM: set the flags
    // CHECK_FOR_INTERRUPTS() reads and wake the latch; all three are
    // async-signal-safe.
    unsafe {
        pg_sys::ProcDiePending = 1;
        pg_sys::InterruptPending = 1;
        pg_sys::SetLatch(pg_sys::MyLatch);
    }
}

/// Starts the clock for this lease call's transaction; called where the
/// call decides, under the registry's lock. A second call in the same
/// transaction keeps the first deadline.
pub fn bound() {
    if ARMED.get() {
        return;
    }
    let id = match TIMEOUT.get() {
        Some(id) => id,
        None => {
            // SAFETY: a client backend's timeouts are initialized at its
            // start; the handler only sets flags.
            let id = unsafe {
                pg_sys::ffi::pg_guard_ffi_boundary(|| {
                    RegisterTimeout(ANY_USER_TIMEOUT, Some(held_too_long))
                })
            };
            TIMEOUT.set(Some(id));
            id
        }
    };
    FIRED.store(false, Ordering::SeqCst);
    // Looked up now: no catalog is read while a transaction aborts.
    let role = session_user();
    // SAFETY: `id` is this backend's registered timeout.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| enable_timeout_after(id, HOLD_MS)) };
    ARMED.set(true);
    register_xact_callback(PgXactCallbackEvent::PreCommit, move || disarm(id));
    register_xact_callback(PgXactCallbackEvent::Abort, move || {
        disarm(id);
        if FIRED.swap(false, Ordering::SeqCst) {
            pgrx::log!(
                "snowflake_id registry: a lease call of role {} kept the registry's lock over {} ms \
                 after its decision; its session is ended",
                role,
                HOLD_MS
            );
        }
    });
}

/// The call's commit waits for the synchronous standbys' flush, no more:
/// `synchronous_commit = on` for this transaction. With `remote_apply`
/// (any session may set it) the commit, after the timer, waited for a
/// standby's replay, which a session there can hold back for
/// `max_standby_streaming_delay`, with the registry's lock held.
pub fn commit_on_flush() {
    if let Err(e) = Spi::run("SELECT pg_catalog.set_config('synchronous_commit', 'on', true)") {
        crate::errors::internal(&format!(
            "snowflake_id registry: synchronous_commit could not be set for a lease call: {e}"
        ));
    }
}

fn disarm(id: c_int) {
    // SAFETY: `id` is this backend's registered timeout; disabling one
    // that already fired is allowed.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| disable_timeout(id, false)) };
    ARMED.set(false);
}

/// The session's login role, for the log line.
fn session_user() -> String {
    // SAFETY: reads this backend's session user id, set at connection.
    let oid = unsafe { pg_sys::GetSessionUserId() };
    // SAFETY: a role name lookup; `true`: no error for a dropped role.
    let name = unsafe { pg_sys::GetUserNameFromId(oid, true) };
    if name.is_null() {
        return format!("oid {}", oid.to_u32());
    }
    // SAFETY: a palloc'd NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}
