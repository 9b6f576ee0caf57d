//! Property-based tests of the pure core (layout, generator, ranges).
//!
//! Layouts are the presets and random valid combinations at a fixed "now";
//! clock traces mix small and large forward steps, zero steps, backward
//! jumps smaller and larger than the drift bound, and bursts of calls within
//! one tick. Each property says which rule of `generator`, `layout` or
//! `ranges` it checks.

use crate::generator::{Clock, GenError, GeneratorState, Step};
use crate::layout::{
    format_unix_ms, parse_epoch, Layout, LayoutError, PartError, Parts, DEFAULT_EPOCH_MS,
    MAX_SEQUENCE_BITS, MAX_WORKER_BITS, MIN_LIFETIME_MS, PRESETS,
};
use crate::ranges::{RangeError, WorkerRanges};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::HashSet;

/// The fixed "now": 2026-11-22T00:00:00Z.
const NOW: i64 = 1_795_305_600_000;
const DAY_MS: i64 = 86_400_000;
const YEAR_MS: i64 = 36_525 * DAY_MS / 100;
/// 2200-01-01T00:00:00Z.
const YEAR_2200_MS: i64 = 7_258_118_400_000;
/// 0000-01-01T00:00:00Z (proleptic Gregorian).
const YEAR_0_MS: i64 = -62_167_219_200_000;
/// 9999-12-31T23:59:59.999Z.
const YEAR_9999_END_MS: i64 = 253_402_300_799_999;

// ---------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------

/// The last Unix millisecond of a layout, computed exactly (no saturation).
fn exact_end_ms(epoch_ms: i64, unit_ms: i64, time_bits: u32) -> i128 {
    i128::from(epoch_ms) + (1i128 << time_bits) * i128::from(unit_ms) - 1
}

/// The fewest time bits that make a layout last ten years past `NOW`.
fn min_time_bits(epoch_ms: i64, unit_ms: i64) -> Option<u32> {
    (1..=62).find(|&tb| exact_end_ms(epoch_ms, unit_ms, tb) >= i128::from(NOW + MIN_LIFETIME_MS))
}

fn preset_layout(index: usize, epoch_ms: i64) -> Layout {
    PRESETS[index].layout(epoch_ms, NOW).unwrap()
}

/// Epochs between 50 years before `NOW` and `NOW` itself.
fn arb_epoch() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(DEFAULT_EPOCH_MS),
        Just(NOW),
        Just(0),
        (NOW - 50 * YEAR_MS)..=NOW,
    ]
}

fn arb_unit() -> impl Strategy<Value = i64> {
    prop_oneof![Just(1i64), Just(10i64), 1..=1000i64, 1..=86_400_000i64]
}

/// A random layout that `Layout::new` accepts at `NOW`: a time field of at
/// least the bits needed for ten years, and whatever room is left.
fn arb_custom_layout(
    worker_bits: impl Strategy<Value = u32>,
    sequence_bits: impl Strategy<Value = u32>,
) -> impl Strategy<Value = Layout> {
    (
        arb_epoch(),
        arb_unit(),
        worker_bits,
        sequence_bits,
        any::<u32>(),
    )
        .prop_filter_map(
            "no room for a ten-year time field",
            |(epoch, unit, w, s, extra)| {
                let tb_min = min_time_bits(epoch, unit)?;
                let room = 63u32.checked_sub(w + s)?;
                if tb_min > room {
                    return None;
                }
                let tb = tb_min + extra % (room - tb_min + 1);
                Layout::new(epoch, unit, tb + w + s, w, s, NOW).ok()
            },
        )
}

/// Presets (at random epochs that keep them valid) and random layouts,
/// biased towards small sequence fields so that bursts exhaust them.
fn arb_layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        1 => (0..PRESETS.len(), (NOW - 40 * YEAR_MS)..=NOW)
            .prop_map(|(i, epoch)| preset_layout(i, epoch)),
        3 => arb_custom_layout(
            prop_oneof![Just(0u32), 0..=MAX_WORKER_BITS],
            prop_oneof![3 => 1..=4u32, 1 => 1..=MAX_SEQUENCE_BITS],
        ),
    ]
}

/// Layouts with at least two worker ids.
fn arb_multi_worker_layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        1 => (0..PRESETS.len(), (NOW - 40 * YEAR_MS)..=NOW)
            .prop_map(|(i, epoch)| preset_layout(i, epoch)),
        3 => arb_custom_layout(
            1..=MAX_WORKER_BITS,
            prop_oneof![3 => 1..=4u32, 1 => 1..=MAX_SEQUENCE_BITS],
        ),
    ]
}

/// Layouts with at most 64 IDs per tick (for exact burst arithmetic).
fn arb_small_sequence_layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        1 => (NOW - 40 * YEAR_MS..=NOW).prop_map(|epoch| preset_layout(2, epoch)),
        3 => arb_custom_layout(0..=MAX_WORKER_BITS, 1..=6u32),
    ]
}

/// The largest ID of a tick (every worker, every sequence).
fn last_id_of_tick(l: &Layout, tick: i64) -> i64 {
    l.compose(tick, l.max_worker_id(), l.max_sequence())
        .unwrap()
}

// ---------------------------------------------------------------------------
// Clocks and traces
// ---------------------------------------------------------------------------

/// A clock that moves only when the trace (or a sleep) moves it, and records
/// every reading and every sleep.
struct TraceClock {
    ms: i64,
    readings: Vec<i64>,
    sleeps: Vec<i64>,
}

impl TraceClock {
    fn new(ms: i64) -> Self {
        TraceClock {
            ms,
            readings: Vec::new(),
            sleeps: Vec::new(),
        }
    }

    fn slept(&self) -> i64 {
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
enum Ev {
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

fn arb_event() -> impl Strategy<Value = Ev> {
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

fn arb_forward_event() -> impl Strategy<Value = Ev> {
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
enum Start {
    Now(u32),
    End(u32),
}

fn arb_start() -> impl Strategy<Value = Start> {
    prop_oneof![
        4 => any::<u32>().prop_map(Start::Now),
        1 => any::<u32>().prop_map(Start::End),
    ]
}

/// A drift bound in ticks (0 often) plus a fraction of a tick, in ms.
fn arb_drift() -> impl Strategy<Value = (i64, u32)> {
    (
        prop_oneof![2 => Just(0i64), 2 => 0..=3i64, 1 => 0..=50i64],
        any::<u32>(),
    )
}

fn drift_ms(l: &Layout, (ticks, sub): (i64, u32)) -> i64 {
    ticks * l.unit_ms + i64::from(sub) % l.unit_ms
}

fn start_ms(l: &Layout, start: Start) -> i64 {
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

fn worker_of(l: &Layout, seed: u32) -> u32 {
    seed % (l.max_worker_id() + 1).max(1)
}

/// One `next_id` call and what surrounded it.
#[derive(Debug)]
struct Call {
    before: GeneratorState,
    after: GeneratorState,
    result: Result<i64, GenError>,
    /// The clock readings (ms) taken during the call.
    readings: Vec<i64>,
    /// The sleeps (ms) asked for during the call.
    sleeps: Vec<i64>,
}

/// Runs `events` on `g` with a clock starting at `start`.
fn run_trace(
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
struct Expect {
    worker: u32,
    max_drift_ms: i64,
    /// Every ID must be above this one (the floor's last ID, or -1).
    above: i64,
}

/// Properties 1 to 4 on one trace: strictly increasing IDs, errors that
/// change nothing, decodable IDs within the drift bound, `ClockBehind`
/// exactly when the clock is behind by more than the bound, sleeps only at
/// the bound and only to the next tick, and the counters.
fn check_trace(
    l: &Layout,
    start: &GeneratorState,
    calls: &[Call],
    end: &GeneratorState,
    e: &Expect,
) -> Result<(), TestCaseError> {
    let d = e.max_drift_ms / l.unit_ms;
    let max_seq = l.max_sequence();
    let mut last_id = e.above;
    let mut issued = 0u64;
    let mut exhausted = 0u64;
    let mut max_drift = start.max_drift;
    let mut backward = 0u64;
    let mut prev_reading: Option<i64> = None;
    let mut state = *start;

    for (i, c) in calls.iter().enumerate() {
        prop_assert_eq!(c.before, state, "call {}: state carried over", i);
        state = c.after;
        prop_assert!(!c.readings.is_empty(), "call {}: no clock reading", i);
        for &r in &c.readings {
            let t = l.tick_at(r);
            if prev_reading.is_some_and(|p| t < p) {
                backward += 1;
            }
            prev_reading = Some(t);
        }
        prop_assert_eq!(
            c.readings.len(),
            c.sleeps.len() + 1,
            "call {}: one reading per attempt",
            i
        );
        let first_ms = c.readings[0];
        let first = l.tick_at(first_ms);
        let last_ms = *c.readings.last().unwrap();
        let now = l.tick_at(last_ms);
        let behind = c.before.last_tick - first;
        prop_assert_eq!(c.after.last_seen, now, "call {}: last_seen", i);

        // Sleeps: at most one, exactly to the start of the next tick, and
        // only when the borrowed tick would be over the bound.
        let must_wait = behind == d && c.before.sequence == max_seq;
        prop_assert_eq!(
            !c.sleeps.is_empty(),
            must_wait,
            "call {}: slept {:?}, behind {} of bound {}",
            i,
            &c.sleeps,
            behind,
            d
        );
        if let Some(&s) = c.sleeps.first() {
            prop_assert_eq!(c.sleeps.len(), 1, "call {}: more than one sleep", i);
            prop_assert!(s >= 1, "call {}: sleep of {} ms", i, s);
            prop_assert!(s <= l.unit_ms, "call {}: sleep of {} ms", i, s);
            prop_assert_eq!(
                first_ms + s,
                l.tick_start_unix_ms(first + 1),
                "call {}: sleeps to the next tick",
                i
            );
        }

        // ClockBehind exactly when behind by more than the bound.
        if behind > d {
            prop_assert_eq!(
                c.result,
                Err(GenError::ClockBehind { behind, bound: d }),
                "call {}",
                i
            );
        }
        match c.result {
            Err(err) => {
                let mut unchanged = c.before;
                unchanged.last_seen = c.after.last_seen;
                unchanged.clock_backward = c.after.clock_backward;
                prop_assert_eq!(c.after, unchanged, "call {}: an error changed the state", i);
                match err {
                    GenError::ClockBehind { behind: b, bound } => {
                        prop_assert!(behind > d, "call {}: {:?} within the bound", i, err);
                        prop_assert_eq!((b, bound), (behind, d));
                    }
                    GenError::Interrupted => prop_assert!(false, "interrupted"),
                    GenError::LayoutExhausted { tick, max } => {
                        prop_assert_eq!(max, l.max_ticks());
                        prop_assert!(tick > max);
                        prop_assert!(
                            tick == now || tick == c.before.last_tick + 1,
                            "call {}: {:?} at clock tick {}",
                            i,
                            err,
                            now
                        );
                    }
                }
            }
            Ok(id) => {
                prop_assert!(id > last_id, "call {}: {} not above {}", i, id, last_id);
                last_id = id;
                prop_assert!((0..=l.max_id()).contains(&id));
                let p = l.decode(id).unwrap();
                prop_assert_eq!(p.worker_id, e.worker);
                prop_assert!(p.sequence <= max_seq);
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
                    prop_assert!(id >= l.first_id_at(last_ms).unwrap());
                }
                // The rules: a new tick starts at sequence 0; otherwise the
                // next ID in order (same tick, or the borrowed next tick).
                let want = if now > c.before.last_tick {
                    (now, 0)
                } else if c.before.sequence < max_seq {
                    (c.before.last_tick, c.before.sequence + 1)
                } else {
                    (c.before.last_tick + 1, 0)
                };
                prop_assert_eq!((p.ticks, p.sequence), want, "call {}", i);
                prop_assert_eq!((c.after.last_tick, c.after.sequence), want);
                prop_assert_eq!(c.after.ids_issued, c.before.ids_issued + 1);
                issued += 1;
                if p.sequence == max_seq {
                    exhausted += 1;
                }
                max_drift = max_drift.max(p.ticks - now);
            }
        }
    }
    prop_assert_eq!(end, &state);
    prop_assert_eq!(end.ids_issued, start.ids_issued + issued, "ids_issued");
    prop_assert_eq!(
        end.sequence_exhausted,
        start.sequence_exhausted + exhausted,
        "sequence_exhausted"
    );
    prop_assert_eq!(end.max_drift, max_drift, "max_drift");
    // `clock_backward` counts the readings lower than the previous reading;
    // the first reading of a fresh generator has none before it.
    prop_assert_eq!(
        end.clock_backward,
        start.clock_backward + backward,
        "clock_backward"
    );
    Ok(())
}

fn issued_ids(calls: &[Call]) -> Vec<i64> {
    calls.iter().filter_map(|c| c.result.ok()).collect()
}

// ---------------------------------------------------------------------------
// Generator properties
// ---------------------------------------------------------------------------

proptest! {
    /// Properties 1, 2 and 4: any trace, from a fresh generator.
    #[test]
    fn generator_trace_keeps_the_rules(
        l in arb_layout(),
        worker in any::<u32>(),
        drift in arb_drift(),
        start in arb_start(),
        events in prop::collection::vec(arb_event(), 1..30),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift_ms = drift_ms(&l, drift);
        let mut g = GeneratorState::new(&l);
        let g0 = g;
        let mut clock = TraceClock::new(start_ms(&l, start));
        let calls = run_trace(&l, &mut g, worker, max_drift_ms, &mut clock, &events);
        check_trace(&l, &g0, &calls, &g, &Expect {
            worker,
            max_drift_ms,
            above: -1,
        })?;
    }

    /// Property 3: a clock that only moves forward never gets `ClockBehind`,
    /// and before the layout's end never gets any error.
    #[test]
    fn forward_clock_never_errors_before_the_end(
        l in arb_layout(),
        worker in any::<u32>(),
        drift in arb_drift(),
        start in arb_start(),
        events in prop::collection::vec(arb_forward_event(), 1..30),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift_ms = drift_ms(&l, drift);
        let mut g = GeneratorState::new(&l);
        let g0 = g;
        let mut clock = TraceClock::new(start_ms(&l, start));
        let calls = run_trace(&l, &mut g, worker, max_drift_ms, &mut clock, &events);
        for c in &calls {
            match c.result {
                Ok(_) => {}
                Err(GenError::ClockBehind { .. }) => {
                    prop_assert!(false, "ClockBehind on a forward clock: {:?}", c);
                }
                Err(GenError::LayoutExhausted { tick, .. }) => {
                    prop_assert!(tick > l.max_ticks(), "{:?}", c);
                }
                Err(GenError::Interrupted) => prop_assert!(false, "interrupted"),
            }
        }
        // Before the end (the clock stays within the layout, with room for
        // the borrowed ticks), nothing fails.
        let d = max_drift_ms / l.unit_ms;
        if l.tick_at(clock.ms) + d < l.max_ticks() {
            prop_assert!(calls.iter().all(|c| c.result.is_ok()));
        }
        check_trace(&l, &g0, &calls, &g, &Expect {
            worker,
            max_drift_ms,
            above: -1,
        })?;
    }

    /// Property 5: a burst of calls at one clock reading borrows (d + 1)
    /// ticks' worth of IDs before sleeping, and then sleeps exactly until
    /// the borrowed tick is within the bound, never longer.
    #[test]
    fn burst_borrows_before_waiting_and_sleeps_only_as_needed(
        l in arb_small_sequence_layout(),
        worker in any::<u32>(),
        d in prop_oneof![Just(0i64), 0..=5i64],
        sub in any::<u32>(),
        k in 1..=8i64,
        offset in any::<u32>(),
        fresh in any::<bool>(),
    ) {
        let worker = worker_of(&l, worker);
        let u = l.unit_ms;
        let max_drift_ms = d * u + i64::from(sub) % u;
        let per_tick = i64::from(l.max_sequence()) + 1;
        let start = (NOW - i64::from(offset) % u).max(l.epoch_ms);
        let t0 = l.tick_at(start);
        // A fresh generator, or one whose previous tick is just below.
        let mut g = if fresh {
            GeneratorState::new(&l)
        } else {
            GeneratorState::starting_above(t0 - 1, &l)
        };
        let mut clock = TraceClock::new(start);
        let n = k.max(d + 2) * per_tick;
        for i in 0..n {
            let id = g.next_id(&l, worker, max_drift_ms, &mut clock).unwrap();
            let tick = t0 + i / per_tick;
            let seq = u32::try_from(i % per_tick).unwrap();
            prop_assert_eq!(id, l.compose(tick, worker, seq).unwrap(), "call {}", i);
            let want_ms = start.max(l.tick_start_unix_ms(tick - d));
            prop_assert_eq!(clock.ms, want_ms, "call {}: clock after the call", i);
            if i < (d + 1) * per_tick {
                prop_assert_eq!(clock.slept(), 0, "call {}: slept before the bound", i);
            } else {
                prop_assert_eq!(clock.slept(), want_ms - start);
            }
        }
        prop_assert!(clock.sleeps.iter().all(|&s| (1..=u).contains(&s)));
        prop_assert_eq!(g.max_drift, d.min((n - 1) / per_tick));
        prop_assert_eq!(g.ids_issued, u64::try_from(n).unwrap());
    }

    /// Property 6: a generator started above a floor never issues an ID of
    /// the floor tick or below, for any worker; then keeps the rules.
    #[test]
    fn starting_above_a_floor_never_repeats_an_id(
        l in arb_layout(),
        worker in any::<u32>(),
        drift in arb_drift(),
        start in arb_start(),
        floor_offset in -1000..=1000i64,
        events in prop::collection::vec(arb_event(), 0..15),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift_ms = drift_ms(&l, drift);
        let d = max_drift_ms / l.unit_ms;
        let t_ms = start_ms(&l, start);
        let floor = (l.tick_at(t_ms) + floor_offset).clamp(-1, l.max_ticks());
        let mut g = GeneratorState::starting_above(floor, &l);
        let g0 = g;
        let above = if floor >= 0 { last_id_of_tick(&l, floor) } else { -1 };
        let mut clock = TraceClock::new(t_ms);
        let first = g.next_id(&l, worker, max_drift_ms, &mut clock);
        let now = l.tick_at(clock.ms);
        match first {
            Ok(id) => {
                for w in [0, worker, l.max_worker_id()] {
                    if floor >= 0 {
                        prop_assert!(id > l.compose(floor, w, l.max_sequence()).unwrap());
                    }
                }
                prop_assert_eq!(l.decode(id).unwrap().ticks, now.max(floor + 1));
            }
            Err(GenError::ClockBehind { behind, bound }) => {
                prop_assert_eq!(bound, d);
                prop_assert_eq!(behind, floor - now);
                prop_assert!(behind > d);
            }
            Err(GenError::LayoutExhausted { tick, .. }) => {
                prop_assert!(tick > l.max_ticks());
                prop_assert!(floor == l.max_ticks() || now > l.max_ticks());
            }
            Err(GenError::Interrupted) => prop_assert!(false, "interrupted"),
        }
        // The rest of a trace keeps the rules above the floor.
        let mut g1 = GeneratorState::starting_above(floor, &l);
        let mut clock = TraceClock::new(t_ms);
        let mut all = vec![Ev::Calls(1)];
        all.extend(events);
        let calls = run_trace(&l, &mut g1, worker, max_drift_ms, &mut clock, &all);
        prop_assert_eq!(calls[0].result, first);
        check_trace(&l, &g0, &calls, &g1, &Expect {
            worker,
            max_drift_ms,
            above,
        })?;
    }

    /// Property 6 (hand-over): a second generator for the same worker,
    /// started above the first one's last tick, with its own clock trace,
    /// issues only IDs above all of the first one's.
    #[test]
    fn hand_over_above_the_last_tick_never_repeats_an_id(
        l in arb_layout(),
        worker in any::<u32>(),
        drift in arb_drift(),
        start_a in arb_start(),
        back in 0..=3000i64,
        events_a in prop::collection::vec(arb_event(), 1..15),
        events_b in prop::collection::vec(arb_event(), 1..15),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift_ms = drift_ms(&l, drift);
        let mut a = GeneratorState::new(&l);
        let mut clock_a = TraceClock::new(start_ms(&l, start_a));
        let calls_a = run_trace(&l, &mut a, worker, max_drift_ms, &mut clock_a, &events_a);
        let ids_a = issued_ids(&calls_a);

        // The new owner's clock may be behind the old one's.
        let mut b = GeneratorState::starting_above(a.last_tick, &l);
        let b0 = b;
        let mut clock_b = TraceClock::new(clock_a.ms - back * l.unit_ms);
        let calls_b = run_trace(&l, &mut b, worker, max_drift_ms, &mut clock_b, &events_b);
        let above = ids_a.last().copied().unwrap_or(-1);
        check_trace(&l, &b0, &calls_b, &b, &Expect {
            worker,
            max_drift_ms,
            above,
        })?;
        let a_set: HashSet<i64> = ids_a.into_iter().collect();
        prop_assert!(issued_ids(&calls_b).iter().all(|id| !a_set.contains(id)));
    }

    /// `raise_floor` puts the next ID above every ID of the floor tick, and a
    /// lower floor changes nothing.
    #[test]
    fn raise_floor_puts_the_next_id_above_the_floor(
        l in arb_layout(),
        worker in any::<u32>(),
        drift in arb_drift(),
        start in arb_start(),
        floor_offset in -1000..=1000i64,
        events in prop::collection::vec(arb_event(), 1..10),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift_ms = drift_ms(&l, drift);
        let mut g = GeneratorState::new(&l);
        let mut clock = TraceClock::new(start_ms(&l, start));
        let calls = run_trace(&l, &mut g, worker, max_drift_ms, &mut clock, &events);
        let last = issued_ids(&calls).last().copied().unwrap_or(-1);
        let floor = (g.last_tick + floor_offset).clamp(-1, l.max_ticks());
        let before = g;
        g.raise_floor(floor, &l);
        if floor < before.last_tick {
            prop_assert_eq!(g, before);
        } else {
            prop_assert_eq!((g.last_tick, g.sequence), (floor, l.max_sequence()));
        }
        if let Ok(id) = g.next_id(&l, worker, max_drift_ms, &mut clock) {
            prop_assert!(id > last);
            if floor >= 0 {
                prop_assert!(id > last_id_of_tick(&l, floor));
            }
        }
    }

    /// Property 7: generators of different worker ids never issue the same
    /// ID, whatever their traces.
    #[test]
    fn different_workers_never_share_an_id(
        l in arb_multi_worker_layout(),
        wa in any::<u32>(),
        wb in any::<u32>(),
        drift in arb_drift(),
        start_a in arb_start(),
        start_b in arb_start(),
        same_clock in any::<bool>(),
        events_a in prop::collection::vec(arb_event(), 1..20),
        events_b in prop::collection::vec(arb_event(), 1..20),
    ) {
        let wa = worker_of(&l, wa);
        let mut wb = worker_of(&l, wb);
        if wb == wa {
            wb = (wa + 1) % (l.max_worker_id() + 1);
        }
        let max_drift_ms = drift_ms(&l, drift);
        let events_b = if same_clock { events_a.clone() } else { events_b };
        let start_b = if same_clock { start_a } else { start_b };
        let mut a = GeneratorState::new(&l);
        let mut b = GeneratorState::new(&l);
        let mut clock_a = TraceClock::new(start_ms(&l, start_a));
        let mut clock_b = TraceClock::new(start_ms(&l, start_b));
        let ids_a = issued_ids(&run_trace(&l, &mut a, wa, max_drift_ms, &mut clock_a, &events_a));
        let ids_b = issued_ids(&run_trace(&l, &mut b, wb, max_drift_ms, &mut clock_b, &events_b));
        let a_set: HashSet<i64> = ids_a.iter().copied().collect();
        prop_assert_eq!(a_set.len(), ids_a.len());
        for id in &ids_b {
            prop_assert!(!a_set.contains(id), "{} issued to workers {} and {}", id, wa, wb);
            prop_assert_eq!(l.decode(*id).unwrap().worker_id, wb);
        }
    }

    /// `step` on arbitrary wall-clock ticks: it asks to wait only for the
    /// next tick, and a wait or an error changes nothing but the clock
    /// observations.
    #[test]
    fn step_waits_only_for_the_next_tick(
        l in arb_layout(),
        worker in any::<u32>(),
        d in prop_oneof![Just(0i64), 0..=5i64],
        start_tick in 0..=1_000_000i64,
        nows in prop::collection::vec(-8..=8i64, 1..200),
    ) {
        let worker = worker_of(&l, worker);
        let mut g = GeneratorState::new(&l);
        let mut now = start_tick.min(l.max_ticks());
        let mut last = -1;
        for delta in nows {
            now += delta;
            let before = g;
            match g.step(&l, worker, now, d, || i64::MIN) {
                Ok(Step::Issue(id)) => {
                    prop_assert!(id > last);
                    last = id;
                }
                Ok(Step::WaitUntil(t)) => {
                    prop_assert_eq!(t, now + 1);
                    prop_assert_eq!(before.last_tick - now, d);
                    prop_assert_eq!(before.sequence, l.max_sequence());
                    prop_assert_eq!((g.last_tick, g.sequence, g.ids_issued),
                        (before.last_tick, before.sequence, before.ids_issued));
                }
                Err(_) => {
                    prop_assert_eq!((g.last_tick, g.sequence, g.ids_issued, g.max_drift),
                        (before.last_tick, before.sequence, before.ids_issued, before.max_drift));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Layout properties
// ---------------------------------------------------------------------------

/// Days from 1970-01-01 to `y`-`m`-`d`, counted the slow way.
fn naive_days(y: i64, m: i64, d: i64) -> i64 {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let year_len = |y: i64| if leap(y) { 366 } else { 365 };
    let mut days = 0;
    if y >= 1970 {
        days += (1970..y).map(year_len).sum::<i64>();
    } else {
        days -= (y..1970).map(year_len).sum::<i64>();
    }
    days += (1..m).map(|mm| naive_month_len(y, mm)).sum::<i64>();
    days + d - 1
}

fn naive_month_len(y: i64, m: i64) -> i64 {
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn arb_parts(l: Layout) -> impl Strategy<Value = (Layout, Parts)> {
    (
        prop_oneof![Just(0), Just(l.max_ticks()), 0..=l.max_ticks()],
        prop_oneof![Just(0), Just(l.max_worker_id()), 0..=l.max_worker_id()],
        prop_oneof![Just(0), Just(l.max_sequence()), 0..=l.max_sequence()],
    )
        .prop_map(move |(ticks, worker_id, sequence)| {
            (
                l,
                Parts {
                    ticks,
                    worker_id,
                    sequence,
                },
            )
        })
}

proptest! {
    /// Property 8: compose and decode are inverse on in-range parts, and
    /// IDs order like their (ticks, worker, sequence).
    #[test]
    fn compose_decode_round_trip(
        (l, a) in arb_layout().prop_flat_map(arb_parts),
        b_seed in (any::<i64>(), any::<u32>(), any::<u32>()),
    ) {
        let id = l.compose(a.ticks, a.worker_id, a.sequence).unwrap();
        prop_assert!((0..=l.max_id()).contains(&id));
        prop_assert_eq!(l.decode(id).unwrap(), a);
        prop_assert_eq!(l.compose_unchecked(a.ticks, a.worker_id, a.sequence), id);
        let b = Parts {
            ticks: b_seed.0.rem_euclid(l.max_ticks() + 1),
            worker_id: b_seed.1 % (l.max_worker_id() + 1).max(1),
            sequence: b_seed.2 % (l.max_sequence() + 1),
        };
        let idb = l.compose(b.ticks, b.worker_id, b.sequence).unwrap();
        prop_assert_eq!(
            id.cmp(&idb),
            (a.ticks, a.worker_id, a.sequence).cmp(&(b.ticks, b.worker_id, b.sequence))
        );
    }

    /// Property 8: every value of 0..=max_id decodes and composes back.
    #[test]
    fn decode_compose_round_trip(l in arb_layout(), seed in any::<i64>()) {
        // max_id is 2^total_bits - 1: masking gives a uniform ID.
        let id = seed & l.max_id();
        let p = l.decode(id).unwrap();
        prop_assert_eq!(l.compose(p.ticks, p.worker_id, p.sequence), Ok(id));
        for edge in [0, l.max_id()] {
            let p = l.decode(edge).unwrap();
            prop_assert_eq!(l.compose(p.ticks, p.worker_id, p.sequence), Ok(edge));
        }
    }

    /// Property 8: out-of-range parts and IDs are errors naming the part.
    #[test]
    fn out_of_range_parts_are_errors(
        l in arb_layout(),
        over in 1..=1000i64,
        under in 1..=1000i64,
        small in any::<u32>(),
    ) {
        let (mt, mw, ms) = (l.max_ticks(), l.max_worker_id(), l.max_sequence());
        let over32 = u32::try_from(over).unwrap();
        let w = small % (mw + 1).max(1);
        let s = small % (ms + 1);
        prop_assert_eq!(
            l.compose(mt + over, w, s),
            Err(PartError::Ticks { value: mt + over, max: mt })
        );
        prop_assert_eq!(
            l.compose(-under, w, s),
            Err(PartError::Ticks { value: -under, max: mt })
        );
        if let Some(bad) = mw.checked_add(over32) {
            prop_assert_eq!(l.compose(0, bad, s), Err(PartError::Worker { value: bad.into(), max: mw }));
        }
        if let Some(bad) = ms.checked_add(over32) {
            prop_assert_eq!(l.compose(0, w, bad), Err(PartError::Sequence { value: bad.into(), max: ms }));
        }
        prop_assert_eq!(l.decode(-under), Err(PartError::Id { value: -under, max: l.max_id() }));
        if let Some(bad) = l.max_id().checked_add(over) {
            prop_assert_eq!(l.decode(bad), Err(PartError::Id { value: bad, max: l.max_id() }));
        }
        prop_assert_eq!(
            l.decode(i64::MIN),
            Err(PartError::Id { value: i64::MIN, max: l.max_id() })
        );
    }

    /// Property 8: `tick_at` and `tick_start_unix_ms` agree; `first_id_at`
    /// is the smallest ID of its tick and above every ID of the tick before.
    #[test]
    fn ticks_and_first_ids_are_consistent(
        l in arb_layout(),
        ms in prop_oneof![
            (NOW - 100 * YEAR_MS)..=(NOW + 100 * YEAR_MS),
            YEAR_0_MS..=YEAR_9999_END_MS,
        ],
        w in any::<u32>(),
        s in any::<u32>(),
    ) {
        let t = l.tick_at(ms);
        prop_assert!(l.tick_start_unix_ms(t) <= ms);
        prop_assert!(ms < l.tick_start_unix_ms(t + 1));
        prop_assert_eq!(l.tick_start_unix_ms(t + 1) - l.tick_start_unix_ms(t), l.unit_ms);
        prop_assert_eq!(l.tick_at(l.tick_start_unix_ms(t)), t);
        prop_assert_eq!(l.tick_at(l.tick_start_unix_ms(t + 1) - 1), t);
        match l.first_id_at(ms) {
            Ok(first) => {
                prop_assert!((0..=l.max_ticks()).contains(&t));
                let want = Parts { ticks: t, worker_id: 0, sequence: 0 };
                prop_assert_eq!(l.decode(first).unwrap(), want);
                let w = w % (l.max_worker_id() + 1).max(1);
                let s = s % (l.max_sequence() + 1);
                prop_assert!(first <= l.compose(t, w, s).unwrap());
                if t > 0 {
                    prop_assert!(first > last_id_of_tick(&l, t - 1));
                }
            }
            Err(e) => {
                prop_assert!(t < 0 || t > l.max_ticks(), "{:?} at tick {}", e, t);
                prop_assert_eq!(e, PartError::Ticks { value: t, max: l.max_ticks() });
            }
        }
    }

    /// The end of a layout is the last millisecond of its last tick.
    #[test]
    fn end_is_the_last_millisecond_of_the_last_tick(l in arb_layout()) {
        let exact = exact_end_ms(l.epoch_ms, l.unit_ms, l.time_bits());
        if exact < i128::from(i64::MAX) {
            prop_assert_eq!(i128::from(l.end_unix_ms()), exact);
            prop_assert_eq!(l.tick_at(l.end_unix_ms()), l.max_ticks());
            prop_assert_eq!(l.tick_at(l.end_unix_ms() + 1), l.max_ticks() + 1);
            prop_assert!(l.first_id_at(l.end_unix_ms()).is_ok());
            prop_assert!(l.first_id_at(l.end_unix_ms() + 1).is_err());
        } else {
            prop_assert_eq!(l.end_unix_ms(), i64::MAX);
        }
        prop_assert!(l.end_unix_ms() >= NOW + MIN_LIFETIME_MS);
    }

    /// A changed layout starts at the first tick whose IDs are all above
    /// every ID the old layout can have issued up to a time; `None` exactly
    /// when no tick of the new layout gets there.
    #[test]
    fn first_tick_above_is_the_first_tick_above_the_old_ids(
        old in arb_layout(),
        new in arb_layout(),
        until in prop_oneof![
            (NOW - 60 * YEAR_MS)..=(NOW + YEAR_MS),
            Just(i64::MIN),
            Just(i64::MAX),
            any::<i64>(),
        ],
    ) {
        let old_tick = old.tick_at(until).min(old.max_ticks());
        let got = new.first_tick_above(&old, until);
        if old_tick < 0 {
            prop_assert_eq!(got, Some(0));
        } else {
            let old_max = last_id_of_tick(&old, old_tick);
            match got {
                Some(t) => {
                    prop_assert!((0..=new.max_ticks()).contains(&t));
                    // Every ID of tick t (and after) is above the old ones ...
                    prop_assert!(new.compose(t, 0, 0).unwrap() > old_max);
                    // ... and some ID of the tick before is not.
                    if t > 0 {
                        prop_assert!(new.compose(t - 1, 0, 0).unwrap() <= old_max);
                    }
                }
                None => {
                    prop_assert!(new.compose(new.max_ticks(), 0, 0).unwrap() <= old_max);
                }
            }
        }
    }

    /// Property 8: format then parse gives back the millisecond, 1970 to 2200.
    #[test]
    fn format_then_parse_round_trips(ms in 0..YEAR_2200_MS) {
        let text = format_unix_ms(ms);
        prop_assert_eq!(text.len(), 24, "{}", text);
        prop_assert_eq!(parse_epoch(&text), Ok(ms), "{}", text);
        // The other accepted spellings of the same instant.
        let bare = &text[..23];
        prop_assert_eq!(parse_epoch(bare), Ok(ms));
        prop_assert_eq!(parse_epoch(&bare.replacen(' ', "T", 1)), Ok(ms));
        for suffix in ["z", "+00", "+00:00", "+0000"] {
            let spelled = format!(" {bare}{suffix} ");
            prop_assert_eq!(parse_epoch(&spelled), Ok(ms), "{}", spelled);
        }
        // The date alone is midnight.
        prop_assert_eq!(parse_epoch(&text[..10]), Ok(ms - ms.rem_euclid(DAY_MS)));
        // Unix milliseconds as digits.
        prop_assert_eq!(parse_epoch(&ms.to_string()), Ok(ms));
    }

    /// The same round trip over every four-digit year (0000 to 9999).
    #[test]
    fn format_then_parse_round_trips_for_four_digit_years(ms in YEAR_0_MS..=YEAR_9999_END_MS) {
        let text = format_unix_ms(ms);
        prop_assert_eq!(parse_epoch(&text), Ok(ms), "{}", text);
    }

    /// Dates and times built from fields parse to the slow count of days.
    #[test]
    fn parse_matches_a_naive_calendar(
        // Centuries and February often: the leap-year rules live there.
        y in prop_oneof![0..=9999i64, (0..=99i64).prop_map(|c| c * 100)],
        m in prop_oneof![1..=12i64, Just(2i64)],
        d_seed in any::<u32>(),
        (h, mi, s) in (0..=23i64, 0..=59i64, 0..=59i64),
        frac in prop_oneof![Just(None), (1..=3usize, 0..1000i64).prop_map(Some)],
        sep in prop_oneof![Just(' '), Just('T')],
        suffix in prop::sample::select(vec!["", "Z", "z", "+00", "+00:00", "+0000"]),
    ) {
        let d = 1 + i64::from(d_seed) % naive_month_len(y, m);
        let mut text = format!("{y:04}-{m:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}");
        let mut want = naive_days(y, m, d) * DAY_MS + ((h * 60 + mi) * 60 + s) * 1000;
        if let Some((len, v)) = frac {
            let digits = format!("{v:03}");
            text.push('.');
            text.push_str(&digits[..len]);
            want += digits[..len].parse::<i64>().unwrap() * [100, 10, 1][len - 1];
        }
        text.push_str(suffix);
        prop_assert_eq!(parse_epoch(&text), Ok(want), "{}", text);
        prop_assert_eq!(format_unix_ms(want)[..19].replace(' ', "T"), text[..19].replace(' ', "T"));
        // The day after the month's last is not a date.
        let bad = format!("{y:04}-{m:02}-{:02}", naive_month_len(y, m) + 1);
        prop_assert!(parse_epoch(&bad).is_err(), "{}", bad);
    }

    /// A field out of its range (month, day, hour, minute, second,
    /// fraction) makes the text an error, not a wrapped date.
    #[test]
    fn parse_rejects_out_of_range_fields(
        y in 0..=9999i64,
        m in 1..=12i64,
        d_seed in any::<u32>(),
        field in 0..6usize,
        bad in 0..=99i64,
        edge in any::<bool>(),
    ) {
        let dim = naive_month_len(y, m);
        let d = 1 + i64::from(d_seed) % dim;
        let mut f = [m, d, 12, 30, 30];
        // The first invalid value half the time, any invalid value otherwise.
        let spread = if edge { 0 } else { bad };
        let bad = match field {
            0 if bad % 2 == 0 => 0,
            0 => 13 + spread % 87,
            1 if bad % 2 == 0 => 0,
            1 => dim + 1 + spread % (99 - dim),
            2 => 24 + spread % 76,
            3 | 4 => 60 + spread % 40,
            _ => bad,
        };
        let text = if field < 5 {
            f[field] = bad;
            format!("{y:04}-{:02}-{:02} {:02}:{:02}:{:02}", f[0], f[1], f[2], f[3], f[4])
        } else {
            // A fraction of four digits or more is not milliseconds.
            format!("{y:04}-{m:02}-{d:02} 12:30:30.{bad:04}")
        };
        prop_assert!(parse_epoch(&text).is_err(), "{}", text);
    }

    /// `parse_epoch` never panics, whatever the text.
    #[test]
    fn parse_epoch_never_panics(
        text in prop_oneof![
            any::<String>(),
            "[0-9 :.TZz+-]{0,30}",
            concat!(
                "[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}",
                "(\\.[0-9]{0,4})?(Z|\\+00|\\+00:00)?",
            ),
        ],
    ) {
        let _ = parse_epoch(&text);
    }

    /// `format_unix_ms` never panics.
    #[test]
    fn format_never_panics(ms in any::<i64>()) {
        let _ = format_unix_ms(ms);
    }
}

// ---------------------------------------------------------------------------
// Layout::new
// ---------------------------------------------------------------------------

/// What `Layout::new` should answer, from the rules in its doc comment.
fn expected_new(
    epoch: i64,
    unit: i64,
    total: u32,
    worker: u32,
    seq: u32,
) -> Result<Layout, &'static str> {
    if !(1..=86_400_000).contains(&unit) {
        return Err("time_unit_ms");
    }
    if !(2..=63).contains(&total) {
        return Err("total_bits");
    }
    if worker > MAX_WORKER_BITS {
        return Err("worker_bits");
    }
    if !(1..=MAX_SEQUENCE_BITS).contains(&seq) {
        return Err("sequence_bits");
    }
    if worker + seq >= total {
        return Err("bits");
    }
    if epoch > NOW {
        return Err("future");
    }
    if exact_end_ms(epoch, unit, total - worker - seq) <= i128::from(NOW) {
        return Err("ended");
    }
    Ok(Layout {
        epoch_ms: epoch,
        unit_ms: unit,
        total_bits: total,
        worker_bits: worker,
        sequence_bits: seq,
    })
}

fn kind(r: &Result<Layout, LayoutError>) -> Result<Layout, &'static str> {
    match r {
        Ok(l) => Ok(*l),
        Err(LayoutError::Setting { name, .. }) => Err(*name),
        Err(LayoutError::Bits { .. }) => Err("bits"),
        Err(LayoutError::EpochInFuture { .. }) => Err("future"),
        Err(LayoutError::Ended { .. }) => Err("ended"),
        Err(LayoutError::Lifetime { .. }) => Err("lifetime"),
    }
}

/// Settings whose time field spans more than ten years (and at most 2^62
/// ms, so that the epoch that ends it exactly ten years after now fits).
fn arb_edge_layout() -> impl Strategy<Value = (i64, u32, u32, u32)> {
    (
        arb_unit(),
        0..=MAX_WORKER_BITS,
        1..=MAX_SEQUENCE_BITS,
        any::<u32>(),
    )
        .prop_filter_map("no time field spans ten years", |(unit, w, s, seed)| {
            let span = |tb: u32| (1i128 << tb) * i128::from(unit);
            let fits: Vec<u32> = (1..=63 - w - s)
                .filter(|&tb| span(tb) > i128::from(MIN_LIFETIME_MS) && span(tb) <= 1i128 << 62)
                .collect();
            let n = u32::try_from(fits.len()).ok().filter(|&n| n > 0)?;
            Some((unit, w, s, fits[usize::try_from(seed % n).ok()?]))
        })
}

proptest! {
    /// Property 9: `Layout::new` accepts exactly what the rules allow, and
    /// says why not.
    #[test]
    fn layout_new_follows_the_rules(
        epoch in prop_oneof![
            (NOW - 100 * YEAR_MS)..=(NOW + YEAR_MS),
            Just(NOW),
            Just(NOW + 1),
            YEAR_0_MS..=NOW,
        ],
        unit in prop_oneof![-5..=0i64, 1..=1000i64, 1..=86_400_000i64, 86_400_001..=100_000_000i64],
        total in prop_oneof![0..=70u32, 40..=63u32],
        worker in prop_oneof![0..=20u32, 0..=16u32],
        seq in prop_oneof![0..=34u32, 1..=20u32],
    ) {
        let got = Layout::new(epoch, unit, total, worker, seq, NOW);
        prop_assert_eq!(kind(&got), expected_new(epoch, unit, total, worker, seq), "{:?}", got);
        match got {
            Err(LayoutError::Bits { total: t, worker: w, sequence: s }) => {
                prop_assert_eq!((t, w, s), (total, worker, seq));
            }
            Err(LayoutError::EpochInFuture { epoch_ms, now_ms }) => {
                prop_assert_eq!((epoch_ms, now_ms), (epoch, NOW));
            }
            Err(LayoutError::Ended { end_ms, now_ms }) => {
                let exact = exact_end_ms(epoch, unit, total - worker - seq);
                prop_assert_eq!(i128::from(end_ms), exact);
                prop_assert_eq!(now_ms, NOW);
            }
            _ => {}
        }
    }

    /// Property 9: a layout makes IDs up to its last millisecond and none
    /// after it; it warns when it ends within the years asked.
    #[test]
    fn end_of_the_layout_at_the_exact_edge((unit, worker, seq, tb) in arb_edge_layout()) {
        let span = (1i128 << tb) * i128::from(unit);
        // With this epoch the layout's last millisecond is now.
        let edge = i64::try_from(i128::from(NOW) + 1 - span).unwrap();
        let total = tb + worker + seq;
        prop_assert_eq!(
            Layout::new(edge, unit, total, worker, seq, NOW),
            Err(LayoutError::Ended { end_ms: NOW, now_ms: NOW })
        );
        let ok = Layout::new(edge + 1, unit, total, worker, seq, NOW).unwrap();
        prop_assert_eq!(ok.end_unix_ms(), NOW + 1);
        prop_assert!(ok.ends_within(NOW, 1));
        prop_assert!(!ok.ends_within(NOW, 0));
        // Ten years ahead: warned about at 11 years, not at 10.
        let later = i64::try_from(i128::from(NOW + MIN_LIFETIME_MS) + 1 - span).unwrap();
        let l = Layout::new(later, unit, total, worker, seq, NOW).unwrap();
        prop_assert!(l.ends_within(NOW, 11));
        prop_assert!(!l.ends_within(NOW, 10));
    }

    /// Property 9: every preset is valid at any epoch from 2015 to now, with
    /// the fields of the preset.
    #[test]
    fn presets_are_accepted(epoch in (NOW - 12 * YEAR_MS)..=NOW) {
        for p in PRESETS {
            let (u, t, w, s) = (p.unit_ms, p.total_bits, p.worker_bits, p.sequence_bits);
            let l = Layout::new(epoch, u, t, w, s, NOW).unwrap();
            prop_assert_eq!(
                (l.unit_ms, l.total_bits, l.worker_bits, l.sequence_bits),
                (p.unit_ms, p.total_bits, p.worker_bits, p.sequence_bits)
            );
            prop_assert_eq!(i128::from(l.max_id()), (1i128 << p.total_bits) - 1);
        }
    }
}

#[test]
fn leap_years_follow_the_gregorian_rules() {
    for (text, ok) in [
        ("1900-02-29", false),
        ("2100-02-29", false),
        ("2200-02-29", false),
        ("1800-02-29", false),
        ("2023-02-29", false),
        ("2000-02-29", true),
        ("2400-02-29", true),
        ("2024-02-29", true),
        ("0000-02-29", true),
    ] {
        assert_eq!(parse_epoch(text).is_ok(), ok, "{text}");
    }
    assert_eq!(
        parse_epoch("2000-03-01").unwrap() - parse_epoch("2000-02-28").unwrap(),
        2 * DAY_MS
    );
    assert_eq!(
        parse_epoch("2100-03-01").unwrap() - parse_epoch("2100-02-28").unwrap(),
        DAY_MS
    );
    assert_eq!(
        format_unix_ms(parse_epoch("2100-03-01").unwrap() - 1),
        "2100-02-28 23:59:59.999Z"
    );
}

#[test]
fn layout_new_rejects_each_rule_once() {
    let ok = Layout::new(DEFAULT_EPOCH_MS, 1, 63, 10, 12, NOW);
    assert!(ok.is_ok());
    assert!(matches!(
        Layout::new(DEFAULT_EPOCH_MS, 1, 63, 10, 0, NOW),
        Err(LayoutError::Setting {
            name: "sequence_bits",
            value: 0,
            ..
        })
    ));
    assert_eq!(
        Layout::new(DEFAULT_EPOCH_MS, 1, 22, 10, 12, NOW),
        Err(LayoutError::Bits {
            total: 22,
            worker: 10,
            sequence: 12
        })
    );
    assert_eq!(
        Layout::new(NOW + 1, 1, 63, 10, 12, NOW),
        Err(LayoutError::EpochInFuture {
            epoch_ms: NOW + 1,
            now_ms: NOW
        })
    );
    // An epoch equal to now is fine.
    assert!(Layout::new(NOW, 1, 63, 10, 12, NOW).is_ok());
    // classic's 41 bits of milliseconds last 69.7 years: an epoch 60 years
    // ago leaves less than ten (a warning), 70 years ago none (refused).
    let old = Layout::new(NOW - 60 * YEAR_MS, 1, 63, 10, 12, NOW).unwrap();
    assert!(old.ends_within(NOW, 10));
    assert!(matches!(
        Layout::new(NOW - 70 * YEAR_MS, 1, 63, 10, 12, NOW),
        Err(LayoutError::Ended { .. })
    ));
    for (name, total, worker, seq, unit) in [
        ("time_unit_ms", 63, 10, 12, 0),
        ("time_unit_ms", 63, 10, 12, 86_400_001),
        ("total_bits", 64, 10, 12, 1),
        ("total_bits", 1, 0, 1, 1),
        ("worker_bits", 63, 17, 12, 1),
        ("sequence_bits", 63, 10, 31, 1),
    ] {
        match Layout::new(DEFAULT_EPOCH_MS, unit, total, worker, seq, NOW) {
            Err(LayoutError::Setting { name: n, .. }) => assert_eq!(n, name),
            other => panic!("{name}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Worker ranges
// ---------------------------------------------------------------------------

/// Disjoint ranges (possibly adjacent), sorted, and the largest worker id.
fn arb_ranges() -> impl Strategy<Value = (Vec<(u32, u32)>, u32)> {
    (
        prop_oneof![Just(0u32), 0..=1000u32, 0..=1_000_000u32],
        prop::collection::vec((prop_oneof![Just(0u32), 1..=50u32], 0..=30u32), 1..8),
        0..=5u32,
    )
        .prop_map(|(base, pieces, extra)| {
            let mut next = base;
            let mut ranges = Vec::new();
            for (gap, len) in pieces {
                let lo = next + gap;
                let hi = lo + len;
                ranges.push((lo, hi));
                next = hi + 1;
            }
            (ranges, next - 1 + extra)
        })
}

fn range_text(&(lo, hi): &(u32, u32)) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

proptest! {
    /// Property 10: parse(display(r)) == r; display is sorted and canonical;
    /// len, iter and contains agree with the set.
    #[test]
    fn worker_ranges_round_trip_and_agree(
        (ranges, max) in arb_ranges(),
        order in any::<u64>(),
        spaces in any::<bool>(),
    ) {
        let canonical: Vec<String> = ranges.iter().map(range_text).collect();
        let canonical = canonical.join(",");
        // Any order, with or without spaces, parses to the same set.
        let mut shuffled: Vec<String> = ranges.iter().map(range_text).collect();
        let n = shuffled.len();
        shuffled.rotate_left(usize::try_from(order % n as u64).unwrap());
        if order % 2 == 1 {
            shuffled.reverse();
        }
        let sep = if spaces { " , " } else { "," };
        let text = format!("{}{}", if spaces { "  " } else { "" }, shuffled.join(sep));
        let r = WorkerRanges::parse(&text, max).unwrap();
        prop_assert_eq!(r.to_string(), canonical.clone());
        prop_assert_eq!(WorkerRanges::parse(&r.to_string(), max), Ok(r.clone()));

        let want: Vec<u32> = ranges.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
        let got: Vec<u32> = r.iter().collect();
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(r.len(), u64::try_from(r.iter().count()).unwrap());
        prop_assert!(!r.is_empty());
        let set: HashSet<u32> = want.iter().copied().collect();
        let lo = ranges[0].0.saturating_sub(3);
        for id in lo..=max.saturating_add(3) {
            prop_assert_eq!(r.contains(id), set.contains(&id), "{}", id);
        }
        // A smaller layout rejects the set; a wider one accepts it.
        let top = ranges.last().unwrap().1;
        if top > 0 {
            prop_assert!(WorkerRanges::parse(&text, top - 1).is_err());
        }
        prop_assert!(WorkerRanges::parse(&text, u32::MAX).is_ok());
    }

    /// Property 10: overlapping ranges are refused.
    #[test]
    fn overlapping_worker_ranges_are_refused(
        (ranges, max) in arb_ranges(),
        pick in any::<usize>(),
        inner in any::<u32>(),
    ) {
        let (lo, hi) = ranges[pick % ranges.len()];
        let id = lo + inner % (hi - lo + 1);
        let mut parts: Vec<String> = ranges.iter().map(range_text).collect();
        parts.push(id.to_string());
        let text = parts.join(",");
        let err = WorkerRanges::parse(&text, max).unwrap_err();
        prop_assert!(matches!(err, RangeError::Overlap { .. }), "{}: {}", text, err);
    }

    /// `WorkerRanges::parse` never panics, whatever the text.
    #[test]
    fn worker_ranges_parse_never_panics(
        text in prop_oneof![any::<String>(), "[0-9, -]{0,30}"],
        max in any::<u32>(),
    ) {
        if let Ok(r) = WorkerRanges::parse(&text, max) {
            prop_assert!(r.len() <= u64::from(max) + 1);
            prop_assert_eq!(WorkerRanges::parse(&r.to_string(), max), Ok(r));
        }
    }
}

#[test]
fn worker_ranges_at_the_top_of_u32() {
    let all = WorkerRanges::all(u32::MAX);
    assert_eq!(all.len(), 1u64 << 32);
    assert!(all.contains(u32::MAX) && all.contains(0));
    let r = WorkerRanges::parse("4294967295", u32::MAX).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r.iter().collect::<Vec<_>>(), vec![u32::MAX]);
    assert!(WorkerRanges::parse("4294967296", u32::MAX).is_err());
    assert_eq!(WorkerRanges::parse("  ", 7), Ok(WorkerRanges::all(7)));
}

// ---------------------------------------------------------------------------
// Example-based tests of the generator rules
// ---------------------------------------------------------------------------

fn classic() -> Layout {
    preset_layout(0, DEFAULT_EPOCH_MS)
}

/// Rule 3 with a unit longer than a millisecond: the wait ends at the start
/// of the next tick, not a whole unit later.
#[test]
fn wait_ends_at_the_start_of_the_next_tick() {
    let l = preset_layout(1, DEFAULT_EPOCH_MS); // sonyflake: 10 ms, 256 per tick
    let mut g = GeneratorState::new(&l);
    let start = l.tick_start_unix_ms(l.tick_at(NOW)) + 7;
    let mut c = TraceClock::new(start);
    for _ in 0..256 {
        g.next_id(&l, 3, 0, &mut c).unwrap();
    }
    assert!(c.sleeps.is_empty());
    let id = g.next_id(&l, 3, 0, &mut c).unwrap();
    assert_eq!(c.sleeps, vec![3]);
    assert_eq!(l.decode(id).unwrap().ticks, l.tick_at(NOW) + 1);
    assert_eq!(g.max_drift, 0);
}

/// A drift bound below one tick is a bound of zero ticks.
#[test]
fn drift_bound_is_rounded_down_to_whole_ticks() {
    let l = preset_layout(1, DEFAULT_EPOCH_MS);
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(NOW);
    for _ in 0..257 {
        g.next_id(&l, 0, 19, &mut c).unwrap();
    }
    // 19 ms is one tick of 10 ms: 2 ticks' worth without sleeping.
    assert!(c.sleeps.is_empty());
    for _ in 0..256 {
        g.next_id(&l, 0, 19, &mut c).unwrap();
    }
    assert_eq!(c.sleeps, vec![10]);
    assert_eq!(g.max_drift, 1);
}

/// Rule 4: the bound is checked against the last tick used, and the error
/// goes away when the clock comes back within it (no waiting).
#[test]
fn clock_behind_names_the_gap_and_the_bound() {
    let l = classic();
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(NOW);
    g.next_id(&l, 1, 0, &mut c).unwrap();
    c.ms -= 1;
    let before = g;
    assert_eq!(
        g.next_id(&l, 1, 0, &mut c),
        Err(GenError::ClockBehind {
            behind: 1,
            bound: 0
        })
    );
    assert!(c.sleeps.is_empty());
    assert_eq!(
        (g.last_tick, g.sequence),
        (before.last_tick, before.sequence)
    );
    c.ms += 1;
    assert!(g.next_id(&l, 1, 0, &mut c).is_ok());
}

/// Rule 5 with borrowing: the borrowed tick past the end is an error, not
/// a wrap-around, and the state is unchanged.
#[test]
fn borrowing_past_the_end_is_layout_exhausted() {
    let l = preset_layout(2, DEFAULT_EPOCH_MS); // js53: 64 per tick
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(l.end_unix_ms());
    let mut last = -1;
    for _ in 0..64 {
        let id = g.next_id(&l, 0, 1000, &mut c).unwrap();
        assert!(id > last);
        last = id;
    }
    assert_eq!(last, l.compose(l.max_ticks(), 0, 63).unwrap());
    let before = g;
    assert_eq!(
        g.next_id(&l, 0, 1000, &mut c),
        Err(GenError::LayoutExhausted {
            tick: l.max_ticks() + 1,
            max: l.max_ticks()
        })
    );
    assert_eq!(g.last_tick, before.last_tick);
    assert_eq!(g.ids_issued, 64);
}

/// A floor at the last tick leaves nothing to issue.
#[test]
fn floor_at_the_last_tick_is_layout_exhausted() {
    let l = classic();
    let mut g = GeneratorState::starting_above(l.max_ticks(), &l);
    let mut c = TraceClock::new(l.end_unix_ms());
    assert!(matches!(
        g.next_id(&l, 0, 1000, &mut c),
        Err(GenError::LayoutExhausted { .. })
    ));
}

/// `drift_at` is the last tick's lead over the clock, never negative.
#[test]
fn drift_at_is_never_negative() {
    let l = classic();
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(NOW);
    g.next_id(&l, 0, 1000, &mut c).unwrap();
    let t = l.tick_at(NOW);
    assert_eq!(g.drift_at(t), 0);
    assert_eq!(g.drift_at(t + 50), 0);
    assert_eq!(g.drift_at(t - 7), 7);
}

/// A generator's counters start at zero and `new` starts below tick 0.
#[test]
fn a_fresh_generator_can_issue_tick_zero() {
    let l = classic();
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(l.epoch_ms);
    assert_eq!(g.next_id(&l, 0, 0, &mut c), Ok(0));
    assert_eq!(g.next_id(&l, 0, 0, &mut c), Ok(1));
    assert_eq!((g.ids_issued, g.clock_backward, g.max_drift), (2, 0, 0));
}

/// `clock_backward` counts readings lower than the previous *reading*. A
/// generator started above a floor (server start, hand-over) has not read
/// the clock yet: a first reading below the floor is not "backwards".
/// (Found by these tests: `starting_above` used to store the floor in
/// `last_seen`.)
#[test]
fn first_reading_below_a_floor_is_not_backwards() {
    let l = classic();
    let floor = l.tick_at(NOW) + 100;
    let mut g = GeneratorState::starting_above(floor, &l);
    let mut c = TraceClock::new(NOW);
    let id = g.next_id(&l, 0, 1000, &mut c).unwrap();
    assert!(id > last_id_of_tick(&l, floor));
    // One reading, nothing before it: the clock did not go backwards.
    assert_eq!(g.clock_backward, 0);
}

/// The same with `new` and a first reading before the epoch (tick -5, below
/// the floor of tick -1).
#[test]
fn first_reading_before_the_epoch_is_not_backwards() {
    let l = classic();
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(l.epoch_ms - 5);
    assert_eq!(g.next_id(&l, 0, 1000, &mut c), Ok(0));
    assert_eq!(g.clock_backward, 0);
}

/// After a clock that went backwards within the bound, IDs stay on the last
/// tick until it fills, then borrow, never going under the clock.
#[test]
fn backward_clock_within_the_bound_fills_the_last_tick_first() {
    let l = preset_layout(2, DEFAULT_EPOCH_MS); // js53: 64 per tick
    let mut g = GeneratorState::new(&l);
    let mut c = TraceClock::new(NOW);
    let t = l.tick_at(NOW);
    g.next_id(&l, 2, 10, &mut c).unwrap();
    c.ms -= 5;
    for seq in 1..64 {
        let p = l.decode(g.next_id(&l, 2, 10, &mut c).unwrap()).unwrap();
        assert_eq!((p.ticks, p.sequence), (t, seq));
    }
    let p = l.decode(g.next_id(&l, 2, 10, &mut c).unwrap()).unwrap();
    assert_eq!((p.ticks, p.sequence), (t + 1, 0));
    assert_eq!(g.max_drift, 6);
    assert_eq!(g.clock_backward, 1);
    assert_eq!(g.sequence_exhausted, 1);
}

// ---------------------------------------------------------------------------
// Sharing: several generators on one position word (compare-and-swap)
// ---------------------------------------------------------------------------

/// What one sharer does next in an interleaving.
#[derive(Clone, Debug)]
enum ShareOp {
    /// Read the word and the clock, and compute the next position.
    Read(usize),
    /// Try to publish what the last `Read` computed (compare-and-swap).
    Commit(usize),
    /// The wall clock moves by this many ms (may go back).
    Clock(i64),
}

fn arb_share_op(sharers: usize) -> impl Strategy<Value = ShareOp> {
    prop_oneof![
        4 => (0..sharers).prop_map(ShareOp::Read),
        4 => (0..sharers).prop_map(ShareOp::Commit),
        1 => prop_oneof![3 => 0..=3i64, 1 => -20..=20i64, 1 => -3000..=3000i64].prop_map(ShareOp::Clock),
    ]
}

/// One sharer: its generator and the attempt it has read but not
/// published yet.
struct Sharer {
    g: GeneratorState,
    pending: Option<(i64, Result<Step, GenError>, GeneratorState)>,
    ids: Vec<i64>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Sharing: any number of generators on one worker id, each reading the
    /// word, computing from its own (possibly stale) reading and publishing
    /// by compare-and-swap in any interleaving, with the clock moving either
    /// way: every ID is distinct and above the floor, each generator's IDs
    /// strictly increase, the word is the position of the largest ID, and
    /// the counters add up.
    #[test]
    fn sharers_on_one_word_never_repeat_an_id(
        l in arb_small_sequence_layout(),
        worker in any::<u32>(),
        sharers in 1..=5usize,
        d in 0..=4i64,
        floor_offset in -5..=5i64,
        ops in proptest::collection::vec(arb_share_op(5), 1..400),
    ) {
        let worker = worker_of(&l, worker);
        let max_drift = d;
        let mut ms = NOW;
        let floor_tick = (l.tick_at(NOW) + floor_offset).max(-1);
        let floor_max = if floor_tick < 0 {
            -1
        } else {
            l.compose(floor_tick, worker, l.max_sequence()).unwrap()
        };
        let word = std::cell::Cell::new(crate::generator::floor_word(&l, floor_tick));
        let mut all: Vec<Sharer> = (0..sharers)
            .map(|_| Sharer { g: GeneratorState::new(&l), pending: None, ids: Vec::new() })
            .collect();
        let mut issued = HashSet::new();
        let mut max_id = i64::MIN;
        for op in ops {
            match op {
                ShareOp::Clock(delta) => ms = (ms + delta).max(l.epoch_ms),
                ShareOp::Read(i) => {
                    let s = &mut all[i % sharers];
                    let current = word.get();
                    let (step, next) =
                        s.g.attempt(&l, worker, current, l.tick_at(ms), max_drift, || i64::MIN);
                    s.pending = Some((current, step, next));
                }
                ShareOp::Commit(i) => {
                    let s = &mut all[i % sharers];
                    let Some((current, step, next)) = s.pending.take() else { continue };
                    match step {
                        Ok(Step::Issue(id)) => {
                            if !crate::generator::SharedPosition::compare_exchange(
                                &word, current, next.word(&l),
                            ) {
                                // Lost the race: nothing changes, start over.
                                prop_assert!(word.get() > current);
                                continue;
                            }
                            s.g = next;
                            prop_assert!(id > floor_max, "id {} at or below the floor", id);
                            prop_assert!(issued.insert(id), "id {} issued twice", id);
                            if let Some(&last) = s.ids.last() {
                                prop_assert!(id > last, "sharer {}: {} after {}", i, id, last);
                            }
                            prop_assert_eq!(l.decode(id).unwrap().worker_id, worker);
                            s.ids.push(id);
                            max_id = max_id.max(id);
                            let p = l.decode(max_id).unwrap();
                            prop_assert_eq!(word.get(), crate::generator::pack(&l, p.ticks, p.sequence));
                        }
                        Ok(Step::WaitUntil(_)) | Err(_) => s.g = next,
                    }
                }
            }
        }
        let total: u64 = all.iter().map(|s| s.g.ids_issued).sum();
        prop_assert_eq!(total, issued.len() as u64);
        let exhausted: u64 = all.iter().map(|s| s.g.sequence_exhausted).sum();
        let at_max = issued
            .iter()
            .filter(|&&id| l.decode(id).unwrap().sequence == l.max_sequence())
            .count() as u64;
        prop_assert_eq!(exhausted, at_max);
    }

    /// The position word orders like the IDs and round-trips.
    #[test]
    fn position_word_orders_like_the_ids(
        (l, a) in arb_layout().prop_flat_map(arb_parts),
        b_tick in any::<i64>(),
        b_seq in any::<u32>(),
    ) {
        let b_tick = b_tick.rem_euclid(l.max_ticks() + 1);
        let b_seq = b_seq % (l.max_sequence() + 1);
        let wa = crate::generator::pack(&l, a.ticks, a.sequence);
        let wb = crate::generator::pack(&l, b_tick, b_seq);
        prop_assert_eq!(crate::generator::unpack(&l, wa), (a.ticks, a.sequence));
        prop_assert_eq!(
            wa.cmp(&wb),
            l.compose(a.ticks, 0, a.sequence).unwrap().cmp(&l.compose(b_tick, 0, b_seq).unwrap())
        );
        prop_assert_eq!(crate::generator::pack(&l, -1, l.max_sequence()), -1);
    }
}
