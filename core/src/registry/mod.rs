//! The registry's side of fleet leases, as pure decisions over facts: what
//! a lease call answers and what it writes. No PostgreSQL calls.
//!
//! `src/sql/leases.sql` gathers the facts of a call in one query (the
//! rows, this session, the timeline and WAL position, the limits, the
//! failover candidates, `pg_stat_replication`), passes them to
//! [`decide`] through the extension's `snowflake_lease_decide`, and applies
//! the [`Writes`] it returns. [`memory::Store`] applies the same decisions
//! to rows kept in memory: the holder's tests and the simulation (`sim/`)
//! run these rules, never a copy of them.
//!
//! Every call, in one transaction that holds the registry's lease lock (so
//! that calls are decided one at a time, each on the rows the last one
//! wrote):
//! 1. [`begin::begin`]: the session holds the node's lock (taken by
//!    `snowflake_lease_hello`, one node per session: [`hello`]), the
//!    request is within the limits ([`limits::check`]), and the
//!    incarnation: a new one when this registry may have forgotten grants,
//!    fenced when holders may be using them
//!    ([`Invariant::FenceFromLimits`], [`Invariant::PromotionNeedsProof`]).
//! 2. The call's own rule ([`blocks`]): acquire, renew, release.
//! 3. The reply's WAL position and [`token`] are added after the writes.
//!
//! [`durable`] decides `snowflake_lease_durable`, called after the grant's
//! commit ([`Invariant::DurableBeforeUse`]).
//!
//! [`Invariant::FenceFromLimits`]: crate::protocol::Invariant::FenceFromLimits
//! [`Invariant::PromotionNeedsProof`]: crate::protocol::Invariant::PromotionNeedsProof
//! [`Invariant::DurableBeforeUse`]: crate::protocol::Invariant::DurableBeforeUse

pub mod backfill;
pub mod begin;
pub mod blocks;
pub mod durable;
pub mod hello;
pub mod limits;
pub mod memory;
pub mod mutation;
pub mod token;

#[cfg(test)]
mod tests;

use crate::protocol::{AcquireRequest, ReleaseRequest, RenewRequest};
use serde::{Deserialize, Serialize};

pub use begin::{IncarnationRow, Proof};
pub use blocks::BlockRow;
pub use limits::{InForce, LimitsRow};

/// A refusal, raised as a PostgreSQL error by the glue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The SQLSTATE.
    pub code: SqlState,
    pub message: String,
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub hint: Option<String>,
    /// Logged on the registry before the error (who asked, and why not).
    #[serde(default)]
    pub log: Option<String>,
}

/// The SQLSTATEs the registry's rules raise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SqlState {
    /// 22023 invalid_parameter_value: a value no holder sends.
    #[serde(rename = "22023")]
    InvalidParameterValue,
    /// 54000 program_limit_exceeded: beyond the fleet's limits.
    #[serde(rename = "54000")]
    ProgramLimitExceeded,
    /// 55000 object_not_in_prerequisite_state.
    #[serde(rename = "55000")]
    NotInPrerequisiteState,
    /// 42501 insufficient_privilege: not the node's session.
    #[serde(rename = "42501")]
    InsufficientPrivilege,
    /// 55P03 lock_not_available: a node's locks held by other roles.
    #[serde(rename = "55P03")]
    LockNotAvailable,
}

impl SqlState {
    pub fn code(self) -> &'static str {
        match self {
            SqlState::InvalidParameterValue => "22023",
            SqlState::ProgramLimitExceeded => "54000",
            SqlState::NotInPrerequisiteState => "55000",
            SqlState::InsufficientPrivilege => "42501",
            SqlState::LockNotAvailable => "55P03",
        }
    }
}

impl Refusal {
    pub fn new(code: SqlState, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            detail: None,
            hint: None,
            log: None,
        }
    }
    pub fn detail(mut self, detail: impl Into<String>) -> Refusal {
        self.detail = Some(detail.into());
        self
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Refusal {
        self.hint = Some(hint.into());
        self
    }
    pub fn log(mut self, log: impl Into<String>) -> Refusal {
        self.log = Some(log.into());
        self
    }
}

/// What the registry server and this session are, for one call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    /// The registry's clock (`now()`), Unix ms.
    pub now_ms: i64,
    /// The WAL timeline this server writes.
    pub timeline: u32,
    /// `pg_current_wal_insert_lsn()`.
    pub insert_lsn: u64,
    /// This session, `pid:start` (`snowflake_lease_session()`).
    pub session: String,
    /// This session's login role (`session_user`): block rows record it,
    /// and `max_blocks_per_role` bounds what its sessions hold.
    #[serde(default)]
    pub role: String,
    /// `pg_postmaster_start_time()`, Unix ms.
    pub postmaster_start_ms: i64,
    /// The OID of the registry's database (`pg_database`): another one than
    /// the row's is a copy of the database put in its place
    /// ([`begin`]). 0: unknown.
    #[serde(default)]
    pub database_oid: u32,
    /// The highest grant count this server signed a token for in this
    /// database since its postmaster started (shared memory, per database:
    /// a copy of the registry's database put in its place and then the
    /// original put back share a postmaster). A count at or below it may be
    /// of a call that rolled back after its reply left (a `DO` block that
    /// shows the reply, then raises): it is no evidence that the registry
    /// forgot. A registry restored in place, or that lost commits, has
    /// restarted since, and signed none of it.
    #[serde(default)]
    pub signed_grants: i64,
    /// The highest grant count a committed lease call left in the
    /// registry's row in this database since the postmaster started
    /// (shared memory, per database; a row made anew goes on from it): a
    /// row's count only rises, so one below it is another database put in
    /// the registry's place under its OID ([`begin`]).
    #[serde(default)]
    pub row_grants_seen: i64,
    /// `fsync = off` on this server.
    #[serde(default)]
    pub fsync_off: bool,
    /// `synchronous_commit = off` in this session.
    #[serde(default)]
    pub synchronous_commit_off: bool,
    /// This session holds the lock of the request's node
    /// (`snowflake_lease_hello`).
    #[serde(default)]
    pub node_locked: bool,
    /// The block locks this session holds.
    #[serde(default)]
    pub locked: Vec<u32>,
    /// Other sessions hold block locks here (live holders).
    #[serde(default)]
    pub others_lock_blocks: bool,
    /// Facts that prove a promotion kept every durable grant.
    #[serde(default)]
    pub proof: Proof,
    /// This registry server's own layout settings, as a holder would send
    /// them (`None`: unknown): the fleet's layout on a registry with no
    /// rows and none fixed by the DBA, so that no request can fix it.
    #[serde(default)]
    pub layout: Option<String>,
    /// The worker ids this registry server sets aside for backfill
    /// (`snowflake_id.backfill_worker_ids`, as ranges; empty: none): blocks
    /// holding one are never leased ([`backfill`]).
    #[serde(default)]
    pub backfill_ids: String,
    /// A fresh random name, used when a new incarnation begins.
    pub fresh_incarnation: String,
    /// The token key for a row made anew: the data directory's
    /// (`snowflake_id.key`), which `DROP EXTENSION` leaves, or, where the
    /// file was just made, a new one.
    pub fresh_key: String,
    /// `fresh_key` was there before this call: tokens of rows made before
    /// in this data directory verify under it.
    #[serde(default)]
    pub key_kept: bool,
    /// For the lease table's trigger ([`forgotten`]): how many rows the
    /// statement that fired it removed, where that is known (a `DELETE`'s
    /// transition table; the rows a `TRUNCATE` found, counted only where
    /// its query sees every committed row).
    #[serde(default)]
    pub removed: Option<i64>,
}

/// The registry's rows, as gathered under the lease lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rows {
    #[serde(default)]
    pub registry: Option<IncarnationRow>,
    #[serde(default)]
    pub blocks: Vec<BlockRow>,
    #[serde(default)]
    pub limits: Option<LimitsRow>,
}

/// A lease call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", content = "request", rename_all = "lowercase")]
pub enum Call {
    Acquire(AcquireRequest),
    Renew(RenewRequest),
    Release(ReleaseRequest),
}

impl Call {
    pub fn node(&self) -> &str {
        match self {
            Call::Acquire(r) => &r.node,
            Call::Renew(r) => &r.node,
            Call::Release(r) => &r.node,
        }
    }
}

/// What a call writes: whole rows, replaced or added (never deleted), and
/// the session's block locks to take or give up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writes {
    /// The registry's row, replaced.
    #[serde(default)]
    pub registry: Option<IncarnationRow>,
    /// Block rows, each replaced or added.
    #[serde(default)]
    pub blocks: Vec<BlockRow>,
    #[serde(default)]
    pub lock: Vec<u32>,
    #[serde(default)]
    pub unlock: Vec<u32>,
    /// Lines for the registry's log.
    #[serde(default)]
    pub log: Vec<String>,
}

/// What a call answers, before the WAL position and token are added
/// after its writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub incarnation: String,
    /// The registry's grant count after this call.
    #[serde(default)]
    pub grants: i64,
    pub fenced_until_ms: Option<i64>,
    /// Acquire and renew: the blocks granted or kept, each with its floor.
    #[serde(default)]
    pub blocks: Vec<crate::protocol::BlockFloor>,
    /// Release: whether the block was released.
    #[serde(default)]
    pub released: Option<bool>,
}

/// The outcome of a call that was not refused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub answer: Answer,
    pub writes: Writes,
}

/// Rows of the lease table forgotten (`how`; the `snowflake_lease_forget`
/// trigger, under the registry's lock): the new, fenced incarnation and
/// every block's mark raised to its floor ([`begin::forget`]); with no
/// registry row, or none removed ([`Server::removed`]), nothing (the next
/// call makes one).
pub fn forgotten(how: begin::Forgotten, server: &Server, rows: &Rows) -> Writes {
    // A statement that removed no row forgot nothing (a role with only
    // DELETE or TRUNCATE on the table would otherwise fence the fleet at
    // will); one whose count is not known may have.
    if how != begin::Forgotten::Restored && server.removed == Some(0) {
        return Writes::default();
    }
    let limits = limits::in_force(rows.limits.as_ref(), server.now_ms);
    let Some(row) = begin::forget(
        rows.registry.as_ref(),
        &limits,
        server.now_ms,
        &server.fresh_incarnation,
        how,
    ) else {
        return Writes::default();
    };
    let mut writes = Writes::default();
    // Invariant::FenceFromLimits: every mark above what a forgotten grant
    // allowed.
    for b in rows
        .blocks
        .iter()
        .filter(|b| b.high_water_ms < row.fence_floor_ms)
    {
        let mut b = b.clone();
        b.high_water_ms = row.fence_floor_ms;
        writes.blocks.push(b);
    }
    writes.log.push(format!(
        "rows of the lease table were {}: new incarnation {}, no block is leased anew until {} (Unix ms), and every block's floor is raised to {}",
        how.as_str(),
        row.incarnation,
        row.fenced_until_ms.unwrap_or_default(),
        row.fence_floor_ms
    ));
    writes.registry = Some(row);
    writes
}

/// Decides one lease call from the facts gathered for it.
pub fn decide(call: &Call, server: &Server, rows: &Rows) -> Result<Outcome, Refusal> {
    let limits = limits::in_force(rows.limits.as_ref(), server.now_ms);
    let held = limits::Held {
        node: rows
            .blocks
            .iter()
            .filter(|b| b.held_by(call.node(), server.now_ms))
            .count() as i64,
        role: blocks::role_held(&rows.blocks, &server.role, server.now_ms),
    };
    limits::check(call, &limits, held, server.now_ms)?;
    let begun = begin::begin(call, server, rows, &limits)?;
    let mut writes = Writes::default();
    let mut blocks = rows.blocks.clone();
    if let Some(fence_floor) = begun.raise_marks_to {
        // Invariant::FenceFromLimits: every mark above what a forgotten
        // grant allowed.
        for b in blocks.iter_mut().filter(|b| b.high_water_ms < fence_floor) {
            b.high_water_ms = fence_floor;
            writes.blocks.push(b.clone());
        }
    }
    writes.log.extend(begun.log.iter().cloned());
    if begun.write {
        writes.registry = Some(begun.row.clone());
    }
    let ctx = blocks::Context {
        server,
        row: &begun.row,
        limits: &limits,
        layout: rows.limits.as_ref().and_then(|l| l.layout.clone()),
    };
    let mut answer = Answer {
        incarnation: begun.row.incarnation.clone(),
        fenced_until_ms: begun.row.fenced_until_ms.filter(|&f| f > server.now_ms),
        ..Answer::default()
    };
    let changed = match call {
        Call::Acquire(req) => {
            let done = blocks::acquire(req, &ctx, &mut blocks)?;
            answer.blocks = done.floors;
            writes.lock = done.lock;
            writes.log.extend(done.log);
            done.changed
        }
        Call::Renew(req) => {
            let done = blocks::renew(req, &ctx, &mut blocks);
            answer.blocks = done.floors;
            writes.lock = done.lock;
            writes.unlock = done.unlock;
            writes.log.extend(done.log);
            done.changed
        }
        Call::Release(req) => {
            let done = blocks::release(req, &ctx, &mut blocks);
            answer.released = Some(done.released);
            writes.unlock = done.unlock;
            done.changed
        }
    };
    let mut row = begun.row;
    if !changed.is_empty() {
        // Only calls that grant move the count.
        row.grants += 1;
        writes.registry = Some(row.clone());
    }
    answer.grants = row.grants;
    for block in changed {
        if let Some(b) = blocks.iter().find(|b| b.block == block) {
            writes.blocks.retain(|w| w.block != block);
            writes.blocks.push(b.clone());
        }
    }
    writes.blocks.sort_by_key(|b| b.block);
    Ok(Outcome { answer, writes })
}
