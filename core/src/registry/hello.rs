//! `snowflake_lease_hello`: a registry session introduces the node it
//! leases for, one node per session.
//!
//! A session that holds another node's lock, or blocks leased under
//! another node (its lock given up with `pg_advisory_unlock`, which any
//! role may call), is refused: so `max_blocks_per_node` bounds what one
//! session can lease. A lease worker keeps one session under one node id;
//! it takes a new id only when the node's lock was taken (a copied data
//! directory whose original runs), before it leased anything. Whether the
//! node's lock is free is PostgreSQL's to say (`pg_try_advisory_lock`),
//! after this decision.

use super::{mutation, Refusal, SqlState};
use serde::{Deserialize, Serialize};

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
}
