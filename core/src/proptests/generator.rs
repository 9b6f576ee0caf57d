//! The generator's properties 1 to 7 over clock traces (the rules of
//! `generator`), then example-based tests of the same rules.

use super::trace::*;
use super::*;
use crate::generator::{GenError, GeneratorState, Step};
use std::collections::HashSet;

proptest! {
    /// The held path's comparisons decide by the exact drift
    /// (0 <= last_tick - now <= max_drift, computed in i128), for any state
    /// and reading, the ends of i64 included. (The saturating formula they
    /// replaced differed only where the drift does not fit an i64.)
    #[test]
    fn next_held_decides_by_the_exact_drift(
        last_tick in prop_oneof![any::<i64>(), -2i64..100, Just(i64::MIN), Just(i64::MAX)],
        now in prop_oneof![any::<i64>(), -2i64..100, Just(i64::MIN), Just(i64::MAX)],
        last_seen in prop_oneof![any::<i64>(), -2i64..100, Just(i64::MIN)],
        max_drift in prop_oneof![any::<i64>(), -1i64..10, Just(i64::MAX)],
        sequence in 0u32..8,
        held in 0u32..8,
    ) {
        let l = preset_layout(0, NOW);
        let mut g = GeneratorState::new(&l);
        g.last_tick = last_tick;
        g.last_seen = last_seen;
        g.sequence = sequence;
        let drift = i128::from(last_tick) - i128::from(now);
        let expect = !(drift < 0 || drift > i128::from(max_drift) || now < last_seen
            || sequence >= held);
        let got = g.next_held(now, held, max_drift);
        prop_assert_eq!(got.is_some(), expect);
        if expect {
            prop_assert_eq!(got, Some(sequence + 1));
            prop_assert_eq!((g.last_seen, g.ids_issued), (now, 1));
        }
    }

    /// The hot path's tick of a clock reading is `tick_at`'s, for every
    /// reading within 2^62 ms of the epoch.
    #[test]
    fn clock_tick_is_tick_at_for_clock_readings(
        l in arb_layout(),
        ms in -(1i64 << 62)..(1i64 << 62),
    ) {
        let unix_ms = ms.saturating_add(l.epoch_ms);
        prop_assert_eq!(l.clock_tick(unix_ms), l.tick_at(unix_ms));
    }

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
