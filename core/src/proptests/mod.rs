//! Property-based tests of the pure core (layout, generator, ranges).
//!
//! Layouts are the presets and random valid combinations at a fixed "now";
//! clock traces mix small and large forward steps, zero steps, backward
//! jumps smaller and larger than the drift bound, and bursts of calls within
//! one tick. Each property says which rule of `generator`, `layout` or
//! `ranges` it checks.
//!
//! One file per subject; this one holds the fixed "now" and the layout
//! strategies they share:
//! - `trace`: a clock driven by a trace, the traces, and `check_trace`
//!   (properties 1 to 4 on one trace);
//! - `generator`: the generator's properties and example-based tests of
//!   its rules;
//! - `layout`: compose, decode, ticks, the end of a layout, and the epoch's
//!   text form (format and parse);
//! - `layout_new`: which layouts `Layout::new` accepts;
//! - `held`: the held window against `next_held`;
//! - `ranges`: worker-id ranges;
//! - `sharing`: several generators on one position word;
//! - `backfill`: backfill IDs of several backends, times in any order.

mod backfill;
mod generator;
mod held;
mod layout;
mod layout_new;
mod ranges;
mod sharing;
mod trace;

use crate::layout::{
    Layout, Parts, DEFAULT_EPOCH_MS, MAX_SEQUENCE_BITS, MAX_WORKER_BITS, MIN_LIFETIME_MS, PRESETS,
};
use proptest::prelude::*;

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

fn worker_of(l: &Layout, seed: u32) -> u32 {
    seed % (l.max_worker_id() + 1).max(1)
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
