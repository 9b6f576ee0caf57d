//! snowflake_core: the pure core of snowflake_id.
//!
//! Everything here is plain Rust with no PostgreSQL calls and no pgrx, so it
//! builds and tests in seconds (`cargo test -p snowflake_core`) with injected
//! clocks and fake registry clients. The extension crate (`src/`) is the glue
//! that puts these rules into shared memory, settings, WAL and workers.
//!
//! - `layout`     the bit layout of an ID
//! - `backfill`   IDs for past times: the set-aside space, grants, open stretches
//! - `backfill_ids` which set-aside ids a server records at start
//! - `generator`  the clock and sequence rules (injected clock)
//! - `held`       the held window: the generator's held IDs in clock milliseconds (hot path)
//! - `clock_behind` why the generator refused: the error a DBA can act on
//! - `ranges`     worker-id range parsing
//! - `lease`      fleet leases of worker-id blocks: the rules and the safety argument
//! - `holder`     the holder side of leases, a state machine over a registry client
//! - `node`       a node's identity over restarts and copies: which saved leases a start uses
//! - `protocol`   the fleet wire protocol: requests, replies, the named invariants
//! - `registry`   the registry side of leases: decisions over gathered facts, and the rules over rows in memory
//! - `promotion`  one server's failover: the floor at promotion, the reservation's wait for synchronous standbys
//! - `public_id`  the keyed, reversible text form of IDs
//! - `key_file`   reading and checking the public key file's contents
//! - `conninfo`   reading libpq connection strings (secrets, problems)
//! - `health`     snowflake_health(): each check's status, threshold and what to do
#![forbid(unsafe_code)]

pub mod backfill;
pub mod backfill_ids;
pub mod clock_behind;
pub mod conninfo;
pub mod generator;
pub mod health;
pub mod held;
pub mod holder;
pub mod key_file;
pub mod layout;
pub mod lease;
pub mod node;
pub mod promotion;
pub mod protocol;
pub mod public_id;
pub mod ranges;
pub mod registry;

#[cfg(test)]
mod proptests;
