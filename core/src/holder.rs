//! The holder's side of fleet leases as a state machine, in plain Rust:
//! what a server does with the registry's replies, over a [`Registry`]
//! client and a [`Host`] (the slots in shared memory and the lease file).
//! No PostgreSQL calls: `lease_worker` is the glue (connections, Citus
//! discovery, the lease file's format), `leases.sql` the registry, and
//! `lease` the rules of marks and the safety argument; [`problems`] is
//! the lease worker's problem reporting. The tests (`holder/tests.rs`)
//! drive it against the registry's real rules over rows in memory
//! (`registry::memory`), which forget, and a network that stalls,
//! reorders and lies.
//!
//! # What the holder trusts
//!
//! - A block is used only under a mark the registry confirmed in a reply
//!   of the *incarnation* the holder knows, or re-asserted to a new one
//!   (see `leases.sql`: a registry that may have forgotten grants starts a
//!   new incarnation and fences).
//! - A reply whose WAL position is below one the holder has already seen
//!   from the same incarnation comes from a registry that went back in
//!   time without knowing it: nothing in it is used, and the next call
//!   tells the registry (which then starts a new, fenced incarnation).
//! - Blocks saved before a restart are used once a renewal confirms them;
//!   before that only while the registry is unreachable and the glue
//!   vouches that this data directory saved them ([`Holder::trust_saved`]).
//! - A reply naming blocks the holder did not ask for is ignored for
//!   those blocks.
//! - A grant (a lease, or a renewal that extends a lease or raises a
//!   mark) is used only once the registry says it is *durable*: on enough
//!   synchronous standbys to satisfy its `synchronous_standby_names`,
//!   checked on the registry after the commit ([`Registry::durable`]), not
//!   inferred from a COMMIT that returned (one whose wait for the standby
//!   was cancelled returns with a warning only). Until then the holder
//!   keeps what it had: a renewal is retried at the next round, leased
//!   blocks wait in [`Holder::pending`] (never used, never saved) until a
//!   durable renewal confirms them. An old primary cut off from its
//!   standby can never make a grant durable, so what it grants after a
//!   promotion is never used. With no synchronous standby named, the
//!   registry's local flush is all there is; [`Replication::Synchronous`]
//!   refuses such grants.
//! - No call waits past the deadline of a block in use, and an answer that
//!   came at or after it is not used ([`Registry::answer_by`],
//!   [`lease::CallLimit`]): the holder stops using a block at its deadline
//!   by its own monotonic clock also while the registry stalls (the glue
//!   is back in its loop then, and revokes it, [`Holder::expire_due`]).
//!   A call that grants (a lease, a renewal, their durability checks) is
//!   bounded by the deadline of its own grant too, so that a late answer
//!   never hands sessions a block already past its deadline.

use crate::lease::{self, CallEnd, Held, Plan, Timing, Usage};
use crate::protocol::EARLIER_KEPT;
pub use crate::protocol::{
    format_lsn, parse_lsn, AcquireRequest, BlockFloor, BlockMark, Durability, DurabilityMode,
    ReleaseReply, ReleaseRequest, RenewRequest, Reply, ReplyHead, Seen,
};

/// What the holder requires of a grant before it uses it
/// (`snowflake_id.lease_replication`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replication {
    /// Durable as the registry is configured: on its synchronous standbys
    /// when `synchronous_standby_names` names some, else flushed locally.
    #[default]
    Auto,
    /// On synchronous standbys only: a registry with none named grants
    /// nothing this server uses.
    Synchronous,
}

/// How a call ended without a reply the holder can use: what happened,
/// so that the glue decides by kind (the texts are for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// No answer before the holder's own limit (`end`: the call timeout,
    /// or the deadline of a block in use, [`lease::CallLimit`]); an answer
    /// that came at or after it counts as none. The session is dropped.
    NoAnswer { end: CallEnd, text: String },
    /// The registry gave the call up at its own `lock_timeout` or
    /// `statement_timeout` (SQLSTATE 55P03 or 57014; a lock held there):
    /// nothing of it was done and it is no answer, but the session is
    /// sound and stays.
    RegistryTimeout { sqlstate: String, message: String },
    /// The registry refused the call with an error of its own, or
    /// answered what this server cannot use.
    Refused(Refusal),
    /// The connection broke during the call, or none could be used.
    Lost(String),
}

/// An error the registry raised (or this server found in its answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The registry's SQLSTATE; `None` for what this server refused of
    /// an answer (or of its own request).
    pub sqlstate: Option<String>,
    /// The message, with its detail and hint.
    pub message: String,
    pub hint: Option<String>,
}

/// SQLSTATEs of the registry's own timeouts (`lock_timeout`,
/// `statement_timeout`): a wait there, not an answer.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
pub const QUERY_CANCELED: &str = "57014";
/// SQLSTATEs of a call whose function or schema does not exist (the
/// registry's extension was updated or made again since the session
/// found them).
pub const UNDEFINED_FUNCTION: &str = "42883";
pub const INVALID_SCHEMA_NAME: &str = "3F000";

impl Refusal {
    /// The lease functions are no longer where this session found them: a
    /// new session looks them up again.
    pub fn functions_gone(&self) -> bool {
        matches!(
            self.sqlstate.as_deref(),
            Some(UNDEFINED_FUNCTION | INVALID_SCHEMA_NAME)
        )
    }
}

impl CallError {
    /// An error the registry raised: its own timeouts are no answer,
    /// anything else a refusal.
    pub fn from_registry(sqlstate: Option<String>, message: String, hint: Option<String>) -> Self {
        match sqlstate {
            Some(code) if code == LOCK_NOT_AVAILABLE || code == QUERY_CANCELED => {
                CallError::RegistryTimeout {
                    sqlstate: code,
                    message,
                }
            }
            sqlstate => CallError::Refused(Refusal {
                sqlstate,
                message,
                hint,
            }),
        }
    }

    /// What this server refused of an answer (no SQLSTATE).
    pub fn unusable(message: impl Into<String>) -> Self {
        CallError::Refused(Refusal {
            sqlstate: None,
            message: message.into(),
            hint: None,
        })
    }

    /// Whether the registry answered the call (with an error of its own):
    /// the registry answers again.
    pub fn answered(&self) -> bool {
        matches!(self, CallError::Refused(r) if !r.functions_gone())
    }

    /// Whether the session is of no more use: the glue drops it and
    /// connects again.
    pub fn drops_session(&self) -> bool {
        match self {
            CallError::NoAnswer { .. } | CallError::Lost(_) => true,
            CallError::Refused(r) => r.functions_gone(),
            CallError::RegistryTimeout { .. } => false,
        }
    }

    /// What went wrong, as text.
    pub fn text(&self) -> &str {
        match self {
            CallError::NoAnswer { text, .. } | CallError::Lost(text) => text,
            CallError::RegistryTimeout { message, .. } => message,
            CallError::Refused(r) => &r.message,
        }
    }
}

/// What a call complete at `answered_mono_ms` under `limit` comes to:
/// `answer` (rows, or the registry's error), unless it came at or after a
/// lease deadline: then it is no answer ([`lease::CallLimit::answer_usable`]),
/// whatever it said.
pub fn settle<T>(
    limit: &lease::CallLimit,
    answered_mono_ms: i64,
    answer: Result<T, CallError>,
) -> Result<T, CallError> {
    if limit.answer_usable(answered_mono_ms) {
        return answer;
    }
    Err(CallError::NoAnswer {
        end: limit.end,
        text: format!(
            "the answer came {} ms after the lease deadline of this server's blocks: not used",
            answered_mono_ms.saturating_sub(limit.until_mono_ms)
        ),
    })
}

/// What one round's calls came to ([`Holder::step`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// The registry answered a call of this round (a reply, or an error
    /// of its own), also when a later call failed.
    pub answered: bool,
    /// The call error that ended the round.
    pub error: Option<CallError>,
}

/// The registry, as the holder calls it (one connected session that took
/// the node's lock).
pub trait Registry {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError>;
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError>;
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError>;
    /// Whether everything this session committed is durable where a
    /// failover can reach it, waiting up to `wait_ms` for the standbys.
    fn durable(&mut self, wait_ms: i64) -> Result<Durability, CallError>;
    /// The holder's monotonic ms by which the calls that follow must be
    /// over: the earliest deadline of the blocks in use
    /// ([`lease::in_use_deadline`]; `None`: none is in use, the call
    /// timeout alone). Set before every call. A call that gets no answer
    /// by then fails as `Unreachable`, and so does one whose answer came
    /// at or after it ([`lease::CallLimit`]): the glue is then back in its
    /// loop to revoke the block at its deadline.
    fn answer_by(&mut self, deadline_mono_ms: Option<i64>);
}

/// This server's side: the slots of each block, and the lease file.
pub trait Host {
    /// Sessions may use `block` for IDs above `floor_ms`, up to `high_ms`
    /// (its mark), while this server's clock reads before `stop_ms` (its
    /// deadline, [`lease::stop_ms`]): the mark bounds the IDs' times, the
    /// stop when sessions make them, so that they stop at the deadline
    /// also while the lease worker cannot revoke the block.
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64, stop_ms: i64);
    /// A confirmed renewal raised the mark and the stop of an active block.
    fn raise(&mut self, block: u32, high_ms: i64, stop_ms: i64);
    /// No session may use `block` any more.
    fn revoke(&mut self, block: u32);
    /// Stops `block` if none of its ids has a session: the start of its
    /// newest tick issued (Unix ms), `Some(None)` when it never issued,
    /// `None` when it is busy (and stays in use).
    fn stop_if_idle(&mut self, block: u32) -> Option<Option<i64>>;
    /// Saves the holder's state durably (the lease file).
    fn save(&mut self, holder: &Holder);
}

/// What happened, for the server log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Leased {
        block: u32,
        floor_ms: i64,
    },
    Expired {
        block: u32,
    },
    Lost {
        block: u32,
    },
    Released {
        block: u32,
    },
    /// The registry began another incarnation (it may have forgotten
    /// grants); `old` is empty on the first contact after a restart that
    /// saved none.
    NewIncarnation {
        old: String,
        new: String,
    },
    /// A reply went back in time (its WAL position, or its grant count
    /// with the position not: another database put in the registry's
    /// place): not used.
    Rollback {
        seen: String,
        reply: String,
        seen_grants: i64,
        reply_grants: i64,
    },
    /// No block is leased anew until this registry-clock Unix ms.
    Fenced {
        until_ms: i64,
    },
    /// The registry refused a call.
    Refused(String),
    /// The registry granted nothing and this server holds nothing.
    NoFreeBlock,
    /// A grant was committed but is not durable where a failover can
    /// reach it (`what`: "lease" or "renewal"): not used.
    NotDurable {
        what: &'static str,
        durability: Durability,
        required: Replication,
    },
    /// Grants are durable again after a `NotDurable`.
    DurableAgain,
    /// How the registry's grants are made durable changed (first seen,
    /// or e.g. synchronous to local): for the log.
    DurabilityMode {
        mode: DurabilityMode,
    },
}

/// The static facts of a holder's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub node: String,
    pub name: String,
    pub layout: String,
    pub block_size: u32,
    pub max_worker_id: u32,
}

/// The holder's state: private; the glue reads it through accessors and
/// changes it through named operations.
#[derive(Clone, Debug)]
pub struct Holder {
    id: Identity,
    held: Vec<Held>,
    /// The registry incarnation last seen ('' for none).
    incarnation: String,
    /// The highest registry WAL position seen from that incarnation.
    lsn: u64,
    /// The registry's token for that incarnation and position ('' from a
    /// registry before 0.8.0): presented with every request, so that the
    /// registry believes what the holder says it saw (`registry::token`).
    token: String,
    /// The registry's grant count seen with them (0.8.0).
    grants: i64,
    /// What it saw of the incarnations before, newest first (at most
    /// `EARLIER_KEPT`), presented with every request.
    earlier: Vec<Seen>,
    /// Monotonic ms when the last confirmed renewal was sent.
    last_renew_mono: Option<i64>,
    /// Saved blocks may be used before a renewal confirms them (set by the
    /// glue while the registry is unreachable and this data directory
    /// provably saved them).
    trust_saved: bool,
    /// This server started from a backup: a saved block, once confirmed,
    /// is used only above the registry's mark for it.
    from_backup: bool,
    /// Registry-clock Unix ms of the last fence reported.
    fenced_until_ms: Option<i64>,
    /// An older incarnation first seen replaced in an acquire's reply: the
    /// next renewal presents it, so that the registry takes it as a
    /// re-assertion of the blocks held.
    reassert_from: Option<Seen>,
    /// Blocks leased by a grant that is not durable yet: never used nor
    /// saved; renewed with the blocks held, and moved to `held` by the
    /// first durable renewal that keeps them (dropped at a new incarnation
    /// or their deadline).
    pending: Vec<Held>,
    /// The last grant was not durable (a `NotDurable` was reported).
    not_durable: bool,
    /// The durability mode last reported.
    durability_mode: Option<DurabilityMode>,
    /// The registry session before the current one (`pid:start`; set by
    /// the glue when it reconnects; '' for none, as after a restart): a
    /// copy of this data directory cannot name it.
    previous_session: String,
    events: Vec<Event>,
}

/// Clock readings and settings for one step.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub mono_ms: i64,
    pub wall_ms: i64,
    pub timing: Timing,
    pub max_drift_ms: i64,
    /// `snowflake_id.max_blocks`.
    pub max_blocks: u32,
    /// `snowflake_id.lease_replication`.
    pub replication: Replication,
}

impl Now {
    /// When sessions stop using `h`: its deadline on this server's clock.
    fn stop_ms(&self, h: &Held) -> i64 {
        lease::stop_ms(h.deadline_mono_ms, self.mono_ms, self.wall_ms)
    }
}

impl Holder {
    pub fn new(id: Identity) -> Holder {
        Holder {
            id,
            held: Vec::new(),
            incarnation: String::new(),
            lsn: 0,
            token: String::new(),
            grants: 0,
            earlier: Vec::new(),
            last_renew_mono: None,
            trust_saved: false,
            from_backup: false,
            fenced_until_ms: None,
            reassert_from: None,
            pending: Vec::new(),
            not_durable: false,
            durability_mode: None,
            previous_session: String::new(),
            events: Vec::new(),
        }
    }

    /// The static facts of its requests.
    pub fn id(&self) -> &Identity {
        &self.id
    }

    /// The blocks held (in use, or saved and waiting for confirmation).
    pub fn held(&self) -> &[Held] {
        &self.held
    }

    /// The earliest deadline of the blocks in use ([`lease::in_use_deadline`]).
    pub fn in_use_deadline(&self) -> Option<i64> {
        lease::in_use_deadline(&self.held)
    }

    /// Whether this server started from a backup and a saved block is still
    /// unconfirmed (the lease file says so, so that the next start knows).
    pub fn from_backup_unconfirmed(&self) -> bool {
        self.from_backup && self.held.iter().any(|h| !h.confirmed)
    }

    /// Takes the holder's events, for the log.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Resumes from what a lease file saved: the registry seen (its
    /// incarnation, WAL position, token and grant count) and whether this
    /// server started from a backup (then a saved block, once confirmed,
    /// is used only above the registry's mark for it). An unreadable WAL
    /// position is taken as none seen.
    pub fn resume(&mut self, seen: &Seen, from_backup: bool) {
        self.incarnation.clone_from(&seen.incarnation);
        self.lsn = parse_lsn(&seen.lsn).unwrap_or(0);
        self.token.clone_from(&seen.token);
        self.grants = seen.grants;
        self.earlier.clone_from(&seen.earlier);
        self.earlier.truncate(EARLIER_KEPT);
        self.from_backup = from_backup;
    }

    /// Whether saved blocks may be used before a renewal confirms them:
    /// set by the glue each round (the registry is unreachable and this
    /// data directory provably saved them).
    pub fn trust_saved(&mut self, trusted: bool) {
        self.trust_saved = trusted;
    }

    /// The registry session before the current one (`pid:start`, '' for
    /// none), named in renewals and releases: set when reconnecting.
    pub fn set_previous_session(&mut self, session: String) {
        self.previous_session = session;
    }

    /// Takes another node id (a copy of this data directory holds the old
    /// one): returns the old one. The blocks of the old id are dropped
    /// with [`Holder::forget_all`].
    pub fn rename(&mut self, node: String) -> String {
        std::mem::replace(&mut self.id.node, node)
    }

    /// A block saved before a restart: used once confirmed (or trusted).
    pub fn add_saved(&mut self, block: u32, floor_ms: i64, high_ms: i64, deadline_mono_ms: i64) {
        if self.held.iter().any(|h| h.block == block) {
            return;
        }
        self.held.push(Held {
            block,
            floor_ms,
            high_ms,
            deadline_mono_ms,
            active: false,
            confirmed: false,
            idle_since_mono_ms: None,
        });
    }

    /// Drops every block (another registry, another node id).
    pub fn forget_all(&mut self, host: &mut dyn Host) {
        for h in std::mem::take(&mut self.held) {
            host.revoke(h.block);
        }
        self.pending.clear();
        self.incarnation.clear();
        self.lsn = 0;
        self.token.clear();
        self.grants = 0;
        self.last_renew_mono = None;
    }

    /// Revokes every block whose deadline has come (and drops pending
    /// grants past theirs), as a round's plan does first. The glue calls it
    /// before it connects and after a round, so that no block is in use
    /// past its deadline while the worker waits on the registry.
    pub fn expire_due(&mut self, now_mono_ms: i64, host: &mut dyn Host) {
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|h| now_mono_ms >= h.deadline_mono_ms)
            .map(|h| h.block)
            .collect();
        for &block in &due {
            self.events.push(Event::Expired { block });
            host.revoke(block);
        }
        self.held.retain(|h| !due.contains(&h.block));
        self.pending.retain(|h| now_mono_ms < h.deadline_mono_ms);
    }

    /// Tells the registry by when the next call must be over: the earliest
    /// deadline of the blocks in use, and, for a call whose answer would
    /// grant (a lease, a renewal, and their durability checks), the
    /// deadline of that grant (`grant_deadline_mono_ms`): an answer that
    /// comes after it would hand sessions a block already past its
    /// deadline.
    fn bound(&self, registry: &mut dyn Registry, grant_deadline_mono_ms: Option<i64>) {
        let in_use = lease::in_use_deadline(&self.held);
        registry.answer_by(match (in_use, grant_deadline_mono_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        });
    }

    /// A new session on the registry: renew at once (adopts saved blocks,
    /// drops those handed over since).
    pub fn reconnected(&mut self) {
        self.last_renew_mono = None;
    }

    /// Idle tracking from the slots' usage (`usage` per held block).
    fn track_idle(&mut self, usage: &[Usage], now_mono: i64) {
        for h in &mut self.held {
            let busy = usage
                .iter()
                .find(|u| u.block == h.block)
                .is_some_and(|u| u.busy > 0);
            if busy || !h.active {
                h.idle_since_mono_ms = None;
            } else if h.idle_since_mono_ms.is_none() {
                h.idle_since_mono_ms = Some(now_mono);
            }
        }
    }

    /// One round: expire, activate, renew, release, acquire. `registry` is
    /// `None` while there is no session. Returns whether the registry
    /// answered and the call error that ended the round, if any (the glue
    /// drops the session when [`CallError::drops_session`]).
    pub fn step(
        &mut self,
        now: Now,
        usage: &[Usage],
        allowed: &[u32],
        registry: Option<&mut dyn Registry>,
        host: &mut dyn Host,
    ) -> Round {
        let mut registry = registry.map(|inner| Answers {
            inner,
            answered: false,
        });
        let result = self.round(now, usage, allowed, registry.as_mut(), host);
        Round {
            answered: registry.is_some_and(|r| r.answered),
            error: result.err(),
        }
    }

    fn round(
        &mut self,
        now: Now,
        usage: &[Usage],
        allowed: &[u32],
        registry: Option<&mut Answers<'_>>,
        host: &mut dyn Host,
    ) -> Result<(), CallError> {
        self.track_idle(usage, now.mono_ms);
        if self.trust_saved && registry.is_none() {
            for h in self.held.iter_mut().filter(|h| !h.confirmed) {
                h.confirmed = true;
            }
        }
        let plan = lease::plan(
            &self.held,
            usage,
            now.mono_ms,
            now.wall_ms,
            &now.timing,
            now.max_drift_ms,
            self.id.block_size,
            now.max_blocks,
        );
        self.apply_local(&plan, &now, host);
        // Pending blocks were never used: past their deadline they are
        // simply dropped (the registry frees them after their expiry).
        self.pending.retain(|h| now.mono_ms < h.deadline_mono_ms);
        let Some(registry) = registry else {
            return Ok(());
        };
        let registry: &mut dyn Registry = registry;
        let due = self
            .last_renew_mono
            .is_none_or(|t| now.mono_ms.saturating_sub(t) >= now.timing.renew_every_ms);
        // Pending grants are not in this round's plan: none is acquired in
        // a round that began with some, even if the renewal confirms them.
        let none_pending = self.pending.is_empty();
        if (!self.held.is_empty() || !none_pending) && due {
            self.renew(now, registry, host)?;
        }
        for block in &plan.release {
            self.release(*block, registry, host)?;
        }
        // Unconfirmed saved blocks and pending grants are not supply yet:
        // the renewal above confirms or drops them first.
        if plan.acquire > 0 && self.held.iter().all(|h| h.confirmed) && none_pending {
            self.acquire(plan.acquire, allowed, now, registry, host)?;
        }
        Ok(())
    }

    fn apply_local(&mut self, plan: &Plan, now: &Now, host: &mut dyn Host) {
        for &block in &plan.expire {
            self.events.push(Event::Expired { block });
            host.revoke(block);
        }
        self.held.retain(|h| !plan.expire.contains(&h.block));
        for &block in &plan.activate {
            self.activate(block, now, host);
        }
    }

    fn activate(&mut self, block: u32, now: &Now, host: &mut dyn Host) {
        if let Some(h) = self.held.iter_mut().find(|h| h.block == block) {
            h.active = true;
            host.activate(block, h.floor_ms, h.high_ms, now.stop_ms(h));
        }
    }

    /// What the holder presents of the registry it saw.
    pub fn seen(&self) -> Seen {
        Seen {
            incarnation: self.incarnation.clone(),
            lsn: format_lsn(self.lsn),
            grants: self.grants,
            token: self.token.clone(),
            earlier: self.earlier.clone(),
        }
    }

    /// Checks a reply's incarnation and WAL position; false: not usable.
    fn accept(&mut self, head: &ReplyHead) -> bool {
        let (incarnation, lsn) = (head.incarnation.as_str(), head.lsn.as_str());
        let Some(lsn) = parse_lsn(lsn) else {
            self.events.push(Event::Refused(format!(
                "invalid WAL position {lsn:?} in a reply"
            )));
            return false;
        };
        if incarnation != self.incarnation {
            // Grants of the older incarnation that never became durable:
            // the new one may never have known them.
            self.pending.clear();
            if !self.incarnation.is_empty() {
                let before = Seen {
                    earlier: Vec::new(),
                    ..self.seen()
                };
                self.earlier.retain(|e| e.incarnation != before.incarnation);
                self.earlier.insert(0, before);
                self.earlier.truncate(EARLIER_KEPT);
            }
            self.events.push(Event::NewIncarnation {
                old: std::mem::take(&mut self.incarnation),
                new: incarnation.to_string(),
            });
            self.incarnation = incarnation.to_string();
            self.lsn = lsn;
            self.grants = head.grants;
            self.token.clone_from(&head.token);
            return true;
        }
        if lsn < self.lsn || head.grants < self.grants {
            self.events.push(Event::Rollback {
                seen: format_lsn(self.lsn),
                reply: format_lsn(lsn),
                seen_grants: self.grants,
                reply_grants: head.grants,
            });
            return false;
        }
        self.lsn = lsn;
        self.grants = head.grants;
        self.token.clone_from(&head.token);
        true
    }

    fn note_fence(&mut self, until: Option<i64>) {
        if until.is_some() && until != self.fenced_until_ms {
            if let Some(until_ms) = until {
                self.events.push(Event::Fenced { until_ms });
            }
        }
        self.fenced_until_ms = until;
    }

    /// Whether the grant just committed may be used: asks the registry
    /// whether it is durable, reports a change.
    fn durable(
        &mut self,
        what: &'static str,
        now: &Now,
        grant_deadline_mono_ms: i64,
        registry: &mut dyn Registry,
    ) -> Result<bool, CallError> {
        let wait_ms = now.timing.renew_every_ms.clamp(100, DURABLE_WAIT_MAX_MS);
        self.bound(registry, Some(grant_deadline_mono_ms));
        let durability = match registry.durable(wait_ms) {
            Ok(d) => d,
            Err(e) => return self.failed(e).map(|()| false),
        };
        let usable = durability.durable
            && (now.replication == Replication::Auto
                || durability.mode == DurabilityMode::Synchronous);
        if Some(durability.mode) != self.durability_mode {
            self.durability_mode = Some(durability.mode);
            self.events.push(Event::DurabilityMode {
                mode: durability.mode,
            });
        }
        if usable {
            if std::mem::take(&mut self.not_durable) {
                self.events.push(Event::DurableAgain);
            }
        } else {
            self.not_durable = true;
            self.events.push(Event::NotDurable {
                what,
                durability,
                required: now.replication,
            });
        }
        Ok(usable)
    }

    /// A renewal: request, call, then the pure steps that apply its
    /// reply (before and after the durability check).
    fn renew(
        &mut self,
        now: Now,
        registry: &mut dyn Registry,
        host: &mut dyn Host,
    ) -> Result<(), CallError> {
        let (req, grant) = self.renew_request(&now);
        self.bound(registry, Some(grant.deadline_mono_ms));
        let reply = match registry.renew(&req) {
            Ok(reply) => reply,
            Err(e) => return self.failed(e),
        };
        let Some(kept) = self.apply_renewal_reply(&reply, host) else {
            return Ok(());
        };
        // Nothing else is used before it is durable: the deadlines and
        // marks stay those of the last durable renewal, and the renewal is
        // sent again at the next round.
        if !self.durable("renewal", &now, grant.deadline_mono_ms, registry)? {
            return Ok(());
        }
        self.apply_durable_renewal(&kept, grant, &now, host);
        Ok(())
    }

    /// The renewal of the blocks held and pending, and what it grants once
    /// confirmed. A re-assertion ([`Holder::reassert_from`]) names the
    /// older incarnation (with its token) at the position seen since.
    fn renew_request(&mut self, now: &Now) -> (RenewRequest, lease::Grant) {
        let grant = lease::grant(now.mono_ms, now.wall_ms, &now.timing, now.max_drift_ms);
        let req = RenewRequest {
            node: self.id.node.clone(),
            layout: self.id.layout.clone(),
            block_size: self.id.block_size.into(),
            max_worker_id: self.id.max_worker_id.into(),
            blocks: self
                .held
                .iter()
                .chain(&self.pending)
                .map(|h| BlockMark {
                    block: h.block.into(),
                    high_ms: h.high_ms,
                })
                .collect(),
            lease_ms: now.timing.lease_ms,
            grace_ms: now.timing.grace_ms,
            high_ms: grant.high_ms,
            seen: match self.reassert_from.take() {
                Some(old) => Seen {
                    lsn: format_lsn(self.lsn),
                    ..old
                },
                None => self.seen(),
            },
            previous_session: self.previous_session.clone(),
        };
        (req, grant)
    }

    /// A renewal's reply, before its durability is known: `None` when the
    /// reply is not usable; else the blocks it keeps. Blocks it does not
    /// keep are given up at once (safe whether or not it is durable).
    fn apply_renewal_reply(
        &mut self,
        reply: &Reply,
        host: &mut dyn Host,
    ) -> Option<Vec<BlockFloor>> {
        if !self.accept(&reply.head) {
            return None;
        }
        self.note_fence(reply.head.fenced_until_ms);
        let asked: Vec<u32> = self
            .held
            .iter()
            .chain(&self.pending)
            .map(|h| h.block)
            .collect();
        let kept: Vec<BlockFloor> = reply
            .blocks
            .iter()
            .filter(|b| asked.contains(&b.block))
            .copied()
            .collect();
        let lost: Vec<u32> = asked
            .iter()
            .copied()
            .filter(|b| !kept.iter().any(|k| k.block == *b))
            .collect();
        for &block in &lost {
            if self.held.iter().any(|h| h.block == block) {
                self.events.push(Event::Lost { block });
                host.revoke(block);
            }
        }
        self.held.retain(|h| !lost.contains(&h.block));
        self.pending.retain(|h| !lost.contains(&h.block));
        Some(kept)
    }

    /// A durable renewal: pending blocks it keeps are held (and used once
    /// their floor is within `max_drift`), the kept blocks' marks and
    /// deadlines rise to the grant's.
    fn apply_durable_renewal(
        &mut self,
        kept: &[BlockFloor],
        grant: lease::Grant,
        now: &Now,
        host: &mut dyn Host,
    ) {
        self.last_renew_mono = Some(now.mono_ms);
        for k in kept {
            let Some(i) = self.pending.iter().position(|p| p.block == k.block) else {
                continue;
            };
            let mut h = self.pending.swap_remove(i);
            h.confirmed = true;
            self.held.push(h);
            if h.floor_ms.saturating_sub(now.max_drift_ms) <= now.wall_ms {
                self.activate(h.block, now, host);
            }
        }
        for k in kept {
            let Some(h) = self.held.iter_mut().find(|h| h.block == k.block) else {
                continue;
            };
            if !h.confirmed && self.from_backup {
                // A backup's saved block: its IDs since the backup are
                // unknown here, the registry's mark bounds them.
                h.floor_ms = h.floor_ms.max(k.floor_ms);
            }
            h.confirmed = true;
            h.high_ms = h.high_ms.max(grant.high_ms);
            h.deadline_mono_ms = h.deadline_mono_ms.max(grant.deadline_mono_ms);
            if h.active {
                host.raise(h.block, h.high_ms, now.stop_ms(h));
            }
        }
    }

    /// A lease of `want` more blocks: request, call, then the pure steps
    /// that apply its reply (before and after the durability check).
    fn acquire(
        &mut self,
        want: u32,
        allowed: &[u32],
        now: Now,
        registry: &mut dyn Registry,
        host: &mut dyn Host,
    ) -> Result<(), CallError> {
        let (req, grant) = self.acquire_request(want, allowed, &now);
        self.bound(registry, Some(grant.deadline_mono_ms));
        let reply = match registry.acquire(&req) {
            Ok(reply) => reply,
            Err(e) => return self.failed(e),
        };
        if !self.apply_lease_reply(&reply) {
            return Ok(());
        }
        // A failed check leaves the blocks leased here as pending, so that
        // they are renewed (or given up) rather than stranded until expiry.
        let checked = if reply.blocks.is_empty() {
            Ok(true)
        } else {
            self.durable("lease", &now, grant.deadline_mono_ms, registry)
        };
        let durable = matches!(checked, Ok(true));
        self.apply_lease(&reply.blocks, allowed, durable, grant, &now, host);
        checked.map(|_| ())
    }

    fn acquire_request(
        &self,
        want: u32,
        allowed: &[u32],
        now: &Now,
    ) -> (AcquireRequest, lease::Grant) {
        let grant = lease::grant(now.mono_ms, now.wall_ms, &now.timing, now.max_drift_ms);
        let req = AcquireRequest {
            node: self.id.node.clone(),
            name: self.id.name.clone(),
            layout: self.id.layout.clone(),
            block_size: self.id.block_size.into(),
            max_worker_id: self.id.max_worker_id.into(),
            allowed: allowed.iter().map(|&b| b.into()).collect(),
            want: want.into(),
            lease_ms: now.timing.lease_ms,
            grace_ms: now.timing.grace_ms,
            high_ms: grant.high_ms,
            seen: self.seen(),
        };
        (req, grant)
    }

    /// A lease's reply, before its durability is known: false when it is
    /// not usable. A new incarnation seen here: the blocks held were not
    /// re-asserted by this call; the next renewal does that (at once).
    fn apply_lease_reply(&mut self, reply: &Reply) -> bool {
        let known = self.seen();
        if !self.accept(&reply.head) {
            return false;
        }
        if known.incarnation != self.incarnation && !self.held.is_empty() {
            self.last_renew_mono = None;
            if !known.incarnation.is_empty() {
                self.reassert_from = Some(known);
            }
        }
        self.note_fence(reply.head.fenced_until_ms);
        if reply.blocks.is_empty() && self.held.is_empty() && reply.head.fenced_until_ms.is_none() {
            self.events.push(Event::NoFreeBlock);
        }
        true
    }

    /// The blocks a lease granted: used (once their floor is within
    /// `max_drift`) when the grant is `durable`, else pending.
    fn apply_lease(
        &mut self,
        blocks: &[BlockFloor],
        allowed: &[u32],
        durable: bool,
        grant: lease::Grant,
        now: &Now,
        host: &mut dyn Host,
    ) {
        for b in blocks {
            if !allowed.contains(&b.block) {
                continue;
            }
            if !durable {
                // Leased to this server by a grant a failover may lose:
                // not used until a durable renewal confirms it.
                if !self
                    .held
                    .iter()
                    .chain(&self.pending)
                    .any(|h| h.block == b.block)
                {
                    self.pending.push(Held {
                        block: b.block,
                        floor_ms: b.floor_ms,
                        high_ms: grant.high_ms,
                        deadline_mono_ms: grant.deadline_mono_ms,
                        active: false,
                        confirmed: false,
                        idle_since_mono_ms: None,
                    });
                }
                continue;
            }
            self.events.push(Event::Leased {
                block: b.block,
                floor_ms: b.floor_ms,
            });
            // A block this server still counts as held (the registry's
            // clock ran its lease out first): one entry, the new grant,
            // and a floor that may have risen meanwhile.
            if let Some(h) = self.held.iter_mut().find(|h| h.block == b.block) {
                h.high_ms = h.high_ms.max(grant.high_ms);
                h.deadline_mono_ms = h.deadline_mono_ms.max(grant.deadline_mono_ms);
                h.floor_ms = h.floor_ms.max(b.floor_ms);
                h.confirmed = true;
                if h.active {
                    host.activate(h.block, h.floor_ms, h.high_ms, now.stop_ms(h));
                }
                continue;
            }
            self.held.push(Held {
                block: b.block,
                floor_ms: b.floor_ms,
                high_ms: grant.high_ms,
                deadline_mono_ms: grant.deadline_mono_ms,
                active: false,
                confirmed: true,
                idle_since_mono_ms: None,
            });
            if b.floor_ms.saturating_sub(now.max_drift_ms) <= now.wall_ms {
                self.activate(b.block, now, host);
            }
        }
    }

    /// Gives an idle block back (if still idle when stopped).
    fn release(
        &mut self,
        block: u32,
        registry: &mut dyn Registry,
        host: &mut dyn Host,
    ) -> Result<(), CallError> {
        let Some(h) = self.held.iter().find(|h| h.block == block).copied() else {
            return Ok(());
        };
        let Some(newest) = host.stop_if_idle(block) else {
            return Ok(());
        };
        // Saved without the block before the registry hears of it: a crash
        // in between must not bring the block back from the file after its
        // mark was lowered.
        self.held.retain(|h| h.block != block);
        host.save(self);
        let req = ReleaseRequest {
            node: self.id.node.clone(),
            block: block.into(),
            high_ms: lease::release_mark(h.floor_ms, newest),
            seen: self.seen(),
            previous_session: self.previous_session.clone(),
        };
        // On failure the block simply expires at the registry, with the
        // higher mark of its last renewal.
        self.bound(registry, None);
        match registry.release(&req) {
            Ok(reply) => {
                if self.accept(&reply.head) && reply.released {
                    self.events.push(Event::Released { block });
                }
                Ok(())
            }
            Err(e) => self.failed(e),
        }
    }

    /// A refusal is reported as an event; a call that drops the session
    /// is the glue's to report.
    fn failed(&mut self, e: CallError) -> Result<(), CallError> {
        if let CallError::Refused(r) = &e {
            if !e.drops_session() {
                self.events.push(Event::Refused(r.message.clone()));
            }
        }
        Err(e)
    }
}

/// The registry of one round, noting whether it answered a call.
struct Answers<'a> {
    inner: &'a mut dyn Registry,
    answered: bool,
}

impl Answers<'_> {
    fn note<T>(&mut self, result: Result<T, CallError>) -> Result<T, CallError> {
        if result.as_ref().is_ok() || result.as_ref().is_err_and(CallError::answered) {
            self.answered = true;
        }
        result
    }
}

impl Registry for Answers<'_> {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError> {
        let r = self.inner.acquire(req);
        self.note(r)
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError> {
        let r = self.inner.renew(req);
        self.note(r)
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError> {
        let r = self.inner.release(req);
        self.note(r)
    }
    fn durable(&mut self, wait_ms: i64) -> Result<Durability, CallError> {
        let r = self.inner.durable(wait_ms);
        self.note(r)
    }
    fn answer_by(&mut self, deadline_mono_ms: Option<i64>) {
        self.inner.answer_by(deadline_mono_ms);
    }
}

/// The longest a durability check waits for the registry's standbys.
pub const DURABLE_WAIT_MAX_MS: i64 = 2_000;

pub mod problems;

#[cfg(test)]
mod tests;
