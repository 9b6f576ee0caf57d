//! Which set-aside worker ids a server records at start (the state file's
//! list), and whether the configured ones break the recorded ones. Pure
//! rules over plain inputs: the extension reads the state file and the
//! setting, calls [`at_start`], and stores what it decided.
//!
//! Grants are numbered over the set-aside `(worker id, sequence)` pairs in
//! the order of the ids (`backfill`). A grant made under the recorded ids
//! keeps its pairs only while the configured ids *start with* the recorded
//! ones (ids added at the end); any other change would renumber the grants
//! already handed out, so the recorded ids stay in force and the change is
//! reported (`snowflake_at()` refuses until it is undone).

use crate::ranges::WorkerRanges;

/// What a server records of the set-aside ids from this start on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The list the state file and shared memory keep (empty: none).
    pub ids: String,
    /// The configured ids break the recorded ones: the recorded list stays
    /// in force and backfill refuses until the configuration is undone.
    pub changed: bool,
    /// The configured ids add ids to a list recorded before (so live IDs
    /// made under the old list may use them until the floor is passed).
    pub newly_set_aside: bool,
}

/// What the state file said at start.
#[derive(Clone, Copy, Debug)]
pub struct AtStart<'a> {
    /// The recorded list, as written (empty: none).
    pub recorded: &'a str,
    /// The state file holds backfill grants.
    pub had_grants: bool,
    /// The state file held a floor (this is not a first start).
    pub had_state: bool,
}

/// The decision at start, given the configured set-aside ids (`None`: none)
/// under a layout whose largest worker id is `max_worker_id`.
pub fn at_start(
    state: AtStart<'_>,
    configured: Option<&WorkerRanges>,
    max_worker_id: u32,
) -> Recorded {
    let (ids, changed) = to_record(state.recorded, state.had_grants, configured, max_worker_id);
    let newly = !changed && state.had_state && new_since(state.recorded, configured, max_worker_id);
    Recorded {
        ids: if newly {
            state.recorded.to_string()
        } else {
            ids
        },
        changed,
        newly_set_aside: newly,
    }
}

/// Which list to record, and whether the configured ids break the recorded
/// ones. `had_grants`: grants were made under `recorded` (without any, the
/// configured ids are adopted as they are).
pub fn to_record(
    recorded: &str,
    had_grants: bool,
    configured: Option<&WorkerRanges>,
    max_worker_id: u32,
) -> (String, bool) {
    let configured_text = configured.map_or_else(String::new, ToString::to_string);
    if !had_grants || recorded.is_empty() {
        return (configured_text, false);
    }
    let continues = match (WorkerRanges::parse(recorded, max_worker_id), configured) {
        (Ok(old), Some(new)) => starts_with(new, &old),
        _ => false,
    };
    if continues {
        (configured_text, false)
    } else {
        (recorded.to_string(), true)
    }
}

/// Whether the configured ids include ids not in `recorded`.
pub fn new_since(recorded: &str, configured: Option<&WorkerRanges>, max_worker_id: u32) -> bool {
    let Some(configured) = configured else {
        return false;
    };
    match WorkerRanges::parse(recorded, max_worker_id) {
        Ok(old) if !recorded.trim().is_empty() => configured.iter().any(|id| !old.contains(id)),
        _ => true,
    }
}

/// Whether `new`, in increasing order, starts with every id of `old`.
fn starts_with(new: &WorkerRanges, old: &WorkerRanges) -> bool {
    new.len() >= old.len() && old.iter().zip(new.iter()).all(|(a, b)| a == b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = 1023;

    fn ranges(text: &str) -> WorkerRanges {
        WorkerRanges::parse(text, MAX).expect("test ranges parse")
    }

    fn start(recorded: &str, had_grants: bool, had_state: bool) -> AtStart<'_> {
        AtStart {
            recorded,
            had_grants,
            had_state,
        }
    }

    #[test]
    fn a_first_start_records_the_configured_ids() {
        let r = at_start(start("", false, false), Some(&ranges("1020-1023")), MAX);
        assert_eq!(
            r,
            Recorded {
                ids: "1020-1023".into(),
                changed: false,
                newly_set_aside: false
            }
        );
    }

    #[test]
    fn ids_added_at_the_end_keep_the_grants_and_are_new() {
        let r = at_start(
            start("1020-1021", true, true),
            Some(&ranges("1020-1023")),
            MAX,
        );
        // Until the floor passes, the old list stays recorded.
        assert_eq!(r.ids, "1020-1021");
        assert!(!r.changed && r.newly_set_aside);
        let (ids, changed) = to_record("1020-1021", true, Some(&ranges("1020-1023")), MAX);
        assert_eq!((ids.as_str(), changed), ("1020-1023", false));
    }

    #[test]
    fn ids_taken_away_or_reordered_break_the_grants() {
        for configured in ["1021-1023", "1020", "1000,1020-1021"] {
            let r = at_start(
                start("1020-1021", true, true),
                Some(&ranges(configured)),
                MAX,
            );
            assert_eq!(r.ids, "1020-1021", "{configured}");
            assert!(r.changed && !r.newly_set_aside, "{configured}");
        }
        let r = at_start(start("1020-1021", true, true), None, MAX);
        assert!(r.changed);
    }

    #[test]
    fn without_grants_any_change_is_adopted() {
        let r = at_start(start("1020-1021", false, true), Some(&ranges("5")), MAX);
        assert_eq!(r.ids, "1020-1021");
        assert!(!r.changed && r.newly_set_aside);
        let r = at_start(start("1020-1021", false, true), None, MAX);
        assert_eq!(
            r,
            Recorded {
                ids: String::new(),
                changed: false,
                newly_set_aside: false
            }
        );
    }

    #[test]
    fn an_unreadable_recorded_list_with_grants_is_kept_and_reported() {
        let r = at_start(start("not ids", true, true), Some(&ranges("1020")), MAX);
        assert_eq!(r.ids, "not ids");
        assert!(r.changed);
    }

    fn ranges_strategy() -> impl Strategy<Value = WorkerRanges> {
        proptest::collection::btree_set(0u32..64, 1..12).prop_map(|ids| {
            let text = ids
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            ranges(&text)
        })
    }

    proptest! {
        /// Grants made under the recorded ids keep their `(worker id,
        /// sequence)`: whatever is recorded from now on starts with the
        /// recorded ids, or the change is reported.
        #[test]
        fn grants_never_renumbered(
            old in ranges_strategy(),
            new in proptest::option::of(ranges_strategy()),
            had_state: bool,
        ) {
            let recorded = old.to_string();
            let r = at_start(start(&recorded, true, had_state), new.as_ref(), MAX);
            if r.changed {
                prop_assert_eq!(&r.ids, &recorded);
            } else {
                let kept = ranges(&r.ids);
                prop_assert!(starts_with(&kept, &old));
                let (next, _) = to_record(&recorded, true, new.as_ref(), MAX);
                prop_assert!(starts_with(&ranges(&next), &old));
            }
        }

        /// Newly set aside only when nothing broke, after a first start, and
        /// some configured id was not recorded.
        #[test]
        fn newly_set_aside_means_new_ids(
            old in ranges_strategy(),
            new in ranges_strategy(),
            had_grants: bool,
            had_state: bool,
        ) {
            let recorded = old.to_string();
            let r = at_start(start(&recorded, had_grants, had_state), Some(&new), MAX);
            prop_assert_eq!(
                r.newly_set_aside,
                !r.changed && had_state && new.iter().any(|id| !old.contains(id))
            );
            if r.newly_set_aside {
                prop_assert_eq!(&r.ids, &recorded);
            }
        }

        /// Without grants nothing is ever reported as broken.
        #[test]
        fn without_grants_never_changed(
            old in proptest::option::of(ranges_strategy()),
            new in proptest::option::of(ranges_strategy()),
            had_state: bool,
        ) {
            let recorded = old.map_or_else(String::new, |o| o.to_string());
            let r = at_start(start(&recorded, false, had_state), new.as_ref(), MAX);
            prop_assert!(!r.changed);
        }
    }
}
