//! One server's failover, without a registry: a primary making IDs under
//! its WAL-logged reservation, one standby receiving the records (after a
//! delay, or not at all while cut off), a crash of the primary, and the
//! standby's promotion under the real rules (`snowflake_core::promotion`:
//! the floor at the end of recovery, the reservation's wait for a
//! synchronous standby) and the real generator (`GeneratorState::step`).
//! The checker fails the run when an ID of the promoted server is not above
//! every ID the primary handed out (same worker id): a repeat, or IDs that
//! went back.
//!
//! [`SINGLE_FAULTS`] labels each fault kept or outside the assumptions
//! (`docs/design/limitations.md`); [`Mutation`]s plant the bugs the rules
//! close, and each must make some seed fail.

use crate::rng::Rng;
use snowflake_core::generator::{GeneratorState, Step};
use snowflake_core::layout::{Layout, DEFAULT_EPOCH_MS};
use snowflake_core::promotion::{self, AtRecoveryEnd, RecoveryEnd, WaitEnd};

/// The primary's clock at the start (Unix ms).
const T0: i64 = 1_795_305_600_000;
/// `snowflake_id.max_drift` of both servers (ms): short, so that bursts
/// reach it.
pub const MAX_DRIFT_MS: i64 = 300;
/// `snowflake_id.standby_clock_skew` (B, ms).
pub const SKEW_BOUND_MS: i64 = 200;
/// The reservation's lead and how early it is extended (as
/// `durability::reservation`).
const RESERVE_MS: i64 = 1000;
const EXTEND_AHEAD_MS: i64 = 200;

/// The faults of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// An asynchronous standby cut off before the crash (it lags), its
    /// clock off by at most B either way.
    AsyncLagWithinSkew,
    /// A synchronous standby, cut off or not, its clock anywhere from 5 s
    /// behind to 1 s ahead.
    SyncAnySkew,
    /// An asynchronous standby that lags, its clock more than B behind.
    AsyncLagBeyondSkew,
}

impl Fault {
    pub const KEPT: [Fault; 2] = [Fault::AsyncLagWithinSkew, Fault::SyncAnySkew];
    pub const OUTSIDE: [Fault; 1] = [Fault::AsyncLagBeyondSkew];
}

/// A fault's label, as in `faults::FAULTS`.
pub struct Row {
    pub fault: Fault,
    pub kept: bool,
    pub why: &'static str,
}

/// The labels of one server's failover.
pub const SINGLE_FAULTS: &[Row] = &[
    Row { fault: Fault::AsyncLagWithinSkew, kept: true, why: "the promoted server starts above its clock + standby_clock_skew + max_drift, above every ID of a primary whose clock was at most that far ahead" },
    Row { fault: Fault::SyncAnySkew, kept: true, why: "a reservation is used only once the synchronous standby flushed it: the standby has every reservation an ID was made under" },
    Row { fault: Fault::AsyncLagBeyondSkew, kept: false, why: "the standby's clock is behind by more than standby_clock_skew: its clock bound is below the primary's last IDs" },
];

/// A planted bug: each must make some seed fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The floor at promotion without the skew bound (B = 0).
    FloorWithoutSkew,
    /// The reservation used before the synchronous standby flushed it.
    NoSyncWait,
    /// No floor at promotion: the replayed reservation only (0.7.0).
    ReplayedOnly,
}

/// What one run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub fault: Fault,
    /// IDs of the promoted server not above the primary's last ID.
    pub repeats: u64,
    pub primary_ids: u64,
    pub promoted_ids: u64,
    pub trace: Vec<String>,
}

struct Standby {
    /// The standby's clock minus the primary's (ms).
    offset_ms: i64,
    /// Ms a record takes to reach it.
    delay_ms: i64,
    /// Cut off from this simulated ms on (receives nothing after).
    cut_at: i64,
    sync: bool,
    /// How many records it flushed.
    received: usize,
}

/// Plays `seed` with `fault`.
pub fn run(seed: u64, fault: Fault, mutation: Option<Mutation>) -> Outcome {
    let mut rng = Rng::new(seed);
    let layout = match Layout::from_settings(DEFAULT_EPOCH_MS, 1, 63, 10, 2) {
        Ok(l) => l,
        Err(e) => panic!("the simulation's layout: {e:?}"),
    };
    let crash_at = rng.range(1_500, 4_000);
    let offset_ms = match fault {
        Fault::AsyncLagWithinSkew => rng.range(-SKEW_BOUND_MS, SKEW_BOUND_MS + 1),
        Fault::SyncAnySkew => rng.range(-5_000, 1_001),
        Fault::AsyncLagBeyondSkew => rng.range(-SKEW_BOUND_MS - 3_000, -SKEW_BOUND_MS),
    };
    let sync = fault == Fault::SyncAnySkew;
    let cut = !sync || rng.chance(0.7);
    let mut standby = Standby {
        offset_ms,
        delay_ms: rng.range(1, 30),
        cut_at: if cut {
            crash_at - rng.range(0, 1_500)
        } else {
            i64::MAX
        },
        sync,
        received: 0,
    };
    // A burst makes IDs faster than a tick's sequence holds, so that they
    // run ahead of the clock up to max_drift.
    let burst_from = crash_at - rng.range(0, 1_000);
    let mut trace = vec![format!(
        "seed {seed} {fault:?}: crash at {crash_at} ms, standby clock {offset_ms:+} ms, delay {} ms, cut off at {}, burst from {burst_from} ms",
        standby.delay_ms,
        if cut { standby.cut_at.to_string() } else { "never".into() }
    )];

    // The primary.
    let mut gen = GeneratorState::new(&layout);
    let mut records: Vec<(i64, i64)> = Vec::new(); // (written at, until)
    let mut confirmed_until = i64::MIN; // the reservation in force
    let mut pending: Option<usize> = None; // a record waiting for the standby
    let mut primary_max = i64::MIN;
    let mut primary_ids = 0u64;
    let max_drift_ticks = layout.whole_ticks(MAX_DRIFT_MS);
    for t in 0..crash_at {
        // WAL reaches the standby.
        while standby.received < records.len()
            && records[standby.received].0 + standby.delay_ms <= t
            && records[standby.received].0 + standby.delay_ms < standby.cut_at
        {
            standby.received += 1;
        }
        if let Some(i) = pending {
            // LSNs: a record's end is its number plus one.
            if promotion::wait_end(standby.received as u64, i as u64 + 1, false)
                == WaitEnd::Confirmed
            {
                confirmed_until = confirmed_until.max(records[i].1);
                pending = None;
            }
        }
        let now_ms = T0 + t;
        let want = if t >= burst_from { 8 } else { rng.range(0, 3) };
        for _ in 0..want {
            let before = gen;
            let step = gen.step(&layout, 0, layout.tick_at(now_ms), max_drift_ticks, || {
                i64::MIN
            });
            let Ok(Step::Issue(id)) = step else {
                gen = before;
                break;
            };
            let id_ms = layout.tick_start_unix_ms(gen.last_tick);
            if id_ms > confirmed_until.saturating_sub(EXTEND_AHEAD_MS) && pending.is_none() {
                records.push((t, id_ms + RESERVE_MS));
                let i = records.len() - 1;
                let wait = if standby.sync && mutation != Some(Mutation::NoSyncWait) {
                    promotion::reservation_wait(false, 10, true, promotion::SyncCommit::RemoteFlush)
                } else {
                    promotion::ReservationWait::None
                };
                if wait == promotion::ReservationWait::None {
                    confirmed_until = confirmed_until.max(records[i].1);
                } else {
                    pending = Some(i);
                }
            }
            if id_ms > confirmed_until {
                // Not handed out: the session waits for the reservation.
                gen = before;
                break;
            }
            primary_max = primary_max.max(id);
            primary_ids += 1;
        }
    }
    // The standby receives what was sent before the crash and its cut.
    while standby.received < records.len()
        && records[standby.received].0 + standby.delay_ms < standby.cut_at.min(crash_at)
    {
        standby.received += 1;
    }
    let replayed_ms = records[..standby.received]
        .iter()
        .map(|r| r.1)
        .max()
        .unwrap_or(i64::MIN);
    let promote_at = crash_at + rng.range(0, 500);
    let s_now = T0 + promote_at + standby.offset_ms;
    let floor = match mutation {
        Some(Mutation::ReplayedOnly) => replayed_ms,
        _ => promotion::floor_at_recovery_end(&AtRecoveryEnd {
            end: RecoveryEnd::Archive,
            replayed_ms,
            now_ms: s_now,
            standby_clock_skew_ms: if mutation == Some(Mutation::FloorWithoutSkew) {
                0
            } else {
                SKEW_BOUND_MS
            },
            max_drift_ms: MAX_DRIFT_MS,
        })
        .ms(),
    };
    let last_ms = if primary_max == i64::MIN {
        i64::MIN
    } else {
        layout.tick_start_unix_ms(gen.last_tick)
    };
    trace.push(format!(
        "primary: {primary_ids} IDs, the last at {} ms ({:+} ms from its clock at the crash), {} records, the standby has {}; promoted at {promote_at}: floor {} ms ({:+} ms from its clock)",
        last_ms.saturating_sub(T0),
        last_ms.saturating_sub(T0 + crash_at),
        records.len(),
        standby.received,
        floor - T0,
        floor - s_now
    ));

    // The promoted server makes IDs on the same worker id, for a second
    // after its clock allows (a floor more than max_drift ahead of it
    // waits, or fails with 55000 until then).
    let mut promoted = GeneratorState::starting_above(layout.tick_at(floor), &layout);
    let (mut repeats, mut promoted_ids) = (0u64, 0u64);
    let waits_ms = (floor - s_now - MAX_DRIFT_MS).max(0);
    let mut first_id_after = None;
    for t in promote_at..promote_at + waits_ms + 1_000 {
        let now_ms = T0 + t + standby.offset_ms;
        for _ in 0..rng.range(0, 4) {
            let Ok(Step::Issue(id)) =
                promoted.step(&layout, 0, layout.tick_at(now_ms), max_drift_ticks, || {
                    i64::MIN
                })
            else {
                break;
            };
            promoted_ids += 1;
            first_id_after.get_or_insert(t - promote_at);
            if id <= primary_max {
                repeats += 1;
            }
        }
    }
    trace.push(format!(
        "promoted: {promoted_ids} IDs, the first {first_id_after:?} ms after the promotion, {repeats} not above the primary's last"
    ));
    Outcome {
        seed,
        fault,
        repeats,
        primary_ids,
        promoted_ids,
        trace,
    }
}
