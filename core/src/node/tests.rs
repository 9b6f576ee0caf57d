//! Tests of the node rules: every branch of [`saved_leases`], [`restore`]
//! and [`NodeClaim`], and properties over every combination of facts.

use super::*;
use proptest::prelude::*;

const HERE: Option<(u64, u64)> = Some((2049, 131_073));
const ELSEWHERE: Option<(u64, u64)> = Some((2049, 524_289));
const T0: i64 = 1_795_305_600_000;

/// A file this data directory wrote, from registry "r", confirmed, and a
/// start with "r" configured: the leases are provably this directory's.
fn facts() -> StartFacts<'static> {
    StartFacts {
        saved_directory: HERE,
        this_directory: HERE,
        saved_registry: Some("r"),
        saved_citus_registry: None,
        configured_registry: Some("r"),
        unconfirmed: false,
        saved_from_backup: false,
        started_from_backup: false,
    }
}

#[test]
fn leases_this_directory_saved_from_the_same_registry_are_provable() {
    let d = saved_leases(&facts());
    assert_eq!(
        d,
        SavedLeases::SameRegistry {
            from_backup: false,
            provable: true
        }
    );
    assert!(d.provable());
    assert!(!d.from_backup());
}

#[test]
fn a_file_from_another_data_directory_is_a_copy() {
    let f = StartFacts {
        saved_directory: ELSEWHERE,
        ..facts()
    };
    assert!(f.copied());
    assert_eq!(saved_leases(&f), SavedLeases::Copy);
    assert!(!saved_leases(&f).provable());
    assert!(!saved_leases(&f).from_backup());
    // Also when this directory's identity cannot be read.
    let unreadable = StartFacts {
        this_directory: None,
        ..facts()
    };
    assert_eq!(saved_leases(&unreadable), SavedLeases::Copy);
}

#[test]
fn a_copy_uses_not_even_the_saved_citus_coordinator() {
    let f = StartFacts {
        saved_directory: ELSEWHERE,
        saved_registry: Some("c"),
        saved_citus_registry: Some("c"),
        configured_registry: None,
        ..facts()
    };
    assert_eq!(f.registry_in_use(), None);
    assert_eq!(saved_leases(&f), SavedLeases::Copy);
    let configured = StartFacts {
        configured_registry: Some("r"),
        ..f
    };
    assert_eq!(configured.registry_in_use(), Some("r"));
}

#[test]
fn a_file_that_does_not_name_its_directory_is_used_but_not_provable() {
    let f = StartFacts {
        saved_directory: None,
        ..facts()
    };
    assert!(!f.copied());
    assert_eq!(
        saved_leases(&f),
        SavedLeases::SameRegistry {
            from_backup: false,
            provable: false
        }
    );
}

#[test]
fn leases_from_another_registry_are_not_used() {
    let other = StartFacts {
        saved_registry: Some("old"),
        ..facts()
    };
    assert_eq!(
        saved_leases(&other),
        SavedLeases::OtherRegistry { from_backup: false }
    );
    let none_saved = StartFacts {
        saved_registry: None,
        ..facts()
    };
    assert_eq!(
        saved_leases(&none_saved),
        SavedLeases::OtherRegistry { from_backup: false }
    );
    // No registry known yet (a Citus node before its first look at the
    // metadata, with no coordinator saved): nothing is the same registry,
    // not even a file that names none.
    let unknown = StartFacts {
        saved_registry: None,
        configured_registry: None,
        ..facts()
    };
    assert_eq!(unknown.registry_in_use(), None);
    assert_eq!(
        saved_leases(&unknown),
        SavedLeases::OtherRegistry { from_backup: false }
    );
    let from_backup = StartFacts {
        started_from_backup: true,
        ..other
    };
    let d = saved_leases(&from_backup);
    assert_eq!(d, SavedLeases::OtherRegistry { from_backup: true });
    assert!(d.from_backup());
    assert!(!d.provable());
}

#[test]
fn a_citus_node_uses_the_coordinator_it_saved_unless_a_registry_is_set() {
    let citus = StartFacts {
        saved_registry: Some("c"),
        saved_citus_registry: Some("c"),
        configured_registry: None,
        ..facts()
    };
    assert_eq!(citus.registry_in_use(), Some("c"));
    assert!(saved_leases(&citus).provable());
    let configured = StartFacts {
        configured_registry: Some("r"),
        ..citus
    };
    assert_eq!(configured.registry_in_use(), Some("r"));
    assert_eq!(
        saved_leases(&configured),
        SavedLeases::OtherRegistry { from_backup: false }
    );
}

#[test]
fn a_start_from_a_backup_waits_for_the_registry() {
    for (started, saved) in [(true, false), (false, true), (true, true)] {
        let f = StartFacts {
            started_from_backup: started,
            saved_from_backup: saved,
            ..facts()
        };
        let d = saved_leases(&f);
        assert_eq!(
            d,
            SavedLeases::SameRegistry {
                from_backup: true,
                provable: false
            }
        );
        assert!(d.from_backup());
    }
}

#[test]
fn unconfirmed_leases_wait_for_the_registry() {
    let f = StartFacts {
        unconfirmed: true,
        ..facts()
    };
    assert_eq!(
        saved_leases(&f),
        SavedLeases::SameRegistry {
            from_backup: false,
            provable: false
        }
    );
}

fn block(deadline_unix_ms: i64) -> SavedBlock {
    SavedBlock {
        block: 7,
        floor_ms: T0 - 1_000,
        high_ms: T0 + 60_000,
        deadline_unix_ms,
    }
}

#[test]
fn a_saved_block_past_its_deadline_is_dropped() {
    assert_eq!(restore(&block(T0), T0, 500, 0), None);
    assert_eq!(restore(&block(T0 - 1), T0, 500, 0), None);
}

#[test]
fn a_saved_block_keeps_its_time_left_and_starts_above_the_restart_floor() {
    let r = restore(&block(T0 + 30_000), T0, 500, 0);
    assert_eq!(
        r,
        Some(Restored {
            block: 7,
            floor_ms: T0 - 1_000,
            high_ms: T0 + 60_000,
            deadline_mono_ms: 30_500,
        })
    );
    // The last life issued IDs up to T0 - 10: they start above that.
    let r = restore(&block(T0 + 30_000), T0, 500, T0 - 10);
    assert_eq!(r.map(|r| r.floor_ms), Some(T0 - 10));
    // A floor above the restart floor stays.
    let r = restore(&block(T0 + 30_000), T0, 500, T0 - 5_000);
    assert_eq!(r.map(|r| r.floor_ms), Some(T0 - 1_000));
}

#[test]
fn a_refused_node_id_ends_the_lingering_session_first() {
    let mut claim = NodeClaim::new(true);
    assert_eq!(claim.refused(|| Ending::Ended), Refused::Retry);
    // The session ended but the lock is still taken: another server's.
    let mut called = false;
    assert_eq!(
        claim.refused(|| {
            called = true;
            Ending::Ended
        }),
        Refused::Rename(Rename::OtherServer)
    );
    assert!(!called, "the earlier session is ended at most once");
    assert_eq!(claim.refused(|| Ending::Ended), Refused::GiveUp);
}

#[test]
fn a_lingering_session_that_is_gone_means_another_server() {
    let mut claim = NodeClaim::new(true);
    assert_eq!(
        claim.refused(|| Ending::Gone),
        Refused::Rename(Rename::OtherServer)
    );
    assert_eq!(claim.refused(|| Ending::Ended), Refused::GiveUp);
}

/// This worker's own earlier session still there and not ended (a stopped
/// registry backend): the node renames, but not for another server, which
/// nothing shows exists.
#[test]
fn a_lingering_session_that_does_not_end_is_said_to_be_this_servers_own() {
    let mut claim = NodeClaim::new(true);
    assert_eq!(
        claim.refused(|| Ending::NotEnded),
        Refused::Rename(Rename::OwnSessionNotEnded)
    );
    assert_eq!(claim.refused(|| Ending::Ended), Refused::GiveUp);
}

#[test]
fn without_a_lingering_session_the_node_renames_once() {
    let mut claim = NodeClaim::new(false);
    let mut called = false;
    assert_eq!(
        claim.refused(|| {
            called = true;
            Ending::NotEnded
        }),
        Refused::Rename(Rename::OtherServer)
    );
    assert!(!called);
    assert_eq!(claim.refused(|| Ending::Ended), Refused::GiveUp);
    assert_eq!(claim.refused(|| Ending::Ended), Refused::GiveUp);
}

/// Directories from a small set, so that equal and different ones both occur.
fn directory() -> impl Strategy<Value = Option<(u64, u64)>> {
    prop::option::of((0u64..2, 0u64..3))
}

/// Registry keys from a small set.
fn key() -> impl Strategy<Value = Option<String>> {
    prop::option::of("[abc]")
}

#[derive(Clone, Debug)]
struct Owned {
    saved_directory: Option<(u64, u64)>,
    this_directory: Option<(u64, u64)>,
    saved_registry: Option<String>,
    saved_citus_registry: Option<String>,
    configured_registry: Option<String>,
    unconfirmed: bool,
    saved_from_backup: bool,
    started_from_backup: bool,
}

impl Owned {
    fn facts(&self) -> StartFacts<'_> {
        StartFacts {
            saved_directory: self.saved_directory,
            this_directory: self.this_directory,
            saved_registry: self.saved_registry.as_deref(),
            saved_citus_registry: self.saved_citus_registry.as_deref(),
            configured_registry: self.configured_registry.as_deref(),
            unconfirmed: self.unconfirmed,
            saved_from_backup: self.saved_from_backup,
            started_from_backup: self.started_from_backup,
        }
    }
}

fn owned() -> impl Strategy<Value = Owned> {
    (
        directory(),
        directory(),
        key(),
        key(),
        key(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(sd, td, sr, sc, cr, u, sb, stb)| Owned {
            saved_directory: sd,
            this_directory: td,
            saved_registry: sr,
            saved_citus_registry: sc,
            configured_registry: cr,
            unconfirmed: u,
            saved_from_backup: sb,
            started_from_backup: stb,
        })
}

proptest! {
    /// A copy's saved leases are never used, trusted or not.
    #[test]
    fn a_copy_never_uses_saved_leases(o in owned()) {
        let f = o.facts();
        let d = saved_leases(&f);
        if f.saved_directory.is_some() && f.saved_directory != f.this_directory {
            prop_assert_eq!(d, SavedLeases::Copy);
        }
        if d == SavedLeases::Copy {
            prop_assert!(f.copied());
            prop_assert!(!d.provable());
        }
    }

    /// Saved leases are used only with the registry they came from.
    #[test]
    fn never_uses_leases_from_another_registry(o in owned()) {
        let f = o.facts();
        let d = saved_leases(&f);
        let same = f.saved_registry.is_some() && f.saved_registry == f.registry_in_use();
        prop_assert_eq!(matches!(d, SavedLeases::SameRegistry { .. }), same && !f.copied());
        if f.saved_registry != f.configured_registry.or(f.saved_citus_registry) {
            let same_registry = matches!(d, SavedLeases::SameRegistry { .. });
            prop_assert!(!same_registry);
        }
    }

    /// Trusted while the registry is unreachable only when this directory
    /// provably saved them: it wrote the file, from the same registry, not
    /// from a backup, every block confirmed.
    #[test]
    fn provable_only_when_this_directory_saved_them(o in owned()) {
        let f = o.facts();
        let d = saved_leases(&f);
        if d.provable() {
            prop_assert!(f.saved_directory.is_some());
            prop_assert_eq!(f.saved_directory, f.this_directory);
            prop_assert!(f.saved_registry.is_some());
            prop_assert_eq!(f.saved_registry, f.registry_in_use());
            prop_assert!(!f.unconfirmed);
            prop_assert!(!f.started_from_backup && !f.saved_from_backup);
        }
        if d != SavedLeases::Copy {
            prop_assert_eq!(d.from_backup(), f.started_from_backup || f.saved_from_backup);
        }
    }

    /// A restored block is used only before its deadline, keeps the time
    /// it had left, and never starts below the restart floor or its own.
    #[test]
    fn a_restored_block_keeps_its_time_and_floors(
        deadline in -1_000_000i64..1_000_000,
        floor in -1_000_000i64..1_000_000,
        restart_floor in -1_000_000i64..1_000_000,
        now_mono in 0i64..1_000_000,
    ) {
        let saved = SavedBlock { block: 3, floor_ms: floor, high_ms: floor + 5, deadline_unix_ms: T0 + deadline };
        match restore(&saved, T0, now_mono, restart_floor) {
            None => prop_assert!(deadline <= 0),
            Some(r) => {
                prop_assert!(deadline > 0);
                prop_assert_eq!(r.deadline_mono_ms - now_mono, deadline);
                prop_assert!(r.floor_ms >= floor && r.floor_ms >= restart_floor);
                prop_assert!(r.floor_ms == floor || r.floor_ms == restart_floor);
                prop_assert_eq!((r.block, r.high_ms), (3, floor + 5));
            }
        }
    }

    /// Extreme saved values never overflow.
    #[test]
    fn restore_never_overflows(
        deadline in any::<i64>(), now_wall in any::<i64>(), now_mono in any::<i64>(),
    ) {
        let saved = SavedBlock { block: 0, floor_ms: 0, high_ms: 0, deadline_unix_ms: deadline };
        if let Some(r) = restore(&saved, now_wall, now_mono, 0) {
            prop_assert!(r.deadline_mono_ms >= now_mono);
        }
    }

    /// Whatever the registry says and whether the earlier session ends:
    /// that session is ended at most once, the node renames at most once
    /// (for its own session only when that one was there and did not end),
    /// and a claim gives up after at most three refusals.
    #[test]
    fn a_claim_ends_renames_and_gives_up_in_order(
        lingering in any::<bool>(),
        ends in prop::collection::vec(
            prop_oneof![Just(Ending::Ended), Just(Ending::Gone), Just(Ending::NotEnded)], 1..8),
    ) {
        let mut claim = NodeClaim::new(lingering);
        let (mut calls, mut renames, mut gave_up_at) = (0, 0, None);
        let mut seen = None;
        for (i, ending) in ends.iter().enumerate() {
            let step = claim.refused(|| { calls += 1; seen = Some(*ending); *ending });
            match step {
                Refused::Retry => prop_assert!(lingering && *ending == Ending::Ended && renames == 0),
                Refused::Rename(why) => {
                    renames += 1;
                    prop_assert_eq!(
                        why == Rename::OwnSessionNotEnded,
                        lingering && seen == Some(Ending::NotEnded) && i == 0
                    );
                }
                Refused::GiveUp => { gave_up_at.get_or_insert(i); }
            }
            if gave_up_at.is_some() {
                prop_assert_eq!(step, Refused::GiveUp);
            }
        }
        prop_assert!(calls <= usize::from(lingering));
        prop_assert!(renames <= 1);
        if let Some(i) = gave_up_at {
            prop_assert!(i <= 2);
            prop_assert_eq!(renames, 1);
        }
    }
}
