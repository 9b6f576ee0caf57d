//! One server's failover in the simulation (`snowflake_sim::single`): the
//! kept faults never make a promoted server repeat the primary's IDs, the
//! fault outside the assumptions does for some seed, and each planted bug
//! makes some seed fail.

use snowflake_sim::single::{run, Fault, Mutation, SINGLE_FAULTS};

fn seeds() -> u64 {
    std::env::var("SNOWFLAKE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

#[test]
fn kept_faults_never_repeat() {
    for fault in Fault::KEPT {
        for seed in 0..seeds() {
            let o = run(seed, fault, None);
            assert_eq!(o.repeats, 0, "{}", o.trace.join("\n"));
            assert!(o.primary_ids > 100 && o.promoted_ids > 100, "{o:?}");
        }
    }
}

#[test]
fn skew_beyond_the_bound_shows_repeats() {
    for fault in Fault::OUTSIDE {
        let found = (0..seeds()).find(|&seed| run(seed, fault, None).repeats > 0);
        assert!(found.is_some(), "{fault:?}: no seed repeats");
        println!("{fault:?}: seed {found:?} repeats");
    }
}

#[test]
fn each_planted_bug_makes_a_kept_fault_repeat() {
    for (mutation, fault) in [
        (Mutation::FloorWithoutSkew, Fault::AsyncLagWithinSkew),
        (Mutation::ReplayedOnly, Fault::AsyncLagWithinSkew),
        (Mutation::NoSyncWait, Fault::SyncAnySkew),
    ] {
        let found = (0..seeds()).find(|&seed| run(seed, fault, Some(mutation)).repeats > 0);
        assert!(found.is_some(), "{mutation:?} not caught under {fault:?}");
        let o = run(found.unwrap_or(0), fault, Some(mutation));
        println!(
            "{mutation:?}: seed {} ({fault:?}): {}",
            o.seed,
            o.trace.join("; ")
        );
    }
}

#[test]
fn every_fault_is_labelled_once() {
    for fault in Fault::KEPT.iter().chain(Fault::OUTSIDE.iter()) {
        let rows: Vec<_> = SINGLE_FAULTS.iter().filter(|r| r.fault == *fault).collect();
        assert_eq!(rows.len(), 1, "{fault:?}");
        assert_eq!(rows[0].kept, Fault::KEPT.contains(fault));
    }
}
