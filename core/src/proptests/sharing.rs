//! Sharing: several generators on one worker id's position word, each
//! publishing by compare-and-swap in any interleaving.

use super::*;
use crate::generator::{GenError, GeneratorState, Step};
use std::collections::HashSet;

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
