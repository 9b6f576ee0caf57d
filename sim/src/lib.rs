//! A seeded, deterministic simulation of a snowflake_id fleet, in the
//! manner of FoundationDB's and TigerBeetle's: the real code under
//! simulated time, network, disks, clocks and replication, with a checker
//! that fails the run on the invariant.
//!
//! What runs is real: each holder is `snowflake_core::holder::Holder`,
//! its sessions make IDs with `generator::GeneratorState` within the bound
//! the holder grants, and each registry server applies
//! `registry::decide` and `registry::durable::decide` to its rows
//! (`registry::memory::Store`). What is simulated: every process's clock
//! (offset, steps, rate), the links between them (delay as lost answers,
//! partitions), stalls, crashes and restarts, the registry's standbys
//! (synchronous `FIRST n`/`ANY n` or asynchronous, each with its copy of
//! the rows and its flush position), promotions with or without a
//! candidate's name, an old primary left running, restores (a snapshot in
//! place, a `pg_dump`), `DROP`/`CREATE EXTENSION`, a copy of a holder's
//! data directory, and a hostile lease role.
//!
//! [`run`] plays one seed; [`checker::Checker`] fails it on an ID made by
//! two servers or a server's IDs of a block not increasing (and on the
//! lease role breaking the registry's bounds: a session's blocks of two
//! nodes, a login role's beyond `max_blocks_per_role`), and records
//! how long holders went without a block after each fault. Each fault is
//! labelled kept or outside the assumptions ([`faults::FAULTS`]), the one
//! table the docs are checked against; runs with faults outside them must
//! be able to show duplicates (the checker can fail), and each mutation
//! (`registry::mutation`) must make some seed fail.
//!
//! [`single`] is one server's failover without a registry: a primary, its
//! reservation records and a standby (asynchronous or synchronous), under
//! the rules of `snowflake_core::promotion`, with its own labelled faults
//! and planted bugs.

pub mod checker;
pub mod faults;
pub mod rng;
pub mod single;
pub mod world;

use faults::{Fault, Scenario};
use snowflake_core::registry::mutation::{self, Mutation};

/// What one run found.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub scenario: Scenario,
    /// The first duplicate or order violation, if any.
    pub violation: Option<String>,
    /// IDs made by two servers.
    pub duplicates: u64,
    pub ids: u64,
    /// The longest a holder that wanted a block waited, after a fault, ms.
    pub longest_wait_ms: i64,
    /// Simulated ms when the violation was found.
    pub at_ms: Option<i64>,
    /// The schedule of faults this run used (for replay and shrinking).
    pub schedule: Vec<(i64, Fault)>,
    pub trace: Vec<String>,
}

/// Plays `seed` under `scenario` for `duration_ms` of simulated time,
/// with `mutation` switched on for this thread.
pub fn run(seed: u64, scenario: Scenario, duration_ms: i64, mutation: Option<Mutation>) -> Outcome {
    let schedule = faults::schedule(seed, scenario, duration_ms);
    run_schedule(seed, scenario, duration_ms, mutation, &schedule)
}

/// Plays a given schedule (a replay, or a step of shrinking).
pub fn run_schedule(
    seed: u64,
    scenario: Scenario,
    duration_ms: i64,
    mutation: Option<Mutation>,
    schedule: &[(i64, Fault)],
) -> Outcome {
    mutation::set(mutation);
    let mut w = world::World::new(seed, scenario);
    let out = w.play(duration_ms, schedule);
    mutation::set(None);
    Outcome {
        seed,
        scenario,
        violation: out.violation,
        duplicates: out.duplicates,
        ids: out.ids,
        longest_wait_ms: out.longest_wait_ms,
        at_ms: out.at_ms,
        schedule: schedule.to_vec(),
        trace: w.trace,
    }
}

/// The smallest schedule (faults dropped one at a time) that still fails:
/// the replayable trace of a failing seed.
pub fn shrink(failed: &Outcome, duration_ms: i64, mutation: Option<Mutation>) -> Outcome {
    let mut best = failed.clone();
    let mut i = 0;
    while i < best.schedule.len() {
        let mut fewer = best.schedule.clone();
        fewer.remove(i);
        let end = best
            .at_ms
            .map_or(duration_ms, |t| (t + 30_000).min(duration_ms));
        let again = run_schedule(best.seed, best.scenario, end, mutation, &fewer);
        if again.violation.is_some() {
            best = again;
        } else {
            i += 1;
        }
    }
    best
}

/// A failing run as text: seed, scenario, the faults left after
/// shrinking, the violation and the last events before it.
pub fn report(o: &Outcome) -> String {
    let mut s = format!(
        "seed {} scenario {:?}: {} (duplicates {}, at {} ms)\nreplay: SNOWFLAKE_SIM_SEED={} SNOWFLAKE_SIM_SCENARIO={:?} cargo test -p snowflake_sim --release replay -- --nocapture\nfaults:\n",
        o.seed,
        o.scenario,
        o.violation.as_deref().unwrap_or("no violation"),
        o.duplicates,
        o.at_ms.unwrap_or(-1),
        o.seed,
        o.scenario
    );
    for (t, f) in &o.schedule {
        s.push_str(&format!("  {t:>7} ms  {f:?}\n"));
    }
    s.push_str("last events:\n");
    for line in o.trace.iter().rev().take(40).rev() {
        s.push_str("  ");
        s.push_str(line);
        s.push('\n');
    }
    s
}
