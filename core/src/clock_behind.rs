//! Why the generator refused with `GenError::ClockBehind`, in the words a
//! DBA can act on: the reservation made before a restart (wait, or the
//! clock is behind it), the current tick not being over, ticks this worker
//! borrowed under a larger `max_drift`, or the server's newest ID. A pure
//! rule over what the claim knows; the extension raises the error it names.

/// What the claim knew when the generator refused.
#[derive(Clone, Copy, Debug)]
pub struct Refused {
    /// How far behind the tick the next ID needs the clock is (the
    /// refusal's `behind`, in ms).
    pub behind_ms: i64,
    /// The refusal's `behind`, in ticks.
    pub behind_ticks: i64,
    /// The wall clock, and the start of its next tick (Unix ms).
    pub now_ms: i64,
    pub next_tick_ms: i64,
    /// The start of this claim's last tick (Unix ms).
    pub last_tick_ms: i64,
    pub unit_ms: i64,
    pub max_drift_ms: i64,
    /// The reservation floor this claim started above, until its first ID.
    pub fresh_floor_ms: Option<i64>,
    /// The clock went back since this claim's last ID.
    pub clock_went_back: bool,
}

/// The cause, and so the error to raise (or the wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Only the current tick is in the way (its IDs may have been made
    /// before a restart) and `max_drift` allows no lead: the tick is just
    /// not over; IDs resume at `next_tick_ms`.
    FloorInThisTick { next_tick_ms: i64 },
    /// The clock is within `wait_ms` of the reservation: wait, then retry.
    WaitForFloor { wait_ms: i64 },
    /// The clock is behind the reservation made before the last restart,
    /// crash or promotion (`floor_ms`).
    BehindFloor { floor_ms: i64 },
    /// This worker's own lead, from ticks borrowed under a larger drift.
    BorrowedLead,
    /// The clock is behind the newest ID issued on this server.
    BehindServer,
    /// None of these: the generator's own error.
    Other,
}

/// The cause of a refusal; a claim that has issued nothing waits up to
/// `floor_wait_ms` for the clock to pass the reservation instead of
/// failing.
pub fn cause(r: &Refused, floor_wait_ms: i64) -> Cause {
    if r.behind_ticks <= 1
        && r.unit_ms > r.max_drift_ms
        && r.next_tick_ms - r.now_ms > floor_wait_ms
        && r.fresh_floor_ms.is_some()
        && !r.clock_went_back
    {
        return Cause::FloorInThisTick {
            next_tick_ms: r.next_tick_ms,
        };
    }
    let own_lead_ms = r.last_tick_ms - r.now_ms;
    if let Some(floor_ms) = r.fresh_floor_ms {
        // The lead the next ID needs: the reservation may be a tick above
        // this claim's last tick (the server's newest tick starts above
        // it), so the claim's own lead can be within max_drift while the
        // next ID is not.
        let lead_ms = own_lead_ms.max(r.behind_ms);
        if lead_ms > r.max_drift_ms {
            if lead_ms - r.max_drift_ms <= floor_wait_ms {
                return Cause::WaitForFloor {
                    wait_ms: lead_ms - r.max_drift_ms,
                };
            }
            return Cause::BehindFloor { floor_ms };
        }
    }
    if own_lead_ms > r.max_drift_ms && !r.clock_went_back {
        return Cause::BorrowedLead;
    }
    if own_lead_ms <= r.max_drift_ms {
        return Cause::BehindServer;
    }
    Cause::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: i64 = 1000;

    /// A restart with the clock `behind_ms` behind a reservation at
    /// 12,628 ms, classic layout (1 ms ticks), max_drift 1 s. The claim's
    /// last tick is the floor's; the server's newest tick is one above it.
    fn after_restart(now_ms: i64) -> Refused {
        let floor_ms = 12_628;
        let behind_ms = floor_ms + 1 - now_ms;
        Refused {
            behind_ms,
            behind_ticks: behind_ms,
            now_ms,
            next_tick_ms: now_ms + 1,
            last_tick_ms: floor_ms,
            unit_ms: 1,
            max_drift_ms: 1000,
            fresh_floor_ms: Some(floor_ms),
            clock_went_back: false,
        }
    }

    #[test]
    fn far_behind_the_reservation_names_it() {
        assert_eq!(
            cause(&after_restart(9_000), WAIT),
            Cause::BehindFloor { floor_ms: 12_628 }
        );
    }

    #[test]
    fn within_a_second_of_the_reservation_waits() {
        assert_eq!(
            cause(&after_restart(11_000), WAIT),
            Cause::WaitForFloor { wait_ms: 629 }
        );
    }

    /// The clock exactly `max_drift` behind the floor: the claim's own lead
    /// is within the bound, but the next ID (a tick above the floor) is
    /// not. This is the reservation, one millisecond from being passed,
    /// not "behind the newest ID issued on this server" (which a test saw
    /// once in 50-ms polling: tests/clocks/test_clocks.py,
    /// test_restart_with_clock_behind_the_reservation).
    #[test]
    fn at_the_boundary_it_is_still_the_reservation() {
        assert_eq!(
            cause(&after_restart(11_628), WAIT),
            Cause::WaitForFloor { wait_ms: 1 }
        );
    }

    #[test]
    fn a_tick_longer_than_the_drift_is_the_current_tick() {
        let r = Refused {
            behind_ms: 0,
            behind_ticks: 1,
            now_ms: 60_000,
            next_tick_ms: 120_000,
            last_tick_ms: 60_000,
            unit_ms: 60_000,
            max_drift_ms: 0,
            fresh_floor_ms: Some(60_000),
            clock_went_back: false,
        };
        assert_eq!(
            cause(&r, WAIT),
            Cause::FloorInThisTick {
                next_tick_ms: 120_000
            }
        );
    }

    #[test]
    fn without_a_floor_own_lead_or_the_server() {
        let mut r = after_restart(9_000);
        r.fresh_floor_ms = None;
        assert_eq!(cause(&r, WAIT), Cause::BorrowedLead);
        r.clock_went_back = true;
        assert_eq!(cause(&r, WAIT), Cause::Other);
        r.last_tick_ms = 9_500;
        assert_eq!(cause(&r, WAIT), Cause::BehindServer);
    }
}
