//! The faults the simulation injects, each labelled: kept (no duplicate,
//! whatever the seed) or outside the assumptions (duplicates may follow,
//! and the simulation shows them). [`FAULTS`] is the one table of labels;
//! `docs/design/fleet-fencing.md` ("When the registry forgets") and
//! `docs/design/limitations.md` are checked against it (`tests`).

use crate::rng::Rng;

/// One fault, at a simulated time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The registry's primary crashes and restarts (fsync on: it keeps
    /// every commit).
    RegistryCrash,
    /// A standby is promoted; `named`: it carries its candidate name
    /// (`snowflake_id.registry_standby_name`); `old_runs`: the old primary
    /// keeps running and holders may still reach it.
    Failover {
        named: bool,
        old_runs: bool,
        to: Option<usize>,
    },
    /// A snapshot of the registry restored in place (same timeline, its
    /// WAL back), holders calling before its WAL passes theirs.
    RestoreSnapshot,
    /// As above, but the restored registry's WAL passes every position its
    /// holders saw before any of them calls.
    RestoreSnapshotWalPassed,
    /// The newest snapshot taken before `before_ms` (simulated time)
    /// restored in place, its WAL then passing every position its holders
    /// saw: scheduled after a `DROP`/`CREATE EXTENSION` at `before_ms`,
    /// a registry back to before its row was made anew.
    RestoreSnapshotBefore { before_ms: i64 },
    /// `DROP EXTENSION` and `CREATE EXTENSION` on the registry.
    DropCreate,
    /// A copy of the registry's database, the newest snapshot taken before
    /// `copied_ms` (simulated time; `CREATE DATABASE ... TEMPLATE`), put in
    /// its place (`DROP DATABASE`, `ALTER DATABASE ... RENAME`): no
    /// restart, the WAL moving on. `same_oid`: made under the original's
    /// OID once it was dropped (`CREATE DATABASE ... OID n`).
    PutBackDatabaseCopy { copied_ms: i64, same_oid: bool },
    /// The database a [`Fault::PutBackDatabaseCopy`] put aside put back in
    /// its place, the copy's sessions ended (the wrong database restored,
    /// then the right one): no restart, its grants since the copy was
    /// taken kept, the copy's forgotten.
    PutBackOriginal,
    /// The registry's database restored from a `pg_dump` taken earlier.
    DumpRestore,
    /// A copy of holder `n`'s data directory starts, keeping its node id,
    /// while the original is cut off; later the copy is cut off and the
    /// original comes back. `detected`: its lease file tells it is a copy
    /// (saved blocks only above the registry's mark), as the lease worker
    /// does; not: a copy it cannot tell (a cloned volume).
    CopyDataDir { holder: usize, detected: bool },
    /// Holder `n` crashes and restarts from its lease file.
    HolderRestart { holder: usize },
    /// Holder `n`'s lease worker stalls (its sessions go on).
    HolderStall { holder: usize, ms: i64 },
    /// The registry's primary stalls.
    RegistryStall { ms: i64 },
    /// Standby `n` stalls (SIGSTOP): its copy and its replies stop.
    StandbyStall { standby: usize, ms: i64 },
    /// Standby `n` is cut off (its WAL receiver stopped): gone from the
    /// primary's `pg_stat_replication` until it streams again or is
    /// promoted.
    StandbyCut { standby: usize, ms: i64 },
    /// Standby `n` taken out of the primary's `synchronous_standby_names`.
    TakeOut { standby: usize },
    /// The registry's data directory without its kept candidates' row:
    /// upgraded from 0.7.0 and no durable write since, or the file
    /// removed.
    LoseKeptCandidates,
    /// Holder `n` is cut off from the registry.
    Partition { holder: usize, ms: i64 },
    /// Holder `n`'s wall clock steps (its monotonic clock does not).
    ClockStep { holder: usize, ms: i64 },
    /// A holder's or registry server's clock runs at a rate off by
    /// `ppm` millionths, within the documented bound.
    ClockRate { process: usize, ppm: i64 },
    /// Clock rates beyond the bound: holder `n`'s clock runs 30 % slow.
    ClockRateBeyond { holder: usize },
    /// The registry primary's clock steps by `ms`.
    RegistryClockStep { ms: i64 },
    /// Standby `n`'s clock is set `ms` off.
    StandbyClock { standby: usize, ms: i64 },
    /// The lease role sends whatever it may for a while.
    Hostile { ms: i64 },
}

/// How a fault stands against the documented assumptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    Kept,
    Outside,
}

/// One row of the table: a fault's name, label and why.
pub struct Row {
    pub name: &'static str,
    pub label: Label,
    pub why: &'static str,
}

/// The labels, one row per fault (and per replication mode where it
/// decides).
pub const FAULTS: &[Row] = &[
    Row { name: "registry crash and restart", label: Label::Kept, why: "every grant used was flushed first" },
    Row { name: "promotion of a synchronous candidate, named", label: Label::Kept, why: "it has every durable grant: no fence, proven" },
    Row { name: "promotion without a candidate's name", label: Label::Kept, why: "a new timeline, unproven: fenced from the limits" },
    Row { name: "old primary left running, one synchronous standby", label: Label::Kept, why: "it can make no grant durable once its standby is promoted" },
    Row { name: "old primary left running, two candidates (ANY 1)", label: Label::Outside, why: "split brain: it drops the promoted candidate after the margin and grants on through the other" },
    Row { name: "split brain on asynchronous replication", label: Label::Outside, why: "the old primary's own flush makes a grant durable: fence the old primary, as any failover must" },
    Row { name: "snapshot restored in place, holders call first", label: Label::Kept, why: "a holder's signed WAL position above the registry's starts a fenced incarnation" },
    Row { name: "snapshot restored in place, its WAL passes the holders' positions", label: Label::Kept, why: "a holder's signed grant count above the registry's starts a fenced incarnation" },
    Row { name: "snapshot from before DROP and CREATE EXTENSION restored in place, its WAL passed", label: Label::Kept, why: "a holder's signed incarnation the restored registry never had, within a fence (or the marks' lead plus grace) of its start, starts a fenced incarnation" },
    Row { name: "DROP and CREATE EXTENSION", label: Label::Kept, why: "live block locks, or a holder naming the older incarnation, fence it" },
    Row { name: "a copy of the registry's database put in its place, no restart", label: Label::Kept, why: "the row names the database it was written in: in another, it starts a fenced incarnation" },
    Row { name: "a copy of the registry's database put in its place under its OID, no restart", label: Label::Kept, why: "a row's grant count only rises while the postmaster runs: one below the count a committed lease call left there starts a fenced incarnation" },
    Row { name: "the original registry database put back after a copy served, no restart", label: Label::Kept, why: "a token names the database it was signed in: the copy's incarnation, signed in another database under the row's key, starts a fenced incarnation" },
    Row { name: "pg_dump restore", label: Label::Kept, why: "restored leased rows fire the trigger's fence; the incarnation is not dumped" },
    Row { name: "copy of a data directory keeping its node id", label: Label::Kept, why: "blocks stay with the registry session that leased them" },
    Row { name: "holder crash and restart", label: Label::Kept, why: "saved blocks are used once a renewal confirms them" },
    Row { name: "a candidate cut off, then DROP and CREATE EXTENSION under ANY 1 (*)", label: Label::Kept, why: "the row made anew names the members of the last one, kept in the data directory, until they are dropped; with none kept, a `*` holds every report back until any row a dropped registry wrote has expired" },
    Row { name: "a candidate cut off and taken out of synchronous_standby_names, then DROP and CREATE EXTENSION", label: Label::Kept, why: "the row made anew names the members of the last one, kept in the data directory: the cut-off candidate holds every report back until it is dropped" },
    Row { name: "stalls of a holder, the registry or a standby", label: Label::Kept, why: "marks bound IDs; the registry hands over after expiry plus grace" },
    Row { name: "partitions and lost answers", label: Label::Kept, why: "a grant is used only once the registry said it is durable" },
    Row { name: "clock offsets and steps", label: Label::Kept, why: "marks are in ID time; a new holder waits for its floor" },
    Row { name: "clock rates within the bound", label: Label::Kept, why: "grace (a fifth of the lease) covers rate differences up to 1000 ppm many times over" },
    Row { name: "clock rates beyond the bound", label: Label::Kept, why: "IDs stay within marks, which are in ID time: a rate only delays when a block is used again" },
    Row { name: "a standby's clock far off the primary's", label: Label::Kept, why: "a standby whose reply_time strays more than 5 s is never a failover candidate" },
    Row { name: "the registry's clock stepping back by less than the grace", label: Label::Kept, why: "a fence's floor is above every forgotten mark while the step is within the grace" },
    Row { name: "a copy of a data directory its lease file cannot tell from the original, while the registry forgets its rows", label: Label::Outside, why: "the copy re-asserts the original's blocks with the marks it saved, below the original's later IDs" },
    Row { name: "a hostile lease role", label: Label::Kept, why: "requests are checked against the limits; what they say they saw counts only with the registry's token; each session is one node, and a login role's sessions hold at most max_blocks_per_role blocks" },
];

/// Which faults a run draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Every fault labelled kept, with synchronous standbys (`FIRST 1`).
    KeptFirst,
    /// Every fault labelled kept, with a quorum (`ANY 1` of two).
    KeptAny,
    /// Kept faults with asynchronous standbys only (no split brain).
    KeptAsync,
    /// Every fault labelled kept, with a quorum of any standby
    /// (`ANY 1 (*)`), and a candidate cut off just before the extension
    /// is made again, then promoted.
    KeptAnyStar,
    /// Split brain on asynchronous replication (outside).
    SplitBrainAsync,
    /// An old primary left running with a second candidate (`ANY 1`)
    /// after the first was promoted (outside).
    SplitBrainAny,
    /// A copy its lease file cannot tell from the original, while the
    /// registry forgets its rows (outside).
    UndetectedCopy,
}

impl Scenario {
    pub const KEPT: [Scenario; 4] = [
        Scenario::KeptFirst,
        Scenario::KeptAny,
        Scenario::KeptAsync,
        Scenario::KeptAnyStar,
    ];
    pub const OUTSIDE: [Scenario; 3] = [
        Scenario::SplitBrainAsync,
        Scenario::SplitBrainAny,
        Scenario::UndetectedCopy,
    ];

    pub fn parse(text: &str) -> Option<Scenario> {
        Scenario::KEPT
            .into_iter()
            .chain(Scenario::OUTSIDE)
            .find(|s| format!("{s:?}") == text)
    }

    /// `synchronous_standby_names` of the registry's primary.
    pub fn synchronous_standby_names(self) -> &'static str {
        match self {
            Scenario::KeptAny | Scenario::SplitBrainAny => "ANY 1 (s1, s2)",
            Scenario::KeptAnyStar => "ANY 1 (*)",
            Scenario::KeptAsync | Scenario::SplitBrainAsync => "",
            _ => "FIRST 1 (s1, s2)",
        }
    }
}

/// Holders, standbys and processes of every run.
pub const HOLDERS: usize = 4;
pub const STANDBYS: usize = 2;

/// The faults of a run: a few at random times, drawn from what the
/// scenario allows.
pub fn schedule(seed: u64, scenario: Scenario, duration_ms: i64) -> Vec<(i64, Fault)> {
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let mut out = Vec::new();
    let n = rng.range(5, 13);
    // The last fifth is quiet: every holder should lease again by its end.
    let until = duration_ms * 4 / 5;
    for _ in 0..n {
        let at = rng.range(5_000, until.max(5_001));
        let holder = rng.range(0, HOLDERS as i64) as usize;
        let ms = rng.range(500, 15_000);
        let f = match rng.range(0, 22) {
            0 | 19 => Fault::RegistryCrash,
            20 => {
                // The table made again while a holder is cut off: its
                // grants run on while others lease.
                out.push((at + 1, Fault::Partition { holder, ms: 12_000 }));
                Fault::DropCreate
            }
            21 => Fault::Failover {
                named: false,
                old_runs: false,
                to: None,
            },
            1 => Fault::Failover {
                named: rng.chance(0.7),
                old_runs: scenario == Scenario::KeptFirst && rng.chance(0.3),
                to: None,
            },
            2 => {
                if rng.chance(0.5) {
                    Fault::RestoreSnapshot
                } else {
                    Fault::RestoreSnapshotWalPassed
                }
            }
            3 => Fault::DropCreate,
            4 => Fault::DumpRestore,
            5 => Fault::CopyDataDir {
                holder,
                detected: true,
            },
            6 => Fault::HolderRestart { holder },
            7 => Fault::HolderStall { holder, ms },
            8 => Fault::RegistryStall { ms: ms / 2 },
            9 => Fault::StandbyStall {
                standby: rng.range(0, STANDBYS as i64) as usize,
                ms: ms * 3,
            },
            10 => Fault::Partition { holder, ms },
            11 => Fault::ClockStep {
                holder,
                ms: rng.range(-10_000, 3_000),
            },
            12 => Fault::ClockRate {
                process: rng.range(0, (HOLDERS + 1 + STANDBYS) as i64) as usize,
                ppm: rng.range(-1_000, 1_000),
            },
            13 => Fault::RegistryClockStep {
                ms: rng.range(-1_000, 3_000),
            },
            14 => Fault::ClockRateBeyond { holder },
            15 => {
                // A candidate stalls until it is dropped, then is promoted
                // under its name; its clock may be far behind (the 0.7.0
                // attack on the promotion proof).
                let standby = rng.range(0, STANDBYS as i64) as usize;
                if rng.chance(0.5) {
                    out.push((
                        at,
                        Fault::StandbyClock {
                            standby,
                            ms: -60_000,
                        },
                    ));
                }
                out.push((
                    at + 100,
                    Fault::StandbyStall {
                        standby,
                        ms: 60_000,
                    },
                ));
                Fault::Failover {
                    named: true,
                    old_runs: false,
                    to: Some(standby),
                }
            }
            _ => Fault::Hostile { ms },
        };
        let at = if let Fault::Failover { to: Some(_), .. } = f {
            at + rng.range(1_000, 50_000)
        } else {
            at
        };
        out.push((at, f));
    }
    // A snapshot from before the row was made anew, restored once the
    // grants it shows have run out (seed 112 on real servers): drawn apart,
    // so that the schedules above stay as they were.
    let mut own = Rng::new(seed.wrapping_mul(131).wrapping_add(17));
    if Scenario::KEPT.contains(&scenario) && own.chance(0.4) {
        let at = own.range(5_000, until.max(5_001));
        out.push((at, Fault::DropCreate));
        out.push((
            at + own.range(8_000, 20_000),
            Fault::RestoreSnapshotBefore { before_ms: at },
        ));
    }
    // A copy of the registry's database put back in its place, maybe
    // after the extension was made again (tests/fleet/test_adversarial_s19.py):
    // drawn apart too.
    let mut copy = Rng::new(seed.wrapping_mul(257).wrapping_add(29));
    if Scenario::KEPT.contains(&scenario) && copy.chance(0.3) {
        let at = copy.range(5_000, until.max(5_001));
        if copy.chance(0.5) {
            out.push((at + copy.range(100, 3_000), Fault::DropCreate));
        }
        let swapped = at + copy.range(4_000, 30_000);
        out.push((
            swapped,
            Fault::PutBackDatabaseCopy {
                copied_ms: at,
                same_oid: false,
            },
        ));
        // And the original put back after the copy served
        // (tests/fleet/test_adversarial_s23.py): drawn apart, so that the
        // schedules above stay as they were.
        let mut back = Rng::new(seed.wrapping_mul(613).wrapping_add(47));
        if back.chance(0.5) {
            out.push((swapped + back.range(2_000, 30_000), Fault::PutBackOriginal));
        }
    }
    // A copy put back under the original's OID, the original dropped
    // (tests/fleet/test_adversarial_s24.py): drawn apart too.
    let mut same = Rng::new(seed.wrapping_mul(733).wrapping_add(53));
    if Scenario::KEPT.contains(&scenario) && same.chance(0.3) {
        let at = same.range(5_000, until.max(5_001));
        out.push((
            at + same.range(4_000, 30_000),
            Fault::PutBackDatabaseCopy {
                copied_ms: at,
                same_oid: true,
            },
        ));
    }
    // A candidate cut off and taken out of the setting before the
    // extension is made again, then promoted under its name
    // (tests/fleet/test_adversarial_s19.py): drawn apart too.
    let mut out_of = Rng::new(seed.wrapping_mul(521).wrapping_add(43));
    if matches!(scenario, Scenario::KeptFirst | Scenario::KeptAny) && out_of.chance(0.3) {
        let at = out_of.range(5_000, until.max(5_001));
        let standby = out_of.range(0, STANDBYS as i64) as usize;
        out.push((
            at,
            Fault::StandbyCut {
                standby,
                ms: 60_000,
            },
        ));
        out.push((at + out_of.range(100, 2_000), Fault::TakeOut { standby }));
        out.push((at + out_of.range(2_000, 5_000), Fault::DropCreate));
        out.push((
            at + out_of.range(6_000, 30_000),
            Fault::Failover {
                named: true,
                old_runs: false,
                to: Some(standby),
            },
        ));
    }
    // The fault the scenario is about, at least twice.
    for _ in 0..2 {
        let at = rng.range(5_000, until.max(5_001));
        let holder = rng.range(0, HOLDERS as i64) as usize;
        match scenario {
            Scenario::SplitBrainAny => out.push((
                at,
                Fault::Failover {
                    named: true,
                    old_runs: true,
                    to: Some(0),
                },
            )),
            Scenario::SplitBrainAsync => out.push((
                at,
                Fault::Failover {
                    named: false,
                    old_runs: true,
                    to: None,
                },
            )),
            Scenario::KeptAnyStar => {
                // The real-server attack of 0.8.0's review: the candidate
                // cut off keeps a row naming it; the row made anew does
                // not know it.
                let standby = rng.range(0, STANDBYS as i64) as usize;
                out.push((
                    at,
                    Fault::StandbyCut {
                        standby,
                        ms: 60_000,
                    },
                ));
                let drop = at + rng.range(100, 5_000);
                if rng.chance(0.5) {
                    out.push((drop - 1, Fault::LoseKeptCandidates));
                }
                out.push((drop, Fault::DropCreate));
                out.push((
                    at + rng.range(6_000, 30_000),
                    Fault::Failover {
                        named: true,
                        old_runs: false,
                        to: Some(standby),
                    },
                ));
            }
            Scenario::UndetectedCopy => {
                out.push((at, Fault::DropCreate));
                out.push((
                    at + 1,
                    Fault::CopyDataDir {
                        holder,
                        detected: false,
                    },
                ));
            }

            _ => {}
        }
    }
    out.sort_by_key(|f| f.0);
    out
}
