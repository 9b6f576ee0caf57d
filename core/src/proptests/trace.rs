//! Clock traces: a clock that moves only when the trace moves it, the
//! events of a trace, running one on a generator, and `check_trace`, which
//! checks properties 1 to 4 on what a trace did.

use super::*;
use crate::generator::{Clock, GenError, GeneratorState};
use proptest::test_runner::TestCaseError;

/// A clock that moves only when the trace (or a sleep) moves it, and records
/// every reading and every sleep.
pub(super) struct TraceClock {
    pub(super) ms: i64,
    pub(super) readings: Vec<i64>,
    pub(super) sleeps: Vec<i64>,
}

impl TraceClock {
    pub(super) fn new(ms: i64) -> Self {
        TraceClock {
            ms,
            readings: Vec::new(),
            sleeps: Vec::new(),
        }
    }

    pub(super) fn slept(&self) -> i64 {
        self.sleeps.iter().sum()
    }
}

impl Clock for TraceClock {
    fn now_ms(&mut self) -> i64 {
        self.readings.push(self.ms);
        self.ms
    }
    fn sleep_ms(&mut self, ms: i64) {
        // A generator that never stops sleeping is a failure, not a hang.
        assert!(self.sleeps.len() < 100_000, "next_id keeps sleeping");
        // Checked by the properties (a sleep is at least 1 ms).
        self.sleeps.push(ms);
        self.ms += ms.max(1);
    }
}

/// One event of a clock trace. Tick counts are scaled to the layout's unit
/// and the drift bound when the trace is run.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ev {
    /// This many `next_id` calls without moving the clock.
    Calls(u32),
    /// Forward by `ticks` ticks plus `sub % unit_ms` milliseconds.
    Forward { ticks: u32, sub: u32 },
    /// A zero step (a reading at the same time).
    Zero,
    /// Backward by at most bound + 1 ticks (and a fraction).
    Back { ticks: u32, sub: u32 },
    /// Backward by more than the bound.
    BackFar { ticks: u32, sub: u32 },
}

pub(super) fn arb_event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (1..=40u32).prop_map(Ev::Calls),
        1 => (100..=600u32).prop_map(Ev::Calls),
        3 => (0..=3u32, any::<u32>()).prop_map(|(ticks, sub)| Ev::Forward { ticks, sub }),
        1 => (4..=2000u32, any::<u32>()).prop_map(|(ticks, sub)| Ev::Forward { ticks, sub }),
        1 => Just(Ev::Zero),
        2 => (any::<u32>(), any::<u32>()).prop_map(|(ticks, sub)| Ev::Back { ticks, sub }),
        1 => (any::<u32>(), any::<u32>()).prop_map(|(ticks, sub)| Ev::BackFar { ticks, sub }),
    ]
}

pub(super) fn arb_forward_event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (1..=40u32).prop_map(Ev::Calls),
        1 => (100..=600u32).prop_map(Ev::Calls),
        3 => (0..=3u32, any::<u32>()).prop_map(|(ticks, sub)| Ev::Forward { ticks, sub }),
        1 => (4..=2000u32, any::<u32>()).prop_map(|(ticks, sub)| Ev::Forward { ticks, sub }),
        1 => Just(Ev::Zero),
    ]
}

/// Where the clock starts: near `NOW`, or near the end of the layout.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start {
    Now(u32),
    End(u32),
}

pub(super) fn arb_start() -> impl Strategy<Value = Start> {
    prop_oneof![
        4 => any::<u32>().prop_map(Start::Now),
        1 => any::<u32>().prop_map(Start::End),
    ]
}

/// A drift bound in ticks (0 often) plus a fraction of a tick, in ms.
pub(super) fn arb_drift() -> impl Strategy<Value = (i64, u32)> {
    (
        prop_oneof![2 => Just(0i64), 2 => 0..=3i64, 1 => 0..=50i64],
        any::<u32>(),
    )
}

pub(super) fn drift_ms(l: &Layout, (ticks, sub): (i64, u32)) -> i64 {
    ticks * l.unit_ms + i64::from(sub) % l.unit_ms
}

pub(super) fn start_ms(l: &Layout, start: Start) -> i64 {
    let u = l.unit_ms;
    match start {
        // Within a day before NOW (not before the epoch), at a random point
        // of a tick.
        Start::Now(x) => {
            (NOW - i64::from(x % 1000) * u.min(DAY_MS / 1000) - i64::from(x) % u).max(l.epoch_ms)
        }
        // Within a few ticks of the end, when the end is not saturated.
        Start::End(x) if l.end_unix_ms() < i64::MAX / 4 => l.end_unix_ms() - i64::from(x) % (5 * u),
        Start::End(x) => (NOW - i64::from(x) % u).max(l.epoch_ms),
    }
}

/// One `next_id` call and what surrounded it.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) before: GeneratorState,
    pub(super) after: GeneratorState,
    pub(super) result: Result<i64, GenError>,
    /// The clock readings (ms) taken during the call.
    pub(super) readings: Vec<i64>,
    /// The sleeps (ms) asked for during the call.
    pub(super) sleeps: Vec<i64>,
}

/// Runs `events` on `g` with a clock starting at `start`.
pub(super) fn run_trace(
    l: &Layout,
    g: &mut GeneratorState,
    worker: u32,
    max_drift_ms: i64,
    clock: &mut TraceClock,
    events: &[Ev],
) -> Vec<Call> {
    let u = l.unit_ms;
    let d = max_drift_ms / u;
    let mut calls = Vec::new();
    for &ev in events {
        match ev {
            Ev::Calls(n) => {
                for _ in 0..n {
                    let (r0, s0) = (clock.readings.len(), clock.sleeps.len());
                    let before = *g;
                    let result = g.next_id(l, worker, max_drift_ms, clock);
                    calls.push(Call {
                        before,
                        after: *g,
                        result,
                        readings: clock.readings[r0..].to_vec(),
                        sleeps: clock.sleeps[s0..].to_vec(),
                    });
                }
            }
            Ev::Forward { ticks, sub } => {
                clock.ms += i64::from(ticks) * u + i64::from(sub) % u;
            }
            Ev::Zero => {}
            Ev::Back { ticks, sub } => {
                clock.ms -= (i64::from(ticks) % (d + 2)) * u + i64::from(sub) % u;
            }
            Ev::BackFar { ticks, sub } => {
                clock.ms -= (d + 1 + i64::from(ticks) % 1000) * u + i64::from(sub) % u;
            }
        }
    }
    calls
}

/// What a trace is checked against.
pub(super) struct Expect {
    pub(super) worker: u32,
    pub(super) max_drift_ms: i64,
    /// Every ID must be above this one (the floor's last ID, or -1).
    pub(super) above: i64,
}

/// Properties 1 to 4 on one trace: strictly increasing IDs, errors that
/// change nothing, decodable IDs within the drift bound, `ClockBehind`
/// exactly when the clock is behind by more than the bound, sleeps only at
/// the bound and only to the next tick, and the counters.
pub(super) fn check_trace(
    l: &Layout,
    start: &GeneratorState,
    calls: &[Call],
    end: &GeneratorState,
    e: &Expect,
) -> Result<(), TestCaseError> {
    let mut seen = Seen::new(start, e.above);
    for (i, c) in calls.iter().enumerate() {
        check_call(l, e, i, c, &mut seen)?;
    }
    check_counters(start, end, &seen)
}

/// What `check_trace` has seen of a trace so far.
struct Seen {
    /// The state the next call must start from.
    state: GeneratorState,
    /// The last ID issued (at first, the ID every ID must be above).
    last_id: i64,
    issued: u64,
    exhausted: u64,
    max_drift: i64,
    /// Readings lower than the previous reading.
    backward: u64,
    /// The tick of the previous reading (none before the first).
    prev_reading: Option<i64>,
}

impl Seen {
    fn new(start: &GeneratorState, above: i64) -> Self {
        Seen {
            state: *start,
            last_id: above,
            issued: 0,
            exhausted: 0,
            max_drift: start.max_drift,
            backward: 0,
            prev_reading: None,
        }
    }
}

/// One call's clock against the bound.
struct CallClock {
    /// The call's index in the trace (for messages).
    i: usize,
    /// The drift bound in ticks.
    d: i64,
    /// The first reading, and its tick.
    first_ms: i64,
    first: i64,
    /// The last reading, and its tick.
    last_ms: i64,
    now: i64,
    /// How far the last tick used was ahead of the first reading's tick.
    behind: i64,
}

/// One call: the state carried over, its readings, its sleeps and its
/// result.
fn check_call(
    l: &Layout,
    e: &Expect,
    i: usize,
    c: &Call,
    seen: &mut Seen,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(c.before, seen.state, "call {}: state carried over", i);
    seen.state = c.after;
    prop_assert!(!c.readings.is_empty(), "call {}: no clock reading", i);
    count_backward_readings(l, c, seen);
    prop_assert_eq!(
        c.readings.len(),
        c.sleeps.len() + 1,
        "call {}: one reading per attempt",
        i
    );
    let first_ms = c.readings[0];
    let first = l.tick_at(first_ms);
    let last_ms = *c.readings.last().unwrap();
    let at = CallClock {
        i,
        d: e.max_drift_ms / l.unit_ms,
        first_ms,
        first,
        last_ms,
        now: l.tick_at(last_ms),
        behind: c.before.last_tick - first,
    };
    prop_assert_eq!(c.after.last_seen, at.now, "call {}: last_seen", i);
    check_sleeps(l, c, &at)?;

    // ClockBehind exactly when behind by more than the bound.
    if at.behind > at.d {
        prop_assert_eq!(
            c.result,
            Err(GenError::ClockBehind {
                behind: at.behind,
                bound: at.d
            }),
            "call {}",
            i
        );
    }
    match c.result {
        Err(err) => check_error(l, c, err, &at),
        Ok(id) => check_issued(l, e, c, id, &at, seen),
    }
}

/// Counts the call's readings whose tick is below the previous reading's.
fn count_backward_readings(l: &Layout, c: &Call, seen: &mut Seen) {
    for &r in &c.readings {
        let t = l.tick_at(r);
        if seen.prev_reading.is_some_and(|p| t < p) {
            seen.backward += 1;
        }
        seen.prev_reading = Some(t);
    }
}

/// Sleeps: at most one, exactly to the start of the next tick, and only
/// when the borrowed tick would be over the bound.
fn check_sleeps(l: &Layout, c: &Call, at: &CallClock) -> Result<(), TestCaseError> {
    let i = at.i;
    let must_wait = at.behind == at.d && c.before.sequence == l.max_sequence();
    prop_assert_eq!(
        !c.sleeps.is_empty(),
        must_wait,
        "call {}: slept {:?}, behind {} of bound {}",
        i,
        &c.sleeps,
        at.behind,
        at.d
    );
    if let Some(&s) = c.sleeps.first() {
        prop_assert_eq!(c.sleeps.len(), 1, "call {}: more than one sleep", i);
        prop_assert!(s >= 1, "call {}: sleep of {} ms", i, s);
        prop_assert!(s <= l.unit_ms, "call {}: sleep of {} ms", i, s);
        prop_assert_eq!(
            at.first_ms + s,
            l.tick_start_unix_ms(at.first + 1),
            "call {}: sleeps to the next tick",
            i
        );
    }
    Ok(())
}

/// An error changes nothing but the clock observations, and is the one the
/// rules give.
fn check_error(l: &Layout, c: &Call, err: GenError, at: &CallClock) -> Result<(), TestCaseError> {
    let i = at.i;
    let mut unchanged = c.before;
    unchanged.last_seen = c.after.last_seen;
    unchanged.clock_backward = c.after.clock_backward;
    prop_assert_eq!(c.after, unchanged, "call {}: an error changed the state", i);
    match err {
        GenError::ClockBehind { behind: b, bound } => {
            prop_assert!(at.behind > at.d, "call {}: {:?} within the bound", i, err);
            prop_assert_eq!((b, bound), (at.behind, at.d));
        }
        GenError::Interrupted => prop_assert!(false, "interrupted"),
        GenError::LayoutExhausted { tick, max } => {
            prop_assert_eq!(max, l.max_ticks());
            prop_assert!(tick > max);
            prop_assert!(
                tick == at.now || tick == c.before.last_tick + 1,
                "call {}: {:?} at clock tick {}",
                i,
                err,
                at.now
            );
        }
    }
    Ok(())
}

/// An issued ID: above the last one, of this worker, within the drift
/// bound, at the position the rules give; and the counters it moves.
fn check_issued(
    l: &Layout,
    e: &Expect,
    c: &Call,
    id: i64,
    at: &CallClock,
    seen: &mut Seen,
) -> Result<(), TestCaseError> {
    let (i, now, d) = (at.i, at.now, at.d);
    prop_assert!(
        id > seen.last_id,
        "call {}: {} not above {}",
        i,
        id,
        seen.last_id
    );
    seen.last_id = id;
    prop_assert!((0..=l.max_id()).contains(&id));
    let p = l.decode(id).unwrap();
    prop_assert_eq!(p.worker_id, e.worker);
    prop_assert!(p.sequence <= l.max_sequence());
    prop_assert!(p.ticks <= l.max_ticks());
    // Never behind the clock, never ahead by more than the bound.
    prop_assert!(
        p.ticks >= now,
        "call {}: tick {} < clock {}",
        i,
        p.ticks,
        now
    );
    prop_assert!(
        p.ticks - now <= d,
        "call {}: drift {} > bound {}",
        i,
        p.ticks - now,
        d
    );
    if now >= 0 {
        prop_assert!(id >= l.first_id_at(at.last_ms).unwrap());
    }
    let want = next_position(l, &c.before, now);
    prop_assert_eq!((p.ticks, p.sequence), want, "call {}", i);
    prop_assert_eq!((c.after.last_tick, c.after.sequence), want);
    prop_assert_eq!(c.after.ids_issued, c.before.ids_issued + 1);
    seen.issued += 1;
    if p.sequence == l.max_sequence() {
        seen.exhausted += 1;
    }
    seen.max_drift = seen.max_drift.max(p.ticks - now);
    Ok(())
}

/// The rules: a new tick starts at sequence 0; otherwise the next ID in
/// order (same tick, or the borrowed next tick).
fn next_position(l: &Layout, before: &GeneratorState, now: i64) -> (i64, u32) {
    if now > before.last_tick {
        (now, 0)
    } else if before.sequence < l.max_sequence() {
        (before.last_tick, before.sequence + 1)
    } else {
        (before.last_tick + 1, 0)
    }
}

/// The end state is the last call's, and its counters add up what the
/// calls did.
fn check_counters(
    start: &GeneratorState,
    end: &GeneratorState,
    seen: &Seen,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(end, &seen.state);
    prop_assert_eq!(end.ids_issued, start.ids_issued + seen.issued, "ids_issued");
    prop_assert_eq!(
        end.sequence_exhausted,
        start.sequence_exhausted + seen.exhausted,
        "sequence_exhausted"
    );
    prop_assert_eq!(end.max_drift, seen.max_drift, "max_drift");
    // `clock_backward` counts the readings lower than the previous reading;
    // the first reading of a fresh generator has none before it.
    prop_assert_eq!(
        end.clock_backward,
        start.clock_backward + seen.backward,
        "clock_backward"
    );
    Ok(())
}

pub(super) fn issued_ids(calls: &[Call]) -> Vec<i64> {
    calls.iter().filter_map(|c| c.result.ok()).collect()
}
