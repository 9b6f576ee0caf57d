//! Worker-id ranges: parse, display and the set they stand for
//! (property 10).

use super::*;
use crate::ranges::{RangeError, WorkerRanges};
use std::collections::HashSet;

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
