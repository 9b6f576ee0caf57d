//! The wall clock the generator runs on in PostgreSQL, and how a backend
//! waits for it.

use pgrx::{check_for_interrupts, pg_sys};
use snowflake_core::generator::Clock;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

/// Current Unix time in milliseconds (negative before 1970).
#[inline]
pub fn unix_ms() -> i64 {
    match try_unix_ms() {
        Some(ms) => ms,
        None => system_unix_ms(),
    }
}

/// [`unix_ms`], or `None` should clock_gettime fail: for a caller that
/// must not panic (`claims::next_held_id` runs without an error guard).
///
/// Called directly rather than through SystemTime: this is the hot path,
/// and SystemTime adds a call and 128-bit arithmetic per ID. Wrapping
/// arithmetic: the same as checked for any time a clock can say (within
/// 292 million years of 1970), and it cannot panic.
#[inline(always)]
pub fn try_unix_ms() -> Option<i64> {
    let mut ts = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: clock_gettime only writes the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, ts.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: clock_gettime returned 0, so it filled the timespec.
    let ts = unsafe { ts.assume_init() };
    // tv_nsec is below 10^9 (POSIX), so it fits a u32, whose division by
    // a constant is a shorter multiply than an i64's.
    let ms_of_second = ts.tv_nsec as u32 / 1_000_000;
    Some(
        ts.tv_sec
            .wrapping_mul(1000)
            .wrapping_add(i64::from(ms_of_second)),
    )
}

/// [`unix_ms`] through the standard library (should clock_gettime fail).
#[cold]
fn system_unix_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The name of the wait event shown in `pg_stat_activity.wait_event` while
/// a backend waits for the clock (PostgreSQL 17+; 15 and 16 show
/// `Extension`).
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
pub const WAIT_EVENT_NAME: &std::ffi::CStr = c"SnowflakeClock";

/// This process's id of the wait event, registered on first use.
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
fn wait_event() -> u32 {
    static EVENT: parking_lot::Mutex<u32> = parking_lot::const_mutex(0);
    let mut event = EVENT.lock();
    if *event == 0 {
        // SAFETY: registers (or looks up) a named custom wait event in
        // shared memory; the name is a static C string.
        *event = unsafe { pg_sys::WaitEventExtensionNew(WAIT_EVENT_NAME.as_ptr()) };
    }
    *event
}

#[cfg(any(feature = "pg15", feature = "pg16"))]
fn wait_event() -> u32 {
    pg_sys::PG_WAIT_EXTENSION
}

/// Waits about `ms` milliseconds (at least 1) on the process latch, as
/// PostgreSQL's own waits do: it shows in pg_stat_activity, ends at once
/// on postmaster death, and a cancel or terminate interrupts it.
pub fn wait_ms(ms: i64) {
    wait_ms_uninterrupted(ms);
    check_for_interrupts!();
}

/// Waits in steps of 10 ms ([`wait_ms`]: interruptible) until `done`
/// holds; false when it still does not after `limit_ms`.
pub fn poll_until(limit_ms: i64, done: impl Fn() -> bool) -> bool {
    let mut waited = 0;
    while !done() {
        if waited >= limit_ms {
            return false;
        }
        wait_ms(10);
        waited += 10;
    }
    true
}

/// [`wait_ms`] without handling an interrupt: returns whether one is
/// pending, for the caller to handle where no Rust frame holds state that
/// an ERROR would have to unwind.
pub fn wait_ms_uninterrupted(ms: i64) -> bool {
    let event = wait_event();
    let flags = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: MyLatch is this process's latch, set up before any SQL runs;
    // WaitLatch and ResetLatch are the documented way to wait in a backend.
    // InterruptPending is a flag PostgreSQL's signal handlers set, read by
    // value as CHECK_FOR_INTERRUPTS() (and pgrx's check_for_interrupts!)
    // reads it, after the calls above.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            flags as _,
            ms.clamp(1, i64::from(i32::MAX)) as _,
            event,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        pg_sys::InterruptPending != 0
    }
}

/// Handles a pending interrupt (cancel, timeout, terminate ...): raises its
/// ERROR or FATAL, or returns when it raises nothing. Kept out of line:
/// PostgreSQL's error handling around the call (a `sigsetjmp`) would
/// otherwise be inlined into the generator's hot path, and slow it down.
#[cold]
#[inline(never)]
pub fn handle_interrupts() {
    check_for_interrupts!();
}

/// The system clock. A cancel, timeout or terminate ends a sleep at once
/// and is recorded in `interrupted`, not raised: the ERROR is raised by
/// `claims::generate` once the generator has returned (no frame of the
/// generator is unwound). `newest_tick` is the server-wide newest ID tick
/// in shared memory, if any.
pub struct WallClock<'a> {
    pub newest_tick: Option<&'a AtomicI64>,
    /// An interrupt is pending since a sleep: the generator stops, and
    /// `claims::generate` handles it once the claim is no longer borrowed.
    pub interrupted: bool,
}

impl Clock for WallClock<'_> {
    #[inline]
    fn now_ms(&mut self) -> i64 {
        unix_ms()
    }

    fn sleep_ms(&mut self, ms: i64) {
        self.interrupted |= wait_ms_uninterrupted(ms);
    }

    #[inline]
    fn interrupted(&mut self) -> bool {
        self.interrupted
    }

    #[inline]
    fn server_newest_tick(&mut self) -> i64 {
        self.newest_tick.map_or(i64::MIN, |t| t.load(Relaxed))
    }

    #[inline]
    fn publish_newest_tick(&mut self, tick: i64) {
        if let Some(t) = self.newest_tick {
            t.fetch_max(tick, Relaxed);
        }
    }
}
