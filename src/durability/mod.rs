//! Durability: no ID repeats after a restart, a crash or a failover.
//!
//! - `reservation` the state file, the floor above every ID issued, and WAL
//!   replay of the reservation
//! - `backfill`    backfill grants: counted, written and WAL-logged before
//!   use, replayed
//! - `registry_key` the registry's token key, kept in the data directory
//! - `registry_candidates` the registry's last failover candidates' row,
//!   kept in the data directory
//! - `wal`         the custom WAL resource manager and its records (a leaf:
//!   `reservation` calls it, it calls back through registered functions)

pub mod backfill;
pub mod registry_candidates;
pub mod registry_key;
pub mod reservation;
pub mod wal;
