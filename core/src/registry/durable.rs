//! `snowflake_lease_durable`: whether what a holder's session committed is
//! where a failover can reach it ([`Invariant::DurableBeforeUse`]), and the
//! registry's failover candidates ([`Invariant::PromotionNeedsProof`]).
//!
//! A grant is durable once enough synchronous standbys flushed it to
//! satisfy `synchronous_standby_names` (`FIRST n`, `ANY n`, or a plain
//! list: n standbys whose `sync_state` is `sync` or `quorum`), and every
//! failover candidate flushed it too. Candidates are synchronous standbys
//! that flushed every grant reported durable since they were added; each
//! stays one until `valid_until` (about [`CANDIDATE_TTL_MS`] ahead, moved on
//! while all keep up). A candidate that falls behind (or goes, or streams
//! under a name another standby uses too, or whose clock strays more than
//! [`MAX_CANDIDATE_SKEW_MS`] from this server's) holds every durable report
//! back until [`DROP_MARGIN_MS`] past `valid_until`, and is then dropped.
//!
//! So a candidate promoted before the `valid_until` of the last row it has
//! (by its own clock, at most [`MAX_CANDIDATE_SKEW_MS`] off this server's
//! when it was last kept, less than the margin) has every grant any holder
//! used: its old primary could not have dropped it yet
//! (`begin::promotion_proven`). The skew is read from the standby's own
//! `reply_time`, so the proof rests on no assumption about offsets between
//! the registry's servers beyond what is measured.
//!
//! A row made anew ([`made_anew`]: `CREATE EXTENSION`, a row deleted by
//! hand) cannot know what a dropped registry's row named, which a standby
//! may still hold: every row written is kept in the data directory too
//! (`Facts::kept`), and the new row names the kept row's members until
//! its `valid_until`; without one of this timeline, [`EVERY_STANDBY`].
//!
//! [`Invariant::DurableBeforeUse`]: crate::protocol::Invariant::DurableBeforeUse
//! [`Invariant::PromotionNeedsProof`]: crate::protocol::Invariant::PromotionNeedsProof

use crate::protocol::{format_lsn, Durability, DurabilityMode};
use serde::{Deserialize, Serialize};

/// How long a candidate stays one without keeping up.
pub const CANDIDATE_TTL_MS: i64 = 30_000;
/// The member of a row made anew (`CREATE EXTENSION`, a row deleted by
/// hand): every standby that may be synchronous is a candidate until the
/// row's `valid_until`. The row a registry made before may have named any
/// of them until then (its `valid_until` never moves back, and no
/// `DROP EXTENSION` takes that back from a standby that read it); no
/// standby proves a promotion by this member.
pub const EVERY_STANDBY: &str = "*";
/// How long past `valid_until` a candidate that fell behind holds durable
/// reports back before it is dropped.
pub const DROP_MARGIN_MS: i64 = 15_000;
/// How far a candidate's clock (its last `reply_time`) may be from this
/// server's: well within the margin.
pub const MAX_CANDIDATE_SKEW_MS: i64 = 5_000;
/// The longest a durability check waits for the standbys.
pub const MAX_WAIT_MS: i64 = 5_000;

/// The one row of `snowflake_lease_standbys`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidatesRow {
    pub members: Vec<String>,
    /// Unix ms (`i64::MIN` for `-infinity`).
    pub valid_until_ms: i64,
    pub timeline: u32,
    pub updated_at_ms: i64,
}

/// One row of `pg_stat_replication`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standby {
    pub application_name: String,
    /// `sync`, `quorum`, `potential`, `async`.
    pub sync_state: String,
    #[serde(default)]
    pub flush_lsn: Option<u64>,
    /// A physical WAL sender (a logical one, which has a database, never
    /// stands for a candidate).
    pub physical: bool,
    #[serde(default)]
    pub streaming: bool,
    /// The standby's clock when it sent its last reply, Unix ms.
    #[serde(default)]
    pub reply_time_ms: Option<i64>,
}

impl Standby {
    fn synchronous(&self) -> bool {
        self.sync_state == "sync" || self.sync_state == "quorum"
    }
    fn flushed(&self, target: u64) -> bool {
        self.flush_lsn.is_some_and(|f| f >= target)
    }
}

/// The facts of one check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    pub now_ms: i64,
    pub synchronous_standby_names: String,
    /// This server's `snowflake_id.registry_standby_name` (files only).
    #[serde(default)]
    pub me: String,
    /// This server's flush position when the check began.
    pub target: u64,
    pub timeline: u32,
    /// The registry's row is of this timeline (a lease call began its
    /// incarnation since a promotion).
    pub incarnation_here: bool,
    #[serde(default)]
    pub standbys: Vec<Standby>,
    /// The candidates' row (read `FOR UPDATE` for the final decision).
    #[serde(default)]
    pub candidates: Option<CandidatesRow>,
    /// The last candidates' row this data directory wrote
    /// (`snowflake_id.candidates.<database OID>`, kept by `DROP EXTENSION`): what a row
    /// made anew names ([`made_anew`]).
    #[serde(default)]
    pub kept: Option<CandidatesRow>,
}

/// The candidates' row made anew (`CREATE EXTENSION`, the row deleted by
/// hand), from `kept`, the last one this data directory wrote before:
/// its members, until its `valid_until`, when it is of this timeline. A
/// standby cut off before the row was made anew, and then taken out of
/// `synchronous_standby_names`, may still hold that row naming it, and
/// prove its promotion by it: it stays a candidate, behind, so that
/// nothing is durable without it until it is dropped (a row made anew
/// under the setting alone, naming s2 only, let s1 prove a promotion that
/// repeated 39,682 IDs on real servers). Without one (a new data
/// directory, or a row of another timeline), [`EVERY_STANDBY`].
pub fn made_anew(kept: Option<&CandidatesRow>, timeline: u32, now_ms: i64) -> CandidatesRow {
    match kept {
        Some(k)
            if k.timeline == timeline
                && !super::mutation::active(super::mutation::Mutation::NoKeptCandidates) =>
        {
            CandidatesRow {
                members: k.members.clone(),
                valid_until_ms: k.valid_until_ms,
                timeline,
                updated_at_ms: now_ms,
            }
        }
        _ => CandidatesRow {
            members: vec![EVERY_STANDBY.into()],
            valid_until_ms: now_ms + CANDIDATE_TTL_MS,
            timeline,
            updated_at_ms: now_ms,
        },
    }
}

/// `synchronous_standby_names` read: how many standbys must have a grant.
pub fn needed(names: &str) -> u32 {
    if names.trim().is_empty() {
        return 0;
    }
    list_of(names).0.unwrap_or(1)
}

/// `synchronous_standby_names` as PostgreSQL's grammar splits it: the
/// count of `FIRST n (...)`, `ANY n (...)` or `n (...)` (`None`: a plain
/// list), and the list.
fn list_of(names: &str) -> (Option<u32>, &str) {
    let s = names.trim();
    let lower = s.to_ascii_lowercase();
    let rest = ["first", "any"]
        .iter()
        .find_map(|k| {
            lower
                .strip_prefix(k)
                .filter(|r| r.starts_with(char::is_whitespace))
                .map(|r| &s[s.len() - r.len()..])
        })
        .unwrap_or(s)
        .trim_start();
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    match (
        rest[..digits].parse::<u32>(),
        rest[digits..].trim_start().strip_prefix('('),
    ) {
        (Ok(n), Some(list)) => (Some(n), list.trim_end().strip_suffix(')').unwrap_or(list)),
        _ => (None, s),
    }
}

fn mode(facts: &Facts) -> DurabilityMode {
    if facts.synchronous_standby_names.trim().is_empty() {
        if facts.standbys.iter().any(|s| s.streaming) {
            DurabilityMode::Asynchronous
        } else {
            DurabilityMode::Local
        }
    } else {
        DurabilityMode::Synchronous
    }
}

/// Where the check stands: the synchronous standbys that flushed the
/// target, and the candidates that have not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub flushed: u32,
    pub behind: Vec<String>,
    /// Nothing left to wait for.
    pub done: bool,
}

/// The candidate named `name` is one that may stay one: exactly one
/// physical standby streams under it, it flushed `target`, and its clock
/// is within [`MAX_CANDIDATE_SKEW_MS`] of this server's.
fn keeps_up(facts: &Facts, name: &str) -> bool {
    let mut under = facts
        .standbys
        .iter()
        .filter(|s| s.physical && s.application_name == name);
    match (under.next(), under.next()) {
        (Some(s), None) => {
            s.flushed(facts.target)
                && s.reply_time_ms
                    .is_some_and(|r| (r - facts.now_ms).abs() <= MAX_CANDIDATE_SKEW_MS)
        }
        _ => false,
    }
}

/// The candidates of this timeline, but this server. A row of an older
/// timeline (written by the primary before a promotion) names none: it
/// proves no promotion from this timeline, so its members hold nothing
/// back (a promoted server without its name would otherwise wait for
/// itself until that row's `valid_until` plus the margin).
fn members(facts: &Facts) -> Vec<String> {
    let mut out: Vec<String> = facts
        .candidates
        .as_ref()
        .filter(|c| c.timeline == facts.timeline)
        .map(|c| {
            c.members
                .iter()
                .flat_map(|m| {
                    if m == EVERY_STANDBY {
                        may_be_synchronous(facts)
                    } else {
                        vec![m.clone()]
                    }
                })
                .filter(|m| *m != facts.me)
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
}

/// [`EVERY_STANDBY`]: the standbys `synchronous_standby_names` lists (as
/// the one streaming under the name spells it, when one does), and every
/// physical standby streaming whose `sync_state` is not `async`.
fn may_be_synchronous(facts: &Facts) -> Vec<String> {
    let listed = listed_names(&facts.synchronous_standby_names)
        .into_iter()
        .filter(|(n, quoted)| !n.is_empty() && (*quoted || n != EVERY_STANDBY))
        .map(|(n, _)| {
            facts
                .standbys
                .iter()
                .find(|s| s.application_name.eq_ignore_ascii_case(&n))
                .map_or_else(|| n.clone(), |s| s.application_name.clone())
        });
    let streaming = facts
        .standbys
        .iter()
        .filter(|s| s.physical && s.sync_state != "async" && !s.application_name.is_empty())
        .map(|s| s.application_name.clone());
    listed.chain(streaming).collect()
}

/// One look at the standbys, while the check waits.
pub fn progress(facts: &Facts) -> Progress {
    let flushed = facts
        .standbys
        .iter()
        .filter(|s| s.synchronous() && s.flushed(facts.target))
        .count() as u32;
    let mut behind: Vec<String> = members(facts)
        .into_iter()
        .filter(|m| !keeps_up(facts, m))
        .collect();
    behind.sort();
    let done = flushed >= needed(&facts.synchronous_standby_names) && behind.is_empty();
    if unnamed_may_be_candidates(facts) {
        // No wait tells these apart: `done` stays as it is, and the
        // decision holds the report back.
        behind.push(EVERY_STANDBY.into());
    }
    Progress {
        done,
        flushed,
        behind,
    }
}

/// A row made anew ([`EVERY_STANDBY`]) while `synchronous_standby_names`
/// has `*` (every standby may be synchronous): a standby cut off before
/// the row was made may be named by a row a registry dropped before, and
/// no name in the setting lets this server count it behind. Until the
/// row's `valid_until` plus the margin, no report is durable.
fn unnamed_may_be_candidates(facts: &Facts) -> bool {
    facts.candidates.as_ref().is_some_and(|c| {
        c.timeline == facts.timeline && c.members.iter().any(|m| m == EVERY_STANDBY)
    }) && lists_every_standby(&facts.synchronous_standby_names)
        && !super::mutation::active(super::mutation::Mutation::StarCountsStreamingOnly)
}

/// `synchronous_standby_names` names `*` (unquoted: `"*"` is a standby
/// called `*`).
fn lists_every_standby(names: &str) -> bool {
    listed_names(names)
        .iter()
        .any(|(n, quoted)| !quoted && n == EVERY_STANDBY)
}

/// The names `synchronous_standby_names` lists, as PostgreSQL reads them:
/// the list of `FIRST n (...)`, `ANY n (...)` or `n (...)`, else the whole
/// setting; a double-quoted name keeps its commas and parentheses, `""`
/// in it is a quote. Each with whether it was quoted.
pub fn listed_names(names: &str) -> Vec<(String, bool)> {
    let (_, inner) = list_of(names);
    let mut out = Vec::new();
    let (mut name, mut quoted, mut in_quotes) = (String::new(), false, false);
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                chars.next();
                name.push('"');
            }
            '"' => {
                in_quotes = !in_quotes;
                quoted = true;
            }
            ',' if !in_quotes => {
                out.push((name.trim().to_string(), quoted));
                (name, quoted) = (String::new(), false);
            }
            c => name.push(c),
        }
    }
    out.push((name.trim().to_string(), quoted));
    out
}

/// The decision, after the wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub reply: Durability,
    /// The candidates' row to write.
    pub write: Option<CandidatesRow>,
    pub log: Vec<String>,
}

/// Whether the grant is durable, and the candidates' row after it.
pub fn decide(facts: &Facts) -> Decision {
    let needed = needed(&facts.synchronous_standby_names);
    let mut reply = Durability {
        durable: false,
        mode: mode(facts),
        needed,
        flushed: 0,
        lsn: format_lsn(facts.target),
        behind: Vec::new(),
    };
    if !facts.incarnation_here {
        // Promoted, and no lease call began its incarnation yet.
        return Decision {
            reply,
            ..Decision::default()
        };
    }
    let p = progress(facts);
    reply.flushed = p.flushed;
    reply.behind.clone_from(&p.behind);
    let mut out = Decision::default();
    let mut durable = p.flushed >= needed;
    let Some(row) = facts.candidates.as_ref() else {
        // Deleted by hand: made again, as CREATE EXTENSION makes it; ask
        // again.
        out.write = Some(made_anew(facts.kept.as_ref(), facts.timeline, facts.now_ms));
        out.reply = reply;
        return out;
    };
    if durable
        && !p.behind.is_empty()
        && facts.now_ms <= row.valid_until_ms.saturating_add(DROP_MARGIN_MS)
    {
        // A candidate that may be promoted without a fence lacks it.
        durable = false;
    }
    if durable {
        // The members that kept up, and every synchronous standby that has
        // it (added: a row it receives names it, and it has everything
        // before that row).
        let mut keep: Vec<String> = members(facts)
            .into_iter()
            .filter(|m| !p.behind.contains(m))
            .chain(
                facts
                    .standbys
                    .iter()
                    .filter(|s| {
                        s.synchronous()
                            && s.flushed(facts.target)
                            && !s.application_name.is_empty()
                            && s.application_name != facts.me
                            && keeps_up(facts, &s.application_name)
                    })
                    .map(|s| s.application_name.clone()),
            )
            .collect();
        keep.sort();
        keep.dedup();
        let fresh = row.valid_until_ms >= facts.now_ms + CANDIDATE_TTL_MS - 5_000;
        if !(p.behind.is_empty() && row.timeline == facts.timeline && keep == row.members && fresh)
        {
            // valid_until never moves back: a candidate may have read it.
            out.write = Some(CandidatesRow {
                members: keep,
                valid_until_ms: if super::mutation::active(
                    super::mutation::Mutation::ValidUntilBack,
                ) {
                    facts.now_ms + CANDIDATE_TTL_MS
                } else {
                    row.valid_until_ms.max(facts.now_ms + CANDIDATE_TTL_MS)
                },
                timeline: facts.timeline,
                updated_at_ms: facts.now_ms,
            });
            if !p.behind.is_empty() {
                out.log.push(format!(
                    "standby {} dropped from the failover candidates (a candidate until {} (Unix ms), and behind since)",
                    p.behind.join(", "),
                    row.valid_until_ms
                ));
            }
        }
    }
    reply.durable =
        durable || super::mutation::active(super::mutation::Mutation::TrustCancelledCommit);
    out.reply = reply;
    out
}
