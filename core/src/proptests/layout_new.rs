//! `Layout::new`: it accepts exactly the layouts its rules allow, and says
//! why not (property 9).

use super::*;
use crate::layout::LayoutError;

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
