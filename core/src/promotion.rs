//! A single server's failover, without a registry: where IDs start when a
//! server ends recovery as a new primary, and when a reservation of the
//! primary waits for its synchronous standbys. Pure rules over facts the
//! extension gathers (`durability::reservation`).
//!
//! The primary WAL-logs each reservation (how far its IDs may go) and
//! hands out IDs under it only once the record is flushed. A standby
//! replays the records, so a promoted standby starts above the last one it
//! received. An asynchronous standby may not have received the newest
//! ones: the primary's IDs after them can be above every replayed
//! reservation. Two rules close that:
//!
//! 1. **The floor at promotion** ([`floor_at_recovery_end`]). The primary's
//!    generator never makes an ID whose time is more than `max_drift`
//!    ahead of its own clock at that moment. If the standby's clock is at
//!    most `standby_clock_skew` (B) behind the primary's, then at the
//!    promotion, later than the primary's last ID, the standby's clock plus
//!    B plus `max_drift` is at or above every ID the primary made. The
//!    promoted server starts above that, or above the replayed reservation
//!    when it is higher. (Assumes the standby's `max_drift` is at least the
//!    primary's, as its layout must be the same.)
//! 2. **Synchronous standbys** ([`reservation_wait`], [`wait_end`]). Where
//!    `synchronous_standby_names` names standbys, a reservation is used
//!    only once its record is flushed on them, so a promoted synchronous
//!    standby has every reservation the primary used, whatever the clocks
//!    say.

/// How recovery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryEnd {
    /// Crash recovery of the server's own WAL: every reservation it used is
    /// in its own WAL and state file.
    Crash,
    /// The end of archive recovery or standby mode: a promotion, or a
    /// restored backup (PITR) that ends recovery. The WAL replayed may lack
    /// reservations an earlier primary used.
    Archive,
}

/// What the server knows when recovery ends.
#[derive(Clone, Copy, Debug)]
pub struct AtRecoveryEnd {
    pub end: RecoveryEnd,
    /// The reservation the state file and the replayed WAL give (Unix ms;
    /// `i64::MIN` when none).
    pub replayed_ms: i64,
    /// This server's clock (Unix ms).
    pub now_ms: i64,
    /// `snowflake_id.standby_clock_skew`: how far this server's clock may be
    /// behind the primary's (ms).
    pub standby_clock_skew_ms: i64,
    /// `snowflake_id.max_drift` (ms).
    pub max_drift_ms: i64,
}

/// Where IDs start after recovery, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// The replayed reservation: crash recovery, or a reservation above the
    /// clock bound.
    Replayed(i64),
    /// This server's clock plus the skew bound plus `max_drift`.
    ClockBound(i64),
}

impl Floor {
    /// The floor (Unix ms): every later ID is above every ID of its tick.
    pub fn ms(self) -> i64 {
        match self {
            Floor::Replayed(ms) | Floor::ClockBound(ms) => ms,
        }
    }
}

/// Where IDs start once recovery ends: above the replayed reservation, and
/// after archive recovery also above this server's clock plus
/// `standby_clock_skew` plus `max_drift` (see the module's rule 1).
pub fn floor_at_recovery_end(at: &AtRecoveryEnd) -> Floor {
    if at.end == RecoveryEnd::Crash {
        return Floor::Replayed(at.replayed_ms);
    }
    let bound = at
        .now_ms
        .saturating_add(at.standby_clock_skew_ms.max(0))
        .saturating_add(at.max_drift_ms.max(0));
    if at.replayed_ms >= bound {
        Floor::Replayed(at.replayed_ms)
    } else {
        Floor::ClockBound(bound)
    }
}

/// A session's `synchronous_commit`, in PostgreSQL's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SyncCommit {
    Off,
    Local,
    RemoteWrite,
    /// `on`
    RemoteFlush,
    RemoteApply,
}

impl SyncCommit {
    /// PostgreSQL's `SYNCHRONOUS_COMMIT_*` value (0 to 4; anything else is
    /// taken as `on`).
    pub fn from_pg(level: i32) -> SyncCommit {
        match level {
            0 => SyncCommit::Off,
            1 => SyncCommit::Local,
            2 => SyncCommit::RemoteWrite,
            4 => SyncCommit::RemoteApply,
            _ => SyncCommit::RemoteFlush,
        }
    }
}

/// Whether a new reservation waits for the synchronous standbys before IDs
/// under it are handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservationWait {
    /// No standby to wait for (none named, no WAL senders, or this server
    /// is itself in recovery and writes no WAL).
    None,
    /// Wait until the standbys flushed the record, as a commit with
    /// `synchronous_commit = on` would; `raise_session_to_flush` when this
    /// session's own `synchronous_commit` asks less (`off`, `local`,
    /// `remote_write`), which PostgreSQL's wait would otherwise honour: the
    /// reservation covers every session's IDs, not only this one's.
    Standbys { raise_session_to_flush: bool },
}

/// Whether to wait, from what the session sees.
pub fn reservation_wait(
    in_recovery: bool,
    max_wal_senders: i32,
    standbys_named: bool,
    session: SyncCommit,
) -> ReservationWait {
    if in_recovery || max_wal_senders <= 0 || !standbys_named {
        return ReservationWait::None;
    }
    ReservationWait::Standbys {
        raise_session_to_flush: session < SyncCommit::RemoteFlush,
    }
}

/// How the wait for the synchronous standbys ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// The standbys flushed the record: the reservation may be used.
    Confirmed,
    /// PostgreSQL released the wait without the standbys (none in force any
    /// more: `synchronous_standby_names` emptied), as it releases commits.
    NotRequired,
    /// A cancel, `statement_timeout` or termination ended the wait: the
    /// reservation must not be used (fail closed).
    Interrupted,
}

/// How the wait ended: from the synchronous standbys' flush position after
/// it, the record's end, and whether an interrupt is pending (the wait
/// returns early only for one, or when no standby is in force any more).
pub fn wait_end(standbys_flushed: u64, record_end: u64, interrupt_pending: bool) -> WaitEnd {
    if standbys_flushed >= record_end {
        WaitEnd::Confirmed
    } else if interrupt_pending {
        WaitEnd::Interrupted
    } else {
        WaitEnd::NotRequired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(end: RecoveryEnd, replayed_ms: i64, now_ms: i64) -> AtRecoveryEnd {
        AtRecoveryEnd {
            end,
            replayed_ms,
            now_ms,
            standby_clock_skew_ms: 1_000,
            max_drift_ms: 10_000,
        }
    }

    #[test]
    fn crash_recovery_keeps_the_replayed_reservation() {
        let a = at(RecoveryEnd::Crash, 5_000, 100_000);
        assert_eq!(floor_at_recovery_end(&a), Floor::Replayed(5_000));
    }

    #[test]
    fn a_promotion_starts_above_the_clock_bound() {
        // The standby lagged: its last reservation is far behind.
        let a = at(RecoveryEnd::Archive, 50_000, 100_000);
        assert_eq!(floor_at_recovery_end(&a), Floor::ClockBound(111_000));
        // Nothing replayed at all.
        let a = at(RecoveryEnd::Archive, i64::MIN, 100_000);
        assert_eq!(floor_at_recovery_end(&a).ms(), 111_000);
        // A reservation above the bound (the primary's clock was further
        // ahead than B, or its IDs borrowed ahead) wins.
        let a = at(RecoveryEnd::Archive, 200_000, 100_000);
        assert_eq!(floor_at_recovery_end(&a), Floor::Replayed(200_000));
    }

    /// The safety argument, over every offset within the bound: the
    /// primary's last ID is at most its clock plus max_drift; the standby's
    /// clock at the promotion is at least the primary's at its last ID
    /// minus B; the floor is above the ID. Beyond B it is not.
    #[test]
    fn within_the_skew_bound_the_floor_covers_the_primarys_ids() {
        let (skew, drift) = (1_000, 10_000);
        for primary_clock in [0, 7, 99_999] {
            for lead in [0, 1, drift] {
                let last_id = primary_clock + lead;
                for behind in [0, 1, skew / 2, skew] {
                    for later in [0, 1, 5_000] {
                        let a = AtRecoveryEnd {
                            end: RecoveryEnd::Archive,
                            replayed_ms: i64::MIN,
                            now_ms: primary_clock - behind + later,
                            standby_clock_skew_ms: skew,
                            max_drift_ms: drift,
                        };
                        assert!(floor_at_recovery_end(&a).ms() >= last_id);
                    }
                }
                let beyond = AtRecoveryEnd {
                    end: RecoveryEnd::Archive,
                    replayed_ms: i64::MIN,
                    now_ms: primary_clock - skew - 1,
                    standby_clock_skew_ms: skew,
                    max_drift_ms: drift,
                };
                if lead == drift {
                    assert!(floor_at_recovery_end(&beyond).ms() < last_id);
                }
            }
        }
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let mut a = at(RecoveryEnd::Archive, i64::MIN, i64::MAX - 5);
        assert_eq!(floor_at_recovery_end(&a).ms(), i64::MAX);
        a.standby_clock_skew_ms = -5;
        a.max_drift_ms = -5;
        a.now_ms = 10;
        assert_eq!(floor_at_recovery_end(&a).ms(), 10);
    }

    #[test]
    fn a_reservation_waits_only_where_standbys_are_named() {
        use SyncCommit::*;
        assert_eq!(
            reservation_wait(false, 10, false, RemoteApply),
            ReservationWait::None
        );
        assert_eq!(
            reservation_wait(false, 0, true, RemoteFlush),
            ReservationWait::None
        );
        assert_eq!(
            reservation_wait(true, 10, true, RemoteFlush),
            ReservationWait::None
        );
        for (level, raise) in [
            (Off, true),
            (Local, true),
            (RemoteWrite, true),
            (RemoteFlush, false),
            (RemoteApply, false),
        ] {
            assert_eq!(
                reservation_wait(false, 10, true, level),
                ReservationWait::Standbys {
                    raise_session_to_flush: raise
                },
                "{level:?}"
            );
        }
        assert_eq!(SyncCommit::from_pg(0), Off);
        assert_eq!(SyncCommit::from_pg(3), RemoteFlush);
        assert_eq!(SyncCommit::from_pg(4), RemoteApply);
    }

    #[test]
    fn a_wait_that_ended_short_is_used_only_without_an_interrupt() {
        assert_eq!(wait_end(100, 100, true), WaitEnd::Confirmed);
        assert_eq!(wait_end(99, 100, true), WaitEnd::Interrupted);
        assert_eq!(wait_end(99, 100, false), WaitEnd::NotRequired);
    }
}
