//! The fleet's limits (`snowflake_lease_limits`): no request may exceed
//! them, and fences rest on them ([`Invariant::FenceFromLimits`]): every
//! grant this registry confirmed was within the limits in force then, so a
//! new incarnation that may have forgotten grants is fenced for the longest
//! lease time plus grace they allow, and raises every mark above the
//! largest lead they allow plus grace.
//!
//! `reserve_blocks` keeps the fleet's last blocks for servers that hold
//! none: a node holding blocks leases another only while more than
//! `reserve_blocks` blocks stay free, so that sessions of the lease role
//! under made-up node ids cannot leave a new server without one
//! ([`super::blocks::acquire`]).
//!
//! `max_blocks_per_role` bounds the blocks the sessions of one login role
//! hold together (`None`: no bound): with a login role per server, a
//! leaked credential takes at most that server's share, however many
//! sessions and made-up node ids it opens. One role shared by every
//! server cannot be bounded so (it would bound the whole fleet).
//!
//! A lowered limit keeps bounding fences (the `previous_*` values) until
//! every grant made under the higher one has run out (`previous_until`).
//!
//! [`Invariant::FenceFromLimits`]: crate::protocol::Invariant::FenceFromLimits

use super::mutation::{self, Mutation};
use super::{Call, Refusal, SqlState};
use serde::{Deserialize, Serialize};

/// The defaults (no row): the holders' default settings (10 min leases,
/// their grace, marks of lease time + the default max_drift + a minute of
/// clock offset, `snowflake_id.max_blocks`).
pub const DEFAULT_MAX_LEASE_MS: i64 = 600_000;
pub const DEFAULT_MAX_GRACE_MS: i64 = 120_000;
pub const DEFAULT_MAX_AHEAD_MS: i64 = 720_000;
pub const DEFAULT_MAX_BLOCKS_PER_NODE: i64 = 8;
/// A server's worth of blocks at the default `snowflake_id.max_blocks`.
pub const DEFAULT_RESERVE_BLOCKS: i64 = 8;

/// Each limit's range, so that no fence or floor leaves bigint's range.
pub const LEASE_RANGE: (i64, i64) = (2_000, 86_400_000);
pub const GRACE_RANGE: (i64, i64) = (1_000, 86_400_000);
pub const AHEAD_RANGE: (i64, i64) = (0, 172_800_000);
pub const BLOCKS_RANGE: (i64, i64) = (1, 64);
pub const RESERVE_RANGE: (i64, i64) = (0, 63);

/// The one row of `snowflake_lease_limits`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsRow {
    pub max_lease_ms: i64,
    pub max_grace_ms: i64,
    pub max_ahead_ms: i64,
    pub max_blocks_per_node: i64,
    #[serde(default)]
    pub previous_max_lease_ms: Option<i64>,
    #[serde(default)]
    pub previous_max_grace_ms: Option<i64>,
    #[serde(default)]
    pub previous_max_ahead_ms: Option<i64>,
    #[serde(default)]
    pub previous_until_ms: Option<i64>,
    /// The fleet's layout, fixed by the DBA (`snowflake_lease_set_limits(
    /// layout => ...)`): block rows are made and kept under it only.
    #[serde(default)]
    pub layout: Option<String>,
    /// What a request without a token says it saw counts, from a node
    /// that holds blocks (holders before 0.8.0 send none): set by the
    /// upgrade from 0.7.0, cleared by the DBA once every holder runs
    /// 0.8.0. A lease role can fence the fleet with such requests.
    #[serde(default)]
    pub unsigned_evidence: bool,
    /// Free blocks kept for nodes that hold none (`None`: the default).
    #[serde(default)]
    pub reserve_blocks: Option<i64>,
    /// The blocks all sessions of one login role may hold (`None`: no
    /// bound).
    #[serde(default)]
    pub max_blocks_per_role: Option<i64>,
}

/// The limits in force, and the higher ones fences still use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InForce {
    pub max_lease_ms: i64,
    pub max_grace_ms: i64,
    pub max_ahead_ms: i64,
    pub max_blocks_per_node: i64,
    pub reserve_blocks: i64,
    pub max_blocks_per_role: Option<i64>,
    pub fence_lease_ms: i64,
    pub fence_grace_ms: i64,
    pub fence_ahead_ms: i64,
    pub previous_until_ms: Option<i64>,
}

impl InForce {
    /// How long a fence lasts: every grant that may have been forgotten
    /// has run out at its holder by then.
    pub fn fence_ms(&self) -> i64 {
        self.fence_lease_ms + self.fence_grace_ms
    }
    /// Where a fence raises every mark to, at registry time `now_ms`.
    pub fn fence_floor_ms(&self, now_ms: i64) -> i64 {
        now_ms + self.fence_ahead_ms + self.fence_grace_ms
    }
}

fn clamp(v: i64, (lo, hi): (i64, i64)) -> i64 {
    v.clamp(lo, hi)
}

/// The limits in force at `now_ms`: the row's, or the defaults, each kept
/// in its range (a row written with its trigger disabled cannot push a
/// fence out of range).
pub fn in_force(row: Option<&LimitsRow>, now_ms: i64) -> InForce {
    let lease = clamp(
        row.map_or(DEFAULT_MAX_LEASE_MS, |r| r.max_lease_ms),
        LEASE_RANGE,
    );
    let grace = clamp(
        row.map_or(DEFAULT_MAX_GRACE_MS, |r| r.max_grace_ms),
        GRACE_RANGE,
    );
    let ahead = clamp(
        row.map_or(DEFAULT_MAX_AHEAD_MS, |r| r.max_ahead_ms),
        AHEAD_RANGE,
    );
    let blocks = clamp(
        row.map_or(DEFAULT_MAX_BLOCKS_PER_NODE, |r| r.max_blocks_per_node),
        BLOCKS_RANGE,
    );
    let reserve = clamp(
        row.and_then(|r| r.reserve_blocks)
            .unwrap_or(DEFAULT_RESERVE_BLOCKS),
        RESERVE_RANGE,
    );
    let previous = row.filter(|r| r.previous_until_ms.is_some_and(|u| u > now_ms));
    let prev = |f: fn(&LimitsRow) -> Option<i64>, hi: i64| {
        previous.map_or(0, |r| f(r).unwrap_or(0).min(hi))
    };
    InForce {
        max_lease_ms: lease,
        max_grace_ms: grace,
        max_ahead_ms: ahead,
        max_blocks_per_node: blocks,
        reserve_blocks: reserve,
        max_blocks_per_role: row
            .and_then(|r| r.max_blocks_per_role)
            .map(|m| clamp(m, BLOCKS_RANGE)),
        fence_lease_ms: lease.max(prev(|r| r.previous_max_lease_ms, LEASE_RANGE.1)),
        fence_grace_ms: grace.max(prev(|r| r.previous_max_grace_ms, GRACE_RANGE.1)),
        fence_ahead_ms: ahead.max(prev(|r| r.previous_max_ahead_ms, AHEAD_RANGE.1)),
        previous_until_ms: previous.and_then(|r| r.previous_until_ms),
    }
}

/// A change of the limits (`snowflake_lease_limits_changed`, before the
/// row is written): `new` with its `previous_*` values set from the limits
/// in force before (`rows`). A lowered lease time, grace or lead keeps the
/// higher fence values while a grant made under them may still run (a
/// block leased, its lease plus grace not over; a mark ahead of the clock;
/// a fence not over), until the longest of them has run out from now.
/// Returns the row and whether fences keep the higher values.
pub fn changed(rows: &super::Rows, mut new: LimitsRow, now_ms: i64) -> (LimitsRow, bool) {
    let was = in_force(rows.limits.as_ref(), now_ms);
    let lowered = new.max_lease_ms < was.max_lease_ms
        || new.max_grace_ms < was.max_grace_ms
        || new.max_ahead_ms < was.max_ahead_ms;
    let may_run = rows
        .blocks
        .iter()
        .any(|b| !b.free(now_ms) || b.high_water_ms > now_ms)
        || rows
            .registry
            .as_ref()
            .is_some_and(|r| r.fenced_until_ms.is_some_and(|f| f > now_ms));
    let kept = lowered && may_run && !mutation::active(Mutation::LoweredLimitsForgotten);
    if kept {
        let until = now_ms + was.fence_lease_ms.max(was.fence_ahead_ms) + was.fence_grace_ms;
        new.previous_until_ms = Some(was.previous_until_ms.map_or(until, |u| u.max(until)));
    } else {
        new.previous_until_ms = was.previous_until_ms;
    }
    let carried = new.previous_until_ms.is_some();
    new.previous_max_lease_ms = carried.then_some(was.fence_lease_ms);
    new.previous_max_grace_ms = carried.then_some(was.fence_grace_ms);
    new.previous_max_ahead_ms = carried.then_some(was.fence_ahead_ms);
    (new, kept)
}

/// What a request asks for, as the limits see it.
struct Asked {
    /// Every block it names.
    named: Vec<i64>,
    /// Every mark it asks for.
    marks: Vec<i64>,
    lease_ms: i64,
    grace_ms: i64,
    want: Option<i64>,
    /// Block size and largest worker id, where it sends them.
    geometry: Option<(i64, i64)>,
}

impl Asked {
    fn of(call: &Call) -> Asked {
        match call {
            Call::Acquire(r) => Asked {
                named: r.allowed.clone(),
                marks: vec![r.high_ms],
                lease_ms: r.lease_ms,
                grace_ms: r.grace_ms,
                want: Some(r.want),
                geometry: Some((r.block_size, r.max_worker_id)),
            },
            Call::Renew(r) => Asked {
                named: r.blocks.iter().map(|b| b.block).collect(),
                marks: std::iter::once(r.high_ms)
                    .chain(r.blocks.iter().map(|b| b.high_ms))
                    .collect(),
                lease_ms: r.lease_ms,
                grace_ms: r.grace_ms,
                want: None,
                geometry: (r.block_size != 0 || r.max_worker_id != 0)
                    .then_some((r.block_size, r.max_worker_id)),
            },
            // A release asks for no lease time.
            Call::Release(r) => Asked {
                named: vec![r.block],
                marks: vec![r.high_ms],
                lease_ms: 1,
                grace_ms: 0,
                want: None,
                geometry: None,
            },
        }
    }
}

/// The blocks a node and the login role of its session hold now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The node's blocks whose lease runs.
    pub node: i64,
    /// The blocks of the role of the session, their leases running.
    pub role: i64,
}

/// Refuses a request beyond the limits, or with values no holder sends,
/// before anything changes.
pub fn check(call: &Call, lim: &InForce, held: Held, now_ms: i64) -> Result<(), Refusal> {
    let node = call.node();
    let Asked {
        named,
        marks,
        lease_ms,
        grace_ms,
        want,
        geometry,
    } = Asked::of(call);
    let invalid = |problem: String| {
        Err(Refusal::new(
            SqlState::InvalidParameterValue,
            format!("lease request of node {node} refused: {problem}"),
        )
        .hint("The snowflake_id lease worker never sends such a request: who called the lease functions by hand?")
        .log(format!("refused a lease request of node {node}: {problem}")))
    };
    if node.is_empty() {
        return invalid("it names no node".into());
    }
    if let Some(bad) = named.iter().copied().filter(|b| !(0..64).contains(b)).min() {
        return invalid(format!(
            "block {bad} is none of a layout's 64 blocks (0 to 63)"
        ));
    }
    if let Some((size, max)) = geometry {
        if !(1..=1024).contains(&size) || !(0..=65_535).contains(&max) {
            return invalid(format!(
                "block_size {size} and max_worker_id {max} are no layout's (1 to 1024, 0 to 65535)"
            ));
        }
    }
    if lease_ms <= 0 || grace_ms < 0 || want.is_some_and(|w| w < 1) {
        return invalid(format!(
            "lease_ms must be positive, grace_ms not negative and want at least 1 (lease_ms {lease_ms}, grace_ms {grace_ms}, want {})",
            want.map_or("none".into(), |w| w.to_string())
        ));
    }
    if let Some(low) = marks.iter().copied().filter(|&m| m < 0).min() {
        return invalid(format!("a mark (high_ms) of {low} is before 1970"));
    }
    let beyond = |problem: String, hint: String| {
        Err(Refusal::new(
            SqlState::ProgramLimitExceeded,
            format!("lease request of node {node} refused: {problem}"),
        )
        .hint(hint)
        .log(format!("refused a lease request of node {node}: {problem}")))
    };
    if lease_ms > lim.max_lease_ms {
        return beyond(
            format!("lease_ms {lease_ms} is above the registry's limit max_lease_ms = {}", lim.max_lease_ms),
            format!("lease_ms is the holder's snowflake_id.lease_time: lower it on that server to at most {} ms, or raise the limit on the registry with snowflake_lease_set_limits(max_lease_ms => ...).", lim.max_lease_ms),
        );
    }
    if grace_ms > lim.max_grace_ms {
        return beyond(
            format!("grace_ms {grace_ms} is above the registry's limit max_grace_ms = {}", lim.max_grace_ms),
            format!("A holder asks for a grace of a fifth of its snowflake_id.lease_time (at least 1 s): lower snowflake_id.lease_time on that server to at most {} ms, or raise the limit on the registry with snowflake_lease_set_limits(max_grace_ms => ...).", lim.max_grace_ms.saturating_mul(5)),
        );
    }
    let ahead = marks
        .iter()
        .map(|m| m.saturating_sub(now_ms))
        .max()
        .unwrap_or(0);
    if ahead > lim.max_ahead_ms {
        return beyond(
            format!("a mark (high_ms) {ahead} ms ahead of the registry's clock is above its limit max_ahead_ms = {}", lim.max_ahead_ms),
            "A holder asks for marks of its clock + snowflake_id.lease_time + snowflake_id.max_drift: lower those on that server, check that its clock is not ahead of the registry's, or raise the limit on the registry with snowflake_lease_set_limits(max_ahead_ms => ...).".into(),
        );
    }
    if let Some(want) = want {
        let held_role = held.role;
        let held = held.node;
        if want > lim.max_blocks_per_node || held >= lim.max_blocks_per_node {
            let problem = if want > lim.max_blocks_per_node {
                format!(
                    "want {want} is above the registry's limit max_blocks_per_node = {}",
                    lim.max_blocks_per_node
                )
            } else {
                format!("the node holds {held} blocks already: the registry's limit max_blocks_per_node is {}", lim.max_blocks_per_node)
            };
            return beyond(
                problem,
                format!("Lower snowflake_id.max_blocks on that server to at most {}, or raise the limit on the registry with snowflake_lease_set_limits(max_blocks_per_node => ...).", lim.max_blocks_per_node),
            );
        }
        if let Some(max) = lim
            .max_blocks_per_role
            .filter(|&m| held_role >= m && !mutation::active(Mutation::NoRoleLimit))
        {
            return beyond(
                format!("the sessions of its login role hold {held_role} blocks already: the registry's limit max_blocks_per_role is {max}"),
                format!("Give each server a login role of its own (docs/operations/fleet.md), or raise the limit on the registry with snowflake_lease_set_limits(max_blocks_per_role => ...); blocks of a server rebuilt under the same role count until their lease runs out (at most {} ms).", lim.max_lease_ms),
            );
        }
    }
    Ok(())
}
