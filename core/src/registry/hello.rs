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
//! has [`key_count`] advisory-lock keys per role ([`node_keys`]), hashed
//! under the registry data directory's key and its postmaster's start, so
//! that another role can neither compute them nor keep one it saw held
//! past a restart. Any role may take any advisory lock, so a key held by
//! a session of another role is a squatter, never a copy of this server (a
//! copy connects as its role): the session ends it or takes the next key
//! ([`introduce`]). Only a session of the same role holding one shows the
//! node in use. A squatter that cannot be ended is a superuser's session
//! or a prepared transaction (no session): there are at most
//! `max_prepared_transactions` of those, so the node has that many keys
//! more than [`NODE_SLOTS`] and one is always left. Whether the key is
//! free is PostgreSQL's to say (`pg_try_advisory_lock`, under the
//! registry's lock), after this decision.

use super::{mutation, token, Refusal, SqlState};
use serde::{Deserialize, Serialize};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

/// A node's lock keys per login role, besides one per prepared
/// transaction the registry allows.
pub const NODE_SLOTS: usize = 4;

/// The longest node id a registry session may introduce, in bytes. A
/// lease worker's is 32 hex digits; the keys are hashed from it under the
/// registry's lock, once per key.
pub const MAX_NODE_BYTES: usize = 256;

/// A node id's length, checked before anything is hashed from it:
/// refused (`54000`) past [`MAX_NODE_BYTES`].
pub fn check_node(node: &str) -> Result<(), Refusal> {
    if node.len() <= MAX_NODE_BYTES {
        return Ok(());
    }
    let n = node.len();
    Err(Refusal::new(
        SqlState::ProgramLimitExceeded,
        format!("node id of {n} bytes refused: the limit is {MAX_NODE_BYTES}"),
    )
    .hint("A snowflake_id lease worker's node id is 32 hex digits: who called the lease functions by hand?")
    .log(format!("refused a node id of {n} bytes")))
}

/// How many keys a node has per role on a registry that allows
/// `max_prepared_transactions` prepared transactions: more than they can
/// hold.
pub fn key_count(max_prepared_transactions: u32) -> usize {
    NODE_SLOTS.saturating_add(usize::try_from(max_prepared_transactions).unwrap_or(usize::MAX))
}

/// The advisory-lock keys of `node` for sessions of `role`, `count` of
/// them ([`key_count`]): SipHash under the registry's data-directory key
/// `secret` (32 hex digits) of the postmaster's start, the node, the role
/// and the slot.
pub fn node_keys(
    secret: &str,
    postmaster_start: i64,
    node: &str,
    role: &str,
    count: usize,
) -> impl Iterator<Item = i64> + use<> {
    let key = token::key_of(secret).unwrap_or_default();
    let (node, role) = (node.to_owned(), role.to_owned());
    (0..count).map(move |slot| {
        let mut h = SipHasher13::new_with_key(&key);
        h.write_i64(postmaster_start);
        h.write(node.as_bytes());
        h.write_u8(0xff);
        h.write(role.as_bytes());
        h.write_u8(0xff);
        h.write_usize(slot);
        i64::from_ne_bytes(h.finish128().h1.to_ne_bytes())
    })
}

/// One lock, held or awaited, on one of the node's keys for the caller's
/// role (`pg_locks`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLock {
    /// The key's slot ([`node_keys`]); `None` for the node's key before
    /// 0.8.0 (one for every role, from the node alone).
    #[serde(default)]
    pub slot: Option<usize>,
    /// The session's pid; `None` for a prepared transaction's lock.
    #[serde(default)]
    pub pid: Option<i32>,
    /// The session's login role.
    #[serde(default)]
    pub role: Option<String>,
    /// The registry may end the session: not a superuser's, and the
    /// extension's owner may signal it (`pg_terminate_backend`).
    #[serde(default)]
    pub endable: bool,
    /// Held, not awaited.
    #[serde(default)]
    pub granted: bool,
}

/// Who holds one of the node's keys, as [`introduce`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    /// The calling session.
    ThisSession,
    /// Another session of the caller's login role: the node's server, or
    /// a copy of its data directory.
    SameRole,
    /// Sessions of other roles only, each to be ended.
    Squatted,
    /// A session of another role the registry may not end (a
    /// superuser's), or a prepared transaction: kept.
    Kept,
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

/// A session to end before the key is taken: one of another role holding
/// or awaiting one of the node's keys, which no lease function takes
/// (`pg_advisory_lock`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Squatter {
    pub pid: i32,
    pub role: String,
}

/// [`introduce`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Introduction {
    pub outcome: Introduce,
    /// Ended first, whatever the outcome: so that none can gather a
    /// node's keys while its server reconnects.
    pub end: Vec<Squatter>,
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
    /// The calling session's pid and login role (`session_user`).
    pub pid: i32,
    pub role: String,
    /// How many keys the node has for that role ([`key_count`]).
    pub keys: usize,
    /// The session holds a node lock other than `node`'s (any
    /// session-level advisory lock of one bigint key in this database:
    /// node locks are those).
    #[serde(default)]
    pub other_node_locked: bool,
    /// The block rows whose `holder_session` is this session.
    #[serde(default)]
    pub blocks: Vec<SessionBlock>,
    /// Every lock held or awaited on the node's keys for that role, and
    /// on its key before 0.8.0.
    #[serde(default)]
    pub locks: Vec<KeyLock>,
}

impl HelloFacts {
    /// Who holds `slot` (`None`: the key before 0.8.0), were the
    /// squatters ended.
    fn slot(&self, slot: Option<usize>) -> Slot {
        let unbound = mutation::active(mutation::Mutation::NodeLockUnbound);
        let mut held = Slot::Free;
        for l in self.locks.iter().filter(|l| l.slot == slot && l.granted) {
            let this = match l.pid {
                Some(p) if p == self.pid => Slot::ThisSession,
                Some(_) if unbound || l.role.as_deref() == Some(self.role.as_str()) => {
                    Slot::SameRole
                }
                Some(_) if l.endable && l.role.is_some() => Slot::Squatted,
                _ => Slot::Kept,
            };
            held = held.max_by_rank(this);
        }
        held
    }

    fn squatters(&self) -> Vec<Squatter> {
        if mutation::active(mutation::Mutation::NodeLockUnbound) {
            return Vec::new();
        }
        let mut end: Vec<Squatter> = Vec::new();
        for l in self.locks.iter().filter(|l| l.slot.is_some() && l.endable) {
            if let (Some(pid), Some(role)) = (l.pid, l.role.as_deref()) {
                if pid != self.pid && role != self.role && !end.iter().any(|s| s.pid == pid) {
                    end.push(Squatter {
                        pid,
                        role: role.to_owned(),
                    });
                }
            }
        }
        end
    }
}

impl Slot {
    /// The one that decides for a key several sessions show (one holds
    /// it; the others' locks are shared or stale views).
    fn max_by_rank(self, other: Slot) -> Slot {
        fn rank(s: Slot) -> u8 {
            match s {
                Slot::Free => 0,
                Slot::Squatted => 1,
                Slot::Kept => 2,
                Slot::SameRole => 3,
                Slot::ThisSession => 4,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// Whether the session may be `node` ([`hello`]), which of its keys it
/// takes, and which sessions are ended first; refused (`55P03`) when
/// sessions of other roles it may not end or prepared transactions hold
/// every key.
pub fn introduce(f: &HelloFacts) -> Result<Introduction, Refusal> {
    hello(f)?;
    let slots: Vec<Slot> = (0..f.keys).map(|i| f.slot(Some(i))).collect();
    let end = f.squatters();
    let outcome = if let Some(i) = slots.iter().position(|s| *s == Slot::ThisSession) {
        Introduce::Take(i)
    } else if slots.contains(&Slot::SameRole) || f.slot(None) == Slot::SameRole {
        Introduce::InUse
    } else if let Some(i) = slots
        .iter()
        .position(|s| *s == Slot::Free)
        .or_else(|| slots.iter().position(|s| *s == Slot::Squatted))
    {
        Introduce::Take(i)
    } else {
        let (node, n) = (&f.node, f.keys);
        return Err(Refusal::new(
            SqlState::LockNotAvailable,
            format!("node {node} cannot take its lock: sessions of other roles or prepared transactions hold all {n} of its keys"),
        )
        .detail("Any role may take any advisory lock; these are not this server's (a copy of it would connect as its role), and the registry cannot end them.")
        .hint("Roll back the prepared transactions that hold advisory locks in the registry's database (pg_prepared_xacts, pg_locks, ROLLBACK PREPARED) and end the sessions of other roles that hold them (pg_terminate_backend; the extension's owner ends them itself when it may signal them); give every server a login role of its own.")
        .log(format!("node {node}: every lock key held by sessions of other roles or prepared transactions")));
    };
    Ok(Introduction { outcome, end })
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

    const ME: i32 = 10;

    fn facts(other_lock: bool, blocks: &[(u32, Option<&str>)]) -> HelloFacts {
        HelloFacts {
            node: "b".into(),
            pid: ME,
            role: "server_b".into(),
            keys: NODE_SLOTS,
            other_node_locked: other_lock,
            blocks: blocks
                .iter()
                .map(|&(block, n)| SessionBlock {
                    block,
                    holder_node: n.map(str::to_string),
                })
                .collect(),
            locks: Vec::new(),
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

    /// Who holds a key, as pg_locks and pg_stat_activity show it.
    #[derive(Clone, Copy)]
    enum By {
        Me,
        MyRole(i32),
        Other(i32),
        OtherWaiting(i32),
        Superuser(i32),
        Prepared,
    }

    fn lock(slot: Option<usize>, by: By) -> KeyLock {
        let (pid, role, endable, granted) = match by {
            By::Me => (Some(ME), Some("server_b"), true, true),
            By::MyRole(p) => (Some(p), Some("server_b"), true, true),
            By::Other(p) => (Some(p), Some("server_x"), true, true),
            By::OtherWaiting(p) => (Some(p), Some("server_x"), true, false),
            By::Superuser(p) => (Some(p), Some("postgres"), false, true),
            By::Prepared => (None, None, false, true),
        };
        KeyLock {
            slot,
            pid,
            role: role.map(str::to_string),
            endable,
            granted,
        }
    }

    fn held(keys: usize, locks: &[(Option<usize>, By)]) -> HelloFacts {
        HelloFacts {
            keys,
            locks: locks.iter().map(|&(s, by)| lock(s, by)).collect(),
            ..facts(false, &[])
        }
    }

    fn outcome(f: &HelloFacts) -> (Introduce, Vec<i32>) {
        let i = introduce(f).unwrap();
        (i.outcome, i.end.iter().map(|s| s.pid).collect())
    }

    #[test]
    fn a_node_lock_held_by_another_role_is_a_squatter_not_a_copy() {
        use By::*;
        let n = NODE_SLOTS;
        // Free: the first key.
        assert_eq!(outcome(&held(n, &[])), (Introduce::Take(0), vec![]));
        // Held by this session already (a second hello): that key.
        assert_eq!(
            outcome(&held(n, &[(Some(0), Superuser(3)), (Some(1), Me)])),
            (Introduce::Take(1), vec![])
        );
        // Squatted by another role: its sessions ended, holding or
        // waiting, and the first free key taken (tests/fleet/
        // test_adversarial_s25.py: X gathered all four keys over A's broken
        // connections, and A was refused for good).
        assert_eq!(
            outcome(&held(
                n,
                &[
                    (Some(0), Other(7)),
                    (Some(1), OtherWaiting(8)),
                    (Some(2), Other(9))
                ]
            )),
            (Introduce::Take(1), vec![7, 8, 9])
        );
        // Every key squatted: the first, once its holder is ended.
        let all: Vec<_> = (0..n).map(|i| (Some(i), Other(20 + i as i32))).collect();
        assert_eq!(
            outcome(&held(n, &all)),
            (Introduce::Take(0), (20..20 + n as i32).collect())
        );
        // A session of the same role on any key: a copy of this server.
        // Squatters are still ended.
        for locks in [
            vec![(Some(0), MyRole(5))],
            vec![
                (Some(0), Prepared),
                (Some(1), Other(7)),
                (Some(2), MyRole(5)),
            ],
        ] {
            assert_eq!(outcome(&held(n, &locks)).0, Introduce::InUse);
        }
        assert_eq!(
            outcome(&held(n, &[(Some(1), Other(7)), (Some(2), MyRole(5))])).1,
            vec![7]
        );
        // A session of its role introduced before the registry's update.
        assert_eq!(outcome(&held(n, &[(None, MyRole(5))])).0, Introduce::InUse);
        // The key before 0.8.0 held by another role: not this server's,
        // and not ended (any 0.7.0 lease session of that role holds one).
        assert_eq!(
            outcome(&held(n, &[(None, Other(7))])),
            (Introduce::Take(0), vec![])
        );
        // A superuser's session is not ended: passed over.
        assert_eq!(
            outcome(&held(n, &[(Some(0), Superuser(3))])),
            (Introduce::Take(1), vec![])
        );
    }

    #[test]
    fn prepared_transactions_never_hold_every_key() {
        use By::*;
        // tests/fleet/test_adversarial_s26.py: X's role took each key A's
        // registry session gave up with pg_advisory_xact_lock and PREPAREd
        // it (no session to end): with four keys, A was refused for good.
        // A registry allowing p prepared transactions gives a node
        // key_count(p) keys: p of them held, one is left.
        for p in [0u32, 1, 10, 200] {
            let keys = key_count(p);
            let mut locks: Vec<_> = (0..p as usize).map(|i| (Some(i), Prepared)).collect();
            locks.push((Some(p as usize), Other(7)));
            let (out, end) = outcome(&held(keys, &locks));
            assert_eq!(out, Introduce::Take(p as usize + 1));
            assert_eq!(end, vec![7]);
        }
        // A prepared transaction of the server's own role is no copy of it.
        assert_eq!(
            outcome(&held(NODE_SLOTS, &[(Some(0), Prepared)])).0,
            Introduce::Take(1)
        );
        // Every key kept (superusers' sessions, prepared transactions):
        // refused with what to do, no rename.
        let kept: Vec<_> = (0..NODE_SLOTS)
            .map(|i| (Some(i), if i % 2 == 0 { Prepared } else { Superuser(3) }))
            .collect();
        let r = introduce(&held(NODE_SLOTS, &kept)).unwrap_err();
        assert_eq!(r.code, SqlState::LockNotAvailable);
        assert!(r.message.contains("all 4 of its keys"), "{}", r.message);
        assert!(r.hint.is_some_and(|h| h.contains("ROLLBACK PREPARED")));
        assert!(r.detail.is_some() && r.log.is_some());
        // One node per session still comes first.
        let other = HelloFacts {
            other_node_locked: true,
            ..held(NODE_SLOTS, &[])
        };
        assert_eq!(
            introduce(&other).unwrap_err().code,
            SqlState::ProgramLimitExceeded
        );
    }

    #[test]
    fn a_node_id_past_the_limit_is_refused() {
        // tests/fleet/test_adversarial_s27.py: a 64 MB node id hashed once
        // per key under the registry's lock held it for seconds.
        assert_eq!(check_node(&"a".repeat(MAX_NODE_BYTES)), Ok(()));
        let r = check_node(&"a".repeat(MAX_NODE_BYTES + 1)).unwrap_err();
        assert_eq!(r.code, SqlState::ProgramLimitExceeded);
        assert_eq!(r.message, "node id of 257 bytes refused: the limit is 256");
        assert!(r.hint.is_some() && r.log.is_some());
    }

    #[test]
    fn key_count_leaves_a_key_past_the_prepared_transactions() {
        assert_eq!(key_count(0), NODE_SLOTS);
        assert_eq!(key_count(200), NODE_SLOTS + 200);
        assert_eq!(key_count(u32::MAX), NODE_SLOTS + u32::MAX as usize);
    }

    #[test]
    fn node_keys_differ_by_role_start_secret_and_slot() {
        const KEY: &str = "000102030405060708090a0b0c0d0e0f";
        let keys = |start, node, role, n| node_keys(KEY, start, node, role, n).collect::<Vec<_>>();
        let k = keys(1, "n", "a", NODE_SLOTS);
        assert_eq!(k, keys(1, "n", "a", NODE_SLOTS));
        // More keys extend the same ones.
        assert_eq!(keys(1, "n", "a", 9)[..NODE_SLOTS], k[..]);
        let mut all: Vec<i64> = keys(1, "n", "a", 9);
        all.extend(keys(1, "n", "b", NODE_SLOTS));
        all.extend(keys(2, "n", "a", NODE_SLOTS));
        all.extend(keys(1, "m", "a", NODE_SLOTS));
        all.extend(node_keys(
            "ff0102030405060708090a0b0c0d0e0f",
            1,
            "n",
            "a",
            NODE_SLOTS,
        ));
        // No separator games: ("n", "ab") is not ("na", "b").
        all.extend(keys(1, "na", "b", 1));
        all.extend(keys(1, "n", "ab", 1));
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
