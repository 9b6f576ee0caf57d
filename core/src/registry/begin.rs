//! The start of every lease call: the caller's authority, and the
//! registry's incarnation. A registry that may have forgotten grants it
//! confirmed (a new timeline, its WAL below a position a holder saw, its
//! row gone, its row written in another database, a restart with fsync
//! off, a holder of an older incarnation soon after an unfenced one
//! began) starts a new incarnation; when
//! holders may be using grants it forgot, it is fenced
//! ([`Invariant::FenceFromLimits`]), unless this server proves it kept
//! every durable grant ([`Invariant::PromotionNeedsProof`], [`Proof`]).
//!
//! What a request says it saw (an incarnation, a WAL position) is evidence
//! only when the registry can believe it: it carries the registry's token
//! for the pair ([`super::token`]), or, while the DBA lets requests without
//! one count (`LimitsRow::unsigned_evidence`, for holders before 0.8.0),
//! its node holds blocks here. The key is the data directory's
//! (`snowflake_id.key`), kept across `DROP`/`CREATE EXTENSION`, so a token
//! of an incarnation before the row was made anew still verifies. A token
//! that does not verify is not evidence, except of an incarnation on a
//! registry whose row was made with a key made then (the file was missing,
//! `Server::key_kept`: older tokens cannot verify): so a request can fence
//! such a registry at most once after its row was made.
//!
//! A request also carries what the holder saw of the incarnations before
//! (`Seen::earlier`). A registry restored to an earlier state, back to an
//! incarnation from before its row was last made anew (`DROP`/`CREATE
//! EXTENSION`, then a snapshot from before it), cannot tell the newer
//! incarnation from an older one (names do not order), but can check what
//! the holder saw of its own: a position or grant count of its own
//! incarnation past its own, under its token, is then evidence. With
//! neither past it (no grant between the snapshot and the `DROP`, and its
//! WAL passed since), the row's [`IncarnationRow::history`] tells: a
//! verified token of an incarnation this registry never had, while a grant
//! made before its postmaster started may still be in use, means it was
//! restored to before that incarnation.
//!
//! [`Invariant::FenceFromLimits`]: crate::protocol::Invariant::FenceFromLimits
//! [`Invariant::PromotionNeedsProof`]: crate::protocol::Invariant::PromotionNeedsProof

use super::limits::InForce;
use super::token;
use super::{Call, Refusal, Rows, Server, SqlState};
use crate::protocol::{parse_lsn, EARLIER_KEPT};
use serde::{Deserialize, Serialize};

/// The one row of `snowflake_lease_registry`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncarnationRow {
    pub incarnation: String,
    pub timeline: u32,
    pub postmaster_start_ms: i64,
    pub started_at_ms: i64,
    #[serde(default)]
    pub fenced_until_ms: Option<i64>,
    #[serde(default)]
    pub fence_floor_ms: i64,
    /// The largest lease time, grace and lead of a mark holders asked for:
    /// shown for choosing the limits, never what a fence rests on.
    #[serde(default)]
    pub max_lease_ms: i64,
    #[serde(default)]
    pub max_grace_ms: i64,
    #[serde(default)]
    pub max_ahead_ms: i64,
    pub cause: String,
    /// The incarnation this one continues without a fence (a proven
    /// promotion): its holders are not evidence.
    #[serde(default)]
    pub previous_incarnation: Option<String>,
    /// The key of the registry's tokens (hex), kept from one incarnation to
    /// the next; new when the row was made anew.
    #[serde(default)]
    pub token_key: String,
    /// The key was made with this incarnation (the row was gone): tokens
    /// of older incarnations cannot verify.
    #[serde(default)]
    pub new_key: bool,
    /// Calls that granted (wrote block rows), over every incarnation: a
    /// holder that saw more knows grants this registry forgot.
    #[serde(default)]
    pub grants: i64,
    /// The incarnations before this one that this row descends from, oldest
    /// first, at most [`HISTORY_KEPT`]: an incarnation a holder knows that
    /// is neither these, this one nor `previous_incarnation` is one this
    /// registry never had (module header).
    #[serde(default)]
    pub history: Vec<String>,
    /// The OID of the database the row was written in (`None`: a row from
    /// before 0.8.0, which may be a copy too: its first call fences once,
    /// and the new row names this database). A row in another database is a
    /// copy put in the registry's place (`CREATE DATABASE ... TEMPLATE`,
    /// then a rename): it forgot what the registry granted since the copy.
    #[serde(default)]
    pub database_oid: Option<u32>,
}

/// How many earlier incarnations a row keeps in `history`.
pub const HISTORY_KEPT: usize = 16;

impl IncarnationRow {
    /// Whether this row is, or descends from, incarnation `name`.
    pub fn had(&self, name: &str) -> bool {
        self.incarnation == name
            || self.previous_incarnation.as_deref() == Some(name)
            || self.history.iter().any(|h| h == name)
    }

    /// `history` for the incarnation that follows this one: the one it
    /// continued, when given an incarnation a holder showed this registry
    /// had (verified), and this one last.
    fn history_after(&self, also: Option<&str>) -> Vec<String> {
        let mut h = self.history.clone();
        let before = self.previous_incarnation.as_deref();
        for name in before
            .into_iter()
            .chain(also)
            .chain([self.incarnation.as_str()])
        {
            if !name.is_empty() && !h.iter().any(|x| x == name) {
                h.push(name.to_string());
            }
        }
        let extra = h.len().saturating_sub(HISTORY_KEPT);
        h.drain(..extra);
        h
    }
}

/// What shows that this server, promoted, has every grant any holder used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// `snowflake_id.registry_standby_name` from the configuration files
    /// only (a session could SET it): '' for none.
    #[serde(default)]
    pub standby_name: String,
    /// The failover candidates' row this server has (written on the old
    /// timeline by the old primary).
    #[serde(default)]
    pub candidates: Option<super::durable::CandidatesRow>,
    /// The last line of this timeline's history file: parent timeline,
    /// switch point, reason. `None`: unreadable.
    #[serde(default)]
    pub history: Option<(u32, String, String)>,
}

/// How a call began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begun {
    /// The row in force after this call.
    pub row: IncarnationRow,
    /// The row is to be written.
    pub write: bool,
    /// A fence began: every block's mark rises to at least this.
    pub raise_marks_to: Option<i64>,
    pub log: Vec<String>,
}

/// Why a new incarnation begins.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cause {
    NoRow,
    Timeline { old: u32, proven: Option<String> },
    Rollback { seen: u64 },
    GrantsBack { seen: i64, have: i64 },
    FsyncOffRestart,
    OlderIncarnation { known: String },
    UnknownIncarnation { known: String },
    SignedElsewhere { known: String, database: u32 },
    DatabaseCopied { was: u32 },
    DatabaseUnrecorded,
    RowBack { seen: i64, have: i64 },
}

impl Cause {
    fn text(&self, server: &Server, node: &str) -> String {
        match self {
            Cause::NoRow => "a registry with no incarnation (new, made again, lease table emptied or restored)".into(),
            Cause::Timeline { old, proven } => {
                let base = format!(
                    "WAL timeline {}, was {old} (promotion or point-in-time recovery)",
                    server.timeline
                );
                match proven {
                    Some(p) => format!("{base}: {p}"),
                    None => base,
                }
            }
            Cause::Rollback { seen } => format!(
                "a holder saw WAL position {}, above this server's {} (the registry went back in time)",
                crate::protocol::format_lsn(*seen),
                crate::protocol::format_lsn(server.insert_lsn)
            ),
            Cause::GrantsBack { seen, have } => format!(
                "a holder saw {seen} grants, this registry has made {have} (it was restored to an earlier state)"
            ),
            Cause::FsyncOffRestart => "a restart with fsync off".into(),
            Cause::DatabaseCopied { was } => format!(
                "the registry's row was written in database OID {was}, this is OID {} (a copy of the database put in its place)",
                server.database_oid
            ),
            Cause::RowBack { seen, have } => format!(
                "the registry's row has made {have} grants, a lease call found {seen} in this database since the postmaster started (another database was put in its place under its OID)"
            ),
            Cause::DatabaseUnrecorded => format!(
                "the registry's row names no database (written before 0.8.0), this is OID {}: it may be a copy of the database put in its place",
                server.database_oid
            ),
            Cause::OlderIncarnation { known } => format!("node {node} knew incarnation {known}"),
            Cause::UnknownIncarnation { known } => format!(
                "node {node} knew incarnation {known}, which this registry never had (it was restored to an earlier state)"
            ),
            Cause::SignedElsewhere { known, database } => format!(
                "node {node} knew incarnation {known}, which this registry never had, under its key in database OID {database}, this is OID {} (a copy of this database served holders)",
                server.database_oid
            ),
        }
    }
}

/// Until when a grant made before the postmaster started (forgotten by a
/// restore in place, which restarts) can still repeat IDs: its holder
/// uses it until a fence after the start at the latest, and its IDs may
/// run up to its mark, at most the limits' `max_ahead_ms` ahead of the
/// registry's clock when granted (a holder's lease time plus its
/// `max_drift`), which a new holder's clock passes only at the floor a
/// fence at the start would raise marks to. With a lead above the grace (`snowflake_id.max_drift` 60 s, 6 s
/// leases) the floor is the later: a block leased anew after the fence
/// alone, above the restored mark, repeated 17,006 IDs of its forgotten
/// holder on real servers (tests/fleet/test_adversarial_s19.py).
pub fn forgotten_matters_until(start_ms: i64, lim: &InForce) -> i64 {
    let floor = start_ms
        .saturating_add(lim.fence_ahead_ms)
        .saturating_add(lim.fence_grace_ms);
    start_ms.saturating_add(lim.fence_ms()).max(floor)
}

/// Whether this server, promoted from timeline `old` to its own, has every
/// grant a holder used: named in the last candidates' row it received
/// (written on `old`), before that row's `valid_until` by its own clock
/// (the old primary kept each candidate's clock within
/// [`super::durable::MAX_CANDIDATE_SKEW_MS`] of its own, and drops a
/// candidate only [`super::durable::DROP_MARGIN_MS`] after
/// `valid_until`), and its history says a promotion ended recovery (not a
/// recovery target: a point-in-time recovery stops before grants it then
/// lacks). With fsync off a crash may have lost WAL it reported flushed.
pub fn promotion_proven(server: &Server, old: u32) -> Option<String> {
    let proof = &server.proof;
    let claimed = super::mutation::active(super::mutation::Mutation::CandidateFromSession)
        .then(|| proof.candidates.as_ref().and_then(|c| c.members.first()))
        .flatten();
    let me = claimed.map_or(proof.standby_name.as_str(), String::as_str);
    if me.is_empty() || server.fsync_off {
        return None;
    }
    let w = proof.candidates.as_ref()?;
    if w.timeline != old || !w.members.iter().any(|m| m == me) || server.now_ms >= w.valid_until_ms
    {
        return None;
    }
    let (parent, switch, reason) = proof.history.as_ref()?;
    if *parent != old || reason != "no recovery target specified" {
        return None;
    }
    Some(format!(
        "standby {me} promoted at {switch}, a failover candidate until {} (Unix ms): it has every durable grant",
        w.valid_until_ms
    ))
}

/// The caller's authority, and the incarnation this call runs in.
pub fn begin(call: &Call, server: &Server, rows: &Rows, lim: &InForce) -> Result<Begun, Refusal> {
    let node = call.node();
    if server.synchronous_commit_off {
        return Err(Refusal::new(SqlState::NotInPrerequisiteState, "lease sessions must commit synchronously")
            .detail("synchronous_commit is off in this session: a grant could be lost in a crash after the holder used it.")
            .hint("Do not set synchronous_commit = off for the role the lease workers connect as (the lease worker asks for on)."));
    }
    if !server.node_locked {
        return Err(Refusal::new(
            SqlState::InsufficientPrivilege,
            format!("this session does not hold the lock of node {node}"),
        )
        .detail("Only the registry session of the server that is this node (after snowflake_lease_hello) may lease, renew or release its blocks.")
        .hint("Lease functions are called by the snowflake_id lease worker of each server; do not call them by hand."));
    }
    let (seen, (lease_ms, grace_ms, high_ms)) = match call {
        Call::Acquire(r) => (&r.seen, (r.lease_ms, r.grace_ms, Some(r.high_ms))),
        Call::Renew(r) => (&r.seen, (r.lease_ms, r.grace_ms, Some(r.high_ms))),
        Call::Release(r) => (&r.seen, (0, 0, None)),
    };
    let seen_lsn = parse_lsn(&seen.lsn).unwrap_or(0);
    let known = seen.incarnation.as_str();
    let now = server.now_ms;
    let unsigned_counts = rows.limits.as_ref().is_some_and(|l| l.unsigned_evidence)
        && rows
            .blocks
            .iter()
            .any(|b| b.holder_node.as_deref() == Some(node));
    let mut log = Vec::new();
    // Whether what the request says it saw can be believed (module header).
    // `made_anew`: a token of an older incarnation of a registry whose row
    // was made anew cannot verify, and counts (an incarnation only).
    let believed = |row: &IncarnationRow, made_anew: bool| -> bool {
        if seen.token.is_empty() {
            return unsigned_counts;
        }
        (made_anew && row.new_key)
            || token::verify(&row.token_key, known, seen_lsn, seen.grants, &seen.token).is_some()
    };
    if rows.registry.as_ref().is_some_and(|r| {
        seen_lsn > server.insert_lsn && r.timeline == server.timeline && !believed(r, false)
    }) {
        log.push(format!(
            "node {node} says it saw WAL position {}, above this server's, with no token this registry issued: not believed",
            seen.lsn
        ));
    }
    let counted = !super::mutation::active(super::mutation::Mutation::AsyncGrantCommitUncounted);
    // This incarnation as a holder saw it before a newer one (module
    // header): a position or grant count past this server's, under this
    // registry's own token, on this timeline.
    let earlier_past = rows
        .registry
        .as_ref()
        .filter(|r| r.timeline == server.timeline)
        .and_then(|r| {
            seen.earlier
                .iter()
                .take(EARLIER_KEPT)
                .filter(|e| e.incarnation == r.incarnation && !e.token.is_empty())
                .find_map(|e| {
                    let lsn = parse_lsn(&e.lsn)?;
                    let past = lsn > server.insert_lsn
                        || (e.grants > r.grants && e.grants > server.signed_grants && counted);
                    (past
                        && token::verify(&r.token_key, &e.incarnation, lsn, e.grants, &e.token)
                            .is_some())
                    .then_some((lsn, e.grants, r.grants))
                })
        });
    // The database another than this one that signed, under this row's
    // key, the incarnation the request names, which this row never had.
    let signed_elsewhere = |r: &IncarnationRow| -> Option<u32> {
        if known.is_empty()
            || r.had(known)
            || server.database_oid == 0
            || super::mutation::active(super::mutation::Mutation::NoDatabaseIdentity)
        {
            return None;
        }
        token::verify(&r.token_key, known, seen_lsn, seen.grants, &seen.token)
            .filter(|d| *d != server.database_oid)
    };
    let elsewhere = rows.registry.as_ref().and_then(signed_elsewhere);
    let (cause, evidence) = match &rows.registry {
        None => {
            let evidence = !known.is_empty()
                || !server.locked.is_empty()
                || rows.blocks.iter().any(|b| b.holder_node.is_some())
                || server.others_lock_blocks;
            (Some(Cause::NoRow), evidence)
        }
        Some(r) if r.timeline != server.timeline => {
            let proven = promotion_proven(server, r.timeline);
            let evidence = proven.is_none();
            (
                Some(Cause::Timeline {
                    old: r.timeline,
                    proven,
                }),
                evidence,
            )
        }
        Some(r)
            if server.database_oid != 0
                && r.database_oid.is_some_and(|d| d != server.database_oid)
                && !super::mutation::active(super::mutation::Mutation::NoDatabaseIdentity) =>
        {
            // A copy of the registry's database in its place: no restart,
            // one WAL for every database, so no other rule sees it. It
            // forgot every grant made since the copy, at any time before.
            (
                Some(Cause::DatabaseCopied {
                    was: r.database_oid.unwrap_or_default(),
                }),
                true,
            )
        }
        Some(r)
            if server.database_oid != 0
                && r.database_oid.is_none()
                && !super::mutation::active(super::mutation::Mutation::NoDatabaseIdentity) =>
        {
            // A row from before 0.8.0 names no database: the live registry's
            // or a copy taken before the update and put in its place, which
            // nothing else tells apart (tests/fleet/test_adversarial_s21.py:
            // 45,949 IDs made twice when it learned its database unfenced).
            // Fenced once, as a copy would be.
            (Some(Cause::DatabaseUnrecorded), true)
        }
        Some(r)
            if r.grants < server.row_grants_seen
                && !super::mutation::active(super::mutation::Mutation::NoRowBack) =>
        {
            // The row's count went back with no restart: a row is written
            // only forward, so this is another database under the
            // registry's OID (CREATE DATABASE ... TEMPLATE copy OID n, the
            // original dropped), which no OID, token or signed count tells
            // apart (tests/fleet/test_adversarial_s24.py: 70,786 IDs made
            // twice). It forgot every grant since it was copied.
            (
                Some(Cause::RowBack {
                    seen: server.row_grants_seen,
                    have: r.grants,
                }),
                true,
            )
        }
        Some(_) if elsewhere.is_some() => {
            // A copy of this database (its row, its key) served holders
            // with grants this one never made, at any time: a database
            // copied, renamed in and out needs no restart, so no window
            // after the postmaster's start bounds them
            // (tests/fleet/test_adversarial_s23.py: the original put back
            // after a copy that granted less than it, 64,058 IDs made
            // twice). Once per such incarnation: it joins the lineage.
            let database = elsewhere.unwrap_or_default();
            (
                Some(Cause::SignedElsewhere {
                    known: known.to_string(),
                    database,
                }),
                true,
            )
        }
        Some(_) if earlier_past.is_some() => {
            let (lsn, grants, have) = earlier_past.unwrap_or_default();
            let cause = if lsn > server.insert_lsn {
                Cause::Rollback { seen: lsn }
            } else {
                Cause::GrantsBack { seen: grants, have }
            };
            (Some(cause), true)
        }
        Some(r)
            if seen_lsn > server.insert_lsn
                && r.previous_incarnation.as_deref() != Some(known)
                && believed(r, false) =>
        {
            // (A holder of the incarnation a proven promotion continued may
            // have seen a position of the old timeline past the promotion:
            // a grant that never became durable, which it did not use.)
            (Some(Cause::Rollback { seen: seen_lsn }), true)
        }
        Some(r)
            if counted
                && seen.grants > r.grants
                && seen.grants > server.signed_grants
                && r.previous_incarnation.as_deref() != Some(known)
                && !seen.token.is_empty()
                && believed(r, false) =>
        {
            (
                Some(Cause::GrantsBack {
                    seen: seen.grants,
                    have: r.grants,
                }),
                true,
            )
        }
        Some(r) if server.fsync_off && r.postmaster_start_ms != server.postmaster_start_ms => {
            (Some(Cause::FsyncOffRestart), true)
        }
        Some(r)
            if !known.is_empty()
                && !r.had(known)
                && r.timeline == server.timeline
                && r.fenced_until_ms.is_none_or(|f| f < now)
                && now < forgotten_matters_until(server.postmaster_start_ms, lim)
                && !seen.token.is_empty()
                && !super::mutation::active(super::mutation::Mutation::NoIncarnationHistory)
                && believed(r, false) =>
        {
            // An incarnation this registry never had, under its own key: it
            // was restored to before it. Any grant it forgot was made before
            // this postmaster started, so has run out a fence after that,
            // and its IDs are below every holder's clock once that clock
            // passes the floor a fence at the start would have raised marks
            // to (forgotten_matters_until).
            (
                Some(Cause::UnknownIncarnation {
                    known: known.to_string(),
                }),
                true,
            )
        }
        Some(r)
            if !known.is_empty()
                && known != r.incarnation
                && r.previous_incarnation.as_deref() != Some(known)
                && r.fenced_until_ms.is_none()
                && now < forgotten_matters_until(r.started_at_ms, lim) =>
        {
            // A holder of an older incarnation soon after this one began
            // unfenced: it may be using a grant this one forgot, or its IDs
            // may still lead every clock (forgotten_matters_until).
            if believed(r, true) {
                (
                    Some(Cause::OlderIncarnation {
                        known: known.to_string(),
                    }),
                    true,
                )
            } else {
                log.push(format!(
                    "node {node} names incarnation {known} without a token this registry issued: not believed"
                ));
                (None, false)
            }
        }
        Some(_) => (None, false),
    };
    let Some(cause) = cause else {
        let mut row = rows.registry.clone().unwrap_or_default();
        // What holders ask for, shown for choosing the limits.
        let ahead = high_ms.map_or(0, |h| h.saturating_sub(now));
        let write =
            lease_ms > row.max_lease_ms || grace_ms > row.max_grace_ms || ahead > row.max_ahead_ms;
        row.max_lease_ms = row.max_lease_ms.max(lease_ms);
        row.max_grace_ms = row.max_grace_ms.max(grace_ms);
        row.max_ahead_ms = row.max_ahead_ms.max(ahead);
        return Ok(Begun {
            row,
            write,
            raise_marks_to: None,
            log,
        });
    };
    let old = rows.registry.clone();
    // A verified incarnation the holder knew joins the lineage (a row made
    // anew has none), so that it is not taken for a forgotten one later.
    let known_verified = (!known.is_empty()
        && !seen.token.is_empty()
        && old.as_ref().map_or_else(
            || {
                token::verify(&server.fresh_key, known, seen_lsn, seen.grants, &seen.token)
                    .is_some()
            },
            |o| token::verify(&o.token_key, known, seen_lsn, seen.grants, &seen.token).is_some(),
        ))
    .then_some(known);
    let proven = matches!(
        cause,
        Cause::Timeline {
            proven: Some(_),
            ..
        }
    );
    let text = cause.text(server, node);
    let mut row = IncarnationRow {
        incarnation: server.fresh_incarnation.clone(),
        timeline: server.timeline,
        postmaster_start_ms: server.postmaster_start_ms,
        started_at_ms: now,
        fenced_until_ms: None,
        fence_floor_ms: old.as_ref().map_or(0, |o| o.fence_floor_ms),
        max_lease_ms: old.as_ref().map_or(0, |o| o.max_lease_ms).max(lease_ms),
        max_grace_ms: old.as_ref().map_or(0, |o| o.max_grace_ms).max(grace_ms),
        max_ahead_ms: old
            .as_ref()
            .map_or(0, |o| o.max_ahead_ms)
            .max(high_ms.map_or(0, |h| h.saturating_sub(now))),
        cause: text.clone(),
        previous_incarnation: if proven {
            old.as_ref().map(|o| o.incarnation.clone())
        } else {
            None
        },
        token_key: old
            .as_ref()
            .map_or_else(|| server.fresh_key.clone(), |o| o.token_key.clone()),
        new_key: old.is_none() && !server.key_kept,
        // A fence for a grant count a holder saw counts it as made: the
        // same evidence again is answered (the fence covers every grant
        // made before it), not a fence at every call
        // (tests/fleet/test_adversarial_s23.py: a reply whose call rolled
        // back, shown after a restart, fenced at each of 30 calls).
        // A row made anew goes on from the count a committed call left in
        // this database since the postmaster started: a copy from before
        // has less (Cause::RowBack).
        grants: old
            .as_ref()
            .map_or(server.row_grants_seen, |o| o.grants)
            .max(match &cause {
                Cause::GrantsBack { seen, .. } | Cause::RowBack { seen, .. } => *seen,
                Cause::SignedElsewhere { .. } => seen.grants,
                _ => 0,
            }),
        history: old.as_ref().map_or_else(
            || {
                known_verified
                    .map(|k| vec![k.to_string()])
                    .unwrap_or_default()
            },
            |o| o.history_after(known_verified),
        ),
        database_oid: (server.database_oid != 0).then_some(server.database_oid),
    };
    let mut raise = None;
    if evidence {
        // Invariant::FenceFromLimits: every grant it may have forgotten has
        // run out at its holder by then, and allowed no mark above this
        // floor.
        if super::mutation::active(super::mutation::Mutation::FenceFromRequests) {
            let old = old.as_ref();
            let (lease, grace, ahead) = old.map_or((lease_ms, grace_ms, 0), |o| {
                (
                    o.max_lease_ms.max(lease_ms),
                    o.max_grace_ms.max(grace_ms),
                    o.max_ahead_ms,
                )
            });
            row.fenced_until_ms = Some(now + lease + grace);
            row.fence_floor_ms = now + ahead + grace;
        } else {
            row.fenced_until_ms = Some(now + lim.fence_ms());
            row.fence_floor_ms = lim.fence_floor_ms(now);
        }
        raise = Some(row.fence_floor_ms);
        log.push(format!(
            "new incarnation {} after {text}: no block is leased anew until {} (Unix ms), and every block's floor is raised to {}",
            row.incarnation, now + lim.fence_ms(), row.fence_floor_ms
        ));
    } else {
        log.push(format!("new incarnation {} ({text})", row.incarnation));
    }
    Ok(Begun {
        row,
        write: true,
        raise_marks_to: raise,
        log,
    })
}

/// How rows of the lease table were forgotten: the trigger's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forgotten {
    /// `DELETE`.
    Deleted,
    /// `TRUNCATE`.
    Truncated,
    /// Rows inserted already leased: a restore (`pg_restore`, `COPY`).
    Restored,
}

impl Forgotten {
    pub fn as_str(self) -> &'static str {
        match self {
            Forgotten::Deleted => "deleted",
            Forgotten::Truncated => "truncated",
            Forgotten::Restored => "restored",
        }
    }
}

/// Rows of the lease table deleted, truncated or restored (the
/// `snowflake_lease_forget` trigger): the registry forgot grants, so a new
/// incarnation begins at once, fenced, also with no holder connected. The
/// row stays (a tombstone); with none, nothing to do. Returns the new row;
/// every block's mark rises to its `fence_floor_ms`.
pub fn forget(
    row: Option<&IncarnationRow>,
    lim: &InForce,
    now_ms: i64,
    fresh_incarnation: &str,
    how: Forgotten,
) -> Option<IncarnationRow> {
    let mut r = row?.clone();
    r.history = r.history_after(None);
    r.incarnation = fresh_incarnation.to_string();
    r.started_at_ms = now_ms;
    r.cause = format!("rows of the lease table were {}", how.as_str());
    // Invariant::FenceFromLimits.
    r.fenced_until_ms = Some(now_ms + lim.fence_ms());
    r.fence_floor_ms = lim.fence_floor_ms(now_ms);
    r.previous_incarnation = None;
    Some(r)
}
