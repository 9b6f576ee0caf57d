//! Backfill (`backfill`): over any layout, set-aside ids and run of calls
//! from several backends with times in any order, repeated, near stretch
//! boundaries, grants taken in batches of nearby stretches, and backends
//! that exit (giving up their grants) between calls, every ID made is unique, decodes to its own tick and carries a
//! set-aside worker id; a refusal comes only from a stretch whose counter
//! is at the backend's limit (all its grants for a first grant, all but
//! the reserve for a further one) and takes nothing.

use super::*;
use crate::backfill::{to_hand_out, Open, Space, Take};
use crate::ranges::WorkerRanges;
use std::collections::{HashMap, HashSet};

proptest! {
    #[test]
    fn backfill_ids_are_unique_and_decode_to_their_tick(
        l in arb_layout(),
        ids_wanted in 1u32..4,
        calls in prop::collection::vec((0usize..4, 0u8..3, -40i64..40, 0u8..50), 1..600),
    ) {
        let max_id = l.max_worker_id();
        let first = max_id.saturating_sub(ids_wanted - 1);
        let ids = WorkerRanges::parse(&format!("{first}-{max_id}"), max_id).unwrap();
        let space = Space::new(&l, ids.clone());
        // The server's durable counters, per stretch.
        let mut counters: HashMap<u32, u32> = HashMap::new();
        let mut backends: Vec<Open> = (0..4).map(|_| Open::new()).collect();
        let mut seen = HashSet::new();
        for (b, stretch, offset, exit) in calls {
            if exit == 0 {
                backends[b] = Open::new();
            }
            let tick = (space.bucket_ticks() * i64::from(stretch) + offset).clamp(0, l.max_ticks());
            let bucket = space.bucket_of(tick);
            let id = loop {
                match backends[b].take(&space, tick) {
                    Take::Id { grant, index } => {
                        let (w, s) = space.grant_parts(grant, index).unwrap();
                        break Some(l.compose(tick, w, s).unwrap());
                    }
                    Take::NeedGrant { bucket: nb } => {
                        prop_assert_eq!(nb, bucket);
                        let usable = (bucket.saturating_sub(2), bucket + 2);
                        let batch = backends[b].to_take(nb, usable);
                        let counts: Vec<u32> =
                            batch.iter().map(|tb| counters.get(tb).copied().unwrap_or(0)).collect();
                        let limits: Vec<u32> = batch
                            .iter()
                            .map(|&tb| space.grant_limit(backends[b].held(tb)))
                            .collect();
                        let hand_out = to_hand_out(&counts, &limits);
                        if !hand_out[0] {
                            // Refused: nothing taken, the asked stretch at
                            // its limit for this backend.
                            let before: Vec<u32> = batch.iter().map(|tb| counters.get(tb).copied().unwrap_or(0)).collect();
                            prop_assert_eq!(&counts, &before);
                            prop_assert!(counts[0] >= limits[0]);
                            break None;
                        }
                        for (tb, give) in batch.into_iter().zip(hand_out) {
                            if give {
                                let n = counters.entry(tb).or_insert(0);
                                *n += 1;
                                backends[b].add(tb, *n - 1);
                            }
                        }
                    }
                }
            };
            match id {
                Some(id) => {
                    prop_assert!(seen.insert(id), "{} made twice", id);
                    let p = l.decode(id).unwrap();
                    prop_assert_eq!(p.ticks, tick);
                    prop_assert!(ids.contains(p.worker_id));
                }
                None => {
                    let limit = space.grant_limit(backends[b].held(bucket));
                    prop_assert!(counters.get(&bucket).copied().unwrap_or(0) >= limit);
                    prop_assert!(limit == space.grants_per_bucket()
                        || limit + space.reserve() == space.grants_per_bucket());
                }
            }
        }
    }
}
