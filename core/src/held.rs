//! The held window: [`GeneratorState::next_held`] in the clock's own terms,
//! for the hot path.
//!
//! A generator alone on its worker id holds sequence numbers of its last
//! tick beyond its last ID (see [`GeneratorState::next_ahead`]). Which
//! clock readings may take the next of them depends only on the state, the
//! layout and the drift bound, so it is computed once, when the generator
//! takes them, as a range of Unix milliseconds: the hot path then compares
//! its clock reading with two numbers, with no tick arithmetic, no epoch
//! and no drift bound per ID.
//!
//! The window is never wider than `next_held`: a reading it admits is one
//! `next_held` admits, with the same ID ([`HeldWindow::next`]), and
//! [`HeldWindow::fold`] puts into the state exactly what `next_held` would
//! have. With millisecond ticks it is exactly as wide; with longer ticks a
//! reading in the same tick as the last one but earlier by the millisecond
//! goes the long way (through `next_held`), which decides it.

use crate::generator::GeneratorState;
use crate::layout::Layout;

/// The held IDs a generator may make without its state: what stays fixed
/// while they are made. Plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldWindow {
    /// The latest clock reading (Unix ms) that may take a held ID: the last
    /// millisecond of the last ID's tick.
    pub hi_ms: i64,
    /// The last sequence number held.
    pub held: u32,
    /// The ID of the last tick with sequence number 0.
    pub id_base: i64,
    /// The last ID's tick (for the caller's lease bound).
    pub last_tick: i64,
    /// The generator's count of IDs issued less the cursor's sequence
    /// number (wrapping): the count after an ID is this plus the ID's
    /// sequence number, so the cursor need not carry it.
    pub ids_base: u64,
}

/// What moves as held IDs are made through a [`HeldWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldCursor {
    /// The earliest clock reading (Unix ms) that may take the next held ID:
    /// not before the last reading, and within the drift bound. After an
    /// ID made through the window, that ID's reading.
    pub lo_ms: i64,
    /// The sequence number of the last ID made.
    pub sequence: u32,
}

impl HeldWindow {
    /// A window that admits no reading.
    pub const CLOSED: HeldWindow = HeldWindow {
        hi_ms: i64::MIN,
        held: 0,
        id_base: 0,
        last_tick: 0,
        ids_base: 0,
    };

    /// The window of `state` holding sequence numbers up to `held` of its
    /// last tick (what `next_ahead` returned with the state), IDs of that
    /// tick being `id_base | sequence`, and its cursor; `None` when it holds
    /// none. `max_drift_ms` is the drift bound `next_held` would be given
    /// (in ms: `layout.whole_ticks` of it).
    pub fn open(
        state: &GeneratorState,
        layout: &Layout,
        held: u32,
        max_drift_ms: i64,
        id_base: i64,
    ) -> Option<(HeldWindow, HeldCursor)> {
        if state.sequence >= held || max_drift_ms < 0 {
            return None;
        }
        let drift_floor = state
            .last_tick
            .saturating_sub(layout.whole_ticks(max_drift_ms));
        let lo_ms = layout.tick_start_unix_ms(state.last_seen.max(drift_floor));
        let hi_ms = layout
            .tick_start_unix_ms(state.last_tick.saturating_add(1))
            .saturating_sub(1);
        let window = HeldWindow {
            hi_ms,
            held,
            id_base,
            last_tick: state.last_tick,
            ids_base: state.ids_issued.wrapping_sub(u64::from(state.sequence)),
        };
        let cursor = HeldCursor {
            lo_ms,
            sequence: state.sequence,
        };
        Some((window, cursor))
    }

    /// The next held ID for the clock reading `now_ms`, advancing `cursor`,
    /// or `None` when the window does not admit the reading (then
    /// `next_held` decides; the cursor is unchanged). Cannot panic.
    #[inline(always)]
    pub fn next(&self, cursor: &mut HeldCursor, now_ms: i64) -> Option<i64> {
        if now_ms < cursor.lo_ms || now_ms > self.hi_ms || cursor.sequence >= self.held {
            return None;
        }
        cursor.sequence += 1;
        cursor.lo_ms = now_ms;
        Some(self.id_base | i64::from(cursor.sequence))
    }

    /// The generator's count of IDs issued once `cursor` is its state.
    #[inline(always)]
    pub fn ids_issued(&self, cursor: &HeldCursor) -> u64 {
        self.ids_base.wrapping_add(u64::from(cursor.sequence))
    }

    /// The same window admitting no reading, its cursor still foldable
    /// (the caller's bounds changed: it must open a new one).
    pub fn shut(self) -> HeldWindow {
        HeldWindow {
            hi_ms: i64::MIN,
            ..self
        }
    }

    /// Puts the IDs made through the window into `state` (which the window
    /// was opened from), as `next_held` would have: the sequence number,
    /// the count, and the last reading's tick.
    pub fn fold(&self, cursor: &HeldCursor, state: &mut GeneratorState, layout: &Layout) {
        if cursor.sequence != state.sequence {
            state.sequence = cursor.sequence;
            state.ids_issued = self.ids_issued(cursor);
            state.last_seen = layout.clock_tick(cursor.lo_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{DEFAULT_EPOCH_MS, PRESETS};

    const NOW: i64 = 1_795_305_600_000;

    fn classic() -> Layout {
        let p = PRESETS.iter().find(|p| p.name == "classic").unwrap();
        p.layout(DEFAULT_EPOCH_MS, NOW).unwrap()
    }

    #[test]
    fn a_window_takes_the_held_ids_of_the_last_tick_then_stops() {
        let l = classic();
        let mut g = GeneratorState::new(&l);
        g.last_tick = l.tick_at(NOW);
        g.last_seen = g.last_tick;
        g.sequence = 3;
        let base = 1 << 40;
        let (w, mut c) = HeldWindow::open(&g, &l, 5, 60_000, base).unwrap();
        assert_eq!((c.lo_ms, w.hi_ms), (NOW, NOW));
        assert_eq!(w.next(&mut c, NOW - 1), None, "before the last reading");
        assert_eq!(w.next(&mut c, NOW + 1), None, "a new tick");
        assert_eq!(w.next(&mut c, NOW), Some(base | 4));
        assert_eq!(w.next(&mut c, NOW), Some(base | 5));
        assert_eq!(w.next(&mut c, NOW), None, "all held IDs made");
        assert_eq!(w.ids_issued(&c), 2);
        w.fold(&c, &mut g, &l);
        assert_eq!(
            (g.sequence, g.ids_issued, g.last_seen),
            (5, 2, l.tick_at(NOW))
        );
    }

    #[test]
    fn a_borrowed_tick_admits_readings_within_the_drift_bound() {
        let l = classic();
        let mut g = GeneratorState::new(&l);
        g.last_tick = l.tick_at(NOW) + 10;
        g.last_seen = l.tick_at(NOW) - 20;
        g.sequence = 0;
        let (w, c) = HeldWindow::open(&g, &l, 9, 15, 0).unwrap();
        assert_eq!((c.lo_ms, w.hi_ms), (NOW - 5, NOW + 10));
        assert_eq!(HeldWindow::open(&g, &l, 0, 15, 0), None, "nothing held");
        assert_eq!(HeldWindow::open(&g, &l, 9, -1, 0), None, "no drift bound");
    }
}
