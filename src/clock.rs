//! The wall clock the generator runs on in PostgreSQL.

use crate::generator::Clock;
use pgrx::{check_for_interrupts, pg_sys};
use std::time::{SystemTime, UNIX_EPOCH};

/// Current Unix time in milliseconds (negative before 1970).
pub fn unix_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The system clock; sleeping honours query cancellation.
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&mut self) -> i64 {
        unix_ms()
    }

    fn sleep_ms(&mut self, ms: i64) {
        // SAFETY: pg_usleep only sleeps; it is interruptible by signals.
        unsafe { pg_sys::pg_usleep((ms.max(1) * 1000) as _) };
        check_for_interrupts!();
    }
}
