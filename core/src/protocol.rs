//! The fleet's wire protocol, in one place: every request a holder sends to
//! the registry's lease functions and every reply, as the jsonb each
//! function takes and returns (`src/sql/leases.sql` passes it to
//! `registry::decide` through the extension; `holder` builds requests and
//! reads replies). `docs/design/fleet-fencing.md` shows the same keys in a
//! table, which `tests` below compares with these types.
//!
//! Compatibility: a key a side does not know is ignored, and a key a side
//! lacks takes its default (`#[serde(default)]`). So 0.7.0 holders, which
//! send no `token`, are served by a 0.8.0 registry, and 0.8.0 holders by a
//! 0.7.0 registry, which sends none back.
//!
//! # The invariants
//!
//! What keeps two servers from making the same ID, named so that the code
//! that relies on one can cite it ([`Invariant`]); the argument is in
//! `lease`, the simulation that checks them in `sim/`.

use serde::{Deserialize, Serialize};

/// The rules the fleet's safety rests on. Code that keeps one cites it by
/// name (`Invariant::MarkRisesWhileHeld`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    /// A block is leased to one holder at a time: the registry hands it to
    /// another only after its expiry plus grace by the registry's clock,
    /// and to another session of the same node likewise.
    DisjointBlocks,
    /// A block's mark only rises while one holder keeps it.
    MarkRisesWhileHeld,
    /// A release never lowers a mark below the floor the block was leased
    /// with.
    ReleaseNotBelowFloor,
    /// A new incarnation that may have forgotten grants is fenced for the
    /// limits' longest lease time plus grace, and raises every mark above
    /// the limits' largest lead plus grace: bounds from the limits, never
    /// from the requests seen (which a failover loses with the grants).
    FenceFromLimits,
    /// A holder uses a grant only once the registry says it is flushed
    /// where a failover can reach it.
    DurableBeforeUse,
    /// A new incarnation skips the fence only when this server proves it
    /// has every durable grant (a failover candidate, promoted in time).
    PromotionNeedsProof,
}

impl Invariant {
    /// Its name, as the code cites it.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::DisjointBlocks => "DisjointBlocks",
            Invariant::MarkRisesWhileHeld => "MarkRisesWhileHeld",
            Invariant::ReleaseNotBelowFloor => "ReleaseNotBelowFloor",
            Invariant::FenceFromLimits => "FenceFromLimits",
            Invariant::DurableBeforeUse => "DurableBeforeUse",
            Invariant::PromotionNeedsProof => "PromotionNeedsProof",
        }
    }

    pub const ALL: [Invariant; 6] = [
        Invariant::DisjointBlocks,
        Invariant::MarkRisesWhileHeld,
        Invariant::ReleaseNotBelowFloor,
        Invariant::FenceFromLimits,
        Invariant::DurableBeforeUse,
        Invariant::PromotionNeedsProof,
    ];
}

/// One block in a request: the block and the mark the holder holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMark {
    pub block: i64,
    #[serde(default)]
    pub high_ms: i64,
}

/// One block in a reply: its mark before this call, the floor a new
/// holder starts above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockFloor {
    pub block: u32,
    pub floor_ms: i64,
}

/// What every request carries about the registry as the holder last saw
/// it: the incarnation, the highest WAL position of it seen, and the
/// registry's token for that pair (empty from a holder before 0.8.0, or
/// one that saw none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    #[serde(default)]
    pub incarnation: String,
    #[serde(default)]
    pub lsn: String,
    /// The registry's grant count seen with them (0.8.0; 0 for none).
    #[serde(default)]
    pub grants: i64,
    #[serde(default)]
    pub token: String,
    /// The same of the incarnations seen before this one, newest first
    /// (0.8.0; at most [`EARLIER_KEPT`] count): a registry restored to one
    /// of them, whose key cannot verify the newer token, still sees a
    /// position past its own under a token it issued
    /// (`registry::begin`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<Seen>,
}

/// How many earlier incarnations a holder presents, and a registry reads.
pub const EARLIER_KEPT: usize = 4;

/// `snowflake_lease_acquire(jsonb)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    pub node: String,
    pub name: String,
    pub layout: String,
    pub block_size: i64,
    pub max_worker_id: i64,
    pub allowed: Vec<i64>,
    pub want: i64,
    pub lease_ms: i64,
    pub grace_ms: i64,
    pub high_ms: i64,
    #[serde(flatten)]
    pub seen: Seen,
}

/// `snowflake_lease_renew(jsonb)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    pub node: String,
    /// With a re-assertion to a registry that forgot the blocks' rows.
    #[serde(default)]
    pub layout: String,
    #[serde(default)]
    pub block_size: i64,
    #[serde(default)]
    pub max_worker_id: i64,
    pub blocks: Vec<BlockMark>,
    pub lease_ms: i64,
    pub grace_ms: i64,
    pub high_ms: i64,
    #[serde(flatten)]
    pub seen: Seen,
    /// The registry session this holder used before its current one
    /// (`pid:start`, '' for none): blocks leased in that session stay its
    /// own; blocks leased in a session it cannot name pass to it only
    /// after their lease and grace ran out.
    #[serde(default)]
    pub previous_session: String,
}

/// `snowflake_lease_release(jsonb)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    pub node: String,
    pub block: i64,
    pub high_ms: i64,
    #[serde(flatten)]
    pub seen: Seen,
    #[serde(default)]
    pub previous_session: String,
}

/// `snowflake_lease_durable(jsonb)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurableRequest {
    #[serde(default)]
    pub wait_ms: i64,
}

/// What every reply carries: the incarnation, the registry's WAL position
/// after the call, the token for the two (0.8.0), and the fence.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyHead {
    pub incarnation: String,
    pub lsn: String,
    /// How many calls that granted the registry has made (0.8.0): only
    /// grants move it, so a registry restored in place shows a count below
    /// one its holders saw however far its WAL has moved since.
    #[serde(default)]
    pub grants: i64,
    #[serde(default)]
    pub token: String,
    /// Registry-clock Unix ms until which no block is leased anew.
    #[serde(default)]
    pub fenced_until_ms: Option<i64>,
}

/// The reply to an acquire or a renewal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    #[serde(flatten)]
    pub head: ReplyHead,
    /// Acquire: the blocks granted, each with its floor. Renew: the blocks
    /// still held, each with its mark before the renewal.
    #[serde(default)]
    pub blocks: Vec<BlockFloor>,
}

/// The reply to a release.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    #[serde(flatten)]
    pub head: ReplyHead,
    pub released: bool,
}

/// How the registry makes grants durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Checked against synchronous standbys.
    Synchronous,
    /// None named, none streaming: the registry's own flush.
    Local,
    /// None named, but standbys stream: a failover to one loses grants
    /// (and is fenced).
    Asynchronous,
    /// A registry whose extension predates the check, or a mode this
    /// holder does not know.
    #[default]
    #[serde(other)]
    Unchecked,
}

impl DurabilityMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DurabilityMode::Synchronous => "synchronous",
            DurabilityMode::Local => "local",
            DurabilityMode::Asynchronous => "asynchronous",
            DurabilityMode::Unchecked => "unchecked",
        }
    }
}

/// The reply to `snowflake_lease_durable`: whether what the session
/// committed is where a failover can reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Durability {
    pub durable: bool,
    pub mode: DurabilityMode,
    /// Synchronous standbys needed by `synchronous_standby_names`.
    #[serde(default)]
    pub needed: u32,
    /// Of those, how many flushed the position checked.
    #[serde(default)]
    pub flushed: u32,
    /// The registry's WAL position checked.
    #[serde(default)]
    pub lsn: String,
    /// Failover candidates that have not flushed it yet: not durable
    /// until they have, or stop being candidates.
    #[serde(default)]
    pub behind: Vec<String>,
}

/// A WAL position as PostgreSQL prints it (`16/B374D848`).
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some(u64::from(hi) << 32 | u64::from(lo))
}

pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn keys<T: Serialize>(value: &T) -> BTreeSet<String> {
        match serde_json::to_value(value) {
            Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
            other => panic!("not an object: {other:?}"),
        }
    }

    /// The top-level keys a table cell names: "blocks: [{block, floor_ms}]
    /// (the blocks still held)" names `blocks`.
    fn split(cell: &str) -> BTreeSet<String> {
        let mut depth = 0;
        let flat: String = cell
            .chars()
            .filter(|&c| {
                match c {
                    '[' | '{' | '(' => depth += 1,
                    ']' | '}' | ')' => depth -= 1,
                    _ => return depth == 0,
                }
                false
            })
            .collect();
        flat.split(',')
            .filter_map(|piece| {
                let word: String = piece
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (!word.is_empty()).then_some(word)
            })
            .collect()
    }

    /// The protocol table of docs/design/fleet-fencing.md names exactly the
    /// keys of these types.
    #[test]
    fn docs_table_matches_the_types() {
        let doc = include_str!("../../docs/design/fleet-fencing.md");
        let expect: [(&str, BTreeSet<String>, BTreeSet<String>); 4] = [
            (
                "snowflake_lease_acquire(jsonb)",
                keys(&AcquireRequest::default()),
                keys(&Reply::default()),
            ),
            (
                "snowflake_lease_renew(jsonb)",
                keys(&RenewRequest::default()),
                keys(&Reply::default()),
            ),
            (
                "snowflake_lease_release(jsonb)",
                keys(&ReleaseRequest::default()),
                keys(&ReleaseReply::default()),
            ),
            (
                "snowflake_lease_durable(jsonb)",
                keys(&DurableRequest::default()),
                keys(&Durability::default()),
            ),
        ];
        for (function, request, reply) in expect {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{function}` |")))
                .unwrap_or_else(|| panic!("no row for {function} in fleet-fencing.md"));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(split(cells[2]), request, "request keys of {function}");
            assert_eq!(split(cells[3]), reply, "reply keys of {function}");
        }
    }

    #[test]
    fn an_older_peer_is_read_with_defaults() {
        // A 0.7.0 holder's renewal: no token.
        let req: RenewRequest = serde_json::from_str(
            r#"{"node":"n","blocks":[{"block":3,"high_ms":5}],"lease_ms":6000,"grace_ms":1200,
                "high_ms":9,"incarnation":"i","lsn":"0/10","previous_session":""}"#,
        )
        .unwrap();
        assert_eq!(req.seen.token, "");
        assert_eq!(req.blocks[0].block, 3);
        // A 0.7.0 registry's reply: no token; a mode this side does not know.
        let reply: Reply = serde_json::from_str(
            r#"{"incarnation":"i","lsn":"0/20","fenced_until_ms":null,"blocks":[{"block":3,"floor_ms":4}]}"#,
        )
        .unwrap();
        assert_eq!(reply.head.token, "");
        assert_eq!(reply.blocks[0].floor_ms, 4);
        let d: Durability = serde_json::from_str(r#"{"durable":true,"mode":"sometime"}"#).unwrap();
        assert_eq!(d.mode, DurabilityMode::Unchecked);
    }

    #[test]
    fn lsn_round_trips() {
        for lsn in [0u64, 1, 0x16_B374_D848, u64::MAX] {
            assert_eq!(parse_lsn(&format_lsn(lsn)), Some(lsn));
        }
        assert_eq!(parse_lsn("nonsense"), None);
    }
}
