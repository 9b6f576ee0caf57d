//! `snowflake_lease_hello`: a registry session introduces the node it
//! leases for, one node per session.
//!
//! A session that holds another node's lock, or blocks leased under
//! another node (its lock given up with `pg_advisory_unlock`, which any
//! role may call), is refused: so `max_blocks_per_node` bounds what one
//! session can lease. A lease worker keeps one session under one node id;
//! it takes a new id only when the node's lock was taken (a copied data
//! directory whose original runs), before it leased anything.
//!
//! A node's lock is bound to the login role that introduces it: the node
//! has [`NODE_SLOTS`] advisory-lock keys per role ([`node_keys`]), hashed
//! under the registry data directory's key and its postmaster's start, so
//! that another role can neither compute them nor keep one it saw held
//! past a restart. Any role may take any advisory lock, so a key held by
//! a session of another role is a squatter, never a copy of this server (a
//! copy connects as its role): the session takes the next key
//! ([`introduce`]). Only a session of the same role holding one shows the
//! node in use. Whether the key is free is PostgreSQL's to say
//! (`pg_try_advisory_lock`, under the registry's lock), after this
//! decision.

use super::{mutation, token, Refusal, SqlState};
use serde::{Deserialize, Serialize};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

/// A node's lock keys per login role.
pub const NODE_SLOTS: usize = 4;

/// The advisory-lock keys of `node` for sessions of `role`: SipHash under
/// the registry's data-directory key `secret` (32 hex digits) of the
/// postmaster's start, the node and the role.
pub fn node_keys(secret: &str, postmaster_start: i64, node: &str, role: &str) -> [i64; NODE_SLOTS] {
    let key = token::key_of(secret).unwrap_or_default();
    let mut keys = [0i64; NODE_SLOTS];
    for (slot, k) in keys.iter_mut().enumerate() {
        let mut h = SipHasher13::new_with_key(&key);
        h.write_i64(postmaster_start);
        h.write(node.as_bytes());
        h.write_u8(0xff);
        h.write(role.as_bytes());
        h.write_u8(0xff);
        h.write_usize(slot);
        *k = i64::from_ne_bytes(h.finish128().h1.to_ne_bytes());
    }
    keys
}

/// Who holds one of the node's lock keys ([`node_keys`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotHolder {
    #[default]
    Free,
    /// The calling session.
    ThisSession,
    /// Another session of the caller's login role: the node's server, or
    /// a copy of its data directory.
    SameRole,
    /// A session of another role (`pg_advisory_lock` on a key it saw).
    OtherRole,
}

/// What a session introducing a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Introduce {
    /// Takes (or holds already) the key of this slot.
    Take(usize),
    /// Another session of its role is this node: a copied data directory
    /// whose original runs; the caller takes a new node id.
    InUse,
}

/// A block row that names the calling session as its holder's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBlock {
    pub block: u32,
    /// Its holder's node; `None` once released.
    #[serde(default)]
    pub holder_node: Option<String>,
}

/// The facts of one `snowflake_lease_hello`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloFacts {
    /// The node the session asks to be.
    pub node: String,
    /// The session holds a node lock other than `node`'s (any
    /// session-level advisory lock of one bigint key in this database:
    /// node locks are those).
    #[serde(default)]
    pub other_node_locked: bool,
    /// The block rows whose `holder_session` is this session.
    #[serde(default)]
    pub blocks: Vec<SessionBlock>,
    /// Who holds each of the node's keys for the caller's role, in slot
    /// order.
    #[serde(default)]
    pub slots: Vec<SlotHolder>,
    /// Who holds the node's key before 0.8.0 (one for every role, from
    /// the node alone): a session introduced before the registry's update.
    #[serde(default)]
    pub legacy: SlotHolder,
}

/// Whether the session may be `node` ([`hello`]), and then which of its
/// keys it takes; refused (`55P03`) when sessions of other roles hold
/// every key.
pub fn introduce(f: &HelloFacts) -> Result<Introduce, Refusal> {
    hello(f)?;
    let unbound = mutation::active(mutation::Mutation::NodeLockUnbound);
    if let Some(slot) = f.slots.iter().position(|s| *s == SlotHolder::ThisSession) {
        return Ok(Introduce::Take(slot));
    }
    if f.slots
        .iter()
        .chain(std::iter::once(&f.legacy))
        .any(|s| *s == SlotHolder::SameRole || (unbound && *s == SlotHolder::OtherRole))
    {
        return Ok(Introduce::InUse);
    }
    if let Some(slot) = f.slots.iter().position(|s| *s == SlotHolder::Free) {
        return Ok(Introduce::Take(slot));
    }
    let node = &f.node;
    Err(Refusal::new(
        SqlState::LockNotAvailable,
        format!("node {node} cannot take its lock: sessions of other roles hold all {NODE_SLOTS} of its keys"),
    )
    .detail("Any role may take any advisory lock; these sessions are not this server's (a copy of it would connect as its role).")
    .hint("End the sessions of other roles that hold advisory locks in the registry's database (pg_locks, pg_terminate_backend) and roll back prepared transactions that hold them (pg_prepared_xacts, ROLLBACK PREPARED); give every server a login role of its own.")
    .log(format!("node {node}: every lock key held by sessions of other roles")))
}

/// Whether the session may take `node`'s lock: refused (`54000`) when it
/// is another node already, by its lock or by the blocks it leased.
pub fn hello(f: &HelloFacts) -> Result<(), Refusal> {
    if mutation::active(mutation::Mutation::ManyNodesPerSession) {
        return Ok(());
    }
    let other = f
        .blocks
        .iter()
        .filter_map(|b| b.holder_node.as_deref())
        .find(|n| *n != f.node);
    let why = match (f.other_node_locked, other) {
        (true, _) => "it holds another node's lock".to_string(),
        (false, Some(n)) => format!("it holds blocks of node {n}"),
        (false, None) => return Ok(()),
    };
    let node = &f.node;
    Err(Refusal::new(
        SqlState::ProgramLimitExceeded,
        format!("lease request of node {node} refused: this session is another node already"),
    )
    .hint("A lease worker introduces one node per session; max_blocks_per_node bounds each node.")
    .log(format!(
        "refused node {node}: the session is another node already ({why})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(other_lock: bool, blocks: &[(u32, Option<&str>)]) -> HelloFacts {
        HelloFacts {
            node: "b".into(),
            slots: vec![SlotHolder::Free; NODE_SLOTS],
            legacy: SlotHolder::Free,
            other_node_locked: other_lock,
            blocks: blocks
                .iter()
                .map(|&(block, n)| SessionBlock {
                    block,
                    holder_node: n.map(str::to_string),
                })
                .collect(),
        }
    }

    #[test]
    fn one_node_per_session() {
        // A fresh session, or one that is this node already.
        assert_eq!(hello(&facts(false, &[])), Ok(()));
        assert_eq!(hello(&facts(false, &[(3, Some("b"))])), Ok(()));
        // Blocks it released name no node: it is no node by them.
        assert_eq!(hello(&facts(false, &[(3, None)])), Ok(()));
        // Another node's lock, or blocks of another node (its lock given
        // up with pg_advisory_unlock).
        for f in [
            facts(true, &[]),
            facts(false, &[(3, Some("b")), (4, Some("a"))]),
            facts(true, &[(3, Some("b"))]),
        ] {
            let r = hello(&f).unwrap_err();
            assert_eq!(r.code, SqlState::ProgramLimitExceeded);
            assert_eq!(
                r.message,
                "lease request of node b refused: this session is another node already"
            );
            assert!(r.log.is_some() && r.hint.is_some());
        }
    }

    fn slots(held: &[SlotHolder]) -> HelloFacts {
        HelloFacts {
            slots: held.to_vec(),
            ..facts(false, &[])
        }
    }

    #[test]
    fn a_node_lock_held_by_another_role_is_a_squatter_not_a_copy() {
        use SlotHolder::*;
        // Free: the first key.
        assert_eq!(
            introduce(&slots(&[Free; NODE_SLOTS])),
            Ok(Introduce::Take(0))
        );
        // Held by this session already (a second hello): that key.
        assert_eq!(
            introduce(&slots(&[OtherRole, ThisSession, Free, Free])),
            Ok(Introduce::Take(1))
        );
        // Squatted by another role: the next free key, not a new node id.
        assert_eq!(
            introduce(&slots(&[OtherRole, Free, OtherRole, Free])),
            Ok(Introduce::Take(1))
        );
        // A session of the same role on any key: a copy of this server.
        for held in [
            [SameRole, Free, Free, Free],
            [OtherRole, OtherRole, SameRole, Free],
        ] {
            assert_eq!(introduce(&slots(&held)), Ok(Introduce::InUse));
        }
        // A session of its role introduced before the registry's update.
        let before = HelloFacts {
            legacy: SameRole,
            ..slots(&[Free; NODE_SLOTS])
        };
        assert_eq!(introduce(&before), Ok(Introduce::InUse));
        let squatted = HelloFacts {
            legacy: OtherRole,
            ..slots(&[Free; NODE_SLOTS])
        };
        assert_eq!(introduce(&squatted), Ok(Introduce::Take(0)));
        // Every key squatted: refused with what to do, no rename.
        let r = introduce(&slots(&[OtherRole; NODE_SLOTS])).unwrap_err();
        assert_eq!(r.code, SqlState::LockNotAvailable);
        assert!(r.hint.is_some() && r.detail.is_some() && r.log.is_some());
        // One node per session still comes first.
        let other = HelloFacts {
            slots: vec![Free; NODE_SLOTS],
            ..facts(true, &[])
        };
        assert_eq!(
            introduce(&other).unwrap_err().code,
            SqlState::ProgramLimitExceeded
        );
    }

    #[test]
    fn node_keys_differ_by_role_start_secret_and_slot() {
        const KEY: &str = "000102030405060708090a0b0c0d0e0f";
        let k = node_keys(KEY, 1, "n", "a");
        assert_eq!(k, node_keys(KEY, 1, "n", "a"));
        let mut all: Vec<i64> = k.to_vec();
        all.extend(node_keys(KEY, 1, "n", "b"));
        all.extend(node_keys(KEY, 2, "n", "a"));
        all.extend(node_keys(KEY, 1, "m", "a"));
        all.extend(node_keys("ff0102030405060708090a0b0c0d0e0f", 1, "n", "a"));
        // No separator games: ("n", "ab") is not ("na", "b").
        all.extend(node_keys(KEY, 1, "na", "b").iter().take(1));
        all.extend(node_keys(KEY, 1, "n", "ab").iter().take(1));
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
