//! Backfill in a fleet: the registry hands out the fleet's backfill
//! grants (see [`crate::backfill`]) to its holders. Pure rules, no
//! PostgreSQL.
//!
//! - The set-aside worker ids are fleet-wide: the same
//!   `snowflake_id.backfill_worker_ids` on the registry and every holder
//!   that backfills ([`plan`] refuses a holder whose ids or layout differ,
//!   naming both). The registry never leases a block holding one of them
//!   ([`block_has_set_aside`], used by [`super::blocks::acquire`]), so no
//!   live ID of the fleet has a set-aside worker id at a time after the
//!   marks of such blocks ([`Plan::after_ms`]: backfill times at or
//!   before it are refused by the holder). While such a block is still
//!   leased (leased before its ids were set aside), no grant is handed out.
//! - The grants are counted by the registry server's own per-stretch
//!   counters (shared memory, state file, WAL), the ones its own
//!   `snowflake_at()` takes from: a grant is handed out once by the
//!   registry, whoever asks. A holder uses it only once the registry says
//!   the WAL holding it is durable on its synchronous standbys (the
//!   lease's rule, `snowflake_lease_durable`), so a failover to such a
//!   standby continues above it.
//! - The lease role may ask: one call takes at most one grant of each of
//!   at most [`MAX_BATCH`] stretches, never more than the stretch's
//!   limit (a further grant of a stretch never takes its reserve). A role
//!   that calls again and again can still use up the space, as it can hold
//!   blocks: the lease role is trusted with the fleet's worker ids.

use super::blocks::BlockRow;
use super::{Refusal, SqlState};
use crate::backfill::{Space, BUCKETS, MAX_BATCH};
use crate::ranges::WorkerRanges;
use serde::{Deserialize, Serialize};

/// What a holder asks: the first grant of each named stretch it holds
/// none of (`first`), or one further grant (IDs sharing a tick).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRequest {
    /// The holder's node id and name, for the registry's log.
    pub node: String,
    #[serde(default)]
    pub name: String,
    /// The holder's layout, as leases send it (`lease::layout_text`).
    pub layout: String,
    /// The holder's `snowflake_id.backfill_worker_ids`, as ranges.
    pub ids: String,
    /// Stretches (buckets), the first the one the holder needs now.
    pub buckets: Vec<i64>,
    /// Per stretch: the holder holds none of its grants.
    pub first: Vec<bool>,
    /// Per stretch: how many grants the holder's own counters count (it
    /// backfilled alone before, or used the fleet's; 0.8.0): the registry
    /// raises its counters to them first, so that it never hands out
    /// again a grant the holder handed out itself. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<i64>,
}

/// The registry's answer: per stretch asked, the grant handed out (`None`:
/// none; all `None` when the first was refused), the time at or before
/// which no backfill ID may be made, and how many grants the first stretch
/// had handed out after the call (for the holder's message).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantReply {
    pub grants: Vec<Option<u32>>,
    pub after_ms: i64,
    #[serde(default)]
    pub handed_out: u32,
    /// The registry's WAL flush position after the grants (text).
    #[serde(default)]
    pub lsn: String,
}

/// What the registry knows for a grant call.
pub struct Facts<'a> {
    /// Its layout, as holders send theirs.
    pub layout: &'a str,
    /// Its set-aside ids (`None`: none).
    pub space: Option<&'a Space>,
    /// Its own backfill floor (`snowflake_at()`'s: live history of the
    /// set-aside ids on the registry server, an accepted layout change).
    pub after_ms: i64,
    /// The lease rows.
    pub blocks: &'a [BlockRow],
    /// The registry's clock, Unix ms.
    pub now_ms: i64,
}

/// What to hand out: the stretches, each with its limit
/// ([`Space::grant_limit`]), and the holder's floor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub buckets: Vec<u32>,
    pub limits: Vec<u32>,
    /// Per stretch, the count to raise the registry's counter to first
    /// (the holder's own: [`GrantRequest::held`]).
    pub raise: Vec<(u32, u32)>,
    /// Backfill times at or before this are refused: the registry's own
    /// floor and the marks of blocks holding set-aside ids (their live IDs).
    pub after_ms: i64,
}

/// Whether a block of worker ids `first..=last` holds a set-aside id.
pub fn block_has_set_aside(ids: &WorkerRanges, first: i64, last: i64) -> bool {
    ids.ranges()
        .iter()
        .any(|&(lo, hi)| i64::from(lo) <= last && i64::from(hi) >= first)
}

fn invalid(detail: String) -> Refusal {
    Refusal::new(
        SqlState::InvalidParameterValue,
        "invalid backfill grant request",
    )
    .detail(detail)
    .hint("The snowflake_id backfill of a holder never sends such a request: who called snowflake_backfill_grant by hand?")
}

/// The grants of one call, or why none: the holder's ids and layout must
/// be the registry's, the request within [`MAX_BATCH`] distinct stretches,
/// and no block holding a set-aside id leased.
pub fn plan(req: &GrantRequest, facts: &Facts) -> Result<Plan, Refusal> {
    let who = format!("node {} ({})", req.node, req.name);
    let Some(space) = facts.space else {
        return Err(Refusal::new(
            SqlState::NotInPrerequisiteState,
            "the registry sets aside no worker ids for backfill",
        )
        .detail(format!("The server {} backfills with snowflake_id.backfill_worker_ids = '{}'; the registry's is empty.", req.name, req.ids))
        .hint("Set the same snowflake_id.backfill_worker_ids on the registry server (it preloads snowflake_id) and restart it.")
        .log(format!("{who} asked for backfill grants; none are set aside here")));
    };
    let ours = space.ids().to_string();
    if req.ids != ours {
        return Err(Refusal::new(
            SqlState::NotInPrerequisiteState,
            "this server's set-aside worker ids are not the registry's",
        )
        .detail(format!(
            "The server {} sets aside snowflake_id.backfill_worker_ids = '{}'; the registry sets aside '{ours}'.",
            req.name, req.ids
        ))
        .hint("Set the same snowflake_id.backfill_worker_ids on every server of the fleet and on the registry, and restart them.")
        .log(format!("{who} asked for backfill grants of ids '{}', the registry's are '{ours}'", req.ids)));
    }
    if req.layout != facts.layout {
        return Err(Refusal::new(
            SqlState::NotInPrerequisiteState,
            "this server's layout is not the registry's",
        )
        .detail(format!(
            "The server {} uses {}; the registry uses {}.",
            req.name, req.layout, facts.layout
        ))
        .hint("Every server of a fleet and its registry must use the same snowflake_id layout settings."));
    }
    if req.buckets.is_empty() || req.buckets.len() > MAX_BATCH {
        return Err(invalid(format!(
            "{} stretches asked; 1 to {MAX_BATCH} are allowed.",
            req.buckets.len()
        )));
    }
    if req.first.len() != req.buckets.len() {
        return Err(invalid("first must have one value per stretch.".into()));
    }
    if !req.held.is_empty() && req.held.len() != req.buckets.len() {
        return Err(invalid(
            "held must have one value per stretch, or none.".into(),
        ));
    }
    let capacity = i64::from(space.grants_per_bucket());
    if let Some(h) = req.held.iter().find(|&&h| !(0..=capacity).contains(&h)) {
        return Err(invalid(format!(
            "held {h} is not one of 0 to {capacity} (the grants of a stretch)."
        )));
    }
    let mut buckets = Vec::with_capacity(req.buckets.len());
    for &b in &req.buckets {
        let Some(b) = u32::try_from(b).ok().filter(|&b| b < BUCKETS) else {
            return Err(invalid(format!(
                "stretch {b} is not one of 0 to {}.",
                BUCKETS - 1
            )));
        };
        if buckets.contains(&b) {
            return Err(invalid(format!("stretch {b} is asked twice.")));
        }
        buckets.push(b);
    }
    let mut after_ms = facts.after_ms;
    for row in facts.blocks {
        if !block_has_set_aside(space.ids(), row.first_worker_id, row.last_worker_id) {
            continue;
        }
        if !row.free(facts.now_ms) {
            return Err(Refusal::new(
                SqlState::NotInPrerequisiteState,
                "a block of worker ids set aside for backfill is leased",
            )
            .detail(format!(
                "Block {} (worker ids {} to {}) is leased to node {}; its live IDs may have any time up to its lease's end.",
                row.block,
                row.first_worker_id,
                row.last_worker_id,
                row.holder_node.as_deref().unwrap_or("?")
            ))
            .hint("The registry no longer leases it anew: backfill once its holder has released it, or its lease and grace ran out."));
        }
        after_ms = after_ms.max(row.high_water_ms);
    }
    let limits = req
        .first
        .iter()
        .map(|&first| space.grant_limit(usize::from(!first)))
        .collect();
    let raise = buckets
        .iter()
        .zip(&req.held)
        .filter_map(|(&b, &h)| u32::try_from(h).ok().filter(|&h| h > 0).map(|h| (b, h)))
        .collect();
    Ok(Plan {
        buckets,
        limits,
        raise,
        after_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PRESETS;

    fn space(ids: &str) -> Space {
        let layout = PRESETS[0]
            .layout(crate::layout::DEFAULT_EPOCH_MS, 1_795_651_200_000)
            .unwrap();
        Space::new(&layout, WorkerRanges::parse(ids, 1023).unwrap())
    }

    fn req(buckets: Vec<i64>) -> GrantRequest {
        GrantRequest {
            node: "n1".into(),
            name: "h1".into(),
            layout: "L".into(),
            ids: "1020-1023".into(),
            first: vec![true; buckets.len()],
            buckets,
            held: Vec::new(),
        }
    }

    fn facts<'a>(space: Option<&'a Space>, blocks: &'a [BlockRow]) -> Facts<'a> {
        Facts {
            layout: "L",
            space,
            after_ms: 5,
            blocks,
            now_ms: 1_000_000,
        }
    }

    fn block(n: u32, holder: Option<&str>, expires: i64, mark: i64) -> BlockRow {
        BlockRow {
            block: n,
            first_worker_id: i64::from(n) * 16,
            last_worker_id: i64::from(n) * 16 + 15,
            holder_node: holder.map(String::from),
            expires_at_ms: Some(expires),
            high_water_ms: mark,
            ..BlockRow::default()
        }
    }

    #[test]
    fn a_plan_has_a_limit_per_stretch_first_grants_up_to_the_reserve() {
        let s = space("1020-1023");
        let mut r = req(vec![7, 8]);
        r.first = vec![true, false];
        let p = plan(&r, &facts(Some(&s), &[])).unwrap();
        assert_eq!(p.buckets, vec![7, 8]);
        assert_eq!(p.limits, vec![256, 256 - 16]);
        assert_eq!(p.after_ms, 5);
    }

    #[test]
    fn the_holders_own_counts_raise_the_registrys_first() {
        // A server that backfilled alone, then joined the fleet: the
        // registry handed out its grants again from 0 (300 IDs made twice
        // on real servers, tests/fleet/test_adversarial_backfill_fleet.py).
        let s = space("1020-1023");
        let mut r = req(vec![7, 8]);
        r.held = vec![12, 0];
        let p = plan(&r, &facts(Some(&s), &[])).unwrap();
        assert_eq!(p.raise, vec![(7, 12)]);
        r.held = vec![12];
        assert_eq!(
            plan(&r, &facts(Some(&s), &[])).unwrap_err().code,
            SqlState::InvalidParameterValue
        );
        r.held = vec![i64::from(s.grants_per_bucket()) + 1, 0];
        assert_eq!(
            plan(&r, &facts(Some(&s), &[])).unwrap_err().code,
            SqlState::InvalidParameterValue
        );
    }

    #[test]
    fn other_ids_another_layout_or_none_set_aside_are_refused_naming_both() {
        let s = space("1020-1023");
        let e = plan(&req(vec![1]), &facts(None, &[])).unwrap_err();
        assert_eq!(e.code, SqlState::NotInPrerequisiteState);
        let mut r = req(vec![1]);
        r.ids = "1022-1023".into();
        let e = plan(&r, &facts(Some(&s), &[])).unwrap_err();
        let d = e.detail.unwrap();
        assert!(
            d.contains("'1022-1023'") && d.contains("'1020-1023'"),
            "{d}"
        );
        assert!(e.log.is_some());
        let mut r = req(vec![1]);
        r.layout = "M".into();
        assert!(plan(&r, &facts(Some(&s), &[])).is_err());
    }

    #[test]
    fn requests_no_holder_sends_are_refused() {
        let s = space("1020-1023");
        for buckets in [
            vec![],
            vec![-1],
            vec![i64::from(BUCKETS)],
            vec![3, 3],
            (0..=MAX_BATCH as i64).collect(),
        ] {
            let e = plan(&req(buckets.clone()), &facts(Some(&s), &[])).unwrap_err();
            assert_eq!(e.code, SqlState::InvalidParameterValue, "{buckets:?}");
        }
        let mut r = req(vec![1, 2]);
        r.first = vec![true];
        assert!(plan(&r, &facts(Some(&s), &[])).is_err());
        assert!(plan(&req((0..MAX_BATCH as i64).collect()), &facts(Some(&s), &[])).is_ok());
    }

    #[test]
    fn a_leased_block_of_set_aside_ids_refuses_and_a_free_one_raises_the_floor() {
        let s = space("1020-1023");
        let leased = [block(63, Some("x"), 2_000_000, 9)];
        let e = plan(&req(vec![1]), &facts(Some(&s), &leased)).unwrap_err();
        assert!(e.detail.unwrap().contains("Block 63"));
        // Run out (expiry plus grace before the clock): free, its mark the floor.
        let gone = [
            block(63, Some("x"), 900_000, 777),
            block(2, Some("y"), 2_000_000, 10_000),
        ];
        assert_eq!(
            plan(&req(vec![1]), &facts(Some(&s), &gone))
                .unwrap()
                .after_ms,
            777
        );
    }

    #[test]
    fn blocks_holding_a_set_aside_id() {
        let ids = WorkerRanges::parse("1020-1023,40", 1023).unwrap();
        assert!(block_has_set_aside(&ids, 1008, 1023));
        assert!(block_has_set_aside(&ids, 32, 47));
        assert!(!block_has_set_aside(&ids, 48, 63));
        assert!(!block_has_set_aside(&ids, 992, 1007));
    }
}
