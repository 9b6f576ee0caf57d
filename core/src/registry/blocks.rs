//! What a lease, a renewal and a release do to the block rows
//! (`snowflake_lease_blocks`).
//!
//! - A block goes to another holder only when free: never leased,
//!   released, or its lease and grace ran out by the registry's clock
//!   ([`Invariant::DisjointBlocks`]). A node's blocks stay with the
//!   registry session that leased or last renewed them, or one that names
//!   it as its previous session (the same holder, reconnected); another
//!   session of the node (a copied data directory, a restarted holder)
//!   gets them only as a new lease once free.
//! - The last `reserve_blocks` free blocks of the fleet go only to nodes
//!   that hold none, one each: a node holding blocks leases another only
//!   while more than `reserve_blocks` stay free. The lease role's sessions
//!   under made-up node ids cannot leave a new server without a block
//!   while fewer than `reserve_blocks` of them arrive holding none.
//!   Re-assertions during a fence are bounded by `max_blocks_per_node`
//!   (and `max_blocks_per_role`) only: they restore blocks holders may be
//!   using.
//! - The sessions of one login role (`session_user`, recorded with each
//!   block) hold no more than `max_blocks_per_role` blocks whose lease
//!   runs, counted as `max_blocks_per_node` counts a node's: whatever the
//!   node ids its sessions make up, a role takes at most its share. (A
//!   block it lets lapse stays from others for its grace, a fifth of the
//!   lease, as any lapsed block; counting it too would keep a server that
//!   lost its blocks in an outage from new ones for as long.)
//! - While a holder keeps a block, its mark only rises
//!   ([`Invariant::MarkRisesWhileHeld`]); a new holder's floor is the mark
//!   it found.
//! - A release records the newest ID time the holder issued there, never
//!   below the floor it leased the block with, nor the floor of the last
//!   fence ([`Invariant::ReleaseNotBelowFloor`]).
//! - During a fence a holder that knew an older incarnation re-asserts its
//!   blocks: each one free or its own is its again, with the greater mark.
//!
//! [`Invariant::DisjointBlocks`]: crate::protocol::Invariant::DisjointBlocks
//! [`Invariant::MarkRisesWhileHeld`]: crate::protocol::Invariant::MarkRisesWhileHeld
//! [`Invariant::ReleaseNotBelowFloor`]: crate::protocol::Invariant::ReleaseNotBelowFloor

use super::begin::IncarnationRow;
use super::limits::InForce;
use super::{Refusal, Server, SqlState};
use crate::protocol::{AcquireRequest, BlockFloor, ReleaseRequest, RenewRequest};
use serde::{Deserialize, Serialize};

/// One row of `snowflake_lease_blocks`. Times are the registry's, Unix ms.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRow {
    pub block: u32,
    pub first_worker_id: i64,
    pub last_worker_id: i64,
    pub layout: String,
    #[serde(default)]
    pub holder_node: Option<String>,
    #[serde(default)]
    pub holder_name: Option<String>,
    #[serde(default)]
    pub leased_at_ms: Option<i64>,
    #[serde(default)]
    pub renewed_at_ms: Option<i64>,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    #[serde(default)]
    pub grace_ms: i64,
    #[serde(default)]
    pub high_water_ms: i64,
    #[serde(default)]
    pub released_at_ms: Option<i64>,
    #[serde(default)]
    pub leases: i64,
    #[serde(default)]
    pub floor_ms: i64,
    #[serde(default)]
    pub holder_session: Option<String>,
    /// The login role of the session that leased or last renewed it
    /// (`None`: a row of a registry before 0.8.0, until renewed).
    #[serde(default)]
    pub holder_role: Option<String>,
}

impl BlockRow {
    /// `node` holds it and its lease runs at `now_ms`.
    pub fn held_by(&self, node: &str, now_ms: i64) -> bool {
        self.holder_node.as_deref() == Some(node) && self.expires_at_ms.is_some_and(|e| e > now_ms)
    }

    /// Another holder may take it at `now_ms`: never leased, released, or
    /// its lease and grace ran out.
    pub fn free(&self, now_ms: i64) -> bool {
        self.holder_node.is_none()
            || self
                .expires_at_ms
                .is_none_or(|e| e.saturating_add(self.grace_ms) < now_ms)
    }

    /// Leased or renewed by a session of login role `role`, its lease
    /// running at `now_ms`: what [`InForce::max_blocks_per_role`] bounds.
    pub fn counts_for_role(&self, role: &str, now_ms: i64) -> bool {
        self.holder_role.as_deref() == Some(role)
            && self.holder_node.is_some()
            && self.expires_at_ms.is_some_and(|e| e > now_ms)
    }

    /// Leased to `node` in `session`, or in the one it names as its
    /// previous by a session of the login role the row records, `role`
    /// (any role may introduce any node, and see a session's pid, and
    /// guess its start: a row from 0.7.0 whose holder was away at the
    /// update records none, and passes only once its lease and grace ran
    /// out, as after a restart). A row from before 0.7.0 records no
    /// session: the update records the one holding its block's lock; with
    /// none, it too passes only once it ran out.
    fn owned_by(&self, node: &str, session: &str, previous: &str, role: &str) -> bool {
        let same_role = self.holder_role.as_deref() == Some(role);
        self.holder_node.as_deref() == Some(node)
            && (super::mutation::active(super::mutation::Mutation::BlocksToAnySession)
                || self.holder_session.as_deref().is_some_and(|s| {
                    s == session || (!previous.is_empty() && s == previous && same_role)
                }))
    }
}

/// What every call's rule needs besides its request and the rows.
pub struct Context<'a> {
    pub server: &'a Server,
    pub row: &'a IncarnationRow,
    pub limits: &'a InForce,
    /// The fleet's layout as the DBA fixed it (`snowflake_lease_limits`).
    pub layout: Option<String>,
}

impl Context<'_> {
    fn fenced(&self) -> bool {
        self.row
            .fenced_until_ms
            .is_some_and(|f| f > self.server.now_ms)
    }

    /// The layout block rows are made under: the DBA's, else that of the
    /// rows there are, else this registry server's own settings; a
    /// request's only where none of those is known.
    fn fleet_layout<'r>(&'r self, rows: &'r [BlockRow], asked: &'r str) -> &'r str {
        self.layout
            .as_deref()
            .or_else(|| rows.first().map(|r| r.layout.as_str()))
            .or(self.server.layout.as_deref())
            .unwrap_or(asked)
    }

    /// A new row for `block`, at the last fence's floor: a registry that
    /// forgot rows may meet blocks holders used under grants it lost.
    fn new_row(&self, block: u32, size: i64, max_worker_id: i64, layout: &str) -> BlockRow {
        let first = i64::from(block) * size;
        BlockRow {
            block,
            first_worker_id: first,
            last_worker_id: (first + size - 1).min(max_worker_id),
            layout: layout.to_string(),
            high_water_ms: self.row.fence_floor_ms,
            ..BlockRow::default()
        }
    }

    /// The blocks `node` may take: within `max_blocks_per_node`, and
    /// within `max_blocks_per_role` for this session's login role.
    fn room(&self, rows: &[BlockRow], node: &str) -> i64 {
        let now = self.server.now_ms;
        let held = rows.iter().filter(|b| b.held_by(node, now)).count() as i64;
        let node_room = (self.limits.max_blocks_per_node - held).max(0);
        match self.limits.max_blocks_per_role {
            Some(max) if !super::mutation::active(super::mutation::Mutation::NoRoleLimit) => {
                node_room.min((max - role_held(rows, &self.server.role, now)).max(0))
            }
            _ => node_room,
        }
    }

    /// The login role of this session, as block rows record it.
    fn role(&self) -> Option<String> {
        (!self.server.role.is_empty()).then(|| self.server.role.clone())
    }

    /// The blocks of the fleet that no node holds at `now`, among the
    /// layout's blocks (a block's first id within `max_worker_id`): rows
    /// free and rows not made yet.
    fn free_blocks(&self, rows: &[BlockRow], block_size: i64, max_worker_id: i64) -> i64 {
        let now = self.server.now_ms;
        (0..64i64)
            .filter(|&b| b.saturating_mul(block_size) <= max_worker_id)
            .filter(|&b| !self.set_aside(b, block_size, max_worker_id))
            .filter(|&b| {
                rows.iter()
                    .find(|r| i64::from(r.block) == b)
                    .is_none_or(|r| r.free(now))
            })
            .count() as i64
    }

    /// Whether block `b` holds a worker id this registry sets aside for
    /// backfill: never leased ([`super::backfill`]).
    fn set_aside(&self, b: i64, block_size: i64, max_worker_id: i64) -> bool {
        let Some(ids) = self.backfill_ids() else {
            return false;
        };
        let first = b.saturating_mul(block_size);
        let last = first.saturating_add(block_size - 1).min(max_worker_id);
        super::backfill::block_has_set_aside(&ids, first, last)
    }

    fn backfill_ids(&self) -> Option<crate::ranges::WorkerRanges> {
        let text = self.server.backfill_ids.trim();
        if text.is_empty() {
            return None;
        }
        crate::ranges::WorkerRanges::parse(text, u32::MAX - 1).ok()
    }

    /// The node's rows of this session that it holds, to lock.
    fn to_lock(&self, rows: &[BlockRow], node: &str, among: &[u32]) -> Vec<u32> {
        rows.iter()
            .filter(|b| {
                among.contains(&b.block)
                    && !self.server.locked.contains(&b.block)
                    && b.holder_node.as_deref() == Some(node)
                    && b.holder_session.as_deref() == Some(self.server.session.as_str())
            })
            .map(|b| b.block)
            .collect()
    }
}

/// The blocks the sessions of login role `role` hold at `now_ms`, their
/// leases running.
pub fn role_held(rows: &[BlockRow], role: &str, now_ms: i64) -> i64 {
    rows.iter()
        .filter(|b| b.counts_for_role(role, now_ms))
        .count() as i64
}

/// What a rule did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// The blocks granted or kept, each with its mark before the call.
    pub floors: Vec<BlockFloor>,
    /// Rows changed or added.
    pub changed: Vec<u32>,
    pub lock: Vec<u32>,
    pub unlock: Vec<u32>,
    pub released: bool,
    pub log: Vec<String>,
}

fn another_layout(name: &str, fleet: &str, asked: &str) -> Refusal {
    Refusal::new(
        SqlState::NotInPrerequisiteState,
        "this fleet's leases were made under another layout",
    )
    .detail(format!("The registry's blocks use {fleet}; the server {name} uses {asked}."))
    .hint("Every server of a fleet must use the same snowflake_id layout settings; on the registry, snowflake_lease_set_limits(layout => ...) fixes the fleet's layout.")
}

/// Gives `node` up to `want` free blocks among `allowed`, the least
/// recently used first (the lowest mark); none while fenced, none beyond
/// `max_blocks_per_node`, none of the last `reserve_blocks` free ones but
/// a first block.
pub fn acquire(
    req: &AcquireRequest,
    ctx: &Context,
    rows: &mut Vec<BlockRow>,
) -> Result<Done, Refusal> {
    let now = ctx.server.now_ms;
    let mut done = Done::default();
    let fleet = ctx.fleet_layout(rows, &req.layout).to_string();
    if req.layout != fleet {
        return Err(another_layout(&req.name, &fleet, &req.layout));
    }
    if ctx.fenced() {
        return Ok(done);
    }
    let room = ctx.room(rows, &req.node);
    let want = if req.want > room {
        done.log.push(format!(
            "node {} asked for {} blocks; it may hold {room} more (max_blocks_per_node, max_blocks_per_role)",
            req.node, req.want
        ));
        room
    } else {
        req.want
    };
    // The reserve: what is free beyond it, and one block of it for a node
    // that holds none.
    let holds_none = !rows.iter().any(|b| b.held_by(&req.node, now));
    let free = ctx.free_blocks(rows, req.block_size, req.max_worker_id);
    let beyond = (free - ctx.limits.reserve_blocks).max(i64::from(holds_none && free > 0));
    // Not logged: a busy holder asks again at each step, as it does when
    // no block is free.
    let want = want.min(beyond);
    // Candidates: free rows and rows not made yet, among the blocks this
    // layout has.
    let mut candidates: Vec<(i64, u32)> = Vec::new();
    for &a in &req.allowed {
        let Ok(block) = u32::try_from(a) else {
            continue;
        };
        if a.saturating_mul(req.block_size) > req.max_worker_id
            || candidates.iter().any(|c| c.1 == block)
            || ctx.set_aside(a, req.block_size, req.max_worker_id)
        {
            continue;
        }
        match rows.iter().find(|r| r.block == block) {
            Some(r) if r.free(now) && (r.layout == fleet || ctx.layout.is_some()) => {
                candidates.push((r.high_water_ms, block));
            }
            Some(_) => {}
            None => candidates.push((ctx.row.fence_floor_ms, block)),
        }
    }
    candidates.sort();
    for &(_, block) in candidates.iter().take(usize::try_from(want).unwrap_or(0)) {
        if !rows.iter().any(|r| r.block == block) {
            rows.push(ctx.new_row(block, req.block_size, req.max_worker_id, &fleet));
        }
        let Some(r) = rows.iter_mut().find(|r| r.block == block) else {
            continue;
        };
        let floor = r.high_water_ms;
        r.layout.clone_from(&fleet);
        r.holder_node = Some(req.node.clone());
        r.holder_name = Some(req.name.clone());
        r.leased_at_ms = Some(now);
        r.renewed_at_ms = Some(now);
        r.holder_session = Some(ctx.server.session.clone());
        r.holder_role = ctx.role();
        r.expires_at_ms = Some(now.saturating_add(req.lease_ms));
        r.grace_ms = req.grace_ms;
        // Invariant::MarkRisesWhileHeld (and the new holder starts above
        // the mark it found: its floor).
        r.high_water_ms = r.high_water_ms.max(req.high_ms);
        r.floor_ms = floor;
        r.released_at_ms = None;
        r.leases += 1;
        done.floors.push(BlockFloor {
            block,
            floor_ms: floor,
        });
        done.changed.push(block);
    }
    done.floors.sort_by_key(|f| f.block);
    let allowed: Vec<u32> = req
        .allowed
        .iter()
        .filter_map(|&a| u32::try_from(a).ok())
        .collect();
    done.lock = ctx.to_lock(rows, &req.node, &allowed);
    Ok(done)
}

/// Extends `node`'s leases of the blocks it names (a new expiry, the
/// holder's new mark); during a fence, re-asserts them for a holder that
/// knew an older incarnation. Returns the blocks still leased to it.
pub fn renew(req: &RenewRequest, ctx: &Context, rows: &mut Vec<BlockRow>) -> Done {
    let now = ctx.server.now_ms;
    let me = ctx.server.session.as_str();
    let previous = req.previous_session.as_str();
    let mut done = Done::default();
    let known = req.seen.incarnation.as_str();
    let reassert = ctx.fenced() && !known.is_empty() && known != ctx.row.incarnation;
    // The blocks named, each with the highest mark named for it.
    let mut asked: Vec<(u32, i64)> = Vec::new();
    for b in &req.blocks {
        let Ok(block) = u32::try_from(b.block) else {
            continue;
        };
        match asked.iter_mut().find(|a| a.0 == block) {
            Some(a) => a.1 = a.1.max(b.high_ms),
            None => asked.push((block, b.high_ms)),
        }
    }
    asked.sort_unstable();
    let mut taken: Vec<u32> = Vec::new();
    if reassert {
        let fleet = ctx.fleet_layout(rows, &req.layout).to_string();
        if req.block_size > 0 && req.layout == fleet {
            // Rows the registry forgot altogether (an emptied table).
            for &(block, _) in &asked {
                if !rows.iter().any(|r| r.block == block)
                    && i64::from(block).saturating_mul(req.block_size) <= req.max_worker_id
                {
                    rows.push(ctx.new_row(block, req.block_size, req.max_worker_id, &fleet));
                    done.changed.push(block);
                }
            }
        }
        let room = ctx.room(rows, &req.node);
        taken = asked
            .iter()
            .filter_map(|&(block, _)| {
                let r = rows.iter().find(|r| r.block == block)?;
                (r.holder_node.as_deref() != Some(req.node.as_str()) && r.free(now))
                    .then_some(block)
            })
            .collect();
        if taken.len() as i64 > room {
            done.log.push(format!(
                "node {} re-asserted {} blocks it does not hold; it may hold {room} more (max_blocks_per_node, max_blocks_per_role)",
                req.node,
                taken.len()
            ));
            taken.truncate(usize::try_from(room).unwrap_or(0));
        }
    }
    // A renewal that makes a block count for this session's role again
    // (its lease lapsed, or it was recorded under another role or none)
    // takes room as a lease does: max_blocks_per_role.
    let role_max = ctx
        .limits
        .max_blocks_per_role
        .filter(|_| !super::mutation::active(super::mutation::Mutation::NoRoleLimit));
    let role = ctx.server.role.as_str();
    let mut role_count = role_held(rows, role, now);
    for &(block, asserted) in &asked {
        let Some(r) = rows.iter_mut().find(|r| r.block == block) else {
            continue;
        };
        let mine = r.owned_by(&req.node, me, previous, role);
        let taken_now = taken.contains(&block) && r.free(now);
        if !(mine || taken_now) {
            continue;
        }
        if let Some(max) = role_max {
            if !r.counts_for_role(role, now) {
                if role_count >= max {
                    done.log.push(format!(
                        "node {} renewed block {block}, which its login role's other blocks leave no room for (max_blocks_per_role {max}): not renewed",
                        req.node
                    ));
                    continue;
                }
                role_count += 1;
            }
        }
        let old = r.high_water_ms;
        r.holder_node = Some(req.node.clone());
        r.holder_session = Some(me.to_string());
        r.holder_role = ctx.role();
        if !mine {
            r.leased_at_ms = Some(now);
            r.leases += 1;
            r.floor_ms = old;
        }
        r.released_at_ms = None;
        r.renewed_at_ms = Some(now);
        r.expires_at_ms = Some(now.saturating_add(req.lease_ms));
        r.grace_ms = req.grace_ms;
        // Invariant::MarkRisesWhileHeld: greatest, never lower.
        r.high_water_ms = old.max(req.high_ms).max(if mine { 0 } else { asserted });
        done.floors.push(BlockFloor {
            block,
            floor_ms: old,
        });
        if !done.changed.contains(&block) {
            done.changed.push(block);
        }
    }
    let named: Vec<u32> = asked.iter().map(|a| a.0).collect();
    done.lock = ctx.to_lock(rows, &req.node, &named);
    // Blocks handed to another holder: this session's lock is stale.
    done.unlock = ctx
        .server
        .locked
        .iter()
        .copied()
        .filter(|h| {
            named.contains(h)
                && !rows
                    .iter()
                    .any(|r| r.block == *h && r.holder_node.as_deref() == Some(req.node.as_str()))
        })
        .collect();
    done
}

/// Gives a block back, recording the newest ID time its holder issued
/// there, never below its floor.
pub fn release(req: &ReleaseRequest, ctx: &Context, rows: &mut [BlockRow]) -> Done {
    let mut done = Done::default();
    let Ok(block) = u32::try_from(req.block) else {
        return done;
    };
    if let Some(r) = rows.iter_mut().find(|r| {
        r.block == block
            && r.owned_by(
                &req.node,
                &ctx.server.session,
                &req.previous_session,
                &ctx.server.role,
            )
    }) {
        r.holder_node = None;
        r.released_at_ms = Some(ctx.server.now_ms);
        r.expires_at_ms = None;
        // Invariant::ReleaseNotBelowFloor: nor below the fence's floor,
        // which a fence raised the mark of a block held then to (the
        // lease's own floor is older: a block leased from a registry
        // restored in place before a holder's evidence fenced it, then
        // released with a mark of 0, went to a new server below IDs its
        // forgotten holder had made, in the simulation, seed 41 KeptAny).
        r.high_water_ms = if super::mutation::active(super::mutation::Mutation::ReleaseBelowFloor) {
            req.high_ms
        } else {
            r.floor_ms.max(req.high_ms).max(ctx.row.fence_floor_ms)
        };
        done.released = true;
        done.changed.push(block);
    }
    if ctx.server.locked.contains(&block) {
        done.unlock.push(block);
    }
    done
}
