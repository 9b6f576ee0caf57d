//! The held window (`held`) against the rule it stands for,
//! `GeneratorState::next_held`: over any state, drift bound and run of
//! clock readings, the window admits only readings `next_held` admits,
//! makes the same IDs and leaves the same state; with millisecond ticks it
//! admits exactly the same readings.

use super::*;
use crate::generator::GeneratorState;
use crate::held::HeldWindow;

proptest! {
    #[test]
    fn the_window_makes_what_next_held_makes(
        l in arb_layout(),
        tick_offset in -1_000i64..1_000,
        seen_back in prop_oneof![Just(None), (0i64..2_000).prop_map(Some)],
        sequence in 0u32..6,
        ahead in 0u32..6,
        drift_ms in prop_oneof![Just(0i64), 0i64..3_000, Just(3_600_000)],
        readings in prop::collection::vec((0u8..3, -3_000i64..3_000), 1..20),
    ) {
        let last_tick = l.tick_at(NOW) + tick_offset;
        let mut state = GeneratorState::new(&l);
        state.last_tick = last_tick;
        state.sequence = sequence;
        state.ids_issued = 7;
        if let Some(back) = seen_back {
            state.last_seen = last_tick - back;
        }
        let held = sequence + ahead;
        let id_base = 1i64 << 40;
        let bound = l.whole_ticks(drift_ms);
        let Some((mut window, mut cursor)) = HeldWindow::open(&state, &l, held, drift_ms, id_base) else {
            prop_assert!(ahead == 0);
            return Ok(());
        };
        let mut rule = state;
        // Readings near now, and at the edges of the last tick.
        let edges = [NOW, l.tick_start_unix_ms(last_tick), l.tick_start_unix_ms(last_tick + 1)];
        for (edge, offset) in readings {
            let now_ms = match edge {
                0 => NOW + offset,
                e => edges[usize::from(e)] + offset % 3,
            };
            let before = cursor;
            let by_window = window.next(&mut cursor, now_ms);
            let mut tried = rule;
            let by_rule = tried.next_held(l.clock_tick(now_ms), held, bound);
            match by_window {
                Some(id) => {
                    prop_assert_eq!(Some(id), by_rule.map(|s| id_base | i64::from(s)));
                    rule = tried;
                    let mut folded = state;
                    window.fold(&cursor, &mut folded, &l);
                    let mut shut = state;
                    let closed = window.shut();
                    let mut unmoved = cursor;
                    prop_assert_eq!(closed.next(&mut unmoved, now_ms), None, "a shut window admits nothing");
                    prop_assert_eq!(unmoved, cursor, "and leaves its cursor alone");
                    closed.fold(&cursor, &mut shut, &l);
                    prop_assert_eq!(shut, rule, "and folds what the open one made");
                    prop_assert_eq!(folded, rule);
                }
                None => {
                    prop_assert_eq!(cursor, before);
                    if l.unit_ms == 1 {
                        prop_assert_eq!(by_rule, None, "ms ticks: the window is exact");
                    }
                    // The long way decides; the window then reopens from
                    // the rule's state, as the glue does.
                    if by_rule.is_some() {
                        rule = tried;
                    }
                    match HeldWindow::open(&rule, &l, held, drift_ms, id_base) {
                        Some((w, c)) => (window, cursor) = (w, c),
                        None => return Ok(()),
                    }
                    state = rule;
                }
            }
        }
    }
}
